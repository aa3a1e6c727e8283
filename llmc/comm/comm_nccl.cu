// llmc/comm/comm_nccl.cu: NcclComm (llmc/comm/comm_nccl.h): NCCL collectives on
// the rank's one communication stream, shared by all its groups, ordered
// against the compute stream with CUDA events, and watched by a background
// thread (llmc/comm/watchdog.h). Compiled to nothing in builds without MPI
// (a .cu file is CUDA whether or not nvcc is given LLMC_CUDA).
#ifdef LLMC_MPI
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "llmc/comm/arrivals.h"
#include "llmc/comm/comm_nccl.h"
#include "llmc/comm/dist.h"
#include "llmc/comm/watchdog.h"

namespace {

// Set when the watchdog ends the job: an error the main thread meets after
// the communicators were aborted is a consequence, not news, so that
// thread waits for MPI_Abort to end it rather than print a second line.
std::atomic<bool> g_aborting{false};

// Errors end the whole job with one line (dist_abort: MPI_Abort when the
// world has several ranks), so no rank is left waiting in a collective.
[[noreturn]] void fail(const std::string& m) {
    while (g_aborting.load()) std::this_thread::sleep_for(std::chrono::seconds(1));
    dist_abort(m);
}
void nccl_check(ncclResult_t r, ncclComm_t comm, const char* call, const std::string& group) {
    if (r == ncclSuccess) return;
    std::string m = std::string("NCCL ") + call + " (group " + group + "): " + ncclGetErrorString(r);
    const char* last = comm ? ncclGetLastError(comm) : nullptr;
    if (last && *last) m += std::string(": ") + last;
    fail(m);
}
void cuda_check(cudaError_t e, const char* call, const std::string& group) {
    if (e != cudaSuccess) fail(std::string("CUDA ") + call + " (group " + group + "): " + cudaGetErrorString(e));
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

double now_s() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// ---- the rank's communication runtime ---------------------------------------------------
// One per device, shared by every NcclComm on it (the process grid's
// groups): the one communication stream all their collectives are queued
// on, and the watchdog. Each collective gets a CUDA event recorded after it
// on that stream; the watchdog thread polls the events and every
// communicator's asynchronous error, and on an error or a timeout aborts
// the communicators and ends the job with one line.
class NcclRuntime {
  public:
    // The current device's runtime, made by its first communicator and
    // freed with its last.
    static std::shared_ptr<NcclRuntime> get() {
        static std::mutex reg_mu;
        static std::map<int, std::weak_ptr<NcclRuntime>> reg;  // weak: nothing outlives the communicators
        int dev = 0;
        cuda_check(cudaGetDevice(&dev), "cudaGetDevice", "(all)");
        std::lock_guard<std::mutex> lk(reg_mu);
        std::shared_ptr<NcclRuntime> rt = reg[dev].lock();
        if (!rt) {
            rt.reset(new NcclRuntime(dev));
            reg[dev] = rt;
        }
        return rt;
    }
    ~NcclRuntime() {
        {
            std::lock_guard<std::mutex> lk(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        if (thread_.joinable()) thread_.join();
        // No aborts here: this may run while the job ends for another reason.
        cudaStreamSynchronize(stream_);
        for (auto& kv : events_) cudaEventDestroy(kv.second);
        for (cudaEvent_t e : pool_) cudaEventDestroy(e);
        cudaStreamDestroy(stream_);
    }
    cudaStream_t stream() const { return stream_; }
    void add(ncclComm_t c, const std::string& group) {
        std::lock_guard<std::mutex> lk(mu_);
        comms_.push_back({c, group});
    }
    void remove(ncclComm_t c) {
        std::lock_guard<std::mutex> lk(mu_);
        for (size_t i = 0; i < comms_.size(); i++)
            if (comms_[i].first == c) {
                comms_.erase(comms_.begin() + (long)i);
                break;
            }
    }
    // After a collective was queued on stream(): watch it. arrivals: who
    // did not come, if known (PendingCollective::arrivals).
    void issued(const std::string& group, CommKind kind, uint64_t bytes,
                std::function<std::string(double)> arrivals) {
        std::lock_guard<std::mutex> lk(mu_);
        cudaEvent_t e;
        if (pool_.empty()) {
            cuda_check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags", group);
        } else {
            e = pool_.back();
            pool_.pop_back();
        }
        cuda_check(cudaEventRecord(e, stream_), "cudaEventRecord", group);
        const uint64_t id = next_++;
        events_[id] = e;
        PendingCollective c{id, group, comm_kind_name(kind), bytes, now_s()};
        c.arrivals = std::move(arrivals);
        dog_.issued(c);
    }

  private:
    explicit NcclRuntime(int dev) : device_(dev), dog_(collective_timeout()) {
        // The highest priority, so a collective's kernels start as soon as
        // its turn comes rather than behind queued compute blocks.
        int least = 0, greatest = 0;
        cuda_check(cudaDeviceGetStreamPriorityRange(&least, &greatest), "cudaDeviceGetStreamPriorityRange", "(all)");
        // Non-blocking, so the legacy default stream does not serialise it.
        cuda_check(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest),
                   "cudaStreamCreateWithPriority", "(all)");
        const double t = dog_.timeout();
        poll_s_ = t > 0 ? std::min(1.0, std::max(0.05, t / 10)) : 1.0;
        thread_ = std::thread([this] { loop(); });
    }
    // The watchdog thread: a check every poll_s_ until stopped.
    void loop() {
        cudaSetDevice(device_);
        std::unique_lock<std::mutex> lk(mu_);
        while (!stop_) {
            cv_.wait_for(lk, std::chrono::duration<double>(poll_s_), [&] { return stop_; });
            if (stop_) break;
            const double now = now_s();
            const std::string m = dog_.check(
                now, [&](uint64_t id) { return done(id); }, [&] { return async_error(); });
            if (m.empty()) {
                // A long wait: the ranks tell each other their counts, so a
                // timeout can name who did not come (once per front, then on
                // each change).
                if (dist_mpi_threads() && dog_.long_wait(now)) {
                    const bool again = dog_.front().id != told_front_;
                    told_front_ = dog_.front().id;
                    Arrivals::tell_all(again);
                }
                continue;
            }
            g_aborting = true;
            std::vector<ncclComm_t> cs;
            for (auto& c : comms_) cs.push_back(c.first);
            lk.unlock();
            for (ncclComm_t c : cs) ncclCommAbort(c);  // stuck kernels return, peers see the error
            dist_abort(m);
        }
    }
    // Under mu_: whether collective id has completed (its event recycled).
    bool done(uint64_t id) {
        auto it = events_.find(id);
        if (it == events_.end()) return true;
        const cudaError_t e = cudaEventQuery(it->second);
        if (e == cudaErrorNotReady) return false;
        if (e != cudaSuccess) {
            if (poll_error_.empty()) poll_error_ = std::string("CUDA: ") + cudaGetErrorString(e);
            return false;
        }
        pool_.push_back(it->second);
        events_.erase(it);
        return true;
    }
    // Under mu_: "" or the first failure: a CUDA error met while polling, or
    // a communicator's asynchronous error.
    std::string async_error() {
        if (!poll_error_.empty()) return poll_error_;
        for (auto& c : comms_) {
            ncclResult_t st = ncclSuccess;
            const ncclResult_t r = ncclCommGetAsyncError(c.first, &st);
            if (r != ncclSuccess) st = r;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)
            if (st == ncclInProgress) continue;  // a non-blocking call still running: not an error
#endif
            if (st == ncclSuccess) continue;
            std::string m = "group " + c.second + ": " + ncclGetErrorString(st);
            const char* last = ncclGetLastError(c.first);
            if (last && *last) m += std::string(": ") + last;
            return m;
        }
        return "";
    }

    int device_;
    cudaStream_t stream_ = nullptr;
    std::mutex mu_;  // everything below; the watchdog thread holds it while it checks
    CollectiveWatchdog dog_;
    std::vector<std::pair<ncclComm_t, std::string>> comms_;
    std::unordered_map<uint64_t, cudaEvent_t> events_;  // the watched collectives' completions
    std::vector<cudaEvent_t> pool_;                     // events to reuse
    uint64_t next_ = 1;
    uint64_t told_front_ = 0;  // the front collective of the last long wait told
    std::string poll_error_;
    double poll_s_ = 1.0;
    std::condition_variable cv_;
    bool stop_ = false;
    std::thread thread_;
};

}  // namespace

struct NcclComm::Impl {
    std::string name;
    ncclComm_t nccl = nullptr;
    MPI_Comm mpi = MPI_COMM_NULL;
    cudaStream_t compute = nullptr;  // the backend's; null: the legacy default stream
    std::shared_ptr<NcclRuntime> rt;  // the rank's communication stream and watchdog
    cudaStream_t stream = nullptr;    // rt's stream, shared with every group of the rank
    // "Compute has reached here", recorded before each call. One event is
    // enough: cudaStreamWaitEvent takes the record current when it is called.
    cudaEvent_t ready = nullptr;
    std::vector<cudaEvent_t> spare;                    // completion events to reuse
    std::unordered_map<CommHandle, cudaEvent_t> done;  // completion of each call in flight
    CommHandle next = 1;
    // Which ranks reached each call (llmc/comm/arrivals.h); shared with the
    // watchdog's records, which may outlive the group.
    std::shared_ptr<Arrivals> arrivals;
    // Waits being timed: a mark recorded on the compute stream where it
    // began to wait, and the collective's completion. Once both have run,
    // the time from mark to completion (if positive) is how long compute
    // stalled there (blocked_seconds).
    std::deque<std::pair<cudaEvent_t, cudaEvent_t>> timed;
    std::vector<cudaEvent_t> marks;  // mark events to reuse

    void nccl_ok(ncclResult_t r, const char* call) { nccl_check(r, nccl, call, name); }
    void cuda_ok(cudaError_t e, const char* call) { cuda_check(e, call, name); }

    // Before a call: the communication stream waits for the compute issued
    // so far (and runs after every collective issued before, of any group).
    void begin() {
        cuda_ok(cudaEventRecord(ready, compute), "cudaEventRecord");
        cuda_ok(cudaStreamWaitEvent(stream, ready, 0), "cudaStreamWaitEvent");
    }
    // A timing event from `pool`, or a new one.
    cudaEvent_t take(std::vector<cudaEvent_t>& pool) {
        cudaEvent_t e;
        if (pool.empty()) {
            cuda_ok(cudaEventCreate(&e), "cudaEventCreate");
        } else {
            e = pool.back();
            pool.pop_back();
        }
        return e;
    }
    // After it: its completion, under a new handle. (Timing events: a wait's
    // stall is measured against it.)
    CommHandle finish() {
        cudaEvent_t e = take(spare);
        cuda_ok(cudaEventRecord(e, stream), "cudaEventRecord");
        const CommHandle h = next++;
        done[h] = e;
        return h;
    }
    // After a call is queued: the watchdog follows it until it completes,
    // with what it needs of the peers when MPI lets the watchdog's thread
    // hear them.
    void watch(CommKind k, uint64_t bytes, std::vector<Arrivals::Expect> expect) {
        std::function<std::string(double)> who;
        if (dist_mpi_threads()) {
            std::shared_ptr<Arrivals> a = arrivals;
            who = [a, expect](double since) {
                const std::string w = a->what(expect);  // " (its collective 12)", ...
                return (w.empty() ? w : w.substr(1) + ": ") + a->late(expect, since);
            };
        }
        rt->issued(name, k, bytes, std::move(who));
    }
    // The compute stream waits for completion event e; the wait is timed,
    // except while the stream is being captured into a graph (an event
    // recorded there belongs to the graph, not to one run of it).
    void wait_for(cudaEvent_t e) {
        cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
        cuda_ok(cudaStreamIsCapturing(compute, &cs), "cudaStreamIsCapturing");
        if (cs != cudaStreamCaptureStatusNone) {
            cuda_ok(cudaStreamWaitEvent(compute, e, 0), "cudaStreamWaitEvent");
            spare.push_back(e);  // the wait has taken this record: reusable at once
            return;
        }
        cudaEvent_t m = take(marks);
        cuda_ok(cudaEventRecord(m, compute), "cudaEventRecord");
        cuda_ok(cudaStreamWaitEvent(compute, e, 0), "cudaStreamWaitEvent");
        timed.push_back({m, e});
        if (timed.size() > 512) stalls();  // a run that never asks stays bounded
    }
    // The seconds of stall of the timed waits that have run, their events
    // recycled; the rest stay for a later call.
    double stalls() {
        double s = 0;
        while (!timed.empty()) {
            auto [m, e] = timed.front();
            const cudaError_t qm = cudaEventQuery(m), qe = cudaEventQuery(e);
            if (qm == cudaErrorNotReady || qe == cudaErrorNotReady) break;
            cuda_ok(qm, "cudaEventQuery");
            cuda_ok(qe, "cudaEventQuery");
            float ms = 0;
            cuda_ok(cudaEventElapsedTime(&ms, m, e), "cudaEventElapsedTime");
            if (ms > 0) s += ms / 1000.0;
            marks.push_back(m);
            spare.push_back(e);
            timed.pop_front();
        }
        return s;
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
    impl_->arrivals = std::make_shared<Arrivals>(impl_->mpi, name);
    impl_->compute = static_cast<cudaStream_t>(compute_stream);
    impl_->rt = NcclRuntime::get();
    impl_->stream = impl_->rt->stream();
    impl_->rt->add(impl_->nccl, name);
    CUDA_OK(cudaEventCreateWithFlags(&impl_->ready, cudaEventDisableTiming));
}

NcclComm::~NcclComm() {
    // No aborts here: this may run while the job ends for another reason.
    if (impl_->stream) cudaStreamSynchronize(impl_->stream);
    for (auto& kv : impl_->done) cudaEventDestroy(kv.second);
    for (cudaEvent_t e : impl_->spare) cudaEventDestroy(e);
    for (auto& me : impl_->timed) cudaEventDestroy(me.first), cudaEventDestroy(me.second);
    for (cudaEvent_t e : impl_->marks) cudaEventDestroy(e);
    if (impl_->ready) cudaEventDestroy(impl_->ready);
    if (impl_->rt && impl_->nccl) impl_->rt->remove(impl_->nccl);  // the watchdog stops asking it first
    if (impl_->nccl) ncclCommDestroy(impl_->nccl);
    impl_->arrivals.reset();  // (the watchdog's records may hold it a while longer)
    impl_->rt.reset();  // the last group's frees the stream and stops the watchdog
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
    impl_->watch(CommKind::AllReduce, n * dtype_size(t), {impl_->arrivals->collective()});
    return impl_->finish();
}

// NCCL's in-place forms are exactly comm.h's (recv == send + rank·recv_n;
// send == recv + rank·send_n), so the pointers pass through unchanged.
CommHandle NcclComm::do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
    count(CommKind::ReduceScatter, (size_t)size_ * recv_n, t);
    if (recv_n == 0) return 0;
    impl_->begin();
    NCCL_OK(ncclReduceScatter(send, recv, recv_n, nccl_type(t), ncclSum, impl_->nccl, impl_->stream));
    impl_->watch(CommKind::ReduceScatter, (size_t)size_ * recv_n * dtype_size(t), {impl_->arrivals->collective()});
    return impl_->finish();
}

CommHandle NcclComm::do_all_gather(const void* send, void* recv, size_t send_n, DType t) {
    count(CommKind::AllGather, (size_t)size_ * send_n, t);
    if (send_n == 0) return 0;
    impl_->begin();
    NCCL_OK(ncclAllGather(send, recv, send_n, nccl_type(t), impl_->nccl, impl_->stream));
    impl_->watch(CommKind::AllGather, (size_t)size_ * send_n * dtype_size(t), {impl_->arrivals->collective()});
    return impl_->finish();
}

void NcclComm::do_broadcast(void* buf, size_t n, DType t, int root) {
    if (root < 0 || root >= size_)
        dist_abort("internal: broadcast root " + std::to_string(root) + " outside group " + name_);
    count(CommKind::Broadcast, n, t);
    if (n == 0) return;
    impl_->begin();
    NCCL_OK(ncclBroadcast(buf, buf, n, nccl_type(t), root, impl_->nccl, impl_->stream));
    impl_->watch(CommKind::Broadcast, n * dtype_size(t), {impl_->arrivals->collective()});
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
    impl_->watch(CommKind::SendRecv, 2 * n * dtype_size(t),
                 {impl_->arrivals->send_to(dst), impl_->arrivals->recv_from(src)});
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
    uint64_t bytes = 0;
    std::vector<Arrivals::Expect> expect;
    for (const P2POp& op : ops) {
        bytes += op.n * dtype_size(t);
        if (op.n) expect.push_back(op.send ? impl_->arrivals->send_to(op.peer) : impl_->arrivals->recv_from(op.peer));
    }
    impl_->watch(CommKind::SendRecv, bytes, std::move(expect));
    // The ops of a group end together on the stream: one event each, all
    // recorded after the group, so each can be waited for once.
    for (size_t i = 0; i < ops.size(); i++)
        if (ops[i].n) (*handles)[i] = impl_->finish();
}

void NcclComm::do_wait(CommHandle h) {
    if (h == 0) return;
    auto it = impl_->done.find(h);
    if (it == impl_->done.end()) dist_abort("internal: wait on an unknown handle of group " + name_);
    // The compute stream waits on the device; the host goes on.
    impl_->wait_for(it->second);
    impl_->done.erase(it);
}

double NcclComm::host_all_reduce(double x, ReduceOp op) {
    host_all_reduce_n(&x, 1, op);
    return x;
}

void NcclComm::host_all_reduce_n(double* x, size_t n, ReduceOp op) {
    if (n == 0) return;
    const double t = now_s();
    MPI_Allreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, impl_->mpi);
    blocked_s_ += now_s() - t;
}

double NcclComm::blocked_seconds() {
    blocked_s_ += impl_->stalls();
    return blocked_s_;
}

#endif  // LLMC_MPI
