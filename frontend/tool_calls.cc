// Tool calls in the OpenAI chat API (see tool_calls.h).
#include "frontend/tool_calls.h"

#include <algorithm>
#include <random>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runtime/grammar/grammar_spec.h"
#include "frontend/errors.h"

namespace pdserve::frontend {
namespace {

using Json = nlohmann::ordered_json;
namespace grammar = engine::grammar;

constexpr std::string_view kOpen = "<tool_call>";
constexpr std::string_view kClose = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

std::string_view StripLeadingBlanks(std::string_view s) {
  while (!s.empty() && absl::ascii_isspace(s.front())) s.remove_prefix(1);
  return s;
}

bool IsBlank(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return absl::ascii_isspace(c); });
}

// Length of the longest suffix of `s` that is a proper prefix of `tag`.
size_t PartialTagAtEnd(std::string_view s, std::string_view tag) {
  for (size_t n = std::min(s.size(), tag.size() - 1); n > 0; --n) {
    if (s.substr(s.size() - n) == tag.substr(0, n)) return n;
  }
  return 0;
}

// `s` without trailing blanks, one trailing '}', and blanks before it: the
// arguments of a call whose object has not been closed yet (or just was).
size_t ArgumentsEnd(std::string_view s) {
  size_t end = s.size();
  while (end > 0 && absl::ascii_isspace(s[end - 1])) --end;
  if (end > 0 && s[end - 1] == '}') --end;
  while (end > 0 && absl::ascii_isspace(s[end - 1])) --end;
  return end;
}

// Matches `{"name": "<name>", "<key>": ` (blanks anywhere JSON allows)
// at the start of `s`. Returns the offset of the arguments; 0 while `s` is
// too short to tell; npos when it does not match.
size_t MatchCallHead(std::string_view s, std::string* name,
                     std::string_view key = "\"arguments\"") {
  size_t i = 0;
  auto blanks = [&] {
    while (i < s.size() && absl::ascii_isspace(s[i])) ++i;
  };
  // Consumes `lit`; 0: out of text, npos: mismatch.
  auto expect = [&](std::string_view lit) -> size_t {
    for (char c : lit) {
      if (i >= s.size()) return 0;
      if (s[i] != c) return std::string_view::npos;
      ++i;
    }
    return 1;
  };
  blanks();
  if (size_t r = expect("{"); r != 1) return r;
  blanks();
  if (size_t r = expect("\"name\""); r != 1) return r;
  blanks();
  if (size_t r = expect(":"); r != 1) return r;
  blanks();
  if (size_t r = expect("\""); r != 1) return r;
  const size_t name_begin = i - 1;
  while (true) {
    if (i >= s.size()) return 0;
    if (s[i] == '\\') {
      i += 2;
      continue;
    }
    if (s[i] == '"') break;
    ++i;
  }
  ++i;
  const Json decoded =
      Json::parse(std::string(s.substr(name_begin, i - name_begin)), nullptr, false);
  if (!decoded.is_string()) return std::string_view::npos;
  blanks();
  if (size_t r = expect(","); r != 1) return r;
  blanks();
  if (size_t r = expect(key); r != 1) return r;
  blanks();
  if (size_t r = expect(":"); r != 1) return r;
  blanks();
  if (i >= s.size()) return 0;
  *name = decoded.get<std::string>();
  return i;
}

// MatchCallHead for llama3_json: "parameters", or "arguments" as some
// fine-tunes write.
size_t MatchLlamaCallHead(std::string_view s, std::string* name) {
  const size_t p = MatchCallHead(s, name, "\"parameters\"");
  if (p != 0 && p != std::string_view::npos) return p;
  const size_t a = MatchCallHead(s, name, "\"arguments\"");
  if (a != 0 && a != std::string_view::npos) return a;
  return p == 0 || a == 0 ? 0 : std::string_view::npos;
}

// The call object of one function, as the format writes it.
Json CallSchema(const ToolFunction& f, ToolCallFormat format) {
  const char* args = format == ToolCallFormat::kLlama3Json ? "parameters" : "arguments";
  Json parameters =
      f.parameters.is_null() || f.parameters.empty() ? Json{{"type", "object"}} : f.parameters;
  return Json{{"type", "object"},
              {"properties", {{"name", {{"const", f.name}}}, {args, std::move(parameters)}}},
              {"required", {"name", args}},
              {"additionalProperties", false}};
}

}  // namespace

absl::StatusOr<ToolCallFormat> ToolCallFormatFor(std::string_view flag,
                                                 std::string_view chat_template_source) {
  if (flag == "hermes") return ToolCallFormat::kHermes;
  if (flag == "llama3_json") return ToolCallFormat::kLlama3Json;
  if (flag == "none") return ToolCallFormat::kNone;
  if (!flag.empty() && flag != "auto") {
    return absl::InvalidArgumentError(
        absl::StrCat("--tool_call_parser must be auto, hermes, llama3_json or none, got \"",
                     std::string(flag), "\""));
  }
  auto contains = [&](std::string_view what) {
    return chat_template_source.find(what) != std::string_view::npos;
  };
  if (contains(kOpen)) return ToolCallFormat::kHermes;
  if (contains(kPythonTag) || contains("\"parameters\"")) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kLlama3Json:
      return "llama3_json";
    case ToolCallFormat::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<ToolsRequest> ReadTools(const Json& body) {
  ToolsRequest out;
  if (auto it = body.find("tools"); it != body.end() && !it->is_null()) {
    if (!it->is_array()) return FieldError("tools", " must be a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const Json& t = (*it)[i];
      const std::string field = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return FieldError(field, " must be an object");
      if (auto type = t.find("type"); type != t.end() && *type != "function") {
        return FieldError(field + ".type", " must be \"function\"");
      }
      const auto fn = t.find("function");
      if (fn == t.end() || !fn->is_object()) {
        return FieldError(field + ".function", " must be an object");
      }
      ToolFunction f;
      const auto name = fn->find("name");
      if (name == fn->end() || !name->is_string() || name->get<std::string>().empty()) {
        return FieldError(field + ".function.name", " must be a non-empty string");
      }
      f.name = name->get<std::string>();
      if (auto p = fn->find("parameters"); p != fn->end() && !p->is_null()) {
        if (!p->is_object())
          return FieldError(field + ".function.parameters", " must be an object");
        f.parameters = *p;
      }
      if (auto s = fn->find("strict"); s != fn->end() && !s->is_null()) {
        if (!s->is_boolean())
          return FieldError(field + ".function.strict", " must be true or false");
        f.strict = s->get<bool>();
      }
      out.tools.push_back(std::move(f));
    }
  }
  out.choice.mode = out.tools.empty() ? ToolChoice::Mode::kNone : ToolChoice::Mode::kAuto;
  if (auto it = body.find("tool_choice"); it != body.end() && !it->is_null()) {
    if (it->is_string()) {
      const std::string c = it->get<std::string>();
      if (c == "none") {
        out.choice.mode = ToolChoice::Mode::kNone;
      } else if (c == "auto") {
        out.choice.mode = ToolChoice::Mode::kAuto;
      } else if (c == "required") {
        out.choice.mode = ToolChoice::Mode::kRequired;
      } else {
        return FieldError("tool_choice",
                          " must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
                          "\"function\": {\"name\": ...}}");
      }
    } else if (it->is_object()) {
      const auto fn = it->find("function");
      const Json* name = nullptr;
      if (fn != it->end() && fn->is_object()) {
        if (auto n = fn->find("name"); n != fn->end() && n->is_string()) name = &*n;
      }
      if (name == nullptr) return FieldError("tool_choice.function.name", " must be a string");
      out.choice.mode = ToolChoice::Mode::kNamed;
      out.choice.name = name->get<std::string>();
      if (std::none_of(out.tools.begin(), out.tools.end(),
                       [&](const ToolFunction& f) { return f.name == out.choice.name; })) {
        return FieldError(
            "tool_choice.function.name",
            absl::StrCat(": no tool is named \"", out.choice.name.substr(0, 64), "\""));
      }
    } else {
      return FieldError("tool_choice", " must be a string or an object");
    }
    if (out.tools.empty() && out.choice.mode != ToolChoice::Mode::kNone) {
      return FieldError("tool_choice", " needs \"tools\"");
    }
  }
  if (auto it = body.find("parallel_tool_calls"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean()) return FieldError("parallel_tool_calls", " must be true or false");
    out.parallel = it->get<bool>();
  }
  return out;
}

absl::StatusOr<std::string> ToolCallGrammarSpec(const ToolsRequest& tools, ToolCallFormat format) {
  if (tools.choice.mode != ToolChoice::Mode::kRequired &&
      tools.choice.mode != ToolChoice::Mode::kNamed) {
    return std::string();
  }
  if (format == ToolCallFormat::kNone) {
    return FieldError("tool_choice",
                      ": the model's chat template has no known tool-call format (start the "
                      "server with --tool_call_parser=hermes or llama3_json)");
  }
  std::vector<Json> calls;
  for (const ToolFunction& f : tools.tools) {
    if (tools.choice.mode == ToolChoice::Mode::kNamed && f.name != tools.choice.name) continue;
    calls.push_back(grammar::JsonSchemaSpec(CallSchema(f, format), f.strict));
  }
  Json one = calls.size() == 1 ? calls[0] : grammar::AlternativesSpec(std::move(calls));
  if (format == ToolCallFormat::kLlama3Json) return one.dump();
  Json call =
      grammar::SequenceSpec({grammar::LiteralSpec(std::string(kOpen) + "\n"), std::move(one),
                             grammar::LiteralSpec("\n" + std::string(kClose))});
  const bool many = tools.choice.mode == ToolChoice::Mode::kRequired && tools.parallel;
  return grammar::RepeatSpec(std::move(call), 1, many ? -1 : 1, "\n").dump();
}

std::string NewToolCallId() {
  static thread_local std::mt19937_64 rng(std::random_device{}());
  return absl::StrCat("call_", absl::StrFormat("%016x%08x", rng(), static_cast<uint32_t>(rng())));
}

// --- ToolCallParser -----------------------------------------------------------

std::vector<ToolCallParser::Piece> ToolCallParser::Feed(std::string_view text) {
  std::vector<Piece> out;
  if (format_ == ToolCallFormat::kNone) {
    if (!text.empty()) out.push_back(Piece{.content = std::string(text)});
    return out;
  }
  held_ += text;
  if (format_ == ToolCallFormat::kHermes) {
    FeedHermes(out);
    return out;
  }
  FeedLlama(out);
  return out;
}

void ToolCallParser::FeedLlama(std::vector<Piece>& out) {
  // The whole output is a call when it opens with { or the tag.
  if (!llama_decided_) {
    const std::string_view s = StripLeadingBlanks(held_);
    if (s.empty() || (s.size() < kPythonTag.size() && kPythonTag.substr(0, s.size()) == s)) {
      return;  // too early to tell
    }
    llama_decided_ = true;
    llama_json_ = s[0] == '{' || StartsWith(s, kPythonTag);
  }
  if (!llama_json_) {
    if (!held_.empty()) out.push_back(Piece{.content = std::exchange(held_, std::string())});
    return;
  }
  if (llama_whole_) return;
  if (!call_started_) {
    std::string_view body = StripLeadingBlanks(held_);
    if (StartsWith(body, kPythonTag)) body = StripLeadingBlanks(body.substr(kPythonTag.size()));
    std::string name;
    const size_t at = MatchLlamaCallHead(body, &name);
    if (at == 0) return;  // too early to tell
    if (at == std::string_view::npos || body[at] != '{') {
      llama_whole_ = true;  // another layout: parsed whole at the end
      return;
    }
    out.push_back(Piece{.index = calls_, .id = NewToolCallId(), .name = std::move(name)});
    call_started_ = true;
    args_begin_ = (body.data() - held_.data()) + at;
    args_sent_ = 0;
  }
  StreamLlamaArguments(out);
}

void ToolCallParser::StreamLlamaArguments(std::vector<Piece>& out) {
  const std::string_view args = std::string_view(held_).substr(args_begin_);
  while (!args_done_ && args_scanned_ < args.size()) {
    const char c = args[args_scanned_++];
    if (args_in_string_) {
      if (args_escape_) {
        args_escape_ = false;
      } else if (c == '\\') {
        args_escape_ = true;
      } else if (c == '"') {
        args_in_string_ = false;
      }
    } else if (c == '"') {
      args_in_string_ = true;
    } else if (c == '{' || c == '[') {
      ++args_depth_;
    } else if ((c == '}' || c == ']') && --args_depth_ == 0) {
      args_done_ = true;
    }
  }
  if (args_scanned_ > args_sent_) {
    out.push_back(
        Piece{.index = calls_,
              .arguments = std::string(args.substr(args_sent_, args_scanned_ - args_sent_))});
    args_sent_ = args_scanned_;
  }
}

void ToolCallParser::FeedHermes(std::vector<Piece>& out) {
  while (true) {
    if (!in_call_) {
      const size_t open = held_.find(kOpen);
      if (open != std::string::npos) {
        const std::string_view before(held_.data(), open);
        // Blanks before a call are dropped (kept if it is no call).
        size_t end = before.size();
        while (end > 0 && absl::ascii_isspace(before[end - 1])) --end;
        if (end > 0) out.push_back(Piece{.content = std::string(before.substr(0, end))});
        blank_before_call_ = std::string(before.substr(end));
        held_.erase(0, open + kOpen.size());
        in_call_ = true;
        call_started_ = false;
        args_sent_ = 0;
        continue;
      }
      // Hold what may begin a tag, and trailing blanks (dropped if a call
      // follows).
      size_t end = held_.size() - PartialTagAtEnd(held_, kOpen);
      while (end > 0 && absl::ascii_isspace(held_[end - 1])) --end;
      if (end > 0) {
        out.push_back(Piece{.content = held_.substr(0, end)});
        held_.erase(0, end);
      }
      return;
    }
    const size_t close = held_.find(kClose);
    if (close == std::string::npos) {
      StreamCall(/*closed=*/false, out);
      return;
    }
    const std::string call = held_.substr(0, close);
    held_.erase(0, close + kClose.size());
    CloseCall(call, out);
  }
}

void ToolCallParser::StreamCall(bool closed, std::vector<Piece>& out) {
  if (!call_started_) {
    std::string name;
    const size_t at = MatchCallHead(held_, &name);
    if (at == 0 || at == std::string::npos) return;  // wait (or for the close)
    out.push_back(Piece{.index = calls_, .id = NewToolCallId(), .name = std::move(name)});
    call_started_ = true;
    args_begin_ = at;
    args_sent_ = 0;
  }
  std::string_view args = std::string_view(held_).substr(args_begin_);
  if (!closed) args.remove_suffix(PartialTagAtEnd(args, kClose));
  const size_t end = ArgumentsEnd(args);
  if (end > args_sent_) {
    out.push_back(Piece{.index = calls_,
                        .arguments = std::string(args.substr(args_sent_, end - args_sent_))});
    args_sent_ = end;
  }
}

void ToolCallParser::CloseCall(const std::string& call_text, std::vector<Piece>& out) {
  in_call_ = false;
  // StreamCall reads the call from held_: the call's head if not out yet
  // (a whole call in one piece of text), then the rest of its arguments as
  // written, so whole and streamed replies agree byte for byte.
  std::string rest = std::exchange(held_, call_text);
  StreamCall(/*closed=*/true, out);
  held_ = std::move(rest);
  if (call_started_) {
    call_started_ = false;
    ++calls_;
    return;
  }
  // Not in the streamable layout: the whole call, if it is one.
  const Json call = Json::parse(call_text, nullptr, false);
  const auto name = call.is_object() ? call.find("name") : call.end();
  const auto args = call.is_object() ? call.find("arguments") : call.end();
  if (name == call.end() || !name->is_string() || args == call.end()) {
    out.push_back(Piece{.content = blank_before_call_ + std::string(kOpen) + call_text +
                                   std::string(kClose)});
    return;
  }
  out.push_back(Piece{.index = calls_,
                      .id = NewToolCallId(),
                      .name = name->get<std::string>(),
                      .arguments = args->is_string() ? args->get<std::string>() : args->dump()});
  ++calls_;
}

std::vector<ToolCallParser::Piece> ToolCallParser::Finish() {
  std::vector<Piece> out;
  if (format_ == ToolCallFormat::kHermes) {
    if (in_call_) {
      if (call_started_) {
        CloseCall(std::exchange(held_, std::string()), out);
      } else {
        out.push_back(Piece{.content = blank_before_call_ + std::string(kOpen) + held_});
        in_call_ = false;
      }
    } else if (!held_.empty() && !(calls_ > 0 && IsBlank(held_))) {
      out.push_back(Piece{.content = held_});
    }
    held_.clear();
    return out;
  }
  if (format_ == ToolCallFormat::kLlama3Json) return FinishLlama();
  return out;
}

std::vector<ToolCallParser::Piece> ToolCallParser::FinishLlama() {
  std::vector<Piece> out;
  if (call_started_) {
    // Every argument byte is out; after the object, the call's closing
    // brace. Anything else after it is content.
    ++calls_;
    std::string_view rest = std::string_view(held_).substr(args_begin_ + args_sent_);
    rest = StripLeadingBlanks(rest);
    if (!rest.empty() && rest.front() == '}') rest = StripLeadingBlanks(rest.substr(1));
    if (!rest.empty()) out.push_back(Piece{.content = std::string(rest)});
    held_.clear();
    return out;
  }
  if (held_.empty()) return out;
  std::string_view body = StripLeadingBlanks(held_);
  if (StartsWith(body, kPythonTag)) body.remove_prefix(kPythonTag.size());
  const Json call = Json::parse(std::string(body), nullptr, false);
  const auto name = call.is_object() ? call.find("name") : call.end();
  auto args = call.is_object() ? call.find("parameters") : call.end();
  if (args == call.end() && call.is_object()) args = call.find("arguments");
  if (name != call.end() && name->is_string() && args != call.end() && args->is_object()) {
    out.push_back(Piece{.index = calls_,
                        .id = NewToolCallId(),
                        .name = name->get<std::string>(),
                        .arguments = args->dump()});
    ++calls_;
  } else {
    out.push_back(Piece{.content = held_});
  }
  held_.clear();
  return out;
}

ParsedToolOutput ParseToolOutput(ToolCallFormat format, std::string_view text) {
  ToolCallParser parser(format);
  std::vector<ToolCallParser::Piece> pieces = parser.Feed(text);
  for (ToolCallParser::Piece& p : parser.Finish()) pieces.push_back(std::move(p));
  ParsedToolOutput out;
  for (ToolCallParser::Piece& p : pieces) {
    if (p.index < 0) {
      out.content += p.content;
      continue;
    }
    if (static_cast<size_t>(p.index) >= out.calls.size()) out.calls.resize(p.index + 1);
    ToolCall& call = out.calls[p.index];
    if (!p.id.empty()) call.id = std::move(p.id);
    if (!p.name.empty()) call.name = std::move(p.name);
    call.arguments += p.arguments;
  }
  return out;
}

}  // namespace pdserve::frontend
