// A generation request as every protocol adapter hands it to the front end:
// native structs, no protobuf or JSON. The gRPC adapter
// (frontend/generate_request_proto.h) and the OpenAI adapter
// (frontend/openai_protocol.h) fill it; validation
// (frontend/request_validation.h) checks it and builds the prompt.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "engine/types/sampling_params.h"
#include "text/chat_template.h"
#include "text/jinja_value.h"

namespace pdserve::frontend {

// How the adapter's protocol names the fields validation reports on, so an
// error names the field the client actually sent ("sampling.max_tokens" on
// gRPC, "max_completion_tokens" on OpenAI chat).
struct FieldNames {
  std::string input = "input";  // the request's input as a whole
  std::string text = "text";
  std::string token_ids = "token_ids";
  std::string chat = "chat";  // chat input as a whole
  std::string messages = "chat.messages";
  std::string template_kwargs = "chat.chat_template_kwargs";
  std::string template_variables = "tools";
  std::string max_tokens = "sampling.max_tokens";
  std::string stop = "sampling.stop";
  std::string response_format = "sampling.response_format";
  std::string request_id = "request_id";
  std::string user = "user";
  // Prefix of the sampling fields the engine's checks name
  // ("sampling.temperature" -> prefix + "temperature").
  std::string sampling_prefix = "sampling.";
};

struct ChatInput {
  // Roles are checked by validation (system, user, assistant, tool); each
  // message's `extra` holds further keys the template may read (tool_calls,
  // tool_call_id, name).
  std::vector<text::ChatMessage> messages;
  // Boolean template variables (gRPC chat_template_kwargs, e.g. Qwen3's
  // enable_thinking). Names are checked by validation.
  std::vector<std::pair<std::string, bool>> template_flags;
  // Further template variables set by the adapter (OpenAI's tools and
  // tool_choice), passed to the template as they are.
  text::jinja::Object template_variables;
};

struct Request {
  enum class Input { kNone, kText, kTokenIds, kChat };

  std::string request_id;  // caller-chosen, echoed; may be empty
  Input input = Input::kNone;
  std::string text;                // kText
  std::vector<int32_t> token_ids;  // kTokenIds
  ChatInput chat;                  // kChat
  // Prepend a BOS to a text prompt (chat templates print their own):
  // unset, where the tokenizer's own settings add one
  // (text::Tokenizer::add_bos_token); true, the tokenizer's BOS else
  // config.json's; false, never.
  std::optional<bool> add_bos;
  // Sampling as the engine takes it; `seed` is resolved by validation (the
  // request's own `seed` below, else one drawn by the front end).
  engine::SamplingParams sampling;
  std::optional<uint64_t> seed;
  // sampling.max_tokens was not given: generate up to the end of the
  // model's context (OpenAI chat).
  bool max_tokens_to_context = false;
  // Generation stops when the text contains any of these; the stop string
  // and what follows are not returned.
  std::vector<std::string> stop;
  // End-user id for logs (OpenAI's `user`); may be empty.
  std::string user;
  // Admission order when requests wait for capacity: lower first, FIFO
  // within a value (as vLLM's `priority`); 0 by default.
  int priority = 0;
  FieldNames names;
};

}  // namespace pdserve::frontend
