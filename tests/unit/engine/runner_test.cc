// The runner interface contract (engine/runtime/model_runner.h), run on every
// backend built into this binary: chunked prompts and prompts after cached
// tokens equal whole prompts, mixed batches equal their parts, steps run in
// enqueue order, each layer is signalled once its K/V is in the cache, the
// registered KV regions describe the cache bytes, sampling in the runner is
// the host sampler's, and bad batches are refused naming the sequence.
// Another backend joins by adding its name to Backends(); its results are
// compared with the CPU backend (the reference) at its dtype's tolerance.
// This file is built twice: runner_test (the CPU backend) and, from
// tests/unit/cuda, runner_cuda_test with PDSERVE_RUNNER_TEST_CUDA (the CUDA
// backend, under the emulation or on a GPU; it skips where no device is
// usable).
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "engine/runner_factory.h"
#include "engine/runtime/model_runner.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

std::vector<std::string> Backends() {
#if defined(PDSERVE_RUNNER_TEST_CUDA)
  return {"cuda"};
#else
  return {"cpu"};
#endif
}
// Backends checked against the CPU reference (all but "cpu").
std::vector<std::string> DeviceBackends() {
  std::vector<std::string> out;
  for (const std::string& b : Backends()) {
    if (b != "cpu") out.push_back(b);
  }
  return out;
}

// Tolerance of logits against the fp32 CPU reference, relative to the logit
// scale: exact-up-to-summation-order for fp32 backends.
double Tolerance(const std::string& backend) { return backend == "cpu" ? 1e-5 : 5e-2; }
// Tolerance between two ways one backend computes the same logits (a whole
// prompt or chunks; a batch or its sequences alone). fp32: summation order.
// bf16 (cuda): a decode token attends through the paged kernel with fp32
// probabilities, a prompt through cuBLAS with bf16 ones, and bf16
// activations round differently along the two paths.
double SamePathTolerance(const std::string& backend) { return backend == "cpu" ? 1e-5 : 2e-2; }

double RelDiff(std::span<const float> a, std::span<const float> b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0, scale = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(a[i] - b[i])));
    scale = std::max(scale, static_cast<double>(std::abs(b[i])));
  }
  return diff / scale;
}

std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 31 + salt * 7 + 5) % vocab;
  return t;
}

std::vector<int32_t> Iota(int n, int from) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

const SamplingParams kGreedy{};

class RunnerTest : public testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    config_ = testing_models::TinyGqaConfig();
    dir_ = testing_models::WriteTinyModel(config_, 7, "f32", "runner_test_model");
    RunnerOptions o = Options(GetParam());
    auto r = CreateModelRunner(o);
    if (GetParam() != "cpu" && r.status().code() == absl::StatusCode::kFailedPrecondition &&
        std::getenv("PDSERVE_REQUIRE_GPU") == nullptr) {  // tests/gpu/run_on_gpu.sh sets it
      GTEST_SKIP() << "no usable device: " << r.status();
    }
    ASSERT_TRUE(r.ok()) << r.status();
    runner_ = *std::move(r);
    tolerance_ = SamePathTolerance(GetParam());
  }
  RunnerOptions Options(const std::string& backend) const {
    RunnerOptions o;
    o.model_dir = dir_;
    o.backend = backend;
    o.kv_block_size = 4;
    o.num_kv_blocks = 64;
    o.num_threads = 2;
    return o;
  }
  std::unique_ptr<ModelRunner> NewRunner(const std::string& backend) {
    auto r = CreateModelRunner(Options(backend));
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *std::move(r) : nullptr;
  }
  // One sampling sequence with logits returned.
  std::vector<float> LogitsOf(ModelRunner& r, std::span<const int32_t> tokens, int num_cached,
                              std::span<const int32_t> table) {
    StepBatch b;
    b.return_logits = true;
    b.seqs.push_back({.tokens = tokens,
                      .num_cached = num_cached,
                      .block_table = table,
                      .sampling = &kGreedy,
                      .history = {}});
    absl::StatusOr<StepOutput> out = r.Step(std::move(b));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->logits : std::vector<float>{};
  }
  // Enqueues `prompt` from position 0 without waiting; null on refusal.
  std::unique_ptr<StepHandle> EnqueuePrompt(std::span<const int32_t> prompt,
                                            std::span<const int32_t> table) {
    absl::StatusOr<std::unique_ptr<StepHandle>> h = runner_->Enqueue(
        {.seqs = {{.tokens = prompt, .block_table = table, .sampling = &kGreedy}}});
    EXPECT_TRUE(h.ok()) << h.status();
    return h.ok() ? *std::move(h) : nullptr;
  }
  // Runs `tokens` from position 0 in chunks of `chunk` (the last samples).
  std::vector<float> ChunkedLogits(ModelRunner& r, const std::vector<int32_t>& tokens, int chunk,
                                   std::span<const int32_t> table) {
    int done = 0;
    while (done + chunk < static_cast<int>(tokens.size())) {
      StepBatch b;
      b.seqs.push_back({.tokens = std::span<const int32_t>(tokens).subspan(done, chunk),
                        .num_cached = done,
                        .block_table = table});
      absl::StatusOr<StepOutput> out = r.Step(std::move(b));
      EXPECT_TRUE(out.ok()) << out.status();
      done += chunk;
    }
    return LogitsOf(r, std::span<const int32_t>(tokens).subspan(done), done, table);
  }

  ModelConfig config_;
  std::string dir_;
  std::unique_ptr<ModelRunner> runner_;
  double tolerance_ = 0;  // SamePathTolerance of the backend
};

TEST_P(RunnerTest, ChunkedPromptEqualsWholePromptAndSoDoesTheNextToken) {
  const std::vector<int32_t> prompt = Tokens(13, config_.vocab_size, 1);
  const std::vector<int32_t> whole_table = Iota(8, 0),
                             chunked_table = {20, 9, 31, 8, 40, 12, 3, 50};
  const std::vector<float> whole = LogitsOf(*runner_, prompt, 0, whole_table);
  for (int chunk : {1, 4, 5, 12}) {
    SCOPED_TRACE(chunk);
    const std::vector<float> chunked = ChunkedLogits(*runner_, prompt, chunk, chunked_table);
    EXPECT_LT(RelDiff(chunked, whole), tolerance_);
    // The next token at position 13 reads the chunked and the whole KV alike.
    const int32_t next = 17;
    EXPECT_LT(RelDiff(LogitsOf(*runner_, {&next, 1}, 13, chunked_table),
                      LogitsOf(*runner_, {&next, 1}, 13, whole_table)),
              tolerance_);
  }
}

TEST_P(RunnerTest, MixedBatchEqualsItsSequencesAlone) {
  // A: a 9-token prompt already cached, decoding token 9. B: the second chunk
  // of a prompt. C: a whole prompt. All in one step, then each alone.
  const std::vector<int32_t> a = Tokens(10, config_.vocab_size, 2),
                             b = Tokens(11, config_.vocab_size, 3),
                             c = Tokens(6, config_.vocab_size, 4);
  const std::vector<int32_t> ta = Iota(3, 0), tb = Iota(3, 3), tc = Iota(2, 6);
  ASSERT_TRUE(
      runner_
          ->Step({.seqs = {{.tokens = std::span<const int32_t>(a).first(9), .block_table = ta},
                           {.tokens = std::span<const int32_t>(b).first(5), .block_table = tb}}})
          .ok());
  StepBatch mixed;
  mixed.return_logits = true;
  mixed.seqs = {{.tokens = std::span<const int32_t>(a).subspan(9),
                 .num_cached = 9,
                 .block_table = ta,
                 .sampling = &kGreedy},
                {.tokens = std::span<const int32_t>(b).subspan(5),
                 .num_cached = 5,
                 .block_table = tb,
                 .sampling = &kGreedy},
                {.tokens = c, .num_cached = 0, .block_table = tc, .sampling = &kGreedy}};
  absl::StatusOr<StepOutput> out = runner_->Step(std::move(mixed));
  ASSERT_TRUE(out.ok()) << out.status();
  const int v = config_.vocab_size;
  ASSERT_EQ(out->logits.size(), 3u * v);

  std::unique_ptr<ModelRunner> alone = NewRunner(GetParam());
  const std::vector<int32_t> t = Iota(3, 10);
  const std::span<const float> all(out->logits);
  EXPECT_LT(RelDiff(all.subspan(0, v), LogitsOf(*alone, a, 0, t)), tolerance_);
  EXPECT_LT(RelDiff(all.subspan(v, v), LogitsOf(*alone, b, 0, t)), tolerance_);
  EXPECT_LT(RelDiff(all.subspan(2 * v, v), LogitsOf(*alone, c, 0, t)), tolerance_);
}

// Verification rows (speculative decoding): a step over a cached prefix plus
// four new tokens returns the logits of its last rows, each what the
// prefix up to that row gives alone, beside a plain sampling sequence and a
// one-token verification, in batch order.
TEST_P(RunnerTest, VerifyRowsAreEachPositionsLogits) {
  const std::vector<int32_t> a = Tokens(12, config_.vocab_size, 6),
                             c = Tokens(5, config_.vocab_size, 8);
  const std::vector<int32_t> ta = Iota(3, 0), tb = Iota(2, 3), tc = Iota(2, 5);
  ASSERT_TRUE(
      runner_
          ->Step({.seqs = {{.tokens = std::span<const int32_t>(a).first(8), .block_table = ta},
                           {.tokens = std::span<const int32_t>(c).first(4), .block_table = tc}}})
          .ok());
  const std::vector<int32_t> b = Tokens(6, config_.vocab_size, 7);
  StepBatch batch;
  batch.return_logits = true;
  batch.seqs = {{.tokens = std::span<const int32_t>(a).subspan(8),
                 .num_cached = 8,
                 .block_table = ta,
                 .num_verify_rows = 3},
                {.tokens = b, .block_table = tb, .sampling = &kGreedy},
                {.tokens = std::span<const int32_t>(c).subspan(4),
                 .num_cached = 4,
                 .block_table = tc,
                 .num_verify_rows = 1}};
  absl::StatusOr<StepOutput> out = runner_->Step(std::move(batch));
  ASSERT_TRUE(out.ok()) << out.status();
  const int v = config_.vocab_size;
  ASSERT_EQ(out->logits.size(), static_cast<size_t>(v));  // the sampling sequence's only
  ASSERT_EQ(out->verify_logits.size(), 4u * v);
  std::unique_ptr<ModelRunner> alone = NewRunner(GetParam());
  const std::vector<int32_t> t = Iota(4, 10);
  const std::span<const float> rows(out->verify_logits);
  for (int j = 0; j < 3; ++j) {  // positions 9, 10, 11 of a
    EXPECT_LT(RelDiff(rows.subspan(j * v, v),
                      LogitsOf(*alone, std::span<const int32_t>(a).first(10 + j), 0, t)),
              tolerance_)
        << "row " << j;
  }
  EXPECT_LT(RelDiff(rows.subspan(3 * v, v), LogitsOf(*alone, c, 0, t)), tolerance_);
  EXPECT_LT(RelDiff(out->logits, LogitsOf(*alone, b, 0, t)), tolerance_);
}

TEST_P(RunnerTest, StepsRunInEnqueueOrderAndEachLayerIsSignalledWithItsKv) {
  const std::vector<int32_t> prompt = Tokens(9, config_.vocab_size, 5);
  const std::vector<int32_t> table = Iota(3, 4);
  const int32_t next = 3;
  // Enqueue the prompt and the decode step that reads its KV, then wait.
  std::unique_ptr<StepHandle> first = EnqueuePrompt(prompt, table);
  ASSERT_NE(first, nullptr);
  absl::StatusOr<std::unique_ptr<StepHandle>> second = runner_->Enqueue(
      {.seqs =
           {{.tokens = {&next, 1}, .num_cached = 9, .block_table = table, .sampling = &kGreedy}},
       .return_logits = true});
  ASSERT_TRUE(second.ok());
  std::vector<std::vector<std::byte>> at_signal(config_.num_layers);
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    ASSERT_TRUE(first->WaitLayer(layer).ok());
    at_signal[layer].resize(runner_->LayerKvBytes(9));
    ASSERT_TRUE(runner_->ReadLayerKv(layer, table, 9, at_signal[layer]).ok());
  }
  ASSERT_TRUE(first->Wait().ok());
  absl::StatusOr<StepOutput> decoded = (*second)->Wait();
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  // Each layer's KV was complete when signalled: it equals the final cache.
  for (int layer = 0; layer < config_.num_layers; ++layer) {
    std::vector<std::byte> final_kv(runner_->LayerKvBytes(9));
    ASSERT_TRUE(runner_->ReadLayerKv(layer, table, 9, final_kv).ok());
    EXPECT_EQ(at_signal[layer], final_kv) << "layer " << layer;
  }
  std::vector<int32_t> ten = prompt;
  ten.push_back(next);
  std::unique_ptr<ModelRunner> alone = NewRunner(GetParam());
  EXPECT_LT(RelDiff(decoded->logits, LogitsOf(*alone, ten, 0, Iota(3, 0))), tolerance_);
  // A waited handle reports no further layers.
  EXPECT_FALSE(first->Wait().ok());
}

TEST_P(RunnerTest, KvRegionsDescribeTheCacheBytes) {
  const std::span<const KvRegion> regions = runner_->kv_regions();
  ASSERT_EQ(regions.size(), static_cast<size_t>(config_.num_layers));
  const std::vector<int32_t> prompt = Tokens(7, config_.vocab_size, 6);
  const std::vector<int32_t> table = {11, 2};
  ASSERT_TRUE(runner_->Step({.seqs = {{.tokens = prompt, .block_table = table}}}).ok());
  for (const KvRegion& region : regions) {
    ASSERT_EQ(region.num_blocks, runner_->num_kv_blocks());
    ASSERT_EQ(region.block_size, runner_->kv_block_size());
    ASSERT_EQ(region.dtype, runner_->kv_dtype());
    if (region.memory != MemoryKind::kHost) continue;  // device bytes: the transport tests
    std::vector<std::byte> kv(runner_->LayerKvBytes(7));
    ASSERT_TRUE(runner_->ReadLayerKv(region.layer, table, 7, kv).ok());
    const int64_t tb = region.token_bytes();
    for (int t = 0; t < 7; ++t) {
      const int64_t at =
          table[t / region.block_size] * region.block_stride_bytes + (t % region.block_size) * tb;
      EXPECT_EQ(std::memcmp(region.k_base + at, kv.data() + t * tb, tb), 0) << "K token " << t;
      EXPECT_EQ(std::memcmp(region.v_base + at, kv.data() + kv.size() / 2 + t * tb, tb), 0)
          << "V token " << t;
    }
  }
}

TEST_P(RunnerTest, SamplingInTheRunnerIsTheHostSampler) {
  const std::vector<int32_t> prompt = Tokens(8, config_.vocab_size, 7);
  const std::vector<int32_t> generated = {4, 9, 4};
  SamplingParams p;
  p.temperature = 0.9f;
  p.top_k = 20;
  p.top_p = 0.9f;
  p.seed = 1234;
  p.repetition_penalty = 1.3f;
  p.frequency_penalty = 0.5f;
  p.logprobs = 3;
  const std::vector<int32_t> table = Iota(2, 0);
  StepBatch b;
  b.return_logits = true;
  b.seqs.push_back({.tokens = prompt,
                    .block_table = table,
                    .sampling = &p,
                    .history = {.prompt = prompt, .generated = generated}});
  absl::StatusOr<StepOutput> out = runner_->Step(std::move(b));
  ASSERT_TRUE(out.ok()) << out.status();
  std::vector<float> scratch;
  const SampledToken host = Sample(out->logits, p, {.prompt = prompt, .generated = generated},
                                   config_.eos_token_ids, scratch);
  EXPECT_EQ(out->sampled[0].token, host.token);
  EXPECT_NEAR(out->sampled[0].logprob, host.logprob, 1e-4);
  ASSERT_EQ(out->sampled[0].top.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(out->sampled[0].top[i].token, host.top[i].token);
}

// A constraint that allows a few ids that depend on the history, so the
// runner must ask it with the sequence's own history.
class FewTokens final : public TokenConstraint {
 public:
  void FillMask(std::span<const int32_t> generated, int remaining, std::span<const int> eos_ids,
                std::span<uint32_t> mask) const override {
    std::fill(mask.begin(), mask.end(), 0u);
    for (int32_t id : Allowed(generated.size(), remaining)) mask[id >> 5] |= 1u << (id & 31);
  }
  static std::vector<int32_t> Allowed(size_t step, int remaining) {
    return {static_cast<int32_t>(3 + step), static_cast<int32_t>(40 + remaining), 77};
  }
};

TEST_P(RunnerTest, ConstraintMasksTheDrawAsTheHostSamplerDoes) {
  const std::vector<int32_t> prompt = Tokens(8, config_.vocab_size, 11);
  const std::vector<int32_t> generated = {4, 9};
  const std::vector<int32_t> table = Iota(2, 0);
  for (float temperature : {0.0f, 1.5f}) {
    for (uint64_t seed : {1u, 2u, 3u}) {
      SamplingParams p;
      p.temperature = temperature;
      p.seed = seed;
      p.max_tokens = 20;
      p.repetition_penalty = 1.2f;
      p.grammar_spec = "(test)";
      p.constraint = std::make_shared<FewTokens>();
      StepBatch b;
      b.return_logits = true;
      b.seqs.push_back({.tokens = prompt,
                        .block_table = table,
                        .sampling = &p,
                        .history = {.prompt = prompt, .generated = generated}});
      absl::StatusOr<StepOutput> out = runner_->Step(std::move(b));
      ASSERT_TRUE(out.ok()) << out.status();
      const std::vector<int32_t> allowed = FewTokens::Allowed(2, 18);
      EXPECT_NE(std::find(allowed.begin(), allowed.end(), out->sampled[0].token), allowed.end())
          << out->sampled[0].token;
      std::vector<float> scratch;
      const SampledToken host = Sample(out->logits, p, {.prompt = prompt, .generated = generated},
                                       config_.eos_token_ids, scratch);
      EXPECT_EQ(out->sampled[0].token, host.token) << "temperature " << temperature;
    }
  }
}

using DeviceRunnerTest = RunnerTest;

TEST_P(DeviceRunnerTest, LogitsAgreeWithTheCpuReference) {
  std::unique_ptr<ModelRunner> cpu = NewRunner("cpu");
  const std::vector<int32_t> prompt = Tokens(12, config_.vocab_size, 8);
  const std::vector<int32_t> table = Iota(3, 0);
  EXPECT_LT(RelDiff(LogitsOf(*runner_, prompt, 0, table), LogitsOf(*cpu, prompt, 0, table)),
            Tolerance(GetParam()));
}

TEST_P(RunnerTest, BadBatchesAreRefusedNamingTheSequence) {
  const std::vector<int32_t> ok = {1, 2, 3}, bad_token = {1, 999}, table = {0};
  auto code_of = [&](StepBatch b) {
    absl::StatusOr<std::unique_ptr<StepHandle>> h = runner_->Enqueue(std::move(b));
    if (!h.ok()) {
      EXPECT_NE(h.status().message().find("sequence 1"), std::string::npos) << h.status();
      return h.status().code();
    }
    return (*h)->Wait().status().code();
  };
  const StepSequence good{.tokens = ok, .block_table = table};
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = bad_token, .block_table = table}}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = {}, .block_table = table}}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = ok, .num_cached = 2, .block_table = table}}}),
            absl::StatusCode::kInvalidArgument);  // 5 tokens, one block of 4
  EXPECT_EQ(code_of({.seqs = {good,
                              {.tokens = ok,
                               .num_cached = config_.max_position_embeddings - 2,
                               .block_table = Iota(40, 0)}}}),
            absl::StatusCode::kInvalidArgument);
  const std::vector<int32_t> out_of_range_block = {runner_->num_kv_blocks()};
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = ok, .block_table = out_of_range_block}}}),
            absl::StatusCode::kInvalidArgument);
  SamplingParams negative;
  negative.temperature = -1;
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = ok, .block_table = table, .sampling = &negative}}}),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code_of({.seqs = {good, {.tokens = ok, .block_table = table, .num_verify_rows = 4}}}),
            absl::StatusCode::kInvalidArgument);  // more rows than tokens
  EXPECT_EQ(code_of({.seqs = {good,
                              {.tokens = ok,
                               .block_table = table,
                               .sampling = &kGreedy,
                               .num_verify_rows = 1}}}),
            absl::StatusCode::kInvalidArgument);  // verifies and samples
  // An empty batch completes at once; the runner still works afterwards.
  EXPECT_TRUE(runner_->Step({}).ok());
  EXPECT_TRUE(runner_->Step({.seqs = {good}}).ok());
}

TEST_P(RunnerTest, DroppingAHandleWaitsForItsStep) {
  // The batch's spans must outlive the step: dropping the handle waits.
  for (int i = 0; i < 20; ++i) {
    std::vector<int32_t> prompt = Tokens(30, config_.vocab_size, i);
    std::vector<int32_t> table = Iota(8, 0);
    absl::StatusOr<std::unique_ptr<StepHandle>> h = runner_->Enqueue(
        {.seqs = {{.tokens = prompt, .block_table = table, .sampling = &kGreedy}}});
    ASSERT_TRUE(h.ok());
  }  // prompt and table die after the handle
  EXPECT_TRUE(runner_
                  ->Step({.seqs = {{.tokens = Tokens(2, config_.vocab_size, 1),
                                    .block_table = Iota(1, 0)}}})
                  .ok());
}

// Step (which a backend may run on the calling thread) after steps still
// queued runs after them, and steps from two threads at once, some through
// Step and some through Enqueue, each give what they give alone.
TEST_P(RunnerTest, StepKeepsEnqueueOrderAndIsSafeBesideEnqueue) {
  std::vector<int32_t> tokens = Tokens(12, config_.vocab_size, 6);
  const std::vector<int32_t> blocks = Iota(3, 9);
  std::unique_ptr<StepHandle> prompt =
      EnqueuePrompt(std::span<const int32_t>(tokens).first(11), blocks);
  ASSERT_NE(prompt, nullptr);
  // Reads the prompt's KV: runs only after the queued prompt.
  const std::vector<float> decoded = LogitsOf(*runner_, {&tokens[11], 1}, 11, blocks);
  ASSERT_TRUE(prompt->Wait().ok());
  std::unique_ptr<ModelRunner> alone = NewRunner(GetParam());
  EXPECT_LT(RelDiff(decoded, LogitsOf(*alone, tokens, 0, Iota(3, 0))), tolerance_);

  // Two threads, each its own sequences (blocks 0-31 and 32-63).
  const auto run = [&](bool through_step, int first_block, std::vector<std::vector<float>>& out) {
    for (int i = 0; i < 12; ++i) {
      const std::vector<int32_t> tokens = Tokens(6 + i % 5, config_.vocab_size, 40 + i);
      const std::vector<int32_t> blocks = Iota(4, first_block + 4 * (i % 8));
      if (through_step) {
        out.push_back(LogitsOf(*runner_, tokens, 0, blocks));
      } else {
        StepBatch b;
        b.return_logits = true;
        b.seqs.push_back({.tokens = tokens, .block_table = blocks, .sampling = &kGreedy});
        absl::StatusOr<std::unique_ptr<StepHandle>> h = runner_->Enqueue(std::move(b));
        ASSERT_TRUE(h.ok());
        absl::StatusOr<StepOutput> o = (*h)->Wait();
        ASSERT_TRUE(o.ok()) << o.status();
        out.push_back(o->logits);
      }
    }
  };
  std::vector<std::vector<float>> by_step, by_enqueue;
  std::thread other([&] { run(false, 32, by_enqueue); });
  run(true, 0, by_step);
  other.join();
  ASSERT_EQ(by_step.size(), 12u);
  ASSERT_EQ(by_enqueue.size(), 12u);
  for (int i = 0; i < 12; ++i) {
    const std::vector<float> want =
        LogitsOf(*alone, Tokens(6 + i % 5, config_.vocab_size, 40 + i), 0, Iota(4, 0));
    EXPECT_LT(RelDiff(by_step[i], want), tolerance_) << "step " << i;
    EXPECT_LT(RelDiff(by_enqueue[i], want), tolerance_) << "enqueue " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, RunnerTest, testing::ValuesIn(Backends()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });
// Empty while the CPU backend is the only one built.
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(DeviceRunnerTest);
INSTANTIATE_TEST_SUITE_P(Backends, DeviceRunnerTest, testing::ValuesIn(DeviceBackends()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace pdserve::engine
