// pdserve_tokenize: the C++ side of the tokenizer reference check. Loads the
// tokenizer (and chat template) of --model_dir, then answers one JSON line
// on stdout per JSON line on stdin:
//   {"text": s}  -> {"ids": Encode(s), "ids_special": prefix + ids + suffix,
//                    "ordinary": EncodeOrdinary(s), "decoded": Decode(ids, keep
//                    specials), "decoded_skip": Decode(ids, skip specials),
//                    "streamed": IncrementalDetokenizer deltas joined}
//   {"chat": [{"role", "content"}...], "add_generation_prompt": b,
//    "enable_thinking": b (optional)}
//                -> {"rendered": text, "ids": Encode(text)} or {"error": msg}
//   {"template": jinja source, "context": {...}}
//                -> {"rendered": text} or {"error": msg} (the raw interpreter)
// Run by tests/tokenizer_reference/compare.mjs; usable by hand too:
//   echo '{"text":"Hello world"}' | pdserve_tokenize --model_dir=DIR
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "common/base/cli.h"
#include "text/bpe_tokenizer.h"
#include "text/chat_template.h"
#include "text/tokenizer_loader.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, model_dir, "", "Model directory with tokenizer.json");

namespace {

using Json = nlohmann::ordered_json;
using pdserve::text::Tokenizer;

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::strict); }

Json HandleText(const Tokenizer& tok, const std::string& text) {
  Json out;
  const std::vector<int32_t> ids = tok.Encode(text);
  std::vector<int32_t> with_special;
  if (const auto* bpe = dynamic_cast<const pdserve::text::BpeTokenizer*>(&tok)) {
    with_special = bpe->prefix_tokens();
    with_special.insert(with_special.end(), ids.begin(), ids.end());
    with_special.insert(with_special.end(), bpe->suffix_tokens().begin(),
                        bpe->suffix_tokens().end());
  } else {
    with_special = ids;
  }
  out["ids"] = ids;
  out["ids_special"] = with_special;
  out["ordinary"] = tok.EncodeOrdinary(text);
  out["decoded"] = tok.Decode(ids, /*skip_special_tokens=*/false);
  out["decoded_skip"] = tok.Decode(ids, /*skip_special_tokens=*/true);
  pdserve::text::IncrementalDetokenizer detok(tok, /*skip_special_tokens=*/false);
  std::string streamed;
  for (int32_t id : ids) streamed += detok.Push(id);
  streamed += detok.Flush();
  out["streamed"] = streamed;
  return out;
}

Json HandleChat(const Tokenizer& tok, const pdserve::text::ChatTemplate* tmpl, const Json& in) {
  Json out;
  if (tmpl == nullptr) {
    out["error"] = "no chat template";
    return out;
  }
  std::vector<pdserve::text::ChatMessage> messages;
  for (const Json& m : in["chat"]) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content") || !m["role"].is_string() ||
        !m["content"].is_string()) {
      out["error"] = "messages need string role and content";
      return out;
    }
    messages.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  }
  pdserve::text::ChatRenderOptions options;
  options.add_generation_prompt =
      in.contains("add_generation_prompt") && in["add_generation_prompt"].is_boolean() &&
      in["add_generation_prompt"].get<bool>();
  if (in.contains("enable_thinking") && in["enable_thinking"].is_boolean()) {
    options.flags.emplace_back("enable_thinking", in["enable_thinking"].get<bool>());
  }
  absl::StatusOr<std::string> rendered = pdserve::text::RenderChat(*tmpl, messages, options);
  if (!rendered.ok()) {
    out["error"] = std::string(rendered.status().message());
    return out;
  }
  out["rendered"] = *rendered;
  out["ids"] = tok.Encode(*rendered);
  return out;
}

namespace jinja = pdserve::text::jinja;

jinja::Value FromJson(const Json& j) {
  switch (j.type()) {
    case Json::value_t::null:
      return jinja::Value::None();
    case Json::value_t::boolean:
      return jinja::Value(j.get<bool>());
    case Json::value_t::number_integer:
    case Json::value_t::number_unsigned:
      return jinja::Value(j.get<int64_t>());
    case Json::value_t::number_float:
      return jinja::Value(j.get<double>());
    case Json::value_t::string:
      return jinja::Value(j.get<std::string>());
    case Json::value_t::array: {
      jinja::Array a;
      for (const Json& e : j) a.push_back(FromJson(e));
      return jinja::Value(std::move(a));
    }
    case Json::value_t::object: {
      jinja::Object o;
      for (const auto& [k, v] : j.items()) o.emplace_back(k, FromJson(v));
      return jinja::Value(std::move(o));
    }
    default:
      return jinja::Value();
  }
}

Json HandleTemplate(const Json& in) {
  Json out;
  absl::StatusOr<jinja::Template> t = jinja::Template::Parse(in["template"].get<std::string>());
  if (!t.ok()) {
    out["error"] = std::string(t.status().message());
    return out;
  }
  const jinja::Value context = FromJson(in.contains("context") ? in["context"] : Json::object());
  absl::StatusOr<std::string> rendered =
      t->Render(context.is_object() ? context.as_object() : jinja::Object{});
  if (!rendered.ok()) {
    out["error"] = std::string(rendered.status().message());
  } else {
    out["rendered"] = *rendered;
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  pdserve::ParseFlags(
      argc, argv,
      "Tokenizes and renders chat templates from JSON lines on stdin (tokenizer reference check)",
      __FILE__);
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = pdserve::text::LoadTokenizer(dir);
  if (!tok.ok()) {
    std::cerr << "pdserve_tokenize: " << tok.status() << "\n";
    return 2;
  }
  absl::StatusOr<pdserve::text::ChatTemplate> tmpl = pdserve::text::LoadChatTemplate(dir);
  if (!tmpl.ok()) std::cerr << "pdserve_tokenize: no chat template: " << tmpl.status() << "\n";

  std::ios::sync_with_stdio(false);
  std::string line;
  while (std::getline(std::cin, line)) {
    const Json in = Json::parse(line, nullptr, /*allow_exceptions=*/false);
    Json out;
    if (in.is_discarded() || !in.is_object()) {
      out["error"] = "bad input line";
    } else if (in.contains("text") && in["text"].is_string()) {
      out = HandleText(**tok, in["text"].get<std::string>());
    } else if (in.contains("template") && in["template"].is_string()) {
      out = HandleTemplate(in);
    } else if (in.contains("chat") && in["chat"].is_array()) {
      out = HandleChat(**tok, tmpl.ok() ? &*tmpl : nullptr, in);
    } else {
      out["error"] = "expected {\"text\"} or {\"chat\"}";
    }
    std::cout << Dump(out) << "\n";
  }
  std::cout.flush();
  return 0;
}
