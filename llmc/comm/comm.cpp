// llmc/comm/comm.cpp: what every communicator shares: the names of the kinds of
// call and the ring-algorithm traffic counts (llmc/comm/comm.h). The transports
// live in comm_mpi.cpp (MPI, host buffers), comm_nccl.cu (NCCL) and
// comm_staged.cu (MPI staged through host memory); the size-1 LocalComm
// lives with the group construction in process_grid.cpp.
#include "llmc/comm/comm.h"

#include <algorithm>
#include <stdexcept>

#include "llmc/base/trace.h"
#include "llmc/comm/watchdog.h"

const char* comm_kind_name(CommKind k) {
    switch (k) {
        case CommKind::AllReduce:
            return "all-reduce";
        case CommKind::ReduceScatter:
            return "reduce-scatter";
        case CommKind::AllGather:
            return "all-gather";
        case CommKind::Broadcast:
            return "broadcast";
        case CommKind::SendRecv:
            return "send-recv";
        case CommKind::count:
            break;
    }
    return "?";
}

uint64_t CommCounts::total_bytes() const {
    uint64_t s = 0;
    for (int k = 0; k < (int)CommKind::count; k++) s += bytes[k];
    return s;
}

// Bytes one rank sends for one call with ring algorithms (the convention of
// docs/design.md section 6), from the element count of the full buffer:
// all-reduce 2·n·(g-1)/g; reduce-scatter and all-gather n·(g-1)/g; broadcast
// and send n. Integer arithmetic in 64 bits, the product taken before the
// division, so the numbers can be compared exactly against the formula.
void Comm::count(CommKind k, size_t full_elems, DType t) {
    if (size_ <= 1) return;  // a group of one moves nothing
    const uint64_t n = full_elems, g = (uint64_t)size_;
    uint64_t elems = 0;
    switch (k) {
        case CommKind::AllReduce:
            elems = 2 * n * (g - 1) / g;
            break;
        case CommKind::ReduceScatter:
        case CommKind::AllGather:
            elems = n * (g - 1) / g;
            break;
        case CommKind::Broadcast:
        case CommKind::SendRecv:
            elems = n;
            break;
        case CommKind::count:
            return;
    }
    counts_.calls[(int)k] += 1;
    counts_.bytes[(int)k] += elems * (uint64_t)dtype_size(t);
}

// ---- the public calls: the transport's work, traced ---------------------------------

// A call that finished inside do_* (handle 0) is a span at once; one still in
// flight is remembered until wait(). Groups of one are not traced (they move
// nothing).
CommHandle Comm::traced(CommKind k, double t0, uint64_t bytes_before, CommHandle h) {
    if (size_ <= 1) return h;
    const uint64_t bytes = counted_bytes() - bytes_before;
    if (h == 0) {
        trace::add(k == CommKind::SendRecv ? trace::Track::p2p : trace::Track::collective,
                   name_ + " " + comm_kind_name(k), comm_kind_name(k), t0, trace::now(),
                   "\"bytes\": " + std::to_string(bytes));
        return h;
    }
    open_.push_back({h, {k, t0, bytes, ""}});
    return h;
}

// Every call passes the tests' stall hook first (llmc/comm/watchdog.h),
// except those of a transport inside another (untraced: the outer call
// passed it already).
#define TRACED(kind, call)                                         \
    if (size_ > 1 && traced_) collective_test_stall();             \
    if (!traced_ || !trace::on()) return call;                     \
    const double t0 = trace::now();                                \
    const uint64_t b0 = counted_bytes();                           \
    return traced(kind, t0, b0, call)

CommHandle Comm::start_all_reduce(void* buf, size_t n, DType t, ReduceOp op) {
    TRACED(CommKind::AllReduce, do_all_reduce(buf, n, t, op));
}
CommHandle Comm::start_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) {
    TRACED(CommKind::ReduceScatter, do_reduce_scatter(send, recv, recv_n, t));
}
CommHandle Comm::start_all_gather(const void* send, void* recv, size_t send_n, DType t) {
    TRACED(CommKind::AllGather, do_all_gather(send, recv, send_n, t));
}
CommHandle Comm::start_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) {
    TRACED(CommKind::SendRecv, do_send_recv(send, dst, recv, src, n, t));
}
void Comm::start_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) {
    handles->assign(ops.size(), 0);
    if (ops.empty()) return;
    if (size_ > 1 && traced_) collective_test_stall();
    const double t0 = traced_ && trace::on() ? trace::now() : 0;
    do_p2p(ops, t, handles);
    if (!traced_ || !trace::on() || size_ <= 1) return;
    // One span per transfer, from the group's start to the wait that ends it.
    for (size_t i = 0; i < ops.size(); i++) {
        const P2POp& op = ops[i];
        Open o{CommKind::SendRecv, t0, op.n * dtype_size(t),
               std::string(op.send ? "send to " : "recv from ") + std::to_string(op.peer)};
        if ((*handles)[i] == 0) {
            trace::add(trace::Track::p2p, name_ + " " + o.what, op.send ? "send" : "recv", t0, trace::now(),
                       "\"bytes\": " + std::to_string(o.bytes));
        } else {
            open_.push_back({(*handles)[i], o});
        }
    }
}
#undef TRACED

void Comm::all_to_all_v(const void* send, const std::vector<size_t>& send_n, void* recv,
                        const std::vector<size_t>& recv_n, DType t) {
    if (send_n.size() != (size_t)size_ || recv_n.size() != (size_t)size_)
        throw std::invalid_argument("all_to_all_v on " + name_ + ": sizes for another group size");
    std::vector<P2POp> ops;
    size_t so = 0, ro = 0;  // element offsets of peer p's blocks
    for (int p = 0; p < size_; so += send_n[p], ro += recv_n[p], p++) {
        if (p == rank_) continue;
        if (recv_n[p]) ops.push_back({false, elem_ptr(recv, t, ro), p, recv_n[p], 0});
        if (send_n[p]) ops.push_back({true, const_cast<void*>(elem_ptr(send, t, so)), p, send_n[p], 0});
    }
    std::vector<CommHandle> hs;
    start_p2p(ops, t, &hs);
    for (CommHandle h : hs) wait(h);
}

void Comm::broadcast(void* buf, size_t n, DType t, int root) {
    if (size_ > 1 && traced_) collective_test_stall();
    if (!traced_ || !trace::on()) return do_broadcast(buf, n, t, root);
    const double t0 = trace::now();
    const uint64_t b0 = counted_bytes();
    do_broadcast(buf, n, t, root);
    traced(CommKind::Broadcast, t0, b0, 0);
}

void Comm::wait(CommHandle h) {
    do_wait(h);
    if (h == 0 || open_.empty()) return;
    auto it = std::find_if(open_.begin(), open_.end(), [h](const std::pair<CommHandle, Open>& p) { return p.first == h; });
    if (it == open_.end()) return;
    const Open o = it->second;
    open_.erase(it);
    // The p2p track for sends and receives, the collective track for the rest.
    if (!o.what.empty())
        trace::add(trace::Track::p2p, name_ + " " + o.what, o.what.compare(0, 4, "send") == 0 ? "send" : "recv", o.t0,
                   trace::now(), "\"bytes\": " + std::to_string(o.bytes));
    else
        trace::add(o.kind == CommKind::SendRecv ? trace::Track::p2p : trace::Track::collective,
                   name_ + " " + comm_kind_name(o.kind), comm_kind_name(o.kind), o.t0, trace::now(),
                   "\"bytes\": " + std::to_string(o.bytes));
}
