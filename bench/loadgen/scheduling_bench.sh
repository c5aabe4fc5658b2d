#!/usr/bin/env bash
# Scheduling benchmarks (docs/performance.md, "Scheduling"): seeded
# pdserve_loadgen workloads against local clusters (deploy/local/cluster.sh)
# and the colocated baseline, one setting changed per pair of runs:
#
#   prefix     a 1,000-token system prompt (or several) and short questions,
#              router + 3 prefill workers + 1 decode worker: prefix cache
#              and prefix-aware routing off, cache on with least-loaded
#              routing, both on. Reports TTFT and the prompt tokens the
#              prefill workers computed (prompt tokens - prefix cache hits).
#   occupancy  a decode worker with a fixed KV budget, requests asking for
#              512 tokens that mostly stop far earlier (the client ends each
#              stream at its planned length): whole-request reservation
#              against lazy growth. Reports goodput, rejections, the mean
#              decode batch and preemptions.
#   chunked    pdserve_colocated with long prompts arriving while streams
#              run: whole prompts in steps of their own against chunks mixed
#              into decode steps under a 64- or 256-token step budget.
#              Reports ITL p99.
#
# Writes $OUT/<experiment>.md (loadgen rows), $OUT/<experiment>-workers.md
# (worker counters over each run, warm-up included), $OUT/*.json and
# $OUT/machine.txt (with the load average before each run). Every process it
# starts is ended by pid.
#
#   bench/loadgen/scheduling_bench.sh [--bin BUILD_DIR] [--out DIR] [--experiments "prefix occupancy chunked"]
#       [--duration_s 60] [--threads 1]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/build" out="" experiments="prefix occupancy chunked" duration=60 threads=1
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --experiments) experiments=$2; shift 2 ;;
    --duration_s) duration=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-scheduling-bench.XXXXXX)
mkdir -p "$out"
loadgen="$bin/bench/loadgen/pdserve_loadgen"
cluster="$root/deploy/local/cluster.sh"

# The serving benchmark's model (bench_lib.sh: 23.5M parameters, f32).
# shellcheck source=bench/loadgen/bench_lib.sh
. "$root/bench/loadgen/bench_lib.sh"
model="$out/model"
bench_model "$model" "$bin"
bench_machine_info "$out/machine.txt" "$root"

colocated_pid=""
cleanup() {
  if [ -n "$colocated_pid" ]; then kill -TERM "$colocated_pid" 2>/dev/null || true; wait "$colocated_pid" || true; fi
  "$cluster" stop "$out/cluster" 2>/dev/null || true
}
trap cleanup EXIT

json_field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }

# Sum of a metric (every series of that name) over the /metrics of ports.
metric_sum() {  # name port...
  local name=$1 port total=0 v
  shift
  for port in "$@"; do
    v=$(curl -sf "http://127.0.0.1:$port/metrics" | awk -v n="$name" '$1 == n { s += $2 } END { print s + 0 }')
    total=$(awk -v a="$total" -v b="$v" 'BEGIN { print a + b }')
  done
  echo "$total"
}

run_load() {  # experiment target label metrics_port loadgen-flags...
  local experiment=$1 target=$2 label=$3 metrics_port=$4
  shift 4
  echo "load average before '$label': $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  "$loadgen" --target="$target" --label="$label" --json_out="$out/$experiment-${label//[^A-Za-z0-9]/_}.json" \
    --markdown_out="$out/$experiment.md" --metrics_target="127.0.0.1:$metrics_port" \
    --arrival=poisson --duration_s="$duration" --warmup_s=10 --concurrency=64 --seed=1 \
    --request_timeout_s=120 --progress=false "$@"
}

start_cluster() {  # prefill decode router_flags prefill_flags decode_flags
  "$cluster" start --model "$model" --prefill "$1" --decode "$2" --threads "$threads" \
    --work "$out/cluster" --bin "$bin" --router_flags "$3" --prefill_flags "$4" --decode_flags "$5" |
    sed -n 's/.*router=\([^ ]*\).*/\1/p'
}
ports_of() {  # role
  for f in "$out/cluster/$1"*.ready; do json_field "$f" metrics_port; done
}

# --- prefix ------------------------------------------------------------------
prefix_run() {  # label prefixes prefill_kv_blocks router_policy caching
  local router
  router=$(start_cluster 3 1 "--routing_policy=$4" \
    "--enable_prefix_caching=$5 --num_kv_blocks=$3" "")
  run_load prefix "$router" "$1" "$(json_field "$out/cluster/router.ready" metrics_port)" \
    --rate=0.3 --shared_prefix_len=1000 --num_shared_prefixes="$2" \
    --prompt_len=uniform:16:64 --output_len=fixed:16 --slo_ttft_s=1.0 --slo_itl_s=0.1
  # shellcheck disable=SC2046
  local prompt hits
  prompt=$(metric_sum pdserve_prefill_prompt_tokens_total $(ports_of prefill))
  # shellcheck disable=SC2046
  hits=$(metric_sum pdserve_prefix_cache_hits_total $(ports_of prefill))
  [ -f "$out/prefix-workers.md" ] || {
    echo "| setup | prompt tokens | prefix cache hits | prompt tokens computed | computed share |"
    echo "| --- | ---: | ---: | ---: | ---: |"
  } > "$out/prefix-workers.md"
  awk -v l="$1" -v p="$prompt" -v h="$hits" \
    'BEGIN { printf "| %s | %d | %d | %d | %.1f%% |\n", l, p, h, p - h, (p > 0 ? 100 * (p - h) / p : 0) }' \
    >> "$out/prefix-workers.md"
  "$cluster" stop "$out/cluster"
}

# --- occupancy -----------------------------------------------------------------
occupancy_run() {  # label headroom
  local router decode
  router=$(start_cluster 1 1 "" "" "--num_kv_blocks=128 --max_running=64 --decode_kv_headroom_tokens=$2")
  decode=$(ports_of decode)
  run_load occupancy "$router" "$1" "$(json_field "$out/cluster/router.ready" metrics_port)" \
    --rate=4 --prompt_len=uniform:32:96 --output_len=exponential:40:4:480 --max_tokens=512 \
    --slo_ttft_s=2.0 --slo_itl_s=0.1
  [ -f "$out/occupancy-workers.md" ] || {
    echo "| setup | admitted | refused | preemptions | mean decode batch | decode steps |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  } > "$out/occupancy-workers.md"
  awk -v l="$1" -v a="$(metric_sum pdserve_decode_requests_admitted_total "$decode")" \
    -v r="$(metric_sum pdserve_decode_requests_rejected_total "$decode")" \
    -v p="$(metric_sum pdserve_preemptions_total "$decode")" \
    -v s="$(metric_sum pdserve_decode_batch_size_sum "$decode")" \
    -v c="$(metric_sum pdserve_decode_batch_size_count "$decode")" \
    'BEGIN { printf "| %s | %d | %d | %d | %.2f | %d |\n", l, a, r, p, (c > 0 ? s / c : 0), c }' \
    >> "$out/occupancy-workers.md"
  "$cluster" stop "$out/cluster"
}

# --- chunked -------------------------------------------------------------------
chunked_run() {  # label chunk step_tokens
  local ready="$out/colocated.ready" target
  rm -f "$ready"
  "$bin/colocated/pdserve_colocated" --model_dir="$model" --threads="$threads" \
    --max_prefill_chunk_tokens="$2" --max_prefill_tokens="$3" --ready_file="$ready" \
    > "$out/colocated-chunk$2.log" 2>&1 &
  colocated_pid=$!
  for _ in $(seq 1 300); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { cat "$out/colocated-chunk$2.log" >&2; exit 1; }
  target=$(json_field "$ready" grpc_address)
  run_load chunked "$target" "$1" "$(json_field "$ready" metrics_port)" \
    --rate=0.5 --prompt_len=uniform:64:1024 --output_len=normal:96:24:32:160 \
    --slo_ttft_s=3.0 --slo_itl_s=0.1
  kill -TERM "$colocated_pid"
  wait "$colocated_pid" || true
  colocated_pid=""
}

for experiment in $experiments; do
  case "$experiment" in
    prefix)
      prefix_run "1 system prompt: no prefix cache, least-loaded routing" 1 0 least_loaded false
      prefix_run "1 system prompt: prefix cache, least-loaded routing" 1 0 least_loaded true
      prefix_run "1 system prompt: prefix cache, prefix-aware routing" 1 0 prefix_aware true
      # Six system prompts; 256 KV blocks (4,096 tokens) per prefill worker
      # hold about three of them besides the prompts being computed.
      prefix_run "6 system prompts, 256 blocks each: no prefix cache, least-loaded" 6 256 least_loaded false
      prefix_run "6 system prompts, 256 blocks each: prefix cache, least-loaded" 6 256 least_loaded true
      prefix_run "6 system prompts, 256 blocks each: prefix cache, prefix-aware" 6 256 prefix_aware true
      ;;
    occupancy)
      occupancy_run "whole-request reservation (headroom -1)" -1
      occupancy_run "lazy growth (headroom 32 tokens)" 32
      ;;
    chunked)
      # The step budget bounds what a decode step carries besides decodes.
      chunked_run "whole prompts in steps of their own (budget 4,096)" 0 4096
      chunked_run "chunks mixed into decode steps (budget 64 tokens)" 64 64
      chunked_run "chunks mixed into decode steps (budget 256 tokens)" 256 256
      ;;
    *) echo "unknown experiment $experiment" >&2; exit 2 ;;
  esac
done
cat "$out/machine.txt"
for f in "$out"/*.md; do echo "== $(basename "$f")"; cat "$f"; done
echo "results in $out"
