#!/usr/bin/env bash
# Builds the safetensors header fuzzer (tests/fuzz/safetensors_fuzz.cc) with
# clang, libFuzzer, ASan and UBSan in its own build directory, writes a small
# seed corpus and a dictionary, and runs the fuzzer for a bounded time.
#
#   tests/fuzz/run_fuzz.sh [SECONDS=60] [BUILD_DIR=build-fuzz]
#
# Needs clang and libFuzzer's runtime. On Debian 12:
#   apt-get install clang libclang-rt-14-dev libomp-14-dev
# (libclang-rt-14-dev ships libclang_rt.fuzzer; libomp-14-dev lets the
# project's OpenMP check pass under clang.) Crashing inputs are written to
# BUILD_DIR/fuzz_artifacts/; exit status is the fuzzer's (0: no crash).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
build="${2:-$root/build-fuzz}"
jobs="${JOBS:-2}"

if ! command -v clang++ >/dev/null; then
  echo "run_fuzz.sh: clang++ not found (apt-get install clang libclang-rt-14-dev)" >&2
  exit 2
fi
if ! ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1; then
  echo "run_fuzz.sh: libFuzzer runtime not found (apt-get install libclang-rt-14-dev)" >&2
  exit 2
fi

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DPDSERVE_FUZZ=ON -DPDSERVE_BUILD_BENCH=OFF >/dev/null
cmake --build "$build" -j"$jobs" --target safetensors_fuzz

corpus="$build/fuzz_corpus/safetensors"
artifacts="$build/fuzz_artifacts/"
mkdir -p "$corpus" "$artifacts"
# Seeds: valid files of each float dtype (scalar, empty and 2-D tensors,
# metadata, padding) and a few near-misses the parser must refuse.
python3 - "$corpus" <<'PY'
import json, struct, sys, os
out = sys.argv[1]
def write(name, header, data=b"", raw_header=None):
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    with open(os.path.join(out, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)
write("f32_matrix", {"__metadata__": {"format": "pt"},
                     "a": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}},
      struct.pack("<6f", 1, -2.5, 3.25, 0, 1e-3, -7))
write("bf16_f16", {"b": {"dtype": "BF16", "shape": [2], "data_offsets": [0, 4]},
                   "h": {"dtype": "F16", "shape": [2], "data_offsets": [4, 8]}}, bytes(range(8)))
write("scalar_and_empty", {"s": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
                           "e": {"dtype": "F32", "shape": [0, 5], "data_offsets": [4, 4]}},
      struct.pack("<f", 42))
write("padded", None, struct.pack("<f", 1),
      raw_header=json.dumps({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode() + b"    ")
write("int_dtypes", {"i": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
                     "u": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}}, bytes(11))
write("overlap", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}, bytes(12))
write("out_of_range", {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, bytes(8))
write("wrong_size", {"a": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}}, bytes(8))
with open(os.path.join(out, "huge_header_len"), "wb") as f:
    f.write(struct.pack("<Q", 1 << 40) + b"{}")
PY
cat > "$build/fuzz_corpus/safetensors.dict" <<'DICT'
"__metadata__"
"dtype"
"shape"
"data_offsets"
"F32"
"F16"
"BF16"
"F64"
"I64"
"BOOL"
"F8_E4M3"
"format"
"pt"
DICT

echo "run_fuzz.sh: fuzzing for ${seconds}s (corpus $corpus)"
"$build/tests/fuzz/safetensors_fuzz" -max_total_time="$seconds" -max_len=4096 \
  -dict="$build/fuzz_corpus/safetensors.dict" -artifact_prefix="$artifacts" \
  -print_final_stats=1 "$corpus"
