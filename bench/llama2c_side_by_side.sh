#!/usr/bin/env bash
# Batch-1 greedy decode, pdserve against llama2.c's run.c on the same model,
# the same machine and the same thread counts, alternating.
#
# The project does not ship llama2.c: pass the path of a checkout (e.g. a
# clone of github.com/karpathy/llama2.c). This script compiles its run.c with
# the flags its Makefile's `runfast` and `runomp` targets use (read with
# `make -n`, so they follow the checkout), into the output directory.
#
# Then it writes one random-weight Llama model with pdserve_make_model (fp32,
# hidden 768, 12 layers, 12 heads / 4 KV heads, intermediate 2048, vocab
# 32000, untied LM head: 124.7 M parameters), converts it to run.c's format
# with pdserve_export_llama2c, checks that both programs produce the same
# greedy tokens, and runs, --rounds times, for each thread count in turn:
#   llama2.c runfast (1 thread only: it is built without OpenMP),
#   llama2.c runomp (OMP_NUM_THREADS=threads),
#   pdserve_engine_bench --decode_only with --weight_dtype f32, bf16, int8
#   and w8a8 (int8 activations too; opt-in, see docs/decisions/cpu-weights.md).
# Both sides decode positions 1..255 after a BOS token and report tokens per
# second over those 255 steps (run.c: `-n 256`, its "achieved tok/s";
# pdserve: --context=1 --decode_steps=255 --warmup=0, total steps / total
# time). The table holds medians over rounds and, on a second line per
# thread count, the best round of each program (as STREAM reports; on a
# shared machine the best run is the least disturbed one); ratios are
# against the faster llama2.c build at that thread count. The triad column
# is pdserve_engine_bench's STREAM triad, measured in each of its runs; a
# second table gives each pdserve run's decode GB/s over that triad
# (lowest and highest round).
# OpenMP's wait policy is the environment's (OMP_WAIT_POLICY): spinning, the
# default, is right on an idle machine and collapses on an oversubscribed
# one, for both programs.
#
# Writes $OUT/results.json, $OUT/table.md, $OUT/runs.txt, $OUT/machine.txt.
#   bench/llama2c_side_by_side.sh --llama2c DIR [--bin BUILD_DIR] [--out DIR]
#       [--threads "1 2"] [--rounds 3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bin="$root/build" out="" llama2c="" threads="1 2" rounds=3
while [ $# -gt 0 ]; do
  case "$1" in
    --llama2c) llama2c=$2; shift 2 ;;
    --bin) bin=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
if [ -z "$llama2c" ] || [ ! -f "$llama2c/run.c" ] || [ ! -f "$llama2c/Makefile" ]; then
  echo "--llama2c must name a llama2.c checkout (with run.c and Makefile)" >&2
  exit 2
fi
[ -n "$out" ] || out=$(mktemp -d /tmp/pdserve-llama2c.XXXXXX)
mkdir -p "$out"
llama2c=$(cd "$llama2c" && pwd)

# The compile command of run.c in a Makefile target, without its output file
# and source: "gcc -Ofast -o run run.c -lm" -> "gcc -Ofast -lm".
make_flags() {
  make -s -n -C "$llama2c" "$1" | grep -E '(^|[[:space:]])run\.c([[:space:]]|$)' | head -1 |
    sed -E 's/(^|[[:space:]])-o[[:space:]]+[^[:space:]]+/ /; s/(^|[[:space:]])run\.c([[:space:]]|$)/ /'
}
build_run() {  # target binary
  local cmd
  cmd=$(make_flags "$1")
  [ -n "$cmd" ] || { echo "no run.c command in target $1 of $llama2c/Makefile" >&2; exit 1; }
  read -r -a words <<< "$cmd"
  echo "llama2.c $1: ${words[*]:0:1} $llama2c/run.c ${words[*]:1} -o $2" >> "$out/machine.txt"
  "${words[0]}" "$llama2c/run.c" "${words[@]:1}" -o "$2"
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
  echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
  echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
  echo "os: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r), $(gcc --version | head -1)"
  echo "pdserve commit: $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  echo "llama2.c commit: $(git -C "$llama2c" rev-parse --short HEAD 2>/dev/null || echo "unknown (not a git checkout)")"
  echo "llama2.c run.c sha256: $(sha256sum "$llama2c/run.c" | cut -d' ' -f1)"
} > "$out/machine.txt"
build_run runfast "$out/run_fast"
build_run runomp "$out/run_omp"

model="$out/model"
[ -f "$model/model.safetensors" ] || "$bin/tools/pdserve_make_model" --out_dir="$model" --seed=1 \
  --vocab_size=32000 --hidden_size=768 --intermediate_size=2048 --num_layers=12 --num_heads=12 \
  --num_kv_heads=4 --max_position_embeddings=2048 --dtype=f32 > /dev/null
"$bin/tools/pdserve_export_llama2c" --model_dir="$model" --out="$out/model.bin" \
  --tokenizer_out="$out/tokenizer.bin"

# Same model: run.c's first 32 greedy tokens after BOS (id 1) against
# pdserve's (fp32 weights). The tokenizer prints token i as "<i>".
"$out/run_fast" "$out/model.bin" -z "$out/tokenizer.bin" -t 0 -n 33 2> /dev/null |
  grep -oE '<[0-9]+>' | tr -d '<>' | head -32 | paste -sd, > "$out/llama2c_tokens.txt"
"$bin/tools/pdserve_dump_logits" --model_dir="$model" --tokens=1 --max_tokens=32 \
  --weight_dtype=f32 --threads=1 |
  python3 -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["greedy_tokens"])))' \
    > "$out/pdserve_tokens.txt"
if ! cmp -s "$out/llama2c_tokens.txt" "$out/pdserve_tokens.txt"; then
  echo "greedy tokens differ: llama2.c $(cat "$out/llama2c_tokens.txt")" >&2
  echo "                      pdserve  $(cat "$out/pdserve_tokens.txt")" >&2
  exit 1
fi
echo "greedy check: the same 32 tokens from llama2.c and pdserve (fp32)" | tee -a "$out/machine.txt"

: > "$out/runs.txt"
record() {  # round threads program tok/s [triad GB/s, decode / triad]
  echo "$1 $2 $3 $4 ${5:-} ${6:-}" >> "$out/runs.txt"
  echo "round $1, $2 thread(s), $3: $4 tok/s${5:+, triad $5 GB/s}${6:+, decode / triad $6}"
}
run_llama2c() {  # round threads binary label
  local tps
  tps=$(OMP_NUM_THREADS=$2 "$3" "$out/model.bin" -z "$out/tokenizer.bin" -t 0 -n 256 2>&1 \
    > /dev/null | sed -n 's/^achieved tok\/s: //p')
  record "$1" "$2" "$4" "$tps"
}
run_pdserve() {  # round threads weight_dtype
  local json
  json=$("$bin/bench/pdserve_engine_bench" --model_dir="$model" --threads="$2" --decode_only \
    --weight_dtype="$3" --context=1 --decode_steps=255 --warmup=0 --stream_mib=256 2> /dev/null |
    tail -1)
  field() { python3 -c 'import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$json" "$1"; }
  record "$1" "$2" "pdserve_$3" "$(field decode_b1_mean_tokens_per_s)" \
    "$(field bandwidth_triad_gbs)" "$(field decode_b1_bandwidth_fraction)"
}
for round in $(seq 1 "$rounds"); do
  for t in $threads; do
    echo "load average before round $round, $t thread(s): $(cut -d' ' -f1-3 /proc/loadavg)" >> "$out/machine.txt"
    [ "$t" = 1 ] && run_llama2c "$round" "$t" "$out/run_fast" llama2c_runfast
    run_llama2c "$round" "$t" "$out/run_omp" llama2c_runomp
    for dtype in f32 bf16 int8 w8a8; do run_pdserve "$round" "$t" "$dtype"; done
  done
done

python3 - "$out" <<'EOF'
import json, statistics, sys
out = sys.argv[1]
runs = {}
triad = {}
fraction = {}  # (threads, program) -> decode GB/s / triad GB/s of each round
for line in open(f"{out}/runs.txt"):
    parts = line.split()
    _, t, prog, tps = parts[:4]
    runs.setdefault((int(t), prog), []).append(float(tps))
    if len(parts) > 4:
        triad.setdefault(int(t), []).append(float(parts[4]))
    if len(parts) > 5:
        fraction.setdefault((int(t), prog), []).append(float(parts[5]))
rows, result = [], {}
for t in sorted({t for t, _ in runs}):
    for kind, pick in (("median", statistics.median), ("best", max)):
        fig = {p: pick(v) for (tt, p), v in runs.items() if tt == t}
        base = max(fig.get("llama2c_runfast", 0), fig.get("llama2c_runomp", 0))
        tri = pick(triad.get(t, [0]))
        result.setdefault(t, {})[kind] = {
            "tokens_per_s": fig, "llama2c": base, "triad_gbs": tri,
            "ratios": {p: fig[p] / base for p in fig if p.startswith("pdserve")}}
        cell = lambda p: f"{fig[p]:.1f} ({fig[p] / base:.2f}x)" if p in fig else "-"
        l2c = lambda p: f"{fig[p]:.1f}" if p in fig else "-"
        rows.append(f"| {t} | {kind} | {l2c('llama2c_runfast')} | {l2c('llama2c_runomp')} | "
                    f"{cell('pdserve_f32')} | {cell('pdserve_bf16')} | {cell('pdserve_int8')} | "
                    f"{cell('pdserve_w8a8')} | {tri:.1f} |")
header = ("| threads | of rounds | llama2.c runfast tok/s | llama2.c runomp tok/s | pdserve f32 "
          "| pdserve bf16 | pdserve int8 | pdserve w8a8 | triad GB/s |\n"
          "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
table = header + "\n" + "\n".join(rows)
# Each pdserve run's decode GB/s (tokens/s x bytes a step reads) over the
# triad it measured just before: the lowest and highest round.
progs = ["pdserve_f32", "pdserve_bf16", "pdserve_int8", "pdserve_w8a8"]
frows = []
for t in sorted({t for t, _ in fraction}):
    cells = []
    for p in progs:
        v = fraction.get((t, p))
        cells.append(f"{min(v):.2f}-{max(v):.2f}" if v else "-")
        if v:
            result[t].setdefault("decode_over_triad", {})[p] = v
    frows.append(f"| {t} | " + " | ".join(cells) + " |")
table += ("\n\ndecode GB/s / triad GB/s, lowest-highest round:\n\n"
          "| threads | pdserve f32 | pdserve bf16 | pdserve int8 | pdserve w8a8 |\n"
          "| ---: | ---: | ---: | ---: | ---: |\n" + "\n".join(frows))
open(f"{out}/table.md", "w").write(table + "\n")
json.dump(result, open(f"{out}/results.json", "w"), indent=2)
print(table)
print("(ratios against the faster llama2.c build at that thread count and statistic)")
EOF
