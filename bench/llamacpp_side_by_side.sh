#!/usr/bin/env bash
# Batch-1 decode and 512-token prefill, pdserve against llama.cpp on the same
# model, the same machine and the same thread counts, alternating.
#
# The project does not ship llama.cpp: pass the path of a checkout (e.g. a
# clone of github.com/ggerganov/llama.cpp). This script builds its
# llama-bench, llama-quantize and llama-simple with CMake (Release,
# GGML_NATIVE=ON, static, no curl) into --llamacpp_build (default: under the
# output directory; pass the same directory again to reuse a build).
#
# Then it writes one random-weight Llama model with pdserve_make_model (fp32,
# hidden 768, 12 layers, 12 heads / 4 KV heads, intermediate 2048, vocab
# 32000, untied LM head: 124.7 M parameters), converts it to GGUF with
# pdserve_export_gguf (fp32; a vocabulary whose token i prints as "<i>"),
# and makes the other formats from that file with llama-quantize --pure
# (every matrix in the one type, the LM head and embedding included, as
# pdserve quantizes them): BF16, Q8_0 and Q4_0. It checks that llama.cpp
# (llama-simple, greedy) and pdserve_dump_logits produce the same 32 greedy
# tokens after BOS on the fp32 files, and reports how many leading greedy
# tokens the quantized pairs share (not required: the two round differently).
#
# The pairs: pdserve --weight_dtype f32 / bf16 / int8 / int4 against GGUF
# F32 / BF16 / Q8_0 / Q4_0. Each round runs, for each thread count in turn
# and each pair in turn, llama-bench then pdserve_engine_bench:
#   llama-bench -m MODEL -p 512 -n 64 -t T -r REPS -o json
#     prefill: pp512 tokens/s; decode: tg64 tokens/s (64 tokens from an empty
#     context, mean over REPS after its warm-up run);
#   pdserve_engine_bench --model_dir=DIR --weight_dtype=D --threads=T
#       --prompt_len=512 --context=1 --decode_steps=64 --batch=1
#     prefill: tokens/s of one 512-token prompt (median of --runs after 1
#     warm-up); decode: batch-1 tokens/s over 64 steps from a context of 1
#     (total steps / total time, as llama-bench's tg).
# With --batches (e.g. "8 16"), each pair and thread count also runs batched
# decode, llama.cpp's llama-batched-bench against pdserve_engine_bench:
#   llama-batched-bench -m MODEL -npp 128 -ntg 64 -npl B1,B2 -c C -t T
#     decode batch B (tgB): S_TG, the tokens/s of 64 steps of B sequences
#     that each start from its own 128-token prompt (KV 128 -> 192);
#   pdserve_engine_bench --batch=B --context=128 --decode_steps=64 ...
#     decode batch B: B sequences with 128 tokens of KV each, tokens/s of the
#     median step over 64 steps.
# The table holds the median over rounds of each figure and the ratio
# pdserve / llama.cpp of those medians; results.json also has every round.
# OpenMP's wait policy is the environment's (OMP_WAIT_POLICY) for both.
#
# Writes $OUT/results.json, $OUT/table.md, $OUT/runs.txt, $OUT/machine.txt.
#   bench/llamacpp_side_by_side.sh --llamacpp DIR [--llamacpp_build DIR]
#       [--bin BUILD_DIR] [--out DIR] [--threads "1 2"] [--rounds 3]
#       [--reps 3] [--jobs 2] [--pairs "f32 bf16 int8 int4"] [--batches "8 16"]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build" out="" llamacpp="" lcpp_build="" threads="1 2" rounds=3 reps=3 jobs=2
pairs="f32 bf16 int8 int4" batches=""
while [ $# -gt 0 ]; do
  case "$1" in
    --llamacpp) llamacpp=$2; shift 2 ;;
    --llamacpp_build) lcpp_build=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --reps) reps=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$llamacpp" ] || [ ! -f "$llamacpp/CMakeLists.txt" ] ||
   [ ! -f "$llamacpp/examples/llama-bench/llama-bench.cpp" ]; then
  echo "--llamacpp must name a llama.cpp checkout (with examples/llama-bench)" >&2
  exit 2
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-llamacpp.XXXXXX)
mkdir -p "$out"
out=$(cd "$out" && pwd)
llamacpp=$(cd "$llamacpp" && pwd)
[ -n "$lcpp_build" ] || lcpp_build="$out/llamacpp-build"

gguf_type() {  # pdserve weight dtype -> llama-quantize type
  case "$1" in
    f32) echo F32 ;; bf16) echo BF16 ;; int8) echo Q8_0 ;; int4) echo Q4_0 ;;
    *) echo "no llama.cpp counterpart for --weight_dtype=$1" >&2; exit 2 ;;
  esac
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores;" \
    "flags: $(grep -m1 -o -w -E 'avx2|avx512f|avx512_vnni|avx512_bf16|amx_int8' /proc/cpuinfo | sort -u | paste -sd' ')"
  echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r), $(gcc --version | head -1)"
  echo "pdserve commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "llama.cpp commit: $(git -C "$llamacpp" rev-parse --short HEAD 2>/dev/null || echo "unknown (not a git checkout)")"
  echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
} > "$out/machine.txt"

# llama.cpp, built once per build directory (CMake rebuilds what changed).
cmake -S "$llamacpp" -B "$lcpp_build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF \
  > "$out/llamacpp-configure.log" 2>&1 ||
  { echo "llama.cpp configure failed: $out/llamacpp-configure.log" >&2; exit 1; }
targets="llama-bench llama-quantize llama-simple"
[ -z "$batches" ] || targets="$targets llama-batched-bench"
# shellcheck disable=SC2086
cmake --build "$lcpp_build" -j "$jobs" --target $targets \
  > "$out/llamacpp-build.log" 2>&1 ||
  { echo "llama.cpp build failed: $out/llamacpp-build.log" >&2; exit 1; }
lbin="$lcpp_build/bin"
echo "llama.cpp build: $lcpp_build (GGML_NATIVE=ON, Release, static)" >> "$out/machine.txt"

model="$out/model"
[ -f "$model/model.safetensors" ] || "$bin/tools/pdserve_make_model" --out_dir="$model" --seed=1 \
  --vocab_size=32000 --hidden_size=768 --intermediate_size=2048 --num_layers=12 --num_heads=12 \
  --num_kv_heads=4 --max_position_embeddings=2048 --dtype=f32 > /dev/null
[ -f "$out/model-F32.gguf" ] ||
  "$bin/tools/pdserve_export_gguf" --model_dir="$model" --out="$out/model-F32.gguf"
for d in $pairs; do
  t=$(gguf_type "$d")
  [ "$t" = F32 ] || [ -f "$out/model-$t.gguf" ] ||
    "$lbin/llama-quantize" --pure "$out/model-F32.gguf" "$out/model-$t.gguf" "$t" \
      > "$out/quantize-$t.log" 2>&1 ||
    { echo "llama-quantize $t failed: $out/quantize-$t.log" >&2; exit 1; }
done

# Greedy tokens after BOS (id 1): llama-simple prints the prompt's BOS, then
# each generated token as "<id>" (an empty prompt: BOS alone).
llamacpp_tokens() {  # gguf
  "$lbin/llama-simple" -m "$1" -n 40 "" 2> /dev/null | grep -oE '<[0-9]+>' | tr -d '<>' |
    tail -n +2 | head -32 | paste -sd,
}
pdserve_tokens() {  # weight_dtype
  "$bin/tools/pdserve_dump_logits" --model_dir="$model" --tokens=1 --max_tokens=32 \
    --weight_dtype="$1" --threads=1 |
    python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["greedy_tokens"])))'
}
leading() {  # a b: how many leading comma-separated items agree
  python3 -c 'import sys; a, b = sys.argv[1].split(","), sys.argv[2].split(",")
n = 0
while n < min(len(a), len(b)) and a[n] == b[n]: n += 1
print(n)' "$1" "$2"
}
for d in $pairs; do
  t=$(gguf_type "$d")
  l=$(llamacpp_tokens "$out/model-$t.gguf")
  p=$(pdserve_tokens "$d")
  echo "$d $l $p" >> "$out/greedy.txt"
  if [ "$d" = f32 ]; then
    if [ "$l" != "$p" ]; then
      echo "greedy tokens differ (fp32): llama.cpp $l" >&2
      echo "                             pdserve   $p" >&2
      exit 1
    fi
    echo "greedy check: the same 32 tokens from llama.cpp (F32) and pdserve (f32)" |
      tee -a "$out/machine.txt"
  else
    echo "greedy, $t against pdserve $d: $(leading "$l" "$p") of 32 leading tokens the same" |
      tee -a "$out/machine.txt"
  fi
done

: > "$out/runs.txt"
record() {  # round threads program test tok/s load
  echo "$1 $2 $3 $4 $5 $6" >> "$out/runs.txt"
  echo "round $1, $2 thread(s), $3 $4: $5 tok/s (load $6)"
}
run_llamacpp() {  # round threads weight_dtype
  local t json load
  t=$(gguf_type "$3")
  load=$(cut -d' ' -f1 /proc/loadavg)
  json=$("$lbin/llama-bench" -m "$out/model-$t.gguf" -p 512 -n 64 -t "$2" -r "$reps" -o json \
    2> /dev/null)
  for test in pp512 tg64; do
    record "$1" "$2" "llamacpp_$3" "$test" "$(python3 -c '
import json, sys
for r in json.loads(sys.argv[1]):
    name = "pp%d" % r["n_prompt"] if r["n_gen"] == 0 else "tg%d" % r["n_gen"]
    if name == sys.argv[2]: print(r["avg_ts"])' "$json" "$test")" "$load"
  done
}
run_pdserve() {  # round threads weight_dtype
  local json load
  load=$(cut -d' ' -f1 /proc/loadavg)
  json=$("$bin/bench/pdserve_engine_bench" --model_dir="$model" --threads="$2" \
    --weight_dtype="$3" --prompt_len=512 --context=1 --decode_steps=64 --batch=1 \
    --runs="$reps" --warmup=1 --stream_mib=64 2> /dev/null | tail -1)
  field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$json" "$1"; }
  record "$1" "$2" "pdserve_$3" pp512 "$(field prefill_tokens_per_s)" "$load"
  record "$1" "$2" "pdserve_$3" tg64 "$(field decode_b1_mean_tokens_per_s)" "$load"
}
run_llamacpp_batched() {  # round threads weight_dtype
  local t load npl ctx=0 b
  t=$(gguf_type "$3")
  load=$(cut -d' ' -f1 /proc/loadavg)
  npl=$(echo "$batches" | tr ' ' ',')
  for b in $batches; do ctx=$((ctx > b * 192 ? ctx : b * 192)); done
  "$lbin/llama-batched-bench" -m "$out/model-$t.gguf" -npp 128 -ntg 64 -npl "$npl" \
    -c "$ctx" -t "$2" --output-format jsonl 2> /dev/null | grep '^{' |
    python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print(r["pl"], r["speed_tg"])' |
    while read -r b tps; do record "$1" "$2" "llamacpp_$3" "batch$b" "$tps" "$load"; done
}
run_pdserve_batched() {  # round threads weight_dtype
  local json load b
  for b in $batches; do
    load=$(cut -d' ' -f1 /proc/loadavg)
    json=$("$bin/bench/pdserve_engine_bench" --model_dir="$model" --threads="$2" \
      --weight_dtype="$3" --prompt_len=16 --context=128 --decode_steps=64 --batch="$b" \
      --runs=1 --warmup=0 --stream_mib=64 2> /dev/null | tail -1)
    record "$1" "$2" "pdserve_$3" "batch$b" \
      "$(python3 -c 'import json, sys; print(json.loads(sys.argv[1])["decode_batch_tokens_per_s"])' "$json")" \
      "$load"
  done
}
for round in $(seq 1 "$rounds"); do
  for t in $threads; do
    echo "load average before round $round, $t thread(s): $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
    for d in $pairs; do
      run_llamacpp "$round" "$t" "$d"
      run_pdserve "$round" "$t" "$d"
      if [ -n "$batches" ]; then
        run_llamacpp_batched "$round" "$t" "$d"
        run_pdserve_batched "$round" "$t" "$d"
      fi
    done
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"

python3 - "$out" "$pairs" "$batches" <<'EOF'
import json, statistics, sys
out, pairs, batches = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
gguf = {"f32": "F32", "bf16": "BF16", "int8": "Q8_0", "int4": "Q4_0"}
runs, loads = {}, {}
for line in open(f"{out}/runs.txt"):
    _, t, prog, test, tps, load = line.split()
    runs.setdefault((int(t), prog, test), []).append(float(tps))
    loads.setdefault(int(t), []).append(float(load))
result, rows = {}, []
for t in sorted({k[0] for k in runs}):
    tests = [("tg64", "decode batch 1 (tg64)"), ("pp512", "prefill 512 (pp512)")]
    tests += [(f"batch{b}", f"decode batch {b}, KV 128+ (llama-batched-bench)") for b in batches]
    for test, label in tests:
        cells = []
        for d in pairs:
            p, l = runs.get((t, f"pdserve_{d}", test)), runs.get((t, f"llamacpp_{d}", test))
            if not p or not l:
                cells.append("-")
                continue
            pm, lm = statistics.median(p), statistics.median(l)
            result.setdefault(str(t), {}).setdefault(test, {})[d] = {
                "pdserve_tokens_per_s": p, "llamacpp_tokens_per_s": l,
                "pdserve_median": pm, "llamacpp_median": lm, "ratio": pm / lm}
            cells.append(f"{pm:.1f} / {lm:.1f} = **{pm / lm:.2f}x**")
        rows.append(f"| {t} | {label} | " + " | ".join(cells) + " |")
header = ("| threads | test | " + " | ".join(f"{d} vs {gguf[d]}" for d in pairs) + " |\n"
          "| ---: | --- | " + " | ".join("---:" for _ in pairs) + " |")
table = header + "\n" + "\n".join(rows)
table += ("\n\ncells: pdserve tokens/s / llama.cpp tokens/s = ratio (medians over rounds); "
          "1-minute load average before the runs: " +
          ", ".join(f"{t} thread(s) {min(v):.1f}-{max(v):.1f}" for t, v in sorted(loads.items())))
open(f"{out}/table.md", "w").write(table + "\n")
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
print(table)
EOF
