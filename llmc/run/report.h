// llmc/run/report.h: what the trainer prints about a run besides the losses:
// the memory line of each rank (bytes held by kind, the pipeline stage and
// its micro-batches in flight), the traffic of a step by group and kind,
// and byte counts for humans. Machine-readable on purpose: the tests parse
// these lines and check them against the formulas of docs/design.md.
#pragma once
#include <string>

#include "llmc/model/gpt.h"
#include "llmc/parallel/process_grid.h"

// "12.3 MiB"
std::string human_bytes(double bytes);

// Seconds as H:MM:SS (the step lines' elapsed time and ETA, the run summary).
std::string hms(double seconds);

// One line per rank:
//   memory[R] WHEN: params=.. grads=.. master=.. optimizer=.. activations=..
//   comm=.. layer_activations=.. stage=S/P layers=N in_flight=a[,b..]
//   stage_activations=.. bytes=.. total=.. peak=..
// layer_activations: bytes one block keeps for its backward, per
// micro-batch; stage_activations: the per-block activations the stage holds
// (layers x in flight x layer_activations); bytes: what the backend holds,
// exactly (total and peak: the same for humans); comm_bytes: buffers of the
// parallel modes.
// Prints one line (a newline is added) with a single write(2) after
// flushing stdout, so that lines every rank prints at once reach mpirun's
// merged output whole rather than cut at stdio's buffer boundaries.
void print_whole_line(const std::string& line);
// Every rank's line, printed by rank 0 in rank order (a collective).
void print_rank_lines(const std::string& line);
// async_host: the host snapshot of --async-checkpoint (printed as
// async_checkpoint_host=N at the end of the line when not 0).
std::string memory_line(const char* when, int rank, GPT& model, size_t comm_bytes, int stage, int stages,
                        size_t async_host = 0);

// Zeroes every group's counts (traffic outside a training step).
void reset_counts(ProcessGrid& g);
// The traffic since the last reset, per group and kind: " dp_all-reduce
// 1.2 MiB ..." for the step line and {"dp_all-reduce": {"calls": .., "bytes":
// ..}, ...} for metrics.jsonl; then resets the counts.
std::string comm_summary(ProcessGrid& g, std::string* json);
// The seconds every group of the grid (the world included) has held this
// rank up so far (Comm::blocked_seconds), for the straggler check.
double blocked_seconds(ProcessGrid& g);
