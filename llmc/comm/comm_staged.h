// llmc/comm/comm_staged.h: StagedComm, MPI for device buffers through host
// memory (--comm mpi on the CUDA backend). Each call waits for the compute
// stream, copies device -> pinned host buffers, runs the MPI operation there
// (llmc/comm/comm_mpi.h; bf16 sums through its fp32 round-to-nearest-even op) and
// copies the result back on the compute stream. Slow, but several ranks can
// share one GPU, which NCCL refuses (docs/design.md section 8). Every
// call is complete when it returns (handles are 0; wait() does nothing).
// Plain C++ header; the CUDA code is in comm_staged.cu. Exists only in
// builds with both MPI and CUDA.
#pragma once
// CUDA: LLMC_CUDA in host code, or compiled by nvcc (the .cu files).
#if defined(LLMC_MPI) && (defined(LLMC_CUDA) || defined(__CUDACC__))
#include <memory>
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/comm_mpi.h"

class StagedComm : public Comm {
  public:
    // Collective over comm (every rank of it constructs one); comm is
    // duplicated. be: the CUDA backend whose device memory the buffers are
    // and whose compute stream orders the copies.
    StagedComm(MPI_Comm comm, const std::string& name, Backend& be);
    ~StagedComm() override;
    StagedComm(const StagedComm&) = delete;
    StagedComm& operator=(const StagedComm&) = delete;

    double host_all_reduce(double x, ReduceOp op) override;
    void host_all_reduce_n(double* x, size_t n, ReduceOp op) override { host_->host_all_reduce_n(x, n, op); }
    // Every call blocks in the host transport's waits.
    double blocked_seconds() override { return host_->blocked_seconds(); }

  protected:
    CommHandle do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) override;
    CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) override;
    CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) override;
    void do_broadcast(void* buf, size_t n, DType t, int root) override;
    CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) override;
    void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) override;
    void do_wait(CommHandle) override {}

  private:
    void* stage(int i, size_t bytes);                         // pinned buffer i (0, 1), grown to bytes
    void to_host(void* host, const void* dev, size_t bytes);  // queued on the compute stream
    void to_device(void* dev, const void* host, size_t bytes);
    void sync();  // host waits for the compute stream

    // The host side; it counts too, but only our counts are reported.
    std::unique_ptr<MpiComm> host_;
    void* stream_;  // cudaStream_t of the backend
    void* stage_[2] = {nullptr, nullptr};
    size_t cap_[2] = {0, 0};
};
#endif  // LLMC_MPI && CUDA
