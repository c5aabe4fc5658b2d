#!/usr/bin/env bash
# Router CPU per relayed token: what the router process spends (utime + stime
# from /proc/PID/stat) divided by the tokens it relayed
# (pdserve_generation_tokens_total), in four situations:
#   - idle: the cluster up, workers registered and heartbeating, no request;
#   - load at each of --rates requests/s on a local cluster of the demo model
#     (tools/demo_model): router + 1 prefill + 1 decode worker, token-id
#     prompts of 32 tokens and 256 output tokens each (pdserve_loadgen,
#     Poisson arrivals, ignore_eos);
#   - --slow_streams streams held open at one token a second each. Real decode
#     workers on a small machine cannot pace like that, so the router is given
#     a scripted worker pair instead (bench/paced_workers.cc: registers like
#     real workers, answers the same internal protocol, computes nothing):
#     this row measures the router alone;
#   - load at each of --paced_rates requests/s (the same requests as the load
#     rows) on the scripted pair pacing one token every --paced_interval_ms:
#     the router's cost per token at rates the demo model's workers do not
#     reach on a small machine, with no model computing beside it.
# Prints one table (rate, tokens/s relayed, open streams, router CPU seconds,
# µs per token, cores) and writes it to $OUT/router_cpu.md, with the machine,
# date, commit and load averages in $OUT/machine.txt, and where the router's
# CPU went in each window by thread name ($OUT/threads.txt: threads that
# ended inside a window are missing there, not from the table). Every
# process it starts is ended by pid.
#
# "open streams" is the mean number of requests open during the window: the
# sum of the requests' end-to-end times over the window (load rows), or the
# router's pdserve_requests_in_flight at the window's ends (slow streams).
#
#   bench/router_cpu.sh [--bin BUILD_DIR] [--tools_bin BUILD_DIR] [--out DIR]
#       [--rates "2 4 8"] [--duration_s 30] [--slow_streams 1000]
#       [--slow_window_s 30] [--idle_s 30] [--paced_rates "20"]   # "" or 0: no such rows
#       [--paced_interval_ms 20] [--label NAME] [--decode_flags "--stream_interval=4"]
# --bin: the router and workers (e.g. another checkout's build, to compare);
# --tools_bin: pdserve_loadgen and pdserve_paced_workers (default: this
# checkout's build). --decode_flags: extra flags of the demo model's decode
# worker (the load rows), e.g. --stream_interval=4 (tokens per message).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build" tools_bin="" out="" rates="2 4 8" duration=30 slow=1000 slow_window=30 idle=30
label="" paced_rates="20" paced_interval=20 decode_flags=""
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) bin=$2; shift 2 ;;
    --tools_bin) tools_bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --rates) rates=$2; shift 2 ;;
    --duration_s) duration=$2; shift 2 ;;
    --slow_streams) slow=$2; shift 2 ;;
    --slow_window_s) slow_window=$2; shift 2 ;;
    --idle_s) idle=$2; shift 2 ;;
    --label) label=$2; shift 2 ;;
    --paced_rates) paced_rates=$2; shift 2 ;;
    --paced_interval_ms) paced_interval=$2; shift 2 ;;
    --decode_flags) decode_flags=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$tools_bin" ] || tools_bin="$root/build"
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-router-cpu.XXXXXX)
[ -n "$label" ] || label=$(git -C "$(dirname "$bin")" rev-parse --short HEAD 2>/dev/null || echo "$bin")
mkdir -p "$out"
loadgen="$tools_bin/bench/loadgen/pdserve_loadgen"
paced="$tools_bin/bench/pdserve_paced_workers"
model="$root/tools/demo_model"
for f in "$bin/router/pdserve_router" "$loadgen" "$paced"; do
  [ -x "$f" ] || { echo "missing $f (build it first)" >&2; exit 1; }
done
clk_tck=$(getconf CLK_TCK)

# shellcheck source=bench/loadgen/bench_lib.sh
. "$root/bench/loadgen/bench_lib.sh"
bench_machine_info "$out/machine.txt" "$root"
echo "router and workers: $bin ($label); tools: $tools_bin; decode flags: ${decode_flags:-none}" >> "$out/machine.txt"

paced_pid="" loadgen_pid=""
cleanup() {
  if [ -n "$loadgen_pid" ]; then kill -TERM "$loadgen_pid" 2>/dev/null || true; wait "$loadgen_pid" 2>/dev/null || true; fi
  if [ -n "$paced_pid" ]; then kill -TERM "$paced_pid" 2>/dev/null || true; wait "$paced_pid" 2>/dev/null || true; fi
  "$root/deploy/local/cluster.sh" stop "$out/cluster" 2>/dev/null || true
}
trap cleanup EXIT

cpu_ticks() {  # pid: utime + stime in clock ticks (fields 14 and 15; comm has no spaces)
  awk '{print $14 + $15}' "/proc/$1/stat"
}
router_metric() {  # name: its value on the router's /metrics (0 if absent)
  curl -sf "http://127.0.0.1:$metrics_port/metrics" |
    awk -v m="$1" '$1 == m {v = $2} END {printf "%.0f\n", v}'
}
now_s() { date +%s.%N; }
thread_ticks() {  # pid: "tid name user_ticks system_ticks" per thread (one read of each)
  awk '{l = $0; a = index(l, "("); b = match(l, /\) [A-Za-z] /)
        name = substr(l, a + 1, b - a - 1); gsub(/ /, "_", name)
        split(substr(l, b + 2), f, " ")
        print $1, name, f[12], f[13]}' /proc/"$1"/task/*/stat 2>/dev/null || true
}
threads_row() {  # what before after: CPU seconds per thread name in the window
  {
    echo "## $1 (router CPU s by thread name, user + system; threads open at the window's end)"
    awk -v hz="$clk_tck" 'NR == FNR {u[$1] = $3; s[$1] = $4; next}
      {du = $3 - ($1 in u ? u[$1] : 0); ds = $4 - ($1 in s ? s[$1] : 0)
       user[$2] += du; sys[$2] += ds; n[$2]++}
      END {for (k in user) if (user[k] + sys[k] > 0)
             printf "%-18s %4d threads %8.2f s = %6.2f + %6.2f\n", k, n[k],
                    (user[k] + sys[k]) / hz, user[k] / hz, sys[k] / hz}' \
      "$2" "$3" | sort -k4 -rn
  } >> "$out/threads.txt"
}

rows="$out/rows.txt"
: > "$rows"
row() {  # what tokens open_streams cpu_ticks window_s
  awk -v what="$1" -v tok="$2" -v open="$3" -v ticks="$4" -v w="$5" -v hz="$clk_tck" 'BEGIN {
    cpu = ticks / hz
    us = tok > 0 ? sprintf("%.1f", cpu / tok * 1e6) : "-"
    printf "| %s | %.0f | %.0f | %.2f | %s | %.3f |\n", what, tok / w, open, cpu, us, cpu / w
  }' | tee -a "$rows"
}

start_cluster() {  # prefill decode
  local info
  info=$("$root/deploy/local/cluster.sh" start --model "$model" --prefill "$1" --decode "$2" \
           --threads 1 --work "$out/cluster" --bin "$bin" --decode_flags "$decode_flags")
  router=$(echo "$info" | sed -n 's/.*router=\([^ ]*\).*/\1/p')
  router_pid=$(head -1 "$out/cluster/pids")
  metrics_port=$(sed -n 's/.*"metrics_port":"\([^"]*\)".*/\1/p' "$out/cluster/router.ready")
  internal_port=$(sed -n 's/.*"internal_port":"\([^"]*\)".*/\1/p' "$out/cluster/router.ready")
  await_pools "$1" "$2"
}

await_pools() {  # prefill decode: until the router lists them (a loaded machine starts slowly)
  for _ in $(seq 1 120); do
    [ "$(router_metric 'pdserve_pool_workers{pool="prefill"}')" -ge "$1" ] &&
      [ "$(router_metric 'pdserve_pool_workers{pool="decode"}')" -ge "$2" ] && return 0
    sleep 1
  done
  echo "the router did not list $1 prefill and $2 decode workers within 120 s" >&2
  exit 1
}

measure_idle() {
  sleep 5  # start-up settles
  echo "load average before idle: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  local c0 c1
  thread_ticks "$router_pid" > "$out/th0"
  c0=$(cpu_ticks "$router_pid")
  sleep "$idle"
  c1=$(cpu_ticks "$router_pid")
  thread_ticks "$router_pid" > "$out/th1"
  threads_row "idle" "$out/th0" "$out/th1"
  row "idle" 0 0 $((c1 - c0)) "$idle"
}

measure_rate() {  # requests/s [what: the row's name]
  local what=${2:-$1 req/s}
  echo "load average before $what: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  local json="$out/rate$1${2:+_paced}.json" c0 c1 k0 k1 t0 t1 open
  thread_ticks "$router_pid" > "$out/th0"
  k0=$(router_metric pdserve_generation_tokens_total)
  t0=$(now_s)
  c0=$(cpu_ticks "$router_pid")
  "$loadgen" --target="$router" --arrival=poisson --rate="$1" --duration_s="$duration" \
    --warmup_s=0 --concurrency=512 --prompt_len=fixed:32 --output_len=fixed:256 \
    --vocab_size=2048 --seed=1 --request_timeout_s=300 --progress=false \
    --label="$what" --json_out="$json" > "${json%.json}.txt"
  c1=$(cpu_ticks "$router_pid")
  t1=$(now_s)
  k1=$(router_metric pdserve_generation_tokens_total)
  thread_ticks "$router_pid" > "$out/th1"
  threads_row "$what" "$out/th0" "$out/th1"
  open=$(jq -r --arg w "$(echo "$t1 - $t0" | bc -l)" \
    '.latency_s.e2e.mean * .latency_s.e2e.count / ($w | tonumber)' "$json")
  local failed
  failed=$(jq -r '.requests.failed' "$json")
  [ "$failed" = 0 ] || echo "warning: $failed requests failed at $what (see $json)" >&2
  row "$what" "$(echo "$k1 - $k0" | bc)" "$open" $((c1 - c0)) "$(echo "$t1 - $t0" | bc -l)"
}

start_paced() {  # token interval in ms: the scripted pair on a router without workers
  local ready="$out/paced.ready"
  rm -f "$ready"
  "$paced" --model_dir="$model" --router="127.0.0.1:$internal_port" \
    --cluster_token_file="$out/cluster/cluster_token" --token_interval_ms="$1" \
    --ready_file="$ready" > "$out/paced.log" 2>&1 &
  paced_pid=$!
  for _ in $(seq 1 600); do [ -s "$ready" ] && break; sleep 0.1; done
  [ -s "$ready" ] || { cat "$out/paced.log" >&2; exit 1; }
  await_pools 1 1
}
stop_paced() {
  kill -TERM "$paced_pid" 2>/dev/null || true
  wait "$paced_pid" 2>/dev/null || true
  paced_pid=""
}

measure_slow() {
  # Long enough to outlast the ramp and the window (the demo model's context
  # is 512); the client is stopped after the window (its cancellations are
  # not measured).
  local tokens=$((slow_window + 180)) c0 c1 p0 p1 k0 k1 o0 o1 e0 e1 t0 t1
  start_paced 1000
  # Every stream: 1 token at once (the prefill), then one a second.
  "$loadgen" --target="$router" --arrival=burst --max_requests="$slow" --rate=1 --duration_s=1 \
    --warmup_s=0 --concurrency="$slow" --prompt_len=fixed:32 --output_len="fixed:$tokens" \
    --vocab_size=2048 --seed=1 --request_timeout_s=$((tokens + 120)) --progress=false \
    --label="$slow slow streams" --json_out="$out/slow.json" > "$out/slow.txt" &
  loadgen_pid=$!
  for _ in $(seq 1 120); do
    [ "$(router_metric pdserve_requests_in_flight)" -ge "$slow" ] 2>/dev/null && break
    sleep 1
  done
  sleep 3  # the last streams' first tokens
  echo "load average before $slow slow streams: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
  thread_ticks "$router_pid" > "$out/th0"
  o0=$(router_metric pdserve_requests_in_flight)
  e0=$(router_metric 'pdserve_requests_total{finish_reason="error"}')
  k0=$(router_metric pdserve_generation_tokens_total)
  t0=$(now_s)
  c0=$(cpu_ticks "$router_pid")
  p0=$(cpu_ticks "$paced_pid")
  sleep "$slow_window"
  c1=$(cpu_ticks "$router_pid")
  p1=$(cpu_ticks "$paced_pid")
  t1=$(now_s)
  k1=$(router_metric pdserve_generation_tokens_total)
  o1=$(router_metric pdserve_requests_in_flight)
  e1=$(router_metric 'pdserve_requests_total{finish_reason="error"}')
  thread_ticks "$router_pid" > "$out/th1"
  threads_row "$slow slow streams" "$out/th0" "$out/th1"
  [ "$e0" = "$e1" ] || echo "warning: $((e1 - e0)) slow streams failed in the window" >&2
  echo "paced workers' CPU in the window: $(echo "($p1 - $p0) / $clk_tck" | bc -l | cut -c1-6) s" >> "$out/machine.txt"
  row "$slow slow streams, 1 token/s each" "$(echo "$k1 - $k0" | bc)" "$(echo "($o0 + $o1) / 2" | bc -l)" \
    $((c1 - c0)) "$(echo "$t1 - $t0" | bc -l)"
  kill -TERM "$loadgen_pid" 2>/dev/null || true
  wait "$loadgen_pid" 2>/dev/null || true
  loadgen_pid=""
}

echo "| $label | tokens/s relayed | open streams | router CPU s | µs per token | cores |"
echo "| --- | ---: | ---: | ---: | ---: | ---: |"
start_cluster 1 1
measure_idle
for rate in $rates; do measure_rate "$rate"; done
"$root/deploy/local/cluster.sh" stop "$out/cluster"
if [ "$slow" -gt 0 ]; then
  start_cluster 0 0
  measure_slow
  stop_paced
  "$root/deploy/local/cluster.sh" stop "$out/cluster"
fi
if [ -n "$paced_rates" ]; then
  start_cluster 0 0
  start_paced "$paced_interval"
  for rate in $paced_rates; do
    measure_rate "$rate" "$rate req/s, scripted workers, 1 token per $paced_interval ms"
  done
  stop_paced
fi
{
  echo "| $label | tokens/s relayed | open streams | router CPU s | µs per token | cores |"
  echo "| --- | ---: | ---: | ---: | ---: | ---: |"
  cat "$rows"
} > "$out/router_cpu.md"
echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
echo "results: $out/router_cpu.md, $out/machine.txt, $out/threads.txt" >&2
