// Tool calls in the OpenAI chat API: the request's `tools` and
// `tool_choice`, the grammar that enforces a call (tool_choice "required" or
// a named function; engine/runtime/grammar/grammar_spec.h), and the parser
// that turns the model's tool-call text back into `tool_calls`, streamed as
// OpenAI streams them (the call's id and name first, then its arguments in
// pieces as they are generated).
//
// Formats (the model's own, chosen from its chat template or a flag):
//   hermes       <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//                (Hermes, Qwen 2.5 / 3), any number of calls, text around them
//                is content
//   llama3_json  {"name": "f", "parameters": {...}} as the whole output,
//                optionally after <|python_tag|> (Llama 3.1 / 3.2 / 3.3
//                JSON tool calling); "arguments" is taken for "parameters".
//                Streamed like hermes when the name comes first and the
//                arguments are an object; other layouts are held to the end
//                and parsed whole.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"

namespace pdserve::frontend {

enum class ToolCallFormat { kNone, kHermes, kLlama3Json };

// "hermes", "llama3_json", "none"; "auto" (or "") reads the chat template's
// source: <tool_call> -> hermes; <|python_tag|> or "parameters" -> llama3_json;
// else none. INVALID_ARGUMENT for another name.
absl::StatusOr<ToolCallFormat> ToolCallFormatFor(std::string_view flag,
                                                 std::string_view chat_template_source);
std::string_view ToolCallFormatName(ToolCallFormat format);

struct ToolChoice {
  enum class Mode { kAuto, kNone, kRequired, kNamed };
  Mode mode = Mode::kAuto;
  std::string name;  // kNamed
};

struct ToolFunction {
  std::string name;
  nlohmann::ordered_json parameters;  // a JSON Schema; {} when absent
  bool strict = false;
};

struct ToolsRequest {
  std::vector<ToolFunction> tools;
  ToolChoice choice;
  bool parallel = true;  // parallel_tool_calls
  // The output is parsed for tool calls (tools given, choice not none).
  bool parse() const { return !tools.empty() && choice.mode != ToolChoice::Mode::kNone; }
};

// The chat body's tools, tool_choice and parallel_tool_calls.
// INVALID_ARGUMENT naming the field (a tool without a function name, a
// tool_choice naming no tool, "required" without tools, ...).
absl::StatusOr<ToolsRequest> ReadTools(const nlohmann::ordered_json& body);

// The grammar spec that makes the output tool calls in `format`: one call
// of the named function, or one or more (one when !parallel) of any tool
// for "required"; "" for auto and none. Arguments follow each function's
// parameters schema. INVALID_ARGUMENT (field tool_choice) when `format` is
// kNone.
absl::StatusOr<std::string> ToolCallGrammarSpec(const ToolsRequest& tools, ToolCallFormat format);

// "call_" and 24 random hex digits.
std::string NewToolCallId();

// Follows the generated text and splits it into content and tool calls.
class ToolCallParser {
 public:
  struct Piece {
    std::string content;    // content text (when index < 0)
    int index = -1;         // the call's index, for a tool-call piece
    std::string id, name;   // set on a call's first piece
    std::string arguments;  // the next bytes of the call's arguments
  };

  explicit ToolCallParser(ToolCallFormat format) : format_(format) {}

  // The pieces `text` completes; text that may still turn out to be a tool
  // call is held back.
  std::vector<Piece> Feed(std::string_view text);
  // The output ended: what was held back.
  std::vector<Piece> Finish();
  int calls() const { return calls_; }

 private:
  void FeedHermes(std::vector<Piece>& out);
  // A call's text (between the tags) begun: emits what can be emitted.
  void StreamCall(bool closed, std::vector<Piece>& out);
  void CloseCall(const std::string& call_text, std::vector<Piece>& out);
  void FeedLlama(std::vector<Piece>& out);
  // llama3_json: emits the arguments object's bytes scanned so far.
  void StreamLlamaArguments(std::vector<Piece>& out);
  std::vector<Piece> FinishLlama();

  const ToolCallFormat format_;
  std::string held_;  // text not yet emitted
  bool in_call_ = false;
  std::string blank_before_call_;  // blanks dropped before the open call
  bool call_started_ = false;      // the call's first piece (id, name) is out
  size_t args_begin_ = 0;          // where the arguments start in held_
  size_t args_sent_ = 0;           // argument bytes already emitted
  bool llama_json_ = false;        // llama3_json: the output is held as a call
  bool llama_decided_ = false;
  bool llama_whole_ = false;  // llama3_json: not streamable, parsed at the end
  // llama3_json arguments (from args_begin_ in held_): bytes scanned, the
  // object's nesting depth there, inside a string / after a backslash, and
  // whether the object closed (its length is then args_sent_).
  size_t args_scanned_ = 0;
  int args_depth_ = 0;
  bool args_in_string_ = false;
  bool args_escape_ = false;
  bool args_done_ = false;
  int calls_ = 0;
};

// A whole output: content ("" when none) and calls (id, name, arguments).
struct ToolCall {
  std::string id, name, arguments;
};
struct ParsedToolOutput {
  std::string content;
  std::vector<ToolCall> calls;
};
ParsedToolOutput ParseToolOutput(ToolCallFormat format, std::string_view text);

}  // namespace pdserve::frontend
