// llmc/comm/comm_local.h: LocalComm, the communicator of a group of one
// process (every group of a one-process run, and the world in builds
// without MPI). Nothing to exchange: operations that move data between
// buffers copy through the backend, whose memory the buffers are; the rest
// do nothing. Never counted (Comm::count ignores groups of one).
#pragma once
#include <string>

#include "llmc/backend/backend.h"
#include "llmc/comm/comm.h"
#include "llmc/comm/dist.h"

class LocalComm : public Comm {
  public:
    LocalComm(const std::string& name, Backend& be) : be_(be) { name_ = name; }
    CommHandle do_all_reduce(void*, size_t, DType, ReduceOp) override { return 0; }
    CommHandle do_reduce_scatter(const void* send, void* recv, size_t recv_n, DType t) override {
        if (send != recv && recv_n) be_.copy(recv, send, recv_n * dtype_size(t));
        return 0;
    }
    CommHandle do_all_gather(const void* send, void* recv, size_t send_n, DType t) override {
        if (send != recv && send_n) be_.copy(recv, send, send_n * dtype_size(t));
        return 0;
    }
    void do_broadcast(void*, size_t, DType, int root) override { check(root, "broadcast root"); }
    CommHandle do_send_recv(const void* send, int dst, void* recv, int src, size_t n, DType t) override {
        check(dst, "send_recv destination");
        check(src, "send_recv source");
        if (send != recv && n) be_.copy(recv, send, n * dtype_size(t));  // to ourselves
        return 0;
    }
    // To ourselves: each receive takes the send with its tag.
    void do_p2p(const std::vector<P2POp>& ops, DType t, std::vector<CommHandle>* handles) override {
        handles->assign(ops.size(), 0);
        for (const P2POp& r : ops) {
            check(r.peer, "p2p peer");
            if (r.send) continue;
            for (const P2POp& s : ops)
                if (s.send && s.tag == r.tag && s.buf != r.buf && r.n) be_.copy(r.buf, s.buf, r.n * dtype_size(t));
        }
    }
    void do_wait(CommHandle) override {}

  public:
    double host_all_reduce(double x, ReduceOp) override { return x; }

  private:
    void check(int r, const char* what) {
        if (r != 0)
            dist_abort("internal: " + std::string(what) + " " + std::to_string(r) + " in group " + name_ +
                       " of size 1");
    }
    Backend& be_;
};
