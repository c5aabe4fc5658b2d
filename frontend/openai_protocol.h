// The OpenAI-compatible API as data: request bodies of /v1/completions and
// /v1/chat/completions parsed into the front end's Request, and deltas
// formatted as OpenAI response objects and server-sent-event chunks. The
// HTTP server (frontend/openai_http_server.h) moves the bytes. No I/O.
//
// Request fields: model, prompt (a string or token ids; a one-element list
// of either), messages (system, user, assistant, tool; content a string, a
// list of text parts or null; name, tool_calls and tool_call_id reach the
// template), tools and tool_choice (template variables), max_tokens /
// max_completion_tokens, temperature (default 1), top_p, top_k, min_p, seed,
// stop, presence_penalty, frequency_penalty, repetition_penalty, min_tokens,
// ignore_eos, stop_token_ids, logprobs and top_logprobs, stream,
// stream_options.include_usage, user, chat_template_kwargs (booleans), n
// (1..ParseOptions::max_n choices), response_format (text, json_object, json_schema: see
// frontend/structured_output.h), tools / tool_choice / parallel_tool_calls
// (frontend/tool_calls.h). An unknown field is ignored; a field of the
// wrong type is INVALID_ARGUMENT naming it; a known field asking for
// something pdserve does not do (echo, suffix, logit_bias, best_of > 1)
// is INVALID_ARGUMENT naming it.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "frontend/request.h"
#include "frontend/request_session.h"
#include "frontend/tool_calls.h"
#include "text/tokenizer.h"

namespace pdserve::frontend::openai {

enum class Api { kCompletions, kChat };

struct ParseOptions {
  // The served model's name; a request naming another is NOT_FOUND. A
  // request without `model` gets this one.
  std::string model_name;
  // Completions: prepend BOS to a text prompt (the tokenizer files ask for
  // it, as Hugging Face tokenizers add it by default).
  bool add_bos = false;
  // The served model's tool-call format (frontend/tool_calls.h): chat
  // replies are parsed for calls in it, and tool_choice "required" or a
  // named function is enforced with its grammar.
  ToolCallFormat tool_format = ToolCallFormat::kNone;
  // Most choices (`n`) one request may ask for.
  int max_n = 16;
};

struct ParsedRequest {
  Api api = Api::kCompletions;
  Request request;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  int n = 1;                   // choices: 1..max_n
  ToolsRequest tools;
  // The format the reply is parsed in: kNone without tools or with
  // tool_choice "none".
  ToolCallFormat tool_format = ToolCallFormat::kNone;
};

// Parses a request body. Errors: INVALID_ARGUMENT naming the field (also for
// a body that is not JSON, or holds invalid UTF-8), NOT_FOUND for another
// model.
absl::StatusOr<ParsedRequest> ParseRequest(Api api, std::string_view body,
                                           const ParseOptions& options);

// The HTTP status of an error: 400 INVALID_ARGUMENT (and UNIMPLEMENTED),
// 404 NOT_FOUND, 429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, 504
// DEADLINE_EXCEEDED, 499 CANCELLED, else 500.
int HttpStatus(absl::StatusCode code);
// {"error": {"message", "type", "param", "code"}}.
std::string ErrorBody(const absl::Status& status);
// GET /v1/models.
std::string ModelsBody(const std::string& model_name, int max_model_len, int64_t created);

// Formats the responses of one request, streamed or whole.
class ResponseFormatter {
 public:
  // `tokenizer` must outlive the formatter; it spells logprob tokens.
  // `logprobs`: the request asked for them.
  // `tool_format`: chat replies are split into content and tool_calls
  // (finish_reason "tool_calls" when there are calls); kNone: plain content.
  // `choice`: the formatter of that choice of several (n > 1): its chunks
  // carry that index, and the stream's usage chunk is the caller's
  // (UsageChunk, once every choice finished).
  ResponseFormatter(Api api, std::string id, int64_t created, std::string model,
                    const text::Tokenizer& tokenizer, bool include_usage, bool logprobs,
                    ToolCallFormat tool_format = ToolCallFormat::kNone,
                    std::optional<int> choice = std::nullopt);

  // Streaming: the JSON payloads of the server-sent events for `delta`, in
  // order (each goes out as "data: <payload>\n\n"; the caller ends the stream
  // with "data: [DONE]").
  std::vector<std::string> Chunks(const Delta& delta);

  // Not streaming: takes each delta in turn; Body() once the last is in.
  void Add(const Delta& delta);
  std::string Body() const;
  // The response of several choices, each formatter holding one (all of
  // one request): usage counts the prompt once and sums the completions,
  // as OpenAI does.
  static std::string Body(std::span<const ResponseFormatter* const> choices);
  // The stream's last chunk before [DONE] when the client asked for usage.
  std::string UsageChunk(int prompt_tokens, int completion_tokens) const;

 private:
  using Json = nlohmann::ordered_json;
  // Chunks of a chat delta split into content and tool calls, or as is.
  void ToolChunks(const Delta& delta, const std::function<void(Json)>& chunk);
  void PlainChunks(const Delta& delta, const std::function<void(Json)>& chunk);
  // "tool_calls" where a stopped reply made calls.
  std::string FinishReason(const Delta& delta) const;
  Json LogprobsOf(const Delta& delta);
  // The non-streamed choice object.
  Json ChoiceJson() const;

  const Api api_;
  const std::string id_;
  const int64_t created_;
  const std::string model_;
  const text::Tokenizer& tokenizer_;
  const bool include_usage_;
  const bool logprobs_;
  const ToolCallFormat tool_format_;
  const int index_;             // the choice's index
  const bool usage_chunk_;      // the stream ends with this formatter's usage chunk
  ToolCallParser tool_parser_;  // streaming, with tool_format_
  bool sent_role_ = false;      // chat streams open with the assistant role
  int64_t text_offset_ = 0;     // completions logprobs: bytes of token text so far
  // Not streaming: what the deltas added up to.
  std::string text_;
  std::vector<int32_t> tokens_;
  std::vector<engine::SampledToken> token_logprobs_;
  std::string finish_reason_;
  int prompt_tokens_ = 0;
  int completion_tokens_ = 0;
};

// "cmpl-" or "chatcmpl-" and 24 random hex digits.
std::string NewResponseId(Api api);

}  // namespace pdserve::frontend::openai
