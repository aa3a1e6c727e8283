// llmc/base/test_hooks.h: the one seam through which the tests reach into a
// run, every hook read from the environment here and nowhere else, so a
// reader sees at once what a test can make the trainer do. Unset (the
// normal run), each costs one comparison. The tests that use them:
// tests/e2e/test_train.py (bad steps), tests/distributed/test_watchdog.py
// (a stalled rank), tests/e2e/test_async_checkpoint.py (a slow writer),
// tests/distributed/test_sync_free.py (host reads),
// tests/distributed/test_matmul_tune.py (stand-in matmul algorithms),
// tests/e2e/test_supervise.py (a rank that dies once),
// tests/distributed/test_stragglers.py (a slow rank),
// tests/e2e/test_cpu_threads.py (other processes' load).
//
//   LLMC_TEST_NAN_STEP=K[:R[:WHERE]] world rank R (default 0) poisons step K
//                                   (from 0) with a NaN, so a bad step must be
//                                   skipped everywhere; WHERE: grad (default:
//                                   one element of its gradients, after their
//                                   reductions, before the optimizer step),
//                                   grad_pre (the same element at the step's
//                                   start, before the backward adds into it
//                                   and the reductions carry it), loss (its
//                                   loss before the loss's reduction; a rank
//                                   that computes one: a last pipeline stage)
//   LLMC_TEST_STALL_RANK=R:K        world rank R sleeps for an hour before its
//                                   K-th collective (from 1, over every group
//                                   of size > 1): the others' watchdog must
//                                   end the job
//   LLMC_TEST_STALL_SETUP=R:K       world rank R sleeps for an hour before its
//                                   K-th start-up collective (from 1: the
//                                   setup checks' agreements, flags shared):
//                                   the others' start-up watchdog must end it
//   LLMC_TEST_CHECKPOINT_DELAY_MS=N each asynchronous checkpoint writer waits
//                                   N ms with its shard under the temporary
//                                   name, before the rename
//   LLMC_TEST_HOST_READS=1          the backend counts the calls that bring a
//                                   value to the host (downloads, waits, the
//                                   norms' sums) and each training step prints
//                                   them (tests/distributed/test_sync_free.py:
//                                   a --sync-free step reads once, at its end)
//   LLMC_TEST_CRASH=K:R:FILE        world rank R kills itself (SIGKILL) at
//                                   the start of step K (from 0) if FILE does
//                                   not exist, creating it first: a fault that
//                                   strikes once (tests/e2e/test_supervise.py:
//                                   the supervisor's restart); where FILE
//                                   cannot be created, at every attempt
//   LLMC_TEST_MATMUL_TUNE=1         the backend offers three stand-in
//                                   algorithms per product shape, timed by a
//                                   formula of the shape, the algorithm and the
//                                   rank (the products stay its own), and prints
//                                   what it timed and what it was told to take
//                                   (tests/distributed/test_matmul_tune.py: the
//                                   ranks' agreement and the choices file)
//   LLMC_TEST_SLOW_RANK=R:MS        world rank R sleeps MS ms at the start of
//                                   each step: a straggler
//                                   (tests/distributed/test_stragglers.py)
//   LLMC_TEST_FP8_LOCAL_AMAX=1      --fp8 scales each operand by this rank's
//                                   piece alone, skipping the group max, so
//                                   tests/distributed/test_fp8.py sees a
//                                   layout that would not quantise alike
//   LLMC_TEST_FP8_ALIGN=Q           the CPU backends report that their FP8
//                                   products need widths that are multiples
//                                   of Q, as cuBLASLt's (16) do, so the setup
//                                   check of those widths runs without a GPU
//                                   (tests/distributed/test_fp8.py)
//   LLMC_TEST_CPU_OTHERS=X[,Y..]    the CPUs other processes used in the
//                                   windows of the rank's thread count read
//                                   as X, then Y, .. (the last one after),
//                                   instead of /proc/stat's figure
//                                   (tests/e2e/test_cpu_threads.py: the count
//                                   follows the load down and back up)
#pragma once
#include <string>

namespace test_hooks {

// LLMC_TEST_NAN_STEP: the step poisoned (-1: none), the rank, and where.
struct NanHook {
    enum Where { grad, grad_pre, loss };
    int step = -1, rank = 0;
    Where where = grad;
    // Whether `rank` poisons `step` at `w`.
    bool at(int s, int r, Where w) const { return s == step && r == rank && w == where; }
};
const NanHook& nan_hook();
// The stalling rank and the collective it stalls before (rank -1: none).
// False with *err naming the variable when its value is malformed.
bool stall_rank(int* rank, long* at, std::string* err);
// LLMC_TEST_STALL_SETUP: the same for the world's start-up collectives
// (llmc/comm/dist.h: agreeing on setup checks, sharing strings).
bool stall_setup(int* rank, long* at, std::string* err);
// Milliseconds each checkpoint writer waits before its rename (0: none).
int checkpoint_delay_ms();
// Whether the backend counts its host reads (LLMC_TEST_HOST_READS=1).
bool host_reads();
// Whether world rank `rank` is to die at the start of `step`
// (LLMC_TEST_CRASH); creates the variable's FILE when it says yes.
bool crash_now(int step, int rank);
// Whether the backend offers stand-in matmul algorithms (LLMC_TEST_MATMUL_TUNE=1).
bool matmul_tune();
// The milliseconds world rank `rank` sleeps at the start of each step
// (LLMC_TEST_SLOW_RANK=R:MS; 0: none).
int slow_rank_ms(int rank);
// Whether --fp8 skips the amax's group max (LLMC_TEST_FP8_LOCAL_AMAX=1).
bool fp8_local_amax();
// Whether --fp8 gives a Mixtral expert one amax over all its rows on this
// rank instead of one per micro-batch's block (LLMC_TEST_FP8_EXPERT_WHOLE=1).
bool fp8_expert_whole();
// The multiple the CPU backends' FP8 products claim to need (LLMC_TEST_FP8_ALIGN; 1: none).
int fp8_align();
// The other processes' CPUs to take instead of the measured ones in
// window `window` (from 0) of llmc/run/cpu_threads.h (LLMC_TEST_CPU_OTHERS; < 0: none).
double cpu_others(int window);

}  // namespace test_hooks
