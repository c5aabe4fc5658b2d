#!/usr/bin/env bash
# pdserve_planner end to end on a local cluster (deploy/local/cluster.sh):
#   1. 1 prefill + 1 decode worker under load with an ITL SLO the decode
#      worker cannot meet: the planner adds a decode worker (reason
#      slo_breached), exports desired_replicas{pool="decode"} 2;
#   2. a planner with an SLO the cluster meets easily, under load again:
#      it drains one decode worker (spare_capacity), and no request of
#      either load fails.
# Every process is ended by pid; every wait is bounded.
#   planner_local_test.sh SOURCE_DIR BUILD_DIR
set -euo pipefail
src=$1 build=$2
work=$(mktemp -d /tmp/pdserve-planner-test.XXXXXX)
cluster="$src/deploy/local/cluster.sh"
planner_pid="" load_pid=""
stop_pid() { [ -z "$1" ] || { kill -TERM "$1" 2>/dev/null || true; wait "$1" 2>/dev/null || true; }; }
cleanup() {
  stop_pid "$load_pid"
  stop_pid "$planner_pid"
  "$cluster" stop "$work/c" || true
  rm -rf "$work"
}
trap cleanup EXIT
field() { sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"; }
pools() { "$cluster" status "$work/c" | sed -n 's/^router pools: //p'; }
fail() { echo "FAIL: $*"; for f in "$work"/planner*.log; do echo "--- $f"; tail -30 "$f"; done; exit 1; }

"$build/tools/pdserve_make_model" --out_dir="$work/model" --seed=3 > /dev/null
"$cluster" start --model "$work/model" --work "$work/c" --bin "$build" --threads 1 > /dev/null
router=$(field "$work/c/router.ready" grpc_address)
[ "$(pools)" = "prefill=1 decode=1" ] || fail "pools $(pools)"

start_planner() {  # name itl_slo
  "$build/planner/pdserve_planner" --actuator=local --cluster_work="$work/c" --cluster_sh="$cluster" \
    --interval=1s --window=4s --ttft_slo=60 --itl_slo="$2" --min_decode=1 --max_decode=2 \
    --max_prefill=1 --scale_up_cooldown=2s --scale_down_cooldown=2s --stabilization=3s \
    --forecast_horizon=2s --settle=2s --decisions_out="$work/$1.jsonl" \
    --ready_file="$work/$1.ready" > "$work/$1.log" 2>&1 &
  planner_pid=$!
  for _ in $(seq 1 100); do [ -s "$work/$1.ready" ] && return 0; sleep 0.1; done
  fail "planner $1 not ready"
}
start_load() {  # name seconds
  "$build/bench/loadgen/pdserve_loadgen" --target="$router" --rate=6 --duration_s="$2" --warmup_s=0 \
    --concurrency=16 --prompt_len=fixed:24 --output_len=fixed:48 --seed=7 --progress=false \
    --request_timeout_s=60 --json_out="$work/$1.json" > "$work/$1.out" 2>&1 &
  load_pid=$!
}
wait_pools() {  # want seconds
  for _ in $(seq 1 $(($2 * 10))); do [ "$(pools)" = "$1" ] && return 0; sleep 0.1; done
  return 1
}
no_failures() {  # name
  wait "$load_pid"; load_pid=""
  local failed
  failed=$(python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['requests']; print(r['failed'], r['succeeded'])" "$work/$1.json")
  echo "$1: failed, succeeded = $failed"
  [ "${failed%% *}" = 0 ] && [ "${failed##* }" -gt 0 ] || fail "$1: requests failed ($failed)"
}

# 1. ITL SLO of 0.1 ms: no decode worker meets it under load.
start_planner planner1 0.0001
start_load load1 40
wait_pools "prefill=1 decode=2" 60 || fail "the planner did not add a decode worker: $(pools)"
grep -q 'planner: decode 1 -> 2 (slo_breached' "$work/planner1.log" || fail "no slo_breached decision logged"
metrics=$(field "$work/planner1.ready" metrics_port)
# Read the page whole first: grep -q stops reading at its match, and under
# pipefail curl's broken pipe would fail the check.
page=$(curl -sf "http://127.0.0.1:$metrics/metrics") || fail "planner metrics unreadable"
grep -q '^pdserve_planner_desired_replicas{pool="decode"} 2' <<< "$page" ||
  fail "desired_replicas of decode is not 2"
# The router counts the max_tokens it admits (48 each here); the planner
# reads them and learns the share answers use (all 48 tokens: about 1).
python3 - "$page" <<'PY' || fail "the planner's max_tokens inputs are not on its page"
import math, re, sys
page = sys.argv[1]
def value(name):
    m = re.search(r'^pdserve_planner_input\{name="%s"\} (\S+)$' % name, page, re.M)
    return float(m.group(1)) if m else math.nan
requested, share = value("mean_requested_tokens"), value("decode_answer_share")
print(f"mean_requested_tokens={requested} decode_answer_share={share}")
sys.exit(0 if requested > 0 and 0 < share <= 1 else 1)
PY
sleep 3  # at its maximum now: nothing more may happen
[ "$(pools)" = "prefill=1 decode=2" ] || fail "pools moved past the maximum: $(pools)"
stop_pid "$planner_pid"; planner_pid=""
no_failures load1

# 2. ITL SLO of 10 s: one decode worker is plenty; it is drained under load.
start_load load2 30
start_planner planner2 10
wait_pools "prefill=1 decode=1" 60 || fail "the planner did not scale decode down: $(pools)"
grep -q 'planner: decode 2 -> 1 (spare_capacity' "$work/planner2.log" || fail "no spare_capacity decision logged"
grep -q 'planner: draining decode' "$work/planner2.log" || fail "no drain logged"
no_failures load2
stop_pid "$planner_pid"; planner_pid=""
echo OK
