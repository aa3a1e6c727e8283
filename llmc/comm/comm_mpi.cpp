// llmc/comm/comm_mpi.cpp: MpiComm (llmc/comm/comm_mpi.h), MPI collectives on host
// buffers. Compiled to nothing in builds without MPI.
#ifdef LLMC_MPI
#include "llmc/comm/comm_mpi.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "llmc/comm/dist.h"
#include "llmc/comm/watchdog.h"

namespace {

// bf16 reductions: every partial result is rounded back to bf16 (the buffer
// holds bf16), as NCCL's bf16 reductions do; the arithmetic itself is fp32.
void bf16_sum_fn(void* in, void* inout, int* len, MPI_Datatype*) {
    const uint16_t* a = static_cast<const uint16_t*>(in);
    uint16_t* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}
// NaN wins, so a diverged rank is not hidden by the others.
void bf16_max_fn(void* in, void* inout, int* len, MPI_Datatype*) {
    const uint16_t* a = static_cast<const uint16_t*>(in);
    uint16_t* b = static_cast<uint16_t*>(inout);
    for (int i = 0; i < *len; i++) {
        float x = bf16_to_f32(a[i]), y = bf16_to_f32(b[i]);
        if (std::isnan(x) || x > y) b[i] = a[i];
    }
}

// One tag for all point-to-point traffic: MPI keeps messages between the same
// pair on one communicator in order, so several send_recv in flight match up.
constexpr int kTag = 17;

void check_rank(int r, int size, const char* what, const std::string& name) {
    if (r < 0 || r >= size)
        dist_abort("internal: " + std::string(what) + " rank " + std::to_string(r) + " outside group " + name +
                   " of size " + std::to_string(size));
}

}  // namespace

MpiComm::MpiComm(MPI_Comm comm, const std::string& name, size_t max_count)
    : max_count_(std::max<size_t>(1, std::min<size_t>(max_count, (size_t)INT_MAX))), timeout_(collective_timeout()) {
    name_ = name;
    MPI_Comm_dup(comm, &comm_);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Op_create(&bf16_sum_fn, 1, &bf16_sum_);
    MPI_Op_create(&bf16_max_fn, 1, &bf16_max_);
    arrivals_.reset(new Arrivals(comm_, name));
}

MpiComm::~MpiComm() {
    arrivals_.reset();
    // After MPI_Finalize nothing may be called (a grid may outlive
    // dist_finalize); MPI has released everything by then.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    for (auto& kv : pending_) MPI_Waitall((int)kv.second.reqs.size(), kv.second.reqs.data(), MPI_STATUSES_IGNORE);
    pending_.clear();
    MPI_Op_free(&bf16_sum_);
    MPI_Op_free(&bf16_max_);
    MPI_Comm_free(&comm_);
}

MPI_Datatype MpiComm::mpi_type(DType t) const {
    switch (t) {
        case DType::F32:
            return MPI_FLOAT;
        case DType::F64:
            return MPI_DOUBLE;
        case DType::BF16:
            return MPI_UINT16_T;  // moved as bits; reduced by our ops
        case DType::I32:
            return MPI_INT;
    }
    return MPI_DATATYPE_NULL;
}

MPI_Op MpiComm::mpi_op(DType t, ReduceOp op) const {
    if (t == DType::BF16) return op == ReduceOp::Sum ? bf16_sum_ : bf16_max_;
    return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX;
}

MpiComm::Pending& MpiComm::add_pending(CommHandle* h) {
    *h = next_++;
    return pending_[*h];
}

MpiComm::Pending& MpiComm::add_collective(CommHandle* h, const char* kind) {
    Pending& p = add_pending(h);
    p.kind = kind;
    p.expect.push_back(arrivals_->collective());
    return p;
}

CommHandle MpiComm::do_all_reduce(void* buf, size_t n, DType t, ReduceOp op) {
    count(CommKind::AllReduce, n, t);
    CommHandle h;
    Pending& p = add_collective(&h, "all-reduce");
    for (size_t off = 0; off < n; off += max_count_) {
        const int c = (int)std::min(max_count_, n - off);
        MPI_Request r;
        MPI_Iallreduce(MPI_IN_PLACE, elem_ptr(buf, t, off), c, mpi_type(t), mpi_op(t, op), comm_, &r);
        p.reqs.push_back(r);
    }
    return h;
}

CommHandle MpiComm::do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
    const size_t full = (size_t)size_ * recv_n;
    count(CommKind::ReduceScatter, full, t);
    const bool in_place = recv == elem_ptr(send, t, (size_t)rank_ * recv_n);
    CommHandle h;
    Pending& p = add_collective(&h, "reduce-scatter");
    MPI_Request r;
    if (full <= max_count_) {
        // MPI's in-place form wants the full input in recvbuf and leaves the
        // result at its start, not at our block; receiving aside and copying
        // the block on wait() is simpler and costs recv_n elements.
        void* dst = recv;
        if (in_place) {
            p.tmp.resize(recv_n * dtype_size(t));
            dst = p.tmp.data();
            p.copy_to = recv;
        }
        MPI_Ireduce_scatter_block(send, dst, (int)recv_n, mpi_type(t), mpi_op(t, ReduceOp::Sum), comm_, &r);
        p.reqs.push_back(r);
        return h;
    }
    // Too long for one call: block b is reduced onto rank b, in pieces. Here
    // the in-place form is exactly MPI's (the root's input is its own block).
    for (int b = 0; b < size_; b++) {
        for (size_t off = 0; off < recv_n; off += max_count_) {
            const int c = (int)std::min(max_count_, recv_n - off);
            const void* s = elem_ptr(send, t, (size_t)b * recv_n + off);
            if (b == rank_)
                MPI_Ireduce(in_place ? MPI_IN_PLACE : s, elem_ptr(recv, t, off), c, mpi_type(t),
                            mpi_op(t, ReduceOp::Sum), b, comm_, &r);
            else
                MPI_Ireduce(s, nullptr, c, mpi_type(t), mpi_op(t, ReduceOp::Sum), b, comm_, &r);
            p.reqs.push_back(r);
        }
    }
    return h;
}

CommHandle MpiComm::do_all_gather(const void* send, void* recv, size_t send_n, DType t) {
    const size_t full = (size_t)size_ * send_n;
    count(CommKind::AllGather, full, t);
    void* mine = elem_ptr(recv, t, (size_t)rank_ * send_n);
    const bool in_place = send == mine;
    CommHandle h;
    Pending& p = add_collective(&h, "all-gather");
    MPI_Request r;
    if (full <= max_count_) {
        // In place: our block already sits at its place in recv.
        MPI_Iallgather(in_place ? MPI_IN_PLACE : send, in_place ? 0 : (int)send_n, mpi_type(t), recv, (int)send_n,
                       mpi_type(t), comm_, &r);
        p.reqs.push_back(r);
        return h;
    }
    // Too long for one call: every rank broadcasts its block, in pieces.
    if (!in_place && send_n) std::memcpy(mine, send, send_n * dtype_size(t));
    for (int b = 0; b < size_; b++) {
        for (size_t off = 0; off < send_n; off += max_count_) {
            const int c = (int)std::min(max_count_, send_n - off);
            MPI_Ibcast(elem_ptr(recv, t, (size_t)b * send_n + off), c, mpi_type(t), b, comm_, &r);
            p.reqs.push_back(r);
        }
    }
    return h;
}

void MpiComm::do_broadcast(void* buf, size_t n, DType t, int root) {
    check_rank(root, size_, "broadcast root", name_);
    count(CommKind::Broadcast, n, t);
    // Non-blocking underneath, so that the wait is watched.
    CommHandle h;
    Pending& p = add_collective(&h, "broadcast");
    for (size_t off = 0; off < n; off += max_count_) {
        const int c = (int)std::min(max_count_, n - off);
        MPI_Request r;
        MPI_Ibcast(elem_ptr(buf, t, off), c, mpi_type(t), root, comm_, &r);
        p.reqs.push_back(r);
    }
    do_wait(h);
}

CommHandle MpiComm::do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) {
    check_rank(dst, size_, "send_recv destination", name_);
    check_rank(src, size_, "send_recv source", name_);
    count(CommKind::SendRecv, n, t);
    CommHandle h;
    Pending& p = add_pending(&h);
    p.kind = "send-recv";
    p.expect.push_back(arrivals_->send_to(dst));
    p.expect.push_back(arrivals_->recv_from(src));
    // The receive is posted first so the matching send never waits on a
    // buffer; pieces are matched in order (same tag, same pair).
    for (size_t off = 0; off < n; off += max_count_) {
        const int c = (int)std::min(max_count_, n - off);
        MPI_Request r;
        MPI_Irecv(elem_ptr(recv, t, off), c, mpi_type(t), src, kTag, comm_, &r);
        p.reqs.push_back(r);
        MPI_Isend(elem_ptr(send, t, off), c, mpi_type(t), dst, kTag, comm_, &r);
        p.reqs.push_back(r);
    }
    return h;
}

// Tags kP2PTagBase + op.tag keep the pipeline's messages apart from each
// other and from send_recv's (kTag).
constexpr int kP2PTagBase = 1000;

void MpiComm::do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) {
    // Receives first, so a matching send never waits on a buffer.
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < ops.size(); i++) {
            const P2POp& op = ops[i];
            if (op.send != (pass == 1)) continue;
            check_rank(op.peer, size_, op.send ? "p2p destination" : "p2p source", name_);
            if (op.send) count(CommKind::SendRecv, op.n, t);
            Pending& p = add_pending(&(*handles)[i]);
            p.kind = op.send ? "pipeline send" : "pipeline recv";
            if (op.send) p.expect.push_back(arrivals_->send_to(op.peer));
            else p.expect.push_back(arrivals_->recv_from(op.peer));
            for (size_t off = 0; off < op.n; off += max_count_) {
                const int c = (int)std::min(max_count_, op.n - off);
                MPI_Request r;
                if (op.send)
                    MPI_Isend(elem_ptr(op.buf, t, off), c, mpi_type(t), op.peer, kP2PTagBase + op.tag, comm_, &r);
                else
                    MPI_Irecv(elem_ptr(op.buf, t, off), c, mpi_type(t), op.peer, kP2PTagBase + op.tag, comm_, &r);
                p.reqs.push_back(r);
            }
        }
    }
}

void MpiComm::do_wait(CommHandle h) {
    if (h == 0) return;
    auto it = pending_.find(h);
    if (it == pending_.end()) dist_abort("internal: wait on an unknown handle of group " + name_);
    Pending& p = it->second;
    wait_pending(p);
    if (p.copy_to) std::memcpy(p.copy_to, p.tmp.data(), p.tmp.size());
    pending_.erase(it);
}

double MpiComm::host_all_reduce(double x, ReduceOp op) {
    host_all_reduce_n(&x, 1, op);
    return x;
}

void MpiComm::host_all_reduce_n(double* x, size_t n, ReduceOp op) {
    if (n == 0) return;
    CommHandle h;
    Pending& p = add_collective(&h, "host all-reduce");
    MPI_Request r;
    MPI_Iallreduce(MPI_IN_PLACE, x, (int)n, MPI_DOUBLE, op == ReduceOp::Sum ? MPI_SUM : MPI_MAX, comm_, &r);
    p.reqs.push_back(r);
    do_wait(h);
}

// ---- the watchdog -------------------------------------------------------------------

// Polled against the timeout (watched_wait, llmc/comm/arrivals.h); the
// time is the group's blocked time.
void MpiComm::wait_pending(Pending& p) {
    if (p.reqs.empty()) return;
    int done = 0;
    MPI_Testall((int)p.reqs.size(), p.reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return;
    arrivals_->drain();  // peers' notes do not pile up over a long run
    blocked_s_ += watched_wait(p.reqs.data(), (int)p.reqs.size(), timeout_,
                               [&](double since, double waited) { timed_out(p, since, waited); });
}

// The line: the call, its group, and who did not come (Arrivals::late).
void MpiComm::timed_out(const Pending& p, double since, double waited) {
    char buf[160];
    std::snprintf(buf, sizeof(buf), " has not completed after %.1f s (--collective-timeout %g); ", waited, timeout_);
    dist_abort("collective timed out: " + std::string(p.kind) + " on group " + name_ + arrivals_->what(p.expect) +
               buf + arrivals_->late(p.expect, since) + "; ending every rank");
}

#endif  // LLMC_MPI
