// llmc/io/model_io.h: llm.c model files (docs/design.md section 1):
// a 256-int32 header (magic 20240326, version 3 = fp32 or 5 = bf16 payload,
// maxT, V, L, NH, C, Vp) then every parameter in model-file order.
#pragma once
#include <string>
#include <vector>

#include "llmc/model/config.h"
#include "llmc/model/gpt.h"
#include "llmc/io/weight_gather.h"

constexpr int kModelMagic = 20240326;

// Reads and checks a header: magic, version, positive sizes, and that the
// file holds exactly the parameters the header promises. *version is 3 or 5.
bool read_model_header(const std::string& path, GPTConfig* cfg, int* version, std::string* err);

// Loads weights into the model; the file's shape must equal the model's.
bool load_model(const std::string& path, GPT& model, std::string* err);

// The 256-int32 header of a model file of this shape and version.
std::vector<int> model_file_header(const GPTConfig& cfg, int version);

// Writes a model file atomically from host weights in model-file order
// (P = model_param_count(cfg) elements of type t), as version 3 (fp32) or 5
// (bf16).
bool write_model_file(const std::string& path, const GPTConfig& cfg, const void* host, DType t, int version,
                      std::string* err);

// Single-process convenience: writes the model's weights (master copy when
// there is one). The model must hold whole buffers (no sharding).
bool save_model(const std::string& path, GPT& model, int version, std::string* err);

// False (with *err naming `what`, the tensor and the element) when any of n
// values of type t in model-file order is NaN or infinite.
bool check_finite(const std::string& what, const GPTConfig& c, const void* host, DType t, size_t n, std::string* err);

// Writes the weights as an llm.c model file (version 3 fp32, 5 bf16),
// tensor by tensor: each tensor is gathered over own.world from its owners
// and rank 0 appends it, so no rank holds more than one tensor beside its
// buffers. Collective; every rank returns the same verdict.
bool export_model(const std::string& path, GPT& model, const Ownership& own, int version, std::string* err);
