// pdserve_engine_bench: CPU engine throughput on a ~110M-parameter
// Llama-shaped model (hidden 768, 12 layers, 12 heads, intermediate 2048,
// vocab 32000; by default 12 KV heads and tied embeddings, else as
// --num_kv_heads and --tie_word_embeddings say; written with random weights
// unless --model_dir is given), next to the machine's measured memory
// bandwidth.
//
// Reports, each after warm-up and as the median of several runs:
//   prefill   tokens/s for one --prompt_len-token prompt (and GFLOP/s, from
//             ModelConfig::PrefillFlops)
//   decode    tokens/s at batch 1 and at --batch, each sequence holding
//             --context tokens of KV, one token per sequence per step
//   bandwidth STREAM-style copy and triad over arrays far larger than cache
//             (best of 5, as STREAM reports), with --threads OpenMP threads
//   roofline  batch-1 decode bytes/s (weights read once per step, as stored
//             per --weight_dtype; + KV read) as a fraction of the triad
//             bandwidth
// --decode_only skips prefill and the batch figure (and --context=1
// --decode_steps=255 --warmup=0 times positions 1..255, as llama2.c's run.c
// reports). It prints a table and, last, one line of JSON (also to
// --json_out).
//   pdserve_engine_bench [--threads=N] [--model_dir=DIR] [--json_out=FILE]
//       [--dtype=bf16|f16|f32] [--weight_dtype=auto|f32|bf16|int8|w8a8|int4]
//       [--num_kv_heads=N] [--tie_word_embeddings=false] [--decode_only]
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/cli.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/model/config.h"
#include "engine/runner_factory.h"
#include "engine/runtime/model_runner.h"
#include "engine/types/weight_dtype.h"
#include "nlohmann/json.hpp"
#include "tools/model_writer.h"

ABSL_FLAG(std::string, model_dir, "",
          "Model to benchmark; empty: write the ~110M Llama-shaped model to a temp dir");
ABSL_FLAG(std::string, dtype, "bf16", "Checkpoint dtype of the written model (f32, bf16, f16)");
ABSL_FLAG(pdserve::engine::WeightDtype, weight_dtype, pdserve::engine::WeightDtype::kAuto,
          "How weight matrices are kept in memory: auto (a bf16 checkpoint's in bf16, else "
          "fp32), f32, bf16, int8, w8a8 or int4");
ABSL_FLAG(int, num_kv_heads, 12, "KV heads of the written model (divides 12)");
ABSL_FLAG(bool, tie_word_embeddings, true, "Written model: LM head tied to the embeddings");
ABSL_FLAG(bool, decode_only, false, "Measure only batch-1 decode and the bandwidth");
ABSL_FLAG(int, threads, 0, "CPU threads for the runner and the bandwidth test; 0: all cores");
ABSL_FLAG(int, prompt_len, 512, "Prefill prompt length");
ABSL_FLAG(int, context, 128, "Tokens of KV each decoding sequence starts with");
ABSL_FLAG(int, batch, 16, "Decode batch size of the second decode figure");
ABSL_FLAG(int, runs, 5, "Measured prefill runs (median reported)");
ABSL_FLAG(int, decode_steps, 32, "Measured decode steps per batch size (median reported)");
ABSL_FLAG(int, warmup, 2, "Unmeasured prefill runs / decode steps first");
ABSL_FLAG(int64_t, stream_mib, 512, "MiB per bandwidth-test array (3 arrays)");
ABSL_FLAG(std::string, json_out, "", "Also write the JSON result to this file");

namespace pdserve::bench {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

engine::ModelConfig BenchConfig() {
  engine::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 32000;
  c.hidden_size = 768;
  c.intermediate_size = 2048;
  c.num_layers = 12;
  c.num_heads = 12;
  c.num_kv_heads = absl::GetFlag(FLAGS_num_kv_heads);
  c.head_dim = 64;
  c.max_position_embeddings = 2048;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  c.tie_word_embeddings = absl::GetFlag(FLAGS_tie_word_embeddings);
  c.bos_token_id = 1;
  c.eos_token_ids = {2};
  return c;
}

struct Bandwidth {
  double copy_gbs = 0;   // 16 bytes per element (read + write), as STREAM counts
  double triad_gbs = 0;  // 24 bytes per element
};

// STREAM copy (c = a) and triad (a = b + s c) on doubles, first touch by the
// same threads, best of 5 after one warm-up pass.
Bandwidth MeasureBandwidth(int64_t mib, int threads) {
  const int64_t n = mib * (int64_t{1} << 20) / 8;
  std::unique_ptr<double[]> a(new double[n]), b(new double[n]), c(new double[n]);
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    a[i] = 1.0;
    b[i] = 2.0;
    c[i] = 0.0;
  }
  Bandwidth best;
  const double scalar = 3.0;
  for (int rep = 0; rep < 6; ++rep) {
    auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) c[i] = a[i];
    auto t1 = Clock::now();
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int64_t i = 0; i < n; ++i) a[i] = b[i] + scalar * c[i];
    auto t2 = Clock::now();
    if (rep == 0) continue;  // warm-up
    best.copy_gbs = std::max(best.copy_gbs, 16.0 * n / Seconds(t0, t1) / 1e9);
    best.triad_gbs = std::max(best.triad_gbs, 24.0 * n / Seconds(t1, t2) / 1e9);
  }
  return best;
}

std::vector<int32_t> Tokens(int n, int vocab, int salt) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    t[i] = static_cast<int32_t>((int64_t{i} * 7919 + salt * 104729 + 3) % vocab);
  return t;
}

// Blocks [first, first + count) as a table.
std::vector<int32_t> Table(int first, int count) {
  std::vector<int32_t> t(static_cast<size_t>(count));
  for (int i = 0; i < count; ++i) t[i] = first + i;
  return t;
}

struct DecodeFigures {
  double step_s = 0;             // median step time
  double tokens_per_s = 0;       // batch / step_s
  double mean_tokens_per_s = 0;  // batch * steps / total time (as llama2.c reports)
  double mean_context = 0;       // mean tokens of KV read per sequence per step
};

// Prefills `batch` sequences of `context` tokens, then times decode steps.
absl::StatusOr<DecodeFigures> MeasureDecode(engine::ModelRunner& runner, int batch, int context,
                                            int warmup, int steps, int blocks_per_seq) {
  const int vocab = runner.config().vocab_size;
  std::vector<std::vector<int32_t>> prompts, tables;
  for (int b = 0; b < batch; ++b) {
    prompts.push_back(Tokens(context, vocab, b + 1));
    tables.push_back(Table(b * blocks_per_seq, blocks_per_seq));
  }
  std::vector<engine::PrefillSequence> prefill;
  for (int b = 0; b < batch; ++b) prefill.push_back({prompts[b], tables[b]});
  std::vector<float> logits;
  if (absl::Status s = PrefillForLogits(runner, prefill, nullptr, logits); !s.ok()) return s;

  std::vector<double> times;
  std::vector<engine::DecodeSequence> seqs(static_cast<size_t>(batch));
  for (int step = 0; step < warmup + steps; ++step) {
    for (int b = 0; b < batch; ++b) {
      seqs[b] = {static_cast<int32_t>((step * 31 + b) % vocab), context + step, tables[b]};
    }
    auto t0 = Clock::now();
    if (absl::Status s = DecodeForLogits(runner, seqs, logits); !s.ok()) return s;
    if (step >= warmup) times.push_back(Seconds(t0, Clock::now()));
  }
  DecodeFigures f;
  f.step_s = Median(times);
  f.tokens_per_s = batch / f.step_s;
  double total = 0;
  for (double t : times) total += t;
  f.mean_tokens_per_s = batch * static_cast<double>(times.size()) / total;
  f.mean_context = context + warmup + (steps - 1) / 2.0 + 1;
  return f;
}

// 1-minute load average: other work on the machine skews every figure.
double LoadAverage() {
  std::ifstream in("/proc/loadavg");
  double load = -1;
  in >> load;
  return load;
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon != std::string::npos) return line.substr(colon + 2);
    }
  }
  return "unknown";
}

int Main() {
  const int threads =
      absl::GetFlag(FLAGS_threads) > 0 ? absl::GetFlag(FLAGS_threads) : omp_get_num_procs();
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int context = absl::GetFlag(FLAGS_context);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int runs = std::max(1, absl::GetFlag(FLAGS_runs));
  const int steps = std::max(1, absl::GetFlag(FLAGS_decode_steps));
  const int warmup = std::max(0, absl::GetFlag(FLAGS_warmup));
  if (prompt_len < 1 || context < 1 || batch < 1) {
    std::cerr << "--prompt_len, --context and --batch must be >= 1\n";
    return 2;
  }

  const double load_before = LoadAverage();
  std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  std::string temp_dir;
  if (model_dir.empty()) {
    temp_dir = absl::StrCat(std::filesystem::temp_directory_path().string(),
                            "/pdserve_engine_bench_", getpid());
    model_dir = temp_dir;
    std::cerr << "writing the benchmark model to " << model_dir << " ...\n";
    engine::RandomModelOptions options;
    options.dtype = absl::GetFlag(FLAGS_dtype);
    if (absl::Status s = engine::WriteRandomModel(BenchConfig(), options, model_dir); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
  }
  auto config = engine::ModelConfig::FromModelDir(model_dir);
  if (!config.ok()) {
    std::cerr << config.status() << "\n";
    return 1;
  }
  const int block_size = 16;
  const int decode_tokens = context + warmup + steps + 1;
  const int blocks_per_seq = (std::max(prompt_len, decode_tokens) + block_size - 1) / block_size;
  engine::RunnerOptions ro;
  ro.model_dir = model_dir;
  ro.kv_block_size = block_size;
  ro.num_kv_blocks = blocks_per_seq * std::max(batch, 1);
  ro.num_threads = threads;
  ro.weight_dtype = absl::GetFlag(FLAGS_weight_dtype);
  std::cerr << "loading ...\n";
  auto runner_or = engine::CreateModelRunner(ro);
  if (!temp_dir.empty()) std::filesystem::remove_all(temp_dir);
  if (!runner_or.ok()) {
    std::cerr << runner_or.status() << "\n";
    return 1;
  }
  engine::ModelRunner& runner = **runner_or;
  const engine::ModelConfig& c = runner.config();
  if (prompt_len + 1 > c.max_position_embeddings || decode_tokens > c.max_position_embeddings) {
    std::cerr << "prompt or context longer than max_position_embeddings\n";
    return 2;
  }

  const bool decode_only = absl::GetFlag(FLAGS_decode_only);
  double prefill_tps = 0, prefill_gflops = 0;
  if (!decode_only) {
    std::cerr << "prefill ...\n";
    const std::vector<int32_t> prompt = Tokens(prompt_len, c.vocab_size, 0);
    const std::vector<int32_t> table = Table(0, blocks_per_seq);
    const engine::PrefillSequence seq{prompt, table};
    std::vector<float> logits;
    std::vector<double> prefill_times;
    for (int run = 0; run < warmup + runs; ++run) {
      auto t0 = Clock::now();
      if (absl::Status s = PrefillForLogits(runner, {&seq, 1}, nullptr, logits); !s.ok()) {
        std::cerr << s << "\n";
        return 1;
      }
      if (run >= warmup) prefill_times.push_back(Seconds(t0, Clock::now()));
    }
    const double prefill_s = Median(prefill_times);
    prefill_tps = prompt_len / prefill_s;
    prefill_gflops = c.PrefillFlops(prompt_len) / prefill_s / 1e9;
  }

  std::cerr << "decode ...\n";
  auto d1 = MeasureDecode(runner, 1, context, warmup, steps, blocks_per_seq);
  auto dn = decode_only ? absl::StatusOr<DecodeFigures>(DecodeFigures{})
                        : MeasureDecode(runner, batch, context, warmup, steps, blocks_per_seq);
  if (!d1.ok() || !dn.ok()) {
    std::cerr << (d1.ok() ? dn.status() : d1.status()) << "\n";
    return 1;
  }
  std::cerr << "bandwidth ...\n";
  const Bandwidth bw = MeasureBandwidth(absl::GetFlag(FLAGS_stream_mib), threads);

  // Bytes one batch-1 decode step must read: every weight the step
  // multiplies by, as stored (the LM head included; of the input embedding
  // only one row, counted as none), plus K and V of the whole context.
  const double weight_bytes = static_cast<double>(runner.DecodeWeightBytes());
  const double kv_bytes = static_cast<double>(c.KvBytesPerToken(4)) * d1->mean_context;
  const double decode_gbs = (weight_bytes + kv_bytes) / d1->step_s / 1e9;
  const double fraction = decode_gbs / bw.triad_gbs;

  const double load_after = LoadAverage();
  const double mem_gib = static_cast<double>(sysconf(_SC_PHYS_PAGES)) *
                         static_cast<double>(sysconf(_SC_PAGE_SIZE)) / (1 << 30);
  std::printf("pdserve_engine_bench  %s, %d threads, %.1f GiB RAM\n", CpuModelName().c_str(),
              threads, mem_gib);
  std::printf(
      "model: %s, %.1fM parameters, hidden %d, %d layers, %d heads (%d KV), "
      "intermediate %d, vocab %d, %s on disk, %.1f MB of weights read per decode step\n",
      c.architecture.c_str(), c.ParameterCount() / 1e6, c.hidden_size, c.num_layers, c.num_heads,
      c.num_kv_heads, c.intermediate_size, c.vocab_size, c.torch_dtype.c_str(),
      static_cast<double>(runner.DecodeWeightBytes()) / 1e6);
  std::printf("--weight_dtype=%s, GEMV kernels: %s\n",
              std::string(engine::WeightDtypeName(absl::GetFlag(FLAGS_weight_dtype))).c_str(),
              engine::cpu::IsaName(engine::cpu::BestIsa()));
  std::printf("load average (1 min) before / after: %.2f / %.2f\n", load_before, load_after);
  std::printf("%-34s %14s\n", "measurement", "value");
  if (!decode_only) {
    std::printf("%-34s %14.1f\n",
                absl::StrFormat("prefill %d tokens, tokens/s", prompt_len).c_str(), prefill_tps);
    std::printf("%-34s %14.1f\n", "prefill GFLOP/s", prefill_gflops);
  }
  std::printf("%-34s %14.2f\n", "decode batch 1, tokens/s", d1->tokens_per_s);
  std::printf("%-34s %14.2f\n", "decode batch 1, ms/step", d1->step_s * 1e3);
  std::printf("%-34s %14.2f\n", "decode batch 1, mean tokens/s", d1->mean_tokens_per_s);
  if (!decode_only) {
    std::printf("%-34s %14.2f\n", absl::StrFormat("decode batch %d, tokens/s", batch).c_str(),
                dn->tokens_per_s);
    std::printf("%-34s %14.2f\n", absl::StrFormat("decode batch %d, ms/step", batch).c_str(),
                dn->step_s * 1e3);
  }
  std::printf("%-34s %14.2f\n", "memory bandwidth copy, GB/s", bw.copy_gbs);
  std::printf("%-34s %14.2f\n", "memory bandwidth triad, GB/s", bw.triad_gbs);
  std::printf("%-34s %14.1f\n", "decode batch 1 bytes/step, MB", (weight_bytes + kv_bytes) / 1e6);
  std::printf("%-34s %14.2f\n", "decode batch 1 achieved, GB/s", decode_gbs);
  std::printf("%-34s %14.3f\n", "decode batch 1 / triad bandwidth", fraction);

  nlohmann::json j = {
      {"cpu", CpuModelName()},
      {"threads", threads},
      {"parameters", c.ParameterCount()},
      {"prompt_len", prompt_len},
      {"context", context},
      {"batch", batch},
      {"prefill_tokens_per_s", prefill_tps},
      {"prefill_gflops", prefill_gflops},
      {"decode_b1_tokens_per_s", d1->tokens_per_s},
      {"decode_b1_step_ms", d1->step_s * 1e3},
      {"decode_b1_mean_tokens_per_s", d1->mean_tokens_per_s},
      {"decode_batch_tokens_per_s", dn->tokens_per_s},
      {"decode_batch_step_ms", dn->step_s * 1e3},
      {"bandwidth_copy_gbs", bw.copy_gbs},
      {"bandwidth_triad_gbs", bw.triad_gbs},
      {"decode_b1_bytes_per_step", weight_bytes + kv_bytes},
      {"weight_dtype", engine::WeightDtypeName(absl::GetFlag(FLAGS_weight_dtype))},
      {"gemv_isa", engine::cpu::IsaName(engine::cpu::BestIsa())},
      {"decode_b1_gbs", decode_gbs},
      {"decode_b1_bandwidth_fraction", fraction},
      {"load_average_before", load_before},
      {"load_average_after", load_after},
  };
  std::printf("%s\n", j.dump().c_str());
  if (const std::string path = absl::GetFlag(FLAGS_json_out); !path.empty()) {
    std::ofstream(path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ParseFlags(
      argc, argv,
      "CPU engine benchmark: prefill and decode throughput next to measured memory bandwidth",
      __FILE__);
  return pdserve::bench::Main();
}
