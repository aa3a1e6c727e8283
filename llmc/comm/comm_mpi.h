// llmc/comm/comm_mpi.h: MpiComm, the communicator of the CPU backend: MPI
// collectives on host buffers, non-blocking where comm.h has a start_ form.
// bf16 buffers (uint16 in memory) are reduced by user-defined MPI operations
// that add (or compare) in fp32 and round to nearest even, as NCCL does.
// StagedComm (comm_staged.h) runs its host side through one of these.
// Exists only in builds with MPI (LLMC_MPI).
//
// Watchdog: every call, broadcast and host_all_reduce included, is
// non-blocking underneath, and wait() polls its requests (MPI_Testall, then
// short sleeps) against --collective-timeout (llmc/comm/watchdog.h). Each
// call is counted in the group's Arrivals (llmc/comm/arrivals.h) as it is
// issued; a wait that grows long tells the peers our counts and reads
// theirs, and at the timeout the line names the call, the group, the ranks
// that did not arrive and the ranks heard from on no group, and the job
// ends (dist_abort: MPI_Abort).
#pragma once
#ifdef LLMC_MPI
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "llmc/comm/arrivals.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/mpi.h"

class MpiComm : public Comm {
  public:
    // Collective over comm: every rank of it constructs one. comm is
    // duplicated (the caller keeps and frees its own), so our traffic never
    // matches messages of other code on the same ranks.
    // max_count: the most elements handed to one MPI call (MPI counts are
    // int); longer buffers go in pieces. Tests lower it to reach those paths.
    MpiComm(MPI_Comm comm, const std::string& name, size_t max_count = (size_t)INT_MAX);
    ~MpiComm() override;
    MpiComm(const MpiComm&) = delete;
    MpiComm& operator=(const MpiComm&) = delete;

    double host_all_reduce(double x, ReduceOp op) override;
    void host_all_reduce_n(double* x, size_t n, ReduceOp op) override;

    MPI_Comm mpi_comm() const { return comm_; }

  protected:
    CommHandle do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) override;
    CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) override;
    CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) override;
    void do_broadcast(void* buf, size_t n, DType t, int root) override;
    CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) override;
    void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) override;
    void do_wait(CommHandle h) override;

  private:
    using Expect = Arrivals::Expect;
    // A call in flight: its requests and, for an in-place reduce-scatter, the
    // block received aside (MPI forbids send and receive buffers that
    // overlap) that wait() copies to its place; what it is, for the
    // watchdog's line.
    struct Pending {
        std::vector<MPI_Request> reqs;
        std::vector<char> tmp;
        void* copy_to = nullptr;
        const char* kind = "";
        std::vector<Expect> expect;
    };
    Pending& add_pending(CommHandle* h);
    Pending& add_collective(CommHandle* h, const char* kind);  // the group's next collective
    // Waits for p's requests, watched; then p is complete.
    void wait_pending(Pending& p);
    [[noreturn]] void timed_out(const Pending& p, double since, double waited);
    MPI_Datatype mpi_type(DType t) const;
    MPI_Op mpi_op(DType t, ReduceOp op) const;

    MPI_Comm comm_ = MPI_COMM_NULL;
    MPI_Op bf16_sum_ = MPI_OP_NULL, bf16_max_ = MPI_OP_NULL;
    size_t max_count_;
    CommHandle next_ = 1;
    // unordered_map: references to entries stay valid while others are added,
    // and MPI holds pointers into an entry's tmp until wait().
    std::unordered_map<CommHandle, Pending> pending_;

    // The watchdog (see above): its timeout and the group's counts.
    double timeout_;
    std::unique_ptr<Arrivals> arrivals_;
};
#endif  // LLMC_MPI
