#!/usr/bin/env bash
# Validates every Kubernetes object of both overlays offline with
# validate_manifests.mjs (npm kubernetes-models and its KEDA and
# prometheus-operator companions, pinned by package-lock.json and installed
# with `npm ci` into NPM_DIR on first use). Where kubectl is absent the
# overlays cannot be rendered: the base files are validated as written, and
# the output says so. Exit 77 (skipped) where node or npm is absent.
# SCRIPT (default validate_manifests.mjs; policy_check.mjs for the security
# policy) is the checker run on the same files.
#   validate_manifests_test.sh SOURCE_DIR NPM_DIR [SCRIPT]
set -euo pipefail
src=$1 npm_dir=$2 script=${3:-validate_manifests.mjs}
here="$src/tests/deploy"
for tool in node npm; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool not found (Debian: apt-get install nodejs npm)"; exit 77; }
done
node -e 'process.exit(Number(process.versions.node.split(".")[0]) >= 18 ? 0 : 1)' ||
  { echo "SKIP: node $(node --version) is older than 18 (package.json engines)"; exit 77; }

# shellcheck source=../util/npm_work.sh
. "$src/tests/util/npm_work.sh"
npm_work_prepare "$npm_dir" "" "--ignore-scripts --loglevel=error" \
  "$here/package.json" "$here/package-lock.json" "$here/$script" ||
  { echo "FAIL: npm ci (is the npm registry reachable?)"; exit 1; }
# ES modules resolve packages from the script's own directory (NPM_DIR); the
# rendered overlays go to a directory of this run's own.
out=$(mktemp -d "$npm_dir/render.XXXXXX")
trap 'rm -rf "$out"' EXIT
rules="$src/deploy/prometheus/pdserve.rules.yml"

if command -v kubectl >/dev/null; then
  for overlay in cpu gpu cpu-planner gpu-planner cpu-keda gpu-keda; do
    kubectl kustomize "$src/deploy/k8s/overlays/$overlay" > "$out/$overlay.yaml" 2> "$out/$overlay.err" ||
      { cat "$out/$overlay.err"; echo "FAIL: overlay $overlay does not render"; exit 1; }
    echo "== overlay $overlay (rendered by kubectl kustomize)"
    node "$npm_dir/$script" --rules "$rules" "$out/$overlay.yaml"
  done
else
  echo "== kubectl not found: validating the base files as written (overlay patches not applied)"
  for dir in base planner keda; do
    base="$src/deploy/k8s/$dir"
    files=$(sed -n 's/^- \(.*\.yaml\)$/\1/p' "$base/kustomization.yaml")
    [ "$dir" = base ] || files="$files $(sed -n 's/^- \(.*\.yaml\)$/..\/base\/\1/p' "$src/deploy/k8s/base/kustomization.yaml")"
    echo "-- base + ${dir}"
    (cd "$base" && node "$npm_dir/$script" --partial --rules "$rules" $files)
  done
fi
