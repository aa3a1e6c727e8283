// llmc/comm/dist.cpp: the job's processes (llmc/comm/dist.h).
#include "llmc/comm/dist.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#ifdef LLMC_MPI
#include "llmc/comm/mpi.h"
#endif

namespace {

#ifdef LLMC_MPI
// The node-local rank is found once, collectively, in dist_init, and asked
// for later by code that may run on one rank only: it has to be kept. The
// flag records whether we started MPI, so that we (and only we) stop it.
// These two are the module's only state; rank and size are asked of MPI.
int g_local_rank = 0, g_local_size = 1;
bool g_started_mpi = false;

bool mpi_live() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}
#endif

}  // namespace

bool launched_by_mpi(const std::function<const char*(const char*)>& getenv) {
    for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "MPI_LOCALNRANKS", "SLURM_PROCID"}) {
        const char* x = getenv(v);
        if (x && *x) return true;
    }
    return false;
}

void dist_init(int* argc, char*** argv, MpiStart start) {
#ifdef LLMC_MPI
    int init = 0;
    MPI_Initialized(&init);
    if (!init && start == MpiStart::if_launched && !launched_by_mpi([](const char* v) { return std::getenv(v); }))
        return;  // one process, no MPI: every dist_* call answers for a world of one
    if (!init) {
        // Only the main thread calls MPI (OpenMP threads compute, never talk).
        int provided = 0;
        MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
        g_started_mpi = true;
    }
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_local_rank);
    MPI_Comm_size(node, &g_local_size);
    MPI_Comm_free(&node);
#else
    (void)argc;
    (void)argv;
    (void)start;
#endif
}

void dist_finalize() {
#ifdef LLMC_MPI
    if (g_started_mpi && mpi_live()) MPI_Finalize();
#endif
}

int dist_world_rank() {
#ifdef LLMC_MPI
    if (mpi_live()) {
        int r = 0;
        MPI_Comm_rank(MPI_COMM_WORLD, &r);
        return r;
    }
#endif
    return 0;
}

int dist_world_size() {
#ifdef LLMC_MPI
    if (mpi_live()) {
        int s = 1;
        MPI_Comm_size(MPI_COMM_WORLD, &s);
        return s;
    }
#endif
    return 1;
}

int dist_local_rank() {
#ifdef LLMC_MPI
    return g_local_rank;
#else
    return 0;
#endif
}

int dist_local_size() {
#ifdef LLMC_MPI
    return g_local_size;
#else
    return 1;
#endif
}

void dist_broadcast(std::string* s) {
#ifdef LLMC_MPI
    if (dist_world_size() == 1) return;
    int len = dist_world_rank() == 0 ? (int)std::min<size_t>(s->size(), INT_MAX) : 0;
    MPI_Bcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD);
    s->resize((size_t)len);
    if (len) MPI_Bcast(&(*s)[0], len, MPI_CHAR, 0, MPI_COMM_WORLD);
#else
    (void)s;
#endif
}

std::vector<std::string> dist_gather_strings(const std::string& mine) {
    const int world = dist_world_size(), rank = dist_world_rank();
    if (world == 1) return {mine};
    std::vector<std::string> all;
#ifdef LLMC_MPI
    int len = (int)std::min<size_t>(mine.size(), INT_MAX);
    std::vector<int> lens(rank == 0 ? world : 0), offs(rank == 0 ? world : 0);
    MPI_Gather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD);
    std::string joined;
    if (rank == 0) {
        size_t total = 0;
        for (int r = 0; r < world; r++) offs[r] = (int)total, total += (size_t)lens[r];
        joined.resize(total);
    }
    MPI_Gatherv(mine.data(), len, MPI_CHAR, rank == 0 ? &joined[0] : nullptr, lens.data(), offs.data(), MPI_CHAR, 0,
                MPI_COMM_WORLD);
    if (rank == 0)
        for (int r = 0; r < world; r++) all.push_back(joined.substr((size_t)offs[r], (size_t)lens[r]));
#endif
    return all;
}

void dist_abort(const std::string& msg) {
    const int world = dist_world_size();
    if (world > 1)
        std::fprintf(stderr, "train_gpt: error (rank %d): %s\n", dist_world_rank(), msg.c_str());
    else
        std::fprintf(stderr, "train_gpt: error: %s\n", msg.c_str());
    std::fflush(stderr);
#ifdef LLMC_MPI
    if (world > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    // Alone: end MPI properly first, or mpirun adds a page about a process
    // that exited without MPI_Finalize to our one line.
    if (g_started_mpi && mpi_live()) MPI_Finalize();
#endif
    std::exit(1);
}

void dist_sum(std::vector<double>* x) {
    if (dist_world_size() == 1 || x->empty()) return;
#ifdef LLMC_MPI
    MPI_Allreduce(MPI_IN_PLACE, x->data(), (int)x->size(), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
#endif
}

bool dist_all_ok(bool ok, const std::string& msg, std::string* err) {
    if (dist_world_size() == 1) {
        if (!ok && err) *err = msg;
        return ok;
    }
#ifdef LLMC_MPI
    // One MIN finds both whether anyone failed and the lowest rank that did.
    int mine = ok ? INT_MAX : dist_world_rank(), lowest = INT_MAX;
    MPI_Allreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (lowest == INT_MAX) return true;
    // That rank's message: its length, then its characters.
    const bool sender = dist_world_rank() == lowest;
    int len = sender ? (int)std::min<size_t>(msg.size(), INT_MAX) : 0;
    MPI_Bcast(&len, 1, MPI_INT, lowest, MPI_COMM_WORLD);
    std::string s = sender ? msg.substr(0, (size_t)len) : std::string((size_t)len, '\0');
    if (len) MPI_Bcast(&s[0], len, MPI_CHAR, lowest, MPI_COMM_WORLD);
    if (err) *err = s;
#endif
    return false;
}
