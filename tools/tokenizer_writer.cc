#include "tools/tokenizer_writer.h"

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/pretokenizer.h"
#include "text/split_patterns.h"

namespace pdserve::engine {
namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kSpecialTokens[] = {"<|begin_of_text|>", "<|end_of_text|>",
                                          "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};

// Llama 3's pre-tokenizer split pattern (tokenizer.json of Llama 3.x).
constexpr std::string_view kLlama3Regex = text::split_patterns::kLlama3;

// Meta-Llama-3-8B-Instruct's chat template, as its tokenizer_config.json has it.
constexpr char kLlama3ChatTemplate[] =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif "
    "%}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ "
    "'<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}";

// The text the merges are learned from when the caller gives none.
constexpr char kCorpus[] =
    "The prefill pool runs the prompt once and builds the key and value cache. The decode pool "
    "then generates the rest of the answer one token at a time, and the router streams each token "
    "back to the client as soon as it is ready. Operators watch the time to first token and the "
    "inter token latency, and they scale the two pools on their own. A request that is cancelled "
    "or that runs out of time frees its cache on both sides, so nothing is left behind. The model "
    "reads its weights from the same files as a real checkpoint, and the tokenizer reads the same "
    "tokenizer files. There is an answer for every question in the world, and the best of them are "
    "the ones that are written in the simplest words. This is the end of the text.";

// Byte-pair training over the words the Llama 3 pattern cuts `corpus` into:
// repeatedly merges the most frequent adjacent pair (ties: the smallest pair
// in byte order) until `max_merges` merges are made or no pair occurs twice.
// Deterministic. INVALID_ARGUMENT if the pattern does not compile.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> LearnMerges(
    std::string_view corpus, int max_merges) {
  absl::StatusOr<std::unique_ptr<text::RegexSplitter>> splitter =
      text::RegexSplitter::Create(kLlama3Regex);
  if (!splitter.ok()) return splitter.status();
  std::map<std::string, int> word_counts;
  for (const auto& [begin, end] : (*splitter)->FindAll(corpus)) {
    ++word_counts[std::string(corpus.substr(begin, end - begin))];
  }
  std::vector<std::pair<std::vector<std::string>, int>> words;
  for (const auto& [w, n] : word_counts) {
    std::vector<std::string> symbols;
    for (char c : w) symbols.emplace_back(1, c);
    words.emplace_back(std::move(symbols), n);
  }
  std::vector<std::pair<std::string, std::string>> merges;
  absl::flat_hash_map<std::pair<std::string, std::string>, int> pairs;
  while (static_cast<int>(merges.size()) < max_merges) {
    pairs.clear();
    for (const auto& [symbols, n] : words) {
      for (size_t k = 0; k + 1 < symbols.size(); ++k) pairs[{symbols[k], symbols[k + 1]}] += n;
    }
    const std::pair<std::string, std::string>* best = nullptr;
    int best_count = 1;
    for (const auto& [pair, n] : pairs) {
      if (n > best_count || (n == best_count && best != nullptr && pair < *best)) {
        best = &pair;
        best_count = n;
      }
    }
    if (best == nullptr) break;
    const auto merge = *best;
    merges.push_back(merge);
    for (auto& [symbols, n] : words) {
      std::vector<std::string> out;
      for (size_t k = 0; k < symbols.size(); ++k) {
        if (k + 1 < symbols.size() && symbols[k] == merge.first && symbols[k + 1] == merge.second) {
          out.push_back(merge.first + merge.second);
          ++k;
        } else {
          out.push_back(symbols[k]);
        }
      }
      symbols = std::move(out);
    }
  }
  return merges;
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteDemoTokenizer(int vocab_size, const std::string& out_dir,
                                std::string_view corpus) {
  if (vocab_size < kDemoFirstMergeId) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the demo tokenizer needs vocab_size >= ", kDemoFirstMergeId, ", got ", vocab_size));
  }
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab[text::ByteLevelAlphabet::Char(static_cast<uint8_t>(b))] = b;
  Json added = Json::array();
  int next = 256;
  for (const char* special : kSpecialTokens) {
    vocab[special] = next;
    added.push_back({{"id", next},
                     {"content", special},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", true}});
    ++next;
  }
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> learned = LearnMerges(
      corpus.empty() ? std::string_view(kCorpus) : corpus, vocab_size - kDemoFirstMergeId);
  if (!learned.ok()) return learned.status();
  Json merges = Json::array();
  for (const auto& [a, b] : *learned) {
    const std::string ea = text::ByteLevelAlphabet::Encode(a),
                      eb = text::ByteLevelAlphabet::Encode(b);
    merges.push_back(ea + " " + eb);
    // Two merges may spell the same token ("a"+"bc", "ab"+"c"): one id.
    if (!vocab.contains(ea + eb)) vocab[ea + eb] = next++;
  }
  const Json bos_piece = {{"SpecialToken", {{"id", kSpecialTokens[0]}, {"type_id", 0}}}};
  const Json tokenizer = {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", added},
      {"normalizer", nullptr},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers", Json::array({{{"type", "Split"},
                                        {"pattern", {{"Regex", std::string(kLlama3Regex)}}},
                                        {"behavior", "Isolated"},
                                        {"invert", false}},
                                       {{"type", "ByteLevel"},
                                        {"add_prefix_space", false},
                                        {"trim_offsets", true},
                                        {"use_regex", false}}})}}},
      {"post_processor",
       {{"type", "TemplateProcessing"},
        {"single", Json::array({bos_piece, {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
        {"pair", Json::array({bos_piece,
                              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                              bos_piece,
                              {{"Sequence", {{"id", "B"}, {"type_id", 1}}}}})},
        {"special_tokens",
         {{kSpecialTokens[0],
           {{"id", kSpecialTokens[0]},
            {"ids", Json::array({kDemoBosId})},
            {"tokens", Json::array({kSpecialTokens[0]})}}}}}}},
      {"decoder",
       {{"type", "ByteLevel"},
        {"add_prefix_space", true},
        {"trim_offsets", true},
        {"use_regex", true}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", nullptr},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", false},
        {"byte_fallback", false},
        {"ignore_merges", true},
        {"vocab", vocab},
        {"merges", merges}}}};
  const Json config = {{"bos_token", kSpecialTokens[0]},
                       {"eos_token", "<|eot_id|>"},
                       {"add_bos_token", true},
                       {"model_max_length", 131072},
                       {"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"chat_template", kLlama3ChatTemplate}};
  if (absl::Status s = WriteFile(out_dir + "/tokenizer.json", tokenizer.dump(2)); !s.ok()) return s;
  return WriteFile(out_dir + "/tokenizer_config.json", config.dump(2));
}

}  // namespace pdserve::engine
