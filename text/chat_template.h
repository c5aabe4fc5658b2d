// Chat templates: render a conversation into the prompt text a model was
// trained on, with the Jinja template the model ships (tokenizer_config.json
// "chat_template", or chat_template.jinja), run by the Jinja subset
// interpreter in text/jinja.h. Llama 3.x and Qwen2/2.5/3 templates are
// checked against the reference implementation (tests/tokenizer_reference).
//
// The rendered text contains special tokens as text (e.g. "<|im_start|>",
// and for Llama 3 the BOS "<|begin_of_text|>" itself): tokenize it with
// Tokenizer::Encode (which parses special tokens) and add no BOS.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "text/jinja.h"

namespace pdserve::text {

struct ChatMessage {
  std::string role;  // "system", "user", "assistant", "tool", ...
  std::string content;
  // Further keys of the message object the template sees (e.g. tool_calls,
  // tool_call_id, name); a "content" here replaces the one above (a null
  // content is jinja::Value::None()).
  jinja::Object extra;
};

struct ChatTemplate {
  jinja::Template program;
  std::string bos_token;  // text of BOS ("" if none), the template's bos_token
  std::string eos_token;  // text of EOS ("" if none), the template's eos_token
  std::string source;     // the template's text (the tool-call format is read from it)
};

struct ChatRenderOptions {
  // Ends the prompt with the opening of an assistant turn.
  bool add_generation_prompt = true;
  // Extra boolean template variables, e.g. {"enable_thinking", false} for Qwen3.
  std::vector<std::pair<std::string, bool>> flags;
  // When set, templates may call strftime_now(format) (Llama 3.2 prints the
  // date); it formats this instant in UTC. Unset: strftime_now is undefined
  // and such templates fall back to their fixed date.
  std::optional<absl::Time> now;
  // Further template variables (e.g. tools, tool_choice), set after the
  // renderer's own.
  jinja::Object variables;
};

// Parses `source` (a Jinja chat template). INVALID_ARGUMENT names the line of
// a syntax error or of a construct outside the supported subset.
absl::StatusOr<ChatTemplate> ParseChatTemplate(std::string_view source, std::string bos_token,
                                               std::string eos_token);

// Loads the template of a Hugging Face model directory: tokenizer_config.json
// "chat_template" (a string, or a list of {name, template} from which
// "default" is taken), else chat_template.jinja. bos_token / eos_token come
// from tokenizer_config.json. NOT_FOUND when the model has no template.
absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir);

// Renders `messages` (variables: messages, bos_token, eos_token,
// add_generation_prompt, options.flags, options.variables; `tools` stays
// undefined unless options.variables sets it). Fails with
// the template's own message when it raises (e.g. roles not alternating),
// and INVALID_ARGUMENT on an empty conversation.
absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       std::span<const ChatMessage> messages,
                                       const ChatRenderOptions& options);
absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       std::span<const ChatMessage> messages,
                                       bool add_generation_prompt);

}  // namespace pdserve::text
