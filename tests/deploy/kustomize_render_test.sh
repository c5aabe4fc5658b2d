#!/usr/bin/env bash
# Renders both kustomize overlays with `kubectl kustomize` (offline) and checks
# each holds the expected objects. Exit 77 (skipped) where kubectl is absent.
#   kustomize_render_test.sh SOURCE_DIR OUT_DIR
set -euo pipefail
src=$1 out=$2
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl not found (Debian: apt-get install kubernetes-client)"
  exit 77
fi
kubectl version --client 2>/dev/null | head -2 || true
mkdir -p "$out"
for overlay in cpu gpu; do
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$out/$overlay.yaml" 2> "$out/$overlay.err" || {
    cat "$out/$overlay.err"; echo "FAIL: overlay $overlay does not render"; exit 1; }
  # The gpu overlay adds the NCCL port-range policies between the pools.
  policies=4
  [ "$overlay" = gpu ] && policies=6
  for want in "Deployment 3" "Service 3" "PodDisruptionBudget 2" "ServiceMonitor 3" "ScaledObject 2" "NetworkPolicy $policies" \
              "PrometheusRule 1" "ConfigMap 1" "PersistentVolumeClaim 1" "Namespace 1"; do
    set -- $want
    got=$(grep -c "^kind: $1\$" "$out/$overlay.yaml" || true)
    [ "$got" = "$2" ] || { echo "FAIL: overlay $overlay renders $got $1 objects, want $2"; exit 1; }
  done
  # Every object lands in the pdserve namespace, except the Namespace itself.
  n_objects=$(grep -c '^kind:' "$out/$overlay.yaml")
  n_ns=$(grep -c '^  namespace: pdserve$' "$out/$overlay.yaml" || true)
  [ "$n_ns" = $((n_objects - 1)) ] || { echo "FAIL: overlay $overlay: $n_ns of $n_objects objects in namespace pdserve"; exit 1; }
  # The pools scale alone: no generated (content-hashed) ConfigMap whose
  # change would roll every Deployment at once; workers find the router by
  # the ConfigMap's fixed name and register themselves.
  refs=$(grep -A1 'configMapRef:' "$out/$overlay.yaml" | sed -n 's/^ *name: //p' | sort -u)
  [ "$refs" = "pdserve-config" ] || { echo "FAIL: overlay $overlay: ConfigMap references '$refs', want pdserve-config only"; exit 1; }
  echo "overlay $overlay: $n_objects objects"
done
grep -q -- '--backend=cpu' "$out/cpu.yaml" && grep -q -- '--threads=' "$out/cpu.yaml" || { echo "FAIL: cpu overlay args"; exit 1; }
! grep -q 'nvidia.com/gpu:' "$out/cpu.yaml" || { echo "FAIL: cpu overlay requests GPUs"; exit 1; }
grep -q -- '--backend=cuda' "$out/gpu.yaml" || { echo "FAIL: gpu overlay args"; exit 1; }
grep -q -- '--kv_transport=nccl' "$out/gpu.yaml" || { echo "FAIL: gpu overlay moves KV over tcp"; exit 1; }
! grep -q -- '--kv_transport=nccl' "$out/cpu.yaml" || { echo "FAIL: cpu overlay asks for nccl"; exit 1; }
n_gpu=$(grep -c '^ *nvidia.com/gpu: "1"$' "$out/gpu.yaml" || true)
# requests and limits of the prefill and decode containers
[ "$n_gpu" = 4 ] || { echo "FAIL: gpu overlay: $n_gpu nvidia.com/gpu entries, want requests and limits of both pools (4)"; exit 1; }
# The router runs the CPU image in every overlay.
for overlay in cpu gpu; do
  grep -q '^        image: pdserve-cpu:' "$out/$overlay.yaml" || { echo "FAIL: overlay $overlay: no pdserve-cpu image (router)"; exit 1; }
done
grep -q '^        image: pdserve-cuda:' "$out/gpu.yaml" || { echo "FAIL: gpu overlay: workers not on the CUDA image"; exit 1; }
echo OK
