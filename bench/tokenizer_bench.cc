// Tokenizer throughput, printed (never asserted):
//  1. pre-tokenizer split alone (text/pretokenizer.h) with the split regexes
//     of GPT-2, Llama 3, DeepSeek V3 (its three Split steps) and o200k, each
//     compiled in three forms (text/regex_translate.h): "pcre2" (\p{X} on
//     PCRE2's own tables: the behaviour before the Unicode 15.1 tables),
//     "tables" (the default: PCRE2's table plus the code points added since
//     Unicode 14) and "ranges" (explicit ranges only), on four generated
//     texts (English prose, Chinese prose, C++ code, emoji-rich chat);
//     forms alternate within each round, medians of --rounds;
//  2. whole-tokenizer Encode for each of --tokenizer_dirs (default: the demo
//     model), default form.
//   pdserve_tokenizer_bench [--rounds=5] [--kib=256] [--tokenizer_dirs=DIR,DIR]
// (run from the repository root for the default tokenizer).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "text/pretokenizer.h"
#include "text/regex_translate.h"
#include "text/split_patterns.h"
#include "text/tokenizer_loader.h"

ABSL_FLAG(int, rounds, 5, "Alternated rounds; medians are reported");
ABSL_FLAG(int, kib, 256, "Size of each generated text in KiB");
ABSL_FLAG(std::string, tokenizer_dirs, "tools/demo_model",
          "Comma-separated model directories whose tokenizer.json is timed whole");

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// `unit` repeated up to `bytes`.
std::string Repeat(std::string_view unit, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += unit;
  return out;
}

struct Text {
  const char* name;
  std::string text;
};

std::vector<Text> Texts(size_t bytes) {
  return {
      {"english", Repeat("The prefill pool runs the prompt once and builds the key and value "
                         "cache; it's 2026, and they've measured 1,234 tokens/s. ",
                         bytes)},
      {"chinese", Repeat("预填充池只运行一次提示并构建键值缓存，解码池随后逐个生成其余的词元。"
                         "路由器在每个词元就绪时立即把它流式传回客户端。",
                         bytes)},
      {"code", Repeat("for (size_t i = 0; i < n; ++i) {\n  out[i] = std::max(a[i], b[i]) * 2;\n}\n",
                      bytes)},
      {"emoji", Repeat("ok \U0001FABF\U0001FAE8 great \U0001F600\U0001F44D\U0001F3FD "
                       "\U0001F6DC\U0001FA75 done! ",
                       bytes)},
  };
}

struct PatternSet {
  const char* name;
  std::vector<std::string_view> steps;
};

struct Form {
  const char* name;
  text::PropertyForm form;
};

std::unique_ptr<text::PreTokenizer> Build(const PatternSet& set, text::PropertyForm form) {
  std::vector<text::PreTokenizerStep> steps;
  for (std::string_view p : set.steps) {
    absl::StatusOr<std::unique_ptr<text::RegexSplitter>> r =
        text::RegexSplitter::Create(p, false, form);
    if (!r.ok()) {
      std::fprintf(stderr, "%s: %s\n", set.name, r.status().ToString().c_str());
      return nullptr;
    }
    if (!(*r)->jit()) std::fprintf(stderr, "%s: PCRE2 JIT did not compile it\n", set.name);
    steps.push_back(text::SplitStep{std::shared_ptr<const text::RegexSplitter>(*std::move(r))});
  }
  absl::StatusOr<text::PreTokenizer> p = text::PreTokenizer::Create(std::move(steps));
  if (!p.ok()) return nullptr;
  return std::make_unique<text::PreTokenizer>(*std::move(p));
}

int Run() {
  const int rounds = std::max(1, absl::GetFlag(FLAGS_rounds));
  const std::vector<Text> texts = Texts(static_cast<size_t>(absl::GetFlag(FLAGS_kib)) * 1024);
  const std::vector<PatternSet> sets = {
      {"gpt2", {text::split_patterns::kGpt2}},
      {"llama3", {text::split_patterns::kLlama3}},
      {"deepseek_v3",
       {text::split_patterns::kDeepSeekV3Digits, text::split_patterns::kDeepSeekV3Cjk,
        text::split_patterns::kDeepSeekV3Words}},
      {"o200k", {text::split_patterns::kO200k}},
  };
  const std::vector<Form> forms = {{"pcre2", text::PropertyForm::kEngineOnly},
                                   {"tables", text::PropertyForm::kAuto},
                                   {"ranges", text::PropertyForm::kRanges}};
  std::printf("pre-tokenizer split, MB/s (median of %d rounds); tables: Unicode %s, pcre2: %s\n",
              rounds, text::RegexUnicodeVersion().c_str(),
              text::RegexUnicodeVersion(text::PropertyForm::kEngineOnly).c_str());
  std::printf("%-12s %-8s %10s %10s %10s %8s\n", "pattern", "text", "pcre2", "tables", "ranges",
              "pieces");
  for (const PatternSet& set : sets) {
    std::vector<std::unique_ptr<text::PreTokenizer>> pre;
    for (const Form& f : forms) {
      pre.push_back(Build(set, f.form));
      if (pre.back() == nullptr) return 1;
    }
    for (const Text& t : texts) {
      std::vector<std::vector<double>> mbps(forms.size());
      size_t pieces = 0;
      for (int r = 0; r < rounds; ++r) {
        for (size_t k = 0; k < forms.size(); ++k) {
          const size_t f = (k + r) % forms.size();  // rotate the order
          const auto start = Clock::now();
          pieces = pre[f]->Split(t.text).size();
          const double s = std::chrono::duration<double>(Clock::now() - start).count();
          mbps[f].push_back(t.text.size() / s / 1e6);
        }
      }
      std::printf("%-12s %-8s %10.1f %10.1f %10.1f %8zu\n", set.name, t.name, Median(mbps[0]),
                  Median(mbps[1]), Median(mbps[2]), pieces);
    }
  }
  std::printf("\nwhole tokenizer Encode (default form), MB/s and tokens/s (median)\n");
  std::printf("%-40s %-8s %10s %12s\n", "tokenizer", "text", "MB/s", "tokens/s");
  const std::vector<std::string> dirs =
      absl::StrSplit(absl::GetFlag(FLAGS_tokenizer_dirs), ',', absl::SkipEmpty());
  for (const std::string& dir : dirs) {
    absl::StatusOr<std::unique_ptr<text::Tokenizer>> tok = text::LoadTokenizer(dir);
    if (!tok.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), tok.status().ToString().c_str());
      return 1;
    }
    for (const Text& t : texts) {
      std::vector<double> mbps, tps;
      for (int r = 0; r < rounds; ++r) {
        const auto start = Clock::now();
        const size_t n = (*tok)->Encode(t.text).size();
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        mbps.push_back(t.text.size() / s / 1e6);
        tps.push_back(n / s);
      }
      std::printf("%-40s %-8s %10.2f %12.0f\n",
                  dir.substr(dir.size() > 40 ? dir.size() - 40 : 0).c_str(), t.name, Median(mbps),
                  Median(tps));
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::Run();
}
