// llmc/comm/comm_staged.cu: StagedComm (llmc/comm/comm_staged.h): MPI for device
// buffers through pinned host memory. Compiled to nothing in builds without
// MPI (a .cu file is CUDA whether or not nvcc is given LLMC_CUDA).
#ifdef LLMC_MPI
#include <cuda_runtime.h>

#include <algorithm>

#include "llmc/comm/comm_mpi.h"
#include "llmc/comm/comm_staged.h"
#include "llmc/comm/dist.h"

namespace {
void cuda_check(cudaError_t e, const char* call, const std::string& group) {
    if (e != cudaSuccess) dist_abort(std::string("CUDA ") + call + " (group " + group + "): " + cudaGetErrorString(e));
}
}  // namespace

#define CUDA_OK(call) cuda_check((call), #call, name_)

StagedComm::StagedComm(MPI_Comm comm, const std::string& name, Backend& be)
    : host_(new MpiComm(comm, name)), stream_(be.native_stream()) {
    name_ = name;
    rank_ = host_->rank();
    size_ = host_->size();
    host_->set_traced(false);  // our own span covers the staging too
}

StagedComm::~StagedComm() {
    // No aborts here: this may run while the job ends for another reason.
    cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));  // copies may still read the buffers
    for (int i = 0; i < 2; i++)
        if (stage_[i]) cudaFreeHost(stage_[i]);
}

// Growing frees and allocates pinned memory, which synchronises the device.
// That is safe here, and done openly with a full device synchronisation
// first: a StagedComm job runs no NCCL (every group of a grid has the same
// transport) and each call of ours completes before it returns, so the
// device holds only this rank's own compute and copies, which never wait
// for a peer. Buffers grow by half again, so sizes that creep up do not
// reallocate each call; after the first step the sizes repeat.
void* StagedComm::stage(int i, size_t bytes) {
    if (bytes > cap_[i]) {
        CUDA_OK(cudaDeviceSynchronize());  // and a copy queued by the previous call may still read the old one
        if (stage_[i]) CUDA_OK(cudaFreeHost(stage_[i]));
        stage_[i] = nullptr;
        const size_t cap = std::max(bytes, cap_[i] + cap_[i] / 2);
        CUDA_OK(cudaMallocHost(&stage_[i], cap));
        cap_[i] = cap;
    }
    return stage_[i];
}

// Copies go on the compute stream, so they are ordered after the compute that
// wrote the data (to host) and before the compute that reads it (to device).
void StagedComm::to_host(void* host, const void* dev, size_t bytes) {
    if (bytes) CUDA_OK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)));
}
void StagedComm::to_device(void* dev, const void* host, size_t bytes) {
    if (bytes) CUDA_OK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream_)));
}
void StagedComm::sync() { CUDA_OK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_))); }

// Each operation: stage buffers first (growing may free), queue the copies to
// the host, wait for them (and so for the compute before them, and for the
// previous call's copies back, which read the same buffers), run MPI, queue
// the copies back. Counted here once; the host MpiComm's counts are unused.
CommHandle StagedComm::do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) {
    count(CommKind::AllReduce, n, t);
    const size_t bytes = n * dtype_size(t);
    void* h = stage(0, bytes);
    to_host(h, buf, bytes);
    sync();
    host_->all_reduce(h, n, t, op);
    to_device(buf, h, bytes);
    return 0;
}

CommHandle StagedComm::do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
    const size_t full = (size_t)size_ * recv_n;
    count(CommKind::ReduceScatter, full, t);
    const size_t es = dtype_size(t);
    void* hs = stage(0, full * es);
    void* hr = stage(1, recv_n * es);
    to_host(hs, send, full * es);
    sync();
    host_->reduce_scatter(hs, hr, recv_n, t);  // separate host buffers: in place on the device is fine
    to_device(recv, hr, recv_n * es);
    return 0;
}

CommHandle StagedComm::do_all_gather(const void* send, void* recv, size_t send_n, DType t) {
    const size_t full = (size_t)size_ * send_n;
    count(CommKind::AllGather, full, t);
    const size_t es = dtype_size(t);
    void* hr = stage(1, full * es);
    void* mine = elem_ptr(hr, t, (size_t)rank_ * send_n);
    to_host(mine, send, send_n * es);
    sync();
    host_->all_gather(mine, hr, send_n, t);  // in place on the host
    to_device(recv, hr, full * es);
    return 0;
}

void StagedComm::do_broadcast(void* buf, size_t n, DType t, int root) {
    count(CommKind::Broadcast, n, t);
    const size_t bytes = n * dtype_size(t);
    void* h = stage(0, bytes);
    if (rank_ == root) to_host(h, buf, bytes);
    sync();
    host_->broadcast(h, n, t, root);
    if (rank_ != root) to_device(buf, h, bytes);
}

CommHandle StagedComm::do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) {
    count(CommKind::SendRecv, n, t);
    const size_t bytes = n * dtype_size(t);
    void* hs = stage(0, bytes);
    void* hr = stage(1, bytes);
    to_host(hs, send, bytes);
    sync();
    host_->send_recv(hs, dst, hr, src, n, t);
    to_device(recv, hr, bytes);
    return 0;
}

// The sends are staged in one pinned buffer, the receives in the other, each
// op at its own offset; complete on return, like every call here.
void StagedComm::do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) {
    const size_t es = dtype_size(t);
    size_t send_n = 0, recv_n = 0;
    for (const P2POp& op : ops) (op.send ? send_n : recv_n) += op.n;
    void* hs = stage(0, send_n * es);
    void* hr = stage(1, recv_n * es);
    std::vector<P2POp> host_ops;
    size_t so = 0, ro = 0;
    for (const P2POp& op : ops) {
        P2POp h = op;
        if (op.send) {
            count(CommKind::SendRecv, op.n, t);
            h.buf = elem_ptr(hs, t, so);
            to_host(h.buf, op.buf, op.n * es);
            so += op.n;
        } else {
            h.buf = elem_ptr(hr, t, ro);
            ro += op.n;
        }
        host_ops.push_back(h);
    }
    sync();
    std::vector<CommHandle> done;
    host_->start_p2p(host_ops, t, &done);
    for (CommHandle h : done) host_->wait(h);
    for (size_t i = 0; i < ops.size(); i++)
        if (!ops[i].send) to_device(ops[i].buf, host_ops[i].buf, ops[i].n * es);
    handles->assign(ops.size(), 0);  // complete
}

double StagedComm::host_all_reduce(double x, ReduceOp op) { return host_->host_all_reduce(x, op); }

#endif  // LLMC_MPI
