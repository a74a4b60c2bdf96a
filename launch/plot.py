#!/usr/bin/env python3
"""Plots of ringattn measurements, as PNG files.

  throughput vs sequence length   --bench FILE.json ...   (`ringattn bench --json` records), with
                                  the peers' numbers on the same shapes when --peers is given
  scaling vs number of ranks      --scaling FILE.json ... (bench records at different world sizes)
  GPU kernel table                --ours-csv F --peers-csv F (tests/gpu/ring_host.sh's ours.csv and
                                  .bench/peers.py's CSV): bars per shape, and a markdown table
                                  on stdout with the ratios

  python3 launch/plot.py --bench cpu.json -o launch/results/plots
  python3 launch/plot.py --scaling p1.json p2.json p4.json -o launch/results/plots
  python3 launch/plot.py --ours-csv launch/results/kernels/2026-11-29-h200-ours.csv \\
                         --peers-csv launch/results/kernels/2026-11-29-h200-peers.csv -o launch/results/plots

Needs matplotlib (Debian: apt-get install python3-matplotlib); the parsing needs nothing else.
"""
import argparse
import csv
import json
import math
import os
import sys

MISSING_MATPLOTLIB = 3  # exit code when matplotlib is missing (the ctest test skips on it)


def load_pyplot():
    try:
        import matplotlib
    except ImportError:
        print(f"plot.py: matplotlib is not installed for {sys.executable}; install it with "
              "`apt-get install python3-matplotlib` (Debian/Ubuntu) or `pip install matplotlib`",
              file=sys.stderr)
        sys.exit(MISSING_MATPLOTLIB)
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    return plt


# ---- readers ----------------------------------------------------------------------------------

def split_shape_csv(path, tail_columns):
    """Rows of a CSV whose first field (the shape, e.g. 4,32,8,2048,2048,128,causal) has commas
    of its own: the known columns are split off the right, the rest is the shape."""
    rows = []
    with open(path) as fh:
        header = fh.readline().strip().split(",")
        names = ["shape"] + header[len(header) - tail_columns:]
        for line in fh:
            line = line.strip()
            if line.count(",") < tail_columns:
                continue
            rows.append(dict(zip(names, line.rsplit(",", tail_columns))))
    return rows


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return math.nan


def read_ours_csv(path):
    """shape,impl,tflops,ms,kv_gbps (tests/gpu/ringattn_gpu_bench)."""
    return [{"shape": r["shape"], "impl": r["impl"], "tflops": number(r["tflops"]), "ms": number(r["ms"]),
             "kv_gbps": number(r["kv_gbps"])} for r in split_shape_csv(path, 4)]


def read_peers(path):
    """.bench/peers.py output, CSV (shape,peer,tflops,ms,kv_gbps,max_abs_err) or its --json file
    ({"device", "torch", "dtype", "rows": [{"shape", "peer", "tflops", "ms", "kv_gbps"}]})."""
    if path.endswith(".json"):
        with open(path) as fh:
            rows = json.load(fh)["rows"]
    else:
        rows = split_shape_csv(path, 5)
    out = []
    for r in rows:
        if "error" in r:
            continue  # a peer that does not support the shape
        out.append({"shape": r["shape"], "peer": r["peer"], "tflops": number(r.get("tflops")),
                    "ms": number(r.get("ms")), "kv_gbps": number(r.get("kv_gbps", r.get("gbps")))})
    return out


def read_bench(path):
    with open(path) as fh:
        record = json.load(fh)
    if record.get("command") != "bench" or "sizes" not in record:
        raise SystemExit(f"plot.py: {path} is not a `ringattn bench --json` record (no 'sizes')")
    return record


def peer_family(name):
    """sdpa_flash and sdpa_flash_gqa are the same kernel with and without repeated K/V: the best
    of the two is the peer's number."""
    return {"sdpa_flash": "FA2 (SDPA flash)", "sdpa_cudnn": "cuDNN (SDPA)", "sdpa_efficient": "SDPA mem-efficient",
            "triton": "Triton flash"}.get(name.replace("_gqa", "").split("_32x32")[0].split("_128x64")[0], name)


def best_per_family(peers):
    best = {}
    for r in peers:
        if r["peer"] == "ceiling":
            continue
        key = (r["shape"], peer_family(r["peer"]))
        if key not in best or r["tflops"] > best[key]["tflops"]:
            best[key] = r
    return best


def ceilings(peers):
    c = {}
    for r in peers:
        if r["peer"] == "ceiling":
            c[r["shape"]] = r
    return c


# ---- plots ------------------------------------------------------------------------------------

def bench_label(rec):
    p = rec["problem"]
    return (f"ringattn {rec['device']}, P={rec['world']} ({rec['transport']}), {p.get('dtype', '')}, "
            f"{'causal' if p.get('causal') else 'full'}")


def rate_unit(values_gflops):
    """One unit for a whole plot: TFLOP/s once anything reaches 1000 GFLOP/s."""
    return ("TFLOP/s", 1e-3) if max(values_gflops, default=0) >= 1000 else ("GFLOP/s", 1.0)


def peer_shape_matches(shape, problem):
    b, hq, hkv, t, s, d, mask = shape.split(",")
    return (int(b), int(hq), int(hkv), int(d), mask == "causal", int(t) == int(s)) == (
        problem["batch"], problem["q_heads"], problem["kv_heads"], problem["head_dim"], bool(problem["causal"]), True)


def plot_throughput(plt, records, peers, out):
    series = []  # (label, [(seq, gflops)], style)
    for rec in records:
        for impl in dict.fromkeys(s["impl"] for s in rec["sizes"]):
            pts = [(s["seq"], s["gflops_per_s"]) for s in rec["sizes"] if s["impl"] == impl]
            series.append((bench_label(rec) + ("" if impl == "flash" else f", {impl}"), pts, "o-"))
    if peers and records:
        problem = records[0]["problem"]
        fams = {}
        for (shape, fam), r in best_per_family(peers).items():
            if peer_shape_matches(shape, problem):
                fams.setdefault(fam, []).append((int(shape.split(",")[3]), r["tflops"] * 1e3))
        for fam, pts in sorted(fams.items()):
            series.append((f"{fam} (peer)", sorted(pts), "s--"))
    unit, k = rate_unit([g for _, pts, _ in series for _, g in pts])
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    for label, pts, style in series:
        ax.plot([x for x, _ in pts], [g * k for _, g in pts], style, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    p = records[0]["problem"]
    ax.set_title(f"throughput vs sequence length (batch {p['batch']}, heads {p['q_heads']}/{p['kv_heads']}, "
                 f"dim {p['head_dim']})", fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    return save(fig, out, "throughput.png")


def plot_scaling(plt, records, out):
    records = sorted(records, key=lambda r: r["world"])
    worlds = [r["world"] for r in records]
    seqs = sorted({s["seq"] for r in records for s in r["sizes"] if s["impl"] == "flash"})
    allg = [s["gflops_per_s"] for r in records for s in r["sizes"]]
    unit, k = rate_unit(allg)
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(10, 4.2))
    for seq in seqs:
        pts = [(r["world"], s["gflops_per_s"], s.get("hidden_fraction", -1)) for r in records for s in r["sizes"]
               if s["seq"] == seq and s["impl"] == "flash"]
        ax.plot([w for w, _, _ in pts], [g * k for _, g, _ in pts], "o-", label=f"seq {seq}")
        hid = [(w, h) for w, _, h in pts if h is not None and h >= 0]
        if hid:
            ax2.plot([w for w, _ in hid], [100 * h for _, h in hid], "o-", label=f"seq {seq}")
    for a in (ax, ax2):
        a.set_xlabel("ranks (P)")
        a.set_xticks(worlds)
        a.grid(True, alpha=0.3)
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    ax.set_title("throughput vs ranks (same problem)", fontsize=10)
    ax.legend(fontsize=8)
    ax2.set_ylabel("exchange hidden behind compute (%)")
    ax2.set_ylim(0, 105)
    ax2.set_title("hidden share of the ring exchange", fontsize=10)
    p = records[0]["problem"]
    fig.suptitle(f"{records[0]['device']}: batch {p['batch']}, heads {p['q_heads']}/{p['kv_heads']}, dim "
                 f"{p['head_dim']}, {p['dtype']}, {'causal' if p['causal'] else 'full'}, {p['sharding']} "
                 f"sharding", fontsize=10)
    return save(fig, out, "scaling.png")


OURS_COLUMNS = [("ours", "ours (complete)"), ("ours_state", "ours kernel (fp32 state)"),
                ("ours_portable_state", "portable kernel (mma.sync)")]
PEER_COLUMNS = ["FA2 (SDPA flash)", "cuDNN (SDPA)"]


def kernel_table(ours, peers):
    """Rows per shape: ours, ours kernel, portable, FA2, cuDNN (best of gqa / repeated K/V)."""
    best = best_per_family(peers)
    shapes = list(dict.fromkeys(r["shape"] for r in ours))
    table = []
    for s in shapes:
        mine = {r["impl"]: r for r in ours if r["shape"] == s}
        row = {"shape": s, "decode": s.split(",")[3] == "1"}
        for impl, _ in OURS_COLUMNS:
            row[impl] = mine.get(impl)
        for fam in PEER_COLUMNS:
            row[fam] = best.get((s, fam))
        table.append(row)
    return table


def print_kernel_table(table, ceil):
    f = lambda r, key="tflops": f"{r[key]:.1f}" if r else "-"
    print("| shape | " + " | ".join(n for _, n in OURS_COLUMNS) + " | FA2 | cuDNN | ours/FA2 | ours/cuDNN | "
          "KV GB/s ours / cuDNN |")
    print("|---" * (len(OURS_COLUMNS) + 6) + "|")
    for r in table:
        o, fa, cu = r["ours"], r["FA2 (SDPA flash)"], r["cuDNN (SDPA)"]
        ratio = lambda a, b: f"{a['tflops'] / b['tflops']:.2f}" if a and b else "-"
        kv = f"{o['kv_gbps']:.0f} / {cu['kv_gbps']:.0f}" if o and cu else "-"
        print(f"| {r['shape']}{' (decode)' if r['decode'] else ''} | " +
              " | ".join(f(r[i]) for i, _ in OURS_COLUMNS) + f" | {f(fa)} | {f(cu)} | {ratio(o, fa)} | "
              f"{ratio(o, cu)} | {kv} |")
    for name, c in ceil.items():
        print(f"ceiling {name}: {c['tflops']:.1f} TFLOP/s, {c['kv_gbps']:.0f} GB/s")


def short_shape(shape):
    b, hq, hkv, t, s, d, mask = shape.split(",")
    return f"B{b} H{hq}/{hkv} d{d}\n{t} x {s}\n{mask}"


def plot_kernels(plt, table, ceil, out, title):
    prefill = [r for r in table if not r["decode"]]
    decode = [r for r in table if r["decode"]]
    cols = [(i, n) for i, n in OURS_COLUMNS] + [(f, f) for f in PEER_COLUMNS]
    colors = dict(zip([c for c, _ in cols], plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.2), gridspec_kw={"width_ratios": [max(len(prefill), 1),
                                                                                    max(len(decode), 1) + 0.6]})
    for ax, rows, key, unit in ((axes[0], prefill, "tflops", "TFLOP/s"), (axes[1], decode, "kv_gbps", "KV GB/s")):
        present = [(c, n) for c, n in cols if any(r[c] for r in rows)]  # no empty bars (decode has no portable)
        width = 0.8 / max(len(present), 1)
        for j, (col, name) in enumerate(present):
            xs = [i + (j - (len(present) - 1) / 2) * width for i in range(len(rows))]
            vals = [r[col][key] if r[col] else 0 for r in rows]
            bars = ax.bar(xs, vals, width, label=name, color=colors[col])
            if col == "ours":
                for b, v in zip(bars, vals):
                    ax.text(b.get_x() + b.get_width() / 2, v, f"{v:.0f}", ha="center", va="bottom", fontsize=7)
        ax.set_xticks(range(len(rows)))
        ax.set_xticklabels([short_shape(r["shape"]) for r in rows], fontsize=7)
        ax.set_ylabel(unit)
        ax.grid(True, axis="y", alpha=0.3)
    if "matmul_8192" in ceil:
        axes[0].axhline(ceil["matmul_8192"]["tflops"], color="gray", ls=":")
        axes[0].text(-0.45, ceil["matmul_8192"]["tflops"], "bf16 matmul ceiling", va="bottom", fontsize=7, color="gray")
    if "copy_2GiB" in ceil:
        axes[1].axhline(ceil["copy_2GiB"]["kv_gbps"], color="gray", ls=":")
        axes[1].text(-0.45, ceil["copy_2GiB"]["kv_gbps"], "device copy ceiling", va="bottom", fontsize=7,
                     color="gray")
    axes[0].set_ylim(0, 1.08 * max([ceil.get("matmul_8192", {}).get("tflops", 0)] +
                                   [r[c]["tflops"] for r in prefill for c, _ in cols if r[c]]))
    axes[1].set_ylim(0, 1.08 * max([ceil.get("copy_2GiB", {}).get("kv_gbps", 0)] +
                                   [r[c]["kv_gbps"] for r in decode for c, _ in cols if r[c]] + [1]))
    axes[0].set_title("prefill: TFLOP/s", fontsize=10)
    axes[1].set_title("decode (one query): K/V GB/s", fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=8, frameon=False)
    fig.suptitle(title, fontsize=11)
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return save(fig, out, "kernels.png", layout=False)


def save(fig, out, name, layout=True):
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, name)
    if layout:
        fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}", file=sys.stderr)
    return path


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bench", nargs="+", default=[], help="bench JSON records: throughput vs sequence length")
    ap.add_argument("--peers", help="peers.py CSV or JSON to draw beside --bench (matching shapes)")
    ap.add_argument("--scaling", nargs="+", default=[], help="bench JSON records at different world sizes")
    ap.add_argument("--ours-csv", help="our GPU kernel table (shape,impl,tflops,ms,kv_gbps)")
    ap.add_argument("--peers-csv", help="the peers on the same shapes (peers.py CSV or JSON)")
    ap.add_argument("--title", default="bf16 attention on one GPU", help="title of the kernel chart")
    ap.add_argument("-o", "--out", default="plots", help="folder for the PNG files (default: plots)")
    args = ap.parse_args(argv)
    if not (args.bench or args.scaling or args.ours_csv):
        ap.error("nothing to plot: give --bench, --scaling or --ours-csv")
    if args.peers_csv and not args.ours_csv:
        ap.error("--peers-csv goes with --ours-csv")
    # Parse everything first: a bad file fails before any plotting.
    bench = [read_bench(p) for p in args.bench]
    scaling = [read_bench(p) for p in args.scaling]
    peers = read_peers(args.peers) if args.peers else []
    ours = read_ours_csv(args.ours_csv) if args.ours_csv else []
    kpeers = read_peers(args.peers_csv) if args.peers_csv else []
    plt = load_pyplot()
    if bench:
        plot_throughput(plt, bench, peers, args.out)
    if scaling:
        plot_scaling(plt, scaling, args.out)
    if ours:
        table = kernel_table(ours, kpeers)
        print_kernel_table(table, ceilings(kpeers))
        plot_kernels(plt, table, ceilings(kpeers), args.out, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
