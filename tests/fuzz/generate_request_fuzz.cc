// libFuzzer target for the front door: arbitrary bytes as the body of a
// pdserve.v1.Generation/Generate call, through the gRPC adapter's decoding
// (frontend/generate_request_proto.h: UTF-8 checked by field, parse,
// conversion), the front end's validation and prompt building
// (frontend/request_validation.h: limits, the byte-level BPE tokenizer, the
// Llama 3 chat template the demo model ships) and the stream assembler
// (detokenizer and stop strings) over the resulting prompt.
// Contract under test: hostile input yields INVALID_ARGUMENT, never a crash,
// leak, out-of-bounds access or undefined behaviour (ASan, UBSan); an
// accepted request has a prompt of vocabulary ids that fits the context
// with its max_tokens, sampling parameters the engine accepts, and stop
// strings and output text that are valid UTF-8.
// Build and run: tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "frontend/generate_request_proto.h"
#include "frontend/prompt_source.h"
#include "frontend/request_validation.h"
#include "frontend/stream_assembler.h"
#include "text/chat_template.h"
#include "text/tokenizer_loader.h"
#include "text/utf8.h"
#include "tools/tokenizer_writer.h"

namespace {

using pdserve::frontend::PromptSource;

constexpr int kContext = 512;
const PromptSource* g_source = nullptr;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

// The demo model's text side, from files written once: vocabulary 300,
// context 512, the self-made BPE tokenizer and chat template.
const PromptSource* LoadSource() {
  char dir[] = "/tmp/pdserve_generate_request_fuzz_XXXXXX";
  Check(mkdtemp(dir) != nullptr);
  Check(pdserve::engine::WriteDemoTokenizer(300, dir).ok());
  auto* source = new PromptSource();
  source->config.vocab_size = 300;
  source->config.max_position_embeddings = kContext;
  source->config.bos_token_id = pdserve::engine::kDemoBosId;
  source->config.eos_token_ids = {pdserve::engine::kDemoEndOfTextId};
  auto tokenizer = pdserve::text::LoadTokenizer(dir);
  Check(tokenizer.ok());
  source->tokenizer = *std::move(tokenizer);
  auto chat_template = pdserve::text::LoadChatTemplate(dir);
  Check(chat_template.ok());
  source->chat_template = *std::move(chat_template);
  return source;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_source = LoadSource();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace pdserve;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<frontend::Request> request = frontend::DecodeGenerateRequest(bytes);
  if (!request.ok()) {
    Check(request.status().code() == absl::StatusCode::kInvalidArgument);
    return 0;
  }
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  absl::StatusOr<frontend::ValidatedRequest> v =
      frontend::ValidateRequest(*request, *g_source, {.max_prompt_bytes = 4096}, now, 1);
  if (!v.ok()) {
    Check(v.status().code() == absl::StatusCode::kInvalidArgument);
    Check(text::utf8::IsValid(std::string(v.status().message())));
    return 0;
  }
  const engine::ModelConfig& config = g_source->config;
  Check(!v->prompt.empty());
  for (int32_t t : v->prompt) Check(t >= 0 && t < config.vocab_size);
  Check(static_cast<int64_t>(v->prompt.size()) + v->sampling.max_tokens <= kContext);
  Check(engine::ValidateSamplingParams(v->sampling, config.vocab_size).ok());
  for (const std::string& stop : v->stop_strings) Check(text::utf8::IsValid(stop));
  // The prompt's tokens as if generated: the client's text is valid UTF-8.
  frontend::StreamAssembler assembler(*g_source->tokenizer, v->stop_strings);
  std::string out = assembler.Push(v->prompt).text;
  out += assembler.Flush().text;
  Check(text::utf8::IsValid(out));
  Check(assembler.generated().size() <= v->prompt.size());
  return 0;
}
