#include "tests/integration/generate_client.h"

#include <algorithm>

#include "absl/time/clock.h"

namespace pdserve::testing {

StreamResult RunGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  auto reader = stub.Generate(&ctx, request);
  StreamResult out;
  v1::GenerateResponse response;
  while (reader->Read(&response)) {
    ++out.messages;
    out.tokens.insert(out.tokens.end(), response.token_ids().begin(), response.token_ids().end());
    out.logprobs.insert(out.logprobs.end(), response.logprobs().begin(), response.logprobs().end());
    out.text += response.text();
    if (response.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) out.last = response;
  }
  out.status = reader->Finish();
  return out;
}

v1::GenerateRequest TokenRequest(const std::vector<int32_t>& prompt, int max_tokens) {
  v1::GenerateRequest r;
  for (int32_t t : prompt) r.mutable_token_ids()->add_ids(t);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

std::string CharacterAt(const std::string& text, size_t from) {
  auto continuation = [&](size_t i) {
    return i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80;
  };
  size_t begin = from;
  while (continuation(begin)) ++begin;
  size_t end = std::min(begin + 1, text.size());
  while (continuation(end)) ++end;
  return text.substr(std::min(begin, text.size()), end - std::min(begin, text.size()));
}

}  // namespace pdserve::testing
