// llmc/parallel/process_grid.cpp: the pp × dp × cp × tp grid of a layout, its
// groups, and one communicator per group, real or shapes only
// (llmc/parallel/process_grid.h).
#include "llmc/parallel/process_grid.h"

#include <stdexcept>
#include <utility>

#include "llmc/comm/comm_local.h"
#include "llmc/comm/comm_shape.h"
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

GridPlace grid_place(const Layout& l, int r) {
    const int dp = l.dp();
    GridPlace p;
    p.tp = r % l.tp;
    p.cp = (r / l.tp) % l.cp;
    p.dp = (r / (l.tp * l.cp)) % dp;
    p.pp = r / (l.tp * l.cp * dp);
    return p;
}

// Colors number the groups of a kind; a rank's place in its group is the
// order of the ranks in it.
std::vector<GroupSpec> group_specs(const Layout& l, int r) {
    const GridPlace p = grid_place(l, r);
    const int tp = l.tp, cp = l.cp, pp = l.pp, dp = l.dp(), ep = l.ep, world = l.world;
    const int stage_ranks = dp * cp * tp, in_stage = r % stage_ranks;
    std::vector<GroupSpec> g;
    g.push_back({"world", 0, r, world});
    g.push_back({"dp", (p.pp * cp + p.cp) * tp + p.tp, p.dp, dp});
    g.push_back({"cp", (p.pp * dp + p.dp) * tp + p.tp, p.cp, cp});
    g.push_back({"tp", (p.pp * dp + p.dp) * cp + p.cp, p.tp, tp});
    g.push_back({"dpcp", p.pp * tp + p.tp, p.dp * cp + p.cp, dp * cp});
    g.push_back({"pp", in_stage, p.pp, pp});
    // The stages of the first and the last virtual stage (tied wte): stage 0
    // and the last, or stage 0 alone under ZBV (its V ends where it starts).
    const int head_stage = pipe_stage_of(l.pp_order, pp, pp * pipe_chunks_per_stage(l.pp_order, l.vpp) - 1);
    const bool end_stage = p.pp == 0 || p.pp == head_stage;
    g.push_back({"embed", end_stage ? in_stage : -1, p.pp == head_stage && head_stage > 0 ? 1 : 0,
                 head_stage > 0 ? 2 : 1});
    if (l.cp_hybrid()) {  // the cp group's a2a groups and rings
        const int n = l.cp_a2a, cp_color = (p.pp * dp + p.dp) * tp + p.tp, groups = cp / n;
        g.push_back({"cp_a2a", cp_color * groups + p.cp / n, p.cp % n, n});
        g.push_back({"cp_ring", cp_color * n + p.cp % n, p.cp / n, groups});
    }
    if (ep > 1) {  // (ep divides dp: check_world)
        const int dp_color = (p.pp * cp + p.cp) * tp + p.tp, groups = dp / ep;
        g.push_back({"ep", dp_color * groups + p.dp / ep, p.dp % ep, ep});
        // Over dp x cp, as the dense weights' group (dpcp): cp ranks hold the same weights.
        g.push_back({"edp", (p.pp * tp + p.tp) * ep + p.dp % ep, (p.dp / ep) * cp + p.cp, groups * cp});
    }
    return g;
}

// Each group of a grid in its field (the names of group_specs).
static std::unique_ptr<Comm>* field_of(ProcessGrid& g, const std::string& name) {
    std::unique_ptr<Comm>* f = name == "world" ? &g.world : name == "dp" ? &g.dp_group : name == "cp" ? &g.cp_group
                             : name == "tp" ? &g.tp_group : name == "dpcp" ? &g.dpcp_group : name == "pp" ? &g.pp_group
                             : name == "embed" ? &g.embed_group : name == "cp_a2a" ? &g.cp_a2a_group
                             : name == "cp_ring" ? &g.cp_ring_group : name == "ep" ? &g.ep_group
                             : name == "edp" ? &g.edp_group : nullptr;
    if (!f) throw std::logic_error("process grid: no group named " + name);
    return f;
}

static RankGroups rank_groups(const std::vector<std::pair<std::string, Comm*>>& named, int cp_rank) {
    RankGroups r;
    r.cp_rank = cp_rank;
    for (const auto& n : named) {
        Comm* c = n.second;
        if (n.first == "tp") r.tp = c;
        else if (n.first == "cp") r.cp = c;
        else if (n.first == "dpcp") r.dpcp = c;
        else if (n.first == "pp") r.pp = c;
        else if (n.first == "embed") r.embed = c;
        else if (n.first == "cp_a2a") r.cp_a2a = c;
        else if (n.first == "cp_ring") r.cp_ring = c;
        else if (n.first == "ep") r.ep = c;
        else if (n.first == "edp") r.edp = c;
    }
    return r;
}

RankGroups ProcessGrid::groups() const {
    RankGroups g = rank_groups({{"tp", tp_group.get()},
                        {"cp", cp_group.get()},
                        {"dpcp", dpcp_group.get()},
                        {"pp", pp_group.get()},
                        {"embed", embed_group.get()},
                        {"cp_a2a", cp_a2a_group.get()},
                        {"cp_ring", cp_ring_group.get()},
                        {"ep", ep_group.get()},
                        {"edp", edp_group.get()}},
                       cp_rank);
    g.world = world.get();
    return g;
}

void make_shape_groups(const Layout& l, int world_rank, bool refuse, ShapeGroups* out) {
    std::vector<std::pair<std::string, Comm*>> named;
    out->owned.clear();
    for (const GroupSpec& s : group_specs(l, world_rank)) {
        // A rank in no group of the kind has a group of one (as the grid gives it).
        out->owned.emplace_back(s.color < 0 ? new ShapeComm(s.name, 1, 0, refuse)
                                            : new ShapeComm(s.name, s.size, s.rank, refuse));
        named.push_back({s.name, out->owned.back().get()});
    }
    out->groups = rank_groups(named, grid_place(l, world_rank).cp);
}

bool make_process_grid(const Layout& l, const std::string& comm, Backend& be, ProcessGrid* grid, std::string* err) {
    auto fail = [&](const std::string& m) {
        if (err) *err = m;
        return false;
    };
    std::string why;
    if (!check_world(l, &why)) return fail(why);
    if (comm != "auto" && comm != "nccl" && comm != "mpi")
        return fail("flag --comm: " + comm + ": expected auto, nccl or mpi");
    const std::string dev = be.name();
    if (dev != "cpu" && dev != "cuda")
        return fail("flag --comm: " + comm + ": no communicator for the " + dev + " backend");
    if (comm == "nccl" && dev == "cpu")
        return fail("flag --comm nccl: NCCL needs the CUDA backend; the CPU backend communicates with --comm mpi (or "
                    "auto)");
#if !defined(LLMC_MPI)
    if (comm != "auto") return fail("flag --comm " + comm + ": this build has no MPI (build with mpicxx and -DLLMC_MPI)");
#endif
    const int world = dist_world_size();
    if (l.world != world)
        return fail("process grid: a layout of " + std::to_string(l.world) + " ranks in a job of " +
                    std::to_string(world)
#if !defined(LLMC_MPI)
                    + " (this build has no MPI: one process only)"
#endif
        );
    Transport kind = Transport::Mpi;
    if (dev == "cuda") kind = comm == "mpi" ? Transport::Staged : Transport::Nccl;

    ProcessGrid& g = *grid;
    g.world_rank = dist_world_rank();
    const GridPlace p = grid_place(l, g.world_rank);
    g.tp_rank = p.tp;
    g.cp_rank = p.cp;
    g.dp_rank = p.dp;
    g.pp_rank = p.pp;

    // One group: the ranks sharing `color`, ordered by their place. Sizes
    // are the same on every rank, so all ranks take the same branch and the
    // splits (collective over the world) happen in the same order everywhere.
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
    for (const GroupSpec& s : group_specs(l, g.world_rank)) *field_of(g, s.name) = make(s.name, s.color, s.rank, s.size);
    return true;
}
