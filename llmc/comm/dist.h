// llmc/comm/dist.h: the job's processes: MPI start-up and shutdown, the
// world rank and size, the node-local rank (which GPU a rank takes), and the
// two ways an error leaves a job: agreed by every rank (setup), or ended
// from one rank (anything later). Without MPI in the build, or when started
// without a launcher (mpirun, srun, mpiexec), the world is one process and
// MPI is not started at all: a single process must not depend on an MPI
// that cannot start without its launcher (a GPU machine's bundled Open MPI,
// say).
#pragma once
#include <functional>
#include <string>
#include <vector>

// When dist_init starts MPI: only under a launcher (the default), or always
// (programs that use MPI directly even alone, such as the communicator tests).
enum class MpiStart { if_launched, always };

// Whether the environment is that of a process an MPI launcher started:
// Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), PMIx (PMIX_RANK: Open MPI 5,
// srun --mpi=pmix), PMI (PMI_RANK, PMI_SIZE: MPICH's mpiexec, srun
// --mpi=pmi2), MPICH's hydra (MPI_LOCALNRANKS) or Slurm (SLURM_PROCID).
// getenv: the lookup (std::getenv in the program; a table in the tests).
bool launched_by_mpi(const std::function<const char*(const char*)>& getenv);

// Call first in main and last. With MPI in the build, starts it when `start`
// says so (MpiStart::if_launched: launched_by_mpi of the real environment).
void dist_init(int* argc, char*** argv, MpiStart start = MpiStart::if_launched);
void dist_finalize();
int dist_world_rank();
int dist_world_size();
int dist_local_rank();  // rank among the processes on this node
// The process's collective timeout, --collective-timeout in seconds (0:
// off): set right after the flags are read (every rank its own value until
// the flags are checked to agree), read by the start-up collectives below
// and by every communicator made after (llmc/comm/watchdog.h).
constexpr double kDefaultCollectiveTimeout = 300.0;
void set_collective_timeout(double seconds);
double collective_timeout();

// Whether any thread may call MPI (MPI_THREAD_MULTIPLE, asked for in builds
// with CUDA): the NCCL watchdog's thread then exchanges the arrival notes.
bool dist_mpi_threads();
int dist_local_size();  // processes on this node

// Ends the whole job from one rank with its message (MPI_Abort when the
// world has several ranks): for errors that other ranks may not share, so
// nobody is left waiting in a collective.
[[noreturn]] void dist_abort(const std::string& msg);

// The world collectives below are watched: a rank that does not come within
// --collective-timeout (collective_timeout(), llmc/comm/watchdog.h) ends the
// job with a line naming it (dist.cpp).

// Agreement for errors found while setting up: every rank calls it with its
// own verdict. Returns true when all are ok. Otherwise it returns false on
// every rank, with *err set to the message of the lowest failing rank.
bool dist_all_ok(bool ok, const std::string& msg, std::string* err);

// The element-wise sum of every rank's x, on every rank (a no-op alone):
// small host vectors (the experts' loads), uncounted like the other host
// helpers.
void dist_sum(std::vector<double>* x);

// Rank 0's string, on every rank (a no-op alone).
void dist_broadcast(std::string* s);

// Every rank's string, in rank order, on rank 0 (empty elsewhere): lines
// that rank 0 prints for all, so that one rank's line never lands inside
// another's long output (mpirun forwards each rank's output in pieces).
std::vector<std::string> dist_gather_strings(const std::string& mine);
