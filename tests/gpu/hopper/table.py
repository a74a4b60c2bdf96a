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

ours = {f[0]: f for f in rows(sys.argv[1])}
peers = {}
for f in rows(sys.argv[2]):
    try:
        peers.setdefault(f[0], {})[f[1]] = float(f[2])
    except ValueError:
        pass
def best(d, *names):
    v = [d[n] for n in names if n in d]
    return max(v) if v else float("nan")
print(f"{'shape':32} {'ours':>7} {'ms':>8} {'cudnn':>7} {'fa2':>7} {'triton':>7} {'ours/cudnn':>10}")
for shape, f in ours.items():
    p = peers.get(shape, {})
    try:
        ours_t = float(f[2])
    except ValueError:
        ours_t = float("nan")
    cud = best(p, "sdpa_cudnn", "sdpa_cudnn_gqa")
    fa2 = best(p, "sdpa_flash", "sdpa_flash_gqa")
    tri = best(p, "triton_32x32", "triton_128x64")
    print(f"{shape:32} {ours_t:7.1f} {f[3]:>8} {cud:7.1f} {fa2:7.1f} {tri:7.1f} {ours_t / cud:10.2f}")
