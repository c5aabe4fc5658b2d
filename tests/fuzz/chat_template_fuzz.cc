// libFuzzer target for the chat template parser and renderer
// (text/chat_template.h, the Jinja subset of text/jinja*): arbitrary bytes
// as a template, rendered over a short conversation with and without the
// generation prompt.
// Contract under test: a hostile template yields an error status (a syntax
// error, an unsupported construct, raise_exception, a resource limit), never
// a crash, unbounded recursion, leak, out-of-bounds access or undefined
// behaviour (ASan, UBSan).
// Build and run: tests/fuzz/run_fuzz.sh 60 build-fuzz chat_template_fuzz.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "text/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view source(reinterpret_cast<const char*>(data), size);
  auto chat_template = pdserve::text::ParseChatTemplate(source, "<s>", "</s>");
  if (!chat_template.ok()) return 0;
  const std::vector<pdserve::text::ChatMessage> messages = {
      {.role = "system", .content = "Be brief."},
      {.role = "user", .content = "Hi {{ there }} \xe2\x98\x83"},
      {.role = "assistant", .content = "Hello."},
      {.role = "user", .content = ""}};
  for (bool generation_prompt : {true, false}) {
    (void)pdserve::text::RenderChat(*chat_template, messages, generation_prompt);
  }
  pdserve::text::ChatRenderOptions options;
  options.flags = {{"enable_thinking", false}};
  (void)pdserve::text::RenderChat(*chat_template, messages, options);
  return 0;
}
