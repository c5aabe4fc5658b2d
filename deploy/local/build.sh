#!/usr/bin/env bash
# Installs dependencies and builds pdserve (CMake preset "default", ./build).
set -euo pipefail
cd "$(dirname "$0")/../.."
deploy/local/install_deps.sh
# shellcheck source=deploy/local/compiler_cache.sh
. deploy/local/compiler_cache.sh
cmake --preset default "${compiler_cache[@]}" >/dev/null
cmake --build --preset default -j "$(nproc)"
