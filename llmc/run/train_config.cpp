// llmc/run/train_config.cpp: the option table of train_gpt.
#include "llmc/run/train_config.h"

#include <cstring>

void add_train_options(ArgParser& p, TrainConfig& c) {
    using O = Option;
    p.add({'i', "train-data", O::String, &c.train_data, "training shards (path or glob)"});
    p.add({'j', "val-data", O::String, &c.val_data, "validation shards (path or glob; \"\" for none)"});
    p.add({0, "tokenizer", O::String, &c.tokenizer, "tokenizer for samples: llm.c file or tokenizer.json (default: an HF -e DIR's tokenizer.json, else the tokenizer.json or tokenizer.bin beside the -i shards, else byte-level; \"\": byte-level)"});
    p.add({'e', "model", O::String, &c.model, "model: dN descriptor (d12), sizes L=,C=,NH=,V=,T=[,Vp=] (arch=llama,..,NKV=,F=[,theta=,eps=,tied=1]; arch=qwen2, the same; arch=mixtral,..,E=,K=[,aux=]), a model file, or a Hugging Face directory"});
    p.add({'o', "output-dir", O::String, &c.output_dir, "output directory: metrics.jsonl and checkpoints"});
    p.add({'b', "batch-size", O::Int, &c.B, "micro-batch size (rows per forward)", 1, 1 << 20});
    p.add({'t', "seq-len", O::Int, &c.T, "sequence length T (0: the model's context, at most 4096)", 0, 1 << 20});
    p.add({'d', "total-batch", O::Long, &c.total_batch, "tokens per optimizer step (-1: B*T*dp, one micro-batch on each data-parallel rank)", -1, 1e15});
    p.add({'x', "max-steps", O::Int, &c.max_steps, "optimizer steps (-1: one epoch of the training data; 0 with --export-hf or --export-model: write -e's weights, untrained)", -1, 1e9});
    p.add({'l', "lr", O::Double, &c.lr, "peak learning rate", 0, 10});
    p.add({'u', "warmup", O::Int, &c.warmup, "linear warmup steps", 0, 1e9});
    p.add({'q', "final-lr-frac", O::Double, &c.final_lr_frac, "final lr as a fraction of lr (cosine decay; 1 = constant)", 0, 1});
    p.add({'c', "weight-decay", O::Double, &c.weight_decay, "AdamW weight decay (2-D tensors only)", 0, 10});
    p.add({0, "grad-clip", O::Double, &c.grad_clip, "clip the global gradient norm to this (0: off)", 0, 1e9});
    p.add({0, "skip-spikes", O::Double, &c.skip_spikes,
           "skip the update of a step whose loss is above this x the running mean of the last ones (0: off)", 0, 1e9});
    p.add({0, "max-skips", O::Int, &c.max_skips,
           "end the run when more steps than this were skipped (non-finite loss or norm, or a spike)", 0, 1e9});
    p.add({0, "sync-free", O::Int, &c.sync_free,
           "1: the step's loss, gradient norm, clipping and skip decision stay on the device, read by the host one "
           "step late (no host synchronisation inside the step)", 0, 1, {}, "1"});
    p.add({0, "fp8", O::Int, &c.fp8,
           "1: the four linear layers of every block multiply FP8 operands (e4m3 inputs and weights, e5m2 output "
           "gradients, per-tensor current scaling; docs/fp8.md)", 0, 1, {}, "1"});
    p.add({0, "fp8-history", O::Int, &c.fp8_history,
           "with --fp8 1: delayed scaling, each operand scaled by the largest amax of its last N steps (0: current "
           "scaling, its own amax)", 0, 1024});
    p.add({0, "fp8-weight-copies", O::Int, &c.fp8_weight_copies,
           "with --fp8 1: 1 keeps the four layers' weights as FP8 copies made by a step's first micro-batch for its "
           "others (2 bytes per weight; not under ZeRO-3); 0 quantises each weight in every product", 0, 1});
    p.add({0, "fp8-layers", O::String, &c.fp8_layers,
           "with --fp8 1: which of each block's linear layers multiply FP8 operands, a list of qkv, attproj, fc "
           "and fcproj (a Mixtral's experts: fc and fcproj), or all; the others stay in the compute type "
           "(--plan eval says which pay)"});
    p.add({0, "matmul-tune", O::Int, &c.matmul_tune,
           "1: after the first step, time several algorithms for each matrix product and keep the fastest, the "
           "same on every rank (kept in -o's matmul_tuning.txt for the next run)", 0, 1, {}, "1"});
    p.add({0, "beta1", O::Double, &c.beta1, "AdamW beta1", 0, 0.999999});
    p.add({0, "beta2", O::Double, &c.beta2, "AdamW beta2", 0, 0.999999});
    p.add({0, "eps", O::Double, &c.eps, "AdamW epsilon", 0, 1});
    p.add({0, "optimizer-dtype", O::String, &c.optimizer_dtype,
           "type of AdamW's m and v (auto: fp32, fp64 in an fp64 run; bf16: half the optimizer's memory, the "
           "update still in fp32)", 0, 0, {"auto", "fp32", "bf16"}});
    p.add({0, "optimizer-rounding", O::String, &c.optimizer_rounding,
           "how bf16 m and v are rounded when stored: nearest (even), or stochastic (unbiased; random bits from "
           "--seed, the step and the value)", 0, 0, {"nearest", "stochastic"}});
    p.add({'v', "val-every", O::Int, &c.val_every, "validation loss every N steps (0: never)", 0, 1e9});
    p.add({'m', "val-steps", O::Int, &c.val_steps, "micro-batches of B rows per validation, as llm.c (0: --val-tokens decides)", 0, 1e9});
    p.add({0, "val-tokens", O::Long, &c.val_tokens, "tokens per validation, the same for every -b and layout (rounded up to whole rows)", 1, 1e15});
    p.add({'s', "sample-every", O::Int, &c.sample_every, "print a text sample every N steps (0: never)", 0, 1e9});
    p.add({0, "log-every", O::Int, &c.log_every, "print the step line every N steps (and the first and last; metrics.jsonl has every step)", 1, 1e9});
    p.add({'g', "gen-tokens", O::Int, &c.gen_tokens, "tokens per sample", 1, 1e6});
    p.add({'n', "checkpoint-every", O::Int, &c.checkpoint_every, "sharded checkpoint every N steps into -o (0: never)", 0, 1e9});
    p.add({0, "keep-checkpoints", O::Int, &c.keep_checkpoints, "keep only the newest K complete checkpoints (0: all)",
           0, 1e9});
    p.add({0, "async-checkpoint", O::Int, &c.async_checkpoint,
           "1: checkpoints copy their shard to host memory and are written by a background thread while training "
           "goes on", 0, 1, {}, "1"});
    p.add({0, "export-model", O::String, &c.export_model, "also write the final weights to this llm.c model file"});
    p.add({0, "export-hf", O::String, &c.export_hf,
           "also write the final weights as a Hugging Face directory (config.json, model.safetensors, tokenizer and generation files)"});
    p.add({0, "config", O::String, &c.config,
           "JSON file of flags by long name ({\"lr\": 3e-4, \"model\": \"d12\"}); flags on the command line override it"});
    p.add({0, "convert", O::String, &c.convert,
           "no training: load this checkpoint (a run's -o directory: its latest, or its final model_SSSSSSSS.bin when it has none; its ckpt_SSSSSSSS; or an llm.c model file) and write --export-hf / --export-model"});
    p.add({0, "export-dtype", O::String, &c.export_dtype,
           "type of the Hugging Face export's weights (auto: the run's parameters)", 0, 0, {"auto", "fp32", "bf16", "fp64"}});
    p.add({'y', "resume", O::Int, &c.resume,
           "1: resume from the newest checkpoint in -o that passes its check (an older one if the newest is damaged)",
           0, 1, {}, "1"});
    p.add({0, "resume-from", O::String, &c.resume_from,
           "resume from this complete checkpoint of -o (ckpt_SSSSSSSS, or its step S) instead of the newest"});
    p.add({'z', "zero", O::Int, &c.zero, "ZeRO stage over the data-parallel ranks", 0, 3});
    p.add({0, "tp", O::Int, &c.tp, "tensor-parallel degree (Megatron; divides heads and world)", 1, 1 << 16});
    p.add({0, "sp", O::Int, &c.sp, "1: sequence parallel on top of tensor parallel (needs --tp > 1)", 0, 1, {}, "1"});
    p.add({0, "cp", O::Int, &c.cp, "context-parallel degree (ring attention; 2*cp divides T)", 1, 1 << 16});
    p.add({0, "cp-impl", O::String, &c.cp_impl,
           "context parallel by ring attention (K,V blocks travel), a2a (all-to-all to head shards and back; cp "
           "divides the heads), or hybrid (all-to-all in groups of --cp-a2a ranks, the ring across the groups)", 0, 0,
           {"ring", "a2a", "hybrid"}});
    p.add({0, "cp-a2a", O::Int, &c.cp_a2a,
           "--cp-impl hybrid: ranks N per all-to-all group (1 < N < cp; N divides cp and each tp rank's heads)", 0,
           1 << 16});
    p.add({0, "ep", O::Int, &c.ep,
           "expert-parallel degree (Mixtral: E/ep experts per rank, over ep of the dp ranks; divides E and dp)", 1,
           1 << 16});
    p.add({0, "moe-balance", O::String, &c.moe_balance,
           "Mixtral's expert balancing: aux (the load-balancing loss, coefficient aux=) or bias (DeepSeek-V3: a "
           "per-expert bias on the routing scores for the choice only, moved each step toward even loads; no loss)",
           0, 0, {"aux", "bias"}});
    p.add({0, "moe-bias-rate", O::Double, &c.moe_bias_rate,
           "--moe-balance bias: each step every expert's bias moves by this toward even loads (sign of the load "
           "error)",
           0, 1e3});
    p.add({0, "pp", O::Int, &c.pp, "pipeline stages (1F1B; L and -d micro-batches must fit)", 1, 1 << 16});
    p.add({0, "vpp", O::Int, &c.vpp, "model chunks per pipeline stage (interleaved 1F1B when > 1)", 1, 1 << 16});
    p.add({0, "pp-schedule", O::String, &c.pp_schedule,
           "the pipeline's schedule: 1f1b, interleaved (with --vpp), zb-h1 (zero bubble: each backward split into "
           "its input's and its weights' gradients, the weights' filling the bubble) or zbv (zero bubble over two "
           "chunks per stage placed in a V; docs/parallelism.md); not given: 1f1b, or interleaved with --vpp",
           0, 0, {"1f1b", "interleaved", "zb-h1", "zbv"}});
    p.add({0, "trace", O::String, &c.trace, "write a Chrome trace (Perfetto) of the run to this file"});
    p.add({0, "memory-budget", O::Double, &c.memory_budget, "MiB the backend may hold per rank (0: no cap)", 0, 1e12});
    p.add({0, "comm", O::String, &c.comm, "collectives: nccl (GPU default) or mpi (host; staged on GPUs)", 0, 0,
           {"auto", "nccl", "mpi"}});
    p.add({0, "collective-timeout", O::Double, &c.collective_timeout,
           "seconds a collective may wait for its peers before every rank ends with a line naming it and the ranks "
           "that did not arrive (0: no limit)",
           0, 1e9});
    p.add({0, "straggler-every", O::Int, &c.straggler_every,
           "every N steps the ranks compare their own work per step (the step less the time spent waiting for "
           "peers) and a rank slower than the others' median by --straggler-factor is named (0: off)",
           0, 1e9});
    p.add({0, "straggler-factor", O::Double, &c.straggler_factor,
           "how much more work per step than the other ranks' median makes a rank a straggler", 1, 1e9});
    p.add({'r', "recompute", O::String, &c.recompute, "activations recomputed in backward (1 = gelu, 0 = none)", 0, 0,
           {"none", "gelu", "selective", "full", "0", "1"}, "1"});
    p.add({0, "head-chunk", O::Int, &c.head_chunk,
           "LM head + cross-entropy in chunks of at most ROWS rows, its backward fused in (0: all rows at once)", 0,
           1e9});
    p.add({0, "document-mask", O::Int, &c.document_mask,
           "1: a token attends only to the earlier tokens of its own document (documents end with --eot-token, "
           "open with --bos-token)", 0, 1, {}, "1"});
    p.add({0, "eot-token", O::Int, &c.eot_token,
           "token id that ends a document (-1: the shards' header, else the tokenizer's end of text: GPT-2's, or "
           "none where <s> opens documents)", -1, 1 << 30});
    p.add({0, "bos-token", O::Int, &c.bos_token,
           "token id that opens a document (-1: the shards' header, else the tokenizer's <s> or <|begin_of_text|>, "
           "else none)", -1, 1 << 30});
    p.add({'a', "overfit", O::Int, &c.overfit, "1: train on the first batch only (debugging)", 0, 1, {}, "1"});
    p.add({0, "plan", O::String, &c.plan, "plan instead of training: search layouts, or eval the one given", 0, 0,
           {"search", "eval"}});
    p.add({0, "world", O::Int, &c.world, "devices to plan for (0: the ranks of this launch)", 0, 1 << 24});
    p.add({0, "gpus-per-node", O::Int, &c.gpus_per_node, "devices per node to plan for (0: the profile's)", 0, 1 << 16});
    p.add({0, "hardware", O::String, &c.hardware, "hardware profile to plan for: h100-sxm, a100-sxm-80g, cpu (this machine) or FILE.json (--plan eval "
           "without it: the device a run takes here)"});
    p.add({0, "plan-json", O::String, &c.plan_json, "write every planned layout as a JSON line to this file"});
    p.add({0, "plan-attention", O::String, &c.plan_attention,
           "attention the plan's time model assumes: this trainer's, or standard (T x T scores in memory)", 0, 0,
           {"flash", "standard"}});
    p.add({0, "plan-top", O::Int, &c.plan_top, "layouts the plan prints", 1, 1e6});
    p.add({0, "calibrate", O::String, &c.calibrate, "measure this machine at -e/-b/-t and write a profile (no training)"});
    p.add({0, "generate", O::String, &c.generate,
           "generate text after this prompt from -e's model (no training; one process)"});
    p.add({0, "prompt-ids", O::String, &c.prompt_ids,
           "generate after these token ids (\"1,2,3\"): a prompt the tokenizer cannot encode"});
    p.add({0, "max-new-tokens", O::Int, &c.max_new_tokens,
           "tokens --generate adds at most (it also stops at the model's maxT)", 0, 1e9});
    p.add({0, "temperature", O::Double, &c.temperature,
           "sampling temperature of --generate (0: greedy, the most likely token)", 0, 1e6});
    p.add({0, "top-k", O::Int, &c.top_k, "--generate draws from the K most likely tokens only (0: all)", 0, 1e9});
    p.add({0, "top-p", O::Double, &c.top_p,
           "--generate draws from the fewest most likely tokens whose probability reaches P (1: all)", 0, 1});
    p.add({0, "ignore-eos", O::Int, &c.ignore_eos, "1: --generate goes on past the end-of-text token", 0, 1, {}, "1"});
    p.add({0, "kv-cache", O::Int, &c.kv_cache,
           "1: --generate keeps every layer's keys and values; 0: runs the whole sequence again per token (a check)",
           0, 1});
    p.add({0, "seed", O::Long, &c.seed, "seed of the initialisation and the sampling RNG", 0, 9.2e18});
    p.add({0, "device", O::String, &c.device, "where to run", 0, 0, {"auto", "cpu", "cuda"}});
    p.add({0, "dtype", O::String, &c.dtype, "precision (auto: fp32 on cpu, bf16 on cuda; bf16 on cpu: the GPU's mixed precision, fp32 compute)", 0, 0,
           {"auto", "fp32", "fp64", "bf16"}});
}

const char* train_examples() {
    return "\nmodels: GPT-2 (llm.c model files, GPT2LMHeadModel directories, dN or L=,C=,NH=,V=,T= sizes) and\n"
           "Llama (LlamaForCausalLM directories, arch=llama sizes), Qwen2 (Qwen2ForCausalLM directories,\n"
           "arch=qwen2 sizes) and Mixtral (MixtralForCausalLM directories, arch=mixtral sizes), randomly\n"
           "initialised or loaded.\n"
           "\nexamples:\n"
           "  ./train_gpt -o log_tiny                                  the default model on the embedded data\n"
           "  ./train_gpt -e d12 -i 'data/fineweb/train_*.bin' -j 'data/fineweb/val_*.bin' -b 8 -t 1024 -d 524288\n"
           "  ./train_gpt -e gpt2_124M.bin -x 100 -l 1e-4 -o ft        fine-tune an llm.c model file\n"
           "  ./train_gpt -e path/to/hf_llama_dir --export-hf out_hf   load and export a Hugging Face directory\n"
           "  mpirun -np 4 ./train_gpt -z 1 -o log_dp4                 data parallel, ZeRO-1, 4 ranks\n"
           "  mpirun -np 4 ./train_gpt --tp 2 --sp 1 -z 1              tensor + sequence parallel x 2 data-parallel ranks\n"
           "  mpirun -np 4 ./train_gpt --pp 2 --tp 2 -d 8192           pipeline x tensor parallel\n"
           "  ./train_gpt --plan search -e d12 --world 64 -t 1024      choose a layout for 64 GPUs\n"
           "  ./train_gpt -e path/to/hf_dir --generate 'Hello' --temperature 0 --max-new-tokens 20\n"
           "                                                           greedy text from a model\n";
}

bool training_flag(const char* name) {
    static const char* const other_modes[] = {
        "plan",       "world",       "gpus-per-node", "hardware", "plan-json",  "plan-attention",
        "plan-top",   "calibrate",   "convert",       "generate", "prompt-ids", "max-new-tokens",
        "temperature", "top-k",      "top-p",         "ignore-eos", "kv-cache", "config"};
    for (const char* n : other_modes)
        if (std::strcmp(n, name) == 0) return false;
    return true;
}

bool layout_from_flags(const TrainConfig& cfg, int world, Layout* lp, std::string* err) {
    Layout& l = *lp;
    l = Layout();
    l.world = world;
    l.pp = cfg.pp;
    l.vpp = cfg.vpp;
    l.tp = cfg.tp;
    l.cp = cfg.cp;
    l.ep = cfg.ep;
    l.sp = cfg.sp;
    l.zero = cfg.zero;
    l.B = cfg.B;
    l.T = cfg.T;
    l.total_batch = cfg.total_batch;
    l.head_chunk = cfg.head_chunk;
    l.bf16_optimizer = cfg.optimizer_dtype == "bf16";
    l.fp8 = cfg.fp8 != 0;
    l.fp8_history = cfg.fp8_history;
    l.fp8_weight_copies = cfg.fp8_weight_copies != 0;
    if (!linear_layers_from_names(cfg.fp8_layers, &l.fp8_layers, err)) {
        *err = "flag --fp8-layers: " + *err;
        return false;
    }
    if (!pipe_order_of(cfg.pp_schedule, cfg.vpp, &l.pp_order, err)) return false;
    l.vpp = pipe_chunks_per_stage(l.pp_order, cfg.vpp);  // (zbv: two, in a V)
    if (cfg.fp8_history > 0 && !cfg.fp8) {
        *err = "flag --fp8-history: delayed scaling is for FP8 products (add --fp8 1)";
        return false;
    }
    if (cfg.fp8_weight_copies == 0 && !cfg.fp8) {
        *err = "flag --fp8-weight-copies: the weights' FP8 copies are for FP8 products (add --fp8 1)";
        return false;
    }
    if (l.fp8_layers != kLinearLayersAll && !cfg.fp8) {
        *err = "flag --fp8-layers: it picks the layers of the FP8 products (add --fp8 1)";
        return false;
    }
    if (cfg.optimizer_rounding == "stochastic" && !l.bf16_optimizer) {
        *err = "flag --optimizer-rounding: stochastic rounding is for bf16 moments (add --optimizer-dtype bf16)";
        return false;
    }
    if (!parse_recompute(cfg.recompute, &l.recompute)) {
        *err = "flag -r: " + cfg.recompute + ": expected none, gelu, selective or full";
        return false;
    }
    return cp_a2a_of(cfg.cp_impl, cfg.cp, cfg.cp_a2a, &l.cp_a2a, err) && check_world(l, err);
}
