# scripts/gpu/torch_attention.py: the bar for our attention kernels on the same
# GPU: PyTorch's scaled_dot_product_attention with the flash backend and with
# the cuDNN backend, causal, bf16, forward and backward, at the d12 shape
# (B=32, 12 heads of 64, T=1024) and at heads of 128 (B=8, 16 heads, T=4096).
# Prints milliseconds and TFLOP/s (median of 20 after 3 warm-ups, CUDA events),
# and each TFLOP/s as "figure torch_sdpa_BACKEND_{fwd,bwd}_hsD_tT_tflops V TFLOP/s"
# (scripts/gpu/check.sh's lab step divides the lab's by them).
# FLOPs: forward 4·B·H·T²·D / 2 (causal), backward 2.5 times the forward.
#   usage (GPU machine, PyTorch with CUDA): python3 scripts/gpu/torch_attention.py
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def bench(fn, n=20):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(n):
        s.record()
        fn()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    print(torch.cuda.get_device_name(), torch.__version__)
    for (B, H, T, D) in [(32, 12, 1024, 64), (8, 16, 4096, 128)]:
        q, k, v = [torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
        fl = 4 * B * H * T * T * D / 2
        for name, bk in [("flash", SDPBackend.FLASH_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]:
            with sdpa_kernel(bk):
                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                tf = bench(f)
                g = torch.randn_like(f())
                # backward = (forward + backward) - forward
                tb = bench(lambda: torch.autograd.grad(F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                                       (q, k, v), g)) - tf
                print(f"B={B} H={H} T={T} D={D} causal {name}: fwd {tf:.3f} ms {fl / tf / 1e9:.0f} TFLOP/s  "
                      f"bwd {tb:.3f} ms {2.5 * fl / tb / 1e9:.0f} TFLOP/s")
                print(f"figure torch_sdpa_{name}_fwd_hs{D}_t{T}_tflops {fl / tf / 1e9:.1f} TFLOP/s")
                print(f"figure torch_sdpa_{name}_bwd_hs{D}_t{T}_tflops {2.5 * fl / tb / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
