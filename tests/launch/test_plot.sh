#!/usr/bin/env bash
# launch/plot.py: a clear message and exit code 3 without matplotlib (with any python3), and, where
# some python3 has matplotlib, PNGs from a real bench record and from the committed kernel CSVs,
# with the kernel table's numbers as the CSVs give them. Exit 77 (ctest: skipped) when no python3
# here has matplotlib.
#   bash tests/launch/test_plot.sh RINGATTN_BINARY
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RINGATTN="$1"
WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
PLOT="$ROOT/launch/plot.py"
RUNS="$ROOT/launch/results/kernels"
fail() { echo "FAIL: $*" >&2; exit 1; }
command -v python3 >/dev/null || { echo "no python3: skipped"; exit 77; }

# 1. matplotlib missing: a package that fails to import stands in for it.
mkdir -p "$WORK/fake/matplotlib"
echo 'raise ImportError("hidden by the test")' >"$WORK/fake/matplotlib/__init__.py"
set +e
PYTHONPATH="$WORK/fake" python3 "$PLOT" --ours-csv "$RUNS/2026-11-29-h200-ours.csv" -o "$WORK/none" >/dev/null 2>"$WORK/err"
rc=$?
set -e
[ $rc -eq 3 ] || fail "without matplotlib: exit $rc, expected 3"
grep -q "matplotlib is not installed" "$WORK/err" || fail "without matplotlib: no clear message: $(cat "$WORK/err")"
[ ! -e "$WORK/none" ] || fail "without matplotlib: wrote files anyway"

# 2. With matplotlib (the Debian package lives in /usr/bin/python3's path, which a python3 on PATH
#    from pyenv or a venv may not see).
PY=""
for p in python3 /usr/bin/python3; do
  if command -v "$p" >/dev/null && "$p" -c "import matplotlib" 2>/dev/null; then PY="$p"; break; fi
done
[ -n "$PY" ] || { echo "matplotlib not installed: the plotting part is skipped"; exit 77; }

OMP_NUM_THREADS=1 "$RINGATTN" bench -b 128 -e 256 -f 2 -n 1 -w 0 --causal --json "$WORK/bench.json" >/dev/null
"$PY" "$PLOT" --bench "$WORK/bench.json" --scaling "$WORK/bench.json" -o "$WORK/plots" 2>/dev/null
"$PY" "$PLOT" --ours-csv "$RUNS/2026-11-29-h200-ours.csv" --peers-csv "$RUNS/2026-11-29-h200-peers.csv" \
  -o "$WORK/plots" >"$WORK/table.md" 2>/dev/null
for f in throughput scaling kernels; do
  [ "$(head -c 8 "$WORK/plots/$f.png" | od -An -tx1 | tr -d ' \n')" = 89504e470d0a1a0a ] || fail "$f.png is not a PNG"
done
# The shape has commas of its own: a row read wrongly would not give these numbers.
grep -q "^| 1,32,8,8192,8192,128,causal | 586.9 | 568.8 | 292.2 | 319.3 | 554.3 | 1.84 | 1.06 | 36 / 34 |$" \
  "$WORK/table.md" || fail "kernel table row: $(grep 8192,128,causal "$WORK/table.md")"
grep -q "^| 8,32,8,1,32768,128,full (decode) | 16.3 | 16.5 | - | 16.2 | 16.7 |" "$WORK/table.md" ||
  fail "decode row: $(grep 32768,128,full "$WORK/table.md")"
# A file that is not a bench record is refused with its name.
echo '{"command": "run"}' >"$WORK/run.json"
if "$PY" "$PLOT" --bench "$WORK/run.json" -o "$WORK/x" 2>"$WORK/err2"; then fail "accepted a run record"; fi
grep -q "run.json is not a" "$WORK/err2" || fail "bad record: $(cat "$WORK/err2")"
echo "plot.py OK ($PY)"
