// llmc/run/train_config.h: every setting of train_gpt, and the one option table
// that the parser, --help and the startup table are generated from. Letters
// follow llm.c where llm.c has them; every option also has a long name.
#pragma once
#include <string>

#include "llmc/base/args.h"
#include "llmc/parallel/layout.h"

// The sequence length of a run that gives no -t: the model's context, at
// most this (Llama 2's; a 128k-context model would otherwise train on rows
// no CPU and few GPUs hold).
constexpr int kDefaultMaxT = 4096;

struct TrainConfig {
    // data and model
    std::string train_data = "data/tiny/tiny_train_*.bin";  // -i
    std::string val_data = "data/tiny/tiny_val_*.bin";      // -j
    std::string tokenizer = "";  // (not given: the model's, else the shards', else byte-level)
    std::string model = "L=4,C=128,NH=4,V=257,T=128";      // -e
    std::string output_dir = "";                           // -o
    // batch
    int B = 8;                 // -b micro-batch rows
    int T = 0;                 // -t sequence length (0: the model's context, at most kDefaultMaxT)
    long long total_batch = -1;  // -d tokens per step (-1: B·T)
    int max_steps = -1;        // -x (-1: one epoch of the training data)
    // optimizer
    double lr = 1e-3;          // -l
    int warmup = 20;           // -u
    double final_lr_frac = 0.1;  // -q
    double weight_decay = 0.1;   // -c
    double grad_clip = 1.0;
    double skip_spikes = 0;    // skip a step whose loss exceeds this x the running mean (0: off)
    int max_skips = 10;        // end the run after more skipped steps than this
    int sync_free = 0;         // 1: the step's loss, norm, clipping and skip stay on the device until its end
    int fp8 = 0;               // 1: the blocks' four linear layers on FP8 operands (docs/fp8.md)
    int fp8_history = 0;       // with fp8: delayed scaling over this many steps' amaxes (0: current scaling)
    int fp8_weight_copies = 1;  // with fp8: the weights' FP8 copies made once per step (0: in every product)
    std::string fp8_layers = "all";  // with fp8: which of the four linear layers (qkv, attproj, fc, fcproj)
    int matmul_tune = 0;       // 1: time the matmul algorithms after the first step, keep the fastest
    double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
    std::string optimizer_dtype = "auto";        // Adam's m and v: auto (fp32; fp64 runs fp64) or bf16
    std::string optimizer_rounding = "nearest";  // bf16 m and v: nearest or stochastic
    // evaluation, sampling, checkpoints
    int val_every = 20;        // -v
    int val_steps = 0;         // -m micro-batches per validation (0: --val-tokens decides)
    long long val_tokens = 20480;  // tokens per validation, whatever -b and the layout
    int sample_every = 20;     // -s
    int gen_tokens = 64;       // -g
    int checkpoint_every = 0;  // -n
    int resume = 0;            // -y
    std::string resume_from = "";  // a complete checkpoint of -o to resume from (ckpt_SSSSSSSS or S)
    int keep_checkpoints = 0;  // newest checkpoints kept (0: all)
    int async_checkpoint = 0;  // 1: snapshot to host, write shards in a background thread
    std::string export_model = "";  // llm.c model file written at the end
    std::string export_hf = "";     // Hugging Face directory written at the end (llmc/io/hf.h)
    std::string export_dtype = "auto";  // its weights' type (llmc/io/hf_meta.h)
    std::string convert = "";       // a checkpoint to export without training (llmc/run/startup.h)
    std::string config = "";        // a JSON file of flags (llmc/base/args.h)
    int log_every = 1;              // step lines printed every N steps
    // execution
    int zero = 0;              // -z
    int tp = 1;                // tensor-parallel degree
    int sp = 0;                // sequence parallel (with tp > 1)
    int cp = 1;                // context-parallel degree
    int ep = 1;                // expert-parallel degree (Mixtral: experts split over dp ranks)
    std::string moe_balance = "aux";  // Mixtral's balancing: the loss (aux) or DeepSeek-V3's routing bias (bias)
    double moe_bias_rate = 1e-3;      // bias: the update's step per optimizer step
    std::string cp_impl = "ring";  // ring attention, all-to-all (Ulysses), or hybrid
    int cp_a2a = 0;                // hybrid: ranks per all-to-all group (0: not given)
    int pp = 1;                // pipeline stages
    int vpp = 1;               // model chunks per pipeline stage (interleaved 1F1B when > 1)
    std::string pp_schedule;   // --pp-schedule: 1f1b, interleaved, zb-h1 ("": from vpp)
    std::string trace = "";    // Chrome trace-event JSON of the run
    std::string comm = "auto";
    double collective_timeout = 300;  // seconds a collective may wait before the job ends (0: no limit)
    int straggler_every = 100;        // steps between the stragglers checks (0: off)
    double straggler_factor = 1.5;    // work per step over the others' median that names a rank
    double memory_budget = 0;  // MiB the backend may hold (0: no cap)
    std::string recompute = "none";  // -r: none, gelu, selective, full (0 = none, 1 = gelu)
    int head_chunk = 0;        // LM head and cross-entropy in chunks of this many rows (0: all at once)
    int overfit = 0;           // -a
    int document_mask = 0;     // attention within documents only (docs/attention.md)
    int eot_token = -1;        // the token that ends a document (-1 given: the shards' header, else the tokenizer's; -1 after setup: none)
    int bos_token = -1;        // the token that opens one (-1 given: the shards' header, else <s> / <|begin_of_text|>; after setup: none)
    long long seed = 1337;
    // planning (no training): llmc/plan/planner.h, llmc/plan/calibrate.h
    std::string plan = "";          // search | eval
    int world = 0;                  // devices planned for (0: this launch's ranks)
    int gpus_per_node = 0;          // (0: the hardware profile's)
    std::string hardware = "h100-sxm";
    std::string plan_json = "";
    std::string plan_attention = "flash";
    int plan_top = 10;
    std::string calibrate = "";     // measure this machine, write a profile here
    // generation (no training): llmc/run/generate.h
    std::string generate = "";      // the prompt's text (the mode: given, or --prompt-ids)
    std::string prompt_ids = "";    // the prompt as token ids "1,2,3"
    int max_new_tokens = 64;
    double temperature = 1.0;       // 0: greedy
    int top_k = 0;                  // 0: off
    double top_p = 1.0;             // 1: off
    int ignore_eos = 0;
    int kv_cache = 1;               // 0: the whole sequence again per token (a check)
    std::string device = "auto";
    std::string dtype = "auto";
};

// Registers every option of cfg with the parser.
void add_train_options(ArgParser& p, TrainConfig& cfg);
// Whether a flag (long name) applies to training: false for those of the
// other modes (--plan and its inputs, --calibrate, --convert, --generate and
// its sampling), which the settings table and run_config.json leave out.
bool training_flag(const char* name);
// The run's layout from its flags, over a world of `world` ranks: the
// degrees, --cp-impl/--cp-a2a as Layout::cp_a2a, the batch and what each
// block keeps, checked against the world (check_world), so a run makes and
// checks it in one place; the model's checks come later (check_layout).
// False with *err naming the flag.
bool layout_from_flags(const TrainConfig& cfg, int world, Layout* l, std::string* err);
// The examples --help prints after the options: a few whole commands.
const char* train_examples();
