#!/usr/bin/env bash
# Serving benchmark: one seeded workload (bench/loadgen) against
#   - a disaggregated local cluster: router + 1 prefill + 1 decode worker,
#     --threads=1 each (two compute cores in all), KV over TCP on loopback;
#   - pdserve_colocated --threads=1 (one core: same threads per process);
#   - pdserve_colocated --threads=2 (two cores: same cores in all), with the
#     default OpenMP wait policy (spinning) and with OMP_WAIT_POLICY=passive.
# Writes $OUT/results.md (one Markdown row per run), $OUT/histograms.md (the
# server's TTFT and ITL histogram quantiles against the measured percentiles,
# one row per run), $OUT/*.json (full reports) and $OUT/machine.txt. Every
# process it starts is ended by pid.
#
# Setups alternate within each repeat, so on a shared machine they see the
# same background load; machine.txt records the load average before each run.
#
#   bench/loadgen/serving_bench.sh [--bin BUILD_DIR] [--out DIR] [--rates "0.5 1"]
#       [--duration_s 30] [--repeats 2] [--setups "disagg colocated1 colocated2 colocated2p"]
#       [--prompt_len uniform:64:256] [--output_len normal:64:16:16:128]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/build" out="" rates="0.5 1.0" duration=30 repeats=2 setups="disagg colocated1 colocated2 colocated2p"
prompt_len="uniform:64:256" output_len="normal:64:16:16:128"
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --duration_s) duration=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --setups) setups=$2; shift 2 ;;
    --prompt_len) prompt_len=$2; shift 2 ;;
    --output_len) output_len=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-serving-bench.XXXXXX)
mkdir -p "$out"
loadgen="$bin/bench/loadgen/pdserve_loadgen"

# shellcheck source=bench/loadgen/bench_lib.sh
. "$root/bench/loadgen/bench_lib.sh"
model="$out/model"
bench_model "$model" "$bin"
bench_machine_info "$out/machine.txt" "$root"

run_load() {  # target label json rate metrics_port
  echo "load average before '$2': $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  "$loadgen" --target="$1" --label="$2" --json_out="$3" --markdown_out="$out/results.md" \
    --metrics_target="127.0.0.1:$5" --histogram_markdown_out="$out/histograms.md" \
    --arrival=poisson --rate="$4" --duration_s="$duration" --warmup_s=5 --concurrency=64 \
    --prompt_len="$prompt_len" --output_len="$output_len" --seed=1 \
    --slo_ttft_s=1.0 --slo_itl_s=0.025 --request_timeout_s=120 --progress=false
}

colocated_pid=""
cleanup() {
  if [ -n "$colocated_pid" ]; then kill -TERM "$colocated_pid" 2>/dev/null || true; wait "$colocated_pid" || true; fi
  "$root/deploy/local/cluster.sh" stop "$out/cluster" 2>/dev/null || true
}
trap cleanup EXIT

run_disagg() {  # rate repeat
  local info router
  info=$("$root/deploy/local/cluster.sh" start --model "$model" --prefill 1 --decode 1 --threads 1 \
           --work "$out/cluster" --bin "$bin")
  router=$(echo "$info" | sed -n 's/.*router=\([^ ]*\).*/\1/p')
  run_load "$router" "disaggregated 1P+1D (1 thread each), $1 req/s, run $2" "$out/disagg-rate$1-run$2.json" "$1" \
    "$(sed -n 's/.*"metrics_port":"\([^"]*\)".*/\1/p' "$out/cluster/router.ready")"
  "$root/deploy/local/cluster.sh" stop "$out/cluster"
}

run_colocated() {  # threads rate repeat [wait_policy]
  local ready="$out/colocated-t$1.ready" target name="colocated-t$1${4:+-$4}"
  local label="colocated ($1 thread$([ "$1" = 1 ] || echo s)${4:+, OMP_WAIT_POLICY=$4})"
  rm -f "$ready"
  env ${4:+OMP_WAIT_POLICY=$4} "$bin/colocated/pdserve_colocated" --model_dir="$model" --threads="$1" \
    --ready_file="$ready" > "$out/$name.log" 2>&1 &
  colocated_pid=$!
  for _ in $(seq 1 300); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { cat "$out/$name.log" >&2; exit 1; }
  target=$(sed -n 's/.*"grpc_address":"\([^"]*\)".*/\1/p' "$ready")
  run_load "$target" "$label, $2 req/s, run $3" "$out/$name-rate$2-run$3.json" "$2" \
    "$(sed -n 's/.*"metrics_port":"\([^"]*\)".*/\1/p' "$ready")"
  kill -TERM "$colocated_pid"
  wait "$colocated_pid" || true  # it drains (no streams left) and exits
  colocated_pid=""
}

for rate in $rates; do
  for repeat in $(seq 1 "$repeats"); do
    for setup in $setups; do
      case "$setup" in
        disagg) run_disagg "$rate" "$repeat" ;;
        colocated1) run_colocated 1 "$rate" "$repeat" ;;
        colocated2) run_colocated 2 "$rate" "$repeat" ;;
        colocated2p) run_colocated 2 "$rate" "$repeat" passive ;;
        *) echo "unknown setup $setup" >&2; exit 2 ;;
      esac
    done
  done
done
cat "$out/machine.txt"
cat "$out/results.md"
cat "$out/histograms.md"
echo "results in $out"
