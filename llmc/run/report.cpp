// llmc/run/report.cpp: the memory line and the traffic summary (llmc/run/report.h).
#include "llmc/run/report.h"

#include <unistd.h>

#include <cstdio>
#include <utility>
#include <vector>

#include "llmc/comm/dist.h"

void print_whole_line(const std::string& line) {
    std::fflush(stdout);
    const std::string s = line + "\n";
    size_t done = 0;
    while (done < s.size()) {
        const ssize_t n = write(STDOUT_FILENO, s.data() + done, s.size() - done);
        if (n <= 0) break;
        done += (size_t)n;
    }
}

void print_rank_lines(const std::string& line) {
    for (const std::string& l : dist_gather_strings(line)) print_whole_line(l);
}

std::string human_bytes(double b) {
    const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    char s[32];
    std::snprintf(s, sizeof(s), "%.1f %s", b, units[u]);
    return s;
}

std::string memory_line(const char* when, int rank, GPT& model, size_t comm_bytes, int stage, int stages,
                        size_t async_host) {
    size_t bytes[6] = {};  // params grads master optimizer activations comm
    const char* names[6] = {"params", "grads", "master", "optimizer", "activations", "comm"};
    size_t per_layer = 0;
    for (const BufferInfo& b : model.buffers()) {
        for (int k = 0; k < 5; k++)
            if (b.group == names[k] || (k == 4 && b.group == "scratch")) bytes[k] += b.bytes;
        if (b.per_layer) per_layer += b.bytes;
    }
    bytes[5] = comm_bytes;
    std::string line = "memory[" + std::to_string(rank) + "] " + when + ":";
    for (int k = 0; k < 6; k++) line += " " + std::string(names[k]) + "=" + std::to_string(bytes[k]);
    line += " layer_activations=" + std::to_string(model.layer_activation_bytes());
    int layers = 0;
    std::string in_flight;
    for (const ModelChunk& c : model.chunks()) {
        layers += c.layers;
        in_flight += (in_flight.empty() ? "" : ",") + std::to_string(c.slots);
    }
    line += " stage=" + std::to_string(stage) + "/" + std::to_string(stages) + " layers=" + std::to_string(layers) +
            " in_flight=" + in_flight + " stage_activations=" + std::to_string(per_layer);
    line += " bytes=" + std::to_string(model.backend().bytes_in_use());
    line += " total=" + human_bytes((double)model.backend().bytes_in_use()) +
            " peak=" + human_bytes((double)model.backend().bytes_peak());
    // Host memory beside the backend's (on a GPU not in bytes; on the CPU
    // backend the same RAM): the snapshot of --async-checkpoint.
    if (async_host) line += " async_checkpoint_host=" + std::to_string(async_host);
    return line;
}

// The groups whose traffic is reported, with their names in the report.
static std::vector<std::pair<const char*, Comm*>> groups(ProcessGrid& g) {
    std::vector<std::pair<const char*, Comm*>> v = {{"dp", g.dpcp_group.get()}, {"tp", g.tp_group.get()},
                                                    {"cp", g.cp_group.get()},   {"pp", g.pp_group.get()},
                                                    {"embed", g.embed_group.get()}};
    // Hybrid context parallel's all-to-all groups and rings, by their own names.
    if (g.cp_a2a_group) v.push_back({"cp_a2a", g.cp_a2a_group.get()});
    if (g.cp_ring_group) v.push_back({"cp_ring", g.cp_ring_group.get()});
    // Expert parallel: the tokens' all-to-all, and the experts' gradients.
    if (g.ep_group) v.push_back({"ep", g.ep_group.get()});
    if (g.edp_group) v.push_back({"edp", g.edp_group.get()});
    return v;
}

void reset_counts(ProcessGrid& g) {
    g.world->counts().reset();
    for (auto& gr : groups(g)) gr.second->counts().reset();
}

std::string comm_summary(ProcessGrid& g, std::string* json) {
    std::string text;
    *json = "{";
    bool first = true;
    for (auto& gr : groups(g)) {
        CommCounts& c = gr.second->counts();
        if (gr.second->size() <= 1) continue;
        for (int k = 0; k < (int)CommKind::count; k++) {
            if (!c.calls[k]) continue;
            std::string key = std::string(gr.first) + "_" + comm_kind_name((CommKind)k);
            *json += (first ? "" : ", ") + ("\"" + key + "\": {\"calls\": " + std::to_string(c.calls[k]) +
                                           ", \"bytes\": " + std::to_string(c.bytes[k]) + "}");
            text += " " + key + " " + human_bytes((double)c.bytes[k]);
            first = false;
        }
        c.reset();
    }
    *json += "}";
    return text;
}

double blocked_seconds(ProcessGrid& g) {
    double s = 0;
    for (auto* c : {&g.world, &g.dp_group, &g.cp_group, &g.tp_group, &g.dpcp_group, &g.pp_group, &g.embed_group,
                    &g.cp_a2a_group, &g.cp_ring_group, &g.ep_group, &g.edp_group})
        if (*c && (*c)->size() > 1) s += (*c)->blocked_seconds();
    return s;
}

std::string hms(double seconds) {
    char b[32];
    const long v = (long)(seconds + 0.5);
    std::snprintf(b, sizeof b, "%ld:%02ld:%02ld", v / 3600, v / 60 % 60, v % 60);
    return b;
}
