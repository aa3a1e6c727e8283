// llmc/comm/comm.h: collective communication on a group of ranks, one interface
// for every transport:
//   MpiComm       MPI on host buffers (the CPU backend);
//   NcclComm      NCCL on device buffers, on the rank's one communication
//                 stream, with a watchdog (GPU default);
//   StagedComm    MPI through host memory for device buffers (--comm mpi), so
//                 several ranks can share one GPU, which NCCL refuses.
// Buffers are backend memory of the backend the group was made for.
//
// Every call is counted per group and per kind (calls, and bytes a rank
// sends with ring algorithms: all-reduce 2·n·(g-1)/g, reduce-scatter and
// all-gather n·(g-1)/g for n elements of the full buffer, broadcast n,
// send n), so reports can be checked against docs/design.md section 6.
//
// Asynchrony: start_* calls return a handle and may run while the caller
// computes (NCCL: a communication stream ordered after the work already
// issued on the compute stream; MPI: non-blocking collectives). wait()
// orders later compute after the collective. A group of size 1 does nothing
// (no counts).
//
// Order (the rule every caller keeps): the calls of all groups can be put
// in one global order that every rank issues its own calls in. The parallel
// modes keep it by construction: the ranks of a pipeline stage run the same
// code path, so the k-th call of one is the k-th call of every other, and
// between stages the only calls are the pipeline's transfers, issued in
// tick order on both ends (and the embedding group's all-reduce after
// them). NCCL runs all the groups of a rank on one stream, in issue order
// (llmc/comm/comm_nccl.h), so the devices follow that global order and
// collectives of different groups cannot deadlock against each other.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "llmc/base/dtype.h"

enum class CommKind : int { AllReduce, ReduceScatter, AllGather, Broadcast, SendRecv, count };
const char* comm_kind_name(CommKind k);
enum class ReduceOp : int { Sum, Max };

struct CommCounts {
    uint64_t calls[(int)CommKind::count] = {};
    uint64_t bytes[(int)CommKind::count] = {};  // ring-algorithm bytes sent by this rank
    uint64_t total_bytes() const;
    void reset() { *this = CommCounts(); }
};

// Opaque handle of a collective in flight; 0 means "already complete".
using CommHandle = uint64_t;

// One transfer of a point-to-point group (start_p2p): send n elements of
// buf to `peer`, or receive n into it from `peer`. The tag tells apart
// messages between the same two ranks that are in flight together (MPI);
// NCCL matches them by their order in the group, which is the same on both
// sides because both sides build their groups from the same schedule.
struct P2POp {
    bool send;
    void* buf;
    int peer;
    size_t n;
    int tag;
};

class Comm {
  public:
    virtual ~Comm() {}
    const std::string& name() const { return name_; }
    int rank() const { return rank_; }
    int size() const { return size_; }
    CommCounts& counts() { return counts_; }

    // In place: buf (n elements) becomes the reduction over the group.
    CommHandle start_all_reduce(void* buf, size_t n, DType t, ReduceOp op);
    // send holds size()·recv_n elements; rank r receives the sum of block r.
    // recv may be send + rank()·recv_n (in place).
    CommHandle start_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t);
    // Each rank contributes send_n elements; recv gets size()·send_n, rank
    // r's block at r·send_n. send may be recv + rank()·send_n (in place).
    CommHandle start_all_gather(const void* send, void* recv, size_t send_n, DType t);
    void broadcast(void* buf, size_t n, DType t, int root);
    // Sends n elements to rank dst and receives n from rank src, at once.
    CommHandle start_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t);
    // Several sends and receives to and from any ranks of the group, issued
    // together (NCCL: one group call, so they progress together and cannot
    // deadlock against a peer's group holding the matching operations).
    // handles[i] completes ops[i]: wait for each (a receive before its data
    // is read, a send before its buffer is reused), so that waiting for a
    // receive never waits for a send that needs the peer's progress.
    // Counted as one send-recv call per send.
    void start_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles);
    // All-to-all with per-peer sizes (MPI_Alltoallv's pattern, for expert
    // parallelism's dispatch and return): send holds send_n[p] elements for
    // each peer p in rank order, recv gets recv_n[p] from each peer p in rank
    // order; every pair's sizes must agree (exchange them first). Built on
    // start_p2p, so every transport has it and it is counted as sends. The
    // rank's own block is not sent: the caller copies it (it owns the
    // backend; a group of size 1 moves nothing). Blocking.
    void all_to_all_v(const void* send, const std::vector<size_t>& send_n, void* recv,
                      const std::vector<size_t>& recv_n, DType t);
    void wait(CommHandle h);
    // Blocking forms.
    void all_reduce(void* buf, size_t n, DType t, ReduceOp op = ReduceOp::Sum) { wait(start_all_reduce(buf, n, t, op)); }
    void reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
        wait(start_reduce_scatter(send, recv, recv_n, t));
    }
    void all_gather(const void* send, void* recv, size_t send_n, DType t) { wait(start_all_gather(send, recv, send_n, t)); }
    void send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) {
        wait(start_send_recv(send, dst, recv, src, n, t));
    }
    // Host-side helpers on small host values (always over MPI, uncounted):
    // used for losses, norms and agreeing on errors.
    virtual double host_all_reduce(double x, ReduceOp op) = 0;
    // The same on n values at once (one call where the transport can; the
    // default reduces them one by one).
    virtual void host_all_reduce_n(double* x, size_t n, ReduceOp op) {
        for (size_t i = 0; i < n; i++) x[i] = host_all_reduce(x[i], op);
    }
    // Seconds this rank has spent so far held up by this group's calls: the
    // host blocked in a wait (MPI, and the host helpers), or the compute
    // stream stalled on a collective it waits for (NCCL: counted once the
    // work has run, so read it after a synchronisation). A rank that waits
    // for slower peers piles it up; the slowest piles up least. The
    // straggler check (llmc/run/stragglers.h) subtracts it from the step
    // time to find each rank's own work.
    virtual double blocked_seconds() { return blocked_s_; }
    // Off: calls of this group leave no trace spans (a transport inside
    // another, whose own span covers them).
    void set_traced(bool on) { traced_ = on; }

  protected:
    // The transports implement these; the public calls above wrap them with
    // the trace (llmc/base/trace.h) so every transport is traced the same way.
    virtual CommHandle do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) = 0;
    virtual CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) = 0;
    virtual CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) = 0;
    virtual void do_broadcast(void* buf, size_t n, DType t, int root) = 0;
    virtual CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) = 0;
    virtual void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) = 0;
    virtual void do_wait(CommHandle h) = 0;

    void count(CommKind k, size_t full_elems, DType t);  // adds the ring bytes of one call
    std::string name_;
    int rank_ = 0, size_ = 1;
    CommCounts counts_;
    double blocked_s_ = 0;  // blocked_seconds(), kept by the transports

  private:
    // Tracing: a call's span runs from its start to the wait that ends it.
    struct Open {
        CommKind kind;
        double t0;
        uint64_t bytes;
        std::string what;  // for point-to-point: "send to 1", "recv from 0"
    };
    CommHandle traced(CommKind k, double t0, uint64_t bytes_before, CommHandle h);
    uint64_t counted_bytes() const { return counts_.total_bytes(); }
    std::vector<std::pair<CommHandle, Open>> open_;
    bool traced_ = true;
};
