#!/usr/bin/env bash
# Renders every kustomize overlay with `kubectl kustomize` (offline) and checks
# each holds the expected objects: cpu and gpu (no autoscaler), *-planner
# (the SLO planner and its RBAC), *-keda (KEDA ScaledObjects), never both
# autoscalers. Exit 77 (skipped) where kubectl is absent.
#   kustomize_render_test.sh SOURCE_DIR OUT_DIR
set -euo pipefail
src=$1 out=$2
if ! command -v kubectl >/dev/null; then
  echo "SKIP: kubectl not found (Debian: apt-get install kubernetes-client)"
  exit 77
fi
kubectl version --client 2>/dev/null | head -2 || true
# A directory of this run's own: two runs of one build may go at once.
mkdir -p "$out"
out=$(mktemp -d "$out/run.XXXXXX")
trap 'rm -rf "$out"' EXIT
overlays="cpu gpu cpu-planner gpu-planner cpu-keda gpu-keda"
for overlay in $overlays; do
  kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$out/$overlay.yaml" 2> "$out/$overlay.err" || {
    cat "$out/$overlay.err"; echo "FAIL: overlay $overlay does not render"; exit 1; }
  # The gpu overlay adds the NCCL port-range policies between the pools.
  policies=4 deployments=3 services=3 monitors=3 scaled=0 roles=0
  case "$overlay" in gpu*) policies=6 ;; esac
  case "$overlay" in
    *-planner) policies=$((policies + 1)) deployments=4 services=4 monitors=4 roles=1 ;;
    *-keda) scaled=2 ;;
  esac
  for want in "Deployment $deployments" "Service $services" "PodDisruptionBudget 2" "ServiceMonitor $monitors" \
              "ScaledObject $scaled" "NetworkPolicy $policies" "Role $roles" "RoleBinding $roles" \
              "ServiceAccount $roles" "ClusterRole 0" "ClusterRoleBinding 0" \
              "PrometheusRule 1" "ConfigMap 1" "PersistentVolumeClaim 1" "Namespace 1"; do
    set -- $want
    got=$(grep -c "^kind: $1\$" "$out/$overlay.yaml" || true)
    [ "$got" = "$2" ] || { echo "FAIL: overlay $overlay renders $got $1 objects, want $2"; exit 1; }
  done
  # Every object lands in the pdserve namespace, except the Namespace itself
  # (a RoleBinding's subject names the namespace at the same indentation).
  n_objects=$(grep -c '^kind:' "$out/$overlay.yaml")
  n_ns=$(grep -c '^  namespace: pdserve$' "$out/$overlay.yaml" || true)
  [ "$n_ns" = $((n_objects - 1 + roles)) ] || { echo "FAIL: overlay $overlay: $n_ns of $n_objects objects in namespace pdserve"; exit 1; }
  # The pools scale alone: no generated (content-hashed) ConfigMap whose
  # change would roll every Deployment at once; workers find the router by
  # the ConfigMap's fixed name and register themselves.
  refs=$(grep -A1 'configMapRef:' "$out/$overlay.yaml" | sed -n 's/^ *name: //p' | sort -u)
  [ "$refs" = "pdserve-config" ] || { echo "FAIL: overlay $overlay: ConfigMap references '$refs', want pdserve-config only"; exit 1; }
  echo "overlay $overlay: $n_objects objects"
done
# Exactly one autoscaler or none: the planner and KEDA would undo each other.
for overlay in $overlays; do
  if grep -q '^kind: ScaledObject$' "$out/$overlay.yaml" && grep -q 'pdserve_planner' "$out/$overlay.yaml"; then
    echo "FAIL: overlay $overlay has both KEDA and the planner"; exit 1
  fi
done
grep -q -- '--actuator=kubernetes' "$out/cpu-planner.yaml" || { echo "FAIL: cpu-planner: the planner does not scale"; exit 1; }
grep -q -- '--itl_slo=0.05' "$out/gpu-planner.yaml" || { echo "FAIL: gpu-planner: no GPU ITL SLO"; exit 1; }
grep -q 'threshold: "32768"' "$out/gpu-keda.yaml" || { echo "FAIL: gpu-keda: no GPU prefill threshold"; exit 1; }
grep -q -- '--backend=cpu' "$out/cpu.yaml" && grep -q -- '--threads=' "$out/cpu.yaml" || { echo "FAIL: cpu overlay args"; exit 1; }
! grep -q 'nvidia.com/gpu:' "$out/cpu.yaml" || { echo "FAIL: cpu overlay requests GPUs"; exit 1; }
grep -q -- '--backend=cuda' "$out/gpu.yaml" || { echo "FAIL: gpu overlay args"; exit 1; }
grep -q -- '--kv_transport=nccl' "$out/gpu.yaml" || { echo "FAIL: gpu overlay moves KV over tcp"; exit 1; }
! grep -q -- '--kv_transport=nccl' "$out/cpu.yaml" || { echo "FAIL: cpu overlay asks for nccl"; exit 1; }
n_gpu=$(grep -c '^ *nvidia.com/gpu: "1"$' "$out/gpu.yaml" || true)
# requests and limits of the prefill and decode containers
[ "$n_gpu" = 4 ] || { echo "FAIL: gpu overlay: $n_gpu nvidia.com/gpu entries, want requests and limits of both pools (4)"; exit 1; }
# The router runs the CPU image in every overlay.
for overlay in $overlays; do
  grep -q '^        image: pdserve-cpu:' "$out/$overlay.yaml" || { echo "FAIL: overlay $overlay: no pdserve-cpu image (router)"; exit 1; }
done
grep -q '^        image: pdserve-cuda:' "$out/gpu.yaml" || { echo "FAIL: gpu overlay: workers not on the CUDA image"; exit 1; }
echo OK
