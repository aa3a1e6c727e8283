// llmc/comm/dist.cpp: the job's processes (llmc/comm/dist.h).
#include "llmc/comm/dist.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "llmc/base/test_hooks.h"

#ifdef LLMC_MPI
#include "llmc/comm/arrivals.h"
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
bool g_threads = false;  // MPI_THREAD_MULTIPLE provided

bool mpi_live() {
    int init = 0, fin = 0;
    MPI_Initialized(&init);
    MPI_Finalized(&fin);
    return init && !fin;
}

// ---- the start-up collectives' watchdog ----
// The world collectives below (agreeing on errors, sharing strings) run
// before the process grid and its watched groups exist, and while ranks
// read files at different speeds. Each is non-blocking underneath and
// waited for as the groups' calls are (watched_wait, llmc/comm/arrivals.h)
// against --collective-timeout (collective_timeout(): every rank's own
// value from the moment its flags are read, 300 s before), counted in the
// world's Arrivals, so a rank that never comes ends the job with a line
// naming it rather than leave the others waiting.
std::unique_ptr<Arrivals> g_world_arrivals;

// Test hook (llmc/base/test_hooks.h): LLMC_TEST_STALL_SETUP=R:K makes world
// rank R sleep an hour before its K-th start-up collective.
void setup_test_stall(uint64_t k) {
    static int rank = -2;
    static long at = 0;
    if (rank == -2) {
        std::string err;
        if (!test_hooks::stall_setup(&rank, &at, &err)) dist_abort(err);
    }
    if (rank < 0 || rank != dist_world_rank() || (long)k != at) return;
    std::fprintf(stderr, "train_gpt: test: rank %d stalls before its start-up collective %ld (LLMC_TEST_STALL_SETUP)\n",
                 rank, at);
    std::fflush(stderr);
    for (int i = 0; i < 3600; i++) ::sleep(1);
}

// Entering a start-up collective: what it needs of the others (and the test's stall).
Arrivals::Expect enter() {
    const Arrivals::Expect e = g_world_arrivals->collective();
    setup_test_stall(e.seq);
    return e;
}

// Waits for r, watched; `what` names the call.
void wait_watched(MPI_Request* r, const char* what, const Arrivals::Expect& e) {
    watched_wait(r, 1, collective_timeout(), [&](double since, double waited) {
        char b[200];
        std::snprintf(b, sizeof b,
                      "start-up collective timed out: %s (the world's start-up collective %llu) has not completed "
                      "after %.1f s (--collective-timeout %g); ",
                      what, (unsigned long long)e.seq, waited, collective_timeout());
        dist_abort(b + g_world_arrivals->late({e}, since) + "; ending every rank");
    });
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
        // OpenMP threads compute, never talk. The CPU transport calls MPI from
        // the main thread only; with CUDA, the NCCL transport's watchdog
        // thread tells the other ranks its counts over MPI in a long wait
        // (llmc/comm/arrivals.h), which needs every thread allowed.
#ifdef LLMC_CUDA
        const int want = MPI_THREAD_MULTIPLE;
#else
        const int want = MPI_THREAD_FUNNELED;
#endif
        int provided = 0;
        MPI_Init_thread(argc, argv, want, &provided);
        g_started_mpi = true;
    }
    int level = 0;
    MPI_Query_thread(&level);
    g_threads = level == MPI_THREAD_MULTIPLE;
    MPI_Comm node;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &g_local_rank);
    MPI_Comm_size(node, &g_local_size);
    MPI_Comm_free(&node);
    g_world_arrivals.reset(new Arrivals(MPI_COMM_WORLD, "world"));
#else
    (void)argc;
    (void)argv;
    (void)start;
#endif
}

void dist_finalize() {
#ifdef LLMC_MPI
    if (!mpi_live()) return;
    g_world_arrivals.reset();  // (reads the notes a peer sent in its last long wait)
    if (g_started_mpi) MPI_Finalize();
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

namespace {
// One value per process: the transports read it when their groups are made.
double g_timeout = kDefaultCollectiveTimeout;
}  // namespace

void set_collective_timeout(double seconds) { g_timeout = seconds > 0 ? seconds : 0; }
double collective_timeout() { return g_timeout; }

bool dist_mpi_threads() {
#ifdef LLMC_MPI
    return g_threads;
#else
    return false;
#endif
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
    MPI_Request r;
    const Arrivals::Expect e = enter();
    MPI_Ibcast(&len, 1, MPI_INT, 0, MPI_COMM_WORLD, &r);
    wait_watched(&r, "broadcast of rank 0's string", e);
    s->resize((size_t)len);
    if (len) {
        MPI_Ibcast(&(*s)[0], len, MPI_CHAR, 0, MPI_COMM_WORLD, &r);
        wait_watched(&r, "broadcast of rank 0's string", e);
    }
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
    MPI_Request r;
    const Arrivals::Expect e = enter();
    MPI_Igather(&len, 1, MPI_INT, lens.data(), 1, MPI_INT, 0, MPI_COMM_WORLD, &r);
    wait_watched(&r, "gather of every rank's string", e);
    std::string joined;
    if (rank == 0) {
        size_t total = 0;
        for (int r = 0; r < world; r++) offs[r] = (int)total, total += (size_t)lens[r];
        joined.resize(total);
    }
    MPI_Igatherv(mine.data(), len, MPI_CHAR, rank == 0 ? &joined[0] : nullptr, lens.data(), offs.data(), MPI_CHAR, 0,
                 MPI_COMM_WORLD, &r);
    wait_watched(&r, "gather of every rank's string", e);
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
    MPI_Request r;
    const Arrivals::Expect e = enter();
    MPI_Iallreduce(MPI_IN_PLACE, x->data(), (int)x->size(), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD, &r);
    wait_watched(&r, "sum of host values", e);
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
    MPI_Request r;
    const Arrivals::Expect e = enter();
    MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD, &r);
    wait_watched(&r, "agreement on a setup check", e);
    if (lowest == INT_MAX) return true;
    // That rank's message: its length, then its characters.
    const bool sender = dist_world_rank() == lowest;
    int len = sender ? (int)std::min<size_t>(msg.size(), INT_MAX) : 0;
    MPI_Ibcast(&len, 1, MPI_INT, lowest, MPI_COMM_WORLD, &r);
    wait_watched(&r, "a setup error's message", e);
    std::string s = sender ? msg.substr(0, (size_t)len) : std::string((size_t)len, '\0');
    if (len) {
        MPI_Ibcast(&s[0], len, MPI_CHAR, lowest, MPI_COMM_WORLD, &r);
        wait_watched(&r, "a setup error's message", e);
    }
    if (err) *err = s;
#endif
    return false;
}
