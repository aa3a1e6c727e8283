// llmc/process_grid.cpp: the job's processes (llmc/process_grid.h): MPI
// start-up and shutdown, errors that end or are agreed by every rank, and the
// dp × cp × tp grid with one communicator per group. Also LocalComm, the
// communicator of every group of one process (and of the whole world in
// builds without MPI).
#include "process_grid.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>

#ifdef LLMC_MPI
#include "comm_mpi.h"  // and MPI itself
#if defined(LLMC_CUDA)
#include "comm_nccl.h"
#include "comm_staged.h"
#endif
#endif

namespace {

// A group of one: nothing to exchange. Operations that move data between
// buffers copy through the backend (whose memory the buffers are); the rest
// do nothing. Never counted (Comm::count ignores groups of one).
class LocalComm : public Comm {
  public:
    LocalComm(const std::string& name, Backend& be) : be_(be) { name_ = name; }
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return 0; }
    CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) override {
        if (send != recv && recv_n) be_.copy(recv, send, recv_n * dtype_size(t));
        return 0;
    }
    CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) override {
        if (send != recv && send_n) be_.copy(recv, send, send_n * dtype_size(t));
        return 0;
    }
    void do_broadcast(void*, size_t, DType, int root) override { check(root, "broadcast root"); }
    CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) override {
        check(dst, "send_recv destination");
        check(src, "send_recv source");
        if (send != recv && n) be_.copy(recv, send, n * dtype_size(t));  // to ourselves
        return 0;
    }
    // To ourselves: each receive takes the send with its tag.
    void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) override {
        handles->assign(ops.size(), 0);
        for (const P2POp& r : ops) {
            check(r.peer, "p2p peer");
            if (r.send) continue;
            for (const P2POp& s : ops)
                if (s.send && s.tag == r.tag && s.buf != r.buf && r.n) be_.copy(r.buf, s.buf, r.n * dtype_size(t));
        }
    }
    void do_wait(CommHandle) override {}

  public:
    double host_all_reduce(double x, ReduceOp) override { return x; }

  private:
    void check(int r, const char* what) {
        if (r != 0)
            dist_abort("internal: " + std::string(what) + " " + std::to_string(r) + " in group " + name_ +
                       " of size 1");
    }
    Backend& be_;
};

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

void dist_init(int* argc, char*** argv) {
#ifdef LLMC_MPI
    int init = 0;
    MPI_Initialized(&init);
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

namespace {
enum class Transport { Mpi, Nccl, Staged };
}

bool make_process_grid(int tp, int cp, int pp, const std::string& comm, Backend& be, ProcessGrid* grid,
                       std::string* err) {
    auto fail = [&](const std::string& m) {
        if (err) *err = m;
        return false;
    };
    if (tp < 1) return fail("--tp " + std::to_string(tp) + ": must be at least 1");
    if (cp < 1) return fail("--cp " + std::to_string(cp) + ": must be at least 1");
    if (pp < 1) return fail("--pp " + std::to_string(pp) + ": must be at least 1");
    if (comm != "auto" && comm != "nccl" && comm != "mpi")
        return fail("--comm " + comm + ": expected auto, nccl or mpi");
    const std::string dev = be.name();
    if (dev != "cpu" && dev != "cuda") return fail("--comm " + comm + ": no communicator for the " + dev + " backend");
    if (comm == "nccl" && dev == "cpu")
        return fail("--comm nccl: NCCL needs the CUDA backend; the CPU backend communicates with --comm mpi (or auto)");
#if !defined(LLMC_MPI)
    if (comm != "auto") return fail("--comm " + comm + ": this build has no MPI (build with mpicxx and -DLLMC_MPI)");
#endif
    const int world = dist_world_size();
    if (world % (tp * cp * pp) != 0) {
        std::string m = "--pp " + std::to_string(pp) + " --tp " + std::to_string(tp) + " --cp " + std::to_string(cp) +
                        ": pp·tp·cp = " + std::to_string(pp * tp * cp) + " must divide the number of ranks, " +
                        std::to_string(world);
#if !defined(LLMC_MPI)
        m += " (this build has no MPI: one process only)";
#endif
        return fail(m);
    }
    Transport kind = Transport::Mpi;
    if (dev == "cuda") kind = comm == "mpi" ? Transport::Staged : Transport::Nccl;

    ProcessGrid& g = *grid;
    g.world_rank = dist_world_rank();
    g.world_size = world;
    g.tp = tp;
    g.cp = cp;
    g.pp = pp;
    g.dp = world / (tp * cp * pp);
    g.tp_rank = g.world_rank % tp;
    g.cp_rank = (g.world_rank / tp) % cp;
    g.dp_rank = (g.world_rank / (tp * cp)) % g.dp;
    g.pp_rank = g.world_rank / (tp * cp * g.dp);

    // One group: the ranks sharing `color`, ordered by `key`. Sizes are the
    // same on every rank, so all ranks take the same branch and the splits
    // (collective over the world) happen in the same order everywhere.
    // A rank that belongs to no group of this kind passes color -1 (it still
    // takes part in the split, which is collective) and gets a group of one.
    auto make = [&](const char* name, int color, int key, int size) -> std::unique_ptr<Comm> {
        if (size == 1) return std::unique_ptr<Comm>(new LocalComm(name, be));
#ifdef LLMC_MPI
        MPI_Comm sub;
        MPI_Comm_split(MPI_COMM_WORLD, color < 0 ? MPI_UNDEFINED : color, key, &sub);
        if (color < 0) return std::unique_ptr<Comm>(new LocalComm(name, be));
        std::unique_ptr<Comm> c;
        switch (kind) {
            case Transport::Mpi:
                c.reset(new MpiComm(sub, name));
                break;
#if defined(LLMC_CUDA)
            case Transport::Nccl:
                c.reset(new NcclComm(sub, name, be.native_stream()));
                break;
            case Transport::Staged:
                c.reset(new StagedComm(sub, name, be));
                break;
#else
            default:
                dist_abort("internal: a CUDA backend in a build without CUDA");
#endif
        }
        MPI_Comm_free(&sub);  // the communicators keep duplicates
        return c;
#else
        (void)color;
        (void)key;
        (void)kind;
        dist_abort("internal: a group of " + std::to_string(size) + " in a build without MPI");
#endif
    };
    // Colors number the groups of a kind; ranks are ordered in a group by key.
    const int r = g.world_rank, stage_ranks = g.dp * cp * tp, in_stage = r % stage_ranks;
    g.world = make("world", 0, r, world);
    g.dp_group = make("dp", (g.pp_rank * cp + g.cp_rank) * tp + g.tp_rank, g.dp_rank, g.dp);
    g.cp_group = make("cp", (g.pp_rank * g.dp + g.dp_rank) * tp + g.tp_rank, g.cp_rank, cp);
    g.tp_group = make("tp", (g.pp_rank * g.dp + g.dp_rank) * cp + g.cp_rank, g.tp_rank, tp);
    g.dpcp_group = make("dpcp", g.pp_rank * tp + g.tp_rank, g.dp_rank * cp + g.cp_rank, g.dp * cp);
    g.pp_group = make("pp", in_stage, g.pp_rank, pp);
    const bool end_stage = g.pp_rank == 0 || g.pp_rank == pp - 1;
    g.embed_group = make("embed", end_stage ? in_stage : -1, g.pp_rank, pp > 1 ? 2 : 1);
    return true;
}
