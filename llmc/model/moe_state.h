// llmc/model/moe_state.h: what Mixtral's MoE blocks (llmc/model/moe.cpp) keep
// between calls, apart from the model's buffers: each layer-slot's expert
// row groups and exchange sizes (read again by its backward), each
// micro-batch's routing statistics (for the load-balancing loss), the
// load-balancing loss itself, and the experts' loads (for --moe-balance
// bias and the imbalance the step line reports); and the bias update and
// the imbalance as functions of a step's loads.
#pragma once
#include <cstddef>
#include <vector>

#include "llmc/model/parallel_hooks.h"

class MoeState {
  public:
    // E experts of L layers; layer_slots / chunk_slots: the model's
    // layer-slots and chunk-slots (activations.h); ep: routes are kept.
    void init(int L, int E, size_t layer_slots, size_t chunk_slots, bool ep);

    // The load-balancing loss of the last forward's micro-batch (without its
    // coefficient; 0 for other models and for a model split into pipeline
    // chunks), and the sum of it over the forwards since the last call
    // (which clears it).
    double aux_loss() const { return aux_last_; }
    double take_aux_sum() {
        const double s = aux_sum_;
        aux_sum_ = 0;
        return s;
    }
    // Over pipeline stages (docs/moe.md): the routing statistics of this
    // stage's blocks since the last call, [assignments per expert (E);
    // probability sums (E)], cleared.
    std::vector<double> take_stats();
    // The experts' loads: with counting on, each training forward adds its
    // blocks' assignments per expert ([L, E], this stage's layers);
    // take_loads returns them and clears them. Off for validation and
    // samples (and the pipeline's forward-only pass of the statistics).
    void count_loads(bool on) { count_loads_ = on; }
    bool counting_loads() const { return count_loads_; }
    std::vector<double> take_loads();
    // Whether the statistics, the load-balancing loss, the loads and the
    // routing bias live in backend memory (GPT::keep_moe_on_device: the
    // sync-free step), where nothing of the above is read on the host.
    bool on_device() const { return on_device_; }

  private:
    friend class GPT;  // the blocks' forward and backward fill what follows
    int E_ = 0;
    std::vector<std::vector<int>> offsets_;  // per layer-slot (and one scratch): the experts' row groups
    std::vector<ExpertParallelOps::Route> routes_;  // expert parallel: per layer-slot, the exchange's sizes
    std::vector<std::vector<double>> count_, psum_;  // per chunk-slot [E]: assignments, probabilities
    double aux_last_ = 0, aux_sum_ = 0;
    std::vector<double> load_;  // [L, E]: the training forwards' assignments since the last take
    bool count_loads_ = false, bias_on_ = false;
    // On the device (doubles in backend memory): per chunk-slot [2E]
    // statistics, the loads [L, E], and the routing bias [L, E] the stat-type
    // bias is rounded from.
    bool on_device_ = false;
    void *stats_dev_ = nullptr, *loads_dev_ = nullptr, *bias_dev_ = nullptr;
};

// --moe-balance bias's update (DeepSeek-V3) from a step's loads [L, E]
// (assignments per layer and expert, over the whole batch): every expert's
// bias moves by rate toward an even load, b_e += rate · sign(mean - load_e),
// the mean over the layer's E experts. And the loads' imbalance, the mean
// over layers of max_e load_e / mean - 1 (0: even; "MaxVio").
void moe_bias_update(std::vector<double>* bias, const std::vector<double>& loads, int E, double rate);
double moe_max_violation(const std::vector<double>& loads, int E);
