// llmc/comm/arrivals.h: Arrivals, which ranks of a group reached a call, for
// the watchdogs' lines (the MPI transport's wait, the NCCL transport's
// thread). Each rank counts what it has issued on the group: collectives,
// and transfers to and from each peer. A rank whose wait grows long tells
// its peers its counts, on every live group (a peer may be waiting on any
// of them), over a duplicate of each group's communicator; at the timeout
// it compares what the call needs with what the peers told: a peer that
// never said it reached the call did not arrive (or is stuck before it).
// Every long wait tells at least once, so a rank heard from on no group
// since our wait began is waiting in no call at all: stalled, or still
// computing.
//
// Thread-safe: the NCCL transport counts on the main thread and tells and
// reads on its watchdog's (with MPI_THREAD_MULTIPLE: dist_mpi_threads()).
// Exists only in builds with MPI (LLMC_MPI).
#pragma once
#ifdef LLMC_MPI
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "llmc/comm/mpi.h"

class Arrivals {
  public:
    // What a call needs of one peer, or of every rank (peer -1): to have
    // issued its seq-th collective, send to us, or receive from us.
    struct Expect {
        enum What { Collective, SendToUs, RecvFromUs } what;
        int peer;
        uint64_t seq;
    };
    // Collective over comm (duplicated for the notes); name: the group's,
    // for the lines.
    Arrivals(MPI_Comm comm, const std::string& name);
    ~Arrivals();
    Arrivals(const Arrivals&) = delete;
    Arrivals& operator=(const Arrivals&) = delete;

    // Counting a call as it is issued: what it needs of the peers.
    Expect collective();
    Expect send_to(int peer);    // we send to peer: it must receive from us
    Expect recv_from(int peer);  // we receive from peer: it must send to us

    // Every live group tells its counts (when they changed, or `again`) and
    // reads what its peers told: the step of a long wait.
    static void tell_all(bool again);
    // Reads the peers' notes on this group (so they do not pile up).
    void drain();
    // " (its collective 12)", " from dp rank 1", ...: what the call waits for.
    std::string what(const std::vector<Expect>& expect) const;
    // "ranks that did not arrive: 3 (dp rank 1)" or "every rank of the group
    // reached it, as far as known", then, when some ranks of the world were
    // heard on no group since `since` (host clock, s), "; ranks waiting in no
    // collective (stalled or computing): 2, 5".
    std::string late(const std::vector<Expect>& expect, double since) const;

  private:
    void tell(bool again);
    void drain_locked();
    mutable std::mutex mu_;
    std::string name_;
    int rank_ = 0, size_ = 1;
    MPI_Comm watch_ = MPI_COMM_NULL;
    std::vector<int> world_of_;  // group rank -> world rank
    // Our counts: collectives issued, transfers to and from each group rank;
    // theirs, as last told.
    uint64_t coll_seq_ = 0;
    std::vector<uint64_t> sends_to_, recvs_from_;
    std::vector<uint64_t> told_coll_, told_sends_, told_recvs_;  // peer's collectives, its sends to us, receives from us
    std::vector<double> heard_;  // when each peer's last note came (host clock, s)
    uint64_t told_sum_ = 0;      // the sum of our counts when last told (they only grow)
    struct Note {
        uint64_t v[3];
        MPI_Request req;
    };
    std::vector<std::unique_ptr<Note>> notes_;  // our messages still being sent
};

// The host clock of the notes (seconds, steady).
double arrivals_now();

// The watched wait of every MPI call (the groups' and the start-up's): polls
// the n requests (MPI_Testall; a yield for the first 2 ms, so a rank sharing
// the core runs, then naps growing to 1 ms, so a long wait costs little
// CPU); past a quarter of the timeout (at most 2 s) the wait is long and
// every live group tells its counts (Arrivals::tell_all: once, then on each
// change); past the timeout it calls timed_out(since, waited), which must
// not return. timeout <= 0: a plain MPI_Waitall. Returns the seconds waited.
double watched_wait(MPI_Request* reqs, int n, double timeout,
                    const std::function<void(double since, double waited)>& timed_out);
#endif  // LLMC_MPI
