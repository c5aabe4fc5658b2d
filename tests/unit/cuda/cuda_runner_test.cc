// The CUDA runner (engine/cuda/cuda_model_runner.h) beyond the interface
// contract of tests/unit/engine/runner_test.cc:
//   * whole-model logits against the CPU runner on every architecture the
//     CPU backend supports, through a prompt, decode steps (single and
//     batched, graph-replayed) and a chunk after cached tokens, within a
//     stated bf16 bound and with the same top-1 token;
//   * decode graphs: replayed steps equal eager ones;
//   * weights: f32 and f16 checkpoints converted on load, through a staging
//     buffer smaller than any tensor;
//   * KV regions and layer events: a stream that waits on layer i's event
//     reads layer i from the registered device memory; layers written from
//     host bytes decode as the computed ones;
//   * failures: device memory that does not suffice, a device fault, both as
//     statuses; the runner works on after a fault is cleared;
//   * device peaks through the engine's backend registry;
//   * structured output: a constrained request's replies on both backends.
// Built for the emulation (gpu_emulated) and for a GPU (gpu; skipped where no
// device is usable).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/cpu/cpu_model_runner.h"
#include "engine/cuda/base/cuda_handles.h"
#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/cuda_peaks.h"
#include "engine/device_peaks.h"
#include "engine/model/weight_source.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "engine/runtime/grammar/tokenizer_vocabulary.h"
#include "engine/runtime/sampler.h"
#include "tests/unit/cuda/gpu_test_util.h"
#include "tests/unit/engine/arch_models.h"
#include "tests/unit/engine/tiny_models.h"
#include "tests/util/constrained_output.h"
#include "tools/tokenizer_writer.h"

namespace pdserve::cuda {
namespace {

using engine::ModelConfig;
using engine::SamplingParams;
using engine::StepBatch;
using engine::StepOutput;
namespace models = engine::testing_models;

// The bf16 bound, for weights stored identically on both backends (a bf16
// checkpoint): the CUDA runner's logits differ from the fp32 CPU runner's
// by bf16 activations (GEMM inputs, K/V, attention probabilities) alone.
// Relative to the row's largest logit: max |cuda - cpu| / max |cpu| <=
// kMaxRelativeError, and sum (cuda - cpu)^2 / sum cpu^2 <= kMaxNmse.
constexpr double kMaxRelativeError = 2e-2;
constexpr double kMaxNmse = 2e-4;

const SamplingParams kGreedy{};

std::vector<int32_t> Iota(int n, int from) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), from);
  return v;
}

std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + salt * 11 + 3) % vocab;
  return t;
}

double RelativeError(std::span<const float> got, std::span<const float> want) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::abs(got[i] - want[i])));
    scale = std::max(scale, static_cast<double>(std::abs(want[i])));
  }
  return diff / scale;
}

int Argmax(std::span<const float> v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// The CPU's top-1 margin over its runner-up, relative to the row's scale.
double Margin(std::span<const float> v) {
  std::vector<float> s(v.begin(), v.end());
  std::partial_sort(s.begin(), s.begin() + 2, s.end(), std::greater<float>());
  double scale = 1e-30;
  for (float x : v) scale = std::max(scale, static_cast<double>(std::abs(x)));
  return (s[0] - s[1]) / scale;
}

// Options of the runners below: a cache of 64 blocks of 4 tokens.
CudaRunnerOptions Small() {
  CudaRunnerOptions o;
  o.kv_block_size = 4;
  o.num_kv_blocks = 64;
  return o;
}

class CudaRunnerTest : public testing::GpuTest {
 protected:
  static std::unique_ptr<CudaModelRunner> Cuda(const std::string& dir,
                                               const CudaRunnerOptions& o = Small()) {
    absl::StatusOr<ModelConfig> config = ModelConfig::FromModelDir(dir);
    EXPECT_TRUE(config.ok()) << config.status();
    if (!config.ok()) return nullptr;
    auto source = engine::WeightSource::Open(*config, dir);
    EXPECT_TRUE(source.ok()) << source.status();
    if (!source.ok()) return nullptr;
    auto runner = CudaModelRunner::Create(**source, o);
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }
  static std::unique_ptr<engine::ModelRunner> Cpu(const std::string& dir) {
    auto runner = engine::CreateModelRunner(
        {.model_dir = dir, .kv_block_size = 4, .num_kv_blocks = 64, .num_threads = 2});
    EXPECT_TRUE(runner.ok()) << runner.status();
    return runner.ok() ? *std::move(runner) : nullptr;
  }
  // Logits of every sampling sequence of `batch`.
  static std::vector<float> Logits(engine::ModelRunner& r, StepBatch batch) {
    batch.return_logits = true;
    absl::StatusOr<StepOutput> out = r.Step(std::move(batch));
    EXPECT_TRUE(out.ok()) << out.status();
    return out.ok() ? out->logits : std::vector<float>{};
  }
};

// ---- every architecture against the CPU ----

struct Arch {
  const char* name;
  ModelConfig (*config)();
};

class ArchitectureTest : public CudaRunnerTest, public ::testing::WithParamInterface<Arch> {};

TEST_P(ArchitectureTest, LogitsAgreeWithTheCpuRunner) {
  const ModelConfig config = GetParam().config();
  const std::string dir =
      models::WriteTinyModel(config, 11, "bf16", std::string("cuda_arch_") + GetParam().name);
  std::unique_ptr<engine::ModelRunner> cpu = Cpu(dir);
  std::unique_ptr<CudaModelRunner> cuda = Cuda(dir);
  ASSERT_TRUE(cpu && cuda);
  const int v = config.vocab_size;
  double worst_rel = 0, worst_nmse = 0;
  int rows = 0;
  // Compares row by row; `what` names the step in failures.
  auto compare = [&](const std::vector<float>& got, const std::vector<float>& want,
                     const std::string& what) {
    ASSERT_EQ(got.size(), want.size()) << what;
    for (size_t r = 0; r * v < want.size(); ++r) {
      const std::span<const float> g(got.data() + r * v, v), w(want.data() + r * v, v);
      const double rel = RelativeError(g, w);
      const double nmse = testing::Nmse({g.begin(), g.end()}, {w.begin(), w.end()});
      worst_rel = std::max(worst_rel, rel);
      worst_nmse = std::max(worst_nmse, nmse);
      EXPECT_LE(rel, kMaxRelativeError) << what << " row " << r;
      EXPECT_LE(nmse, kMaxNmse) << what << " row " << r;
      // The same top-1 token unless the CPU's own margin is within the bound.
      if (Margin(w) > 2 * kMaxRelativeError) {
        EXPECT_EQ(Argmax(g), Argmax(w)) << what << " row " << r;
      }
      ++rows;
    }
  };

  // Two prompts (13 and 6 tokens) in one step; the second's blocks come
  // from the far end of the cache.
  const std::vector<int32_t> a = Tokens(13, v, 1), b = Tokens(6, v, 2);
  const std::vector<int32_t> ta = Iota(8, 0), tb = {63, 40, 41, 42, 43, 44, 45, 46};
  auto prompts = [&] {
    StepBatch batch;
    batch.seqs = {{.tokens = a, .block_table = ta, .sampling = &kGreedy},
                  {.tokens = b, .block_table = tb, .sampling = &kGreedy}};
    return batch;
  };
  const std::vector<float> want_prompt = Logits(*cpu, prompts());
  compare(Logits(*cuda, prompts()), want_prompt, "prompts");

  // Decode both sequences for 8 steps (as a graph-replayed batch of two),
  // feeding the CPU's greedy tokens to both (teacher forcing), so a window
  // of 5 and the context buckets are crossed.
  std::vector<float> want = want_prompt;
  int32_t next_a = Argmax({want.data(), static_cast<size_t>(v)});
  int32_t next_b = Argmax({want.data() + v, static_cast<size_t>(v)});
  for (int step = 0; step < 8; ++step) {
    auto decode = [&] {
      StepBatch batch;
      batch.seqs = {{.tokens = {&next_a, 1},
                     .num_cached = 13 + step,
                     .block_table = ta,
                     .sampling = &kGreedy},
                    {.tokens = {&next_b, 1},
                     .num_cached = 6 + step,
                     .block_table = tb,
                     .sampling = &kGreedy}};
      return batch;
    };
    want = Logits(*cpu, decode());
    compare(Logits(*cuda, decode()), want, "decode step " + std::to_string(step));
    next_a = Argmax({want.data(), static_cast<size_t>(v)});
    next_b = Argmax({want.data() + v, static_cast<size_t>(v)});
  }

  // A chunk of 5 prompt tokens after the 6 of `b` already cached, next to a
  // single decode token of `a` (a mixed step) and alone.
  const std::vector<int32_t> chunk = Tokens(5, v, 3);
  const std::vector<int32_t> tc = {50, 51, 52};
  auto mixed = [&] {
    StepBatch batch;
    batch.seqs = {
        {.tokens = b, .block_table = tc},
        {.tokens = {&next_a, 1}, .num_cached = 21, .block_table = ta, .sampling = &kGreedy}};
    return batch;
  };
  ASSERT_TRUE(cpu->Step(mixed()).ok());
  ASSERT_TRUE(cuda->Step(mixed()).ok());
  auto after_cache = [&] {
    StepBatch batch;
    batch.seqs = {{.tokens = chunk, .num_cached = 6, .block_table = tc, .sampling = &kGreedy}};
    return batch;
  };
  compare(Logits(*cuda, after_cache()), Logits(*cpu, after_cache()), "chunk after cache");

  EXPECT_GT(cuda->stats().graph_steps, 0);
  RecordProperty("worst_relative_error", std::to_string(worst_rel));
  RecordProperty("worst_nmse", std::to_string(worst_nmse));
  std::printf("%s: %d rows, worst relative error %.3g, worst NMSE %.3g\n", GetParam().name, rows,
              worst_rel, worst_nmse);
}

INSTANTIATE_TEST_SUITE_P(
    Architectures, ArchitectureTest,
    ::testing::Values(Arch{"llama_gqa", &models::TinyGqaConfig},
                      Arch{"mha_tied", &models::TinyTiedConfig},
                      Arch{"llama3_rope", &models::TinyLlama3RopeConfig},
                      Arch{"attention_bias", &models::TinyLlamaAttentionBiasConfig},
                      Arch{"mistral_window", &models::TinyMistralWindowConfig},
                      Arch{"qwen2", &models::TinyQwen2Config},
                      Arch{"qwen3", &models::TinyQwen3Config}),
    [](const ::testing::TestParamInfo<Arch>& info) { return std::string(info.param.name); });

// ---- decode graphs ----

TEST_F(CudaRunnerTest, GraphReplayedDecodeStepsEqualEagerOnes) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 3, "bf16", "cuda_graphs");
  std::unique_ptr<CudaModelRunner> graphs = Cuda(dir);
  CudaRunnerOptions no_graphs = Small();
  no_graphs.cuda_graphs = false;
  std::unique_ptr<CudaModelRunner> eager = Cuda(dir, no_graphs);
  ASSERT_TRUE(graphs && eager);
  const int v = config.vocab_size;
  for (int batch : {2, 3}) {  // 2: the graph's own size; 3: padded to 4
    SCOPED_TRACE(batch);
    std::vector<std::vector<int32_t>> prompts, tables;
    for (int s = 0; s < batch; ++s) {
      prompts.push_back(Tokens(7 + s, v, 10 + s));
      tables.push_back(Iota(4, 4 * s));
    }
    auto step = [&](int decode_step, const std::vector<int32_t>& next) {
      StepBatch b;
      for (int s = 0; s < batch; ++s) {
        if (decode_step < 0) {
          b.seqs.push_back({.tokens = prompts[s], .block_table = tables[s], .sampling = &kGreedy});
        } else {
          b.seqs.push_back({.tokens = {&next[s], 1},
                            .num_cached = static_cast<int>(prompts[s].size()) + decode_step,
                            .block_table = tables[s],
                            .sampling = &kGreedy});
        }
      }
      return b;
    };
    std::vector<int32_t> next(batch, 0);
    ASSERT_TRUE(graphs->Step(step(-1, next)).ok());
    ASSERT_TRUE(eager->Step(step(-1, next)).ok());
    for (int d = 0; d < 4; ++d) {
      for (int s = 0; s < batch; ++s) next[s] = (d * 13 + s * 5 + 1) % v;
      const std::vector<float> replayed = Logits(*graphs, step(d, next));
      const std::vector<float> direct = Logits(*eager, step(d, next));
      ASSERT_EQ(replayed.size(), direct.size());
      if (batch == 2) {
        EXPECT_EQ(replayed, direct) << "same kernels, same shapes: bit for bit";
      } else {
        EXPECT_LT(RelativeError(replayed, direct), 1e-2) << "padded rows change GEMM shapes only";
        for (int s = 0; s < batch; ++s) {
          EXPECT_EQ(Argmax({replayed.data() + s * v, static_cast<size_t>(v)}),
                    Argmax({direct.data() + s * v, static_cast<size_t>(v)}));
        }
      }
    }
  }
  const CudaModelRunner::Stats g = graphs->stats(), e = eager->stats();
  EXPECT_EQ(g.graph_steps, 8);
  EXPECT_EQ(g.graph_captures, 2);  // batch buckets 2 and 4, one context bucket
  EXPECT_EQ(g.graph_capture_failures, 0) << g.last_graph_failure;
  EXPECT_EQ(e.graph_steps, 0);
  EXPECT_EQ(e.eager_decode_steps, 8);
}

TEST_F(CudaRunnerTest, DecodeCrossingAContextBucketCapturesTheNextGraphOrFallsBack) {
  ModelConfig config = models::TinyGqaConfig();
  config.max_position_embeddings = 600;
  const std::string dir = models::WriteTinyModel(config, 4, "bf16", "cuda_graph_buckets");
  CudaRunnerOptions options = Small();
  options.num_kv_blocks = 80;
  CudaRunnerOptions small_graphs = options;
  small_graphs.max_graph_context = 256;  // contexts beyond it run eagerly
  CudaRunnerOptions no_graphs = options;
  no_graphs.cuda_graphs = false;
  std::unique_ptr<CudaModelRunner> graphs = Cuda(dir, options), fallback = Cuda(dir, small_graphs),
                                   eager = Cuda(dir, no_graphs);
  ASSERT_TRUE(graphs && fallback && eager);
  const std::vector<int32_t> prompt = Tokens(254, config.vocab_size, 9), table = Iota(65, 0);
  for (CudaModelRunner* r : {graphs.get(), fallback.get(), eager.get()}) {
    ASSERT_TRUE(r->Step({.seqs = {{.tokens = prompt, .block_table = table}}}).ok());
  }
  // Contexts 255 .. 258: the 256-token bucket, then the 512-token one.
  for (int step = 0; step < 4; ++step) {
    const int32_t token = (step * 29 + 3) % config.vocab_size;
    auto batch = [&] {
      StepBatch b;
      b.seqs.push_back({.tokens = {&token, 1},
                        .num_cached = 254 + step,
                        .block_table = table,
                        .sampling = &kGreedy});
      return b;
    };
    const std::vector<float> want = Logits(*eager, batch());
    EXPECT_EQ(Logits(*graphs, batch()), want) << "step " << step;
    EXPECT_EQ(Logits(*fallback, batch()), want) << "step " << step;
  }
  EXPECT_EQ(graphs->stats().graph_captures, 2);
  EXPECT_EQ(graphs->stats().graph_steps, 4);
  EXPECT_EQ(fallback->stats().graph_captures, 1);
  EXPECT_EQ(fallback->stats().graph_steps, 2);
  EXPECT_EQ(fallback->stats().eager_decode_steps, 2);
}

// ---- structured output ----

// A JSON Schema request (structured output) on the CUDA runner, whose
// sampler applies the constraint's bit mask on the device, and on the CPU
// runner: both replies parse, validate and end where the grammar lets them.
// Greedy, the CUDA tokens follow the CPU's until a step where the CPU ranks
// the CUDA choice within the bf16 bound of its own best allowed token (the
// only place the backends may rightly differ); a CUDA token the mask
// forbids would be -inf there.
TEST_F(CudaRunnerTest, ConstrainedGenerationValidatesAndFollowsTheCpuWhereNumericsAllow) {
  const ModelConfig config = models::TinyDemoConfig();
  const std::string dir = models::WriteTinyModel(config, 7, "f32", "cuda_constrained");
  ASSERT_TRUE(engine::WriteDemoTokenizer(config.vocab_size, dir).ok());
  auto grammars = engine::grammar::CreateGrammarCompiler(dir, config);
  ASSERT_TRUE(grammars.ok()) << grammars.status();
  const nlohmann::ordered_json schema = pdserve::testing::LongSchema(/*min_tags=*/3);
  const std::string spec = pdserve::testing::SpecOf(schema);
  std::unique_ptr<CudaModelRunner> cuda = Cuda(dir);
  std::unique_ptr<engine::ModelRunner> cpu = Cpu(dir);
  ASSERT_NE(cuda, nullptr);
  ASSERT_NE(cpu, nullptr);
  const std::vector<int32_t> prompt = Tokens(12, 256, 6);
  for (float temperature : {0.0f, 0.8f}) {
    SCOPED_TRACE(temperature);
    const SamplingParams params{.temperature = temperature, .seed = 5, .max_tokens = 80};
    auto on_cuda = engine::GenerateLocally(*cuda, prompt,
                                           pdserve::testing::Constrained(params, **grammars, spec));
    auto on_cpu = engine::GenerateLocally(*cpu, prompt,
                                          pdserve::testing::Constrained(params, **grammars, spec));
    ASSERT_TRUE(on_cuda.ok()) << on_cuda.status();
    ASSERT_TRUE(on_cpu.ok()) << on_cpu.status();
    for (const auto* out : {&*on_cuda, &*on_cpu}) {
      EXPECT_EQ(out->finish_reason, engine::FinishReason::kStop);
      EXPECT_EQ(pdserve::testing::ReplyViolation(
                    schema, pdserve::testing::TextOf((*grammars)->vocab(), out->tokens)),
                "");
    }
    if (temperature != 0.0f) continue;
    const std::vector<int32_t>& got = on_cuda->tokens;
    const std::vector<int32_t>& want = on_cpu->tokens;
    const size_t common =
        std::mismatch(got.begin(), got.end(), want.begin(), want.end()).first - got.begin();
    if (common == got.size() && common == want.size()) continue;  // token for token
    ASSERT_LT(common, std::min(got.size(), want.size()));
    // The CPU's logits, under the mask, at the first step that differs.
    const std::span<const int32_t> before(got.data(), common);
    std::vector<int32_t> tokens = prompt;
    tokens.insert(tokens.end(), before.begin(), before.end());
    StepBatch b;
    b.seqs.push_back({.tokens = tokens,
                      .block_table = Iota(static_cast<int>(tokens.size() + 3) / 4, 0),
                      .sampling = &kGreedy});
    std::vector<float> logits = Logits(*cpu, std::move(b));
    ASSERT_EQ(logits.size(), static_cast<size_t>(config.vocab_size));
    double scale = 1e-30;
    for (float x : logits) scale = std::max(scale, static_cast<double>(std::abs(x)));
    const SamplingParams constrained = pdserve::testing::Constrained(params, **grammars, spec);
    engine::ApplyLogitsProcessors(logits, constrained, {.prompt = prompt, .generated = before},
                                  config.eos_token_ids);
    EXPECT_EQ(Argmax(logits), want[common]);
    EXPECT_LE((logits[want[common]] - logits[got[common]]) / scale, 2 * kMaxRelativeError)
        << "step " << common << ": cuda " << got[common] << ", cpu " << want[common];
  }
}

// ---- weights ----

TEST_F(CudaRunnerTest, F32AndF16CheckpointsAreConvertedOnLoad) {
  const ModelConfig config = models::TinyQwen2Config();  // biases and tied embeddings too
  const std::string bf16 = models::WriteTinyModel(config, 5, "bf16", "cuda_dtype_bf16");
  const std::string f32 = models::WriteTinyModel(config, 5, "f32", "cuda_dtype_f32");
  const std::string f16 = models::WriteTinyModel(config, 5, "f16", "cuda_dtype_f16");
  const std::vector<int32_t> prompt = Tokens(9, config.vocab_size, 4), table = Iota(3, 0);
  auto logits = [&](const std::string& dir, size_t staging) {
    CudaRunnerOptions o = Small();
    o.weight_staging_bytes = staging;
    std::unique_ptr<CudaModelRunner> r = Cuda(dir, o);
    if (r == nullptr) return std::vector<float>{};
    EXPECT_EQ(r->DecodeWeightBytes() % 2, 0);
    StepBatch b;
    b.seqs.push_back({.tokens = prompt, .block_table = table, .sampling = &kGreedy});
    return Logits(*r, std::move(b));
  };
  const std::vector<float> want = logits(bf16, size_t{64} << 20);
  ASSERT_FALSE(want.empty());
  // f32 rounded to bf16 on the device is the bf16 checkpoint, exactly, and
  // so is anything staged 64 bytes at a time.
  EXPECT_EQ(logits(f32, size_t{64} << 20), want);
  EXPECT_EQ(logits(f32, 64), want);
  EXPECT_EQ(logits(bf16, 64), want);
  // f16 is another rounding of the same numbers.
  const std::vector<float> half = logits(f16, 64);
  ASSERT_EQ(half.size(), want.size());
  EXPECT_LT(RelativeError(half, want), kMaxRelativeError);
}

// ---- KV regions, layer events, KV in and out ----

TEST_F(CudaRunnerTest, AStreamWaitingOnALayerEventReadsThatLayerFromTheRegion) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 7, "f32", "cuda_regions");
  std::unique_ptr<CudaModelRunner> runner = Cuda(dir);
  ASSERT_TRUE(runner);
  const std::span<const engine::KvRegion> regions = runner->kv_regions();
  ASSERT_EQ(regions.size(), static_cast<size_t>(config.num_layers));
  for (const engine::KvRegion& r : regions) {
    EXPECT_EQ(r.memory, engine::MemoryKind::kDevice);
    EXPECT_EQ(r.dtype, engine::KvDtype::kBF16);
    EXPECT_EQ(r.block_stride_bytes, r.block_size * r.token_bytes());
    EXPECT_EQ(r.token_bytes(), config.kv_size() * 2);
  }
  // A prompt into fresh blocks (poisoned under the emulation): a reader
  // that did not wait would see NaN.
  const std::vector<int32_t> prompt = Tokens(10, config.vocab_size, 5), table = {9, 30, 17};
  absl::StatusOr<UniqueStream> reader = NewNonBlockingStream();
  ASSERT_TRUE(reader.ok());
  const int64_t tb = regions[0].token_bytes();
  std::vector<std::vector<std::byte>> read(config.num_layers, std::vector<std::byte>(2 * 10 * tb));
  {
    absl::StatusOr<std::unique_ptr<engine::StepHandle>> h =
        runner->Enqueue({.seqs = {{.tokens = prompt, .block_table = table, .sampling = &kGreedy}}});
    ASSERT_TRUE(h.ok()) << h.status();
    for (int l = 0; l < config.num_layers; ++l) {
      auto event = static_cast<cudaEvent_t>((*h)->LayerDeviceEvent(l));
      ASSERT_NE(event, nullptr);
      ASSERT_EQ(cudaStreamWaitEvent(reader->get(), event, 0), cudaSuccess);
      for (int t = 0; t < 10; ++t) {
        const int64_t at = table[t / 4] * regions[l].block_stride_bytes + (t % 4) * tb;
        ASSERT_EQ(cudaMemcpyAsync(read[l].data() + t * tb, regions[l].k_base + at, tb,
                                  cudaMemcpyDeviceToHost, reader->get()),
                  cudaSuccess);
        ASSERT_EQ(cudaMemcpyAsync(read[l].data() + (10 + t) * tb, regions[l].v_base + at, tb,
                                  cudaMemcpyDeviceToHost, reader->get()),
                  cudaSuccess);
      }
    }
    ASSERT_TRUE((*h)->Wait().ok());
    EXPECT_EQ((*h)->LayerDeviceEvent(config.num_layers), nullptr);
  }
  ASSERT_EQ(cudaStreamSynchronize(reader->get()), cudaSuccess);
  for (int l = 0; l < config.num_layers; ++l) {
    std::vector<std::byte> kv(runner->LayerKvBytes(10));
    ASSERT_TRUE(runner->ReadLayerKv(l, table, 10, kv).ok());
    EXPECT_EQ(read[l], kv) << "layer " << l;
  }
}

#if defined(PDSERVE_GPU_EMULATION)
// Under the emulation, the slots of a step's blocks that no step has written
// are poisoned, also where a block held another sequence's K/V: a kernel
// reading past a sequence's context reads NaN, not the old values.
TEST_F(CudaRunnerTest, UnwrittenSlotsOfReusedBlocksArePoisonedUnderTheEmulation) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 7, "bf16", "cuda_reuse_poison");
  std::unique_ptr<CudaModelRunner> runner = Cuda(dir);  // blocks of 4 tokens
  ASSERT_TRUE(runner);
  const std::vector<int32_t> a = Tokens(10, config.vocab_size, 3),
                             b = Tokens(3, config.vocab_size, 4);
  const std::vector<int32_t> a_table = {5, 6, 7}, b_table = {6, 5};
  ASSERT_TRUE(runner->Step({.seqs = {{.tokens = a, .block_table = a_table}}}).ok());
  const size_t token_bytes = config.kv_size() * 2;
  auto poisoned = [&](const std::vector<std::byte>& kv, int tokens, int t) {
    for (int half = 0; half < 2; ++half) {  // K, then V
      const std::byte* p = kv.data() + (half * tokens + t) * token_bytes;
      for (size_t i = 0; i < token_bytes; ++i) {
        if (p[i] != std::byte{0xff}) return false;
      }
    }
    return true;
  };
  // Block 6 held a's tokens 4..7; b writes 3 tokens into it.
  const uint64_t before = pdserve::gpuemu::ReusePoisonedBytes();
  ASSERT_TRUE(runner->Step({.seqs = {{.tokens = b, .block_table = b_table}}}).ok());
  EXPECT_GT(pdserve::gpuemu::ReusePoisonedBytes(), before);
  for (int l = 0; l < config.num_layers; ++l) {
    std::vector<std::byte> kv(runner->LayerKvBytes(8));
    ASSERT_TRUE(runner->ReadLayerKv(l, b_table, 8, kv).ok());
    for (int t = 0; t < 8; ++t)
      EXPECT_EQ(poisoned(kv, 8, t), t >= 3) << "layer " << l << " token " << t;
  }
}
#endif

TEST_F(CudaRunnerTest, LayersWrittenFromHostBytesDecodeAsComputedOnes) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 8, "bf16", "cuda_kv_io");
  // Staging of 8 tokens (two blocks): a 23-token layer moves in three pieces.
  CudaRunnerOptions o = Small();
  o.kv_staging_bytes = size_t{8} * 2 * config.kv_size() * 2;
  std::unique_ptr<CudaModelRunner> prefill = Cuda(dir, o);
  std::unique_ptr<CudaModelRunner> decode = Cuda(dir, o);
  ASSERT_TRUE(prefill && decode);
  const std::vector<int32_t> prompt = Tokens(23, config.vocab_size, 6);
  const std::vector<int32_t> src = Iota(6, 0), dst = {40, 2, 33, 7, 12, 60};
  ASSERT_TRUE(prefill->Step({.seqs = {{.tokens = prompt, .block_table = src}}}).ok());
  for (int l = 0; l < config.num_layers; ++l) {
    std::vector<std::byte> kv(prefill->LayerKvBytes(23));
    ASSERT_TRUE(prefill->ReadLayerKv(l, src, 23, kv).ok());
    ASSERT_TRUE(decode->WriteLayerKv(l, dst, 23, kv).ok());
    std::vector<std::byte> back(kv.size());
    ASSERT_TRUE(decode->ReadLayerKv(l, dst, 23, back).ok());
    EXPECT_EQ(back, kv);
  }
  const int32_t next = 5;
  auto step = [&](const std::vector<int32_t>& table) {
    StepBatch b;
    b.seqs.push_back(
        {.tokens = {&next, 1}, .num_cached = 23, .block_table = table, .sampling = &kGreedy});
    return b;
  };
  EXPECT_EQ(Logits(*decode, step(dst)), Logits(*prefill, step(src)));
  std::vector<std::byte> wrong(prefill->LayerKvBytes(23) + 1);
  EXPECT_EQ(decode->WriteLayerKv(0, dst, 23, wrong).code(), absl::StatusCode::kInvalidArgument);
}

// ---- failures ----

TEST_F(CudaRunnerTest, AKvCacheBeyondDeviceMemoryIsResourceExhausted) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 9, "bf16", "cuda_oom");
  auto source = engine::WeightSource::Open(config, dir);
  ASSERT_TRUE(source.ok());
  // 2^27 blocks of 16 tokens, 2 layers of K and V of 32 bf16 values per
  // token: 512 GiB, beyond any device.
  CudaRunnerOptions o;
  o.kv_block_size = 16;
  o.num_kv_blocks = (1 << 27) - 1;
  auto runner = CudaModelRunner::Create(**source, o);
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kResourceExhausted) << runner.status();
  EXPECT_NE(runner.status().message().find("KV cache"), std::string::npos) << runner.status();
}

// 4-bit weights are a CPU backend storage: the cuda backend refuses them by
// name rather than serving bf16 under an int4 label.
TEST_F(CudaRunnerTest, Int4WeightsAreRefusedWithAClearError) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 9, "bf16", "cuda_int4");
  auto runner = engine::CreateModelRunner({.model_dir = dir,
                                           .backend = "cuda",
                                           .kv_block_size = 4,
                                           .num_kv_blocks = 8,
                                           .weight_dtype = engine::WeightDtype::kInt4});
  ASSERT_FALSE(runner.ok());
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kUnimplemented) << runner.status();
  EXPECT_NE(runner.status().message().find("int4"), std::string::npos) << runner.status();
}

#if defined(PDSERVE_GPU_EMULATION)
// A kernel whose barrier only half the block reaches: under the emulation a
// sticky launch failure, as a fault is on a GPU (on a GPU this kernel is
// undefined behaviour, hence emulation only).
__global__ void BrokenBarrier() {
  if (threadIdx.x < 16) __syncthreads();
}

TEST_F(CudaRunnerTest, ADeviceFaultFailsTheStepNotTheProcess) {
  const ModelConfig config = models::TinyGqaConfig();
  const std::string dir = models::WriteTinyModel(config, 10, "bf16", "cuda_fault");
  std::unique_ptr<CudaModelRunner> runner = Cuda(dir);
  ASSERT_TRUE(runner);
  const std::vector<int32_t> prompt = Tokens(5, config.vocab_size, 7), table = Iota(2, 0);
  auto step = [&] {
    StepBatch b;
    b.seqs.push_back({.tokens = prompt, .block_table = table, .sampling = &kGreedy});
    return b;
  };
  ASSERT_TRUE(runner->Step(step()).ok());
  ASSERT_EQ(Launch(BrokenBarrier, {dim3(1), dim3(32), 0, nullptr}), cudaSuccess);
  ASSERT_NE(cudaDeviceSynchronize(), cudaSuccess);
  absl::StatusOr<StepOutput> failed = runner->Step(step());
  ASSERT_FALSE(failed.ok());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_NE(failed.status().message().find("emulation:"), std::string::npos)
      << "the emulation names the failing kernel and rule: " << failed.status();
  // Cleared (the emulation keeps allocations over a reset), the runner
  // serves again.
  ASSERT_EQ(cudaDeviceReset(), cudaSuccess);
  absl::StatusOr<StepOutput> again = runner->Step(step());
  EXPECT_TRUE(again.ok()) << again.status();
}
#endif

// ---- peaks ----

TEST_F(CudaRunnerTest, PeaksComeFromTheDevice) {
  absl::StatusOr<double> bandwidth = DeviceMemoryBandwidth(0);
  ASSERT_TRUE(bandwidth.ok()) << bandwidth.status();
  EXPECT_GT(*bandwidth, 1e11);  // any GPU of this decade
  absl::StatusOr<double> flops = MeasureBf16GemmFlops(0, absl::Milliseconds(20));
  ASSERT_TRUE(flops.ok()) << flops.status();
  EXPECT_GT(*flops, 0);
  absl::StatusOr<double> copy = MeasureCopyBandwidth(0, absl::Milliseconds(20), size_t{1} << 20);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_GT(*copy, 0);
  // Through the backend registry, as the workers ask.
  const engine::ResolvedPeak gauge = engine::ResolvePeak(
      engine::PeakKind::kMemoryBandwidth, 0, "peak_memory_bandwidth", {.backend = "cuda"});
  EXPECT_EQ(gauge.value, *bandwidth);
  EXPECT_NE(gauge.source.find("memory clock x bus width"), std::string::npos) << gauge.source;
  const engine::ResolvedPeak mfu =
      engine::ResolvePeak(engine::PeakKind::kFlops, 0, "peak_flops",
                          {.backend = "cuda", .budget = absl::Milliseconds(20)});
  EXPECT_GT(mfu.value, 0) << mfu.source;
}

}  // namespace
}  // namespace pdserve::cuda
