#!/usr/bin/env bash
# Installs what is missing, builds once, and runs every test with ctest.
# GPU tests (label gpu) skip themselves where no GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
deploy/local/build.sh
ctest --preset default -j "$(nproc)" "$@"
