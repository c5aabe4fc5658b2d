#include "frontend/openai_protocol.h"

#include <cmath>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "frontend/errors.h"
#include "frontend/request_limits.h"
#include "frontend/structured_output.h"
#include "nlohmann/json.hpp"
#include "text/utf8.h"

namespace pdserve::frontend::openai {
namespace {

// Insertion-ordered, so tools reach the template in the client's key order.
using Json = nlohmann::ordered_json;

#define PDSERVE_RETURN_IF_ERROR(expr)         \
  do {                                        \
    if (absl::Status _s = (expr); !_s.ok()) { \
      return _s;                              \
    }                                         \
  } while (0)

constexpr int kMaxJsonDepth = 64;
// Marks invalid UTF-8 in a body so that the field holding it can be named:
// a noncharacter, which no client text needs.
constexpr char32_t kInvalidMark = 0xFDD0;

std::string Dump(const Json& json) {
  return json.dump(-1, ' ', false, Json::error_handler_t::replace);
}

absl::Status TypeError(absl::string_view field, absl::string_view want) {
  return FieldError(field, absl::StrCat(" must be ", want));
}

absl::Status Unsupported(absl::string_view field, absl::string_view what) {
  return FieldError(field, absl::StrCat(": ", what));
}

// Refuses a list (or object) `v` of more than `limit` entries before it is
// copied anywhere.
absl::Status CheckCount(const Json& v, absl::string_view field, size_t limit,
                        absl::string_view what) {
  if (v.size() <= limit) return absl::OkStatus();
  return FieldError(field, absl::StrCat(": at most ", limit, " ", what, ", got ", v.size()));
}

// The field `name` of `obj`; nullptr when absent or null.
const Json* Find(const Json& obj, absl::string_view name) {
  auto it = obj.find(std::string(name));
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status ReadFloat(const Json& obj, absl::string_view name, float* out) {
  const Json* v = Find(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return TypeError(name, "a number");
  *out = v->get<float>();
  return absl::OkStatus();
}

// Integers, and floats with an integral value (some clients send 16.0).
absl::Status ReadInt64(const Json& obj, absl::string_view name, int64_t min, int64_t max,
                       std::optional<int64_t>* out) {
  const Json* v = Find(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    if (u > static_cast<uint64_t>(max)) return FieldError(name, absl::StrCat(" is above ", max));
    if (min > 0 && u < static_cast<uint64_t>(min)) {
      return FieldError(name, absl::StrCat(" is below ", min));
    }
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (v->is_number_integer()) {
    *out = v->get<int64_t>();
  } else if (v->is_number_float()) {
    const double d = v->get<double>();
    if (!(d == std::floor(d)) || std::fabs(d) > 9e15) return TypeError(name, "an integer");
    *out = static_cast<int64_t>(d);
  } else {
    return TypeError(name, "an integer");
  }
  if (**out < min) return FieldError(name, absl::StrCat(" is below ", min));
  if (**out > max) return FieldError(name, absl::StrCat(" is above ", max));
  return absl::OkStatus();
}

absl::Status ReadInt(const Json& obj, absl::string_view name, int* out) {
  std::optional<int64_t> v;
  PDSERVE_RETURN_IF_ERROR(ReadInt64(obj, name, std::numeric_limits<int32_t>::min(),
                                    std::numeric_limits<int32_t>::max(), &v));
  if (v.has_value()) *out = static_cast<int>(*v);
  return absl::OkStatus();
}

absl::Status ReadBool(const Json& obj, absl::string_view name, bool* out) {
  const Json* v = Find(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return TypeError(name, "true or false");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status ReadString(const Json& obj, absl::string_view name, std::string* out) {
  const Json* v = Find(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return TypeError(name, "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::StatusOr<text::jinja::Value> ToJinja(const Json& v, const std::string& field, int depth) {
  if (depth > kMaxJsonDepth) return FieldError(field, " is nested too deeply");
  switch (v.type()) {
    case Json::value_t::null:
      return text::jinja::Value::None();
    case Json::value_t::boolean:
      return text::jinja::Value(v.get<bool>());
    case Json::value_t::number_integer:
      return text::jinja::Value(v.get<int64_t>());
    case Json::value_t::number_unsigned:
      return text::jinja::Value(static_cast<int64_t>(
          std::min<uint64_t>(v.get<uint64_t>(), std::numeric_limits<int64_t>::max())));
    case Json::value_t::number_float:
      return text::jinja::Value(v.get<double>());
    case Json::value_t::string:
      return text::jinja::Value(v.get<std::string>());
    case Json::value_t::array: {
      text::jinja::Array array;
      for (const Json& item : v) {
        absl::StatusOr<text::jinja::Value> x = ToJinja(item, field, depth + 1);
        if (!x.ok()) return x.status();
        array.push_back(*std::move(x));
      }
      return text::jinja::Value(std::move(array));
    }
    case Json::value_t::object: {
      text::jinja::Object object;
      for (const auto& [key, item] : v.items()) {
        absl::StatusOr<text::jinja::Value> x = ToJinja(item, field, depth + 1);
        if (!x.ok()) return x.status();
        object.emplace_back(key, *std::move(x));
      }
      return text::jinja::Value(std::move(object));
    }
    case Json::value_t::binary:
    case Json::value_t::discarded:
      break;
  }
  return TypeError(field, "JSON");
}

// The path of the first string (or key) of `v` holding kInvalidMark.
std::optional<std::string> FindMarked(const Json& v, const std::string& path, int depth) {
  static const std::string kMark = [] {
    std::string s;
    text::utf8::Append(kInvalidMark, &s);
    return s;
  }();
  if (depth > kMaxJsonDepth) return std::nullopt;
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().find(kMark) != std::string::npos) return path;
  } else if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i) {
      if (auto p = FindMarked(v[i], absl::StrCat(path, "[", i, "]"), depth + 1)) return p;
    }
  } else if (v.is_object()) {
    for (const auto& [key, item] : v.items()) {
      const std::string child = path.empty() ? key : absl::StrCat(path, ".", key);
      if (key.find(kMark) != std::string::npos) return path.empty() ? "request" : path;
      if (auto p = FindMarked(item, child, depth + 1)) return p;
    }
  }
  return std::nullopt;
}

// JSON text must be UTF-8, so a body with invalid bytes is no JSON; to name
// the field holding them, parse it again with each ill-formed sequence
// replaced by a mark.
absl::Status InvalidUtf8Error(std::string_view body) {
  std::string marked;
  marked.reserve(body.size() + 16);
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t start = pos;
    const char32_t cp = text::utf8::Next(body, &pos);
    const std::string_view bytes = body.substr(start, pos - start);
    if (cp == text::utf8::kReplacementChar && bytes != "\xEF\xBF\xBD") {
      text::utf8::Append(kInvalidMark, &marked);
    } else {
      marked.append(bytes);
    }
  }
  const Json doc = Json::parse(marked, nullptr, /*allow_exceptions=*/false);
  if (!doc.is_discarded()) {
    if (std::optional<std::string> path = FindMarked(doc, "", 0)) {
      return FieldError(*path, " is not valid UTF-8");
    }
  }
  return absl::InvalidArgumentError("request body is not valid JSON: it is not valid UTF-8");
}

absl::Status ReadStop(const Json& obj, Request* out) {
  const Json* v = Find(obj, "stop");
  if (v == nullptr) return absl::OkStatus();
  if (v->is_string()) {
    out->stop.push_back(v->get<std::string>());
    return absl::OkStatus();
  }
  if (!v->is_array()) return TypeError("stop", "a string or a list of strings");
  PDSERVE_RETURN_IF_ERROR(CheckCount(*v, "stop", kMaxStopStrings, "strings"));
  for (size_t i = 0; i < v->size(); ++i) {
    if (!(*v)[i].is_string()) return TypeError(absl::StrCat("stop[", i, "]"), "a string");
    out->stop.push_back((*v)[i].get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status ReadTokenIds(const Json& array, const std::string& field, std::vector<int32_t>* out) {
  for (size_t i = 0; i < array.size(); ++i) {
    const Json& t = array[i];
    if (!t.is_number_integer() && !t.is_number_unsigned()) {
      return TypeError(absl::StrCat(field, "[", i, "]"), "a token id (an integer)");
    }
    const int64_t id = t.is_number_unsigned()
                           ? static_cast<int64_t>(std::min<uint64_t>(t.get<uint64_t>(), 1ull << 40))
                           : t.get<int64_t>();
    out->push_back(static_cast<int32_t>(std::clamp<int64_t>(id, -1, 1 << 30)));
  }
  return absl::OkStatus();
}

// Sampling and the other fields both APIs share.
absl::Status ReadCommon(const Json& obj, int max_n, ParsedRequest* out) {
  Request& r = out->request;
  engine::SamplingParams& p = r.sampling;
  p.temperature = 1.0f;  // OpenAI's default
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "temperature", &p.temperature));
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "top_p", &p.top_p));
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "top_k", &p.top_k));
  if (p.top_k == -1) p.top_k = 0;  // vLLM's "off"
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "min_p", &p.min_p));
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "presence_penalty", &p.presence_penalty));
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "frequency_penalty", &p.frequency_penalty));
  PDSERVE_RETURN_IF_ERROR(ReadFloat(obj, "repetition_penalty", &p.repetition_penalty));
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "min_tokens", &p.min_tokens));
  PDSERVE_RETURN_IF_ERROR(ReadBool(obj, "ignore_eos", &p.ignore_eos));
  if (const Json* ids = Find(obj, "stop_token_ids")) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "a list of token ids");
    PDSERVE_RETURN_IF_ERROR(CheckCount(*ids, "stop_token_ids", kMaxStopTokenIds, "ids"));
    PDSERVE_RETURN_IF_ERROR(ReadTokenIds(*ids, "stop_token_ids", &p.stop_token_ids));
  }
  std::optional<int64_t> seed;
  PDSERVE_RETURN_IF_ERROR(ReadInt64(obj, "seed", std::numeric_limits<int64_t>::min(),
                                    std::numeric_limits<int64_t>::max(), &seed));
  if (const Json* v = Find(obj, "seed"); v != nullptr && v->is_number_unsigned()) {
    r.seed = v->get<uint64_t>();
  } else if (seed.has_value()) {
    r.seed = static_cast<uint64_t>(*seed);
  }
  PDSERVE_RETURN_IF_ERROR(ReadStop(obj, &r));
  PDSERVE_RETURN_IF_ERROR(ReadString(obj, "user", &r.user));
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "priority", &r.priority));

  PDSERVE_RETURN_IF_ERROR(ReadBool(obj, "stream", &out->stream));
  if (const Json* options = Find(obj, "stream_options")) {
    if (!options->is_object()) return TypeError("stream_options", "an object");
    bool include_usage = false;
    if (const Json* v = Find(*options, "include_usage")) {
      if (!v->is_boolean()) return TypeError("stream_options.include_usage", "true or false");
      include_usage = v->get<bool>();
    }
    out->include_usage = out->stream && include_usage;
  }
  if (const Json* format = Find(obj, "response_format")) {
    absl::StatusOr<std::string> spec = OpenAiResponseFormatSpec(*format);
    if (!spec.ok()) return spec.status();
    r.sampling.grammar_spec = *std::move(spec);
  }
  std::optional<int64_t> n;
  PDSERVE_RETURN_IF_ERROR(ReadInt64(obj, "n", 1, std::numeric_limits<int32_t>::max(), &n));
  if (n.has_value() && *n > max_n) {
    return Unsupported("n", absl::StrCat("at most ", max_n, " choices per request, got ", *n));
  }
  out->n = static_cast<int>(n.value_or(1));
  if (const Json* bias = Find(obj, "logit_bias")) {
    if (!bias->is_object()) return TypeError("logit_bias", "an object");
    if (!bias->empty()) return Unsupported("logit_bias", "not supported");
  }
  return absl::OkStatus();
}

absl::Status ReadPrompt(const Json& obj, Request* r) {
  const Json* prompt = Find(obj, "prompt");
  if (prompt == nullptr) return FieldError("prompt", " is required");
  const Json* one = prompt;
  if (prompt->is_array() && !prompt->empty() &&
      (prompt->front().is_string() || prompt->front().is_array())) {
    if (prompt->size() != 1) return Unsupported("prompt", "one prompt per request is supported");
    one = &prompt->front();
  }
  if (one->is_string()) {
    r->input = Request::Input::kText;
    r->text = one->get<std::string>();
    return absl::OkStatus();
  }
  if (one->is_array()) {
    r->input = Request::Input::kTokenIds;
    return ReadTokenIds(*one, "prompt", &r->token_ids);
  }
  return TypeError("prompt", "a string or a list of token ids");
}

absl::Status ReadContent(const Json& content, const std::string& field, text::ChatMessage* m) {
  if (content.is_null()) {
    m->extra.emplace_back("content", text::jinja::Value::None());
    return absl::OkStatus();
  }
  if (content.is_string()) {
    m->content = content.get<std::string>();
    return absl::OkStatus();
  }
  if (!content.is_array()) return TypeError(field, "a string, a list of text parts or null");
  PDSERVE_RETURN_IF_ERROR(CheckCount(content, field, kMaxContentParts, "parts"));
  std::vector<std::string> parts;
  for (size_t j = 0; j < content.size(); ++j) {
    const Json& part = content[j];
    const std::string part_field = absl::StrCat(field, "[", j, "]");
    if (!part.is_object()) return TypeError(part_field, "an object");
    std::string type;
    PDSERVE_RETURN_IF_ERROR(ReadString(part, "type", &type));
    if (type != "text") {
      return Unsupported(absl::StrCat(part_field, ".type"), "only text parts are supported");
    }
    std::string text;
    if (const Json* t = Find(part, "text"); t == nullptr || !t->is_string()) {
      return TypeError(absl::StrCat(part_field, ".text"), "a string");
    }
    parts.push_back(part["text"].get<std::string>());
  }
  m->content = absl::StrJoin(parts, "\n");
  return absl::OkStatus();
}

absl::Status ReadMessages(const Json& obj, Request* r) {
  const Json* messages = Find(obj, "messages");
  if (messages == nullptr) return FieldError("messages", " is required");
  if (!messages->is_array()) return TypeError("messages", "a list of messages");
  PDSERVE_RETURN_IF_ERROR(CheckCount(*messages, "messages", kMaxChatMessages, "messages"));
  r->input = Request::Input::kChat;
  for (size_t i = 0; i < messages->size(); ++i) {
    const Json& m = (*messages)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return TypeError(field, "an object");
    text::ChatMessage message;
    const Json* role = Find(m, "role");
    if (role == nullptr || !role->is_string()) return TypeError(field + ".role", "a string");
    message.role = role->get<std::string>();
    if (auto it = m.find("content"); it != m.end()) {
      PDSERVE_RETURN_IF_ERROR(ReadContent(*it, field + ".content", &message));
    }
    for (const char* key : {"name", "tool_call_id"}) {
      std::string value;
      PDSERVE_RETURN_IF_ERROR(ReadString(m, key, &value));
      if (Find(m, key) != nullptr) message.extra.emplace_back(key, text::jinja::Value(value));
    }
    if (const Json* calls = Find(m, "tool_calls")) {
      if (!calls->is_array()) return TypeError(field + ".tool_calls", "a list");
      PDSERVE_RETURN_IF_ERROR(
          CheckCount(*calls, field + ".tool_calls", kMaxToolCallsPerMessage, "tool calls"));
      // Templates print a call's arguments as an object (Hugging Face's
      // convention); OpenAI sends them as JSON text.
      Json with_objects = *calls;
      for (Json& call : with_objects) {
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) {
          continue;
        }
        Json& fn = call["function"];
        if (auto a = fn.find("arguments"); a != fn.end() && a->is_string()) {
          Json parsed = Json::parse(a->get<std::string>(), nullptr, false);
          if (parsed.is_object()) *a = std::move(parsed);
        }
      }
      absl::StatusOr<text::jinja::Value> v = ToJinja(with_objects, field + ".tool_calls", 0);
      if (!v.ok()) return v.status();
      message.extra.emplace_back("tool_calls", *std::move(v));
    }
    r->chat.messages.push_back(std::move(message));
  }
  for (const char* name : {"tools", "tool_choice"}) {
    if (const Json* v = Find(obj, name)) {
      if (absl::string_view(name) == "tools") {
        if (!v->is_array()) return TypeError(name, "a list");
        PDSERVE_RETURN_IF_ERROR(CheckCount(*v, name, kMaxTools, "tools"));
      }
      absl::StatusOr<text::jinja::Value> value = ToJinja(*v, name, 0);
      if (!value.ok()) return value.status();
      r->chat.template_variables.emplace_back(name, *std::move(value));
    }
  }
  if (const Json* kwargs = Find(obj, "chat_template_kwargs")) {
    if (!kwargs->is_object()) return TypeError("chat_template_kwargs", "an object");
    PDSERVE_RETURN_IF_ERROR(
        CheckCount(*kwargs, "chat_template_kwargs", kMaxChatTemplateKwargs, "entries"));
    for (const auto& [name, value] : kwargs->items()) {
      if (!value.is_boolean()) {
        return TypeError(absl::StrCat("chat_template_kwargs.", name), "true or false");
      }
      r->chat.template_flags.emplace_back(name, value.get<bool>());
    }
  }
  return absl::OkStatus();
}

absl::Status ReadCompletion(const Json& obj, const ParseOptions& options, ParsedRequest* out) {
  Request& r = out->request;
  PDSERVE_RETURN_IF_ERROR(ReadPrompt(obj, &r));
  r.add_bos = options.add_bos;
  r.sampling.max_tokens = 16;  // OpenAI's default
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "max_tokens", &r.sampling.max_tokens));
  std::optional<int64_t> logprobs;
  PDSERVE_RETURN_IF_ERROR(ReadInt64(obj, "logprobs", 0, 20, &logprobs));
  if (logprobs.has_value()) r.sampling.logprobs = static_cast<int>(*logprobs);
  bool echo = false;
  PDSERVE_RETURN_IF_ERROR(ReadBool(obj, "echo", &echo));
  if (echo) return Unsupported("echo", "not supported");
  std::string suffix;
  PDSERVE_RETURN_IF_ERROR(ReadString(obj, "suffix", &suffix));
  if (!suffix.empty()) return Unsupported("suffix", "not supported");
  int best_of = 1;
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "best_of", &best_of));
  if (best_of != 1) {
    return Unsupported("best_of", "only 1 is supported (n asks for several choices, all returned)");
  }
  return absl::OkStatus();
}

absl::Status ReadChat(const Json& obj, const ParseOptions& options, ParsedRequest* out) {
  Request& r = out->request;
  PDSERVE_RETURN_IF_ERROR(ReadMessages(obj, &r));
  absl::StatusOr<ToolsRequest> tools = ReadTools(obj);
  if (!tools.ok()) return tools.status();
  out->tools = *std::move(tools);
  if (out->tools.parse()) out->tool_format = options.tool_format;
  absl::StatusOr<std::string> tool_grammar = ToolCallGrammarSpec(out->tools, options.tool_format);
  if (!tool_grammar.ok()) return tool_grammar.status();
  if (!tool_grammar->empty()) {
    if (!r.sampling.grammar_spec.empty()) {
      return Unsupported("tool_choice",
                         "a required tool call cannot be combined with a "
                         "response_format");
    }
    r.sampling.grammar_spec = *std::move(tool_grammar);
    r.names.response_format = "tools";  // what a schema refusal names
  }
  // Unset: up to the end of the context.
  r.sampling.max_tokens = 0;
  r.max_tokens_to_context = true;
  PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "max_tokens", &r.sampling.max_tokens));
  if (Find(obj, "max_completion_tokens") != nullptr) {
    r.names.max_tokens = "max_completion_tokens";
    PDSERVE_RETURN_IF_ERROR(ReadInt(obj, "max_completion_tokens", &r.sampling.max_tokens));
  }
  if (Find(obj, "max_tokens") != nullptr || Find(obj, "max_completion_tokens") != nullptr) {
    r.max_tokens_to_context = false;
  }
  bool logprobs = false;
  PDSERVE_RETURN_IF_ERROR(ReadBool(obj, "logprobs", &logprobs));
  std::optional<int64_t> top;
  PDSERVE_RETURN_IF_ERROR(ReadInt64(obj, "top_logprobs", 0, 20, &top));
  if (top.has_value() && !logprobs) {
    return Unsupported("top_logprobs", "needs \"logprobs\": true");
  }
  if (logprobs) r.sampling.logprobs = static_cast<int>(top.value_or(0));
  return absl::OkStatus();
}

FieldNames OpenAiNames(Api api) {
  FieldNames names;
  const std::string input = api == Api::kChat ? "messages" : "prompt";
  names.input = input;
  names.text = "prompt";
  names.token_ids = "prompt";
  names.chat = "messages";
  names.messages = "messages";
  names.template_kwargs = "chat_template_kwargs";
  names.template_variables = "tools";
  names.max_tokens = "max_tokens";
  names.stop = "stop";
  names.response_format = "response_format";
  names.request_id = "request_id";
  names.user = "user";
  names.sampling_prefix = "";
  return names;
}

std::string FinishReasonName(engine::FinishReason reason) {
  switch (reason) {
    case engine::FinishReason::kStop:
      return "stop";
    case engine::FinishReason::kLength:
    case engine::FinishReason::kContext:
      return "length";
    case engine::FinishReason::kNone:
      break;
  }
  return "stop";
}

double Logprob(float value) {
  // JSON has no infinities; a token the model rules out gets vLLM's floor.
  return std::isfinite(value) ? std::max(static_cast<double>(value), -9999.0) : -9999.0;
}

// A token's bytes: the special token's text, or its raw bytes.
std::string TokenBytes(const text::Tokenizer& tokenizer, int32_t token) {
  std::string special = tokenizer.SpecialTokenText(token);
  return special.empty() ? tokenizer.TokenBytes(token) : special;
}

Json Usage(int prompt_tokens, int completion_tokens) {
  return Json{{"prompt_tokens", prompt_tokens},
              {"completion_tokens", completion_tokens},
              {"total_tokens", prompt_tokens + completion_tokens}};
}

}  // namespace

absl::StatusOr<ParsedRequest> ParseRequest(Api api, std::string_view body,
                                           const ParseOptions& options) {
  const Json doc = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) {
    if (!text::utf8::IsValid(body)) return InvalidUtf8Error(body);
    return absl::InvalidArgumentError("request body is not valid JSON");
  }
  if (!doc.is_object()) return absl::InvalidArgumentError("request body must be a JSON object");
  ParsedRequest out;
  out.api = api;
  out.request.names = OpenAiNames(api);
  std::string model = options.model_name;
  PDSERVE_RETURN_IF_ERROR(ReadString(doc, "model", &model));
  if (!options.model_name.empty() && model != options.model_name) {
    return WithField(absl::NotFoundError(absl::StrCat("The model `", model,
                                                      "` does not exist; this server serves `",
                                                      options.model_name, "`")),
                     "model");
  }
  PDSERVE_RETURN_IF_ERROR(ReadCommon(doc, options.max_n, &out));
  if (api == Api::kChat) {
    PDSERVE_RETURN_IF_ERROR(ReadChat(doc, options, &out));
  } else {
    PDSERVE_RETURN_IF_ERROR(ReadCompletion(doc, options, &out));
  }
  return out;
}

int HttpStatus(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kOk:
      return 200;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kUnimplemented:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      return 400;
    case absl::StatusCode::kNotFound:
      return 404;
    case absl::StatusCode::kResourceExhausted:
      return 429;
    case absl::StatusCode::kUnavailable:
      return 503;
    case absl::StatusCode::kDeadlineExceeded:
      return 504;
    case absl::StatusCode::kCancelled:
      return 499;
    default:
      return 500;
  }
}

std::string ErrorBody(const absl::Status& status) {
  const int http = HttpStatus(status.code());
  std::string type = "server_error";
  Json code = nullptr;
  if (http == 400) {
    type = "invalid_request_error";
  } else if (http == 404) {
    type = "invalid_request_error";
    code = "model_not_found";
  } else if (http == 429) {
    type = "rate_limit_error";
    code = "rate_limit_exceeded";
  } else if (http == 503) {
    type = "service_unavailable";
  } else if (http == 504) {
    type = "timeout";
  }
  const std::string field = ErrorField(status);
  Json error = {{"message", std::string(status.message())},
                {"type", type},
                {"param", field.empty() ? Json(nullptr) : Json(field)},
                {"code", code}};
  return Dump(Json{{"error", std::move(error)}});
}

std::string ModelsBody(const std::string& model_name, int max_model_len, int64_t created) {
  Json model = {{"id", model_name},
                {"object", "model"},
                {"created", created},
                {"owned_by", "pdserve"},
                {"max_model_len", max_model_len}};
  return Dump(Json{{"object", "list"}, {"data", Json::array({std::move(model)})}});
}

std::string NewResponseId(Api api) {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat(api == Api::kChat ? "chatcmpl-" : "cmpl-",
                      absl::StrFormat("%016x%08x", rng(), static_cast<uint32_t>(rng())));
}

// --- ResponseFormatter ---------------------------------------------------------

ResponseFormatter::ResponseFormatter(Api api, std::string id, int64_t created, std::string model,
                                     const text::Tokenizer& tokenizer, bool include_usage,
                                     bool logprobs, ToolCallFormat tool_format,
                                     std::optional<int> choice)
    : api_(api),
      id_(std::move(id)),
      created_(created),
      model_(std::move(model)),
      tokenizer_(tokenizer),
      include_usage_(include_usage),
      logprobs_(logprobs),
      tool_format_(api == Api::kChat ? tool_format : ToolCallFormat::kNone),
      index_(choice.value_or(0)),
      usage_chunk_(!choice.has_value()),
      tool_parser_(tool_format_) {}

namespace {

// Chat: {"content": [{token, logprob, bytes, top_logprobs}]}.
Json ChatLogprobs(const text::Tokenizer& tokenizer, std::span<const int32_t> tokens,
                  std::span<const engine::SampledToken> logprobs) {
  auto entry = [&](int32_t token, float logprob) {
    const std::string bytes = TokenBytes(tokenizer, token);
    Json raw = Json::array();
    for (unsigned char c : bytes) raw.push_back(static_cast<int>(c));
    return Json{
        {"token", text::utf8::Repair(bytes)}, {"logprob", Logprob(logprob)}, {"bytes", raw}};
  };
  Json content = Json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    Json item = entry(tokens[i], logprobs[i].logprob);
    Json top = Json::array();
    for (const engine::TopLogprob& t : logprobs[i].top) top.push_back(entry(t.token, t.logprob));
    item["top_logprobs"] = std::move(top);
    content.push_back(std::move(item));
  }
  return Json{{"content", std::move(content)}};
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"};
// `offset` is the text offset of the first token, advanced past the last.
Json CompletionLogprobs(const text::Tokenizer& tokenizer, std::span<const int32_t> tokens,
                        std::span<const engine::SampledToken> logprobs, int64_t* offset) {
  Json strings = Json::array(), values = Json::array(), tops = Json::array(),
       offsets = Json::array();
  for (size_t i = 0; i < tokens.size() && i < logprobs.size(); ++i) {
    const std::string bytes = TokenBytes(tokenizer, tokens[i]);
    strings.push_back(text::utf8::Repair(bytes));
    values.push_back(Logprob(logprobs[i].logprob));
    Json top = Json::object();
    for (const engine::TopLogprob& t : logprobs[i].top) {
      top[text::utf8::Repair(TokenBytes(tokenizer, t.token))] = Logprob(t.logprob);
    }
    tops.push_back(std::move(top));
    offsets.push_back(*offset);
    *offset += static_cast<int64_t>(bytes.size());
  }
  return Json{{"tokens", std::move(strings)},
              {"token_logprobs", std::move(values)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

}  // namespace

std::vector<std::string> ResponseFormatter::Chunks(const Delta& delta) {
  std::vector<std::string> out;
  const bool chat = api_ == Api::kChat;
  auto chunk = [&](Json choice) {
    Json c = {{"id", id_},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created_},
              {"model", model_},
              {"choices", Json::array({std::move(choice)})}};
    if (include_usage_) c["usage"] = nullptr;
    out.push_back(Dump(c));
  };
  if (chat && !sent_role_) {
    sent_role_ = true;
    chunk(Json{{"index", index_},
               {"delta", {{"role", "assistant"}, {"content", ""}}},
               {"logprobs", nullptr},
               {"finish_reason", nullptr}});
  }
  if (tool_format_ != ToolCallFormat::kNone) {
    ToolChunks(delta, chunk);
  } else {
    PlainChunks(delta, chunk);
  }
  if (delta.finished && include_usage_ && usage_chunk_) {
    out.push_back(UsageChunk(delta.prompt_tokens, delta.completion_tokens));
  }
  return out;
}

std::string ResponseFormatter::UsageChunk(int prompt_tokens, int completion_tokens) const {
  return Dump(Json{{"id", id_},
                   {"object", api_ == Api::kChat ? "chat.completion.chunk" : "text_completion"},
                   {"created", created_},
                   {"model", model_},
                   {"choices", Json::array()},
                   {"usage", Usage(prompt_tokens, completion_tokens)}});
}

std::string ResponseFormatter::FinishReason(const Delta& delta) const {
  const std::string reason = FinishReasonName(delta.finish_reason);
  return reason == "stop" && tool_parser_.calls() > 0 ? "tool_calls" : reason;
}

Json ResponseFormatter::LogprobsOf(const Delta& delta) {
  if (!logprobs_ || delta.logprobs.empty()) return nullptr;
  return api_ == Api::kChat
             ? ChatLogprobs(tokenizer_, delta.token_ids, delta.logprobs)
             : CompletionLogprobs(tokenizer_, delta.token_ids, delta.logprobs, &text_offset_);
}

void ResponseFormatter::ToolChunks(const Delta& delta, const std::function<void(Json)>& chunk) {
  std::vector<ToolCallParser::Piece> pieces = tool_parser_.Feed(delta.text);
  if (delta.finished) {
    for (ToolCallParser::Piece& p : tool_parser_.Finish()) pieces.push_back(std::move(p));
  }
  Json logprobs = LogprobsOf(delta);
  // Consecutive pieces of one kind go out in one chunk.
  for (size_t i = 0; i < pieces.size();) {
    Json d = Json::object();
    if (pieces[i].index < 0) {
      std::string text;
      for (; i < pieces.size() && pieces[i].index < 0; ++i) text += pieces[i].content;
      d["content"] = std::move(text);
    } else {
      Json calls = Json::array();
      for (; i < pieces.size() && pieces[i].index >= 0; ++i) {
        const ToolCallParser::Piece& p = pieces[i];
        Json call = {{"index", p.index}};
        if (!p.id.empty()) {
          call["id"] = p.id;
          call["type"] = "function";
          call["function"] = {{"name", p.name}, {"arguments", p.arguments}};
        } else {
          call["function"] = {{"arguments", p.arguments}};
        }
        calls.push_back(std::move(call));
      }
      d["tool_calls"] = std::move(calls);
    }
    chunk(Json{{"index", index_},
               {"delta", std::move(d)},
               {"logprobs", std::exchange(logprobs, nullptr)},
               {"finish_reason", nullptr}});
  }
  if (!logprobs.is_null() || delta.finished) {
    chunk(Json{{"index", index_},
               {"delta", Json::object()},
               {"logprobs", std::move(logprobs)},
               {"finish_reason", delta.finished ? Json(FinishReason(delta)) : Json(nullptr)}});
  }
}

void ResponseFormatter::PlainChunks(const Delta& delta, const std::function<void(Json)>& chunk) {
  const bool chat = api_ == Api::kChat;
  const bool has_logprobs = logprobs_ && !delta.logprobs.empty();
  if (!delta.text.empty() || has_logprobs || delta.finished) {
    Json choice = {{"index", index_}};
    if (chat) {
      choice["delta"] =
          delta.text.empty() && delta.finished ? Json::object() : Json{{"content", delta.text}};
    } else {
      choice["text"] = delta.text;
    }
    choice["logprobs"] = LogprobsOf(delta);
    choice["finish_reason"] =
        delta.finished ? Json(FinishReasonName(delta.finish_reason)) : Json(nullptr);
    chunk(std::move(choice));
  }
}

void ResponseFormatter::Add(const Delta& delta) {
  text_ += delta.text;
  tokens_.insert(tokens_.end(), delta.token_ids.begin(), delta.token_ids.end());
  token_logprobs_.insert(token_logprobs_.end(), delta.logprobs.begin(), delta.logprobs.end());
  if (delta.finished) {
    finish_reason_ = FinishReasonName(delta.finish_reason);
    prompt_tokens_ = delta.prompt_tokens;
    completion_tokens_ = delta.completion_tokens;
  }
}

Json ResponseFormatter::ChoiceJson() const {
  const bool chat = api_ == Api::kChat;
  Json choice = {{"index", index_}};
  std::string finish_reason = finish_reason_;
  if (chat && tool_format_ != ToolCallFormat::kNone) {
    ParsedToolOutput parsed = ParseToolOutput(tool_format_, text_);
    Json message = {
        {"role", "assistant"},
        {"content",
         parsed.content.empty() && !parsed.calls.empty() ? Json(nullptr) : Json(parsed.content)}};
    if (!parsed.calls.empty()) {
      Json calls = Json::array();
      for (ToolCall& c : parsed.calls) {
        calls.push_back(
            {{"id", std::move(c.id)},
             {"type", "function"},
             {"function", {{"name", std::move(c.name)}, {"arguments", std::move(c.arguments)}}}});
      }
      message["tool_calls"] = std::move(calls);
      if (finish_reason == "stop") finish_reason = "tool_calls";
    }
    choice["message"] = std::move(message);
  } else if (chat) {
    choice["message"] = {{"role", "assistant"}, {"content", text_}};
  } else {
    choice["text"] = text_;
  }
  if (logprobs_) {
    int64_t offset = 0;
    choice["logprobs"] = chat ? ChatLogprobs(tokenizer_, tokens_, token_logprobs_)
                              : CompletionLogprobs(tokenizer_, tokens_, token_logprobs_, &offset);
  } else {
    choice["logprobs"] = nullptr;
  }
  choice["finish_reason"] = finish_reason.empty() ? Json(nullptr) : Json(finish_reason);
  return choice;
}

std::string ResponseFormatter::Body() const {
  const ResponseFormatter* self = this;
  return Body(std::span<const ResponseFormatter* const>(&self, 1));
}

std::string ResponseFormatter::Body(std::span<const ResponseFormatter* const> choices) {
  const ResponseFormatter& first = *choices.front();
  Json list = Json::array();
  int completion_tokens = 0;
  for (const ResponseFormatter* c : choices) {
    list.push_back(c->ChoiceJson());
    completion_tokens += c->completion_tokens_;
  }
  return Dump(Json{{"id", first.id_},
                   {"object", first.api_ == Api::kChat ? "chat.completion" : "text_completion"},
                   {"created", first.created_},
                   {"model", first.model_},
                   {"choices", std::move(list)},
                   {"usage", Usage(first.prompt_tokens_, completion_tokens)}});
}

}  // namespace pdserve::frontend::openai
