// llmc/comm/comm_nccl.h: NcclComm, the GPU default communicator: NCCL collectives
// on device buffers, run on a CUDA stream of its own so they can overlap the
// compute; each call is ordered after the work already issued on the compute
// stream, and wait() orders later compute after it. Plain C++ (the CUDA and
// NCCL types stay in comm_nccl.cu), so host code compiled with mpicxx can
// make one. Exists only in builds with both MPI and CUDA.
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
