// Chat template loading and rendering (see chat_template.h).
#include "text/chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace pdserve::text {
namespace {

using Json = nlohmann::json;

constexpr uintmax_t kMaxFileBytes = uintmax_t{64} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (size > kMaxFileBytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": file too large"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// "text" or {"content": "text"}; "" when absent.
std::string TokenText(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

}  // namespace

absl::StatusOr<ChatTemplate> ParseChatTemplate(std::string_view source, std::string bos_token,
                                               std::string eos_token) {
  absl::StatusOr<jinja::Template> program = jinja::Template::Parse(source);
  if (!program.ok()) return program.status();
  return ChatTemplate{*std::move(program), std::move(bos_token), std::move(eos_token),
                      std::string(source)};
}

absl::StatusOr<ChatTemplate> LoadChatTemplate(const std::string& model_dir) {
  const std::string config_path = model_dir + "/tokenizer_config.json";
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  Json config = Json::object();
  std::error_code ec;
  if (std::filesystem::exists(config_path, ec)) {
    absl::StatusOr<std::string> text = ReadFile(config_path);
    if (!text.ok()) return text.status();
    config = Json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(config_path, ": not a JSON object"));
    }
  }
  std::string source;
  bool found = false;
  if (auto it = config.find("chat_template"); it != config.end() && !it->is_null()) {
    if (it->is_string()) {
      source = it->get<std::string>();
      found = true;
    } else if (it->is_array()) {
      for (const Json& entry : *it) {
        if (!entry.is_object()) continue;
        auto name = entry.find("name");
        auto text = entry.find("template");
        if (name != entry.end() && name->is_string() && *name == "default" && text != entry.end() &&
            text->is_string()) {
          source = text->get<std::string>();
          found = true;
        }
      }
      if (!found) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_path, ": chat_template list has no \"default\" entry"));
      }
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(config_path, ": chat_template must be a string"));
    }
  }
  if (!found && std::filesystem::exists(jinja_path, ec)) {
    absl::StatusOr<std::string> text = ReadFile(jinja_path);
    if (!text.ok()) return text.status();
    source = *std::move(text);
    found = true;
  }
  if (!found)
    return absl::NotFoundError(absl::StrCat(model_dir, ": the model has no chat template"));
  absl::StatusOr<ChatTemplate> t =
      ParseChatTemplate(source, TokenText(config, "bos_token"), TokenText(config, "eos_token"));
  if (!t.ok()) {
    return absl::Status(t.status().code(), absl::StrCat(model_dir, ": ", t.status().message()));
  }
  return t;
}

absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       std::span<const ChatMessage> messages,
                                       const ChatRenderOptions& options) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: the conversation is empty");
  jinja::Array list;
  list.reserve(messages.size());
  for (const ChatMessage& m : messages) {
    jinja::Value message(
        jinja::Object{{"role", jinja::Value(m.role)}, {"content", jinja::Value(m.content)}});
    for (const auto& [key, value] : m.extra) message.Set(key, value);
    list.push_back(std::move(message));
  }
  jinja::Object globals = {
      {"messages", jinja::Value(std::move(list))},
      {"bos_token", jinja::Value(chat_template.bos_token)},
      {"eos_token", jinja::Value(chat_template.eos_token)},
      {"add_generation_prompt", jinja::Value(options.add_generation_prompt)},
  };
  for (const auto& [name, value] : options.flags) globals.emplace_back(name, jinja::Value(value));
  for (const auto& [name, value] : options.variables) globals.emplace_back(name, value);
  if (options.now.has_value()) {
    const absl::Time now = *options.now;
    globals.emplace_back(
        "strftime_now",
        jinja::Value(jinja::Function([now](std::span<const jinja::Value> args,
                                           const jinja::KwArgs&) -> absl::StatusOr<jinja::Value> {
          if (args.empty() || !args[0].is_string()) {
            return absl::InvalidArgumentError("strftime_now() needs a format string");
          }
          return jinja::Value(absl::FormatTime(args[0].as_string(), now, absl::UTCTimeZone()));
        })));
  }
  return chat_template.program.Render(globals);
}

absl::StatusOr<std::string> RenderChat(const ChatTemplate& chat_template,
                                       std::span<const ChatMessage> messages,
                                       bool add_generation_prompt) {
  ChatRenderOptions options;
  options.add_generation_prompt = add_generation_prompt;
  return RenderChat(chat_template, messages, options);
}

}  // namespace pdserve::text
