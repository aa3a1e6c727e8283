// tests/lib/null_comm.h: NullComm, a communicator of a given size and rank
// that moves nothing: every call completes at once, host reductions return
// their input. For tests that need a group's shape (building a rank's model
// stack) or its byte counts (Comm::count), not its data.
#pragma once
#include <string>
#include <vector>

#include "llmc/comm/comm.h"

class NullComm : public Comm {
  public:
    NullComm(const std::string& name, int size, int rank) {
        name_ = name;
        size_ = size;
        rank_ = rank;
    }
    double host_all_reduce(double x, ReduceOp) override { return x; }

  protected:
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return 0; }
    CommHandle do_reduce_scatter(const void*, void*, size_t, DType) override { return 0; }
    CommHandle do_all_gather(const void*, void*, size_t, DType) override { return 0; }
    void do_broadcast(void*, size_t, DType, int) override {}
    CommHandle do_send_recv(const void*, int, void*, int, size_t, DType) override { return 0; }
    void do_p2p(const std::vector<P2POp>& ops, DType, std::vector<CommHandle>* h) override { h->assign(ops.size(), 0); }
    void do_wait(CommHandle) override {}
};
