#!/usr/bin/env bash
# SLO planner benchmark: one workload whose mix shifts in three phases,
#   prefill-heavy  long prompts, short answers;
#   decode-heavy   short prompts, long answers;
#   mixed          medium prompts and answers;
# served by a local cluster (deploy/local/cluster.sh, --threads 1 per worker)
# with the same worker budget, 3 workers, in three setups:
#   fixed 1P+2D, fixed 2P+1D, and pdserve_planner (--actuator=local, starting
#   from 1P+1D, --max_total_workers=3, at most 2 per pool).
# Each phase is its own pdserve_loadgen run (seeded, Poisson arrivals); the
# phases are sent back to back (a phase starts on time even while the last
# one's requests finish). Per phase and setup: SLO attainment (share of
# requests with TTFT <= --ttft_slo and mean ITL <= --itl_slo, failures
# counting as misses) and goodput (such requests per second).
# Setups alternate within each round (rotated between rounds), so they see
# the same background load; machine.txt records the load average before
# and after every phase. Writes $OUT/results.md (the table), $OUT/*.json,
# $OUT/planner-round*.jsonl (the planner's decisions) and, where python3
# has matplotlib (Debian: python3-matplotlib), $OUT/planner.png (decisions
# and pool sizes over time). Every process it starts is ended by pid.
#
#   bench/loadgen/planner_bench.sh [--bin BUILD_DIR] [--out DIR] [--rounds 1]
#       [--phase_s 90] [--setups "fixed_1p2d fixed_2p1d planner"] [--ttft_slo 4] [--itl_slo 0.15]
#       [--rate_scale 1]   # multiplies every phase's request rate
#       [--warmup_s 0]     # first this long of the mixed phase's load, not measured, for
#                          # every setup alike (the planner then starts from traffic it has seen)
#       [--router_flags "..."]  # extra router flags, for every setup alike
#                          # (e.g. --prefill_queue_seconds=0.5: the backlog waits at the router)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin="$root/build" out="" rounds=1 phase_s=90 setups="fixed_1p2d fixed_2p1d planner"
ttft_slo=4 itl_slo=0.15 rate_scale=1 warmup_s=0 router_flags=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --phase_s) phase_s=$2; shift 2 ;;
    --setups) setups=$2; shift 2 ;;
    --ttft_slo) ttft_slo=$2; shift 2 ;;
    --itl_slo) itl_slo=$2; shift 2 ;;
    --rate_scale) rate_scale=$2; shift 2 ;;
    --warmup_s) warmup_s=$2; shift 2 ;;
    --router_flags) router_flags=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-planner-bench.XXXXXX)
mkdir -p "$out"
loadgen="$bin/bench/loadgen/pdserve_loadgen"
cluster="$root/deploy/local/cluster.sh"

# shellcheck source=bench/loadgen/bench_lib.sh
. "$root/bench/loadgen/bench_lib.sh"
model="$out/model"
bench_model "$model" "$bin"
bench_machine_info "$out/machine.txt" "$root"
[ -z "$router_flags" ] || echo "router flags: $router_flags" >> "$out/machine.txt"

# name rate prompt_len output_len: sized for the bench model on this
# 2-core machine while it is shared with other work (measured at a load
# average of 15-16: one worker prefills ~180 prompt tokens/s; a decode
# worker streams ~80 tokens/s to one sequence, far less per sequence at 4),
# so that each phase saturates one pool of a 1-worker split. On an idle
# machine raise the rates (--rate_scale).
phases=(
  "prefill_heavy 0.6 uniform:192:320 fixed:8"
  "decode_heavy 0.5 uniform:16:48 uniform:96:160"
  "mixed 0.4 uniform:128:256 uniform:32:96"
)

planner_pid=""
cleanup() {
  if [ -n "$planner_pid" ]; then kill -TERM "$planner_pid" 2>/dev/null || true; wait "$planner_pid" 2>/dev/null || true; fi
  "$cluster" stop "$out/cluster" 2>/dev/null || true
}
trap cleanup EXIT

loadavg() { cut -d' ' -f1-3 /proc/loadavg; }

run_phases() {  # setup round router
  local i=0 start now pids=() name rate prompt output
  echo "$1 round $2: start $(date -u +%H:%M:%S), load average $(loadavg)" >> "$out/machine.txt"
  if [ "$warmup_s" != 0 ]; then
    # The last (mixed) phase's load, not measured; the first phase starts
    # on time while its requests finish, as at every phase change.
    read -r name rate prompt output <<<"${phases[${#phases[@]}-1]}"
    rate=$(python3 -c "print($rate * $rate_scale)")
    "$loadgen" --target="$3" --label="$1 warmup round $2" --json_out="$out/$1-warmup-round$2.json" \
      --arrival=poisson --rate="$rate" --duration_s="$warmup_s" --warmup_s=0 --concurrency=128 \
      --prompt_len="$prompt" --output_len="$output" --seed=100 --request_timeout_s=300 \
      --progress=false > "$out/$1-warmup-round$2.out" 2>&1 &
    pids+=($!)
    sleep "$warmup_s"
  fi
  start=$(date +%s.%N)
  echo "{\"setup\": \"$1\", \"round\": $2, \"start\": $start, \"phase_s\": $phase_s, \"warmup_s\": $warmup_s}" > "$out/$1-round$2.times.json"
  for p in "${phases[@]}"; do
    read -r name rate prompt output <<<"$p"
    rate=$(python3 -c "print($rate * $rate_scale)")
    now=$(date +%s.%N)
    sleep "$(python3 -c "print(max(0.0, $start + $i * $phase_s - $now))")"
    echo "  $name: load average $(loadavg) at start" >> "$out/machine.txt"
    "$loadgen" --target="$3" --label="$1 $name round $2" --json_out="$out/$1-$name-round$2.json" \
      --arrival=poisson --rate="$rate" --duration_s="$phase_s" --warmup_s=0 --concurrency=128 \
      --prompt_len="$prompt" --output_len="$output" --seed=$((i + 1)) --slo_ttft_s="$ttft_slo" \
      --slo_itl_s="$itl_slo" --request_timeout_s=300 --progress=false > "$out/$1-$name-round$2.out" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  for pid in "${pids[@]}"; do wait "$pid"; done
  echo "  end: load average $(loadavg)" >> "$out/machine.txt"
}

run_setup() {  # setup round
  local p d info router
  case "$1" in
    fixed_1p2d) p=1 d=2 ;;
    fixed_2p1d) p=2 d=1 ;;
    planner) p=1 d=1 ;;
    *) echo "unknown setup $1" >&2; exit 2 ;;
  esac
  rm -rf "$out/cluster"
  info=$("$cluster" start --model "$model" --prefill "$p" --decode "$d" --threads 1 \
           --work "$out/cluster" --bin "$bin" --router_flags "$router_flags")
  router=$(echo "$info" | sed -n 's/.*router=\([^ ]*\).*/\1/p')
  if [ "$1" = planner ]; then
    rm -f "$out/planner-round$2.jsonl"
    "$bin/planner/pdserve_planner" --actuator=local --cluster_work="$out/cluster" --cluster_sh="$cluster" \
      --ttft_slo="$ttft_slo" --itl_slo="$itl_slo" --latency_quantile=0.9 --interval=2s --window=20s \
      --min_prefill=1 --max_prefill=2 --min_decode=1 --max_decode=2 --max_total_workers=3 \
      --scale_up_cooldown=6s --scale_down_cooldown=10s --stabilization=8s --settle=10s \
      --forecast_horizon=4s --model_memory=60s --decisions_out="$out/planner-round$2.jsonl" \
      > "$out/planner-round$2.log" 2>&1 &
    planner_pid=$!
  fi
  run_phases "$1" "$2" "$router"
  if [ -n "$planner_pid" ]; then
    kill -TERM "$planner_pid"; wait "$planner_pid" || true; planner_pid=""
  fi
  "$cluster" stop "$out/cluster"
}

read -r -a order <<<"$setups"
for round in $(seq 1 "$rounds"); do
  for s in "${order[@]}"; do run_setup "$s" "$round"; done
  order=("${order[@]:1}" "${order[0]}")  # rotate: each setup takes each slot in turn
done

python3 "$root/bench/loadgen/planner_report.py" --out "$out" --ttft_slo "$ttft_slo" --itl_slo "$itl_slo" \
  --phases "$(for p in "${phases[@]}"; do echo "$p"; done | cut -d' ' -f1 | tr '\n' ' ')" \
  --setups "$setups" --rounds "$rounds"
plotted=0
case " $setups " in *" planner "*) ;; *) plotted=2 ;; esac  # no planner: nothing to plot
[ $plotted = 2 ] || for py in python3 /usr/bin/python3; do
  if "$py" -c "import matplotlib" 2>/dev/null; then
    "$py" "$root/bench/loadgen/planner_plot.py" --out "$out" --rounds "$rounds" --phase_s "$phase_s"
    plotted=1
    break
  fi
done
[ $plotted != 0 ] || echo "no python3 with matplotlib (Debian: apt-get install python3-matplotlib): no plot"

echo "results: $out/results.md"
