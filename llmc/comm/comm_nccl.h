// llmc/comm/comm_nccl.h: NcclComm, the GPU default communicator: NCCL collectives
// on device buffers, run beside the compute so they can overlap it; each call
// is ordered after the work already issued on the compute stream, and wait()
// orders later compute after it (the compute stream waits on an event only
// where it needs the result). Plain C++ (the CUDA and NCCL types stay in
// comm_nccl.cu), so host code compiled with mpicxx can make one. Exists only
// in builds with both MPI and CUDA.
//
// One communication stream per rank: every NcclComm of a rank (all the
// groups of its process grid) queues its collectives on the same CUDA
// stream, owned by a small runtime in comm_nccl.cu that the rank's first
// communicator makes and its last frees. NCCL requires collectives of
// different communicators that may run at the same time to run in the same
// order on every rank, or they can deadlock (each GPU stuck in a different
// group's kernel, waiting for peers stuck in the other); on separate streams
// the device is free to run them in any order. On one stream the device
// runs them in the order the rank issued them, and that order is the
// program's, which is the same on every rank: safe by construction, as long
// as the rule of llmc/comm/comm.h holds. The cost: collectives of different
// groups no longer overlap each other (a tp all-reduce waits behind a dp
// reduce-scatter issued before it); they still overlap the compute.
//
// Watchdog: every collective is watched until it completes (a CUDA event
// after it on the stream), and a background thread polls the events and
// each communicator's asynchronous error (ncclCommGetAsyncError). On an
// error, or when the oldest collective has not completed after
// --collective-timeout seconds at the front of the stream (default 300;
// 0: no timeout), it aborts the rank's communicators (ncclCommAbort) and
// ends the job with one line naming the group, the collective and how long
// it waited (llmc/comm/watchdog.h holds the decisions; dist_abort the end).
#pragma once
// CUDA: LLMC_CUDA in host code, or compiled by nvcc (the .cu files).
#if defined(LLMC_MPI) && (defined(LLMC_CUDA) || defined(__CUDACC__))
#include <memory>
#include <string>

#include "llmc/comm/comm.h"
#include "llmc/comm/mpi.h"

class NcclComm : public Comm {
  public:
    // Collective over comm (every rank of it constructs one): group rank 0
    // makes the NCCL id and MPI_Bcast shares it. comm is duplicated, and the
    // duplicate carries host_all_reduce. The CUDA device must be current
    // already (the backend selects it). compute_stream: the backend's
    // cudaStream_t (Backend::native_stream()); null is the legacy default
    // stream. NCCL refuses two ranks of one group on the same GPU.
    NcclComm(MPI_Comm comm, const std::string& name, void* compute_stream);
    ~NcclComm() override;
    NcclComm(const NcclComm&) = delete;
    NcclComm& operator=(const NcclComm&) = delete;

    double host_all_reduce(double x, ReduceOp op) override;
    void host_all_reduce_n(double* x, size_t n, ReduceOp op) override;
    // The compute stream's stalls on this group's collectives (each wait
    // times, on the device, from when compute reached it to when the
    // collective ended), counted for the waits whose work has run, plus
    // the host helpers' blocking.
    double blocked_seconds() override;

  protected:
    CommHandle do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) override;
    CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) override;
    CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) override;
    // Ordered like the others: later compute runs after it; the host does
    // not wait.
    void do_broadcast(void* buf, size_t n, DType t, int root) override;
    CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) override;
    void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) override;
    void do_wait(CommHandle h) override;

  private:
    struct Impl;  // NCCL communicator, streams, events (comm_nccl.cu)
    std::unique_ptr<Impl> impl_;
};
#endif  // LLMC_MPI && CUDA
