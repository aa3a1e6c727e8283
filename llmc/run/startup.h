// llmc/run/startup.h: what every mode of train_gpt does first, on every
// rank: agree on errors found while setting up (so all ranks exit together
// with one message), check that the ranks were given the same flags and
// read the same data, that the outputs can be written, and share the node's
// CPU cores between its ranks. What -e, --convert and --tokenizer name is
// llmc/run/model_source.h.
#pragma once
#include <string>

#include "llmc/base/args.h"
#include "llmc/io/dataloader.h"
#include "llmc/run/train_config.h"

// Setup errors: every rank reaches the same check, so the ranks agree on
// the outcome; rank 0 prints the first failing rank's message as
// "train_gpt: error: ..." and every rank exits with status 2 (kExitSetup):
// an error of the flags, the files or the run's own limits, which running
// the same command again cannot fix (scripts/supervise.py stops on it),
// where a fault during the run ends the job with status 1 (end_job).
constexpr int kExitSetup = 2;
void setup_check(bool ok, const std::string& msg);

// Errors during training, possibly on one rank only: end the whole job
// (llmc/comm/dist.h dist_abort).
[[noreturn]] void end_job(const std::string& msg);

// Every rank must run with the same flags (mpirun -np 1 A : -np 1 B would
// otherwise hang or train wrong): rank 0's values go to every rank, each
// compares them with its own, and the lowest rank that differs names the
// first flag where it does (a setup_check). Called right after parsing,
// before the run's mode is chosen: one rank given --help, --plan or
// --calibrate while the others train would otherwise leave them waiting.
void check_same_flags(const ArgParser& parser, bool help);

// Why an output the run writes only at its end (--export-model,
// --export-hf, --trace) could not be written, or "" when it can: checked
// before the first step, so that a typo does not cost the whole run.
// directory: the path is a folder to create or fill, else a file.
std::string output_path_problem(const std::string& path, bool directory);

// Every rank must read the same data: rank 0's fingerprint of the loader
// (DataLoader::fingerprint) goes to every rank, and a rank whose files differ
// (another working directory, another copy) ends the job with one line
// naming the flag and the pattern, instead of training on other data and
// hanging at the end of a shorter epoch. Then every token id is checked
// against the vocabulary (DataLoader::check_ids, the ranks sharing the
// reading), so a bad id stops the run before the first step.
// Returns the fingerprint (checkpoints keep it, so a resume sees other data).
std::string check_same_data(DataLoader& data, const char* flag, const std::string& pattern);

// How OpenMP's threads wait between parallel regions, before the runtime
// reads it (it does so when the library loads, before main): unless
// OMP_WAIT_POLICY or GOMP_SPINCOUNT is set, the process starts itself again
// (execv of the file /proc/self/exe points to, the same arguments, so the
// process keeps its name; nothing has run yet, MPI included) with GOMP_SPINCOUNT=1000: a wait spins about a microsecond,
// then sleeps. The runtime's default spins 300000 times first, which on a
// shared machine keeps the cores of waiting threads from the threads doing
// the work (a default run beside one busy loop on 2 cores: 4.1x its quiet
// time, against 2.3x; scripts/benchmark_busy.py); quiet, the two are the
// same. The first thing main() calls; a failed exec goes on as it is.
void openmp_wait_policy(char** argv);
// The wait policy in force, for the settings.
std::string openmp_wait_text();

// CPU threads: unless OMP_NUM_THREADS says otherwise, the ranks on a node
// share its cores (every rank starting as many threads as the node has
// cores runs several times slower), and no rank runs more threads than the
// cores mpirun bound it to. Returns the line for the settings. During a
// run the count may go lower while other processes use the cores
// (llmc/run/cpu_threads.h).
std::string choose_threads();
