#!/usr/bin/env python3
"""A model of the weak and strong scaling of ringattn's zigzag causal ring past the 2 GPUs measured
so far: P = 1, 2, 4, 8 GPUs in a node (NVLink) and several nodes of 8 (InfiniBand between them).
Python 3 standard library only (issue 17, item 6).

  python3 launch/scaling_model.py                 # the defaults: H200, bf16, 32/8 heads, d128
  python3 launch/scaling_model.py --overhead-ms 0 # what the ring would do without its per-exchange loss

The model. With P GPUs and N tokens every GPU holds t = N / P tokens (zigzag: two chunks of N / 2P).
Every hop of the zigzag causal ring computes the same number of query-key pairs, t^2 / 2 (the
pairs of a causal self-attention of t tokens), so the compute of one hop is the one-GPU causal
time at t tokens: Tc = 4 x batch x heads x dim x t (t + 1) / 2 / R(t), with R the one-GPU rate
interpolated (log-linearly in tokens) between measured points and held at the nearest point
outside them (such rows are marked *). The block a hop moves is K and V of t tokens, B = 2 x batch
x kv_heads x t x dim x element bytes, in Tx = latency + B / bandwidth over the slowest link of the
ring: NVLink within one node; InfiniBand as soon as the ring spans nodes, since every hop waits for
its slowest pair and a ring over several nodes always has pairs that cross. Each exchange also
costs a fixed overhead o (posting, waiting, events, the state's fold), fitted to one measured
P > 1 point unless --overhead-ms gives it:
    T_P(N) = (P - 1) x (max(Tc, Tx) + o) + Tc    (the last hop computes with nothing in flight)
Efficiency (weak and strong alike) is T_1(N) / (P x T_P(N)), T_1(N) the one-GPU time of the same
global problem from the same rate curve (the definition of launch/multigpu_summary.py's "same
problem" column; for N beyond one GPU's memory it is the rate curve's, not a measurement).

Context parallelism layouts (ringattn run --cp hybrid:U; U = 1 is the ring, U = P ulysses). U
consecutive GPUs form a group (inside a node while U <= --node-gpus) and G = P / U groups a ring.
An all-to-all inside the group gives every GPU the group's U t tokens for heads / U query and
kv_heads / U KV heads: each GPU sends (U - 1) / U of its q, k and v (t x batch x dim x elem bytes x
(heads + 2 kv_heads)) and, after the ring, of its out and lse (t x batch x heads x (dim x elem bytes
+ 4)), each in latency + bytes / bandwidth + o over the group's link (NVLink inside a node, else
InfiniBand). The ring across the groups then moves the same bytes per hop as the plain ring (K/V of
U t tokens for kv_heads / U heads) over G - 1 hops, each computing heads / U heads of a causal
self-attention over U t tokens (the rate at U t tokens); its link is InfiniBand once the groups span
nodes. T = A2A_in + (G - 1) x (max(Tc, Tx) + o) + Tc + A2A_out; U must divide both head counts.

Sources of the defaults (all bf16, batch 1, 32 query / 8 KV heads, head dim 128, causal):
  --hop-ms   launch/results/kernels/2026-11-29-h200-ours.csv, rows "1,32,8,8192,8192,128,causal,ours"
             (0.937 ms) and "1,32,8,32768,32768,128,causal,ours" (14.778 ms): one H200, measured
  --measured P = 1: /work/shared/notes/two-gpu-2026-11-30.md, "P=1, 8192 (one shard's length)"
             0.948 ms and "P=1, the whole 16384 on one GPU" 3.836 ms (ringattn bench, measured);
             P = 2: docs/performance.md, "2026-11-30, two H200s: P = 2 over NCCL", 16384 tokens
             2.421 ms and 65536 tokens 30.8 ms (ringattn bench -n 20 -w 3, measured); 131072 tokens 119.1 ms from
             /work/shared/notes/two-gpu-2026-11-30.md ("ringattn: ... 119.1 ms (1182)", measured)
  --nvlink-* NVIDIA's H200 SXM specification: NVLink 900 GB/s per GPU, both directions together,
             so 450 GB/s each way (a specification, not measured here); latency assumed 5 us
  --ib-*     one 400 Gb/s (NDR) InfiniBand adapter per GPU, as in 8-GPU H200 nodes: 50 GB/s each
             way (a specification, not measured here); latency assumed 10 us
"""
import argparse
import math
import sys

DEFAULT_HOP_MS = "8192:0.937,32768:14.778"
DEFAULT_MEASURED = "1:8192:0.948,1:16384:3.836,2:16384:2.421,2:65536:30.8,2:131072:119.1"


# ---------------------------------------------------------------------------------------------
# Flags: every bad value is refused naming the flag's value and what is allowed (argparse exits 2).

def positive_number(text):
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0 (got '{text}')")
    return v


def non_negative_number(text):
    try:
        v = float(text)
    except ValueError:
        v = float("nan")
    if not (math.isfinite(v) and v >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0 (got '{text}')")
    return v


def positive_int(text):
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1 (got '{text}')")
    return int(text)


def int_list(text):
    try:
        values = [positive_int(x) for x in text.split(",")]
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"must be a comma-separated list of integers >= 1 (got '{text}')")
    return values


def points(text):
    """'tokens:value,...' (tokens an integer >= 1, value > 0), sorted by tokens, tokens distinct."""
    out = {}
    for item in text.split(","):
        parts = item.split(":")
        try:
            if len(parts) != 2:
                raise argparse.ArgumentTypeError("")
            t, v = positive_int(parts[0]), positive_number(parts[1])
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated TOKENS:VALUE pairs, TOKENS an integer >= 1 and VALUE a number > 0 "
                f"(got '{item}' in '{text}')")
        if t in out:
            raise argparse.ArgumentTypeError(f"gives {t} tokens twice (in '{text}')")
        out[t] = v
    return sorted(out.items())


def measurements(text):
    """'P:tokens:ms,...' measured times of the whole forward over P GPUs."""
    out = []
    for item in text.split(","):
        parts = item.split(":")
        try:
            if len(parts) != 3:
                raise argparse.ArgumentTypeError("")
            p, t, ms = positive_int(parts[0]), positive_int(parts[1]), positive_number(parts[2])
        except argparse.ArgumentTypeError:
            raise argparse.ArgumentTypeError(
                f"must be comma-separated P:TOKENS:MS triples, P and TOKENS integers >= 1, MS a number > 0 "
                f"(got '{item}' in '{text}')")
        if t % p != 0:
            raise argparse.ArgumentTypeError(f"{t} tokens do not split over {p} GPUs (in '{item}')")
        out.append((p, t, ms))
    return out


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    shape = ap.add_argument_group("problem (the shape the compute measurements were taken at)")
    shape.add_argument("--batch", type=positive_int, default=1)
    shape.add_argument("--heads", type=positive_int, default=32, help="query heads")
    shape.add_argument("--kv-heads", type=positive_int, default=8)
    shape.add_argument("--dim", type=positive_int, default=128, help="head dimension")
    shape.add_argument("--elem-bytes", type=positive_int, default=2, help="bytes per K/V element (bf16: 2)")
    comp = ap.add_argument_group("one GPU's compute (give one of the two)")
    comp.add_argument("--hop-ms", type=points, default=None,
                      help=f"TOKENS:MS, one GPU's causal forward time at TOKENS (= one hop's compute when TOKENS "
                           f"is the shard); default {DEFAULT_HOP_MS}")
    comp.add_argument("--rate", type=points, default=None, help="TOKENS:TFLOPS, one GPU's causal rate at TOKENS")
    link = ap.add_argument_group("links (per GPU, each way)")
    link.add_argument("--nvlink-gbps", type=positive_number, default=450.0, help="within a node, GB/s")
    link.add_argument("--nvlink-latency-us", type=non_negative_number, default=5.0)
    link.add_argument("--ib-gbps", type=positive_number, default=50.0, help="between nodes, GB/s")
    link.add_argument("--ib-latency-us", type=non_negative_number, default=10.0)
    ring = ap.add_argument_group("the ring")
    ring.add_argument("--overhead-ms", type=non_negative_number, default=None,
                      help="fixed cost of each exchange (default: fitted to --fit)")
    ring.add_argument("--measured", type=measurements, default=DEFAULT_MEASURED,
                      help=f"P:TOKENS:MS measured forward times to validate against; default {DEFAULT_MEASURED}")
    ring.add_argument("--fit", default=None, metavar="P:TOKENS",
                      help="the --measured point the overhead is fitted to (default: the first with P > 1)")
    tab = ap.add_argument_group("the tables")
    tab.add_argument("--gpus-per-node", type=int_list, default=[1, 2, 4, 8], help="one node: these GPU counts")
    tab.add_argument("--node-gpus", type=positive_int, default=8, help="GPUs per node in the multi-node rows")
    tab.add_argument("--nodes", type=int_list, default=[2, 4, 16], help="multi-node rows: these node counts")
    tab.add_argument("--weak-tokens", type=int_list, default=[8192, 32768], help="weak scaling: tokens per GPU")
    tab.add_argument("--strong-tokens", type=int_list, default=[131072, 1048576], help="strong scaling: total tokens")
    tab.add_argument("--cp-gpus", type=int_list, default=[8, 16, 32, 64],
                     help="the layouts table (--cp): these GPU counts, --node-gpus per node")
    tab.add_argument("--cp-tokens", type=int_list, default=[8192, 32768], help="the layouts table: tokens per GPU")
    a = ap.parse_args(argv)
    if a.hop_ms is not None and a.rate is not None:
        ap.error("--hop-ms and --rate both describe one GPU's compute: give one of them")
    if isinstance(a.measured, str):
        a.measured = measurements(a.measured)
    if a.hop_ms is None and a.rate is None:
        a.hop_ms = points(DEFAULT_HOP_MS)
    if a.heads % a.kv_heads != 0:
        ap.error(f"--heads {a.heads} is not a multiple of --kv-heads {a.kv_heads}")
    if a.overhead_ms is None:
        fit = [m for m in a.measured if m[0] > 1]
        if a.fit is not None:
            want = a.fit.split(":")
            fit = [m for m in a.measured if [str(m[0]), str(m[1])] == want]
            if not fit or fit[0][0] < 2:
                ap.error(f"--fit {a.fit}: no --measured point P:TOKENS with P > 1 matches it "
                         f"(the points: {', '.join(f'{p}:{t}' for p, t, _ in a.measured)})")
        if not fit:
            ap.error("no --measured point with P > 1 to fit the per-exchange overhead to; give one, or --overhead-ms")
        a.fit_point = fit[0]
    else:
        a.fit_point = None
    return a


# ---------------------------------------------------------------------------------------------
# The model.

class Model:
    def __init__(self, a):
        self.a = a
        self.block_per_token = 2 * a.batch * a.kv_heads * a.dim * a.elem_bytes
        src = a.rate if a.rate is not None else [(t, self.flops(t) / (ms * 1e-3) / 1e12) for t, ms in a.hop_ms]
        self.rates = src  # (tokens, TFLOP/s), sorted by tokens
        self.overhead_s = (a.overhead_ms or 0.0) * 1e-3

    def flops(self, n):
        """4 x batch x heads x dim x the visible pairs of causal self-attention over n tokens."""
        return 4.0 * self.a.batch * self.a.heads * self.a.dim * n * (n + 1) / 2

    def rate(self, n):
        """One GPU's causal rate at n tokens (FLOP/s) and whether n lies outside the measured points."""
        pts = self.rates
        if n <= pts[0][0] or len(pts) == 1:
            return pts[0][1] * 1e12, n < pts[0][0]
        if n >= pts[-1][0]:
            return pts[-1][1] * 1e12, n > pts[-1][0]
        for (t0, r0), (t1, r1) in zip(pts, pts[1:]):
            if t0 <= n <= t1:
                w = math.log(n / t0) / math.log(t1 / t0)
                return (r0 + w * (r1 - r0)) * 1e12, False
        raise AssertionError("unreachable")

    def one_gpu_s(self, n):
        return self.flops(n) / self.rate(n)[0]

    def link(self, nodes):
        a = self.a
        if nodes > 1:
            return "IB", a.ib_gbps * 1e9, a.ib_latency_us * 1e-6
        return "NVLink", a.nvlink_gbps * 1e9, a.nvlink_latency_us * 1e-6

    def forward(self, gpus, nodes, n):
        """Predicted time of one forward of n tokens over `gpus` GPUs on `nodes` nodes."""
        t = n / gpus
        tc = self.one_gpu_s(t)
        name, bw, lat = self.link(nodes)
        tx = lat + self.block_per_token * t / bw if gpus > 1 else 0.0
        total = (gpus - 1) * (max(tc, tx) + self.overhead_s) + tc
        return {"tc": tc, "tx": tx, "link": name if gpus > 1 else "-", "total": total,
                "bound": "-" if gpus == 1 else ("link" if tx > tc else "compute")}

    def layout(self, gpus, n, u):
        """Predicted forward of n tokens over `gpus` GPUs (--node-gpus per node) with groups of u:
        the all-to-alls inside the groups, then the ring across the gpus / u groups."""
        a = self.a
        t = n / gpus
        g = gpus // u
        def link(span_nodes):
            return ((a.ib_gbps * 1e9, a.ib_latency_us * 1e-6) if span_nodes
                    else (a.nvlink_gbps * 1e9, a.nvlink_latency_us * 1e-6))
        share = (u - 1) / u
        bw, lat = link(u > a.node_gpus)
        a2a_in = a2a_out = 0.0
        if u > 1:
            a2a_in = lat + share * t * a.batch * a.dim * a.elem_bytes * (a.heads + 2 * a.kv_heads) / bw + self.overhead_s
            a2a_out = lat + share * t * a.batch * a.heads * (a.dim * a.elem_bytes + 4) / bw + self.overhead_s
        tc = self.one_gpu_s(u * t) / u  # heads / u heads of the group's u t tokens
        rbw, rlat = link(gpus > a.node_gpus)
        tx = rlat + self.block_per_token * t / rbw if g > 1 else 0.0
        total = a2a_in + (g - 1) * (max(tc, tx) + self.overhead_s) + tc + a2a_out
        return {"a2a": a2a_in + a2a_out, "tc": tc, "tx": tx, "hops": g, "total": total,
                "held": self.rate(u * t)[1]}

    def fit_overhead(self, p, n, ms):
        """The per-exchange overhead that makes the model meet one measured point (P > 1, one node)."""
        self.overhead_s = 0.0
        bare = self.forward(p, 1, n)["total"]
        self.overhead_s = max(0.0, (ms * 1e-3 - bare) / (p - 1))
        return self.overhead_s


# ---------------------------------------------------------------------------------------------
# The report.

def describe(a, m):
    print(f"# ringattn scaling model: zigzag causal ring, batch {a.batch}, heads {a.heads}/{a.kv_heads}, "
          f"dim {a.dim}, {a.elem_bytes}-byte K/V elements")
    if a.rate is not None:
        print("# one GPU's rate (given): " + ", ".join(f"{t} tokens {r:g} TFLOP/s" for t, r in a.rate))
    else:
        print("# one GPU's causal forward (given): " + ", ".join(
            f"{t} tokens {ms:g} ms ({m.flops(t) / ms / 1e9:.1f} TFLOP/s)" for t, ms in a.hop_ms))
    print(f"# links per GPU, each way: NVLink {a.nvlink_gbps:g} GB/s + {a.nvlink_latency_us:g} us within a node, "
          f"InfiniBand {a.ib_gbps:g} GB/s + {a.ib_latency_us:g} us between nodes")
    if a.fit_point is not None:
        p, n, ms = a.fit_point
        o = m.fit_overhead(p, n, ms)
        print(f"# per-exchange overhead {o * 1e3:.3f} ms, fitted to the measured P = {p}, {n}-token point ({ms:g} ms)")
    else:
        print(f"# per-exchange overhead {m.overhead_s * 1e3:.3f} ms (given)")
    print("# T_P(N) = (P - 1) x (max(compute of a hop, transfer of its block) + overhead) + compute of a hop")
    print()


def validate(a, m):
    print("## validation: the model against the measurements it was given\n")
    print("| P | tokens | measured ms | predicted ms | measured / predicted | |")
    print("|---:|---:|---:|---:|---:|---|")
    for p, n, ms in a.measured:
        pred = m.forward(p, 1, n)["total"] * 1e3
        note = "fitted" if a.fit_point == (p, n, ms) else ""
        print(f"| {p} | {n} | {ms:.3f} | {pred:.3f} | ratio {ms / pred:.3f} | {note} |")
    print()


def configurations(a):
    rows = [(g, 1) for g in a.gpus_per_node]
    rows += [(a.node_gpus * n, n) for n in a.nodes]
    return rows


def table(title, m, rows):
    print(f"## {title} (predicted)\n")
    print("| GPUs | nodes x GPUs | tokens | tokens/GPU | compute/hop ms | transfer/hop ms | link | bound | "
          "ms | TFLOP/s | efficiency |")
    print("|---:|---|---:|---:|---:|---:|---|---|---:|---:|---:|")
    for gpus, nodes, n in rows:
        f = m.forward(gpus, nodes, n)
        tf = m.flops(n) / f["total"] / 1e12
        eff = m.one_gpu_s(n) / (gpus * f["total"])
        # * : the rate at that length is held from the nearest measured point, not interpolated.
        hop_mark = "*" if m.rate(n / gpus)[1] else ""
        eff_mark = "*" if m.rate(n)[1] else ""
        print(f"| {gpus} | {nodes} x {gpus // nodes} | {n} | {n // gpus} | {f['tc'] * 1e3:.3f}{hop_mark} | "
              f"{f['tx'] * 1e3:.3f} | {f['link']} | {f['bound']} | {f['total'] * 1e3:.2f} | {tf:.0f} | "
              f"{eff:.2f}{eff_mark} |")
    print()


def layouts_table(a, m, tokens):
    print(f"## layouts (--cp): {tokens} tokens per GPU, {a.node_gpus} GPUs per node (predicted)\n")
    print("| GPUs | cp | groups x GPUs | all-to-alls ms | compute/hop ms | transfer/hop ms | ms | TFLOP/s | best |")
    print("|---:|---|---|---:|---:|---:|---:|---:|---|")
    for gpus in a.cp_gpus:
        n = tokens * gpus
        us = [u for u in range(1, gpus + 1) if gpus % u == 0 and a.heads % u == 0 and a.kv_heads % u == 0]
        rows = [(u, m.layout(gpus, n, u)) for u in us]
        best = min(rows, key=lambda r: r[1]["total"])[0]
        for u, f in rows:
            name = "ring" if u == 1 else "ulysses" if u == gpus else f"hybrid:{u}"
            mark = "*" if f["held"] else ""
            print(f"| {gpus} | {name} | {gpus // u} x {u} | {f['a2a'] * 1e3:.3f} | {f['tc'] * 1e3:.3f}{mark} | "
                  f"{f['tx'] * 1e3:.3f} | {f['total'] * 1e3:.2f} | {m.flops(n) / f['total'] / 1e12:.0f} | "
                  f"{'best' if u == best else ''} |")
    print()


def main(argv):
    a = parse_args(argv)
    m = Model(a)
    describe(a, m)
    validate(a, m)
    configs = configurations(a)
    for t in a.weak_tokens:
        table(f"weak scaling: {t} tokens per GPU", m, [(g, nodes, t * g) for g, nodes in configs])
    for n in a.strong_tokens:
        table(f"strong scaling: {n} tokens in all", m, [(g, nodes, n) for g, nodes in configs if n % g == 0])
    for t in a.cp_tokens:
        layouts_table(a, m, t)
    lo, hi = m.rates[0][0], m.rates[-1][0]
    print(f"efficiency = one GPU's time for the same tokens / (GPUs x the ring's time). * = outside the measured "
          f"compute points ({lo}..{hi} tokens), the rate held at the nearest one: on compute/hop for the shard, on "
          f"efficiency for the one-GPU baseline of all the tokens. Below {lo} tokens per GPU a GPU is slower than "
          f"that, so those rows are optimistic.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
