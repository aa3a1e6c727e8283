// llmc/comm/arrivals.cpp: which ranks reached a call (llmc/comm/arrivals.h).
// Compiled to nothing in builds without MPI.
#ifdef LLMC_MPI
#include "llmc/comm/arrivals.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>

namespace {

// The notes' tag on a group's duplicate communicator.
constexpr int kNoteTag = 1;

// Every live group of the process: a rank whose wait grows long tells its
// counts on all of them.
std::mutex g_live_mu;
std::vector<Arrivals*> g_live;

}  // namespace

double arrivals_now() {
    return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Arrivals::Arrivals(MPI_Comm comm, const std::string& name) : name_(name) {
    MPI_Comm_dup(comm, &watch_);
    MPI_Comm_rank(watch_, &rank_);
    MPI_Comm_size(watch_, &size_);
    const size_t g = (size_t)size_;
    sends_to_.assign(g, 0), recvs_from_.assign(g, 0);
    told_coll_.assign(g, 0), told_sends_.assign(g, 0), told_recvs_.assign(g, 0);
    heard_.assign(g, -1);
    std::vector<int> mine(g);
    world_of_.assign(g, -1);
    for (int i = 0; i < size_; i++) mine[(size_t)i] = i;
    MPI_Group group, world;
    MPI_Comm_group(watch_, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    MPI_Group_translate_ranks(group, size_, mine.data(), world, world_of_.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
    std::lock_guard<std::mutex> lk(g_live_mu);
    g_live.push_back(this);
}

Arrivals::~Arrivals() {
    {
        std::lock_guard<std::mutex> lk(g_live_mu);
        g_live.erase(std::remove(g_live.begin(), g_live.end(), this), g_live.end());
    }
    // After MPI_Finalize nothing may be called (a grid may outlive
    // dist_finalize); MPI has released everything by then.
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    std::lock_guard<std::mutex> lk(mu_);
    // Notes are tiny (sent at once); one a peer has not taken is dropped with
    // the communicator. A send MPI still holds keeps its buffer (a few bytes
    // left allocated), since MPI may read it until the send completes.
    drain_locked();
    for (auto& n : notes_) {
        int sent = 0;
        MPI_Test(&n->req, &sent, MPI_STATUS_IGNORE);
        if (sent) continue;
        MPI_Request_free(&n->req);
        n.release();
    }
    notes_.clear();
    MPI_Comm_free(&watch_);
}

Arrivals::Expect Arrivals::collective() {
    std::lock_guard<std::mutex> lk(mu_);
    return {Expect::Collective, -1, ++coll_seq_};
}
Arrivals::Expect Arrivals::send_to(int peer) {
    std::lock_guard<std::mutex> lk(mu_);
    return {Expect::RecvFromUs, peer, ++sends_to_[(size_t)peer]};
}
Arrivals::Expect Arrivals::recv_from(int peer) {
    std::lock_guard<std::mutex> lk(mu_);
    return {Expect::SendToUs, peer, ++recvs_from_[(size_t)peer]};
}

void Arrivals::tell_all(bool again) {
    std::lock_guard<std::mutex> lk(g_live_mu);
    for (Arrivals* a : g_live) a->tell(again);
}

void Arrivals::tell(bool again) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < notes_.size();) {  // sent ones leave
        int sent = 0;
        MPI_Test(&notes_[i]->req, &sent, MPI_STATUS_IGNORE);
        if (sent) notes_.erase(notes_.begin() + (long)i);
        else i++;
    }
    uint64_t sum = coll_seq_;
    for (int q = 0; q < size_; q++) sum += sends_to_[(size_t)q] + recvs_from_[(size_t)q];
    if (sum != told_sum_ || again) {
        told_sum_ = sum;
        for (int q = 0; q < size_; q++) {
            if (q == rank_) continue;
            std::unique_ptr<Note> n(new Note{{coll_seq_, sends_to_[(size_t)q], recvs_from_[(size_t)q]}, MPI_REQUEST_NULL});
            MPI_Isend(n->v, 3, MPI_UINT64_T, q, kNoteTag, watch_, &n->req);
            notes_.push_back(std::move(n));
        }
    }
    drain_locked();
}

void Arrivals::drain() {
    std::lock_guard<std::mutex> lk(mu_);
    drain_locked();
}

void Arrivals::drain_locked() {
    for (;;) {
        int flag = 0;
        MPI_Status st;
        MPI_Iprobe(MPI_ANY_SOURCE, kNoteTag, watch_, &flag, &st);
        if (!flag) return;
        uint64_t v[3];
        MPI_Recv(v, 3, MPI_UINT64_T, st.MPI_SOURCE, kNoteTag, watch_, MPI_STATUS_IGNORE);
        const size_t s = (size_t)st.MPI_SOURCE;
        heard_[s] = arrivals_now();
        // Counts only grow; a late note never lowers them.
        told_coll_[s] = std::max(told_coll_[s], v[0]);
        told_sends_[s] = std::max(told_sends_[s], v[1]);
        told_recvs_[s] = std::max(told_recvs_[s], v[2]);
    }
}

std::string Arrivals::what(const std::vector<Expect>& expect) const {
    std::string w;
    for (const Expect& e : expect) {
        if (e.what == Expect::Collective) w += " (its collective " + std::to_string(e.seq) + ")";
        else
            w += std::string(e.what == Expect::SendToUs ? " from " : " to ") + name_ + " rank " + std::to_string(e.peer);
    }
    return w;
}

std::string Arrivals::late(const std::vector<Expect>& expect, double since) const {
    std::vector<int> late;
    {
        std::lock_guard<std::mutex> lk(mu_);
        for (const Expect& e : expect) {
            if (e.what == Expect::Collective) {
                for (int q = 0; q < size_; q++)
                    if (q != rank_ && told_coll_[(size_t)q] < e.seq) late.push_back(q);
            } else {
                const size_t q = (size_t)e.peer;
                const bool sends = e.what == Expect::SendToUs;
                if (e.peer != rank_ && (sends ? told_sends_[q] : told_recvs_[q]) < e.seq) late.push_back(e.peer);
            }
        }
    }
    std::sort(late.begin(), late.end());
    late.erase(std::unique(late.begin(), late.end()), late.end());
    std::string m;
    if (late.empty()) {
        m = "every rank of the group reached it, as far as known";
    } else {
        m = "ranks that did not arrive: ";
        for (size_t i = 0; i < late.size(); i++)
            m += (i ? ", " : "") + std::to_string(world_of_[(size_t)late[i]]) + " (" + name_ + " rank " +
                 std::to_string(late[i]) + ")";
    }
    // Every rank that waits long tells every group it is in, the world among
    // them: who was not heard from since we began waiting is in no call.
    int world = 1, me = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm_rank(MPI_COMM_WORLD, &me);
    std::vector<char> heard((size_t)world, 0);
    {
        std::lock_guard<std::mutex> lk(g_live_mu);
        for (Arrivals* a : g_live) {
            std::lock_guard<std::mutex> la(a->mu_);
            for (int q = 0; q < a->size_; q++)
                if (a->heard_[(size_t)q] >= since && a->world_of_[(size_t)q] >= 0)
                    heard[(size_t)a->world_of_[(size_t)q]] = 1;
        }
    }
    std::string silent;
    for (int w = 0; w < world; w++)
        if (w != me && !heard[(size_t)w]) silent += (silent.empty() ? "" : ", ") + std::to_string(w);
    if (!silent.empty()) m += "; ranks waiting in no collective (stalled or computing): " + silent;
    return m;
}

double watched_wait(MPI_Request* reqs, int n, double timeout,
                    const std::function<void(double since, double waited)>& timed_out) {
    const double t0 = arrivals_now();
    if (timeout <= 0) {
        MPI_Waitall(n, reqs, MPI_STATUSES_IGNORE);
        return arrivals_now() - t0;
    }
    const double slow = std::min(2.0, timeout / 4);
    useconds_t nap = 20;
    bool told = false;
    for (;;) {
        int done = 0;
        MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE);
        const double waited = arrivals_now() - t0;
        if (done) return waited;
        if (waited < 0.002) {
            sched_yield();
            continue;
        }
        if (waited >= slow) {
            Arrivals::tell_all(!told);
            told = true;
        }
        if (waited > timeout) timed_out(t0, waited);
        ::usleep(nap);
        nap = std::min<useconds_t>(nap * 2, 1000);
    }
}
#endif  // LLMC_MPI
