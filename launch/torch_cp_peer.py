#!/usr/bin/env python3
"""The peer for ringattn's multi-GPU numbers: PyTorch context parallelism
(torch.distributed.tensor.experimental.context_parallel) on the same shapes, K/V rotated around
the ring ("alltoall" rotation: each step passes the K/V shard to the next rank, as ringattn does;
"allgather" gathers all shards at once instead).

  torchrun --standalone --nproc_per_node 8 launch/torch_cp_peer.py --seq 262144 --causal
  torchrun --standalone --nproc_per_node 8 launch/torch_cp_peer.py --seq 131072 --causal --json cp.json

Rank 0 prints one line: world, shape, median forward time (slowest rank), TFLOP/s (FLOPs counted
as ringattn counts them: 4 x batch x heads x dim x visible query-key pairs, the causal mask
exactly). With --backward each timed step is the forward and the backward (autograd through
context parallelism's ring, dO drawn once), counted as 3.5x the forward's FLOPs, as
`ringattn bench --backward` counts its forward + backward total. With --check (sequences up to
32768) the gathered output is compared with one SDPA call on the whole sequence. Set
NCCL_NVLS_ENABLE=0 as launch/multigpu.sh does.

Differences from ringattn to keep in mind when reading the numbers: this script repeats the K/V
heads to the query heads (GQA under context parallelism is not supported by every PyTorch
version), so every hop moves Hq/Hkv times ringattn's bytes; PyTorch's causal load balancing
splits the sequence in 2P chunks as ringattn's zigzag does.
"""
import argparse
import json
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.attention import SDPBackend, sdpa_kernel

try:
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard, set_rotate_method
except ImportError as e:  # older PyTorch (< 2.6) has no context parallelism
    sys.exit(f"torch_cp_peer.py: this PyTorch ({torch.__version__}) has no context_parallel: {e}")

BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION}


def attention_flops(b, hq, seq, d, causal):
    pairs = seq * (seq + 1) // 2 if causal else seq * seq
    return 4.0 * b * hq * d * pairs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", type=int, required=True, help="global sequence length")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", action="store_true")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--rotate", default="alltoall", choices=["alltoall", "allgather"])
    ap.add_argument("--backend", default="flash", choices=sorted(BACKENDS))
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--check", action="store_true", help="compare with one SDPA call (seq <= 32768)")
    ap.add_argument("--backward", action="store_true", help="time forward + backward (3.5x the forward's FLOPs)")
    ap.add_argument("--json", help="rank 0 writes the result here")
    args = ap.parse_args()

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    world, rank = dist.get_world_size(), dist.get_rank()
    if args.seq % (2 * world):
        sys.exit(f"torch_cp_peer.py: --seq {args.seq} must be a multiple of 2 x world = {2 * world}")
    mesh = init_device_mesh("cuda", (world,), mesh_dim_names=("cp",))
    set_rotate_method(args.rotate)
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16

    # Every rank makes the same global tensors (same seed), then context_parallel keeps its shard.
    g = torch.Generator(device="cuda").manual_seed(1)
    shape_q = (args.batch, args.heads, args.seq, args.dim)
    shape_kv = (args.batch, args.kv_heads, args.seq, args.dim)
    q = torch.randn(shape_q, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(shape_kv, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(shape_kv, device="cuda", dtype=dtype, generator=g)
    rep = args.heads // args.kv_heads
    k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    full = (q.clone(), k.clone(), v.clone()) if args.check and args.seq <= 32768 else None

    times = []
    with sdpa_kernel(BACKENDS[args.backend]):
        with context_parallel(mesh, buffers=[q, k, v], buffer_seq_dims=[2, 2, 2], no_restore_buffers={q, k, v}):
            for it in range(args.warmup + args.iters):
                dist.barrier()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if args.backward:
                    # The sharded buffers as leaves of a fresh graph (context_parallel resizes the
                    # buffers in place, which autograd forbids on leaves that require grad).
                    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                    if it == 0:
                        dout = torch.randn_like(q)
                start.record()
                if args.backward:
                    out = F.scaled_dot_product_attention(qg, kg, vg, is_causal=args.causal)
                    out.backward(dout)
                else:
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=args.causal)
                end.record()
                torch.cuda.synchronize()
                if it >= args.warmup:
                    t = torch.tensor([start.elapsed_time(end)], device="cuda")
                    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank sets the time
                    times.append(t.item())
        err = None
        if full is not None:
            (gathered,) = context_parallel_unshard(mesh, [out], [2])
            ref = F.scaled_dot_product_attention(*full, is_causal=args.causal)
            err = (gathered.float() - ref.float()).abs().max().item()

    ms = statistics.median(times)
    flops = attention_flops(args.batch, args.heads, args.seq, args.dim, args.causal) * (3.5 if args.backward else 1.0)
    result = {"peer": f"torch_cp_{args.rotate}_{args.backend}" + ("_fwd_bwd" if args.backward else ""),
              "measures": "forward + backward" if args.backward else "forward", "torch": torch.__version__, "world": world,
              "seq": args.seq, "batch": args.batch, "heads": args.heads, "kv_heads": args.kv_heads, "dim": args.dim,
              "causal": args.causal, "dtype": args.dtype, "median_ms": ms, "tflops": flops / ms / 1e9,
              "tflops_per_gpu": flops / ms / 1e9 / world, "max_abs_err_vs_single_sdpa": err,
              "device": torch.cuda.get_device_name()}
    if rank == 0:
        print(f"torch_cp{' fwd+bwd' if args.backward else ''} world {world} seq {args.seq} "
              f"{'causal' if args.causal else 'full'} {args.rotate}/"
              f"{args.backend}: {ms:.3f} ms, {result['tflops']:.1f} TFLOP/s ({result['tflops_per_gpu']:.1f} per GPU)"
              + (f", max abs err {err:.2e}" if err is not None else ""), flush=True)
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(result, fh, indent=1)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
