// pdserve_cuda_bench: the CUDA runner (engine/cuda/cuda_model_runner.h) on
// Llama-3.2-1B- and Llama-3.1-8B-shaped models (bench/model_shapes.h) with
// random bf16 weights made in memory (bench/random_weights.h), against the
// device's measured peaks:
//   decode   step time of a batch of B sequences, each one token at a
//            context of N tokens (B x N tokens of KV read), for every B in
//            --batches and N in --contexts, with decode CUDA graphs on and
//            off (--graphs): bytes a step reads (weights as stored + KV, as
//            the decode worker counts them) per second, as a fraction of
//            the measured device-to-device copy bandwidth (bytes read +
//            written per second);
//   prefill  tokens/s of one prompt of T tokens for every T in
//            --prefill_tokens, and its FLOP/s (ModelConfig::PrefillFlops) as
//            MFU against a measured cuBLAS bf16 GEMM peak.
// The KV cache is zeroed, not computed: a decode step's time does not
// depend on the values it reads. Each figure is the median of --steps runs
// after --warmup (decode warm-up captures the step's CUDA graph).
// --results_tsv writes every figure as a tab-separated line:
//   peak    copy|gemm   B/s|FLOP/s
//   decode  SHAPE  on|off  BATCH  CONTEXT  STEP_MS  FRACTION_OF_COPY_BANDWIDTH
//   prefill SHAPE  TOKENS  MS  MFU
//
// Built with nvcc in CUDA builds (pdserve_cuda_bench; tests/gpu/run_kit.sh
// runs it on a GPU) and against the CPU emulation (pdserve_cuda_bench_emulated),
// where ctest runs it on --shapes=tiny so it keeps building and running;
// emulated figures are CPU timings and mean nothing for a GPU.
//   pdserve_cuda_bench [--shapes=llama-1b,llama-8b] [--batches=1,8,32,64]
//       [--contexts=512,4096] [--prefill_tokens=512,2048,8192] [--graphs=on,off]
//       [--results_tsv=FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_common.h"
#include "bench/model_shapes.h"
#include "bench/random_weights.h"
#include "common/base/cli.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/cuda_model_runner.h"
#include "engine/cuda/cuda_peaks.h"
#include "engine/model/config.h"
#include "engine/model/weight_source.h"

ABSL_FLAG(std::string, shapes, "llama-1b,llama-8b",
          "Model shapes (bench/model_shapes.h): llama-1b, llama-8b, qwen3-0.6b, tiny");
ABSL_FLAG(std::string, batches, "1,8,32,64", "Decode batch sizes");
ABSL_FLAG(std::string, contexts, "512,4096", "Decode contexts (tokens per sequence)");
ABSL_FLAG(std::string, prefill_tokens, "512,2048,8192", "Prefill prompt lengths");
ABSL_FLAG(std::string, graphs, "on,off",
          "Decode CUDA graphs: on, off or on,off (a runner each; prefill runs on the last)");
ABSL_FLAG(std::string, results_tsv, "",
          "Write every figure to this file, one tab-separated line each");
ABSL_FLAG(int, steps, 20, "Measured runs per figure (median reported)");
ABSL_FLAG(int, warmup, 3, "Unmeasured runs first");
ABSL_FLAG(int, peak_budget_ms, 300, "Time per peak measurement");
ABSL_FLAG(int64_t, copy_bytes, int64_t{512} << 20, "Bytes per copy of the bandwidth peak");

namespace pdserve::bench {
namespace {

using engine::ModelConfig;

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

// --results_tsv: one line per figure, flushed at once (a run cut short keeps
// what it measured).
class Results {
 public:
  explicit Results(const std::string& path)
      : file_(path.empty() ? nullptr : std::fopen(path.c_str(), "w")) {}
  ~Results() {
    if (file_ != nullptr) std::fclose(file_);
  }
  bool failed_to_open(const std::string& path) const { return !path.empty() && file_ == nullptr; }
  void Line(const std::string& line) {
    if (file_ == nullptr) return;
    std::fprintf(file_, "%s\n", line.c_str());
    std::fflush(file_);
  }

 private:
  FILE* file_;
};

struct Plan {
  std::vector<int> batches, contexts, prompts;
  double copy_bandwidth = 0, gemm_peak = 0;
};

constexpr int kBlock = 16;

// The decode table of one runner (graphs on or off).
void Decode(const std::string& name, const ModelConfig& config, cuda::CudaModelRunner& r,
            bool graphs, const Plan& plan, Results& results) {
  std::printf("decode, CUDA graphs %s:\n\n", graphs ? "on" : "off");
  std::printf("| batch | context | step ms | tokens/s | GB/s read | of copy bandwidth |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: | ---: |\n");
  const engine::SamplingParams greedy;
  for (int n : plan.contexts) {
    for (int b : plan.batches) {
      const int blocks = (n + kBlock - 1) / kBlock;
      std::vector<std::vector<int32_t>> tables(b);
      std::vector<int32_t> tokens(b);
      engine::StepBatch batch;
      for (int s = 0; s < b; ++s) {
        tables[s].resize(blocks);
        for (int i = 0; i < blocks; ++i) tables[s][i] = s * blocks + i;
        tokens[s] = (s * 7919 + 13) % config.vocab_size;
        batch.seqs.push_back({.tokens = {&tokens[s], 1},
                              .num_cached = n - 1,
                              .block_table = tables[s],
                              .sampling = &greedy});
      }
      const double seconds = TimeSteps(r, batch);
      const double bytes = static_cast<double>(r.DecodeWeightBytes()) +
                           double{1.0} * b * n * config.KvBytesPerToken(2);
      const double fraction = seconds > 0 ? bytes / seconds / plan.copy_bandwidth : 0;
      std::printf("| %d | %d | %.3f | %.0f | %.1f | %.2f |\n", b, n, seconds * 1e3,
                  seconds > 0 ? b / seconds : 0, seconds > 0 ? bytes / seconds / 1e9 : 0, fraction);
      std::fflush(stdout);
      results.Line(absl::StrFormat("decode\t%s\t%s\t%d\t%d\t%.4f\t%.4f", name,
                                   graphs ? "on" : "off", b, n, seconds * 1e3, fraction));
    }
  }
  const cuda::CudaModelRunner::Stats stats = r.stats();
  std::printf("\n(decode graphs: %lld captured, %lld steps replayed, %lld eager)\n\n",
              static_cast<long long>(stats.graph_captures),
              static_cast<long long>(stats.graph_steps),
              static_cast<long long>(stats.eager_decode_steps));
}

void Prefill(const std::string& name, const ModelConfig& config, cuda::CudaModelRunner& r,
             const Plan& plan, Results& results) {
  std::printf("| prompt tokens | ms | tokens/s | TFLOP/s | MFU |\n");
  std::printf("| ---: | ---: | ---: | ---: | ---: |\n");
  const engine::SamplingParams greedy;
  for (int t : plan.prompts) {
    std::vector<int32_t> prompt(t), table((t + kBlock - 1) / kBlock);
    for (int i = 0; i < t; ++i) prompt[i] = (i * 31 + 7) % config.vocab_size;
    for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
    engine::StepBatch batch;
    batch.seqs.push_back({.tokens = prompt, .block_table = table, .sampling = &greedy});
    const double seconds = TimeSteps(r, batch);
    const double flops = config.PrefillFlops(t);
    const double mfu = seconds > 0 ? flops / seconds / plan.gemm_peak : 0;
    std::printf("| %d | %.2f | %.0f | %.1f | %.2f |\n", t, seconds * 1e3,
                seconds > 0 ? t / seconds : 0, seconds > 0 ? flops / seconds / 1e12 : 0, mfu);
    std::fflush(stdout);
    results.Line(absl::StrFormat("prefill\t%s\t%d\t%.4f\t%.4f", name, t, seconds * 1e3, mfu));
  }
  std::printf("\n");
}

// Every table of one shape; 0 or the exit status.
int RunShape(const std::string& name, const std::vector<bool>& graph_modes, const Plan& plan,
             Results& results) {
  absl::StatusOr<ModelConfig> config = ModelShape(name);
  if (!config.ok()) {
    std::fprintf(stderr, "%s\n", config.status().ToString().c_str());
    return 2;
  }
  const auto made = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<engine::WeightSource>> source = RandomBf16Weights(*config, 1);
  if (!source.ok()) {
    std::fprintf(stderr, "%s\n", source.status().ToString().c_str());
    return 1;
  }
  const double make_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - made).count();
  int max_tokens = 0;
  for (int b : plan.batches) {
    for (int n : plan.contexts)
      max_tokens = std::max(max_tokens, b * ((n + kBlock - 1) / kBlock * kBlock));
  }
  for (int t : plan.prompts) max_tokens = std::max(max_tokens, t);
  // Prefill on the last runner: a long prompt that runs out a caller's time
  // budget then costs no decode figure.
  for (size_t mode = 0; mode < graph_modes.size(); ++mode) {
    const bool graphs = graph_modes[mode], first = mode == 0;
    cuda::CudaRunnerOptions options;
    options.kv_block_size = kBlock;
    options.num_kv_blocks = max_tokens / kBlock + 1;
    options.cuda_graphs = graphs;
    for (int b : plan.batches) options.max_graph_batch = std::max(options.max_graph_batch, b);
    if (!plan.contexts.empty()) {
      options.max_graph_context = *std::max_element(plan.contexts.begin(), plan.contexts.end());
    }
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
    if (first) {
      std::printf(
          "## %s: %lld parameters, %.3g GB of bf16 weights read per decode step (random weights "
          "made in %.1f s)\n\n",
          name.c_str(), static_cast<long long>(config->ParameterCount()),
          r.DecodeWeightBytes() / 1e9, make_s);
    }
    if (!plan.batches.empty() && !plan.contexts.empty()) {
      Decode(name, *config, r, graphs, plan, results);
    }
    if (mode + 1 == graph_modes.size()) Prefill(name, *config, r, plan, results);
  }
  return 0;
}

int Main() {
  Plan plan;
  plan.batches = Ints(absl::GetFlag(FLAGS_batches));
  plan.contexts = Ints(absl::GetFlag(FLAGS_contexts));
  plan.prompts = Ints(absl::GetFlag(FLAGS_prefill_tokens));
  std::vector<bool> graph_modes;
  for (absl::string_view mode :
       absl::StrSplit(absl::GetFlag(FLAGS_graphs), ',', absl::SkipEmpty())) {
    if (mode != "on" && mode != "off") {
      std::fprintf(stderr, "--graphs: \"%s\" is neither on nor off\n", std::string(mode).c_str());
      return 2;
    }
    graph_modes.push_back(mode == "on");
  }
  if (graph_modes.empty()) graph_modes.push_back(true);
  Results results(absl::GetFlag(FLAGS_results_tsv));
  if (results.failed_to_open(absl::GetFlag(FLAGS_results_tsv))) {
    std::fprintf(stderr, "cannot open --results_tsv=%s\n",
                 absl::GetFlag(FLAGS_results_tsv).c_str());
    return 2;
  }
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
  plan.copy_bandwidth = *copy;
  plan.gemm_peak = *gemm;
#if defined(PDSERVE_GPU_EMULATION)
  std::printf("EMULATION: every figure below is a CPU emulation timing, not a GPU's.\n");
#endif
  std::printf("device: %s\n", prop.name);
  std::printf(
      "memory bandwidth: %.4g B/s from the device (2 x clock x bus), %.4g B/s measured "
      "(device-to-device copy, read + write)\n",
      datasheet.ok() ? *datasheet : 0.0, *copy);
  std::printf("bf16 GEMM peak: %.4g FLOP/s measured (cuBLAS, fp32 accumulation)\n\n", *gemm);
  std::fflush(stdout);
  results.Line(absl::StrFormat("peak\tcopy\t%.6g", *copy));
  results.Line(absl::StrFormat("peak\tgemm\t%.6g", *gemm));

  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    if (int rc = RunShape(std::string(name), graph_modes, plan, results); rc != 0) return rc;
  }
  return g_step_failed ? 1 : 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv,
                      "CUDA runner benchmark: decode step time against measured copy bandwidth "
                      "(CUDA graphs on and off), prefill MFU against a measured bf16 GEMM peak",
                      __FILE__);
  return pdserve::bench::Main();
}
