#!/usr/bin/env bash
# One 1 prefill + 1 decode cluster of the GPU run kit's binaries on the
# demo model (tools/demo_model, trained, so greedy tokens have clear
# margins), started by deploy/local/cluster.sh; streams the greedy
# continuation of three verses and writes their token ids, one line per
# prompt, to WORK/tokens. BACKEND cuda: both workers on GPU 0 with
# --backend=cuda --kv_transport=nccl, which moves the KV by CUDA IPC between
# two processes on one GPU; afterwards the decode worker's
# pdserve_kv_transfer_received_bytes_total must be > 0 and its log must not
# say that CUDA IPC was refused. Stops the cluster (its own processes only)
# on exit. Used by run_kit.sh.
#   tests/gpu/kit_cluster.sh KIT_DIR WORK cpu|cuda
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
kit=${1:?usage: kit_cluster.sh KIT_DIR WORK cpu|cuda}
work=${2:?usage: kit_cluster.sh KIT_DIR WORK cpu|cuda}
backend=${3:?usage: kit_cluster.sh KIT_DIR WORK cpu|cuda}
rm -rf "$work"
mkdir -p "$work"
flags=""
[ "$backend" = cuda ] && flags="--backend=cuda --kv_transport=nccl"
threads=$(( $(nproc) / 2 ))
[ "$threads" -ge 1 ] || threads=1
[ "$threads" -le 8 ] || threads=8

trap '"$root/deploy/local/cluster.sh" stop "$work/cluster" || true' EXIT
if ! "$root/deploy/local/cluster.sh" start --model "$root/tools/demo_model" --bin "$kit/build" \
    --work "$work/cluster" --threads "$threads" --no_token --prefill_flags "$flags" \
    --decode_flags "$flags" > "$work/start.txt" 2>&1; then
  echo "the $backend cluster did not start:"
  cat "$work/start.txt"
  for f in "$work"/cluster/*.log; do echo "--- $f"; tail -20 "$f"; done
  exit 1
fi
router=$(sed -n 's/^router=\([^ ]*\) .*/\1/p' "$work/start.txt")
echo "$backend cluster: $(tail -1 "$work/start.txt")"

prompts=("For hatred does not cease by hatred at any time:"
         "As rain breaks through an ill-thatched house,"
         "If a man's thoughts are not dissipated,")
: > "$work/tokens"
for p in "${prompts[@]}"; do
  ok=0
  for _ in 1 2 3 4 5; do  # the router may not list both workers yet
    if "$kit/bin/pdserve_client" --router="$router" --prompt="$p" --max_tokens=32 \
        --print_ids --timeout_ms=60000 > "$work/ids.txt" 2> "$work/client.txt"; then
      ok=1
      break
    fi
    sleep 2
  done
  if [ $ok -eq 0 ]; then
    echo "the client failed on the $backend cluster:"
    cat "$work/client.txt"
    for f in "$work"/cluster/*.log; do echo "--- $f"; tail -20 "$f"; done
    exit 1
  fi
  ids=$(tr -s ' \n' ' ' < "$work/ids.txt" | sed 's/ *$//')
  echo "$ids" >> "$work/tokens"
  echo "  \"$p\" -> $ids"
  sed -n 's/^router: */  router: /p' "$work/client.txt"
done

if [ "$backend" = cuda ]; then
  metrics=$(sed -n 's/.*"metrics_port":"\([0-9]*\)".*/\1/p' "$work/cluster/decode1.ready")
  received=$(python3 -c "import urllib.request,sys
for line in urllib.request.urlopen('http://127.0.0.1:$metrics/metrics', timeout=10).read().decode().splitlines():
    if line.startswith('pdserve_kv_transfer_received_bytes_total'): print(line.split()[-1])")
  echo "  decode worker: pdserve_kv_transfer_received_bytes_total ${received:-missing}"
  if grep -h "cannot use CUDA IPC\|kv pair with .* failed" "$work"/cluster/*.log; then
    echo "the KV did not move by CUDA IPC"
    exit 1
  fi
  awk -v r="${received:-0}" 'BEGIN { exit !(r + 0 > 0) }' || { echo "no KV bytes received"; exit 1; }
fi
