#!/usr/bin/env bash
# Installs the Debian 12 packages pdserve builds and tests with (only those
# missing). Uses sudo when not root.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git curl ca-certificates
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev openssl
  libabsl-dev prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev
  libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev
  python3-torch python3-numpy python3-jinja2
  # Deployment checks (tests/deploy, tests/integration/prometheus_test.cc):
  # promtool and a Prometheus server (on systemd machines the package also
  # enables a system service on :9090; the tests start their own process),
  # kubectl for `kubectl kustomize` (any kubectl will do), node and npm for
  # the offline Kubernetes schema validation.
  prometheus
  $(command -v kubectl >/dev/null || echo kubernetes-client)
  $(command -v node >/dev/null || echo nodejs) $(command -v npm >/dev/null || echo npm)
  # Tokenizers: PCRE2 (split regexes) and ICU (NFC normalization).
  libpcre2-dev libicu-dev
  # GPU emulation (gpu_emulation/): each emulated GPU thread is a fiber.
  libboost-context-dev
  # A compiler cache (deploy/local/build.sh, tests/gpu/make_kit.sh): the
  # CUDA build recompiles most of the default build's sources with the same
  # commands, and a rebuild after a small change recompiles what changed.
  ccache
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "installing: ${missing[*]}"
$SUDO apt-get update -q
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
