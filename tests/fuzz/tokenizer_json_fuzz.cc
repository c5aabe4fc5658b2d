// libFuzzer target for the tokenizer.json loader (text/bpe_tokenizer.h):
// arbitrary bytes as tokenizer.json text, and when they load, the tokenizer
// encodes and decodes a few fixed strings and the input itself.
// Contract under test: a hostile file yields an error status (INVALID_ARGUMENT
// or UNIMPLEMENTED), never a crash, hang, leak, out-of-bounds access or
// undefined behaviour (ASan, UBSan); a loaded tokenizer's ids are within its
// vocabulary and decoding them does not crash.
// Build and run: tests/fuzz/run_fuzz.sh 60 build-fuzz tokenizer_json_fuzz.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "text/bpe_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  auto tokenizer = pdserve::text::BpeTokenizer::FromJson(json);
  if (!tokenizer.ok()) return 0;
  const int vocab = (*tokenizer)->vocab_size();
  for (std::string_view text :
       {std::string_view("Hello, world!"), std::string_view(" \n\t  x"),
        std::string_view("caf\xc3\xa9 \xe2\x98\x83"), json.substr(0, 256)}) {
    const std::vector<int32_t> ids = (*tokenizer)->Encode(text);
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab) std::abort();  // an id outside the vocabulary
    }
    (void)(*tokenizer)->Decode(ids, /*skip_special_tokens=*/false);
    (void)(*tokenizer)->EncodeOrdinary(text);
  }
  return 0;
}
