// llmc/parallel/process_grid.h: the ranks of a job and their groups.
//
// world = pp × dp × cp × tp; tp varies fastest, then cp, then dp, and pp is
// outermost (so that pipeline stages, which exchange the least, can sit on
// different nodes): world rank = ((pp_rank·dp + dp_rank)·cp + cp_rank)·tp +
// tp_rank. The user gives --pp, --tp and --cp; dp is what remains. Groups,
// all within one pipeline stage unless said: tp (same pp, dp, cp), cp (same
// pp, dp, tp), dp (same pp, cp, tp), dp×cp (same pp, tp), over which
// gradients are reduced; pp (same dp, cp, tp: one rank per stage), and the
// embedding group (the first and the last stage's ranks of one pp group,
// which both hold the tied wte; size 1 when pp = 1). Hybrid context parallel
// (all-to-all groups of cp_a2a ranks, 1 < cp_a2a < cp) splits the cp group
// twice: cp_a2a (cp ranks c with the same c / cp_a2a: consecutive) and
// cp_ring (the same c % cp_a2a: one rank of each a2a group, in order).
// Expert parallel adds the ep and expert-data groups (below). The degrees
// are the layout's (llmc/parallel/layout.h); nothing here copies them. Each rank picks its GPU by its node-local rank (llmc/comm/dist.h).
// Without MPI in the build, or when started without mpirun, the world is
// one process and every group has size 1 (llmc/comm/comm_local.h).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/dist.h"
#include "llmc/parallel/layout.h"

// Where a world rank sits along each axis of a layout.
struct GridPlace {
    int pp = 0, dp = 0, cp = 0, tp = 0;
};
GridPlace grid_place(const Layout& l, int world_rank);

// One group of a rank: its kind's name, which group of that kind it is
// (color; -1: the rank is in none, as a middle pipeline stage in the
// embedding group), the group's size and the rank's place in it.
struct GroupSpec {
    const char* name;
    int color, rank, size;
};
// Every group of a world rank, in the order the grid makes them (the same
// kinds in the same order on every rank): world, dp, cp, tp, dpcp, pp,
// embed; cp_a2a and cp_ring under hybrid context parallel; ep and edp under
// expert parallel. The one place the groups are derived from the layout.
std::vector<GroupSpec> group_specs(const Layout& l, int world_rank);

// A rank's groups as the model stack takes them (llmc/parallel/model_stack.h):
// real communicators, or shapes only for the planner and the tests; its
// place along the context-parallel axis; hybrid context parallel's two
// splits of the cp group and expert parallel's groups (null otherwise).
struct RankGroups {
    Comm *tp = nullptr, *cp = nullptr, *dpcp = nullptr, *pp = nullptr, *embed = nullptr;
    int cp_rank = 0;
    Comm *cp_a2a = nullptr, *cp_ring = nullptr;
    Comm *ep = nullptr, *edp = nullptr;  // expert parallel (ep > 1)
    Comm* world = nullptr;  // every rank (the optimizer's verdict; null in the planner's shapes)
};

// Transport of the groups: "nccl" (CUDA default), "mpi" (MPI on host
// buffers for the CPU backend; staged through host memory for CUDA).
struct ProcessGrid {
    int world_rank = 0;
    int pp_rank = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0;
    std::unique_ptr<Comm> world, dp_group, cp_group, tp_group, dpcp_group, pp_group, embed_group;
    std::unique_ptr<Comm> cp_a2a_group, cp_ring_group;  // hybrid only (null otherwise)
    // Expert parallel (ep > 1 only, null otherwise): ep groups of ep
    // consecutive dp ranks (same dp_rank / ep, same cp rank: the experts'
    // all-to-all) and expert-data groups (same dp_rank % ep, every cp rank:
    // the dp x cp ranks holding the same experts, which reduce their
    // gradients and shard them under ZeRO).
    std::unique_ptr<Comm> ep_group, edp_group;
    RankGroups groups() const;
};

// The groups of layout l (checked here with check_world, so a layout that
// does not fit the world is refused in its words) over transport comm:
// "auto" (nccl on cuda, mpi on cpu), "nccl" or "mpi". Fails (false, *err
// naming the flag) also when nccl is asked for on the CPU or when the build
// lacks what is asked for. l.world must be the job's world size.
bool make_process_grid(const Layout& l, const std::string& comm, Backend& be, ProcessGrid* grid, std::string* err);

// World rank r's groups of layout l as ShapeComm (llmc/comm/comm_shape.h):
// the shapes of the groups make_process_grid would make there, owned here.
// refuse: calls that move data throw (the planner's stacks are never run).
struct ShapeGroups {
    std::vector<std::unique_ptr<Comm>> owned;
    RankGroups groups;
};
void make_shape_groups(const Layout& l, int world_rank, bool refuse, ShapeGroups* out);
