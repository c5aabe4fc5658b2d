// BPE from tokenizer.json (see bpe_tokenizer.h). Layout:
//   - load: parse and check every field (a hostile file is an error, never a
//     crash), build id tables, the merge map keyed by id pair, and tries of
//     added tokens;
//   - encode: added-token split -> normalize -> added-token split of
//     normalized tokens -> pre-tokenize -> BPE per word (cached);
//   - decode: precomputed text per id (streaming), the decoder chain over
//     the tokens' strings (whole texts of text vocabularies).
// Byte-level vocabularies: the model works on raw bytes; vocabulary strings
// are mapped back through the byte-level alphabet once at load, so encoding
// never builds alphabet strings. Text vocabularies (no ByteLevel
// pre-tokenizer: SentencePiece-converted files) work on UTF-8 characters.
#include "text/bpe_tokenizer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"
#include "text/decoder.h"
#include "text/normalizer.h"
#include "text/pretokenizer.h"
#include "text/utf8.h"

namespace pdserve::text {
namespace {

using Json = nlohmann::json;

// Token ids must stay below (number of tokens + kMaxIdGap): bounds the tables
// a hostile file can make us allocate.
constexpr int64_t kMaxIdGap = 65536;

absl::string_view Absl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tokenizer.json: ", Absl(what)));
}

// `s` as an error of the file's section `where`, keeping its code.
absl::Status InFile(const absl::Status& s, std::string_view where) {
  return absl::Status(s.code(), absl::StrCat("tokenizer.json: ", Absl(where), ": ", s.message()));
}

// `obj[key]` as a bool; `fallback` when absent or null.
absl::StatusOr<bool> GetBool(const Json& obj, const char* key, bool fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) return Invalid(absl::StrCat(key, " must be a boolean"));
  return it->get<bool>();
}

// `obj[key]` as a string; `fallback` when absent or null.
absl::StatusOr<std::string> GetString(const Json& obj, const char* key, std::string fallback) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return fallback;
  if (!it->is_string()) return Invalid(absl::StrCat(key, " must be a string"));
  return it->get<std::string>();
}

absl::StatusOr<std::string> TypeOf(const Json& obj, std::string_view where) {
  if (!obj.is_object()) return Invalid(absl::StrCat(Absl(where), " must be an object"));
  auto it = obj.find("type");
  if (it == obj.end() || !it->is_string()) {
    return Invalid(absl::StrCat(Absl(where), " has no string \"type\""));
  }
  return it->get<std::string>();
}

absl::StatusOr<int32_t> GetId(const Json& v, std::string_view where) {
  if (!v.is_number_integer()) return Invalid(absl::StrCat(Absl(where), ": id must be an integer"));
  const int64_t id = v.get<int64_t>();
  if (id < 0 || id > INT32_MAX - kMaxIdGap) {
    return Invalid(absl::StrCat(Absl(where), ": id ", id, " out of range"));
  }
  return static_cast<int32_t>(id);
}

// Leftmost-longest matching of added tokens over bytes.
class Trie {
 public:
  void Add(std::string_view key, int32_t value) {
    int32_t node = 0;
    for (char c : key) {
      const uint8_t b = static_cast<uint8_t>(c);
      auto it = nodes_[node].children.find(b);
      if (it == nodes_[node].children.end()) {
        nodes_.emplace_back();
        it = nodes_[node].children.emplace(b, static_cast<int32_t>(nodes_.size() - 1)).first;
      }
      node = it->second;
    }
    nodes_[node].value = value;
    first_byte_[static_cast<uint8_t>(key[0])] = true;
    empty_ = false;
  }
  bool empty() const { return empty_; }
  // Longest key starting at `pos`: {value, length}, or {-1, 0}.
  std::pair<int32_t, size_t> LongestAt(std::string_view text, size_t pos) const {
    std::pair<int32_t, size_t> best{-1, 0};
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) return best;
    int32_t node = 0;
    for (size_t i = pos; i < text.size(); ++i) {
      auto it = nodes_[node].children.find(static_cast<uint8_t>(text[i]));
      if (it == nodes_[node].children.end()) break;
      node = it->second;
      if (nodes_[node].value >= 0) best = {nodes_[node].value, i + 1 - pos};
    }
    return best;
  }

 private:
  struct Node {
    absl::flat_hash_map<uint8_t, int32_t> children;
    int32_t value = -1;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_byte_{};
  bool empty_ = true;
};

// Word -> BPE ids for recent short words. One cache per thread, so encoding
// threads never contend; it belongs to one tokenizer at a time (`owner`, a
// never-reused serial) and is cleared when another tokenizer uses the thread
// or when it fills up.
struct WordCache {
  static constexpr size_t kMaxWordBytes = 48;
  static constexpr size_t kMaxEntries = 16384;
  uint64_t owner = 0;
  absl::flat_hash_map<std::string, std::vector<int32_t>> map;

  static WordCache& ForThread(uint64_t tokenizer_serial) {
    thread_local WordCache cache;
    if (cache.owner != tokenizer_serial) {
      cache.map.clear();
      cache.owner = tokenizer_serial;
    }
    return cache;
  }
};

std::atomic<uint64_t> next_serial{1};

enum class TokenKind : uint8_t { kNone, kModel, kAdded, kSpecial };

struct Merge {
  int32_t rank;
  int32_t id;  // the merged token
};

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct BpeTokenizer::Impl {
  // True when the vocabulary is written in the byte-level alphabet (a
  // ByteLevel pre-tokenizer); false for text vocabularies, whose symbols are
  // UTF-8 characters and whose text comes from `decoder`.
  bool byte_level = true;
  std::optional<Decoder> decoder;  // text vocabularies only
  // Per id: text inside a stream (raw bytes of model tokens; decoded content
  // of added tokens), and kind. Sized vocab_size.
  std::vector<std::string> bytes;
  std::vector<TokenKind> kind;
  // Text vocabularies: per id, the vocabulary string or added-token content
  // the decoder chain takes.
  std::vector<std::string> pieces;
  // Vocabulary strings (alphabet form) and added-token contents -> id.
  absl::flat_hash_map<std::string, int32_t> token_to_id;
  // Model tokens by the string the BPE works on (raw bytes for byte-level
  // vocabularies, the vocabulary string otherwise) -> id.
  absl::flat_hash_map<std::string, int32_t> word_to_id;
  std::array<int32_t, 256> byte_id;           // single-byte token, -1 if none
  std::array<int32_t, 256> byte_fallback_id;  // "<0xXX>" token, -1 if none
  absl::flat_hash_map<uint64_t, Merge> merges;
  int32_t unk_id = -1;
  bool fuse_unk = false;
  bool byte_fallback = false;
  bool ignore_merges = false;

  std::vector<AddedToken> added;                 // file order
  Trie raw_trie;                                 // added tokens matched in raw text
  Trie normalized_trie;                          // added tokens matched in normalized text
  std::vector<std::string> normalized_contents;  // per `added` index

  Normalizer normalizer;
  PreTokenizer pre_tokenizer;

  std::vector<int32_t> prefix, suffix;
  std::optional<int32_t> bos, eos;
  bool add_bos = false;

  const uint64_t serial = next_serial.fetch_add(1);  // identifies this tokenizer's word caches

  void Bpe(std::string_view word, std::vector<int32_t>* out) const;
  // `starts_text`: `text` begins the input (no added token before it).
  void EncodeText(std::string_view text, bool starts_text, std::vector<int32_t>* out) const;
  // Splits `text` around added tokens of `trie`; calls `on_text` for the
  // pieces between them and appends matched token ids to `out`.
  template <typename F>
  void SplitAdded(const Trie& trie, std::string_view text, bool parse_special,
                  std::vector<int32_t>* out, F on_text) const;
};

namespace {

// A Split / Replace "pattern": {"Regex": r} or {"String": s}; sets
// `*regex` to which.
absl::StatusOr<std::string> ParsePattern(const Json& parent, std::string_view where, bool* regex) {
  auto pattern = parent.find("pattern");
  if (pattern == parent.end() || !pattern->is_object()) {
    return Invalid(absl::StrCat(Absl(where), " needs a pattern object"));
  }
  if (auto r = pattern->find("Regex"); r != pattern->end() && r->is_string()) {
    *regex = true;
    return r->get<std::string>();
  }
  if (auto s = pattern->find("String"); s != pattern->end() && s->is_string()) {
    *regex = false;
    return s->get<std::string>();
  }
  return Invalid(absl::StrCat(Absl(where), " pattern needs a Regex or String"));
}

// Parses the "normalizer" section into `steps`.
absl::Status ParseNormalizer(const Json& n, std::vector<NormalizerStep>* steps) {
  if (n.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = TypeOf(n, "normalizer");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = n.find("normalizers");
    if (it == n.end() || !it->is_array()) return Invalid("normalizer Sequence needs normalizers[]");
    for (const Json& sub : *it) {
      if (absl::Status s = ParseNormalizer(sub, steps); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  static constexpr std::pair<std::string_view, NormalizationForm> kForms[] = {
      {"NFC", NormalizationForm::kNfc},
      {"NFD", NormalizationForm::kNfd},
      {"NFKC", NormalizationForm::kNfkc},
      {"NFKD", NormalizationForm::kNfkd}};
  for (const auto& [name, form] : kForms) {
    if (*type == name) {
      steps->push_back(form);
      return absl::OkStatus();
    }
  }
  if (*type == "Prepend") {
    absl::StatusOr<std::string> prefix = GetString(n, "prepend", "");
    if (!prefix.ok()) return prefix.status();
    steps->push_back(PrependNormalizer{*std::move(prefix)});
  } else if (*type == "Replace") {
    ReplaceNormalizer replace;
    absl::StatusOr<std::string> pattern = ParsePattern(n, "Replace", &replace.regex);
    if (!pattern.ok()) return pattern.status();
    absl::StatusOr<std::string> content = GetString(n, "content", "");
    if (!content.ok()) return content.status();
    replace.pattern = *std::move(pattern);
    replace.content = *std::move(content);
    steps->push_back(std::move(replace));
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: normalizer ", *type,
                     " is not supported (null, NF[K]C/D, Prepend, Replace, Sequence)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<SplitBehavior> ParseBehavior(const std::string& b) {
  if (b == "Removed") return SplitBehavior::kRemoved;
  if (b == "Isolated") return SplitBehavior::kIsolated;
  if (b == "MergedWithPrevious") return SplitBehavior::kMergedWithPrevious;
  if (b == "MergedWithNext") return SplitBehavior::kMergedWithNext;
  if (b == "Contiguous") return SplitBehavior::kContiguous;
  return Invalid(absl::StrCat("unknown Split behavior ", b));
}

// A Metaspace pre-tokenizer or decoder: "replacement", "prepend_scheme"
// (first / always / never; older files: "add_prefix_space", false meaning
// never), "split" (default true).
absl::StatusOr<MetaspaceStep> ParseMetaspace(const Json& p) {
  MetaspaceStep step;
  absl::StatusOr<std::string> replacement = GetString(p, "replacement", "\u2581");
  if (!replacement.ok()) return replacement.status();
  step.replacement = *std::move(replacement);
  absl::StatusOr<std::string> scheme = GetString(p, "prepend_scheme", "always");
  if (!scheme.ok()) return scheme.status();
  if (*scheme == "always") {
    step.prepend_scheme = PrependScheme::kAlways;
  } else if (*scheme == "first") {
    step.prepend_scheme = PrependScheme::kFirst;
  } else if (*scheme == "never") {
    step.prepend_scheme = PrependScheme::kNever;
  } else {
    return Invalid(absl::StrCat("Metaspace: unknown prepend_scheme ", *scheme));
  }
  absl::StatusOr<bool> add_prefix_space = GetBool(p, "add_prefix_space", true);
  if (!add_prefix_space.ok()) return add_prefix_space.status();
  if (!*add_prefix_space) {
    if (p.contains("prepend_scheme") && step.prepend_scheme != PrependScheme::kNever) {
      return Invalid("Metaspace: add_prefix_space false contradicts prepend_scheme");
    }
    step.prepend_scheme = PrependScheme::kNever;
  }
  absl::StatusOr<bool> split = GetBool(p, "split", true);
  if (!split.ok()) return split.status();
  step.split = *split;
  return step;
}

absl::Status ParsePreTokenizer(const Json& p, std::vector<PreTokenizerStep>* steps) {
  if (p.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = TypeOf(p, "pre_tokenizer");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = p.find("pretokenizers");
    if (it == p.end() || !it->is_array())
      return Invalid("pre_tokenizer Sequence needs pretokenizers[]");
    for (const Json& sub : *it) {
      if (absl::Status s = ParsePreTokenizer(sub, steps); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") {
    ByteLevelStep step;
    absl::StatusOr<bool> prefix = GetBool(p, "add_prefix_space", false);
    absl::StatusOr<bool> regex = GetBool(p, "use_regex", true);
    if (!prefix.ok()) return prefix.status();
    if (!regex.ok()) return regex.status();
    step.add_prefix_space = *prefix;
    step.use_regex = *regex;
    steps->push_back(step);
    return absl::OkStatus();
  }
  if (*type == "Split") {
    bool is_regex = false;
    absl::StatusOr<std::string> text = ParsePattern(p, "Split", &is_regex);
    if (!text.ok()) return text.status();
    absl::StatusOr<std::unique_ptr<RegexSplitter>> regex =
        RegexSplitter::Create(*text, /*literal=*/!is_regex);
    if (!regex.ok()) return Invalid(absl::StrCat("Split: ", regex.status().message()));
    absl::StatusOr<std::string> behavior = GetString(p, "behavior", "Isolated");
    if (!behavior.ok()) return behavior.status();
    absl::StatusOr<SplitBehavior> b = ParseBehavior(*behavior);
    if (!b.ok()) return b.status();
    absl::StatusOr<bool> invert = GetBool(p, "invert", false);
    if (!invert.ok()) return invert.status();
    steps->push_back(
        SplitStep{std::shared_ptr<const RegexSplitter>(*std::move(regex)), *b, *invert});
    return absl::OkStatus();
  }
  if (*type == "Metaspace") {
    absl::StatusOr<MetaspaceStep> step = ParseMetaspace(p);
    if (!step.ok()) return step.status();
    steps->push_back(*std::move(step));
    return absl::OkStatus();
  }
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: pre_tokenizer ", *type,
                   " is not supported (Split, ByteLevel, Metaspace, Sequence)"));
}

absl::Status ParseDecoder(const Json& d, std::vector<DecoderStep>* steps) {
  if (d.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = TypeOf(d, "decoder");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = d.find("decoders");
    if (it == d.end() || !it->is_array()) return Invalid("decoder Sequence needs decoders[]");
    for (const Json& sub : *it) {
      if (absl::Status s = ParseDecoder(sub, steps); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") {
    steps->push_back(ByteLevelDecoder{});
  } else if (*type == "ByteFallback") {
    steps->push_back(ByteFallbackDecoder{});
  } else if (*type == "Fuse") {
    steps->push_back(FuseDecoder{});
  } else if (*type == "Replace") {
    bool regex = false;
    absl::StatusOr<std::string> pattern = ParsePattern(d, "decoder Replace", &regex);
    if (!pattern.ok()) return pattern.status();
    if (regex) {
      return absl::UnimplementedError(
          "tokenizer.json: decoder Replace with a Regex pattern is not supported");
    }
    absl::StatusOr<std::string> content = GetString(d, "content", "");
    if (!content.ok()) return content.status();
    steps->push_back(ReplaceDecoder{*std::move(pattern), *std::move(content)});
  } else if (*type == "Strip") {
    StripDecoder strip;
    absl::StatusOr<std::string> content = GetString(d, "content", " ");
    if (!content.ok()) return content.status();
    strip.content = *std::move(content);
    for (auto [key, field] : {std::pair{"start", &strip.start}, std::pair{"stop", &strip.stop}}) {
      auto it = d.find(key);
      if (it == d.end() || it->is_null()) continue;
      if (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > 1024) {
        return Invalid(absl::StrCat("decoder Strip: ", key, " must be an integer in [0, 1024]"));
      }
      *field = it->get<int>();
    }
    steps->push_back(std::move(strip));
  } else if (*type == "Metaspace") {
    absl::StatusOr<MetaspaceStep> meta = ParseMetaspace(d);
    if (!meta.ok()) return meta.status();
    steps->push_back(
        MetaspaceDecoder{meta->replacement, meta->prepend_scheme != PrependScheme::kNever});
  } else {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: decoder ", *type,
                     " is not supported (ByteLevel, ByteFallback, Fuse, Replace, Strip, "
                     "Metaspace, Sequence)"));
  }
  return absl::OkStatus();
}

// Collects the ids a post-processor adds around a single sequence.
absl::Status ParsePostProcessor(const Json& p,
                                const absl::flat_hash_map<std::string, int32_t>& token_to_id,
                                std::vector<int32_t>* prefix, std::vector<int32_t>* suffix) {
  if (p.is_null()) return absl::OkStatus();
  absl::StatusOr<std::string> type = TypeOf(p, "post_processor");
  if (!type.ok()) return type.status();
  if (*type == "Sequence") {
    auto it = p.find("processors");
    if (it == p.end() || !it->is_array())
      return Invalid("post_processor Sequence needs processors[]");
    for (const Json& sub : *it) {
      if (absl::Status s = ParsePostProcessor(sub, token_to_id, prefix, suffix); !s.ok()) {
        return s;
      }
    }
    return absl::OkStatus();
  }
  if (*type == "TemplateProcessing") {
    auto single = p.find("single");
    auto specials = p.find("special_tokens");
    if (single == p.end() || !single->is_array())
      return Invalid("TemplateProcessing needs single[]");
    bool after_sequence = false;
    for (const Json& piece : *single) {
      if (!piece.is_object()) return Invalid("TemplateProcessing piece must be an object");
      if (piece.contains("Sequence")) {
        after_sequence = true;
        continue;
      }
      auto st = piece.find("SpecialToken");
      if (st == piece.end() || !st->is_object()) return Invalid("unknown TemplateProcessing piece");
      absl::StatusOr<std::string> name = GetString(*st, "id", "");
      if (!name.ok()) return name.status();
      std::vector<int32_t> ids;
      const Json* entry = nullptr;
      if (specials != p.end() && specials->is_object()) {
        auto e = specials->find(*name);
        if (e != specials->end()) entry = &*e;
      }
      if (entry != nullptr && entry->is_object() && entry->contains("ids")) {
        const Json& list = (*entry)["ids"];
        if (!list.is_array()) return Invalid("TemplateProcessing ids must be an array");
        for (const Json& v : list) {
          absl::StatusOr<int32_t> id = GetId(v, "TemplateProcessing");
          if (!id.ok()) return id.status();
          ids.push_back(*id);
        }
      } else if (auto it = token_to_id.find(*name); it != token_to_id.end()) {
        ids.push_back(it->second);
      } else {
        return Invalid(absl::StrCat("TemplateProcessing: unknown special token ", *name));
      }
      auto* target = after_sequence ? suffix : prefix;
      target->insert(target->end(), ids.begin(), ids.end());
    }
    return absl::OkStatus();
  }
  if (*type == "RobertaProcessing" || *type == "BertProcessing") {
    for (const char* key : {"cls", "sep"}) {
      auto it = p.find(key);
      if (it == p.end() || !it->is_array() || it->size() != 2) {
        return Invalid(absl::StrCat(*type, " needs ", key, " = [token, id]"));
      }
      absl::StatusOr<int32_t> id = GetId((*it)[1], *type);
      if (!id.ok()) return id.status();
      (std::string_view(key) == "cls" ? prefix : suffix)->push_back(*id);
    }
    return absl::OkStatus();
  }
  if (*type == "ByteLevel") return absl::OkStatus();  // offsets only
  return absl::UnimplementedError(
      absl::StrCat("tokenizer.json: post_processor ", *type, " is not supported"));
}

// A tokenizer_config.json token entry: "text" or {"content": "text", ...}.
std::optional<std::string> ConfigToken(const Json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeTokenizer>> BpeTokenizer::FromJson(
    std::string_view tokenizer_json, std::string_view tokenizer_config_json) {
  const Json root = Json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Invalid("not valid JSON");
  if (!root.is_object()) return Invalid("top level must be an object");
  auto impl = std::make_unique<Impl>();

  // --- normalizer, pre-tokenizer, decoder ---
  std::vector<NormalizerStep> normalizer_steps;
  if (absl::Status s = ParseNormalizer(root.value("normalizer", Json()), &normalizer_steps);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<Normalizer> normalizer = Normalizer::Create(std::move(normalizer_steps));
  if (!normalizer.ok()) return InFile(normalizer.status(), "normalizer");
  impl->normalizer = *std::move(normalizer);

  std::vector<PreTokenizerStep> steps;
  if (absl::Status s = ParsePreTokenizer(root.value("pre_tokenizer", Json()), &steps); !s.ok()) {
    return s;
  }
  absl::StatusOr<PreTokenizer> pre = PreTokenizer::Create(std::move(steps));
  if (!pre.ok()) return InFile(pre.status(), "pre_tokenizer");
  impl->byte_level = pre->has_byte_level();
  impl->pre_tokenizer = *std::move(pre);
  std::vector<DecoderStep> decoder_steps;
  if (absl::Status s = ParseDecoder(root.value("decoder", Json()), &decoder_steps); !s.ok()) {
    return s;
  }
  absl::StatusOr<Decoder> decoder = Decoder::Create(std::move(decoder_steps));
  if (!decoder.ok()) return InFile(decoder.status(), "decoder");
  if (!impl->byte_level) impl->decoder = *std::move(decoder);

  // --- model ---
  auto model_it = root.find("model");
  if (model_it == root.end()) return Invalid("no model");
  const Json& model = *model_it;
  absl::StatusOr<std::string> model_type = TypeOf(model, "model");
  if (!model_type.ok()) {
    // Old files omit model.type for BPE.
    if (!model.is_object() || !model.contains("merges")) return model_type.status();
    model_type = std::string("BPE");
  }
  if (*model_type != "BPE") {
    return absl::UnimplementedError(
        absl::StrCat("tokenizer.json: model ", *model_type, " is not supported (BPE only)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    absl::StatusOr<std::string> v = GetString(model, key, "");
    if (!v.ok()) return v.status();
    if (!v->empty()) {
      return absl::UnimplementedError(
          absl::StrCat("tokenizer.json: model.", key, " is not supported"));
    }
  }
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0) {
      return absl::UnimplementedError("tokenizer.json: BPE dropout is not supported");
    }
  }
  for (auto [key, field] :
       {std::pair{"fuse_unk", &impl->fuse_unk}, std::pair{"byte_fallback", &impl->byte_fallback},
        std::pair{"ignore_merges", &impl->ignore_merges}}) {
    absl::StatusOr<bool> v = GetBool(model, key, false);
    if (!v.ok()) return v.status();
    *field = *v;
  }

  auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object())
    return Invalid("model.vocab must be an object");
  auto added_it = root.find("added_tokens");
  if (added_it != root.end() && !added_it->is_null() && !added_it->is_array()) {
    return Invalid("added_tokens must be an array");
  }
  const size_t num_added = added_it != root.end() && added_it->is_array() ? added_it->size() : 0;
  const int64_t id_limit = static_cast<int64_t>(vocab_it->size() + num_added) + kMaxIdGap;

  int64_t max_id = -1;
  std::vector<std::pair<std::string, int32_t>> vocab;
  vocab.reserve(vocab_it->size());
  for (const auto& [token, value] : vocab_it->items()) {
    absl::StatusOr<int32_t> id = GetId(value, "model.vocab");
    if (!id.ok()) return id.status();
    if (*id >= id_limit)
      return Invalid(absl::StrCat("model.vocab: id ", *id, " is far past the vocabulary"));
    vocab.emplace_back(token, *id);
    max_id = std::max<int64_t>(max_id, *id);
  }

  // --- added tokens ---
  if (num_added > 0) {
    for (const Json& entry : *added_it) {
      if (!entry.is_object()) return Invalid("added_tokens entries must be objects");
      AddedToken t;
      auto id_it = entry.find("id");
      if (id_it == entry.end()) return Invalid("added token without id");
      absl::StatusOr<int32_t> id = GetId(*id_it, "added_tokens");
      if (!id.ok()) return id.status();
      if (*id >= id_limit)
        return Invalid(absl::StrCat("added_tokens: id ", *id, " is far past the vocabulary"));
      t.id = *id;
      absl::StatusOr<std::string> content = GetString(entry, "content", "");
      if (!content.ok()) return content.status();
      if (content->empty()) return Invalid("added token with empty content");
      if (!utf8::IsValid(*content)) return Invalid("added token content is not UTF-8");
      t.content = *std::move(content);
      for (auto [key, field] :
           {std::pair{"special", &t.special}, std::pair{"lstrip", &t.lstrip},
            std::pair{"rstrip", &t.rstrip}, std::pair{"normalized", &t.normalized},
            std::pair{"single_word", &t.single_word}}) {
        // HF's default for "normalized" is !special; files always spell it out.
        absl::StatusOr<bool> v = GetBool(entry, key, false);
        if (!v.ok()) return v.status();
        *field = *v;
      }
      max_id = std::max<int64_t>(max_id, t.id);
      impl->added.push_back(std::move(t));
    }
  }

  const size_t size = static_cast<size_t>(max_id + 1);
  impl->bytes.assign(size, "");
  impl->kind.assign(size, TokenKind::kNone);
  impl->byte_id.fill(-1);
  impl->byte_fallback_id.fill(-1);
  impl->token_to_id.reserve(vocab.size() + impl->added.size());
  impl->word_to_id.reserve(vocab.size());
  if (!impl->byte_level) impl->pieces.assign(size, "");
  for (auto& [token, id] : vocab) {
    if (impl->kind[id] != TokenKind::kNone) {
      return Invalid(absl::StrCat("model.vocab: id ", id, " is used twice"));
    }
    impl->kind[id] = TokenKind::kModel;
    if (!impl->byte_level) {
      // Text vocabulary: the BPE works on the string itself; its text is
      // what the decoder chain makes of it.
      if (!utf8::IsValid(token)) return Invalid("model.vocab: a token is not UTF-8");
      impl->word_to_id.emplace(token, id);
      impl->bytes[id] = impl->decoder->DecodeToken(token);
      impl->pieces[id] = token;
    } else if (std::optional<std::string> raw = ByteLevelAlphabet::Decode(token); raw.has_value()) {
      impl->word_to_id.emplace(*raw, id);
      if (raw->size() == 1) impl->byte_id[static_cast<uint8_t>((*raw)[0])] = id;
      impl->bytes[id] = *std::move(raw);
    } else {
      // Not in the alphabet: no byte-level text produces it; it decodes to its
      // own UTF-8 (what HF's ByteLevel decoder does).
      impl->bytes[id] = token;
    }
    if (token.size() == 6 && token.starts_with("<0x") && token.back() == '>') {
      int value = 0;
      bool hex = true;
      for (char c : token.substr(3, 2)) {
        const int d = (c >= '0' && c <= '9') ? c - '0' : (c >= 'A' && c <= 'F') ? c - 'A' + 10 : -1;
        hex = hex && d >= 0;
        value = value * 16 + d;
      }
      if (hex) impl->byte_fallback_id[value] = id;
    }
    impl->token_to_id.emplace(std::move(token), id);
  }
  vocab.clear();
  if (impl->byte_level && impl->byte_fallback) {
    // <0xXX> tokens decode to their byte (text vocabularies: if the decoder
    // has ByteFallback).
    for (int b = 0; b < 256; ++b) {
      if (impl->byte_fallback_id[b] >= 0)
        impl->bytes[impl->byte_fallback_id[b]] = std::string(1, char(b));
    }
  }
  for (const AddedToken& t : impl->added) {
    impl->kind[t.id] = t.special ? TokenKind::kSpecial : TokenKind::kAdded;
    impl->bytes[t.id] = impl->byte_level ? t.content : impl->decoder->DecodeToken(t.content);
    if (!impl->byte_level) impl->pieces[t.id] = t.content;
    impl->token_to_id.insert_or_assign(t.content, t.id);
  }

  absl::StatusOr<std::string> unk = GetString(model, "unk_token", "");
  if (!unk.ok()) return unk.status();
  if (!unk->empty()) {
    auto it = impl->token_to_id.find(*unk);
    if (it == impl->token_to_id.end())
      return Invalid(absl::StrCat("unk_token ", *unk, " is not in the vocabulary"));
    impl->unk_id = it->second;
  }

  // --- merges ---
  auto merges_it = model.find("merges");
  if (merges_it != model.end() && !merges_it->is_null()) {
    if (!merges_it->is_array()) return Invalid("model.merges must be an array");
    impl->merges.reserve(merges_it->size());
    int32_t rank = 0;
    std::string merged;
    for (const Json& m : *merges_it) {
      std::string a, b;
      if (m.is_string()) {
        const std::string& s = m.get_ref<const std::string&>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return Invalid(
              absl::StrCat("merge \"", s, "\" is not two tokens separated by one space"));
        }
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        a = m[0].get<std::string>();
        b = m[1].get<std::string>();
      } else {
        return Invalid("merges must be \"a b\" strings or [a, b] pairs");
      }
      auto ia = impl->token_to_id.find(a);
      auto ib = impl->token_to_id.find(b);
      merged = a + b;
      auto im = impl->token_to_id.find(merged);
      if (ia == impl->token_to_id.end() || ib == impl->token_to_id.end() ||
          im == impl->token_to_id.end()) {
        return Invalid(absl::StrCat("merge (", a, ", ", b, ") uses a token not in the vocabulary"));
      }
      impl->merges.insert_or_assign(PairKey(ia->second, ib->second), Merge{rank++, im->second});
    }
  }

  // --- post-processor ---
  if (absl::Status s = ParsePostProcessor(root.value("post_processor", Json()), impl->token_to_id,
                                          &impl->prefix, &impl->suffix);
      !s.ok()) {
    return s;
  }
  for (int32_t id : impl->prefix) {
    if (id < 0 || static_cast<size_t>(id) >= size) return Invalid("post_processor id out of range");
  }
  for (int32_t id : impl->suffix) {
    if (id < 0 || static_cast<size_t>(id) >= size) return Invalid("post_processor id out of range");
  }

  // --- added-token tries (normalized ones match normalized contents) ---
  impl->normalized_contents.resize(impl->added.size());
  for (size_t i = 0; i < impl->added.size(); ++i) {
    const AddedToken& t = impl->added[i];
    if (t.normalized && !impl->normalizer.empty()) {
      impl->normalized_contents[i] = impl->normalizer.Normalize(t.content);
      impl->normalized_trie.Add(impl->normalized_contents[i], static_cast<int32_t>(i));
    } else {
      impl->raw_trie.Add(t.content, static_cast<int32_t>(i));
    }
  }

  // --- tokenizer_config.json: BOS / EOS ---
  std::optional<bool> config_add_bos;
  if (!tokenizer_config_json.empty()) {
    const Json config = Json::parse(tokenizer_config_json, nullptr, false);
    if (config.is_discarded() || !config.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    auto lookup = [&](const char* key) -> std::optional<int32_t> {
      std::optional<std::string> name = ConfigToken(config, key);
      if (!name.has_value()) return std::nullopt;
      auto it = impl->token_to_id.find(*name);
      if (it == impl->token_to_id.end()) return std::nullopt;
      return it->second;
    };
    impl->bos = lookup("bos_token");
    impl->eos = lookup("eos_token");
    if (auto it = config.find("add_bos_token"); it != config.end() && it->is_boolean()) {
      config_add_bos = it->get<bool>();
    }
  }
  if (!impl->bos.has_value() && impl->prefix.size() == 1) impl->bos = impl->prefix[0];
  impl->add_bos = impl->bos.has_value() &&
                  config_add_bos.value_or(!impl->prefix.empty() && impl->prefix[0] == *impl->bos);

  return std::unique_ptr<BpeTokenizer>(new BpeTokenizer(std::move(impl)));
}

BpeTokenizer::BpeTokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
BpeTokenizer::~BpeTokenizer() = default;

namespace {

// Letter, mark, decimal digit or connector: the \w of HF's single_word check.
bool IsWordChar(char32_t cp) {
  static const RegexSplitter* word = [] {
    auto r = RegexSplitter::Create(R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}])");
    return r.ok() ? r->release() : nullptr;
  }();
  if (word == nullptr) return cp == '_' || (cp < 0x80 && std::isalnum(static_cast<int>(cp)));
  std::string s;
  utf8::Append(cp, &s);
  return !word->FindAll(s).empty();
}

// Last code point before byte `pos` of valid UTF-8 `s` (pos > 0).
char32_t CodePointBefore(std::string_view s, size_t pos) {
  size_t start = pos - 1;
  while (start > 0 && (static_cast<uint8_t>(s[start]) & 0xC0) == 0x80) --start;
  return utf8::Next(s, &start);
}

}  // namespace

template <typename F>
void BpeTokenizer::Impl::SplitAdded(const Trie& trie, std::string_view text, bool parse_special,
                                    std::vector<int32_t>* out, F on_text) const {
  if (trie.empty()) {
    if (!text.empty()) on_text(text);
    return;
  }
  size_t emitted = 0;  // text before this offset is handled
  size_t pos = 0;
  while (pos < text.size()) {
    const auto [index, length] = trie.LongestAt(text, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    const AddedToken& t = added[index];
    size_t start = pos;
    size_t stop = pos + length;
    bool accept = parse_special || !t.special;
    if (accept && t.single_word) {
      const bool left_ok = start == 0 || !IsWordChar(CodePointBefore(text, start));
      size_t after = stop;
      const bool right_ok = stop == text.size() || !IsWordChar(utf8::Next(text, &after));
      accept = left_ok && right_ok;
    }
    if (!accept) {
      pos = stop;  // like HF: the skipped match is consumed, matching resumes after it
      continue;
    }
    if (t.lstrip) {
      while (start > emitted) {
        size_t prev = start - 1;
        while (prev > emitted && (static_cast<uint8_t>(text[prev]) & 0xC0) == 0x80) --prev;
        size_t probe = prev;
        if (!utf8::IsWhiteSpace(utf8::Next(text, &probe))) break;
        start = prev;
      }
    }
    if (t.rstrip) {
      while (stop < text.size()) {
        size_t next = stop;
        if (!utf8::IsWhiteSpace(utf8::Next(text, &next))) break;
        stop = next;
      }
    }
    if (start > emitted) on_text(text.substr(emitted, start - emitted));
    out->push_back(t.id);
    emitted = pos = stop;
  }
  if (emitted < text.size()) on_text(text.substr(emitted));
}

void BpeTokenizer::Impl::EncodeText(std::string_view text, bool starts_text,
                                    std::vector<int32_t>* out) const {
  for (const std::string& word : pre_tokenizer.Split(text, starts_text)) {
    if (ignore_merges) {
      auto it = word_to_id.find(Absl(word));
      if (it != word_to_id.end()) {
        out->push_back(it->second);
        continue;
      }
    }
    Bpe(word, out);
  }
}

void BpeTokenizer::Impl::Bpe(std::string_view word, std::vector<int32_t>* out) const {
  WordCache* cache = nullptr;
  if (word.size() <= WordCache::kMaxWordBytes) {
    cache = &WordCache::ForThread(serial);
    auto it = cache->map.find(Absl(word));
    if (it != cache->map.end()) {
      out->insert(out->end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t first = out->size();

  // Initial symbols: one per byte, with HF's unk / byte-fallback handling.
  // Scratch buffers are per thread and reused across words.
  struct Symbol {
    int32_t id;
    int32_t prev;
    int32_t next;
    bool alive;
  };
  struct Candidate {
    int32_t rank;
    int32_t pos;
    int32_t id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  symbols.clear();
  heap.clear();
  int32_t pending_unk = -1;  // a (possibly fused) unk waiting to be pushed
  auto push = [&](int32_t id) {
    const int32_t n = static_cast<int32_t>(symbols.size());
    symbols.push_back({id, n - 1, n + 1, true});
  };
  // Symbols are bytes (byte-level vocabularies) or characters (text
  // vocabularies, where a character outside the vocabulary falls back to its
  // <0xXX> tokens when all exist).
  for (size_t i = 0; i < word.size();) {
    size_t end = i;  // of this symbol
    int32_t id = -1;
    bool fallback = false;
    if (byte_level) {
      const uint8_t b = static_cast<uint8_t>(word[end++]);
      id = byte_id[b] >= 0 ? byte_id[b] : byte_fallback ? byte_fallback_id[b] : -1;
    } else {
      utf8::Next(word, &end);
      auto it = word_to_id.find(Absl(word.substr(i, end - i)));
      if (it != word_to_id.end()) {
        id = it->second;
      } else if (byte_fallback) {
        fallback = true;
        for (size_t k = i; k < end; ++k) {
          fallback = fallback && byte_fallback_id[static_cast<uint8_t>(word[k])] >= 0;
        }
      }
    }
    if (id >= 0 || fallback) {
      if (pending_unk >= 0) push(pending_unk), pending_unk = -1;
      if (id >= 0) {
        push(id);
      } else {
        for (size_t k = i; k < end; ++k) push(byte_fallback_id[static_cast<uint8_t>(word[k])]);
      }
    } else if (unk_id >= 0) {
      if (pending_unk >= 0 && !fuse_unk) push(pending_unk);
      pending_unk = unk_id;
    }  // else: HF drops the symbol
    i = end;
  }
  if (pending_unk >= 0) push(pending_unk);
  if (symbols.empty()) return;
  symbols.back().next = -1;

  // Merge lowest rank first; ties go to the leftmost pair. A popped candidate
  // is stale if its left symbol died or its pair changed since it was pushed.
  const auto greater = std::greater<Candidate>();
  auto consider = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    auto it = merges.find(PairKey(symbols[pos].id, symbols[next].id));
    if (it == merges.end()) return;
    heap.push_back({it->second.rank, pos, it->second.id});
    std::push_heap(heap.begin(), heap.end(), greater);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(symbols.size()); ++i) consider(i);
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), greater);
    const Candidate top = heap.back();
    heap.pop_back();
    Symbol& left = symbols[top.pos];
    if (!left.alive || left.next < 0) continue;
    auto it = merges.find(PairKey(left.id, symbols[left.next].id));
    if (it == merges.end() || it->second.rank != top.rank || it->second.id != top.id) continue;
    Symbol& right = symbols[left.next];
    right.alive = false;
    left.id = top.id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = top.pos;
    if (left.prev >= 0) consider(left.prev);
    consider(top.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) out->push_back(symbols[i].id);
  if (symbols.capacity() > (size_t{1} << 16)) {  // do not keep a huge word's buffers
    symbols = {};
    heap = {};
  }
  if (cache != nullptr) {
    if (cache->map.size() >= WordCache::kMaxEntries) cache->map.clear();
    cache->map.emplace(std::string(word), std::vector<int32_t>(out->begin() + first, out->end()));
  }
}

std::vector<int32_t> BpeTokenizer::EncodeImpl(std::string_view text, bool parse_special) const {
  std::string repaired;
  if (!utf8::IsValid(text)) {
    repaired = utf8::Repair(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  const Impl& m = *impl_;
  m.SplitAdded(m.raw_trie, text, parse_special, &ids, [&](std::string_view piece) {
    const bool starts_text = piece.data() == text.data();
    if (m.normalizer.empty()) {
      m.EncodeText(piece, starts_text, &ids);
      return;
    }
    const std::string normalized = m.normalizer.Normalize(piece);
    m.SplitAdded(m.normalized_trie, normalized, parse_special, &ids, [&](std::string_view sub) {
      m.EncodeText(sub, starts_text && sub.data() == normalized.data(), &ids);
    });
  });
  return ids;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text) const {
  return EncodeImpl(text, /*parse_special=*/true);
}

std::vector<int32_t> BpeTokenizer::EncodeOrdinary(std::string_view text) const {
  return EncodeImpl(text, /*parse_special=*/false);
}

std::string BpeTokenizer::Decode(std::span<const int32_t> ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  if (m.byte_level) return Tokenizer::Decode(ids, skip_special_tokens);
  std::vector<std::string_view> pieces;
  pieces.reserve(ids.size());
  for (int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= m.kind.size()) continue;
    const TokenKind kind = m.kind[id];
    if (kind == TokenKind::kNone || (skip_special_tokens && kind == TokenKind::kSpecial)) continue;
    pieces.push_back(m.pieces[id]);
  }
  return utf8::Repair(m.decoder->Decode(pieces));
}

std::string BpeTokenizer::TokenBytes(int32_t token) const {
  if (token < 0 || static_cast<size_t>(token) >= impl_->kind.size()) return "";
  if (impl_->kind[token] == TokenKind::kSpecial) return "";
  return impl_->bytes[token];
}

std::string BpeTokenizer::SpecialTokenText(int32_t token) const {
  if (!IsSpecial(token)) return "";
  return impl_->bytes[token];
}

bool BpeTokenizer::IsSpecial(int32_t token) const {
  return token >= 0 && static_cast<size_t>(token) < impl_->kind.size() &&
         impl_->kind[token] == TokenKind::kSpecial;
}

std::optional<int32_t> BpeTokenizer::TokenId(std::string_view token) const {
  auto it = impl_->token_to_id.find(Absl(token));
  if (it == impl_->token_to_id.end()) return std::nullopt;
  return it->second;
}

std::optional<int32_t> BpeTokenizer::bos_token_id() const { return impl_->bos; }
std::optional<int32_t> BpeTokenizer::eos_token_id() const { return impl_->eos; }
bool BpeTokenizer::add_bos_token() const { return impl_->add_bos; }
int BpeTokenizer::vocab_size() const { return static_cast<int>(impl_->kind.size()); }
const std::vector<int32_t>& BpeTokenizer::prefix_tokens() const { return impl_->prefix; }
const std::vector<int32_t>& BpeTokenizer::suffix_tokens() const { return impl_->suffix; }
std::span<const AddedToken> BpeTokenizer::added_tokens() const { return impl_->added; }

}  // namespace pdserve::text
