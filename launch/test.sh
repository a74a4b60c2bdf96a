#!/usr/bin/env bash
# Builds ringattn and runs the whole test suite (labels: unit, cli, mpi, gpu, slurm, python; GPU tests skip
# without a GPU, Slurm tests where no local Slurm cluster can start: they need root, see
# launch/local_slurm.sh). Extra arguments go to ctest, e.g. `bash launch/test.sh -L unit`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$BUILD_DIR"
set +e
ctest --output-on-failure --no-label-summary --parallel "$(nproc)" "$@" 2>&1 | tee ctest.log
rc=${PIPESTATUS[0]}
# Why tests skipped: each skipping test prints a "skipped: REASON" line (ctest shows skipped tests'
# names only).
awk '/^[0-9]+\/[0-9]+ Test: / {name = $3} /^skipped: / {print "skipped " name ": " substr($0, 10)}' \
  Testing/Temporary/LastTest.log 2>/dev/null || true
# ctest prints the list of skipped tests (the GPU tests on a machine without one) after its
# summary; repeat the summary so that it is the last line of the output.
grep -E "^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+" ctest.log | tail -1
exit "$rc"
