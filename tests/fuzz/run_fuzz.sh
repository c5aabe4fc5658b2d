#!/usr/bin/env bash
# Builds the fuzzers (tests/fuzz/*_fuzz.cc: the safetensors header reader,
# GenerateRequest bytes through the front end's decoding, validation and
# prompt building, the tokenizer.json loader, and the chat template parser
# and renderer) with clang, libFuzzer, ASan and UBSan in their own build
# directory, writes small seed corpora and dictionaries, and runs each fuzzer
# for a bounded time. Every library of that build is instrumented
# (-fsanitize=fuzzer-no-link, address, undefined).
#
#   tests/fuzz/run_fuzz.sh [SECONDS=60] [BUILD_DIR=build-fuzz] [FUZZER=all]
#
# FUZZER: safetensors_fuzz, generate_request_fuzz, tokenizer_json_fuzz,
# chat_template_fuzz, or all (each runs SECONDS).
#
# Needs clang and libFuzzer's runtime; the newest clang with a runtime is
# used (CLANG=clang++-NN picks one). On Debian 12:
#   apt-get install clang-16 libclang-rt-16-dev libomp-16-dev
# (libclang-rt-NN-dev ships libclang_rt.fuzzer; libomp-NN-dev lets the
# project's OpenMP check pass under clang). clang 14 compiles
# safetensors_fuzz but not the front end's dependencies: it cannot compile
# libstdc++ 12's <ranges>, which engine/runtime/sampler.cc uses. Crashing
# inputs are written to BUILD_DIR/fuzz_artifacts/; exit status is the
# fuzzers' (0: no crash).
set -euo pipefail

root="$(cd "$(dirname "$0")/../.." && pwd)"
seconds="${1:-60}"
build="${2:-$root/build-fuzz}"
which="${3:-all}"
jobs="${JOBS:-2}"

cxx="${CLANG:-}"
if [ -z "$cxx" ]; then
  for v in 19 18 17 16 15 14; do
    if command -v "clang++-$v" >/dev/null &&
       ls /usr/lib/llvm-"$v"/lib/clang/*/lib/linux/libclang_rt.fuzzer-*.a >/dev/null 2>&1; then
      cxx="clang++-$v"
      break
    fi
  done
fi
if [ -z "$cxx" ]; then
  echo "run_fuzz.sh: no clang++ with a libFuzzer runtime (apt-get install clang-16 libclang-rt-16-dev)" >&2
  exit 2
fi
cc="${cxx/clang++/clang}"

instrument="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_C_FLAGS="$instrument" -DCMAKE_CXX_FLAGS="$instrument" \
  -DPDSERVE_FUZZ=ON -DPDSERVE_BUILD_BENCH=OFF >/dev/null
case "$which" in
  all) targets=(safetensors_fuzz generate_request_fuzz tokenizer_json_fuzz chat_template_fuzz) ;;
  safetensors_fuzz | generate_request_fuzz | tokenizer_json_fuzz | chat_template_fuzz)
    targets=("$which") ;;
  *) echo "run_fuzz.sh: unknown fuzzer $which" >&2; exit 2 ;;
esac
cmake --build "$build" -j"$jobs" --target "${targets[@]}"
status=0
artifacts="$build/fuzz_artifacts/"
mkdir -p "$artifacts"

# Runs fuzzer NAME for $seconds on its corpus and dictionary
# (BUILD_DIR/fuzz_corpus/NAME[.dict], written by its seed function).
fuzz() {  # NAME MAX_LEN
  local corpus="$build/fuzz_corpus/$1"
  echo "run_fuzz.sh: ${1}_fuzz for ${seconds}s (corpus $corpus)"
  "$build/tests/fuzz/${1}_fuzz" -max_total_time="$seconds" -max_len="$2" \
    -dict="$build/fuzz_corpus/$1.dict" -artifact_prefix="$artifacts" \
    -print_final_stats=1 "$corpus"
}

seed_safetensors() {
corpus="$build/fuzz_corpus/safetensors"
mkdir -p "$corpus"
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
}

# Seeds: GenerateRequests of every input kind (text, token ids, chat with
# template kwargs), with sampling fields and stop strings, and near-misses
# (invalid UTF-8, a truncated field), in protobuf wire format.
seed_generate_request() {
corpus="$build/fuzz_corpus/generate_request"
mkdir -p "$corpus"
python3 - "$corpus" <<'PY'
import os, struct, sys
out = sys.argv[1]
def varint(n):
    b = b""
    while True:
        x = n & 0x7F
        n >>= 7
        if n:
            b += bytes([x | 0x80])
        else:
            return b + bytes([x])
def ld(num, payload):  # length-delimited field
    if isinstance(payload, str):
        payload = payload.encode()
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def vi(num, value):  # varint field
    return varint(num << 3) + varint(value)
def f32(num, value):
    return varint(num << 3 | 5) + struct.pack("<f", value)
def write(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
sampling = ld(4, vi(5, 8) + f32(1, 0.7) + vi(2, 40) + f32(3, 0.9) + vi(4, 7) + ld(12, "END")
              + ld(12, "\n\n") + vi(13, 1) + vi(14, 2))
write("text", ld(1, "req-1") + ld(2, "Hello, w\u00f6rld \u2603") + vi(5, 1) + sampling)
write("token_ids", ld(3, ld(1, b"".join(varint(t) for t in [256, 72, 105, 299]))) + ld(4, vi(5, 4)))
chat = ld(6, ld(1, ld(1, "system") + ld(2, "Be brief.")) + ld(1, ld(1, "user") + ld(2, "Hi <|eot_id|>"))
          + ld(2, ld(1, "enable_thinking") + vi(2, 0)))
write("chat", chat + ld(4, vi(5, 16)))
write("bad_role", ld(6, ld(1, ld(1, "narrator") + ld(2, "x"))) + ld(4, vi(5, 2)))
write("invalid_utf8", ld(2, b"caf\xc3") + ld(4, vi(5, 2)))
write("truncated", ld(2, "abc")[:-1])
PY
cat > "$build/fuzz_corpus/generate_request.dict" <<'DICT'
"system"
"user"
"assistant"
"tool"
"<|begin_of_text|>"
"<|eot_id|>"
"<|start_header_id|>"
"enable_thinking"
"add_generation_prompt"
"\xc3"
"\xe2\x98\x83"
DICT
}

# Seeds: small byte-level BPE tokenizer.json files (with added special
# tokens, a normalizer, a Metaspace variant, merges as strings and as pairs)
# and the demo model's own tokenizer.json.
seed_tokenizer_json() {
corpus="$build/fuzz_corpus/tokenizer_json"
mkdir -p "$corpus"
cp "$root/tools/demo_model/tokenizer.json" "$corpus/demo_model"
python3 - "$corpus" <<'PY'
import json, os, sys
out = sys.argv[1]
def byte_chars():
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b); cs.append(256 + n); n += 1
    return [chr(c) for c in cs]
chars = byte_chars()
vocab = {c: i for i, c in enumerate(chars)}
for pair in ["He", "ll", "llo", "\u0120w"]:
    vocab.setdefault(pair, len(vocab))
merges = ["H e", "l l", "ll o", "\u0120 w"]
added = [{"id": len(vocab), "content": "<s>", "single_word": False, "lstrip": False,
          "rstrip": False, "normalized": False, "special": True},
         {"id": len(vocab) + 1, "content": "</s>", "single_word": False, "lstrip": False,
          "rstrip": False, "normalized": False, "special": True}]
def tok(**over):
    t = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
         "normalizer": None,
         "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                           "use_regex": True},
         "post_processor": None, "decoder": {"type": "ByteLevel"},
         "model": {"type": "BPE", "dropout": None, "unk_token": None, "fuse_unk": False,
                   "byte_fallback": False, "vocab": vocab, "merges": merges}}
    t.update(over)
    return t
def write(name, obj):
    with open(os.path.join(out, name), "w") as f:
        json.dump(obj, f)
write("byte_level", tok())
write("pair_merges", tok(model=dict(tok()["model"], merges=[m.split(" ") for m in merges])))
write("nfc_sequence", tok(normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}]},
                          pre_tokenizer={"type": "Sequence", "pretokenizers": [
                              {"type": "Split", "pattern": {"Regex": "\\s+"},
                               "behavior": "Isolated", "invert": False},
                              {"type": "ByteLevel", "add_prefix_space": False,
                               "trim_offsets": True, "use_regex": False}]}))
write("metaspace", tok(pre_tokenizer={"type": "Metaspace", "replacement": "\u2581",
                                      "prepend_scheme": "first", "split": False},
                       decoder={"type": "Metaspace", "replacement": "\u2581",
                                "prepend_scheme": "first", "split": False}))
write("template_post", tok(post_processor={"type": "TemplateProcessing",
    "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
    "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [added[0]["id"]], "tokens": ["<s>"]}}}))
with open(os.path.join(out, "truncated"), "w") as f:
    f.write(json.dumps(tok())[:300])
PY
cat > "$build/fuzz_corpus/tokenizer_json.dict" <<'DICT'
"\"type\""
"\"BPE\""
"\"ByteLevel\""
"\"Metaspace\""
"\"Sequence\""
"\"Split\""
"\"Regex\""
"\"NFC\""
"\"TemplateProcessing\""
"\"added_tokens\""
"\"merges\""
"\"vocab\""
"\"special\""
"\"byte_fallback\""
"\"unk_token\""
DICT
}

# Seeds: the demo model's chat template and small templates using the
# subset's statements, filters, tests, macros and namespaces.
seed_chat_template() {
corpus="$build/fuzz_corpus/chat_template"
mkdir -p "$corpus"
python3 - "$corpus" "$root/tools/demo_model/tokenizer_config.json" <<'PY'
import json, os, sys
out = sys.argv[1]
def write(name, text):
    with open(os.path.join(out, name), "w") as f:
        f.write(text)
template = json.load(open(sys.argv[2])).get("chat_template")
if isinstance(template, str):
    write("demo_model", template)
write("chatml", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] | trim }}"
      "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
write("llama3", "{{ bos_token }}{% for message in messages %}{% set content = '<|start_header_id|>' "
      "+ message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' %}"
      "{{ content }}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
write("namespace_loop", "{% set ns = namespace(n=0, sys='') %}{% for m in messages %}"
      "{% if m.role == 'system' %}{% set ns.sys = m.content %}{% else %}{% set ns.n = ns.n + 1 %}"
      "{% endif %}{% if loop.last and not loop.first %}{{ loop.index0 }}{% endif %}{% endfor %}"
      "[{{ ns.sys | length }}:{{ ns.n }}]{{ messages | map(attribute='role') | join(',') }}")
write("macro_raise", "{% macro turn(r, c) -%}<{{ r | upper }}>{{ c | replace('a', 'b') }}{%- endmacro %}"
      "{% for m in messages %}{% if m.role not in ['system', 'user', 'assistant'] %}"
      "{{ raise_exception('bad role') }}{% endif %}{{ turn(m.role, m.content) }}{% endfor %}"
      "{{ eos_token if not add_generation_prompt else '' }}")
write("slices_tests", "{{ messages[1:][::-1] | length }}{% if enable_thinking is defined and "
      "enable_thinking is false %}{{ '<think></think>' }}{% endif %}{{ (messages | last).content[:3] }}"
      "{{ messages[0]['content'].split(' ') | first }}{{ '%d' % 3 if true }}{{ {'a': 1}.items() | list }}")
write("unclosed", "{% for m in messages %}{{ m.content")
PY
cat > "$build/fuzz_corpus/chat_template.dict" <<'DICT'
"{%"
"%}"
"{{"
"}}"
"{#"
"#}"
"{%-"
"-%}"
"for"
"endfor"
"if"
"elif"
"else"
"endif"
"set"
"macro"
"endmacro"
"namespace("
"loop.index"
"messages"
"message['role']"
"add_generation_prompt"
"raise_exception("
"| trim"
"| length"
"| tojson"
"is defined"
"not in"
DICT
}

for t in "${targets[@]}"; do
  case "$t" in
    safetensors_fuzz) seed_safetensors && fuzz safetensors 4096 || status=$? ;;
    generate_request_fuzz) seed_generate_request && fuzz generate_request 8192 || status=$? ;;
    tokenizer_json_fuzz) seed_tokenizer_json && fuzz tokenizer_json 131072 || status=$? ;;
    chat_template_fuzz) seed_chat_template && fuzz chat_template 8192 || status=$? ;;
  esac
done
exit $status
