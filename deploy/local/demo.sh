#!/usr/bin/env bash
# The main job on one machine: install what is missing, build, write a small
# random-weight Llama model (with a byte-level BPE tokenizer and the Llama 3
# chat template), start a router + 1 prefill + 1 decode worker on loopback,
# stream generations through the client (a text prompt and a chat request:
# tokens, TTFT, ITL), show the exported latency metrics, and stop every
# process it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

deploy/local/build.sh

model="$root/build/models/demo"
if [ ! -f "$model/model.safetensors" ] || [ ! -f "$model/tokenizer.json" ]; then
  build/tools/pdserve_make_model --out_dir="$model" --seed=1 --tokenizer=bpe
fi

work=$(mktemp -d /tmp/pdserve-demo.XXXXXX)
trap 'deploy/local/cluster.sh stop "$work"' EXIT
info=$(deploy/local/cluster.sh start --model "$model" --prefill 1 --decode 1 --work "$work")
echo "cluster: $info"
router=$(echo "$info" | sed -n 's/.*router=\([^ ]*\).*/\1/p')
metrics=$(echo "$info" | sed -n 's/.*metrics_port=\([^ ]*\).*/\1/p')

prompt=${PDSERVE_DEMO_PROMPT:-"Disaggregated serving splits prefill from decode."}
echo "prompt: $prompt"
echo "--- streamed output (random weights: the text is noise, the tokens are real) ---"
build/router/pdserve_client --router="$router" --prompt="$prompt" --max_tokens=48 --ignore_eos
build/router/pdserve_client --router="$router" --prompt="$prompt" --max_tokens=16 --print_ids --ignore_eos
echo "--- chat request (rendered through the model's chat template by the router) ---"
build/router/pdserve_client --router="$router" --system="Answer briefly." \
  --chat="What does the decode pool do?" --max_tokens=32
echo "--- router metrics ---"
curl -sf "http://127.0.0.1:$metrics/metrics" | grep -E '^pdserve_(time_to_first_token_seconds|inter_token_latency_seconds)_(count|sum)|^pdserve_requests_total'
