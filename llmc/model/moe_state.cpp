// llmc/model/moe_state.cpp: the MoE blocks' state between calls, and the
// routing bias's update and the loads' imbalance (llmc/model/moe_state.h).
#include "llmc/model/moe_state.h"

#include <algorithm>
#include <stdexcept>

#include "llmc/backend/moe_figures.h"

void MoeState::init(int L, int E, size_t layer_slots, size_t chunk_slots, bool ep) {
    E_ = E;
    load_.assign((size_t)L * E, 0.0);
    offsets_.assign(layer_slots + 1, std::vector<int>(E + 1, 0));
    if (ep) routes_.assign(layer_slots + 1, ExpertParallelOps::Route());
    count_.assign(chunk_slots, std::vector<double>(E, 0.0));
    psum_.assign(chunk_slots, std::vector<double>(E, 0.0));
}

std::vector<double> MoeState::take_stats() {
    const size_t E = E_;
    std::vector<double> out(2 * E, 0.0);
    for (size_t s = 0; s < count_.size(); s++)
        for (size_t e = 0; e < E; e++) {
            out[e] += count_[s][e];
            out[E + e] += psum_[s][e];
            count_[s][e] = psum_[s][e] = 0;
        }
    return out;
}

std::vector<double> MoeState::take_loads() {
    std::vector<double> out = load_;
    std::fill(load_.begin(), load_.end(), 0.0);
    return out;
}

void moe_bias_update(std::vector<double>* bias, const std::vector<double>& loads, int E, double rate) {
    if (bias->size() != loads.size() || E < 1 || loads.size() % E != 0)
        throw std::invalid_argument("moe_bias_update: loads and bias of other shapes");
    moe_bias_step(bias->data(), loads.data(), (int)(loads.size() / E), E, rate);
}

double moe_max_violation(const std::vector<double>& loads, int E) {
    if (E < 1 || loads.empty() || loads.size() % E != 0) return 0;
    return moe_imbalance(loads.data(), (int)(loads.size() / E), E);
}
