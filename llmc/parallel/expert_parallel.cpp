// llmc/parallel/expert_parallel.cpp: see expert_parallel.h. Every collective of
// expert parallelism is issued in this file.
#include "llmc/parallel/expert_parallel.h"

#include <stdexcept>
#include <string>

ExpertParallel::ExpertParallel(Comm& group, Backend& be, int experts) : comm_(group), be_(be), experts_(experts) {
    if (experts < 1 || experts % group.size() != 0)
        throw std::invalid_argument("expert parallel: " + std::to_string(group.size()) + " ranks do not divide " +
                                    std::to_string(experts) + " experts");
    counts_ = (int*)be_.alloc((size_t)group.size() * experts * sizeof(int));
}

ExpertParallel::~ExpertParallel() { be_.release(counts_); }

void ExpertParallel::plan(const std::vector<int>& offsets, Route* r) {
    const int P = comm_.size(), me = comm_.rank(), E = experts_, El = E / P;
    std::vector<int> mine(E), all((size_t)P * E);
    for (int e = 0; e < E; e++) mine[e] = offsets[e + 1] - offsets[e];
    // Counted as the block's traffic (tiny beside the rows).
    be_.upload(counts_ + (size_t)me * E, DType::I32, mine.data(), DType::I32, E);
    comm_.all_gather(counts_ + (size_t)me * E, counts_, E, DType::I32);
    be_.download(all.data(), DType::I32, counts_, DType::I32, all.size());
    r->send_rows.assign(P, 0);
    r->recv_rows.assign(P, 0);
    r->block_rows.assign((size_t)P * El, 0);
    r->expert_rows = 0;
    for (int p = 0; p < P; p++)
        for (int j = 0; j < El; j++) {
            r->send_rows[p] += mine[p * El + j];  // to p's expert j
            const int n = all[(size_t)p * E + me * El + j];  // from p, for my expert j
            r->block_rows[(size_t)p * El + j] = n;
            r->recv_rows[p] += n;
            r->expert_rows += n;
        }
}

void ExpertParallel::exchange(const void* send, const std::vector<size_t>& send_rows, void* recv,
                              const std::vector<size_t>& recv_rows, size_t width, DType t) {
    const int P = comm_.size(), me = comm_.rank();
    std::vector<size_t> sn(P), rn(P);
    size_t so = 0, ro = 0;  // this rank's own block: where it is sent from and received at
    for (int p = 0; p < P; p++) {
        sn[p] = send_rows[p] * width;
        rn[p] = recv_rows[p] * width;
        if (p < me) so += sn[p], ro += rn[p];
    }
    comm_.all_to_all_v(send, sn, recv, rn, t);
    // The rows a rank routes to its own experts do not travel (sn[me] == rn[me]).
    if (sn[me]) be_.copy(elem_ptr(recv, t, ro), elem_ptr(send, t, so), sn[me] * dtype_size(t));
}

void ExpertParallel::dispatch(const void* grouped, void* expert_side, const Route& r, size_t width, DType t) {
    exchange(grouped, r.send_rows, expert_side, r.recv_rows, width, t);
}

void ExpertParallel::combine(const void* expert_side, void* grouped, const Route& r, size_t width, DType t) {
    exchange(expert_side, r.recv_rows, grouped, r.send_rows, width, t);
}
