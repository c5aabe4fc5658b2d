#!/usr/bin/env bash
# Makes the GPU run kit: the CUDA build's binaries with every shared library
# they need that a bare GPU machine lacks, in one git-ignored folder that
# travels with the working tree (tests/gpu/README.md). On this machine
# (Debian 12, nvcc at /usr/local/cuda):
#   1. configures the `cuda` preset (./build-cuda, the build CI already
#      makes) with PDSERVE_KIT=ON: executables look up libraries in ../lib
#      beside them, then in the CUDA toolkit (DT_RPATH);
#   2. builds pdserve_cuda_all (kernels, gpu tests, pdserve_cuda_bench,
#      pdserve_cuda_check) and the service binaries with the CUDA backend,
#      pdserve_client, pdserve_make_model, pdserve_kv_transfer_bench and
#      pdserve_overlap_bench;
#   3. lays out pdserve-gpu-kit/: bin/ (tools and services), tests/ (every
#      ctest of label gpu, with its timeout in tests.tsv, and kv_peer),
#      lib/ (what `ldd` lists, less glibc, the CUDA toolkit's and the
#      driver's libraries; libstdc++ and libgcc_s included, for hosts
#      without GCC 12's, run_kit.sh deciding), build/ (symlinks in the
#      build tree's layout, for deploy/local/cluster.sh --bin), MANIFEST
#      (commit, CUDA libraries and symbol versions the host must have);
#      binaries and libraries stripped; libicudata replaced by an ICU stub
#      (icudata_stub.c: the kit never loads ICU data; NFC/NFD stay, being
#      built into libicuuc);
#   4. packs it as GPUKIT/pdserve-gpu-kit.tar.xz (GPUKIT: $PDSERVE_GPUKIT,
#      default ./gpukit, ignored by git) and fails if that exceeds 48 MiB.
# Prints the kit's folder (GPUKIT) as its last line.
#   tests/gpu/make_kit.sh [--jobs N]
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)
jobs=$(nproc)
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs=$2; shift 2 ;;
    *) echo "make_kit.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
readonly max_bytes=$((48 << 20))
gpukit=${PDSERVE_GPUKIT:-$root/gpukit}
build=$root/build-cuda
nvcc=/usr/local/cuda/bin/nvcc
[ -x "$nvcc" ] || { echo "make_kit.sh: no CUDA toolkit at /usr/local/cuda" >&2; exit 1; }
start=$(date +%s)

# shellcheck source=deploy/local/compiler_cache.sh
. deploy/local/compiler_cache.sh
cmake --preset cuda -DPDSERVE_KIT=ON "${compiler_cache[@]}" >/dev/null
cmake --build "$build" -j "$jobs" --target pdserve_cuda_all pdserve_router_main \
  pdserve_prefill_worker pdserve_decode_worker pdserve_client pdserve_make_model \
  pdserve_kv_transfer_bench pdserve_overlap_bench kv_peer
built=$(date +%s)

stage=$build/kit-stage
kit=$stage/pdserve-gpu-kit
rm -rf "$stage"
mkdir -p "$kit/bin" "$kit/tests" "$kit/lib" "$kit/build/router" "$kit/build/prefill_worker" \
  "$kit/build/decode_worker"

# Binaries. The gpu tests as ctest knows them (name, executable, timeout).
ctest --test-dir "$build" -L '^gpu$' --show-only=json-v1 > "$stage/tests.json"
python3 - "$stage/tests.json" > "$stage/tests.tsv" <<'EOF'
import json, sys
for t in json.load(open(sys.argv[1]))["tests"]:
    props = {p["name"]: p["value"] for p in t.get("properties", [])}
    print("%s\t%s\t%s" % (t["name"], t["command"][0], int(float(props.get("TIMEOUT", 300)))))
EOF
[ -s "$stage/tests.tsv" ] || { echo "make_kit.sh: ctest lists no gpu test in $build" >&2; exit 1; }
: > "$kit/tests/tests.tsv"
while IFS=$'\t' read -r name exe timeout; do
  cp "$exe" "$kit/tests/$name"
  printf '%s\t%s\n' "$name" "$timeout" >> "$kit/tests/tests.tsv"
done < "$stage/tests.tsv"
cp "$build/tests/unit/kvtransfer/kv_peer" "$kit/tests/"  # spawned by kv_peer_kill_test
for b in router/pdserve_router prefill_worker/pdserve_prefill_worker \
    decode_worker/pdserve_decode_worker router/pdserve_client tools/pdserve_make_model \
    bench/pdserve_cuda_bench bench/pdserve_kv_transfer_bench bench/pdserve_overlap_bench \
    tests/gpu/pdserve_cuda_check; do
  cp "$build/$b" "$kit/bin/"
done
for b in router/pdserve_router prefill_worker/pdserve_prefill_worker \
    decode_worker/pdserve_decode_worker; do
  ln -s "../../bin/$(basename "$b")" "$kit/build/$b"
done
strip --strip-unneeded "$kit"/bin/* "$kit"/tests/kv_peer
while IFS=$'\t' read -r name _; do strip --strip-unneeded "$kit/tests/$name"; done < "$kit/tests/tests.tsv"

# Libraries: everything the binaries resolve outside glibc, the CUDA
# toolkit and the driver, by the name they ask for.
glibc_re='^(ld-linux-x86-64\.so\.2|libc\.so\.6|libm\.so\.6|libmvec\.so\.1|libpthread\.so\.0|libdl\.so\.2|librt\.so\.1|libresolv\.so\.2|libutil\.so\.1|libanl\.so\.1|libnsl\.so\.1|libnss_[a-z]+\.so\.2|libBrokenLocale\.so\.1|libthread_db\.so\.1|libc_malloc_debug\.so\.0|linux-vdso\.so\.1)$'
cuda_libs=""
binaries=$(find "$kit/bin" "$kit/tests" -type f -perm -u+x)
for b in $binaries; do
  env -i /usr/bin/ldd "$b" | awk '$2 == "=>" {print $1, $3}'
done | sort -u > "$stage/needed.txt"
while read -r name path; do
  if [[ $name =~ $glibc_re ]]; then continue; fi
  if [ "$path" = "not" ]; then echo "make_kit.sh: $name not found" >&2; exit 1; fi
  real=$(readlink -f "$path")
  case "$real" in
    /usr/local/cuda*|*/libcuda.so*)
      cuda_libs="$cuda_libs $name"
      continue ;;
  esac
  if [[ $name =~ ^libicudata\.so\.([0-9]+)$ ]]; then
    cc -O2 -shared -fPIC -DICUDT_SYMBOL="icudt${BASH_REMATCH[1]}_dat" -Wl,-soname,"$name" \
      -o "$kit/lib/$name" tests/gpu/icudata_stub.c
  else
    cp "$real" "$kit/lib/$name"
  fi
  strip --strip-unneeded "$kit/lib/$name"
done < "$stage/needed.txt"

# Nothing may resolve outside the kit, glibc and the CUDA toolkit now.
for b in $binaries; do
  env -i /usr/bin/ldd "$b" | awk '$2 == "=>" {print $1, $3}'
done | sort -u | while read -r name path; do
  [[ $name =~ $glibc_re ]] && continue
  case "$(readlink -f "$path")" in "$kit/lib/"*|/usr/local/cuda*) continue ;; esac
  echo "make_kit.sh: $name resolves to $path, outside the kit" >&2
  exit 1
done

# The newest symbol versions the kit asks of glibc, libstdc++ and libgcc_s:
# run_kit.sh uses the host's libstdc++ and libgcc_s where they have these
# (the kit's, Debian 12's, need glibc 2.36), the kit's otherwise.
needs() {  # PREFIX FILES...: the newest PREFIX_x.y the files need
  local prefix=$1
  shift
  objdump -T "$@" 2>/dev/null | awk '/\*UND\*/' | grep -o "${prefix}_[0-9][0-9.]*" |
    sort -u -t_ -k2,2V | tail -1
}
own=$(echo $binaries; ls "$kit"/lib/* | grep -v '/libstdc++\.so\|/libgcc_s\.so')
{
  echo "pdserve GPU run kit"
  echo "commit: $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "made: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(. /etc/os-release && echo "$PRETTY_NAME")"
  echo "nvcc: $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "cuda architectures: $(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' "$build/CMakeCache.txt")"
  echo "needs from the CUDA toolkit:$(echo "$cuda_libs" | tr ' ' '\n' | sort -u | tr '\n' ' ')"
  echo "needs glibc: $(needs GLIBC $own) ($(needs GLIBC "$kit/lib/libstdc++.so.6" "$kit/lib/libgcc_s.so.1") with the kit's libstdc++)"
  echo "needs libstdc++: $(needs GLIBCXX $own) $(needs CXXABI $own)"
  echo "needs libgcc_s: $(needs GCC $own)"
} > "$kit/MANIFEST"

# Pack.
mkdir -p "$gpukit"
raw=$(du -sb "$kit" | cut -f1)
tar -C "$stage" -cf - pdserve-gpu-kit | xz -T0 -6 > "$gpukit/pdserve-gpu-kit.tar.xz.tmp"
mv "$gpukit/pdserve-gpu-kit.tar.xz.tmp" "$gpukit/pdserve-gpu-kit.tar.xz"
packed=$(stat -c %s "$gpukit/pdserve-gpu-kit.tar.xz")
cp "$kit/MANIFEST" "$gpukit/MANIFEST"
end=$(date +%s)
cat "$kit/MANIFEST"
echo "kit: $(find "$kit" -type f | wc -l) files, $((raw >> 20)) MiB unpacked, $((packed >> 20)).$(((packed % (1 << 20)) * 10 >> 20)) MiB packed ($gpukit/pdserve-gpu-kit.tar.xz); build $((built - start)) s, layout and packing $((end - built)) s"
if [ "$packed" -gt "$max_bytes" ]; then
  echo "make_kit.sh: the packed kit is over 48 MiB" >&2
  exit 1
fi
echo "$gpukit"
