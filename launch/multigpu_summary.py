#!/usr/bin/env python3
"""Tables from the JSON files of one launch/multigpu.sh run (its OUT folder): correctness, weak
and strong scaling, per-hop compute vs exchange, and PyTorch context parallelism beside ringattn.

  python3 launch/multigpu_summary.py multigpu-20261130-0900
"""
import glob
import json
import os
import re
import sys


def load(path):
    try:
        with open(path) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def bench_row(rec):
    """The one size of a single-size bench record: (TFLOP/s, ms, hidden fraction, pass)."""
    s = rec["sizes"][0]
    return s["gflops_per_s"] / 1e3, s["median_s"] * 1e3, s.get("hidden_fraction", -1), s["pass"]


def fmt_hidden(h):
    return f"{100 * h:.0f}%" if h is not None and h >= 0 else "n/a"


def step_codes(out):
    codes = {}
    try:
        with open(os.path.join(out, "steps.txt")) as fh:
            for line in fh:
                m = re.match(r"(\S+) rc=(\d+)", line)
                if m:
                    codes[m.group(1)] = int(m.group(2))
    except OSError:
        pass
    return codes


def correctness(out, codes):
    print("## correctness (NCCL, bf16, GQA 32/8, head dim 128, --check)\n")
    print("| run | exit | max abs error | non-finite |\n|---|---|---|---|")
    for path in sorted(glob.glob(os.path.join(out, "correct-*.json"))):
        name = os.path.basename(path)[:-5]
        rec = load(path) or {}
        ranks = rec.get("ranks", [])
        err = max((r.get("max_abs_error", 0) for r in ranks), default=float("nan"))
        nan = sum(r.get("nan_count", 0) for r in ranks)
        print(f"| {name} | {codes.get(name, '?')} | {err:.2e} | {nan} |")
    print()


def scaling(out):
    worlds = sorted({int(m.group(1)) for p in glob.glob(os.path.join(out, "strong-p*.json"))
                     if (m := re.search(r"strong-p(\d+)\.json", p))})
    for t in (8192, 32768):
        rows = []
        for p in sorted({int(m.group(1)) for f in glob.glob(os.path.join(out, f"weak-t{t}-p*-zigzag.json"))
                         if (m := re.search(r"-p(\d+)-zigzag", f))}):
            rec = load(os.path.join(out, f"weak-t{t}-p{p}-zigzag.json"))
            if not rec:
                continue
            tf, ms, hid, ok = bench_row(rec)
            single = load(os.path.join(out, f"weak-t{t}-p{p}-single.json"))
            if p == 1:
                single = rec
            shard = load(os.path.join(out, f"weak-t{t}-p{p}-shardwork.json"))
            s_tf = bench_row(single)[0] if single else float("nan")
            w_tf = shard["gflops_per_s"] / 1e3 if shard else (s_tf if p == 1 else float("nan"))
            rows.append(f"| {p} | {t * p} | {ms:.2f} | {tf:.1f} | {tf / p:.1f} | {tf / (p * s_tf):.2f} | "
                        f"{tf / (p * w_tf):.2f} | {fmt_hidden(hid)} | {'OK' if ok else 'FAILED'} |")
        if rows:
            print(f"## weak scaling: {t} tokens per GPU, causal zigzag\n")
            print("efficiency = rate / (P x one GPU's rate), one GPU running the same global problem, or one "
                  "shard's work (t queries over the t*P keys before them)\n")
            print("| P | seq | ms | TFLOP/s | per GPU | eff. (same problem) | eff. (shard's work) | hidden | check |")
            print("|---|---|---|---|---|---|---|---|---|")
            print("\n".join(rows) + "\n")
        beside = []
        for shard in ("contiguous", "zigzag", "striped"):
            g = max(worlds, default=1)
            rec = load(os.path.join(out, f"weak-t{t}-p{g}-{shard}.json"))
            if rec:
                tf, ms, hid, ok = bench_row(rec)
                beside.append(f"| {shard} | {g} | {ms:.2f} | {tf:.1f} | {fmt_hidden(hid)} |")
        if beside:
            print(f"shardings at P = {max(worlds, default=1)}, {t} tokens per GPU, causal:\n")
            print("| sharding | P | ms | TFLOP/s | hidden |\n|---|---|---|---|---|")
            print("\n".join(beside) + "\n")
    if worlds:
        print("## strong scaling: 131072 tokens, causal zigzag\n")
        print("| P | ms | TFLOP/s | speedup | efficiency | hidden | torch CP TFLOP/s |\n|---|---|---|---|---|---|---|")
        base = None
        for p in worlds:
            rec = load(os.path.join(out, f"strong-p{p}.json"))
            if not rec:
                continue
            tf, ms, hid, ok = bench_row(rec)
            base = base or ms * p  # the P = 1 time (the first world is 1)
            peer = load(os.path.join(out, f"peer-strong-p{p}.json"))
            ptf = f"{peer['tflops']:.1f}" if peer else "-"
            print(f"| {p} | {ms:.2f} | {tf:.1f} | {base / ms:.2f} | {base / ms / p:.2f} | {fmt_hidden(hid)} | {ptf} |")
        print()


def hops(out):
    files = sorted(glob.glob(os.path.join(out, "hops-p*.json")), key=lambda f: int(re.search(r"p(\d+)", f).group(1)))
    if not files:
        return
    print("## per hop: compute vs exchange (32768 tokens per GPU, causal zigzag, NCCL)\n")
    print("per rank, divided by the P hops (compute) and the P - 1 exchanges (exposed, transfer)\n")
    print("| P | rank | compute/hop ms | exposed/exchange ms | transfer/exchange ms | MiB/exchange | hidden |")
    print("|---|---|---|---|---|---|---|")
    for f in files:
        rec = load(f)
        if not rec:
            continue
        p = rec["world"]
        for r in rec["ranks"]:
            x = max(p - 1, 1)
            tr = f"{1e3 * r['transfer_s'] / x:.3f}" if r.get("transfer_s", -1) >= 0 else "n/a"
            print(f"| {p} | {r['rank']} | {1e3 * r['compute_s'] / p:.3f} | {1e3 * r['exposed_comm_s'] / x:.3f} | {tr} | "
                  f"{r['bytes_sent'] / x / 2**20:.1f} | {fmt_hidden(r.get('hidden_fraction'))} |")
    print()


def peers(out):
    files = sorted(glob.glob(os.path.join(out, "peer-weak-*.json")))
    if not files:
        return
    print("## weak scaling beside PyTorch context parallelism (ring rotation, repeated K/V heads)\n")
    print("| tokens/GPU | P | ringattn TFLOP/s | torch CP TFLOP/s | ratio |\n|---|---|---|---|---|")
    for f in files:
        m = re.search(r"peer-weak-t(\d+)-p(\d+)", f)
        peer, ours = load(f), load(os.path.join(out, f"weak-t{m.group(1)}-p{m.group(2)}-zigzag.json"))
        if peer and ours:
            tf = bench_row(ours)[0]
            print(f"| {m.group(1)} | {m.group(2)} | {tf:.1f} | {peer['tflops']:.1f} | {tf / peer['tflops']:.2f} |")
    chk = glob.glob(os.path.join(out, "peer-check-*.json"))
    if chk and (c := load(chk[0])):
        print(f"\ntorch CP check at P = {c['world']}, seq {c['seq']}: max abs error vs one SDPA call "
              f"{c['max_abs_err_vs_single_sdpa']}")
    print()


def main():
    if len(sys.argv) != 2 or not os.path.isdir(sys.argv[1]):
        sys.exit("usage: multigpu_summary.py OUT_DIR (the folder launch/multigpu.sh wrote)")
    out = sys.argv[1]
    correctness(out, step_codes(out))
    scaling(out)
    hops(out)
    peers(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
