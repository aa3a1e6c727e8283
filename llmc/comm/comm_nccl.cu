// llmc/comm/comm_nccl.cu: NcclComm (llmc/comm/comm_nccl.h): NCCL collectives on a
// side stream, ordered against the compute stream with CUDA events.
// Compiled to nothing in builds without MPI (a .cu file is CUDA whether or
// not nvcc is given LLMC_CUDA).
#ifdef LLMC_MPI
#include <cuda_runtime.h>
#include <nccl.h>

#include <unordered_map>
#include <vector>

#include "llmc/comm/comm_nccl.h"
#include "llmc/comm/dist.h"

namespace {

// Errors end the whole job with one line (dist_abort: MPI_Abort when the
// world has several ranks), so no rank is left waiting in a collective.
void nccl_check(ncclResult_t r, ncclComm_t comm, const char* call, const std::string& group) {
    if (r == ncclSuccess) return;
    std::string m = std::string("NCCL ") + call + " (group " + group + "): " + ncclGetErrorString(r);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) m += std::string(": ") + last;
    dist_abort(m);
}
void cuda_check(cudaError_t e, const char* call, const std::string& group) {
    if (e != cudaSuccess) dist_abort(std::string("CUDA ") + call + " (group " + group + "): " + cudaGetErrorString(e));
}

ncclDataType_t nccl_type(DType t) {
    switch (t) {
        case DType::F32:
            return ncclFloat32;
        case DType::F64:
            return ncclFloat64;
        case DType::BF16:
            return ncclBfloat16;
        case DType::I32:
            return ncclInt32;
    }
    return ncclFloat32;
}

}  // namespace

struct NcclComm::Impl {
    std::string name;
    ncclComm_t nccl = nullptr;
    MPI_Comm mpi = MPI_COMM_NULL;
    cudaStream_t compute = nullptr;  // the backend's; null: the legacy default stream
    cudaStream_t stream = nullptr;   // ours; non-blocking, so the legacy stream does not serialise it
    // "Compute has reached here", recorded before each call. One event is
    // enough: cudaStreamWaitEvent takes the record current when it is called.
    cudaEvent_t ready = nullptr;
    std::vector<cudaEvent_t> spare;                    // completion events to reuse
    std::unordered_map<CommHandle, cudaEvent_t> done;  // completion of each call in flight
    CommHandle next = 1;

    void nccl_ok(ncclResult_t r, const char* call) { nccl_check(r, nccl, call, name); }
    void cuda_ok(cudaError_t e, const char* call) { cuda_check(e, call, name); }

    // Before a call: our stream waits for the compute issued so far.
    void begin() {
        cuda_ok(cudaEventRecord(ready, compute), "cudaEventRecord");
        cuda_ok(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
    }
    // After it: its completion, under a new handle.
    CommHandle finish() {
        cudaEvent_t e;
        if (spare.empty()) {
            cuda_ok(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
        } else {
            e = spare.back();
            spare.pop_back();
        }
        cuda_ok(cudaEventRecord(e, stream), "cudaEventRecord");
        const CommHandle h = next++;
        done[h] = e;
        return h;
    }
};

#define NCCL_OK(call) impl_->nccl_ok((call), #call)
#define CUDA_OK(call) impl_->cuda_ok((call), #call)

NcclComm::NcclComm(MPI_Comm comm, const std::string& name, void* compute_stream) : impl_(new Impl) {
    name_ = name;
    impl_->name = name;
    MPI_Comm_dup(comm, &impl_->mpi);
    MPI_Comm_rank(impl_->mpi, &rank_);
    MPI_Comm_size(impl_->mpi, &size_);
    ncclUniqueId id;
    if (rank_ == 0) NCCL_OK(ncclGetUniqueId(&id));
    MPI_Bcast(&id, (int)sizeof(id), MPI_BYTE, 0, impl_->mpi);
    NCCL_OK(ncclCommInitRank(&impl_->nccl, size_, id, rank_));
    impl_->compute = static_cast<cudaStream_t>(compute_stream);
    CUDA_OK(cudaStreamCreateWithFlags(&impl_->stream, cudaStreamNonBlocking));
    CUDA_OK(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming));
}

NcclComm::~NcclComm() {
    // No aborts here: this may run while the job ends for another reason.
    if (impl_->stream) cudaStreamSynchronize(impl_->stream);
    for (auto& kv : impl_->done) cudaEventDestroy(kv.second);
    for (cudaEvent_t e : impl_->spare) cudaEventDestroy(e);
    if (impl_->ready) cudaEventDestroy(impl_->ready);
    if (impl_->nccl) ncclCommDestroy(impl_->nccl);
    if (impl_->stream) cudaStreamDestroy(impl_->stream);
    int fin = 0;
    MPI_Finalized(&fin);  // a grid may outlive dist_finalize; then MPI has freed it
    if (!fin && impl_->mpi != MPI_COMM_NULL) MPI_Comm_free(&impl_->mpi);
}

CommHandle NcclComm::do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) {
    count(CommKind::AllReduce, n, t);
    if (n == 0) return 0;
    impl_->begin();
    NCCL_OK(
        ncclAllReduce(buf, buf, n, nccl_type(t), op == ReduceOp::Sum ? ncclSum : ncclMax, impl_->nccl, impl_->stream));
    return impl_->finish();
}

// NCCL's in-place forms are exactly comm.h's (recv == send + rank·recv_n;
// send == recv + rank·send_n), so the pointers pass through unchanged.
CommHandle NcclComm::do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
    count(CommKind::ReduceScatter, (size_t)size_ * recv_n, t);
    if (recv_n == 0) return 0;
    impl_->begin();
    NCCL_OK(ncclReduceScatter(send, recv, recv_n, nccl_type(t), ncclSum, impl_->nccl, impl_->stream));
    return impl_->finish();
}

CommHandle NcclComm::do_all_gather(const void* send, void* recv, size_t send_n, DType t) {
    count(CommKind::AllGather, (size_t)size_ * send_n, t);
    if (send_n == 0) return 0;
    impl_->begin();
    NCCL_OK(ncclAllGather(send, recv, send_n, nccl_type(t), impl_->nccl, impl_->stream));
    return impl_->finish();
}

void NcclComm::do_broadcast(void* buf, size_t n, DType t, int root) {
    if (root < 0 || root >= size_)
        dist_abort("internal: broadcast root " + std::to_string(root) + " outside group " + name_);
    count(CommKind::Broadcast, n, t);
    if (n == 0) return;
    impl_->begin();
    NCCL_OK(ncclBroadcast(buf, buf, n, nccl_type(t), root, impl_->nccl, impl_->stream));
    wait(impl_->finish());
}

CommHandle NcclComm::do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) {
    if (dst < 0 || dst >= size_ || src < 0 || src >= size_)
        dist_abort("internal: send_recv ranks " + std::to_string(dst) + ", " + std::to_string(src) + " outside group " +
                   name_);
    count(CommKind::SendRecv, n, t);
    if (n == 0) return 0;
    impl_->begin();
    // Grouped, so the send and the receive progress together (no deadlock
    // around a ring).
    NCCL_OK(ncclGroupStart());
    NCCL_OK(ncclSend(send, n, nccl_type(t), dst, impl_->nccl, impl_->stream));
    NCCL_OK(ncclRecv(recv, n, nccl_type(t), src, impl_->nccl, impl_->stream));
    NCCL_OK(ncclGroupEnd());
    return impl_->finish();
}

// One NCCL group: the peers build their groups from the same schedule, so
// each send meets its receive in a group issued at the same point there.
void NcclComm::do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) {
    bool any = false;
    for (const P2POp& op : ops) {
        if (op.peer < 0 || op.peer >= size_)
            dist_abort("internal: p2p peer " + std::to_string(op.peer) + " outside group " + name_);
        if (op.send) count(CommKind::SendRecv, op.n, t);
        any = any || op.n > 0;
    }
    if (!any) return;
    impl_->begin();
    NCCL_OK(ncclGroupStart());
    for (const P2POp& op : ops) {
        if (op.n == 0) continue;
        if (op.send)
            NCCL_OK(ncclSend(op.buf, op.n, nccl_type(t), op.peer, impl_->nccl, impl_->stream));
        else
            NCCL_OK(ncclRecv(op.buf, op.n, nccl_type(t), op.peer, impl_->nccl, impl_->stream));
    }
    NCCL_OK(ncclGroupEnd());
    // The ops of a group end together on the stream: one event each, all
    // recorded after the group, so each can be waited for once.
    for (size_t i = 0; i < ops.size(); i++)
        if (ops[i].n) (*handles)[i] = impl_->finish();
}

void NcclComm::do_wait(CommHandle h) {
    if (h == 0) return;
    auto it = impl_->done.find(h);
    if (it == impl_->done.end()) dist_abort("internal: wait on an unknown handle of group " + name_);
    // The compute stream waits on the device; the host goes on. The event can
    // be reused at once: the wait has already taken this record.
    CUDA_OK(cudaStreamWaitEvent(impl_->compute, it->second, 0));
    impl_->spare.push_back(it->second);
    impl_->done.erase(it);
}

double NcclComm::host_all_reduce(double x, ReduceOp op) {
    double y = x;
    MPI_Allreduce(&x, &y, 1, MPI_DOUBLE, op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, impl_->mpi);
    return y;
}

#endif  // LLMC_MPI
