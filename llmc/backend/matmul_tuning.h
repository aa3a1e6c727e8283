// llmc/backend/matmul_tuning.h: what a backend offers for choosing each
// matrix product's algorithm by timing (--matmul-tune 1, docs/design.md
// section 2.11): its timings of one product shape, and the choices it is
// told to take. A backend with several algorithms per product (CUDA:
// cuBLASLt's heuristic returns a ranked list; its first is what runs
// untuned) times a few of them on each shape it has run
// (Backend::time_matmul_candidates) and runs what it is told
// (Backend::choose_matmul_algorithms). How the ranks' timings become one
// choice, and the file that keeps them, is the run's (llmc/run/matmul_tune.h).
#pragma once
#include <map>
#include <string>
#include <vector>

// One shape's timings on one backend. shape: the backend's description of
// the product (its types, sizes, transposes, epilogue, alignments), the
// same text on every rank for the same product; ids: its candidates in the
// backend's order of preference (ids[0] is what runs untuned), each a name
// that is the same on every rank for the same algorithm; ms: each one's time
// per call (+inf: it failed to run).
struct MatmulTrial {
    std::string shape;
    std::vector<std::string> ids;
    std::vector<double> ms;
};

// Shape -> the algorithm id a backend runs for it.
using MatmulChoices = std::map<std::string, std::string>;
