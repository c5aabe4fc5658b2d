// Speculative decoding end to end on the CPU runner, for every architecture
// the engine serves: the scheduler with a SpecDecoder (n-gram proposals,
// verification in one step, KV rollback) against the same scheduler without
// one. Greedy and seeded sampling give the same tokens (and finish reasons)
// with and without speculation, with sequences with and without proposals
// in one step, with penalties, stop tokens and max_tokens landing inside an
// accepted run, prefix caching and preemption; every block comes back.
#include <memory>
#include <string>
#include <vector>

#include "engine/runner_factory.h"
#include "engine/spec/draft_proposer.h"
#include "engine/spec/ngram_proposer.h"
#include "engine/spec/spec_decoder.h"
#include "engine/spec/spec_factory.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/arch_models.h"
#include "tests/unit/engine/spec_test_util.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

using testing_spec::RunRequest;
using testing_spec::RunResult;
using testing_spec::RunToCompletion;

using ModelCase = testing_models::ArchCase;

// A prompt that repeats a phrase (what n-gram lookup copies), or one that
// does not.
std::vector<int32_t> RepeatingPrompt(int vocab, int salt) {
  std::vector<int32_t> phrase;
  for (int i = 0; i < 5; ++i) phrase.push_back((i * 7 + salt * 13 + 5) % vocab);
  std::vector<int32_t> p;
  for (int r = 0; r < 4; ++r) p.insert(p.end(), phrase.begin(), phrase.end());
  p.push_back(phrase[0]);
  return p;
}
std::vector<int32_t> PlainPrompt(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 3) % vocab;
  return t;
}

std::unique_ptr<spec::SpecDecoder> NgramDecoder(int k, bool adaptive = true) {
  return std::make_unique<spec::SpecDecoder>(
      spec::SpecOptions{.num_speculative_tokens = k, .adaptive = adaptive},
      std::make_unique<spec::NgramProposer>(spec::NgramOptions{.min_n = 1, .max_n = 3}));
}

class SpecDecodeTest : public testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    config_ = GetParam().config;
    dir_ = testing_models::WriteTinyModel(config_, 11, GetParam().dtype, "spec_" + GetParam().name);
  }
  std::unique_ptr<ModelRunner> NewRunner(int num_blocks = 96) {
    RunnerOptions o;
    o.model_dir = dir_;
    o.kv_block_size = 4;
    o.num_kv_blocks = num_blocks;
    o.num_threads = 2;
    auto r = CreateModelRunner(o);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  // Repeating and plain prompts side by side: steps mix sequences with and
  // without proposals.
  std::vector<RunRequest> Requests(const SamplingParams& base) const {
    std::vector<RunRequest> reqs;
    for (int i = 0; i < 4; ++i) {
      RunRequest r{.prompt = i % 2 == 0 ? RepeatingPrompt(config_.vocab_size, i)
                                        : PlainPrompt(9 + i, config_.vocab_size, i),
                   .sampling = base};
      r.sampling.seed = 1000 + i;
      r.sampling.max_tokens = 30 + 3 * i;
      reqs.push_back(r);
    }
    return reqs;
  }
  void ExpectSame(const RunResult& plain, const RunResult& spec) {
    EXPECT_EQ(plain.tokens, spec.tokens);
    EXPECT_EQ(plain.finish, spec.finish);
    EXPECT_GT(spec.proposed, 0) << "no proposals: the test checks nothing";
    EXPECT_GT(spec.accepted, 0) << "no proposal stood: the test checks nothing";
    EXPECT_LE(spec.steps, plain.steps);
  }

  ModelConfig config_;
  std::string dir_;
};

TEST_P(SpecDecodeTest, GreedyTokenIdentical) {
  auto runner = NewRunner();
  SamplingParams greedy;
  greedy.ignore_eos = true;
  const std::vector<RunRequest> reqs = Requests(greedy);
  const RunResult plain = RunToCompletion(*runner, reqs, nullptr);
  for (int k : {1, 4}) {
    SCOPED_TRACE(k);
    auto decoder = NgramDecoder(k);
    const RunResult spec = RunToCompletion(*runner, reqs, decoder.get());
    ExpectSame(plain, spec);
    EXPECT_EQ(spec.free_blocks_after, runner->num_kv_blocks());
  }
}

TEST_P(SpecDecodeTest, SeededSamplingWithPenaltiesTokenIdentical) {
  auto runner = NewRunner();
  SamplingParams sampled;
  sampled.temperature = 0.7f;
  sampled.top_k = 12;
  sampled.top_p = 0.95f;
  sampled.repetition_penalty = 1.05f;
  sampled.frequency_penalty = 0.1f;
  sampled.min_tokens = 3;
  sampled.logprobs = 2;
  const std::vector<RunRequest> reqs = Requests(sampled);
  const RunResult plain = RunToCompletion(*runner, reqs, nullptr);
  auto decoder = NgramDecoder(4, /*adaptive=*/false);
  const RunResult spec = RunToCompletion(*runner, reqs, decoder.get());
  EXPECT_EQ(plain.tokens, spec.tokens);
  EXPECT_EQ(plain.finish, spec.finish);
  EXPECT_GT(spec.proposed, 0);
  // Log-probabilities come from the verification rows: the same up to the
  // summation order of a batched pass.
  for (const auto& [id, tokens] : plain.sampled) {
    const std::vector<SampledToken>& other = spec.sampled.at(id);
    ASSERT_EQ(tokens.size(), other.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      EXPECT_NEAR(tokens[i].logprob, other[i].logprob, 1e-3) << id << " " << i;
      ASSERT_EQ(tokens[i].top.size(), 2u);
      ASSERT_EQ(other[i].top.size(), 2u);
      EXPECT_EQ(tokens[i].top[0].token, other[i].top[0].token);
    }
  }
}

// Stop tokens and max_tokens that fall inside a run of standing proposals:
// the output ends at the same token as without speculation.
TEST_P(SpecDecodeTest, StopsInsideAcceptedRuns) {
  auto runner = NewRunner();
  SamplingParams greedy;
  greedy.ignore_eos = true;
  std::vector<RunRequest> reqs = Requests(greedy);
  const RunResult free_run = RunToCompletion(*runner, reqs, nullptr);
  for (size_t i = 0; i < reqs.size(); ++i) {
    const std::vector<int32_t>& out = free_run.tokens.at(i + 1);
    if (i % 2 == 0) {
      reqs[i].sampling.stop_token_ids = {out[out.size() / 2]};
    } else {
      reqs[i].sampling.max_tokens = 7 + static_cast<int>(i);
    }
  }
  const RunResult plain = RunToCompletion(*runner, reqs, nullptr);
  auto decoder = NgramDecoder(5, /*adaptive=*/false);
  const RunResult spec = RunToCompletion(*runner, reqs, decoder.get());
  EXPECT_EQ(plain.tokens, spec.tokens);
  EXPECT_EQ(plain.finish, spec.finish);
  EXPECT_EQ(spec.free_blocks_after, runner->num_kv_blocks());
}

// A cache small enough that sequences are preempted and recomputed, with
// prefix caching on: the same tokens, every block back (free or evictable).
TEST_P(SpecDecodeTest, PreemptionAndPrefixCachingTokenIdentical) {
  auto runner = NewRunner(/*num_blocks=*/36);
  SamplingParams greedy;
  greedy.ignore_eos = true;
  const std::vector<RunRequest> reqs = Requests(greedy);
  const RunResult plain = RunToCompletion(*runner, reqs, nullptr, /*prefix_caching=*/true);
  auto decoder = NgramDecoder(4);
  const RunResult spec = RunToCompletion(*runner, reqs, decoder.get(), /*prefix_caching=*/true);
  EXPECT_GT(plain.preemptions + spec.preemptions, 0) << "the cache was never short";
  EXPECT_EQ(plain.tokens, spec.tokens);
  EXPECT_EQ(plain.finish, spec.finish);
  EXPECT_GT(spec.accepted, 0);
  EXPECT_EQ(spec.free_blocks_after, runner->num_kv_blocks());
}

// A draft model: the target itself (its proposals nearly always stand) and
// another model of the same vocabulary (they mostly fall): greedy output is
// token-identical, and the draft's cache holds nothing once every sequence
// finished.
TEST_P(SpecDecodeTest, DraftModelGreedyTokenIdentical) {
  auto runner = NewRunner();
  const std::string other = testing_models::WriteTinyModel(config_, 99, GetParam().dtype,
                                                           "spec_other_" + GetParam().name);
  SamplingParams greedy;
  greedy.ignore_eos = true;
  const std::vector<RunRequest> reqs = Requests(greedy);
  const RunResult plain = RunToCompletion(*runner, reqs, nullptr);
  // Unpriced, then priced (a draft at 0.3 target steps a token): a draft that
  // agrees keeps proposing either way, one that does not cools down sooner
  // when priced; the tokens are the same in every case.
  for (const std::string& draft_dir : {dir_, other}) {
    int64_t unpriced_proposed = 0;
    for (double cost : {0.0, 0.3}) {
      SCOPED_TRACE(draft_dir + " cost " + std::to_string(cost));
      auto draft = CreateModelRunner(
          {.model_dir = draft_dir, .kv_block_size = 4, .num_kv_blocks = 96, .num_threads = 1});
      ASSERT_TRUE(draft.ok()) << draft.status();
      auto proposer = spec::DraftProposer::Create(*std::move(draft), config_);
      ASSERT_TRUE(proposer.ok()) << proposer.status();
      const spec::DraftProposer* p = proposer->get();
      // Nothing cached yet: all but the newest token to catch up.
      EXPECT_EQ(p->CatchUpTokens(1, reqs[0].prompt), static_cast<int>(reqs[0].prompt.size()) - 1);
      spec::SpecDecoder decoder(
          {.num_speculative_tokens = 3, .proposal_cost = cost, .catch_up_cost = cost / 3},
          *std::move(proposer));
      const RunResult spec = RunToCompletion(*runner, reqs, &decoder);
      EXPECT_EQ(plain.tokens, spec.tokens);
      EXPECT_EQ(plain.finish, spec.finish);
      EXPECT_GT(spec.proposed, 0);
      if (draft_dir == dir_) {
        EXPECT_GT(spec.accepted, spec.proposed * 8 / 10);
      } else if (cost > 0) {
        EXPECT_LE(spec.proposed, unpriced_proposed);
      }
      if (cost == 0) unpriced_proposed = spec.proposed;
      EXPECT_EQ(p->num_sequences(), 0u);
      EXPECT_EQ(spec.free_blocks_after, runner->num_kv_blocks());
    }
  }
}

// What the worker's flags build: off is nothing, a k left at 0 is the
// method's default, a k outside [0, 16] or a missing draft
// directory are refused, a draft of another vocabulary is refused naming
// the tokenizer, a draft of the same one is used.
TEST(SpecFactoryTest, ChecksTheConfiguration) {
  const ModelConfig config = testing_models::TinyGqaConfig();
  const std::string dir = testing_models::WriteTinyModel(config, 3, "f32", "spec_factory_target");
  ModelConfig other_vocab = config;
  other_vocab.vocab_size = 64;
  const std::string other =
      testing_models::WriteTinyModel(other_vocab, 4, "f32", "spec_factory_other");
  auto target = CreateModelRunner({.model_dir = dir, .kv_block_size = 4, .num_kv_blocks = 8});
  ASSERT_TRUE(target.ok()) << target.status();
  using spec::SpecMethod;
  EXPECT_EQ(*spec::CreateSpecDecoder({.method = SpecMethod::kOff}, **target), nullptr);
  for (int bad_k : {-1, 17}) {
    EXPECT_EQ(spec::CreateSpecDecoder(
                  {.method = SpecMethod::kNgram, .num_speculative_tokens = bad_k}, **target)
                  .status()
                  .code(),
              absl::StatusCode::kInvalidArgument)
        << bad_k;
  }
  EXPECT_EQ(spec::CreateSpecDecoder({.method = SpecMethod::kDraft}, **target).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<spec::SpecDecoder>> mismatch =
      spec::CreateSpecDecoder({.method = SpecMethod::kDraft, .draft_model_dir = other}, **target);
  EXPECT_EQ(mismatch.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(mismatch.status().message().find("tokenizer"), std::string::npos) << mismatch.status();
  absl::StatusOr<std::unique_ptr<spec::SpecDecoder>> draft = spec::CreateSpecDecoder(
      {.method = SpecMethod::kDraft, .draft_model_dir = dir, .num_threads = 1}, **target);
  ASSERT_TRUE(draft.ok()) << draft.status();
  EXPECT_EQ((*draft)->proposer().name(), "draft");
  absl::StatusOr<std::unique_ptr<spec::SpecDecoder>> ngram =
      spec::CreateSpecDecoder({.method = SpecMethod::kNgram}, **target);
  ASSERT_TRUE(ngram.ok()) << ngram.status();
  EXPECT_EQ((*ngram)->proposer().name(), "ngram");
  // k left at 0 is the method's default; a k given is kept.
  EXPECT_EQ((*ngram)->num_speculative_tokens(), spec::kDefaultNgramTokens);
  EXPECT_EQ((*draft)->num_speculative_tokens(), spec::kDefaultDraftTokens);
  EXPECT_EQ(spec::DefaultSpeculativeTokens(SpecMethod::kNgram), 6);
  EXPECT_EQ(spec::DefaultSpeculativeTokens(SpecMethod::kDraft), 4);
  absl::StatusOr<std::unique_ptr<spec::SpecDecoder>> ngram3 = spec::CreateSpecDecoder(
      {.method = SpecMethod::kNgram, .num_speculative_tokens = 3}, **target);
  ASSERT_TRUE(ngram3.ok()) << ngram3.status();
  EXPECT_EQ((*ngram3)->num_speculative_tokens(), 3);
  // Max batch left at -1 is the method's default; n-gram proposals are not
  // priced, a draft's are, at its size against the target's (the same model
  // here: 1) unless given.
  EXPECT_EQ((*ngram)->options().max_batch, spec::kDefaultNgramMaxBatch);
  EXPECT_EQ((*draft)->options().max_batch, spec::kDefaultDraftMaxBatch);
  EXPECT_EQ((*ngram3)->options().proposal_cost, 0.0);
  EXPECT_DOUBLE_EQ((*draft)->options().proposal_cost, 1.0);
  absl::StatusOr<std::unique_ptr<spec::SpecDecoder>> given = spec::CreateSpecDecoder(
      {.method = SpecMethod::kDraft, .max_batch = 0, .draft_cost = 0.25, .draft_model_dir = dir,
       .num_threads = 1},
      **target);
  ASSERT_TRUE(given.ok()) << given.status();
  EXPECT_EQ((*given)->options().max_batch, 0);
  EXPECT_EQ((*given)->options().proposal_cost, 0.25);
  EXPECT_EQ(spec::CreateSpecDecoder({.method = SpecMethod::kNgram, .max_batch = -2}, **target)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// The draft's cost is its forward FLOPs per token against the target's: a
// model of half the hidden size and half the layers costs well under half.
TEST(SpecFactoryTest, DraftCostFollowsTheModelsSizes) {
  // The demo model's and its draft's shapes (tools/demo_model).
  ModelConfig target;
  target.vocab_size = 2048;
  target.hidden_size = 256;
  target.intermediate_size = 640;
  target.num_layers = 4;
  target.num_heads = 8;
  target.num_kv_heads = 4;
  target.head_dim = 32;
  target.tie_word_embeddings = true;
  ModelConfig draft = target;
  draft.hidden_size = 128;
  draft.intermediate_size = 320;
  draft.num_layers = 2;
  draft.num_heads = 4;
  draft.num_kv_heads = 2;
  const double cost = spec::EstimateDraftCost(draft, target);
  EXPECT_GT(cost, 0.1);
  EXPECT_LT(cost, 0.3);
  EXPECT_DOUBLE_EQ(spec::EstimateDraftCost(target, target), 1.0);
}

INSTANTIATE_TEST_SUITE_P(Models, SpecDecodeTest, testing::ValuesIn(testing_models::AllArchCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace pdserve::engine
