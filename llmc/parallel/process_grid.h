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
// Each rank picks its GPU by its node-local rank (llmc/comm/dist.h).
// Without MPI in the build, or when started without mpirun, the world is
// one process and every group has size 1 (llmc/comm/comm_local.h).
#pragma once
#include <memory>
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/dist.h"

// Transport of the groups: "nccl" (CUDA default), "mpi" (MPI on host
// buffers for the CPU backend; staged through host memory for CUDA).
struct ProcessGrid {
    int world_rank = 0, world_size = 1;
    int pp = 1, dp = 1, cp = 1, tp = 1;
    int pp_rank = 0, dp_rank = 0, cp_rank = 0, tp_rank = 0;
    std::unique_ptr<Comm> world, dp_group, cp_group, tp_group, dpcp_group, pp_group, embed_group;
    int cp_a2a = 1;
    std::unique_ptr<Comm> cp_a2a_group, cp_ring_group;  // hybrid only (null otherwise)
    // Expert parallel (ep > 1 only, null otherwise): ep groups of ep
    // consecutive dp ranks (same dp_rank / ep, same cp rank: the experts'
    // all-to-all) and expert-data groups (same dp_rank % ep, every cp rank:
    // the dp x cp ranks holding the same experts, which reduce their
    // gradients and shard them under ZeRO).
    int ep = 1;
    std::unique_ptr<Comm> ep_group, edp_group;
};

// comm: "auto" (nccl on cuda, mpi on cpu), "nccl" or "mpi". Fails (false,
// *err naming the flag) when world % (pp·tp·cp) != 0, when nccl is asked for
// on the CPU, when cp_a2a does not divide cp, or when the build lacks what
// is asked for.
bool make_process_grid(int tp, int cp, int pp, const std::string& comm, Backend& be, ProcessGrid* grid,
                       std::string* err, int cp_a2a = 1, int ep = 1);
