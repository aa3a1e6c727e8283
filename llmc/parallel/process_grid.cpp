// llmc/parallel/process_grid.cpp: the pp × dp × cp × tp grid of a job and
// one communicator per group (llmc/parallel/process_grid.h).
#include "llmc/parallel/process_grid.h"

#include "llmc/comm/comm_local.h"
#ifdef LLMC_MPI
#include "llmc/comm/comm_mpi.h"  // and MPI itself
#if defined(LLMC_CUDA)
#include "llmc/comm/comm_nccl.h"
#include "llmc/comm/comm_staged.h"
#endif
#endif

namespace {
enum class Transport { Mpi, Nccl, Staged };
}

bool make_process_grid(int tp, int cp, int pp, const std::string& comm, Backend& be, ProcessGrid* grid,
                       std::string* err, int cp_a2a, int ep) {
    auto fail = [&](const std::string& m) {
        if (err) *err = m;
        return false;
    };
    if (tp < 1) return fail("--tp " + std::to_string(tp) + ": must be at least 1");
    if (cp < 1) return fail("--cp " + std::to_string(cp) + ": must be at least 1");
    if (pp < 1) return fail("--pp " + std::to_string(pp) + ": must be at least 1");
    if (cp_a2a < 1 || cp % cp_a2a != 0)
        return fail("--cp-a2a " + std::to_string(cp_a2a) + ": must divide --cp " + std::to_string(cp));
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
    const long long degrees = (long long)tp * cp * pp;  // 64 bits: huge degrees would wrap an int to 0
    if (degrees > world || world % degrees != 0) {
        std::string m = "--pp " + std::to_string(pp) + " --tp " + std::to_string(tp) + " --cp " + std::to_string(cp) +
                        ": pp·tp·cp = " + std::to_string(degrees) + " must divide the number of ranks, " +
                        std::to_string(world);
#if !defined(LLMC_MPI)
        m += " (this build has no MPI: one process only)";
#endif
        return fail(m);
    }
    if (ep < 1 || (world / degrees) % ep != 0)
        return fail("--ep " + std::to_string(ep) + ": must divide the " + std::to_string(world / degrees) +
                    " data-parallel ranks");
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
    // Hybrid context parallel: the cp group's a2a groups and rings.
    g.cp_a2a = cp_a2a;
    if (cp_a2a > 1 && cp_a2a < cp) {
        const int cp_color = (g.pp_rank * g.dp + g.dp_rank) * tp + g.tp_rank, groups = cp / cp_a2a;
        g.cp_a2a_group = make("cp_a2a", cp_color * groups + g.cp_rank / cp_a2a, g.cp_rank % cp_a2a, cp_a2a);
        g.cp_ring_group = make("cp_ring", cp_color * cp_a2a + g.cp_rank % cp_a2a, g.cp_rank / cp_a2a, groups);
    }
    g.ep = ep;
    if (ep > 1) {  // (ep divides dp: checked above)
        const int dp_color = (g.pp_rank * cp + g.cp_rank) * tp + g.tp_rank, groups = g.dp / ep;
        g.ep_group = make("ep", dp_color * groups + g.dp_rank / ep, g.dp_rank % ep, ep);
        // Over dp x cp, as the dense weights' group (dpcp): cp ranks hold the same weights.
        g.edp_group = make("edp", (g.pp_rank * tp + g.tp_rank) * ep + g.dp_rank % ep, (g.dp_rank / ep) * cp + g.cp_rank,
                           groups * cp);
    }
    return true;
}
