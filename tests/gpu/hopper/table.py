"""Joins our bench CSV with the peers' CSV (same shapes, one run) into a compact table."""
import sys

def rows(path):
    out = []
    # A shape is 7 comma-separated fields itself: shape, peer, tflops, ms follow.
    for line in open(path):
        f = line.strip().split(",")
        if len(f) >= 10 and f[0].isdigit():
            out.append([",".join(f[:7])] + f[7:])
    return out

ours = {}  # shape -> {variant: (tflops, ms)}
order = []
for f in rows(sys.argv[1]):
    if f[0] not in ours:
        order.append(f[0])
    try:
        ours.setdefault(f[0], {})[f[1]] = (float(f[2]), f[3])
    except ValueError:
        ours.setdefault(f[0], {})[f[1]] = (float("nan"), "")
peers = {}
for f in rows(sys.argv[2]):
    try:
        peers.setdefault(f[0], {})[f[1]] = float(f[2])
    except ValueError:
        pass
def best(d, *names):
    v = [d[n] for n in names if n in d]
    return max(v) if v else float("nan")
variants = []
for shape in order:
    for name in ours[shape]:
        if name not in variants:
            variants.append(name)
if "ours_hopper" in variants:  # the default configuration first
    variants.remove("ours_hopper")
    variants.insert(0, "ours_hopper")
short = [v.replace("ours_", "") for v in variants]
width = [max(len(s), 6) for s in short]
print(f"{'shape (TFLOP/s)':30} " + " ".join(f"{s:>{w}}" for s, w in zip(short, width)) +
      f" {'cudnn':>6} {'fa2':>6} {'triton':>6} {'hopper/cudnn':>12} {'best/cudnn':>10}")
for shape in order:
    p = peers.get(shape, {})
    vals = [ours[shape].get(v, (float("nan"), ""))[0] for v in variants]
    cud = best(p, "sdpa_cudnn", "sdpa_cudnn_gqa")
    fa2 = best(p, "sdpa_flash", "sdpa_flash_gqa")
    tri = best(p, "triton_32x32", "triton_128x64")
    top = max([x for x in vals if x == x], default=float("nan"))
    default = ours[shape].get("ours_hopper", (float("nan"), ""))[0]
    print(f"{shape:30} " + " ".join(f"{x:{w}.1f}" for x, w in zip(vals, width)) +
          f" {cud:6.1f} {fa2:6.1f} {tri:6.1f} {default / cud:12.2f} {top / cud:10.2f}")
