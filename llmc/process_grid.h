// llmc/process_grid.h: the ranks of a job and their groups.
//
// world = dp × cp × tp (room for pp later); tp varies fastest, then cp, then
// dp: world rank = (dp_rank·cp + cp_rank)·tp + tp_rank. The user gives --tp
// and --cp; dp is what remains. Groups: tp (same dp, cp), cp (same dp, tp),
// dp (same cp, tp), and dp×cp (same tp), over which gradients are reduced.
// Each rank picks its GPU by its node-local rank (MPI shared-memory split),
// which works under plain mpirun, multi-node, and Slurm.
//
// Without MPI in the build, or when started without mpirun, the world is
// one process and every group has size 1.
#pragma once
#include <memory>
#include <string>

#include "backend.h"
#include "comm.h"

// Call first in main (MPI_Init when built with MPI) and last.
void dist_init(int* argc, char*** argv);
void dist_finalize();
int dist_world_rank();
int dist_world_size();
int dist_local_rank();  // rank among the processes on this node

// Ends the whole job from one rank with its message (MPI_Abort when the
// world has several ranks): for errors that other ranks may not share, so
// nobody is left waiting in a collective.
[[noreturn]] void dist_abort(const std::string& msg);

// Agreement for errors found while setting up: every rank calls it with its
// own verdict. Returns true when all are ok. Otherwise it returns false on
// every rank, with *err set to the message of the lowest failing rank.
bool dist_all_ok(bool ok, const std::string& msg, std::string* err);

// Transport of the groups: "nccl" (CUDA default), "mpi" (MPI on host
// buffers for the CPU backend; staged through host memory for CUDA).
struct ProcessGrid {
    int world_rank = 0, world_size = 1;
    int dp = 1, cp = 1, tp = 1;
    int dp_rank = 0, cp_rank = 0, tp_rank = 0;
    std::unique_ptr<Comm> world, dp_group, cp_group, tp_group, dpcp_group;
};

// comm: "auto" (nccl on cuda, mpi on cpu), "nccl" or "mpi". Fails (false,
// *err naming the flag) when world % (tp·cp) != 0, when nccl is asked for on
// the CPU, or when the build lacks what is asked for.
bool make_process_grid(int tp, int cp, const std::string& comm, Backend& be, ProcessGrid* grid, std::string* err);
