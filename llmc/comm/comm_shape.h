// llmc/comm/comm_shape.h: ShapeComm, a communicator of a given size and rank
// that moves nothing: a group's shape for building a rank's model stack
// without the rank's peers (the planner builds any rank of any layout, the
// tests a whole world in one process), and its byte counts (Comm::count
// counts every call as a real group would). Calls complete at once and host
// reductions return their input; with refuse set, any call that would move
// a buffer throws instead (the planner's stacks are built, never run).
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "llmc/comm/comm.h"

class ShapeComm : public Comm {
  public:
    ShapeComm(const std::string& name, int size, int rank, bool refuse = false) : refuse_(refuse) {
        name_ = name;
        size_ = size;
        rank_ = rank;
    }
    double host_all_reduce(double x, ReduceOp) override { return x; }

  protected:
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return check(); }
    CommHandle do_reduce_scatter(const void*, void*, size_t, DType) override { return check(); }
    CommHandle do_all_gather(const void*, void*, size_t, DType) override { return check(); }
    void do_broadcast(void*, size_t, DType, int) override { check(); }
    CommHandle do_send_recv(const void*, int, void*, int, size_t, DType) override { return check(); }
    void do_p2p(const std::vector<P2POp>& ops, DType, std::vector<CommHandle>* h) override {
        check();
        h->assign(ops.size(), 0);
    }
    void do_wait(CommHandle) override {}

  private:
    CommHandle check() const {
        if (refuse_) throw std::logic_error("group " + name_ + ": a group of shapes only does not communicate");
        return 0;
    }
    bool refuse_;
};
