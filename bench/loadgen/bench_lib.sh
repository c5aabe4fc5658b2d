# Shared by the serving benchmarks (serving_bench.sh, scheduling_bench.sh):
# source it, then call these.

# The benchmarks' model in DIR (kept if already there): a Llama-shaped random
# model, 8 layers, hidden 512, 8 heads (4 KV heads), MLP 1408, byte
# vocabulary: 23.5 M parameters, f32 (94 MB), 2,048 positions, 16 KiB of KV
# per token. On one idle core a 256-token prefill takes ~0.3 s and a batch-1
# decode step ~10 ms.
bench_model() {  # DIR BUILD_DIR
  [ -f "$1/model.safetensors" ] || "$2/tools/pdserve_make_model" --out_dir="$1" --seed=1 \
    --hidden_size=512 --intermediate_size=1408 --num_layers=8 --num_heads=8 --num_kv_heads=4 \
    --max_position_embeddings=2048 --vocab_size=320 > /dev/null
}

# The machine, date and commit, written to FILE.
bench_machine_info() {  # FILE SOURCE_DIR
  {
    echo "date: $(date -u +%Y-%m-%dT%H:%MZ)"
    echo "cpu: $(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1), $(nproc) cores"
    echo "memory: $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
    echo "os: $(. /etc/os-release && echo "$PRETTY_NAME"), kernel $(uname -r)"
    echo "commit: $(git -C "$2" rev-parse --short HEAD 2>/dev/null || echo unknown)"
  } > "$1"
}
