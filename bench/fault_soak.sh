#!/usr/bin/env bash
# Fault soak: sustained load on a local cluster (deploy/local/cluster.sh)
# while worker processes are killed (-9) at random and restarted, for N
# minutes. Prints the resident memory of every process before and after,
# the load generator's request outcomes, and the router's retry, migration
# and failure counters. Not run in CI (minutes long, timing-dependent).
#
#   bench/fault_soak.sh [--minutes 10] [--model tools/demo_model] [--bin build]
#       [--work /tmp/pdserve-soak] [--rate 20] [--kill_every_s 20] [--seed 1]
#
# Two prefill and two decode workers; at most one worker is down at a time,
# so each pool always keeps one. A killed worker is restarted after 1-3 s
# (cluster.sh add-prefill/add-decode). Requests: Poisson arrivals at --rate,
# 64-token prompts, 128 tokens out, seeded sampling.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
minutes=10 ; model="$root/tools/demo_model" ; bin="$root/build" ; work=/tmp/pdserve-soak
rate=20 ; kill_every=20 ; seed=1
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes) minutes=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --kill_every_s) kill_every=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cluster="$root/deploy/local/cluster.sh"
RANDOM=$seed
json_field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }
rss_kb() { sed -n 's/^VmRSS:\s*\([0-9]*\) kB/\1/p' "/proc/$1/status" 2>/dev/null || true; }
live_pid() {  # ready file -> pid if running
  local pid
  pid=$(json_field "$1" pid)
  kill -0 "$pid" 2>/dev/null && echo "$pid"
}
print_rss() {  # label
  local f pid
  for f in "$work"/*.ready; do
    pid=$(live_pid "$f") || continue
    printf '%-8s %-10s pid=%-8s rss=%s kB\n' "$1" "$(basename "$f" .ready)" "$pid" "$(rss_kb "$pid")"
  done
}
router_counters() {
  curl -sf "http://127.0.0.1:$(json_field "$work/router.ready" metrics_port)/metrics" |
    grep -E '^pdserve_(retries|migrations|worker_failures|requests)_total' || true
}

rm -rf "$work"
mkdir -p "$work"
trap '"$cluster" stop "$work"' EXIT
"$cluster" start --model "$model" --prefill 2 --decode 2 --work "$work" --bin "$bin" --threads 1 \
  --router_flags "--stall_timeout_ms=5000"
router=$(json_field "$work/router.ready" grpc_address)
vocab=$(sed -n 's/.*"vocab_size": *\([0-9]*\).*/\1/p' "$model/config.json")
echo "== before"
print_rss before | tee "$work/rss_before.txt"

duration=$((minutes * 60))
"$bin/bench/loadgen/pdserve_loadgen" --target="$router" --duration_s="$duration" --warmup_s=0 \
  --rate="$rate" --arrival=poisson --concurrency=256 --prompt_len=fixed:64 --output_len=fixed:128 \
  --temperature=0.8 --vocab_size="${vocab:-256}" --request_timeout_s=120 --progress=false \
  --json_out="$work/loadgen.json" > "$work/loadgen.txt" 2>&1 &
loadgen=$!

kills=0
end=$(($(date +%s) + duration))
while [ "$(date +%s)" -lt $((end - 5)) ]; do
  sleep $((kill_every / 2 + RANDOM % (kill_every + 1)))
  [ "$(date +%s)" -lt $((end - 5)) ] || break
  role=$([ $((RANDOM % 2)) -eq 0 ] && echo prefill || echo decode)
  victims=()
  for f in "$work/$role"*.ready; do
    pid=$(live_pid "$f") && victims+=("$pid")
  done
  [ ${#victims[@]} -ge 2 ] || continue  # keep one worker per pool
  pid=${victims[$((RANDOM % ${#victims[@]}))]}
  kill -KILL "$pid"
  sed -i "/^$pid\$/d" "$work/pids"  # gone: cluster.sh stop must not signal a reused pid
  kills=$((kills + 1))
  echo "$(date -u +%T) kill -9 $role pid $pid"
  sleep $((1 + RANDOM % 3))
  "$cluster" "add-$role" "$work" | sed 's/^/  restarted /'
done
wait $loadgen || echo "loadgen exited with $?"

echo "== after ($kills workers killed and restarted in $minutes min)"
print_rss after | tee "$work/rss_after.txt"
echo "== load generator"
cat "$work/loadgen.txt"
echo "== router counters"
router_counters
