// Sampled outputs with speculation follow the distribution of sampling
// without it: a model of 8 tokens, a draft model of the same vocabulary
// whose sampled proposals are verified by rejection sampling, and many
// seeds. Two-sample chi-square on the first decoded tokens (the first
// token comes from the prompt step, which never speculates) against the
// same requests decoded plainly. Seeds are fixed: the test is deterministic.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "engine/runner_factory.h"
#include "engine/spec/draft_proposer.h"
#include "engine/spec/spec_decoder.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/spec_test_util.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

using testing_spec::RunRequest;
using testing_spec::RunResult;
using testing_spec::RunToCompletion;

constexpr int kVocab = 8;

ModelConfig TinyVocabConfig() {
  ModelConfig c = testing_models::TinyGqaConfig();
  c.vocab_size = kVocab;
  c.hidden_size = 32;
  c.intermediate_size = 64;
  c.head_dim = 8;
  c.eos_token_ids = {7};
  c.bos_token_id = 6;
  return c;
}

std::unique_ptr<ModelRunner> Runner(const std::string& dir, int blocks) {
  auto r = CreateModelRunner(
      {.model_dir = dir, .kv_block_size = 4, .num_kv_blocks = blocks, .num_threads = 1});
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? *std::move(r) : nullptr;
}

// Sum over cells of (a - b)^2 / (a + b): two samples of equal size.
double TwoSampleChiSquare(const std::vector<int>& a, const std::vector<int>& b, int& cells) {
  double chi2 = 0;
  cells = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] + b[i] == 0) continue;
    ++cells;
    chi2 += static_cast<double>(a[i] - b[i]) * (a[i] - b[i]) / (a[i] + b[i]);
  }
  return chi2;
}

TEST(SpecDistributionTest, SampledOutputsFollowTheTargetDistribution) {
  const ModelConfig config = TinyVocabConfig();
  // The model's logits are scaled up (temperature 0.5) so the distribution
  // is far from uniform; the draft differs from the target.
  const std::string target_dir = testing_models::WriteTinyModel(config, 5, "f32", "dist_target");
  const std::string draft_dir = testing_models::WriteTinyModel(config, 6, "f32", "dist_draft");
  auto target = Runner(target_dir, 512);
  constexpr int kRequests = 3000;
  std::vector<RunRequest> reqs(kRequests);
  for (int i = 0; i < kRequests; ++i) {
    reqs[i].prompt = {6, 1, 3, 5, 1};
    reqs[i].sampling.temperature = 0.5f;
    reqs[i].sampling.seed = 7000 + i;
    reqs[i].sampling.max_tokens = 4;
    reqs[i].sampling.ignore_eos = true;
  }
  const RunResult plain = RunToCompletion(*target, reqs, nullptr, false, 4, /*max_num_seqs=*/64);
  auto proposer = spec::DraftProposer::Create(Runner(draft_dir, 512), config);
  ASSERT_TRUE(proposer.ok()) << proposer.status();
  spec::SpecDecoder decoder({.num_speculative_tokens = 3, .adaptive = false}, *std::move(proposer));
  const RunResult spec = RunToCompletion(*target, reqs, &decoder, false, 4, 64);
  ASSERT_EQ(spec.tokens.size(), plain.tokens.size());
  // Proposals both stood and fell: both branches of the sampler ran.
  EXPECT_GT(spec.accepted, spec.proposed / 10);
  EXPECT_LT(spec.accepted, spec.proposed * 9 / 10);

  // Tokens 2 and 3 jointly (64 cells), token 4 alone (8 cells).
  std::vector<int> pair_plain(kVocab * kVocab), pair_spec(kVocab * kVocab);
  std::vector<int> last_plain(kVocab), last_spec(kVocab);
  int differ = 0;
  for (const auto& [id, tokens] : plain.tokens) {
    const std::vector<int32_t>& other = spec.tokens.at(id);
    ASSERT_EQ(tokens.size(), 4u);
    ASSERT_EQ(other.size(), 4u);
    EXPECT_EQ(tokens[0], other[0]);  // the prompt step's token: no speculation
    ++pair_plain[tokens[1] * kVocab + tokens[2]];
    ++pair_spec[other[1] * kVocab + other[2]];
    ++last_plain[tokens[3]];
    ++last_spec[other[3]];
    differ += tokens != other;
  }
  // Rejection sampling draws differently from plain sampling: the samples
  // are distinct, not copies.
  EXPECT_GT(differ, kRequests / 10);
  int cells = 0;
  const double chi_pair = TwoSampleChiSquare(pair_plain, pair_spec, cells);
  // 0.999 quantile of chi-square with cells - 1 degrees of freedom, by
  // Wilson-Hilferty.
  auto critical = [](int dof) {
    const double z = 3.09, k = dof;
    return k * std::pow(1 - 2 / (9 * k) + z * std::sqrt(2 / (9 * k)), 3);
  };
  EXPECT_LT(chi_pair, critical(cells - 1)) << "tokens 2-3, " << cells << " cells";
  const double chi_last = TwoSampleChiSquare(last_plain, last_spec, cells);
  EXPECT_LT(chi_last, critical(cells - 1)) << "token 4, " << cells << " cells";

  // The check has teeth: the draft model's own samples (another
  // distribution) fail it.
  auto draft_runner = Runner(draft_dir, 512);
  const RunResult draft_only = RunToCompletion(*draft_runner, reqs, nullptr, false, 4, 64);
  std::vector<int> pair_draft(kVocab * kVocab);
  for (const auto& [id, tokens] : draft_only.tokens) ++pair_draft[tokens[1] * kVocab + tokens[2]];
  const double chi_draft = TwoSampleChiSquare(pair_plain, pair_draft, cells);
  EXPECT_GT(chi_draft, critical(cells - 1));
  std::cout << "acceptance " << spec.accepted << "/" << spec.proposed << ", chi-square: tokens 2-3 "
            << chi_pair << ", token 4 " << chi_last << ", draft's own samples " << chi_draft << " ("
            << cells << " cells, 0.999 critical " << critical(cells - 1) << ")\n";
}

}  // namespace
}  // namespace pdserve::engine
