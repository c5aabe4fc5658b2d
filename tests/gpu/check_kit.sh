#!/usr/bin/env bash
# ctest gpu_kit (label gpu_kit, in builds configured with PDSERVE_KIT): the
# GPU run kit that tests/gpu/make_kit.sh made is self-contained, and its run
# script works. On this machine, as root, without a GPU:
#   1. the packed kit is at most 48 MiB;
#   2. every binary of the kit, under `env -i` and with the loader's cache
#      off, resolves every library from the kit's lib/, the CUDA toolkit
#      (/usr/local/cuda) or glibc, and nothing else; every library in lib/
#      asks only for libraries of the kit, the toolkit or glibc;
#   3. in a clean room (a mount namespace where /usr/lib/x86_64-linux-gnu
#      holds glibc alone, the loader cache is empty), clean_room.sh runs the
#      binaries: --help, --gtest_list_tests, pdserve_make_model, a CPU
#      cluster streaming the demo model's greedy continuation;
#   4. run_kit.sh without a GPU stops at once saying so (where none is);
#      run_kit.sh --dry passes and writes at most 8 files;
#   5. its performance table and target verdicts render made-up figures.
# A kit that still needs one Debian library fails 2 and 3.
#   tests/gpu/check_kit.sh [ARCHIVE]   (default gpukit/pdserve-gpu-kit.tar.xz)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
archive=${1:-${PDSERVE_GPUKIT:-$root/gpukit}/pdserve-gpu-kit.tar.xz}
fail() {
  echo "gpu_kit: FAILED: $*" >&2
  exit 1
}
[ -f "$archive" ] || fail "no kit at $archive: run tests/gpu/make_kit.sh first"
tmp=$(mktemp -d "${TEST_TMPDIR:-/tmp}/gpu_kit.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

# 1.
size=$(stat -c %s "$archive")
[ "$size" -le $((48 << 20)) ] || fail "the packed kit is $size bytes, over 48 MiB"
tar -C "$tmp" -xJf "$archive"
kit=$tmp/pdserve-gpu-kit
echo "gpu_kit: $archive, $((size >> 20)) MiB packed, $(du -sm "$kit" | cut -f1) MiB unpacked"

# 2.
glibc_re='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libnss_[a-z]+\.so\.2|libBrokenLocale\.so\.1|libthread_db\.so\.1|libc_malloc_debug\.so\.0|linux-vdso\.so\.1)$'
ldso=/lib64/ld-linux-x86-64.so.2
# resolves KIT: prints the first library found outside the kit, the CUDA
# toolkit and glibc, and fails; else prints a count.
resolves() {
  local kit=$1 b l name arrow path rest n=0
  for b in $(find "$kit/bin" "$kit/tests" -type f -perm -u+x); do
    if ! env -i "$ldso" --inhibit-cache --list "$b" > "$tmp/list.txt" 2>&1; then
      echo "$b: $(cat "$tmp/list.txt")"
      return 1
    fi
    while read -r name arrow path rest; do
      [ "$arrow" = "=>" ] || continue
      if [ "$path" = not ]; then echo "$b: $name not found"; return 1; fi
      case "$(readlink -f "$path")" in "$kit/lib/"*|/usr/local/cuda*) continue ;; esac
      if ! [[ $name =~ $glibc_re ]]; then
        echo "$b: $name resolves to $path, outside the kit, the CUDA toolkit and glibc"
        return 1
      fi
    done < "$tmp/list.txt"
    n=$((n + 1))
  done
  for l in "$kit"/lib/*; do
    for name in $(objdump -p "$l" | awk '$1 == "NEEDED" {print $2}'); do
      if ! [ -e "$kit/lib/$name" ] && ! [ -e "/usr/local/cuda/lib64/$name" ] &&
          ! [[ $name =~ $glibc_re ]]; then
        echo "$l needs $name, which is neither in the kit, the CUDA toolkit nor glibc"
        return 1
      fi
    done
  done
  echo "$n binaries and $(ls "$kit/lib" | wc -l) libraries resolve within the kit, the CUDA toolkit and glibc"
}
msg=$(resolves "$kit") || fail "$msg"
echo "gpu_kit: $msg"

# 3.
mkdir -p "$tmp/glibc"
for f in $(dpkg -L libc6 | grep -E '^/(usr/)?lib/x86_64-linux-gnu/[^/]+\.so[.0-9]*$'); do
  cp -L "$f" "$tmp/glibc/"
done
[ -e "$tmp/glibc/libc.so.6" ] && [ -e "$tmp/glibc/ld-linux-x86-64.so.2" ] ||
  fail "cannot gather glibc (dpkg -L libc6)"
command -v unshare >/dev/null || fail "unshare (util-linux) is needed for the clean room"
clean_room() {  # KIT ROOM [resolve-only]
  mkdir -p "$2"
  timeout --kill-after=10 300 unshare --mount --propagation private /bin/sh -c '
    mount --bind /dev/null /etc/ld.so.cache &&
    mount --bind "$1" /usr/lib/x86_64-linux-gnu &&
    shift &&
    exec /bin/sh "$@"' clean-room "$tmp/glibc" "$root/tests/gpu/clean_room.sh" "$1" "$root" "$2" ${3:-}
}
clean_room "$kit" "$tmp/room" || fail "the clean-room run failed (above)"

# The checks have teeth: the kit less one library (protobuf) fails both.
cp -a "$kit" "$tmp/less"
rm "$tmp/less/lib/libprotobuf.so."*
if msg=$(resolves "$tmp/less"); then fail "the kit without protobuf passed: $msg"; fi
echo "gpu_kit: without protobuf the resolution check fails: $msg"
if clean_room "$tmp/less" "$tmp/room-less" resolve-only > "$tmp/less.txt" 2>&1; then
  fail "the kit without protobuf passed the clean room: $(cat "$tmp/less.txt")"
fi
echo "gpu_kit: without protobuf the clean room fails: $(tail -1 "$tmp/less.txt" | cut -c1-200)"

# 4.
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  if PDSERVE_KIT_WORK=$tmp/nogpu bash "$root/tests/gpu/run_kit.sh" --kit "$archive" \
      > "$tmp/nogpu.txt" 2>&1; then
    fail "run_kit.sh passed without a GPU"
  fi
  grep -q "no GPU here" "$tmp/nogpu.txt" || fail "run_kit.sh without a GPU: $(cat "$tmp/nogpu.txt")"
  echo "gpu_kit: run_kit.sh without --dry and without a GPU stops at once: $(head -1 "$tmp/nogpu.txt")"
fi
mkdir -p "$tmp/out"
OUT=$tmp/out PDSERVE_KIT_WORK=$tmp/dry bash "$root/tests/gpu/run_kit.sh" --dry --kit "$archive" ||
  fail "run_kit.sh --dry failed (above)"
files=$(find "$tmp/out" -type f | wc -l)
[ "$files" -le 8 ] || fail "run_kit.sh wrote $files files into \$OUT, more than 8"
grep -q '^[0-9]* passed, [0-9]* failed$' "$tmp/out/summary.md" ||
  fail "no 'N passed, N failed' line in summary.md"
echo "gpu_kit: run_kit.sh --dry passed; \$OUT: $(cd "$tmp/out" && ls | tr '\n' ' ')"
# 5. The summary's performance table and the targets' verdicts, from
# made-up figures in the benchmarks' formats.
printf 'peak\tcopy\t3.0e12\npeak\tgemm\t7.5e14\n' > "$tmp/perf.tsv"
printf 'decode\tllama-1b\ton\t1\t512\t1.1000\t0.7512\ndecode\tllama-1b\toff\t1\t512\t2.5\t0.33\n' \
  >> "$tmp/perf.tsv"
printf 'prefill\tllama-8b\t2048\t80.5\t0.4012\n' >> "$tmp/perf.tsv"
printf '| tokens | KV bytes | bandwidth GB/s | TTFT model ms | exposed ms | exposed / TTFT |\n' \
  > "$tmp/perf.md"
printf '| 2048 | 256 MiB | 812.34 | 54.6 | 0.3 | 0.5%% |\n| 8192 | 1024 MiB | 905.10 | 230.0 | 0.4 | 0.2%% |\n' \
  >> "$tmp/perf.md"
table=$(bash "$root/tests/gpu/run_kit.sh" --step perf_table "$tmp/perf.tsv" "$tmp/perf.md")
for want in "device-to-device copy 3000 GB/s" "cuBLAS bf16 GEMM 750 TFLOP/s" \
    "| llama-1b | decode, batch 1, context 512 | 1.100 ms, 75% | 2.500 ms, 33% |" \
    "| llama-1b | decode, batch 32, context 512 | not measured | not measured |" \
    "| llama-8b | prefill, 2048 tokens | 80.5 ms, MFU 40% | |" \
    "2048 tokens: 812.34 GB/s; 8192 tokens: 905.10 GB/s" \
    "| 0.75 | >= 0.70 | met |" "| 0.40 | >= 0.55 | MISSED |"; do
  grep -qF -- "$want" <<< "$table" || fail "the performance table has no \"$want\": $table"
done
echo "gpu_kit: the summary's performance table and verdicts render made-up figures as expected"
echo "gpu_kit: passed"
