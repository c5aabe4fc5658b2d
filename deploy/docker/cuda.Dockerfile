# syntax=docker/dockerfile:1
# pdserve for NVIDIA GPU nodes, on Debian 12 like the CPU image: Debian's
# packages for everything but CUDA, and CUDA, cuBLAS and NCCL from NVIDIA's
# CUDA apt repository for Debian 12 (x86_64). Two stages from the repository
# root:
#
#   docker build -f deploy/docker/cuda.Dockerfile --target build -t pdserve-cuda-build:0.1.0 .
#   docker build -f deploy/docker/cuda.Dockerfile -t pdserve-cuda:0.1.0 .
#
# `build` is the build image (compilers, nvcc, -dev packages, the source and
# a CMake "cuda" preset build: CUDA backend, Hopper, CMAKE_CUDA_ARCHITECTURES=90);
# the final stage is the runtime image: the binaries in /usr/local/bin, their
# Debian shared libraries and the CUDA runtime libraries, run as a non-root
# user. The driver (libcuda) comes from the node through the NVIDIA container
# runtime. Pick the CUDA release with --build-arg CUDA_VERSION=MAJOR.MINOR.
# deploy/k8s/overlays/gpu references it by name (pdserve-cuda:0.1.0).
# cuda.Dockerfile.dockerignore keeps build trees and models out of the context.

ARG CUDA_VERSION=13.0

# Debian 12 with NVIDIA's CUDA repository enabled (its keyring package).
FROM debian:12-slim AS cuda-apt
ADD https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb /tmp/
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates \
 && dpkg -i /tmp/cuda-keyring_1.1-1_all.deb \
 && rm -f /tmp/cuda-keyring_1.1-1_all.deb \
 && rm -rf /var/lib/apt/lists/*

FROM cuda-apt AS build
ARG CUDA_VERSION
RUN cuda=$(echo "$CUDA_VERSION" | tr . -) \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      build-essential cmake ninja-build pkg-config git \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libssl-dev \
      libabsl-dev prometheus-cpp-dev libcpp-httplib-dev nlohmann-json3-dev \
      libopenblas-dev libpcre2-dev libicu-dev \
      cuda-minimal-build-$cuda cuda-cudart-dev-$cuda libcublas-dev-$cuda libnccl-dev \
 && rm -rf /var/lib/apt/lists/* \
 && { [ -e /usr/local/cuda ] || ln -s "cuda-$CUDA_VERSION" /usr/local/cuda; } \
 && /usr/local/cuda/bin/nvcc --version
WORKDIR /src
COPY . .
# The servers, the client, the planner, the load generator and the model
# writer; no tests.
# The "cuda" preset expects nvcc at /usr/local/cuda/bin/nvcc.
RUN cmake --preset cuda -DPDSERVE_BUILD_TESTS=OFF \
 && cmake --build --preset cuda -j "$(nproc)" --target \
      pdserve_router_main pdserve_prefill_worker pdserve_decode_worker pdserve_colocated \
      pdserve_client pdserve_loadgen pdserve_make_model pdserve_planner \
 && install -d /opt/pdserve/bin \
 && install -m 0755 build-cuda/router/pdserve_router build-cuda/router/pdserve_client \
      build-cuda/prefill_worker/pdserve_prefill_worker build-cuda/decode_worker/pdserve_decode_worker \
      build-cuda/colocated/pdserve_colocated build-cuda/bench/loadgen/pdserve_loadgen \
      build-cuda/tools/pdserve_make_model build-cuda/planner/pdserve_planner /opt/pdserve/bin/

FROM cuda-apt AS runtime
ARG CUDA_VERSION
# The Debian libraries of the CPU image, plus the CUDA runtime, cuBLAS and NCCL.
RUN cuda=$(echo "$CUDA_VERSION" | tr . -) \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libgrpc++1.51 libprotobuf32 libabsl20220623 libprometheus-cpp-core1.0 \
      libcpp-httplib0.11 libopenblas0-pthread libgomp1 libpcre2-8-0 libicu72 \
      cuda-cudart-$cuda libcublas-$cuda libnccl2 \
 && rm -rf /var/lib/apt/lists/* \
 && { [ -e /usr/local/cuda ] || ln -s "cuda-$CUDA_VERSION" /usr/local/cuda; }
ENV LD_LIBRARY_PATH=/usr/local/cuda/lib64
# What the NVIDIA container runtime reads: the compute libraries of the
# driver, and no GPU unless one is given: Kubernetes' device plugin sets
# NVIDIA_VISIBLE_DEVICES to the GPUs a pod requested, `docker run --gpus`
# sets it too. A default of "all" would hand every GPU of the node to any
# container of this image that requested none.
ENV NVIDIA_VISIBLE_DEVICES=void NVIDIA_DRIVER_CAPABILITIES=compute,utility
COPY --from=build /opt/pdserve/bin/ /usr/local/bin/
# Fails the build if a shared library is missing (the driver's libcuda is
# mounted at run time).
RUN ! ldd /usr/local/bin/pdserve_* | grep 'not found' | grep -v 'libcuda\.so'
RUN useradd --system --uid 10001 --no-create-home pdserve
USER 10001
# Model weights are mounted here (deploy/k8s: the pdserve-model volume).
VOLUME ["/models"]
# gRPC, metrics, KV transfer (decode) as deploy/k8s uses them.
EXPOSE 50051 9400 50061
# Without arguments: the router's flags (exit 0). Deployments name the
# binary and its flags (deploy/k8s).
CMD ["/usr/local/bin/pdserve_router", "--help"]
