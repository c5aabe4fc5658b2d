// Test helper: one streamed Generate call, collected whole.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::testing {

struct StreamResult {
  grpc::Status status;
  std::vector<int32_t> tokens;  // every message's token ids, in order
  std::vector<v1::TokenLogprob> logprobs;  // every message's log-probabilities, in order
  std::string text;             // every message's text, concatenated
  v1::GenerateResponse last;    // the message carrying the finish reason
  int messages = 0;
};

// Sends `request` with a deadline of `timeout` and reads the stream to its end.
StreamResult RunGenerate(v1::Generation::Stub& stub, const v1::GenerateRequest& request,
                         absl::Duration timeout = absl::Seconds(60));

// A token-id prompt with max_tokens set.
v1::GenerateRequest TokenRequest(const std::vector<int32_t>& prompt, int max_tokens);

// The first whole UTF-8 character of `text` that starts at or after byte
// `from` (a stop string taken from a generation's text).
std::string CharacterAt(const std::string& text, size_t from);

}  // namespace pdserve::testing
