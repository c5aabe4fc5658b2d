#!/usr/bin/env bash
# Starts a local pdserve cluster on loopback: a router, N prefill workers and
# M decode workers, every port picked by the kernel. Prints the router address
# and writes the pids it started to $WORK/pids; `cluster.sh stop WORK` ends
# exactly those processes.
#
#   deploy/local/cluster.sh start --model DIR [--prefill N] [--decode M] [--work DIR] [--bin DIR]
#   deploy/local/cluster.sh stop WORK
set -euo pipefail

wait_ready() {  # file pid name
  for _ in $(seq 1 600); do
    [ -s "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "$3 exited; its log:" >&2; cat "${1%.ready}.log" >&2; return 1; }
    sleep 0.1
  done
  echo "$3 not ready after 60 s" >&2
  return 1
}

json_field() {  # file key
  sed -n "s/.*\"$2\":\"\([^\"]*\)\".*/\1/p" "$1"
}

stop_cluster() {
  local work=$1
  [ -f "$work/pids" ] || return 0
  # Workers first, router last; SIGTERM drains, SIGKILL after 15 s.
  tac "$work/pids" | while read -r pid; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 150); do
    alive=0
    while read -r pid; do kill -0 "$pid" 2>/dev/null && alive=1; done < "$work/pids"
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  while read -r pid; do kill -KILL "$pid" 2>/dev/null || true; done < "$work/pids"
  rm -f "$work/pids"
}

cmd=${1:-}
shift || true
case "$cmd" in
  stop) stop_cluster "${1:?usage: cluster.sh stop WORK}"; exit 0 ;;
  start) ;;
  *) echo "usage: cluster.sh start|stop ..." >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
model="" ; n_prefill=1 ; n_decode=1 ; work="" ; bin="$root/build"
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --prefill) n_prefill=$2; shift 2 ;;
    --decode) n_decode=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "--model is required" >&2; exit 2; }
[ -n "$work" ] || work=$(mktemp -d /tmp/pdserve-cluster.XXXXXX)
mkdir -p "$work"
: > "$work/pids"

"$bin/router/pdserve_router" --model_dir="$model" --ready_file="$work/router.ready" \
  > "$work/router.log" 2>&1 &
echo $! >> "$work/pids"
wait_ready "$work/router.ready" $! router || { stop_cluster "$work"; exit 1; }
router=$(json_field "$work/router.ready" grpc_address)

threads=$(( $(nproc) / (n_prefill + n_decode) ))
[ "$threads" -ge 1 ] || threads=1
for i in $(seq 1 "$n_prefill"); do
  "$bin/prefill_worker/pdserve_prefill_worker" --model_dir="$model" --router="$router" \
    --threads="$threads" --ready_file="$work/prefill$i.ready" > "$work/prefill$i.log" 2>&1 &
  echo $! >> "$work/pids"
  wait_ready "$work/prefill$i.ready" $! "prefill$i" || { stop_cluster "$work"; exit 1; }
done
for i in $(seq 1 "$n_decode"); do
  "$bin/decode_worker/pdserve_decode_worker" --model_dir="$model" --router="$router" \
    --threads="$threads" --ready_file="$work/decode$i.ready" > "$work/decode$i.log" 2>&1 &
  echo $! >> "$work/pids"
  wait_ready "$work/decode$i.ready" $! "decode$i" || { stop_cluster "$work"; exit 1; }
done

# Wait until the router lists every worker.
metrics=$(json_field "$work/router.ready" metrics_port)
for _ in $(seq 1 100); do
  page=$(curl -sf "http://127.0.0.1:$metrics/metrics" || true)
  p=$(echo "$page" | sed -n 's/^pdserve_pool_workers{pool="prefill"} \([0-9]*\).*/\1/p')
  d=$(echo "$page" | sed -n 's/^pdserve_pool_workers{pool="decode"} \([0-9]*\).*/\1/p')
  [ "${p:-0}" = "$n_prefill" ] && [ "${d:-0}" = "$n_decode" ] && break
  sleep 0.1
done
echo "router=$router metrics_port=$metrics work=$work"
