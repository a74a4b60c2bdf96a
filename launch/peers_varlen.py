#!/usr/bin/env python3
"""Packed-document (varlen) attention of the peers, timed as shared/bench/peers.py times the
forward: the backend chosen outside the timed region, 20 calls enqueued back to back between two
CUDA events, median of 7 such batches. The documents are nested jagged tensors through PyTorch
SDPA, which runs FlashAttention-2's varlen kernel (cu_seqlens) on the flash backend; cuDNN and the
efficient backend are tried too and reported as unsupported where PyTorch refuses them. GQA: the
K/V heads are repeated to the query heads outside the timed region (SDPA's nested path takes no
enable_gqa). TFLOP/s count the visible pairs only (4 * H * D per pair; causal: l (l + 1) / 2 pairs
per document of length l), as `ringattn bench --docs` counts them.
    python3 launch/peers_varlen.py --total 65536 --doc-len 4096 [--heads 32 --kv-heads 8 --dim 128] [--full]
Documents: total / doc-len of length doc-len, then the remainder (ringattn bench --docs fixed:L).
"""
import argparse
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timed(fn, calls=20, batches=7):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(batches):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        for _ in range(calls):
            fn()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / calls)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--total", type=int, required=True)
    ap.add_argument("--doc-len", type=int, required=True)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--full", action="store_true", help="no causal edge inside a document")
    a = ap.parse_args()
    causal = not a.full
    lens = [a.doc_len] * (a.total // a.doc_len) + ([a.total % a.doc_len] if a.total % a.doc_len else [])
    pairs = sum(l * (l + 1) // 2 if causal else l * l for l in lens)
    flops = 4.0 * a.heads * a.dim * pairs
    dt = torch.bfloat16

    rep = a.heads // a.kv_heads

    def jagged(heads, repeat=1):
        # [docs, (len), heads, dim] with the K/V heads repeated to the query heads (untimed),
        # then [docs, heads, (len), dim] as SDPA takes it.
        parts = [torch.randn(l, heads, a.dim, device="cuda", dtype=dt).repeat_interleave(repeat, dim=1) for l in lens]
        return torch.nested.nested_tensor(parts, layout=torch.jagged).transpose(1, 2)

    q = jagged(a.heads)
    k = jagged(a.kv_heads, rep)
    v = jagged(a.kv_heads, rep)
    print("case,peer,docs,ms,tflops")
    case = f"{a.total}/{a.doc_len}/{'causal' if causal else 'full'}"
    for backend, name in [(SDPBackend.FLASH_ATTENTION, "sdpa_flash_varlen"), (SDPBackend.CUDNN_ATTENTION, "sdpa_cudnn_varlen"),
                          (SDPBackend.EFFICIENT_ATTENTION, "sdpa_efficient_varlen")]:
        try:
            with sdpa_kernel(backend):
                ms = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
            print(f"{case},{name},{len(lens)},{ms:.4f},{flops / ms / 1e9:.1f}", flush=True)
        except Exception as e:  # a backend PyTorch refuses for nested inputs
            print(f"{case},{name},{len(lens)},unsupported,{type(e).__name__}: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
