#!/usr/bin/env bash
# The one command on a GPU machine: runs the GPU run kit that
# tests/gpu/make_kit.sh made (gpukit/pdserve-gpu-kit.tar.xz, carried with the
# working tree; tests/gpu/README.md) in at most 6 minutes, needing nothing but
# bash, coreutils, tar with xz (or python3), an NVIDIA driver and the CUDA
# toolkit's libraries: no package manager, network or build. Each step has a
# time budget and is stopped, and reported so, when it runs over (seconds:
# 30 + 20 + 100 + 45 + 45 + 100 + 20 = 360, each with 3 s to stop):
#   unpack    the kit into $PDSERVE_KIT_WORK (default /tmp/pdserve-gpu-kit-run);
#             the host's libstdc++ where it is new enough, else the kit's;
#   facts     nvidia-smi, the OS, glibc, and where each binary finds its
#             libraries (the CUDA toolkit's are looked for in
#             /usr/local/cuda, $CUDA_HOME, beside nvcc and in Python's
#             nvidia-* packages when the binaries' own path misses them);
#   tests     every ctest of label gpu, PDSERVE_REQUIRE_GPU=1 (a missing
#             device fails them, never skips them; a test that needs two
#             GPUs still skips on one, and is listed): "N passed, N failed";
#   check     pdserve_cuda_check: CUDA vs CPU runner logits and greedy
#             tokens, Llama-3.2-1B- and Qwen3-0.6B-shaped bf16 models (4 layers);
#   cluster   1 prefill + 1 decode worker of the demo model on the CPU, then
#             both on the GPU (KV by CUDA IPC): the same greedy tokens;
#   bench     pdserve_cuda_bench (1B and 8B shapes: decode batch 1 and 32,
#             CUDA graphs on and off, prefill 2048 and 8192 tokens) and
#             pdserve_kv_transfer_bench --transport=ipc;
#   overlap   pdserve_overlap_bench --backend=cuda on the demo model: B
#             streams of 128 tokens on the colocated engine core, the next
#             step's launch overlapped with the last step's hand-out and
#             not, alternated (docs/decisions/runtime-core.md);
#   summary   the performance table and the targets (batch-1 decode >= 70%
#             of copy bandwidth on 1B; prefill MFU >= 55% at 2048 tokens on
#             8B), a miss reported as MISSED.
# Writes 8 small files into $OUT when it is set (else $PDSERVE_KIT_WORK/out):
# summary.md, nvidia-smi.txt, gpu_tests.log, cuda_check.log, cluster.log,
# bench.md, bench.tsv, overlap.md. Exit 0 when every step passed.
#
# --dry (for machines without a GPU; the gpu_kit ctest runs it): every step
# that needs no device runs as on a GPU (unpacking, library resolution, the
# CPU cluster); the device steps must fail cleanly with a message naming the
# missing device (a test that passes by skipping fails the dry run). Without
# --dry and without a GPU the script stops at once, saying so.
#   tests/gpu/run_kit.sh [--dry] [--kit ARCHIVE_OR_DIR]
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)

# ---- the steps' bodies: run as `run_kit.sh --step FUNCTION ARGS` under
# `timeout`, which stops a step with every process it started. They read
# root, kit, work, out and dry from the environment. ----

unpack() {  # ARCHIVE_OR_DIR
  if [ -d "$1" ]; then
    cp -a "$1" "$work/pdserve-gpu-kit"
  elif command -v xz >/dev/null; then
    tar -C "$work" -xJf "$1"
  else
    python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" "$1" "$work"
  fi
  cat "$work/pdserve-gpu-kit/MANIFEST"
  choose_libstdcxx | tee "$work/libstdcxx.txt"
}

# The host's libstdc++ and libgcc_s where they have every symbol version the
# kit's binaries and libraries need (MANIFEST); else the kit's (Debian 12's
# GCC 12 ones, which need glibc 2.36 where the binaries need 2.34).
choose_libstdcxx() {
  local need_cxx need_gcc host_cxx host_gcc v ok=1
  need_cxx=$(sed -n 's/^needs libstdc++: //p' "$kit/MANIFEST")
  need_gcc=$(sed -n 's/^needs libgcc_s: //p' "$kit/MANIFEST")
  host_cxx=$(ldconfig -p 2>/dev/null | awk '$1 == "libstdc++.so.6" && /x86-64/ {print $NF; exit}')
  host_gcc=$(ldconfig -p 2>/dev/null | awk '$1 == "libgcc_s.so.1" && /x86-64/ {print $NF; exit}')
  [ -n "$host_cxx" ] && [ -n "$host_gcc" ] || ok=0
  for v in $need_cxx; do grep -qa "$v" "$host_cxx" 2>/dev/null || ok=0; done
  for v in $need_gcc; do grep -qa "$v" "$host_gcc" 2>/dev/null || ok=0; done
  if [ $ok -eq 1 ]; then
    mkdir -p "$kit/lib-unused"
    mv "$kit/lib/libstdc++.so.6" "$kit/lib/libgcc_s.so.1" "$kit/lib-unused/"
    echo "libstdc++: the host's $(readlink -f "$host_cxx") (has $need_cxx)"
  else
    echo "libstdc++: the kit's (the host has none with $need_cxx)"
  fi
}

# Directories that may hold the CUDA toolkit's libraries.
cuda_dirs() {
  local d
  for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib \
      "${CUDA_HOME:-/nonexistent}/lib64" \
      "$(dirname "$(command -v nvcc 2>/dev/null || echo /nonexistent/nvcc)")/../lib64"; do
    [ -d "$d" ] && echo "$d"
  done
  python3 -c '
import glob, os, site
for base in site.getsitepackages() + [site.getusersitepackages()]:
    for d in sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib"))):
        print(d)' 2>/dev/null
}

unresolved() {  # every library a kit binary does not find
  local b
  for b in "$kit"/bin/* "$kit"/tests/*; do
    [ -f "$b" ] && [ -x "$b" ] || continue
    ldd "$b" 2>&1 | awk '/not found/ {print $1}'
  done | sort -u
}

facts() {
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -n), kernel $(uname -r), $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME"), $(nproc) cores"
  echo "glibc: $(ldd --version 2>&1 | head -1)"
  cat "$work/libstdcxx.txt"
  if nvidia-smi -L >/dev/null 2>&1; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
      --format=csv
  else
    echo "nvidia-smi: no GPU (dry run)"
  fi
  local missing dirs="" lib d
  missing=$(unresolved)
  if [ -n "$missing" ]; then
    echo "not found through the binaries' own path: $(echo $missing)"
    for lib in $missing; do
      for d in $(cuda_dirs); do
        [ -e "$d/$lib" ] || continue
        case ":$dirs:" in *":$d:"*) ;; *) dirs="$dirs:$d" ;; esac
        break
      done
    done
    dirs=${dirs#:}
    echo "$dirs" > "$work/ld_library_path"
    [ -z "$dirs" ] || echo "LD_LIBRARY_PATH+=$dirs"
    missing=$(LD_LIBRARY_PATH="$dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" unresolved)
    if [ -n "$missing" ]; then
      echo "still not found: $(echo $missing)"
      return 1
    fi
  fi
  echo "libraries: every binary resolves every library (kit, CUDA toolkit, glibc)"
  ldd "$kit/bin/pdserve_cuda_bench" | grep -E 'libcuda|libcublas|libnccl' | sed 's/^[[:space:]]*/  /'
}

# Per test binary: passed, failed, or skipped (every test case skipped
# itself), from its exit status and GoogleTest's summary, as ctest counts.
gpu_tests() {  # BUDGET_S
  local name timeout rc verdict log left passed=0 failed_n=0 skipped=0
  local deadline=$(( $(date +%s) + $1 ))
  : > "$work/test_results"
  mkdir -p "$work/tests"
  while IFS=$'\t' read -r name timeout; do
    log=$work/tests/$name.log
    mkdir -p "$work/tmp/$name"
    left=$(( deadline - $(date +%s) ))
    [ "$timeout" -le "$left" ] || timeout=$left
    if [ "$timeout" -le 0 ]; then
      echo "$name: failed (not run: the step's budget is spent)"
      echo -e "$name\tfailed (not run)" >> "$work/test_results"
      failed_n=$((failed_n + 1))
      continue
    fi
    (cd "$kit/tests" && PDSERVE_REQUIRE_GPU=1 TEST_TMPDIR="$work/tmp/$name" \
      timeout --foreground --kill-after=5 "$timeout" "./$name") > "$log" 2>&1
    rc=$?
    if [ $rc -eq 0 ] && grep -q '\[  PASSED  \] 0 tests\.' "$log"; then
      verdict=skipped
    elif [ $rc -eq 0 ]; then
      verdict=passed
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      verdict="failed (stopped after ${timeout} s)"
    else
      verdict="failed (exit $rc)"
    fi
    case $verdict in
      passed) passed=$((passed + 1)) ;;
      skipped) skipped=$((skipped + 1)) ;;
      *) failed_n=$((failed_n + 1)) ;;
    esac
    echo "$name: $verdict; test cases: $(grep -c '^\[       OK \]' "$log") passed," \
      "$(grep -c '^\[  FAILED  \].*(' "$log") failed, $(grep -c '^\[  SKIPPED \].*(' "$log") skipped"
    grep -h -A1 ': Skipped$\|: Failure$' "$log" | grep -v '^--$' | sort | uniq -c | sort -rn |
      head -4 | sed 's/^/   /'
    echo -e "$name\t$verdict" >> "$work/test_results"
    { echo "===== $name: $verdict"; tail -c 300000 "$log"; } >> "$out/gpu_tests.log"
  done < "$kit/tests/tests.tsv"
  echo "$passed passed, $failed_n failed" | tee "$work/tests_line"
  # With PDSERVE_REQUIRE_GPU=1 a missing device fails; what still skips
  # needs more than this machine has (two GPUs), and is listed.
  [ $skipped -eq 0 ] || echo "($skipped skipped: every test case skipped itself, reasons above)" |
    tee -a "$work/tests_line"
  [ $failed_n -eq 0 ]
}

no_device_re='no usable\|no CUDA-capable\|cudaErrorNoDevice\|cudaErrorInsufficientDriver\|PDSERVE_REQUIRE_GPU=1 but'

# Dry run: without a device every test binary must fail naming the missing
# device, or pass on work that needs none; none may pass by skipping.
dry_tests() {  # BUDGET_S
  gpu_tests "$1"
  local name verdict bad=0
  while IFS=$'\t' read -r name verdict; do
    case $verdict in
      passed) echo "dry: $name passed without a device (it needs none)" ;;
      skipped) echo "dry: $name skipped instead of failing"; bad=1 ;;
      "failed (exit"*)
        if grep -q "$no_device_re" "$work/tests/$name.log"; then
          echo "dry: $name failed on the missing device, as it must"
        else
          echo "dry: $name failed for another reason:"; tail -20 "$work/tests/$name.log"; bad=1
        fi ;;
      *) echo "dry: $name: $verdict"; bad=1 ;;
    esac
  done < "$work/test_results"
  return $bad
}

# Dry run: COMMAND must fail, naming the missing device.
must_fail_without_device() {  # WHAT COMMAND...
  local what=$1 log
  shift
  log=$work/dry_$(date +%s%N).txt
  if "$@" > "$log" 2>&1; then
    cat "$log"
    echo "dry: $what succeeded without a device"
    return 1
  fi
  tail -5 "$log"
  if grep -q "$no_device_re" "$log"; then
    echo "dry: $what failed on the missing device, as it must"
  else
    echo "dry: $what failed for another reason"
    return 1
  fi
}

cuda_check() {
  local args=(--shapes=llama-1b,qwen3-0.6b --layers=4 --prompt_tokens=40 --decode_steps=16)
  if [ "$dry" = 1 ]; then
    must_fail_without_device pdserve_cuda_check "$kit/bin/pdserve_cuda_check" "${args[@]}"
  else
    "$kit/bin/pdserve_cuda_check" "${args[@]}"
  fi
}

cluster() {
  bash "$root/tests/gpu/kit_cluster.sh" "$kit" "$work/cluster-cpu" cpu || return 1
  if [ "$dry" = 1 ]; then
    must_fail_without_device "the cuda cluster" \
      bash "$root/tests/gpu/kit_cluster.sh" "$kit" "$work/cluster-cuda" cuda
    return
  fi
  bash "$root/tests/gpu/kit_cluster.sh" "$kit" "$work/cluster-cuda" cuda || return 1
  if cmp -s "$work/cluster-cpu/tokens" "$work/cluster-cuda/tokens"; then
    echo "the cuda cluster streamed the cpu cluster's greedy tokens (3 prompts)"
  else
    echo "DIFFERENT greedy tokens (cpu <, cuda >):"
    diff "$work/cluster-cpu/tokens" "$work/cluster-cuda/tokens"
    return 1
  fi
}

bench() {
  if [ "$dry" = 1 ]; then
    must_fail_without_device pdserve_cuda_bench "$kit/bin/pdserve_cuda_bench" --shapes=tiny \
      --results_tsv="$out/bench.tsv" || return 1
    must_fail_without_device "pdserve_kv_transfer_bench --transport=ipc" \
      "$kit/bin/pdserve_kv_transfer_bench" --transport=ipc --tokens=16 --layers=2 --runs=1
    return
  fi
  local rc rc2
  echo '```'
  timeout --foreground --kill-after=3 78 "$kit/bin/pdserve_cuda_bench" --shapes=llama-1b,llama-8b \
    --batches=1,32 --contexts=512,4096 --prefill_tokens=2048,8192 --graphs=on,off --steps=10 \
    --warmup=3 --results_tsv="$out/bench.tsv"
  rc=$?
  echo '```'
  echo
  echo '```'
  timeout --foreground --kill-after=3 14 "$kit/bin/pdserve_kv_transfer_bench" --transport=ipc \
    --tokens=2048,8192 --runs=5
  rc2=$?
  echo '```'
  [ $rc -eq 0 ] && [ $rc2 -eq 0 ]
}

overlap() {
  local args=(--backend=cuda --model_dir="$root/tools/demo_model" --batches=1,8,32 --tokens=128)
  if [ "$dry" = 1 ]; then
    must_fail_without_device "pdserve_overlap_bench --backend=cuda" \
      "$kit/bin/pdserve_overlap_bench" "${args[@]}" --rounds=1
    return
  fi
  echo '```'
  "$kit/bin/pdserve_overlap_bench" "${args[@]}" --rounds=3
  local rc=$?
  echo '```'
  return $rc
}

# The performance table and the targets' verdicts, in markdown, from the
# benchmarks' --results_tsv lines and their tables (the gpu_kit check runs
# this on made-up figures).
perf_table() {  # BENCH_TSV BENCH_MD
  local tsv=$1 md=$2 copy gemm shape b n t on off p ipc
  figure() {  # AWK_PROGRAM: the first line it prints from the tsv
    awk -F'\t' "$1" "$tsv" | head -1
  }
  decode_cell() {  # SHAPE GRAPHS BATCH CONTEXT
    figure "\$1 == \"decode\" && \$2 == \"$1\" && \$3 == \"$2\" && \$4 == $3 && \$5 == $4 \
      {printf \"%.3f ms, %.0f%%\", \$6, 100 * \$7}"
  }
  target() {  # WHAT VALUE TARGET
    if [ -z "$2" ]; then
      echo "| $1 | not measured | >= $3 | MISSED (no figure) |"
    elif awk -v v="$2" -v t="$3" 'BEGIN { exit !(v + 0 >= t + 0) }'; then
      echo "| $1 | $2 | >= $3 | met |"
    else
      echo "| $1 | $2 | >= $3 | MISSED |"
    fi
  }
  copy=$(figure '$1 == "peak" && $2 == "copy" {printf "%.0f GB/s", $3 / 1e9}')
  gemm=$(figure '$1 == "peak" && $2 == "gemm" {printf "%.0f TFLOP/s", $3 / 1e12}')
  echo "Measured peaks: device-to-device copy ${copy:-not measured} (bytes read + written)," \
    "cuBLAS bf16 GEMM ${gemm:-not measured}. Decode cells: step time, and bytes read per" \
    "second as a fraction of the copy bandwidth."
  echo
  echo "| shape | figure | CUDA graphs on | CUDA graphs off |"
  echo "| --- | --- | ---: | ---: |"
  for shape in llama-1b llama-8b; do
    for b in 1 32; do
      for n in 512 4096; do
        on=$(decode_cell $shape on $b $n)
        off=$(decode_cell $shape off $b $n)
        echo "| $shape | decode, batch $b, context $n | ${on:-not measured} | ${off:-not measured} |"
      done
    done
    for t in 2048 8192; do
      p=$(figure "\$1 == \"prefill\" && \$2 == \"$shape\" && \$3 == $t \
        {printf \"%.1f ms, MFU %.0f%%\", \$4, 100 * \$5}")
      echo "| $shape | prefill, $t tokens | ${p:-not measured} | |"
    done
  done
  echo
  # pdserve_kv_transfer_bench's rows: | tokens | KV bytes | GB/s | ...
  ipc=$(awk -F'|' '/^\| *[0-9]+ *\| *[0-9.]+ MiB *\|/ {gsub(/ /, "", $2); gsub(/ /, "", $4);
    printf "%s%s tokens: %s GB/s", sep, $2, $4; sep = "; "}' "$md")
  echo "KV transfer by CUDA IPC (pdserve_kv_transfer_bench --transport=ipc, 8B shape, one" \
    "process): ${ipc:-not measured}"
  echo
  echo "| target | measured | target | verdict |"
  echo "| --- | ---: | ---: | --- |"
  target "llama-1b batch-1 decode (context 512, graphs on), of copy bandwidth" \
    "$(figure '$1 == "decode" && $2 == "llama-1b" && $3 == "on" && $4 == 1 && $5 == 512 {printf "%.2f", $7}')" 0.70
  target "llama-8b prefill MFU at 2048 tokens" \
    "$(figure '$1 == "prefill" && $2 == "llama-8b" && $3 == 2048 {printf "%.2f", $5}')" 0.55
}

if [ "${1:-}" = --step ]; then
  shift
  "$@"
  exit
fi

# ---- main ----
dry=0
kit_arg=${PDSERVE_GPUKIT:-$root/gpukit}/pdserve-gpu-kit.tar.xz
while [ $# -gt 0 ]; do
  case "$1" in
    --dry) dry=1; shift ;;
    --kit) kit_arg=$2; shift 2 ;;
    *) echo "run_kit.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
work=${PDSERVE_KIT_WORK:-/tmp/pdserve-gpu-kit-run}
out=${OUT:-$work/out}
kit=$work/pdserve-gpu-kit
export root dry work out kit
start=$(date +%s)

if [ $dry -eq 0 ] && ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "run_kit.sh: no GPU here (nvidia-smi lists none); nothing was run." >&2
  echo "run_kit.sh: on a machine without a GPU, --dry runs the parts that need none." >&2
  exit 1
fi
if [ ! -e "$kit_arg" ]; then
  echo "run_kit.sh: no kit at $kit_arg: make it with tests/gpu/make_kit.sh on the build" \
    "machine and carry gpukit/ (tests/gpu/README.md)" >&2
  exit 1
fi
rm -rf "$work"
mkdir -p "$work/tmp" "$out"
steps=$work/steps.md
: > "$steps"
failed=0

# step NAME BUDGET_S LOG FUNCTION ARGS...: FUNCTION's output appended to LOG,
# stopped with every process it started after BUDGET_S seconds.
step() {
  local name=$1 budget=$2 log=$3 t0 rc verdict
  shift 3
  t0=$(date +%s)
  echo "== $name (budget ${budget} s)" | tee -a "$log"
  timeout --kill-after=3 "$budget" bash "$0" --step "$@" >> "$log" 2>&1
  rc=$?
  case $rc in
    0) verdict=passed ;;
    124|137) verdict="STOPPED after its ${budget} s budget"; failed=1 ;;
    *) verdict="FAILED (exit $rc)"; failed=1 ;;
  esac
  echo "| $name | $verdict | $(( $(date +%s) - t0 )) s |" >> "$steps"
  echo "   $name: $verdict, $(( $(date +%s) - t0 )) s"
  return $rc
}

step unpack 30 "$work/unpack.log" unpack "$kit_arg" || { cat "$work/unpack.log" >&2; exit 1; }
: > "$out/nvidia-smi.txt"
step "facts and libraries" 20 "$out/nvidia-smi.txt" facts
if [ -s "$work/ld_library_path" ]; then
  export LD_LIBRARY_PATH="$(cat "$work/ld_library_path")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
if [ $dry -eq 0 ]; then nvidia-smi >> "$out/nvidia-smi.txt" 2>&1; fi

: > "$out/gpu_tests.log"
if [ $dry -eq 1 ]; then
  step "gpu tests (dry: must fail on the missing device)" 100 "$work/tests.txt" dry_tests 92
else
  step "gpu tests" 100 "$work/tests.txt" gpu_tests 92
fi
: > "$out/cuda_check.log"
step "cuda vs cpu runner" 45 "$out/cuda_check.log" cuda_check
: > "$out/cluster.log"
step "cluster cpu vs cuda" 45 "$out/cluster.log" cluster
: > "$out/bench.md"
: > "$out/bench.tsv"
step bench 100 "$out/bench.md" bench
: > "$out/overlap.md"
step "overlap on and off" 20 "$out/overlap.md" overlap

# ---- summary ----
{
  echo "# pdserve GPU run kit: $([ $dry -eq 1 ] && echo "dry run, no GPU" || echo "GPU run"), $(date -u +%Y-%m-%d)"
  echo
  sed 's/^/    /' "$kit/MANIFEST"
  echo
  echo '```'
  grep -v '^==' "$out/nvidia-smi.txt" | sed -n '1,/^libraries:/p'
  echo '```'
  echo
  echo "| step | result | time |"
  echo "| --- | --- | ---: |"
  cat "$steps"
  echo
  echo "## gpu tests (PDSERVE_REQUIRE_GPU=1)"
  echo
  echo '```'
  grep -v '^==' "$work/tests.txt"
  echo '```'
  echo
  cat "$work/tests_line" 2>/dev/null || echo "0 passed, 0 failed (not run)"
  echo
  echo "## CUDA vs CPU runner (pdserve_cuda_check)"
  echo
  echo '```'
  grep -v '^==' "$out/cuda_check.log" | tail -20
  echo '```'
  echo
  echo "## cluster: 1 prefill + 1 decode worker, demo model, CPU then GPU (KV by CUDA IPC)"
  echo
  echo '```'
  grep -v '^==' "$out/cluster.log" | tail -30
  echo '```'
  echo
  echo "## performance"
  echo
  if [ $dry -eq 1 ]; then
    echo "not measured: dry run, no GPU"
  else
    perf_table "$out/bench.tsv" "$out/bench.md"
  fi
  echo
  echo "## overlap of the next step with the last one's hand-out (pdserve_overlap_bench --backend=cuda)"
  echo
  if [ $dry -eq 1 ]; then
    echo "not measured: dry run, no GPU"
  else
    grep -v '^==' "$out/overlap.md" | tail -20
  fi
  echo
  echo "total: $(( $(date +%s) - start )) s; $([ $failed -eq 0 ] && echo "every step passed" || echo "SOME STEPS FAILED")"
} > "$out/summary.md"
cat "$out/summary.md"
echo "run_kit.sh: results in $out"
exit $failed
