#!/usr/bin/python3
# tests/distributed/test_moe.py: Mixtral models (arch=mixtral: Llama with a
# sparse mixture of experts for every MLP, docs/moe.md) under the parallel
# layouts on the CPU under mpirun, against one process. (One process against
# transformers' MixtralForCausalLM is test_gpt on the states that
# tests/reference/reference_hf.py writes.)
#   - parameters: the count the trainer prints, whole and per tensor-parallel
#     rank, against the formula (router E x C, E experts of 3·C·F; w1 and w3
#     split by rows and w2 by columns under tp, the router replicated);
#   - equivalence in fp64, with the load-balancing loss in the objective:
#     dp 2 with ZeRO 0, 1, 2 and 3 against one process with the same
#     micro-batches (the loss is per micro-batch, as transformers computes it
#     per forward call), tp 2, tp + sp (with recompute modes), cp 2 (ring
#     and all-to-all: the micro-batch's routing statistics summed over the cp
#     group), tp x cp, pp 2 (1F1B and interleaved, with tp + sp, cp or
#     ZeRO-3; the routing statistics summed over the stages by a
#     forward-only pass) and pp with aux=0: 10 steps of `loss` and
#     `aux_loss` (metrics.jsonl) and the final weights equal one process
#     (rel err <= 1e-10); tp + sp and cp in fp32 (<= 1e-5);
#   - the aux loss matters: a run with aux=0 trains to other weights, and
#     its aux_loss is still reported;
#   - checkpoints (the architecture in the index): saved at tp=2, resumed in
#     one process and at cp=2, with the uninterrupted run's losses;
#   - expert parallelism (--ep) in fp64 against one process: ep 2 with
#     ZeRO 0-3, x tp 2 + sp, x cp 2 (ring; a2a with ZeRO-1), full recompute;
#     dp 4 as ep 2 x expert-data 2 (ZeRO 0, 1, 3) and ep 4 (ZeRO 0, 2); ep 2
#     x pp 2 (1F1B; interleaved with ZeRO-1); ep 2 in fp32;
#   - the all-to-all's bytes against the formula with every token routed to
#     every expert (K = E: N·K·(ep-1)/ep rows leave a rank per block, four
#     times a step), the counts' all-gather, the experts' all-reduce over
#     the expert-data group;
#   - checkpoints: saved at ep 2 (ZeRO-1) and resumed whole and at ep 4;
#     saved whole and resumed at ep 2 with ZeRO-3;
#   - --moe-balance bias (DeepSeek-V3's routing bias, no loss): fp64 layouts
#     against one process (dp 2, ep 2 with ZeRO-1, ep 2 x tp 2 + sp, cp 2,
#     ep 2 x pp 2: the loads summed over the whole batch, so the biases
#     agree); rate 0 is the unbalanced run (aux=0) exactly; a rate lowers
#     the loads' imbalance (metrics' moe_maxvio) and changes the weights;
#     the bias is in the checkpoint (resumed whole and at ep 2);
#   - errors: tp not dividing the experts' width F, K > E,
#     E without arch=mixtral, --ep not dividing
#     E or dp, --ep with a dense model, --ep 0, --moe-balance bias with a
#     dense model, an unknown --moe-balance, a negative --moe-bias-rate:
#     one line naming the flag, every rank exits (and --generate over the
#     KV cache runs; tests/reference/test_generate.py checks its ids).
# Last line: "N passed, N failed".
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "lib"))
from testlib import (Checks, equivalence, metrics, read_checkpoint, refusals, rel, resume_check, run_suite, train,
                     write_shard)

L, C, NH, NKV, F, E, K, V = 2, 48, 4, 2, 40, 4, 2, 97
MIX = f"arch=mixtral,L={L},C={C},NH={NH},NKV={NKV},F={F},E={E},K={K},V={V},T=64,aux=0.05"
MIX0 = MIX.replace("aux=0.05", "aux=0")
TOP1 = f"arch=mixtral,L={L},C={C},NH={NH},NKV={NKV},F={F},E=3,K=1,V={V},T=64,tied=1,aux=0.1"
check = Checks()
DATA = None


def base(dtype, model, steps=10):
    return ["-e", model, "-i", DATA, "-j", "", "-t", "16", "-x", str(steps), "-s", "0", "-v", "0", "--dtype", dtype,
            "-c", "0.1", "-l", "3e-3", "-u", "3", "-q", "0.2", "--grad-clip", "0.5"]


def mixtral_params(tp, tied=False):
    hs = C // NH
    block = C + C * (NH + 2 * NKV) * hs // tp + (NH * hs // tp) * C + C + E * C + E * 3 * C * F // tp
    vocab = -(-V // tp) * C
    return vocab * (1 if tied else 2) + L * block + C


PARAMS = re.compile(r"(\d+) parameters \((\d+) on this rank")


def test_params():
    for np_, extra, tp in ((0, [], 1), (2, ["--tp", "2"], 2)):
        rc, out, err = train(np_, base("fp32", MIX, 1) + ["-b", "2"] + extra)
        m = PARAMS.search(out)
        if not check(rc == 0 and m, f"params tp={tp}: {err[-300:]}"):
            continue
        whole, here = int(m.group(1)), int(m.group(2))
        print(f"  params tp={tp}: {whole} whole (formula {mixtral_params(1)}), {here} on rank 0 "
              f"(formula {mixtral_params(tp)})")
        check(whole == mixtral_params(1) and here == mixtral_params(tp), f"params tp={tp}: {whole}, {here}")
        check(re.search(r"aux [0-9.]+ \|", out) is not None, f"tp={tp}: the step line reports aux")


def test_equivalence(tmp):
    keys = ("loss", "aux_loss")
    args = base("fp64", MIX) + ["-d", "128"]  # 128 tokens per step: 8 rows of 16
    # Micro-batches of 4 rows: one process accumulates two, dp 2 runs one each.
    equivalence(check, tmp, "fp64", args, ["-b", "4"],
                [(2, ["-b", "4"]), (2, ["-b", "4", "-z", "1"]), (2, ["-b", "4", "-z", "2"]),
                 (2, ["-b", "4", "-z", "3"])], keys=keys)
    # Micro-batches of 8 rows, split by heads and the experts' widths, or by
    # the sequence; recompute modes.
    equivalence(check, tmp, "fp64", args, ["-b", "8"],
                [(2, ["-b", "8", "--tp", "2"]), (2, ["-b", "8", "--tp", "2", "--sp", "1"]),
                 (2, ["-b", "8", "--tp", "2", "--sp", "1", "-r", "full"]), (2, ["-b", "8", "--cp", "2"]),
                 (2, ["-b", "8", "--cp", "2", "--cp-impl", "a2a"]), (4, ["-b", "8", "--tp", "2", "--cp", "2"]),
                 (0, ["-b", "8", "-r", "gelu"]), (0, ["-b", "8", "-r", "full"])], keys=keys)
    # fp32 (<= 1e-5; the CPU is deterministic, so a near-tie in a top-k would fail every run, not some).
    equivalence(check, tmp, "fp32", base("fp32", MIX) + ["-d", "128"], ["-b", "8"],
                [(2, ["-b", "8", "--tp", "2", "--sp", "1"]), (2, ["-b", "8", "--cp", "2"])], keys=keys)
    # Top-1 routing, tied head, a larger coefficient.
    equivalence(check, tmp, "fp64", base("fp64", TOP1) + ["-d", "128"], ["-b", "8"],
                [(2, ["-b", "8", "--tp", "2", "--sp", "1"]), (2, ["-b", "8", "--cp", "2"])], keys=keys)
    # Pipeline stages (1F1B, interleaved: 4 layers), with the load-balancing
    # loss (the stages' routing statistics from a forward-only pass) and without.
    equivalence(check, tmp, "fp64", base("fp64", MIX.replace("L=2", "L=4")) + ["-d", "128"], ["-b", "2"],
                [(2, ["-b", "2", "--pp", "2"]), (2, ["-b", "2", "--pp", "2", "--vpp", "2"]),
                 (4, ["-b", "2", "--pp", "2", "--tp", "2", "--sp", "1"]), (4, ["-b", "2", "--pp", "2", "--cp", "2"]),
                 (4, ["-b", "2", "--pp", "2", "-z", "3"])], keys=keys)
    equivalence(check, tmp, "fp64", base("fp64", MIX0.replace("L=2", "L=4")) + ["-d", "128"], ["-b", "2"],
                [(2, ["-b", "2", "--pp", "2"])])


def test_expert_parallel(tmp):
    keys = ("loss", "aux_loss")
    args = base("fp64", MIX) + ["-d", "128"]
    # ep 2 alone (the experts split over the two dp ranks; no expert-data
    # group) with ZeRO 0-3, one micro-batch of 4 rows on each.
    equivalence(check, tmp, "fp64", args, ["-b", "4"],
                [(2, ["-b", "4", "--ep", "2"]), (2, ["-b", "4", "--ep", "2", "-z", "1"]),
                 (2, ["-b", "4", "--ep", "2", "-z", "2"]), (2, ["-b", "4", "--ep", "2", "-z", "3"]),
                 (4, ["-b", "4", "--ep", "2", "--tp", "2", "--sp", "1"]), (4, ["-b", "4", "--ep", "2", "--cp", "2"]),
                 (4, ["-b", "4", "--ep", "2", "--cp", "2", "--cp-impl", "a2a", "-z", "1"]),
                 (2, ["-b", "4", "--ep", "2", "-r", "full"])], keys=keys)
    # dp 4: ep 2 x expert-data 2 (ZeRO-1 and -3 shard the experts over it), ep 4.
    equivalence(check, tmp, "fp64", args, ["-b", "2"],
                [(4, ["-b", "2", "--ep", "2", "-z", "1"]), (4, ["-b", "2", "--ep", "2", "-z", "3"]),
                 (4, ["-b", "2", "--ep", "2"]), (4, ["-b", "2", "--ep", "4"]), (4, ["-b", "2", "--ep", "4", "-z", "2"])],
                keys=keys)
    # Pipeline stages: each stage's dp ranks exchange its layers' rows.
    equivalence(check, tmp, "fp64", base("fp64", MIX.replace("L=2", "L=4")) + ["-d", "128"], ["-b", "2"],
                [(4, ["-b", "2", "--ep", "2", "--pp", "2"]), (4, ["-b", "2", "--ep", "2", "--pp", "2", "--vpp", "2",
                                                              "-z", "1"])], keys=keys)
    equivalence(check, tmp, "fp32", base("fp32", MIX) + ["-d", "128"], ["-b", "4"],
                [(2, ["-b", "4", "--ep", "2"])], keys=keys)


def test_ep_traffic(tmp):
    """Every token to every expert (K = E): the rows that leave a rank are
    exactly N·K·(ep-1)/ep per block, four times a step (forward out and back,
    backward out and back); the counts are E ints per block and forward; the
    experts' gradients are all-reduced over the expert-data group alone."""
    Ek = 4
    model = MIX.replace("K=2", f"K={Ek}")
    for np_, ep, B in ((2, 2, 4), (4, 2, 2), (4, 4, 2)):
        d = os.path.join(tmp, f"traffic_ep{ep}_np{np_}")
        rc, out, err = train(np_, base("fp64", model, 2) + ["-b", str(B), "-d", "128", "--ep", str(ep), "-o", d])
        if not check(rc == 0, f"traffic ep={ep}: {err[-300:]}"):
            continue
        comm = metrics(d)[-1].get("comm", {})
        N = B * 16
        rows = L * 4 * N * Ek * (ep - 1) // ep
        want = {"ep_send-recv": rows * C * 8, "ep_all-gather": L * (ep - 1) * E * 4}  # E int32 counts
        edp = np_ // ep
        expert_elems = L * (E // ep) * 3 * C * F  # a block's local experts (a multiple of 2: no padding)
        if edp > 1:
            want["edp_all-reduce"] = 2 * (edp - 1) * expert_elems * 8 // edp
        for k, w in want.items():
            got = comm.get(k, {}).get("bytes", 0)
            check(got == w, f"traffic ep={ep} np={np_}: {k} {got} bytes, formula {w}")
        dense = comm.get("dp_all-reduce", {}).get("bytes", 0)
        print(f"  ep={ep} np={np_}: ep_send-recv {comm.get('ep_send-recv', {}).get('bytes', 0)} B "
              f"(formula {want['ep_send-recv']}), dp_all-reduce {dense} B, edp {want.get('edp_all-reduce', 0)} B")


def test_bias(tmp):
    """--moe-balance bias (DeepSeek-V3): the routing bias in place of the loss."""
    bias = ["--moe-balance", "bias", "--moe-bias-rate", "0.02"]
    keys = ("loss", "moe_maxvio")
    # Every layout sums the step's loads over the whole batch, so the biases,
    # the routing and the weights stay those of one process.
    equivalence(check, tmp, "fp64", base("fp64", MIX) + ["-d", "128"] + bias, ["-b", "4"],
                [(2, ["-b", "4"]), (2, ["-b", "4", "--ep", "2", "-z", "1"]), (4, ["-b", "4", "--ep", "2", "--tp", "2",
                                                                               "--sp", "1"]),
                 (2, ["-b", "4", "--cp", "2"])], keys=keys)
    equivalence(check, tmp, "fp64", base("fp64", MIX.replace("L=2", "L=4")) + ["-d", "128"] + bias, ["-b", "2"],
                [(4, ["-b", "2", "--pp", "2", "--ep", "2"])], keys=keys)
    # Rate 0 is the run without any balancing (aux=0): the same losses; a
    # rate balances the experts' loads (the mean imbalance of the last 20 of
    # 60 steps, at a learning rate that lets the routing drift, well below
    # the unbalanced run's) and so trains to other weights.
    runs = {}
    for name, model, extra in (("none", MIX0, []), ("rate0", MIX, ["--moe-balance", "bias", "--moe-bias-rate", "0"]),
                               ("bias", MIX0, ["--moe-balance", "bias", "--moe-bias-rate", "0.01"])):
        d = os.path.join(tmp, "bias_" + name)
        args = base("fp64", model, 60) + ["-b", "8", "-d", "128", "-l", "1e-2", "-c", "0", "--grad-clip", "1",
                                          "-n", "60", "-o", d] + extra
        rc, out, err = train(0, args)
        if not check(rc == 0, f"bias {name}: {err[-300:]}"):
            return
        runs[name] = (metrics(d), read_checkpoint(d, 60)[0])
    (mn, wn), (m0, w0), (mb, wb) = runs["none"], runs["rate0"], runs["bias"]
    check([x["loss"] for x in mn] == [x["loss"] for x in m0],
          "--moe-bias-rate 0 trains as no balancing at all (aux=0): the same losses")
    late = lambda m: sum(x["moe_maxvio"] for x in m[-20:]) / 20  # noqa: E731
    print(f"  expert imbalance (max/mean - 1) over steps 41-60: {late(mn):.3f} unbalanced, "
          f"{late(mb):.3f} with the bias")
    check(late(mb) < 0.85 * late(mn), f"the bias balances the loads: {late(mb):.3f} against {late(mn):.3f}")
    check(rel(wb, wn) > 1e-6, f"the bias trains to other weights: rel difference {rel(wb, wn):.2e}")
    # The bias is in the checkpoint: a resumed run (whole, or at ep 2)
    # continues the uninterrupted one's losses.
    resume_check(check, os.path.join(tmp, "bias_resume"), base("fp64", MIX) + ["-d", "128"] + bias, ["-b", "4"],
                 (0, ["-b", "4"]), ((0, ["-b", "4"]), (2, ["-b", "4", "--ep", "2"])))


def test_checkpoints(tmp):
    resume_check(check, tmp, base("fp64", MIX) + ["-d", "128"], ["-b", "8"], (2, ["-b", "8", "--tp", "2"]),
                 ((0, ["-b", "8"]), (2, ["-b", "8", "--cp", "2"])))
    # Saved with the experts split (ep 2, the expert slices under ZeRO-1),
    # resumed whole, and the other way round.
    resume_check(check, os.path.join(tmp, "ep_saved"), base("fp64", MIX) + ["-d", "256"], ["-b", "4"],
                 (2, ["-b", "4", "--ep", "2", "-z", "1"]), ((0, ["-b", "4"]), (4, ["-b", "4", "--ep", "4"])))
    resume_check(check, os.path.join(tmp, "ep_resumed"), base("fp64", MIX) + ["-d", "128"], ["-b", "4"],
                 (0, ["-b", "4"]), ((2, ["-b", "4", "--ep", "2", "-z", "3"]),))


def test_aux_matters(tmp):
    runs = {}
    for name, model in (("aux", MIX), ("noaux", MIX0)):
        d = os.path.join(tmp, "matters_" + name)
        rc, out, err = train(0, base("fp64", model) + ["-b", "8", "-d", "128", "-n", "10", "-o", d])
        if not check(rc == 0, f"{name}: {err[-300:]}"):
            return
        runs[name] = (metrics(d), read_checkpoint(d, 10)[0])
    (ma, wa), (m0, w0) = runs["aux"], runs["noaux"]
    check(ma[0]["loss"] == m0[0]["loss"] and ma[0]["aux_loss"] == m0[0]["aux_loss"] > 0,
          f"step 1: the same cross-entropy and aux_loss with and without the coefficient "
          f"({ma[0]['aux_loss']}, {m0[0]['aux_loss']})")
    d = rel(wa, w0)
    check(d > 1e-6, f"aux=0.05 trains to other weights than aux=0: rel difference {d:.2e}")


def test_errors(tmp):
    cases = ((4, MIX.replace("F=40", "F=42").replace("NKV=2", "NKV=4"), ["--tp", "4"], "--tp"),  # F=42 over 4
             (1, MIX.replace("K=2", "K=5"), [], "-e"),
             (1, MIX.replace("arch=mixtral", "arch=llama"), [], "-e"),
             (1, MIX, ["--prompt-ids", "1,2,3", "--max-new-tokens", "2"], None),  # the KV cache runs the MoE block
             # --ep: E=4 not divisible by 3; 3 not dividing dp=2; a dense
             # model. (The line names the flag and says which check refused.)
             (3, MIX, ["--ep", "3"], "--ep: 3 does not divide the 4 experts"),
             (2, MIX, ["--ep", "3"], "--ep: 3 does not divide the 2 data-parallel ranks"),
             (4, MIX, ["--ep", "4", "--tp", "2"], "--ep: 4 does not divide the 2 data-parallel ranks"),
             (2, MIX.replace("arch=mixtral", "arch=llama").replace(f",E={E},K={K}", "").replace(",aux=0.05", ""),
              ["--ep", "2"], "--ep: expert parallelism needs a mixture-of-experts model"),
             (1, MIX, ["--ep", "0"], "--ep"),
             (2, MIX, ["--ep", "2", "-b", "2"], None),
             # --moe-balance: a dense model, an unknown mode, a negative rate.
             (1, MIX.replace("arch=mixtral", "arch=llama").replace(f",E={E},K={K}", "").replace(",aux=0.05", ""),
              ["--moe-balance", "bias"], "--moe-balance"),
             (1, MIX, ["--moe-balance", "loss-free"], "--moe-balance"),
             (1, MIX, ["--moe-balance", "bias", "--moe-bias-rate", "-1"], "--moe-bias-rate"),
             (1, MIX, ["--ep", "1"], None))
    refusals(check, cases, lambda model: base("fp32", model, 2) + ["-b", "4", "-d", "64"])


def suite(tmp):
    global DATA
    DATA = os.path.join(tmp, "data.bin")
    write_shard(DATA, np.random.default_rng(7).integers(0, V, 40000))
    test_params()
    test_equivalence(tmp)
    test_expert_parallel(tmp)
    test_ep_traffic(tmp)
    test_bias(tmp)
    test_aux_matters(tmp)
    test_checkpoints(tmp)
    test_errors(tmp)


def main():
    run_suite(check, "llmc_moe_", suite)


if __name__ == "__main__":
    main()
