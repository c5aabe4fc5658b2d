// pdserve_cuda_check: the CUDA runner against the CPU runner on the GPU
// itself, at the widths of public checkpoints (bench/model_shapes.h:
// Llama-3.2-1B and Qwen3-0.6B by default, --layers of them) with random
// bf16 weights (bench/random_weights.h), the same weights on both sides.
//
// Per shape: two prompts in one step (--prompt_tokens and about half as
// many, the second's blocks at the far end of the cache), then
// --decode_steps greedy decode steps of both as one batch (graph-replayed),
// each fed the CPU runner's greedy token (teacher forcing). Every logits row
// is held to the bounds of tests/unit/cuda/cuda_runner_test.cc (relative to
// the row's largest CPU logit: max |cuda - cpu| <= 2e-2 and
// sum (cuda - cpu)^2 / sum cpu^2 <= 2e-4): bf16 activations are the only
// difference. The CUDA runner's greedy token must be the CPU's wherever the
// CPU's own top-1 margin exceeds twice the relative bound (closer margins
// are near-ties, counted and printed, not failed).
//
// Prints one line per shape and "PASS"/"FAIL"; exit 1 on any failure or
// error. Built with nvcc (pdserve_cuda_check; tests/gpu/run_kit.sh runs it on
// a GPU) and against the CPU emulation (pdserve_cuda_check_emulated, tiny
// shapes, ctest cuda_check_emulated_smoke).
//   pdserve_cuda_check [--shapes=llama-1b,qwen3-0.6b] [--layers=4]
//       [--prompt_tokens=40] [--decode_steps=16] [--threads=0]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "bench/model_shapes.h"
#include "bench/random_weights.h"
#include "common/base/cli.h"
#include "engine/cpu/cpu_model_runner.h"
#include "engine/cuda/base/cuda_compat.h"
#include "engine/cuda/cuda_model_runner.h"

ABSL_FLAG(std::string, shapes, "llama-1b,qwen3-0.6b", "Model shapes (bench/model_shapes.h)");
ABSL_FLAG(int, layers, 4, "Decoder layers of each shape (0: the shape's own)");
ABSL_FLAG(int, prompt_tokens, 40, "Tokens of the first prompt (the second has half + 3)");
ABSL_FLAG(int, decode_steps, 16, "Greedy decode steps after the prompts");
ABSL_FLAG(int, threads, 0, "CPU runner threads (0: all cores)");
ABSL_FLAG(double, max_relative_error, 2e-2, "Bound on max |cuda - cpu| / max |cpu| per row");
ABSL_FLAG(double, max_nmse, 2e-4, "Bound on sum (cuda - cpu)^2 / sum cpu^2 per row");

namespace pdserve::bench {
namespace {

using engine::ModelConfig;
using engine::StepBatch;

constexpr int kBlock = 16;

struct RowStats {
  int rows = 0, failed_rows = 0, tokens = 0, same_tokens = 0, near_ties = 0;
  double worst_rel = 0, worst_nmse = 0;
};

double MaxAbs(std::span<const float> v) {
  double m = 1e-30;
  for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  return m;
}

int Argmax(std::span<const float> v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

// Compares one logits row; `what` names it in failures.
void CompareRow(std::span<const float> cuda, std::span<const float> cpu, const std::string& what,
                RowStats& stats) {
  const double scale = MaxAbs(cpu);
  double diff = 0, err = 0, norm = 0;
  bool nan = false;
  for (size_t i = 0; i < cpu.size(); ++i) {
    if (std::isnan(cuda[i])) nan = true;
    const double d = static_cast<double>(cuda[i]) - cpu[i];
    diff = std::max(diff, std::abs(d));
    err += d * d;
    norm += static_cast<double>(cpu[i]) * cpu[i];
  }
  const double rel = nan ? INFINITY : diff / scale;
  const double nmse = nan ? INFINITY : err / std::max(norm, 1e-30);
  stats.worst_rel = std::max(stats.worst_rel, rel);
  stats.worst_nmse = std::max(stats.worst_nmse, nmse);
  ++stats.rows;
  const double max_rel = absl::GetFlag(FLAGS_max_relative_error);
  if (rel > max_rel || nmse > absl::GetFlag(FLAGS_max_nmse)) {
    ++stats.failed_rows;
    std::printf("  %s: relative error %.3g, NMSE %.3g over the bounds\n", what.c_str(), rel, nmse);
  }
  std::vector<float> top(cpu.begin(), cpu.end());
  std::partial_sort(top.begin(), top.begin() + 2, top.end(), std::greater<float>());
  ++stats.tokens;
  if (Argmax(cuda) == Argmax(cpu)) {
    ++stats.same_tokens;
  } else if ((top[0] - top[1]) / scale <= 2 * max_rel) {
    ++stats.near_ties;
  } else {
    std::printf("  %s: greedy token %d on CUDA, %d on the CPU (CPU margin %.3g)\n", what.c_str(),
                Argmax(cuda), Argmax(cpu), (top[0] - top[1]) / scale);
  }
}

absl::StatusOr<std::vector<float>> Logits(engine::ModelRunner& r, StepBatch batch) {
  batch.return_logits = true;
  absl::StatusOr<engine::StepOutput> out = r.Step(std::move(batch));
  if (!out.ok()) return out.status();
  return std::move(out->logits);
}

std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 7919 + salt * 104729 + 3) % vocab;
  return t;
}

std::vector<int32_t> Blocks(int n, int from) {
  std::vector<int32_t> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}

// One shape; false on a failure (printed).
bool CheckShape(const std::string& name) {
  absl::StatusOr<ModelConfig> config = ModelShape(name);
  if (!config.ok()) {
    std::printf("%s: %s\nFAIL\n", name.c_str(), config.status().ToString().c_str());
    return false;
  }
  if (absl::GetFlag(FLAGS_layers) > 0) config->num_layers = absl::GetFlag(FLAGS_layers);
  const int v = config->vocab_size;
  const int len_a = absl::GetFlag(FLAGS_prompt_tokens), len_b = len_a / 2 + 3;
  const int steps = absl::GetFlag(FLAGS_decode_steps);
  const int blocks_a = (len_a + steps + kBlock - 1) / kBlock;
  const int blocks_b = (len_b + steps + kBlock - 1) / kBlock;
  const int num_blocks = blocks_a + blocks_b + 8;

  absl::StatusOr<std::unique_ptr<engine::WeightSource>> weights = RandomBf16Weights(*config, 11);
  if (!weights.ok()) {
    std::printf("%s: %s\nFAIL\n", name.c_str(), weights.status().ToString().c_str());
    return false;
  }
  auto cpu =
      engine::CpuModelRunner::Create(**weights, {.kv_block_size = kBlock,
                                                 .num_kv_blocks = num_blocks,
                                                 .num_threads = absl::GetFlag(FLAGS_threads)});
  cuda::CudaRunnerOptions options;
  options.kv_block_size = kBlock;
  options.num_kv_blocks = num_blocks;
  auto gpu = cuda::CudaModelRunner::Create(**weights, options);
  if (!cpu.ok() || !gpu.ok()) {
    std::printf("%s: %s\nFAIL\n", name.c_str(),
                (!cpu.ok() ? cpu.status() : gpu.status()).ToString().c_str());
    return false;
  }

  const engine::SamplingParams greedy;
  const std::vector<int32_t> a = Tokens(len_a, v, 1), b = Tokens(len_b, v, 2);
  const std::vector<int32_t> ta = Blocks(blocks_a, 0), tb = Blocks(blocks_b, num_blocks - blocks_b);
  RowStats stats;
  // Runs `make()` on both runners and compares its rows; the CPU's logits.
  auto step = [&](const std::function<StepBatch()>& make,
                  const std::string& what) -> absl::StatusOr<std::vector<float>> {
    absl::StatusOr<std::vector<float>> want = Logits(**cpu, make());
    if (!want.ok()) return want.status();
    absl::StatusOr<std::vector<float>> got = Logits(**gpu, make());
    if (!got.ok()) return got.status();
    if (got->size() != want->size()) return absl::InternalError("logits of different sizes");
    for (size_t r = 0; r * v < want->size(); ++r) {
      CompareRow({got->data() + r * v, static_cast<size_t>(v)},
                 {want->data() + r * v, static_cast<size_t>(v)}, what + " row " + std::to_string(r),
                 stats);
    }
    return want;
  };

  absl::StatusOr<std::vector<float>> want = step(
      [&] {
        StepBatch batch;
        batch.seqs = {{.tokens = a, .block_table = ta, .sampling = &greedy},
                      {.tokens = b, .block_table = tb, .sampling = &greedy}};
        return batch;
      },
      "prompts");
  for (int s = 0; want.ok() && s < steps; ++s) {
    int32_t next_a = Argmax({want->data(), static_cast<size_t>(v)});
    int32_t next_b = Argmax({want->data() + v, static_cast<size_t>(v)});
    want = step(
        [&] {
          StepBatch batch;
          batch.seqs = {{.tokens = {&next_a, 1},
                         .num_cached = len_a + s,
                         .block_table = ta,
                         .sampling = &greedy},
                        {.tokens = {&next_b, 1},
                         .num_cached = len_b + s,
                         .block_table = tb,
                         .sampling = &greedy}};
          return batch;
        },
        "decode step " + std::to_string(s));
  }
  if (!want.ok()) {
    std::printf("%s: step failed: %s\nFAIL\n", name.c_str(), want.status().ToString().c_str());
    return false;
  }
  const bool pass = stats.failed_rows == 0 && stats.same_tokens + stats.near_ties == stats.tokens &&
                    (*gpu)->stats().graph_steps > 0;
  std::printf(
      "%s (%d layers, vocab %d): %d logits rows, worst relative error %.3g (bound %.3g), worst "
      "NMSE %.3g (bound %.3g); greedy tokens %d/%d the CPU's, %d near-ties; %lld graph-replayed "
      "steps\n%s\n",
      name.c_str(), config->num_layers, v, stats.rows, stats.worst_rel,
      absl::GetFlag(FLAGS_max_relative_error), stats.worst_nmse, absl::GetFlag(FLAGS_max_nmse),
      stats.same_tokens, stats.tokens, stats.near_ties,
      static_cast<long long>((*gpu)->stats().graph_steps), pass ? "PASS" : "FAIL");
  std::fflush(stdout);
  return pass;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv,
                      "The CUDA runner's logits and greedy tokens against the CPU runner's on "
                      "random bf16 models of public shapes",
                      __FILE__);
  int devices = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&devices); e != cudaSuccess || devices == 0) {
    std::printf("no usable CUDA device (%s)\nFAIL\n", cudaGetErrorName(e));
    return 1;
  }
  bool ok = true;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_shapes), ',', absl::SkipEmpty())) {
    ok = pdserve::bench::CheckShape(std::string(name)) && ok;
  }
  return ok ? 0 : 1;
}
