// llmc/comm/dist.h: the job's processes: MPI start-up and shutdown, the
// world rank and size, the node-local rank (which GPU a rank takes), and the
// two ways an error leaves a job: agreed by every rank (setup), or ended
// from one rank (anything later). Without MPI in the build, or when started
// without mpirun, the world is one process.
#pragma once
#include <string>

// Call first in main (MPI_Init when built with MPI) and last.
void dist_init(int* argc, char*** argv);
void dist_finalize();
int dist_world_rank();
int dist_world_size();
int dist_local_rank();  // rank among the processes on this node
int dist_local_size();  // processes on this node

// Ends the whole job from one rank with its message (MPI_Abort when the
// world has several ranks): for errors that other ranks may not share, so
// nobody is left waiting in a collective.
[[noreturn]] void dist_abort(const std::string& msg);

// Agreement for errors found while setting up: every rank calls it with its
// own verdict. Returns true when all are ok. Otherwise it returns false on
// every rank, with *err set to the message of the lowest failing rank.
bool dist_all_ok(bool ok, const std::string& msg, std::string* err);

// Rank 0's string, on every rank (a no-op alone).
void dist_broadcast(std::string* s);
