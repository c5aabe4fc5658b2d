#!/usr/bin/env bash
# The main job on one machine: install what is missing, build, start a
# router + 1 prefill + 1 decode worker on loopback serving the demo model
# (tools/demo_model: a small Llama trained on the Dhammapada, with its own
# byte-level BPE tokenizer and the Llama 3 chat template), stream generations
# through the client (a text prompt and a chat request: text, tokens, TTFT,
# ITL), show the exported latency metrics, and stop every process it started.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"

deploy/local/build.sh

model="$root/tools/demo_model"

work=$(mktemp -d /tmp/pdserve-demo.XXXXXX)
trap 'deploy/local/cluster.sh stop "$work"' EXIT
info=$(deploy/local/cluster.sh start --model "$model" --prefill 1 --decode 1 --work "$work")
echo "cluster: $info"
router=$(echo "$info" | sed -n 's/.*router=\([^ ]*\).*/\1/p')
metrics=$(echo "$info" | sed -n 's/.*metrics_port=\([^ ]*\).*/\1/p')

prompt=${PDSERVE_DEMO_PROMPT:-"For hatred does not cease by hatred at any time:"}
echo "prompt: $prompt"
echo "--- streamed output (greedy: the model continues the verse it was trained on) ---"
build/router/pdserve_client --router="$router" --prompt="$prompt" --max_tokens=64 --ignore_eos
build/router/pdserve_client --router="$router" --prompt="$prompt" --max_tokens=16 --print_ids --ignore_eos
echo "--- chat request (rendered through the model's chat template by the router;"
echo "    the model learnt verses, not conversations: its answer is verse-like noise) ---"
build/router/pdserve_client --router="$router" --chat="What is the path of immortality?" \
  --max_tokens=32
echo "--- router metrics ---"
curl -sf "http://127.0.0.1:$metrics/metrics" | grep -E '^pdserve_(time_to_first_token_seconds|inter_token_latency_seconds)_(count|sum)|^pdserve_requests_total'
