"""ringattn.torch.attention beside PyTorch SDPA (cuDNN and FlashAttention-2 backends) on one GPU.

    python -m ringattn.bench [--shape B,HQ,HKV,T,S,D,causal|full ...] [--reps 20] [--passes 7]
                             [--decode-calls 1000] [--csv FILE]

Every implementation is timed the same way: `reps` calls enqueued back to back between two CUDA
events, the median of `passes` such batches (Python's launch cost overlaps the GPU's work unless
it is the larger). Forward rows time the call; fwd+bwd rows time the call and `out.backward`.
TFLOP/s count 4 B HQ T S D for the forward (halved for causal self-attention) and 3.5 times that
for forward + backward (the backward 2.5 times the forward, FlashAttention's counts);
ringattn_speedup is the row's time over ours (above 1: ours is faster).

The decode rows (one query against an S-token cache) measure the host's cost per call: `calls`
calls issued back to back, their wall time per call (loop), the GPU time of their kernels per call
(torch.profiler's device time: kernel), and what the host adds above the kernel (loop - kernel,
at least 0). SDPA's layout is [B, H, T, D]; ours FlashAttention's [B, T, H, D], each fed its own
contiguous tensors."""

import argparse
import csv
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from . import torch as rt

DEFAULT_SHAPES = ["1,32,8,8192,8192,128,full", "1,32,8,8192,8192,128,causal", "4,32,8,2048,2048,128,causal",
                  "1,32,32,16384,16384,64,full"]
PEERS = [("sdpa_cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa_flash", SDPBackend.FLASH_ATTENTION)]


def parse_shape(text):
    parts = text.split(",")
    if len(parts) != 7 or parts[6] not in ("causal", "full"):
        raise SystemExit(f"bad --shape {text!r}: want B,HQ,HKV,T,S,D,causal|full")
    b, hq, hkv, t, s, d = (int(x) for x in parts[:6])
    return b, hq, hkv, t, s, d, parts[6] == "causal"


def flops(shape, backward):
    b, hq, _, t, s, d, causal = shape
    f = 4.0 * b * hq * t * s * d * (0.5 if causal and t == s else 1.0)
    return f * (3.5 if backward else 1.0)


def time_batches(fn, reps, passes):
    """Median milliseconds per call over `passes` batches of `reps` back-to-back calls."""
    fn()
    torch.cuda.synchronize()
    per = []
    for _ in range(passes):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        stop.record()
        stop.synchronize()
        per.append(start.elapsed_time(stop) / reps)
    return statistics.median(per)


def calls(shape, dtype):
    """name -> (forward, forward + backward) callables on fresh inputs for ours and each peer."""
    b, hq, hkv, t, s, d, causal = shape
    dev = torch.device("cuda")
    ours = [torch.randn(x, dtype=dtype, device=dev).requires_grad_() for x in ((b, t, hq, d), (b, s, hkv, d),
                                                                             (b, s, hkv, d))]
    sdpa = [x.detach().transpose(1, 2).contiguous().requires_grad_() for x in ours]
    dout, dout_sdpa = torch.randn_like(ours[0]), torch.randn_like(sdpa[0])
    out = {}

    def ours_fwd():
        with torch.no_grad():
            return rt.attention(*ours, causal=causal)

    def ours_both():  # the gradients returned, not accumulated into .grad (no extra add per call)
        torch.autograd.grad(rt.attention(*ours, causal=causal), ours, dout)

    out["ringattn"] = (ours_fwd, ours_both)
    for name, backend in PEERS:
        def fwd(backend=backend):
            with sdpa_kernel(backend), torch.no_grad():
                return F.scaled_dot_product_attention(*sdpa, is_causal=causal, enable_gqa=hq != hkv)

        def both(backend=backend):
            with sdpa_kernel(backend):
                torch.autograd.grad(F.scaled_dot_product_attention(*sdpa, is_causal=causal, enable_gqa=hq != hkv),
                                    sdpa, dout_sdpa)

        out[name] = (fwd, both)
    return out


def kernel_us(fn, n=50):
    """GPU time of the kernels of one call (torch.profiler's device time, averaged over n calls)."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    total = 0.0
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            total += getattr(e, "device_time", None) or e.cuda_time
    return total / n


def decode_rows(s, dtype, n):
    b, hq, hkv, d = 1, 32, 8, 128
    dev = torch.device("cuda")
    q, k, v = (torch.randn(x, dtype=dtype, device=dev) for x in ((b, 1, hq, d), (b, s, hkv, d), (b, s, hkv, d)))
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    # sdpa: PyTorch's own choice with no backend context manager around the call (whose cost
    # the pinned rows include).
    impls = {"ringattn": lambda: rt.attention(q, k, v),
             "sdpa": lambda: F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)}
    for name, backend in PEERS:
        def fn(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(qs, ks, vs, enable_gqa=True)
        impls[name] = fn
    rows = []
    for name, fn in impls.items():
        try:
            with torch.no_grad():
                kern = kernel_us(fn)
            with torch.no_grad():
                for _ in range(20):
                    fn()
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(n):
                    fn()
                issued = time.perf_counter()
                torch.cuda.synchronize()
                t1 = time.perf_counter()
        except RuntimeError as e:
            print(f"# {name} decode: {e}".splitlines()[0], file=sys.stderr)
            continue
        loop = (t1 - t0) / n * 1e6
        rows.append((name, f"1,{hq},{hkv},1,{s},{d},full", round(loop, 2), round(kern, 2),
                     round((issued - t0) / n * 1e6, 2), round(max(0.0, loop - kern), 2)))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m ringattn.bench", description=__doc__.splitlines()[0])
    ap.add_argument("--shape", action="append", help="B,HQ,HKV,T,S,D,causal|full (repeatable)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--decode-cache", type=int, default=8192, help="the decode rows' cache length (0: none)")
    ap.add_argument("--decode-calls", type=int, default=1000)
    ap.add_argument("--csv", help="also write the rows to this file")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("python -m ringattn.bench needs a CUDA GPU (torch sees none)")
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float16
    rows = [("kind", "impl", "shape", "ms", "tflops", "ringattn_speedup")]
    print(f"# {torch.cuda.get_device_name()} torch {torch.__version__} {a.dtype}; medians of {a.passes} batches "
          f"of {a.reps} calls")
    for text in a.shape or DEFAULT_SHAPES:
        shape = parse_shape(text)
        impls = calls(shape, dtype)
        for kind, i in (("fwd", 0), ("fwd+bwd", 1)):
            times = {}
            for name, fns in impls.items():
                try:
                    times[name] = time_batches(fns[i], a.reps, a.passes)
                except RuntimeError as e:  # a backend that refuses the shape is reported, not fatal
                    print(f"# {name} {kind} {text}: {e}".splitlines()[0], file=sys.stderr)
            for name, ms in times.items():
                ratio = ms / times["ringattn"] if "ringattn" in times else float("nan")
                rows.append((kind, name, text, round(ms, 4), round(flops(shape, i == 1) / ms / 1e9, 1),
                             round(ratio, 3)))
        del impls
        torch.cuda.empty_cache()
    if a.decode_cache > 0:
        rows.append(("kind", "impl", "shape", "loop_us", "kernel_us", "issue_us", "host_above_kernel_us"))
        rows += [("decode",) + r for r in decode_rows(a.decode_cache, dtype, a.decode_calls)]
    w = csv.writer(sys.stdout)
    w.writerows(rows)
    if a.csv:
        with open(a.csv, "w", newline="") as f:
            csv.writer(f).writerows(rows)


if __name__ == "__main__":
    main()
