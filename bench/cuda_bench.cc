// pdserve_cuda_bench: the CUDA runner (engine/cuda/cuda_model_runner.h) on
// Llama-3.2-1B- and Llama-3.1-8B-shaped models with random bf16 weights
// (written into --work_dir on first use), against the device's measured
// peaks:
//   decode   step time of a batch of B sequences, each one token at a
//            context of N tokens (B x N tokens of KV read), for every B in
//            --batches and N in --contexts: bytes a step reads (weights as
//            stored + KV, as the decode worker counts them) per second, as
//            a fraction of the measured device-to-device copy bandwidth
//            (bytes read + written per second);
//   prefill  tokens/s of one prompt of T tokens for every T in
//            --prefill_tokens, and its FLOP/s (ModelConfig::PrefillFlops) as
//            MFU against a measured cuBLAS bf16 GEMM peak.
// The KV cache is zeroed, not computed: a decode step's time does not
// depend on the values it reads. Each figure is the median of --steps runs
// after --warmup (decode warm-up captures the step's CUDA graph).
//
// Built with nvcc in CUDA builds (pdserve_cuda_bench, tests/gpu/run_on_gpu.sh
// runs it) and against the CPU emulation (pdserve_cuda_bench_emulated), where
// ctest runs it on --shapes=tiny so it keeps building and running; emulated
// figures are CPU timings and mean nothing for a GPU.
//   pdserve_cuda_bench [--shapes=llama-1b,llama-8b] [--work_dir=DIR]
//       [--batches=1,8,32,64] [--contexts=512,4096] [--prefill_tokens=512,2048,8192]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/cli.h"
#include "engine/cuda/cuda_compat.h"
#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/cuda_peaks.h"
#include "engine/model/config.h"
#include "engine/model/weight_source.h"
#include "tools/model_writer.h"

ABSL_FLAG(std::string, shapes, "llama-1b,llama-8b", "Model shapes: llama-1b, llama-8b, tiny");
ABSL_FLAG(std::string, work_dir, "/tmp/pdserve_cuda_bench",
          "Where the random models are written (reused when present)");
ABSL_FLAG(std::string, batches, "1,8,32,64", "Decode batch sizes");
ABSL_FLAG(std::string, contexts, "512,4096", "Decode contexts (tokens per sequence)");
ABSL_FLAG(std::string, prefill_tokens, "512,2048,8192", "Prefill prompt lengths");
ABSL_FLAG(int, steps, 20, "Measured runs per figure (median reported)");
ABSL_FLAG(int, warmup, 3, "Unmeasured runs first");
ABSL_FLAG(int, peak_budget_ms, 300, "Time per peak measurement");
ABSL_FLAG(int64_t, copy_bytes, int64_t{512} << 20, "Bytes per copy of the bandwidth peak");

namespace pdserve::bench {
namespace {

using engine::ModelConfig;

ModelConfig Llama3Shape(int hidden, int inter, int layers, int head_dim, bool tied,
                        float rope_factor) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 128256;
  c.hidden_size = hidden;
  c.intermediate_size = inter;
  c.num_layers = layers;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = head_dim;
  c.max_position_embeddings = 131072;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_scaling = {.type = engine::RopeScaling::Type::kLlama3,
                    .factor = rope_factor,
                    .low_freq_factor = 1.0f,
                    .high_freq_factor = 4.0f,
                    .original_max_position_embeddings = 8192};
  c.tie_word_embeddings = tied;
  c.bos_token_id = 128000;
  c.eos_token_ids = {128001};
  return c;
}

absl::StatusOr<ModelConfig> Shape(const std::string& name) {
  if (name == "llama-1b") return Llama3Shape(2048, 8192, 16, 64, true, 32.0f);
  if (name == "llama-8b") return Llama3Shape(4096, 14336, 32, 128, false, 8.0f);
  if (name == "tiny") {  // for the emulation
    ModelConfig c = Llama3Shape(64, 128, 2, 16, false, 8.0f);
    c.vocab_size = 256;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.max_position_embeddings = 512;
    c.bos_token_id = 1;
    c.eos_token_ids = {2};
    return c;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown shape ", name));
}

std::vector<int> Ints(const std::string& list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

bool g_step_failed = false;  // the exit status says so

// Median seconds of `steps` runs of `batch` after `warmup` ones; 0 if a step
// fails (reported).
double TimeSteps(engine::ModelRunner& runner, const engine::StepBatch& batch) {
  std::vector<double> seconds;
  for (int i = 0; i < absl::GetFlag(FLAGS_warmup) + absl::GetFlag(FLAGS_steps); ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<engine::StepOutput> out = runner.Step(batch);
    const auto end = std::chrono::steady_clock::now();
    if (!out.ok()) {
      std::fprintf(stderr, "step failed: %s\n", out.status().ToString().c_str());
      g_step_failed = true;
      return 0;
    }
    if (i >= absl::GetFlag(FLAGS_warmup)) {
      seconds.push_back(std::chrono::duration<double>(end - start).count());
    }
  }
  return Median(seconds);
}

int Main() {
  const std::vector<int> batches = Ints(absl::GetFlag(FLAGS_batches));
  const std::vector<int> contexts = Ints(absl::GetFlag(FLAGS_contexts));
  const std::vector<int> prompts = Ints(absl::GetFlag(FLAGS_prefill_tokens));
  const absl::Duration budget = absl::Milliseconds(absl::GetFlag(FLAGS_peak_budget_ms));

  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "no usable CUDA device\n");
    return 1;
  }
  absl::StatusOr<double> datasheet = cuda::DeviceMemoryBandwidth(0);
  absl::StatusOr<double> copy =
      cuda::MeasureCopyBandwidth(0, budget, static_cast<size_t>(absl::GetFlag(FLAGS_copy_bytes)));
  absl::StatusOr<double> gemm = cuda::MeasureBf16GemmFlops(0, budget);
  if (!copy.ok() || !gemm.ok()) {
    std::fprintf(stderr, "peak measurement failed: %s %s\n", copy.status().ToString().c_str(),
                 gemm.status().ToString().c_str());
    return 1;
  }
#if defined(PDSERVE_GPU_EMULATION)
  std::printf("EMULATION: every figure below is a CPU emulation timing, not a GPU's.\n");
#endif
  std::printf("device: %s\n", prop.name);
  std::printf(
      "memory bandwidth: %.4g B/s from the device (2 x clock x bus), %.4g B/s measured "
      "(device-to-device copy, read + write)\n",
      datasheet.ok() ? *datasheet : 0.0, *copy);
  std::printf("bf16 GEMM peak: %.4g FLOP/s measured (cuBLAS, fp32 accumulation)\n\n", *gemm);

  const std::vector<std::string> shapes =
      absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty());
  for (const std::string& name : shapes) {
    absl::StatusOr<ModelConfig> config = Shape(name);
    if (!config.ok()) {
      std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
      return 2;
    }
    const std::string dir = absl::GetFlag(FLAGS_work_dir) + "/" + name;
    if (!std::filesystem::exists(dir + "/config.json")) {
      std::printf("writing %s (random bf16 weights) to %s ...\n", name.c_str(), dir.c_str());
      std::fflush(stdout);
      if (absl::Status s = engine::WriteRandomModel(*config, 1, "bf16", dir); !s.ok()) {
        std::fprintf(stderr, "%s\n", s.ToString().c_str());
        return 1;
      }
    }
    absl::StatusOr<std::unique_ptr<engine::WeightSource>> source =
        engine::WeightSource::Open(*config, dir);
    if (!source.ok()) {
      std::fprintf(stderr, "%s\n", source.status().ToString().c_str());
      return 1;
    }
    constexpr int kBlock = 16;
    int max_tokens = 0;
    for (int b : batches) {
      for (int n : contexts)
        max_tokens = std::max(max_tokens, b * ((n + kBlock - 1) / kBlock * kBlock));
    }
    for (int t : prompts) max_tokens = std::max(max_tokens, t);
    cuda::CudaRunnerOptions options;
    options.kv_block_size = kBlock;
    options.num_kv_blocks = max_tokens / kBlock + 1;
    options.max_graph_batch = std::max(64, *std::max_element(batches.begin(), batches.end()));
    options.max_graph_context = *std::max_element(contexts.begin(), contexts.end());
    absl::StatusOr<std::unique_ptr<cuda::CudaModelRunner>> runner =
        cuda::CudaModelRunner::Create(**source, options);
    if (!runner.ok()) {
      std::fprintf(stderr, "%s: %s\n", name.c_str(), runner.status().ToString().c_str());
      return 1;
    }
    cuda::CudaModelRunner& r = **runner;
    for (const engine::KvRegion& region : r.kv_regions()) {  // zeros: valid bf16 K and V
      const size_t bytes = static_cast<size_t>(region.num_blocks) * region.block_stride_bytes;
      if (cudaMemset(region.k_base, 0, bytes) != cudaSuccess ||
          cudaMemset(region.v_base, 0, bytes) != cudaSuccess) {
        std::fprintf(stderr, "cannot clear the KV cache\n");
        return 1;
      }
    }

    std::printf("## %s: %lld parameters, %.3g GB of bf16 weights read per decode step\n\n",
                name.c_str(), static_cast<long long>(config->ParameterCount()),
                r.DecodeWeightBytes() / 1e9);
    std::printf("| batch | context | step ms | tokens/s | GB/s read | of copy bandwidth |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
    const engine::SamplingParams greedy;
    for (int n : contexts) {
      for (int b : batches) {
        const int blocks = (n + kBlock - 1) / kBlock;
        std::vector<std::vector<int32_t>> tables(b);
        std::vector<int32_t> tokens(b);
        engine::StepBatch batch;
        for (int s = 0; s < b; ++s) {
          tables[s].resize(blocks);
          for (int i = 0; i < blocks; ++i) tables[s][i] = s * blocks + i;
          tokens[s] = (s * 7919 + 13) % config->vocab_size;
          batch.seqs.push_back({.tokens = {&tokens[s], 1},
                                .num_cached = n - 1,
                                .block_table = tables[s],
                                .sampling = &greedy});
        }
        const double seconds = TimeSteps(r, batch);
        const double bytes = static_cast<double>(r.DecodeWeightBytes()) +
                             double{1.0} * b * n * config->KvBytesPerToken(2);
        std::printf("| %d | %d | %.3f | %.0f | %.1f | %.2f |\n", b, n, seconds * 1e3,
                    seconds > 0 ? b / seconds : 0, seconds > 0 ? bytes / seconds / 1e9 : 0,
                    seconds > 0 ? bytes / seconds / *copy : 0);
      }
    }
    const cuda::CudaModelRunner::Stats stats = r.stats();
    std::printf("\n(decode graphs: %lld captured, %lld steps replayed, %lld eager)\n\n",
                static_cast<long long>(stats.graph_captures),
                static_cast<long long>(stats.graph_steps),
                static_cast<long long>(stats.eager_decode_steps));

    std::printf("| prompt tokens | ms | tokens/s | TFLOP/s | MFU |\n");
    std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
    for (int t : prompts) {
      std::vector<int32_t> prompt(t), table((t + kBlock - 1) / kBlock);
      for (int i = 0; i < t; ++i) prompt[i] = (i * 31 + 7) % config->vocab_size;
      for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
      engine::StepBatch batch;
      batch.seqs.push_back({.tokens = prompt, .block_table = table, .sampling = &greedy});
      const double seconds = TimeSteps(r, batch);
      const double flops = config->PrefillFlops(t);
      std::printf("| %d | %.2f | %.0f | %.1f | %.2f |\n", t, seconds * 1e3,
                  seconds > 0 ? t / seconds : 0, seconds > 0 ? flops / seconds / 1e12 : 0,
                  seconds > 0 ? flops / seconds / *gemm : 0);
    }
    std::printf("\n");
  }
  return g_step_failed ? 1 : 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv,
                      "CUDA runner benchmark: decode step time against measured copy bandwidth, "
                      "prefill MFU against a measured bf16 GEMM peak",
                      __FILE__);
  return pdserve::bench::Main();
}
