# syntax=docker/dockerfile:1
# pdserve for CPU nodes, on Debian 12 with Debian's packages (the same ones
# deploy/local/install_deps.sh installs). Two stages from the repository root:
#
#   docker build -f deploy/docker/cpu.Dockerfile --target build -t pdserve-cpu-build:0.1.0 .
#   docker build -f deploy/docker/cpu.Dockerfile -t pdserve-cpu:0.1.0 .
#
# `build` is the build image (compilers, -dev packages, the source and a
# CMake "default" preset build); the final stage is the runtime image: the
# binaries in /usr/local/bin and their shared libraries, run as a non-root
# user. deploy/k8s/overlays/cpu references it by name (pdserve-cpu:0.1.0).
# cpu.Dockerfile.dockerignore keeps build trees and models out of the context.

FROM debian:12 AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git ca-certificates \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev \
      libabsl-dev prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev \
      libopenblas-dev libpcre2-dev libicu-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The servers, the client, the planner, the load generator and the model
# writer; no tests.
RUN cmake --preset default -DPDSERVE_BUILD_TESTS=OFF \
 && cmake --build --preset default -j "$(nproc)" --target \
      pdserve_router_main pdserve_prefill_worker pdserve_decode_worker pdserve_colocated \
      pdserve_client pdserve_loadgen pdserve_make_model pdserve_planner \
 && install -d /opt/pdserve/bin \
 && install -m 0755 build/router/pdserve_router build/router/pdserve_client \
      build/prefill_worker/pdserve_prefill_worker build/decode_worker/pdserve_decode_worker \
      build/colocated/pdserve_colocated build/bench/loadgen/pdserve_loadgen \
      build/tools/pdserve_make_model build/planner/pdserve_planner /opt/pdserve/bin/

FROM debian:12-slim AS runtime
# Shared libraries of the binaries above (ldd), by Debian package; libgrpc29
# (with c-ares, re2, OpenSSL, zlib) comes in as a dependency of libgrpc++1.51.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-core1.0 \
      libcpp-httplib0.11 libopenblas0-pthread libgomp1 libpcre2-8-0 libicu72 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/pdserve/bin/ /usr/local/bin/
# Fails the build if a shared library is missing from the list above.
RUN ! ldd /usr/local/bin/pdserve_* | grep 'not found'
RUN useradd --system --uid 10001 --no-create-home pdserve
USER 10001
# Model weights are mounted here (deploy/k8s: the pdserve-model volume).
VOLUME ["/models"]
# gRPC, metrics, KV transfer (decode) as deploy/k8s uses them.
EXPOSE 50051 9400 50061
# Without arguments: the router's flags (exit 0). Deployments name the
# binary and its flags (deploy/k8s).
CMD ["/usr/local/bin/pdserve_router", "--help"]
