#!/usr/bin/env bash
# Builds ringattn and runs the whole test suite (labels: unit, cli, mpi, gpu; GPU tests skip
# without a GPU). ctest's summary is the last thing printed. Extra arguments go to ctest,
# e.g. `bash launch/test.sh -L unit`.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/setup.sh"
cd "$BUILD_DIR"
exec ctest --output-on-failure --no-label-summary --parallel "$(nproc)" "$@"
