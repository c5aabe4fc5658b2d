#!/usr/bin/env bash
# Starts a local pdserve cluster on loopback: a router, N prefill workers and
# M decode workers, every port picked by the kernel. Prints the router address
# and writes the pids it started to $WORK/pids; `cluster.sh stop WORK` ends
# exactly those processes. The pools scale and drain while the cluster runs,
# and a local Prometheus can watch it (deploy/prometheus). Workers register on
# the router's internal port with a cluster token (WORK/cluster_token, mode
# 600, a fresh random one unless --token_file names one; --no_token: none).
#
#   deploy/local/cluster.sh start --model DIR [--prefill N] [--decode M] [--work DIR] [--bin DIR] [--threads T]
#       [--router_flags "..."] [--prefill_flags "..."] [--decode_flags "..."]   # extra flags, also for add-*
#       [--token_file F | --no_token]   # cluster token: default a new random one in WORK/cluster_token
#   deploy/local/cluster.sh add-prefill WORK     # one more prefill worker; registers with the router
#   deploy/local/cluster.sh add-decode WORK      # one more decode worker
#   deploy/local/cluster.sh drain WORK PID       # SIGTERM one process of WORK, wait until it has drained
#   deploy/local/cluster.sh prometheus WORK [--port P]   # Prometheus on 127.0.0.1 scraping WORK
#   deploy/local/cluster.sh status WORK          # processes and the router's pool sizes
#   deploy/local/cluster.sh stop WORK
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)

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

pool_size() {  # metrics_port pool
  curl -sf "http://127.0.0.1:$1/metrics" 2>/dev/null |
    sed -n "s/^pdserve_pool_workers{pool=\"$2\"} \([0-9]*\).*/\1/p" || true
}

# "alive" stands for the workers running now, counted again at each try: a
# worker drained meanwhile leaves the router's list when it exits, and a
# count taken once would then wait out the 10 s.
wait_pools() {  # work prefill|alive decode|alive
  local metrics want_p want_d
  metrics=$(json_field "$1/router.ready" metrics_port)
  for _ in $(seq 1 100); do
    want_p=$2 want_d=$3
    [ "$want_p" = alive ] && want_p=$(count_alive "$1" prefill)
    [ "$want_d" = alive ] && want_d=$(count_alive "$1" decode)
    [ "$(pool_size "$metrics" prefill)" = "$want_p" ] && [ "$(pool_size "$metrics" decode)" = "$want_d" ] && return 0
    sleep 0.1
  done
  echo "the router does not list $want_p prefill and $want_d decode workers yet" >&2
}

# WORK/pids and the Prometheus target files are rewritten by add-* and
# drain, which may run at the same time (the planner drains one worker in
# the background while it adds another): one writer at a time. (Two adds
# at once could still pick the same worker name: run them one by one.)
locked() {  # work command...
  local work=$1; shift
  ( flock 9; "$@" ) 9> "$work/.lock"
}

count_alive() {  # work role
  local n=0 f pid
  for f in "$1/$2"*.ready; do
    [ -e "$f" ] || continue
    pid=$(json_field "$f" pid)
    kill -0 "$pid" 2>/dev/null && n=$((n + 1))
  done
  echo $n
}

# Prometheus file_sd targets of the live processes, when WORK has a Prometheus.
write_targets() {  # work
  local work=$1 dir="$1/prometheus/targets" role f pid first
  [ -d "$dir" ] || return 0
  for role in router prefill decode; do
    {
      printf '[{"targets": ['
      first=1
      for f in "$work/$role"*.ready; do
        [ -e "$f" ] || continue
        pid=$(json_field "$f" pid)
        kill -0 "$pid" 2>/dev/null || continue
        [ $first -eq 1 ] || printf ', '
        printf '"127.0.0.1:%s"' "$(json_field "$f" metrics_port)"
        first=0
      done
      printf ']}]\n'
    } > "$dir/$role.json.tmp"
    mv "$dir/$role.json.tmp" "$dir/$role.json"
  done
}

stop_cluster() {
  local work=$1
  [ -f "$work/pids" ] || return 0
  # Last started first (Prometheus, added workers), router last; SIGTERM
  # drains, SIGKILL after 15 s.
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

start_worker() {  # work role(prefill|decode)
  local work=$1 role=$2 i bin_name pid extra
  # shellcheck disable=SC1091
  . "$work/cluster.env"
  i=1
  while [ -e "$work/$role$i.ready" ] || [ -e "$work/$role$i.log" ]; do i=$((i + 1)); done
  if [ "$role" = prefill ]; then bin_name=prefill_worker/pdserve_prefill_worker; extra=${PREFILL_FLAGS:-}
  else bin_name=decode_worker/pdserve_decode_worker; extra=${DECODE_FLAGS:-}; fi
  # shellcheck disable=SC2086  # extra flags split on spaces
  "$BIN/$bin_name" --model_dir="$MODEL" --router="$ROUTER" --threads="$THREADS" \
    --cluster_token_file="$TOKEN_FILE" $extra \
    --ready_file="$work/$role$i.ready" > "$work/$role$i.log" 2>&1 &
  pid=$!
  locked "$work" sh -c 'echo "$1" >> "$2"' _ "$pid" "$work/pids"
  wait_ready "$work/$role$i.ready" $pid "$role$i" || return 1
  echo "$role$i pid=$pid address=$(json_field "$work/$role$i.ready" grpc_address) metrics_port=$(json_field "$work/$role$i.ready" metrics_port)"
}

require_work() {
  [ -n "${1:-}" ] && [ -f "$1/cluster.env" ] || { echo "not a cluster work directory: ${1:-}" >&2; exit 2; }
}

cmd=${1:-}
shift || true
case "$cmd" in
  stop)
    stop_cluster "${1:?usage: cluster.sh stop WORK}"
    exit 0 ;;
  add-prefill|add-decode)
    work=${1:?usage: cluster.sh $cmd WORK}
    require_work "$work"
    role=${cmd#add-}
    start_worker "$work" "$role"
    locked "$work" write_targets "$work"
    wait_pools "$work" alive alive
    exit 0 ;;
  drain)
    work=${1:?usage: cluster.sh drain WORK PID}
    pid=${2:?usage: cluster.sh drain WORK PID}
    require_work "$work"
    grep -qx "$pid" "$work/pids" || { echo "pid $pid was not started in $work" >&2; exit 2; }
    # Health goes NOT_SERVING, the worker tells the router it drains, running
    # requests finish, then it exits (at most --drain_timeout_ms, 30 s).
    kill -TERM "$pid"
    start=$(date +%s%N)
    for _ in $(seq 1 400); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then echo "pid $pid still running after 40 s" >&2; exit 1; fi
    echo "pid $pid drained and exited after $(( ($(date +%s%N) - start) / 1000000 )) ms"
    locked "$work" sed -i "/^$pid\$/d" "$work/pids"
    locked "$work" write_targets "$work"
    exit 0 ;;
  prometheus)
    work=${1:?usage: cluster.sh prometheus WORK [--port P]}
    require_work "$work"
    port=0
    [ "${2:-}" = --port ] && port=${3:?--port needs a value}
    command -v prometheus >/dev/null || { echo "prometheus not found (Debian: apt-get install prometheus)" >&2; exit 1; }
    dir="$work/prometheus"
    mkdir -p "$dir/targets" "$dir/data"
    cp "$root/deploy/prometheus/prometheus.yml" "$root/deploy/prometheus/pdserve.rules.yml" "$dir/"
    write_targets "$work"
    prometheus --config.file="$dir/prometheus.yml" --storage.tsdb.path="$dir/data" \
      --web.listen-address="127.0.0.1:$port" > "$dir/prometheus.log" 2>&1 &
    pid=$!
    echo $pid >> "$work/pids"
    for _ in $(seq 1 100); do
      address=$(sed -n 's/.*msg="Listening on" address=\([^ ]*\).*/\1/p' "$dir/prometheus.log" | head -1)
      [ -n "$address" ] && break
      kill -0 "$pid" 2>/dev/null || { cat "$dir/prometheus.log" >&2; exit 1; }
      sleep 0.1
    done
    [ -n "$address" ] || { echo "Prometheus did not start; see $dir/prometheus.log" >&2; exit 1; }
    echo "prometheus=http://$address pid=$pid"
    exit 0 ;;
  status)
    work=${1:?usage: cluster.sh status WORK}
    require_work "$work"
    for f in "$work"/*.ready; do
      [ -e "$f" ] || continue
      pid=$(json_field "$f" pid)
      state=exited
      kill -0 "$pid" 2>/dev/null && state=running
      echo "$(basename "$f" .ready) pid=$pid $state address=$(json_field "$f" grpc_address) metrics_port=$(json_field "$f" metrics_port)"
    done
    metrics=$(json_field "$work/router.ready" metrics_port)
    echo "router pools: prefill=$(pool_size "$metrics" prefill) decode=$(pool_size "$metrics" decode)"
    exit 0 ;;
  start) ;;
  *) echo "usage: cluster.sh start|add-prefill|add-decode|drain|prometheus|status|stop ..." >&2; exit 2 ;;
esac

model="" ; n_prefill=1 ; n_decode=1 ; work="" ; bin="$root/build" ; threads=""
router_flags="" ; prefill_flags="" ; decode_flags="" ; token_file="" ; no_token=0
while [ $# -gt 0 ]; do
  case "$1" in
    --model) model=$2; shift 2 ;;
    --prefill) n_prefill=$2; shift 2 ;;
    --decode) n_decode=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --router_flags) router_flags=$2; shift 2 ;;
    --prefill_flags) prefill_flags=$2; shift 2 ;;
    --decode_flags) decode_flags=$2; shift 2 ;;
    --token_file) token_file=$2; shift 2 ;;
    --no_token) no_token=1; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$model" ] || { echo "--model is required" >&2; exit 2; }
[ -n "$work" ] || work=$(mktemp -d /tmp/pdserve-cluster.XXXXXX)
mkdir -p "$work"
rm -f "$work"/*.ready
: > "$work/pids"
if [ $no_token -eq 0 ] && [ -z "$token_file" ]; then
  token_file="$work/cluster_token"
  (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$token_file")
fi
[ -z "$token_file" ] || token_file=$(cd "$(dirname "$token_file")" && pwd)/$(basename "$token_file")

# shellcheck disable=SC2086  # extra flags split on spaces
"$bin/router/pdserve_router" --model_dir="$model" --ready_file="$work/router.ready" \
  --cluster_token_file="$token_file" $router_flags \
  > "$work/router.log" 2>&1 &
echo $! >> "$work/pids"
wait_ready "$work/router.ready" $! router || { stop_cluster "$work"; exit 1; }
router=$(json_field "$work/router.ready" grpc_address)
# Workers register on the router's internal port.
internal="${router%:*}:$(json_field "$work/router.ready" internal_port)"

if [ -z "$threads" ]; then
  threads=$(( $(nproc) / (n_prefill + n_decode) ))
  [ "$threads" -ge 1 ] || threads=1
fi
# What add-prefill / add-decode need later.
printf 'MODEL=%q\nBIN=%q\nROUTER=%q\nTHREADS=%q\nPREFILL_FLAGS=%q\nDECODE_FLAGS=%q\nTOKEN_FILE=%q\n' \
  "$model" "$bin" "$internal" "$threads" "$prefill_flags" "$decode_flags" "$token_file" \
  > "$work/cluster.env"
for _ in $(seq 1 "$n_prefill"); do
  start_worker "$work" prefill > /dev/null || { stop_cluster "$work"; exit 1; }
done
for _ in $(seq 1 "$n_decode"); do
  start_worker "$work" decode > /dev/null || { stop_cluster "$work"; exit 1; }
done

# Wait until the router lists every worker.
wait_pools "$work" "$n_prefill" "$n_decode" || true
metrics=$(json_field "$work/router.ready" metrics_port)
echo "router=$router internal=$internal metrics_port=$metrics work=$work"
