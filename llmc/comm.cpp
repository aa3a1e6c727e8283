// llmc/comm.cpp: what every communicator shares: the names of the kinds of
// call and the ring-algorithm traffic counts (llmc/comm.h). The transports
// live in comm_mpi.cpp (MPI, host buffers), comm_nccl.cu (NCCL) and
// comm_staged.cu (MPI staged through host memory); the size-1 LocalComm
// lives with the group construction in process_grid.cpp.
#include "comm.h"

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
// shared/reference.md section 6), from the element count of the full buffer:
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
