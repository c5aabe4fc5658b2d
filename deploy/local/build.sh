#!/usr/bin/env bash
# Installs dependencies and builds pdserve (CMake preset "default", ./build).
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/install_deps.sh
cmake --preset default >/dev/null
cmake --build --preset default -j "$(nproc)"
