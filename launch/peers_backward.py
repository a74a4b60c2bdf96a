"""Backward throughput of the peers (PyTorch SDPA: FlashAttention-2 and cuDNN backends), timed as
shared/bench/peers.py times the forward: the backend chosen outside the timed region, 20 calls
enqueued back to back between two CUDA events, median of 7 such batches. One call is
torch.autograd.grad(o, (q, k, v), dO) on a graph built once (retain_graph), so only the backward
kernels run. TFLOP/s = 2.5 x the forward's 4*B*Hq*T*S*D (halved for causal), FlashAttention's
convention. GQA through enable_gqa (dK/dV summed over each group by the backend).
    python3 launch/peers_backward.py --shape 1,32,8,8192,8192,128,causal ...
"""
import argparse, sys
import torch
import torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shape", action="append", required=True)
    args = ap.parse_args()
    print("shape,peer,bwd_tflops,bwd_ms")
    for text in args.shape:
        b, hq, hkv, t, s, d, m = text.split(","); b, hq, hkv, t, s, d = map(int, (b, hq, hkv, t, s, d)); causal = m == "causal"
        fwd = 4.0 * b * hq * t * s * d / (2 if causal and t == s else 1)
        for backend, name in [(SDPBackend.FLASH_ATTENTION, "sdpa_flash"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn")]:
            try:
                q = torch.randn(b, hq, t, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                k = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                v = torch.randn(b, hkv, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                with sdpa_kernel(backend):
                    if hkv != hq and backend == SDPBackend.FLASH_ATTENTION:
                        kx = k.repeat_interleave(hq // hkv, dim=1); vx = v.repeat_interleave(hq // hkv, dim=1)
                        o = F.scaled_dot_product_attention(q, kx, vx, is_causal=causal)
                    else:
                        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=hkv != hq)
                    do = torch.randn_like(o)
                    fn = lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
                    for _ in range(5): fn()
                    torch.cuda.synchronize()
                    per = []
                    for _ in range(7):
                        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        e0.record()
                        for _ in range(20): fn()
                        e1.record(); torch.cuda.synchronize()
                        per.append(e0.elapsed_time(e1) / 20)
                ms = sorted(per)[3]
                print(f"{text},{name},{2.5 * fwd / ms / 1e9:.1f},{ms:.3f}", flush=True)
            except Exception as e:
                print(f"{text},{name},unsupported: {type(e).__name__}: {str(e)[:80]},", flush=True)
            torch.cuda.empty_cache()

if __name__ == "__main__":
    sys.exit(main())
