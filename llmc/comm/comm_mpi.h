// llmc/comm/comm_mpi.h: MpiComm, the communicator of the CPU backend: MPI
// collectives on host buffers, non-blocking where comm.h has a start_ form.
// bf16 buffers (uint16 in memory) are reduced by user-defined MPI operations
// that add (or compare) in fp32 and round to nearest even, as NCCL does.
// StagedComm (comm_staged.h) runs its host side through one of these.
// Exists only in builds with MPI (LLMC_MPI).
//
// Watchdog: every call, broadcast and host_all_reduce included, is
// non-blocking underneath, and wait() polls its requests (MPI_Testall, then
// short sleeps) against --collective-timeout (llmc/comm/watchdog.h). To
// name the ranks that never arrived, each rank counts what it has issued
// on the group (collectives; sends to and receives from each peer), and a
// rank whose wait grows long tells its peers on every group its counts, on
// a duplicate communicator of each group. A rank that times out compares
// what it waits for with what its peers told it: a peer that never said it
// reached the call did not arrive (or is stuck before it). Every long wait
// tells its counts at least once, so a rank not heard from on any group
// since our wait began is waiting in no call at all: stalled, or still
// computing. The line names the call, the group, the ranks that did not
// arrive and the ranks heard from on no group, and the job ends
// (dist_abort: MPI_Abort).
#pragma once
#ifdef LLMC_MPI
#include <climits>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

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
    // What a call needs of one peer, or of every rank (peer -1): to have
    // issued its seq-th collective, send to us, or receive from us.
    struct Expect {
        enum What { Collective, SendToUs, RecvFromUs } what;
        int peer;
        uint64_t seq;
    };
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
    // The watchdog's exchange: tell the peers our counts (when they changed),
    // and read what they told us.
    void announce(bool again);
    void drain();
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

    // The watchdog (see above). Our counts: collectives issued, and
    // transfers issued to and from each group rank; theirs, as last told.
    double timeout_;
    MPI_Comm watch_ = MPI_COMM_NULL;
    std::vector<int> world_of_;  // group rank -> world rank
    uint64_t coll_seq_ = 0;
    std::vector<uint64_t> sends_to_, recvs_from_;
    std::vector<uint64_t> told_coll_, told_sends_, told_recvs_;  // peer's collectives, its sends to us, receives from us
    std::vector<double> heard_;  // when each peer's last note came (host clock, s)
    uint64_t announced_ = 0;  // the sum of our counts when last told (they only grow)
    struct Note {
        uint64_t v[3];
        MPI_Request req;
    };
    std::vector<std::unique_ptr<Note>> notes_;  // our messages still being sent
};
#endif  // LLMC_MPI
