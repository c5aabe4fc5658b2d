#!/usr/bin/env bash
# deploy/local/cluster.sh end to end: start 1 prefill + 1 decode, scale each
# pool out, watch with a local Prometheus (when installed), drain a decode
# worker, stop; every process it started must be gone afterwards.
#   cluster_sh_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d /tmp/pdserve-cluster-sh-test.XXXXXX)
cluster="$src/deploy/local/cluster.sh"
all_pids=""
cleanup() {
  "$cluster" stop "$work/c" || true
  for pid in $all_pids; do
    if kill -0 "$pid" 2>/dev/null; then echo "FAIL: pid $pid still running after stop"; kill -KILL "$pid"; fi
  done
  rm -rf "$work"
}
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }
pools() { "$cluster" status "$work/c" | sed -n 's/^router pools: //p'; }

"$build/tools/pdserve_make_model" --out_dir="$work/model" --seed=2 > /dev/null
"$cluster" start --model "$work/model" --work "$work/c" --bin "$build" --threads 1
all_pids=$(cat "$work/c/pids")
[ "$(pools)" = "prefill=1 decode=1" ] || { echo "FAIL: pools $(pools)"; exit 1; }

"$cluster" add-decode "$work/c"
"$cluster" add-prefill "$work/c"
all_pids=$(cat "$work/c/pids")
[ "$(pools)" = "prefill=2 decode=2" ] || { echo "FAIL: after scale-out: $(pools)"; exit 1; }

if command -v prometheus >/dev/null; then
  "$cluster" prometheus "$work/c"
  all_pids=$(cat "$work/c/pids")
  grep -q "127.0.0.1:$(field "$work/c/decode2.ready" metrics_port)" "$work/c/prometheus/targets/decode.json" ||
    { echo "FAIL: decode2 is not a Prometheus target"; exit 1; }
else
  echo "prometheus not installed: skipping the Prometheus step"
fi

"$build/router/pdserve_client" --router="$(field "$work/c/router.ready" grpc_address)" \
  --token_ids=1,2,3,4 --max_tokens=8 --ignore_eos > /dev/null
"$cluster" drain "$work/c" "$(field "$work/c/decode1.ready" pid)"
for _ in $(seq 1 50); do [ "$(pools)" = "prefill=2 decode=1" ] && break; sleep 0.1; done
[ "$(pools)" = "prefill=2 decode=1" ] || { echo "FAIL: after drain: $(pools)"; exit 1; }
if [ -d "$work/c/prometheus" ]; then
  ! grep -q "127.0.0.1:$(field "$work/c/decode1.ready" metrics_port)" "$work/c/prometheus/targets/decode.json" ||
    { echo "FAIL: the drained worker is still a Prometheus target"; exit 1; }
fi
"$build/router/pdserve_client" --router="$(field "$work/c/router.ready" grpc_address)" \
  --token_ids=1,2,3,4 --max_tokens=8 --ignore_eos > /dev/null
"$cluster" stop "$work/c"
echo OK
