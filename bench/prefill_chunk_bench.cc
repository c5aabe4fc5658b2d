// pdserve_prefill_chunk_bench: prompt throughput when a prefill worker
// computes prompts in chunks of at most C tokens (--max_prefill_chunk_tokens)
// against whole prompts, on the runner a worker uses (CPU backend). Chunking
// bounds how long one step runs, which is how soon a cancelled or expired
// prompt stops and a waiting one starts; it costs throughput because each
// chunk reads the weights again and attends over the KV of the chunks
// before it. The default chunk size is the smallest of these whose loss
// against whole prompts stays within 5% (docs/performance.md).
//
//   pdserve_prefill_chunk_bench [--model_dir=DIR] [--prompt_len=2048]
//       [--chunks=0,2048,1024,512,256] [--batch_prompts=2] [--rounds=3] [--threads=0]
//
// Without --model_dir it writes a random model of the demo model's shape
// with the given context. Chunk sizes are alternated within each round; the
// median of the rounds is printed per size, with its loss against whole
// prompts (chunk 0) and the longest step. Throughput is given both by wall
// time and by the process's CPU time (what the prompts cost the cores,
// which other load on a shared machine disturbs far less than wall time).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "engine/model/config.h"
#include "engine/runner_factory.h"
#include "tools/model_writer.h"

ABSL_FLAG(std::string, model_dir, "", "Model directory (empty: a random model of the demo shape)");
ABSL_FLAG(int, prompt_len, 2048, "Tokens per prompt");
ABSL_FLAG(std::string, chunks, "0,2048,1024,512,256", "Chunk sizes to compare (0: whole prompts)");
ABSL_FLAG(int, batch_prompts, 2, "Prompts computed together in each step (a busy worker's batch)");
ABSL_FLAG(int, rounds, 3, "Rounds; each measures every chunk size once");
ABSL_FLAG(int, threads, 0, "Runner threads (0: all cores)");

namespace pdserve {
namespace {

using Clock = std::chrono::steady_clock;

struct Sample {
  double seconds = 0;       // all prompts of the batch, whole
  double cpu_seconds = 0;   // the process's CPU time meanwhile
  double longest_step = 0;  // seconds
};

double ProcessCpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// Computes `batch` prompts of `len` tokens in steps of at most `chunk`
// tokens each (0: whole), every prompt advancing by one chunk per step.
absl::StatusOr<Sample> Run(engine::ModelRunner& runner, int len, int batch, int chunk) {
  const int block = runner.kv_block_size();
  const int blocks_per_prompt = (len + block - 1) / block;
  std::vector<std::vector<int32_t>> prompts(batch), tables(batch);
  for (int p = 0; p < batch; ++p) {
    for (int t = 0; t < len; ++t) {
      prompts[p].push_back((t * 7919 + p * 104729 + 3) % runner.config().vocab_size);
    }
    for (int b = 0; b < blocks_per_prompt; ++b) tables[p].push_back(p * blocks_per_prompt + b);
  }
  const engine::SamplingParams sampling{.max_tokens = 1};
  const int step_tokens = chunk > 0 ? chunk : len;
  Sample out;
  const double cpu_start = ProcessCpuSeconds();
  const auto start = Clock::now();
  for (int done = 0; done < len; done += step_tokens) {
    const int n = std::min(step_tokens, len - done);
    engine::StepBatch step;
    for (int p = 0; p < batch; ++p) {
      step.seqs.push_back({.tokens = std::span<const int32_t>(prompts[p]).subspan(done, n),
                           .num_cached = done,
                           .block_table = tables[p],
                           .sampling = done + n == len ? &sampling : nullptr});
    }
    const auto step_start = Clock::now();
    absl::StatusOr<std::unique_ptr<engine::StepHandle>> handle = runner.Enqueue(std::move(step));
    if (!handle.ok()) return handle.status();
    if (absl::StatusOr<engine::StepOutput> s = (*handle)->Wait(); !s.ok()) return s.status();
    out.longest_step = std::max(out.longest_step,
                                std::chrono::duration<double>(Clock::now() - step_start).count());
  }
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.cpu_seconds = ProcessCpuSeconds() - cpu_start;
  return out;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Main() {
  const int len = absl::GetFlag(FLAGS_prompt_len);
  const int batch = absl::GetFlag(FLAGS_batch_prompts);
  std::vector<int> chunks;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_chunks), ',')) {
    int c = 0;
    if (!absl::SimpleAtoi(s, &c) || c < 0) {
      std::cerr << "bad --chunks entry '" << s << "'\n";
      return 2;
    }
    chunks.push_back(c);
  }
  std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  if (model_dir.empty()) {
    model_dir = std::filesystem::temp_directory_path() / "pdserve_prefill_chunk_bench_model";
    engine::ModelConfig config = engine::DefaultDemoConfig();
    config.max_position_embeddings = std::max(len + 16, config.max_position_embeddings);
    if (absl::Status s = engine::WriteRandomModel(config, 1, "bf16", model_dir); !s.ok()) {
      std::cerr << s << "\n";
      return 1;
    }
  }
  const int block = 16;
  auto runner = engine::CreateModelRunner({.model_dir = model_dir,
                                           .kv_block_size = block,
                                           .num_kv_blocks = batch * ((len + block - 1) / block),
                                           .num_threads = absl::GetFlag(FLAGS_threads)});
  if (!runner.ok()) {
    std::cerr << runner.status() << "\n";
    return 1;
  }
  std::vector<std::vector<double>> seconds(chunks.size()), cpu(chunks.size()),
      longest(chunks.size());
  if (auto warm = Run(**runner, len, batch, 0); !warm.ok()) {
    std::cerr << warm.status() << "\n";
    return 1;
  }
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (size_t i = 0; i < chunks.size(); ++i) {
      auto s = Run(**runner, len, batch, chunks[i]);
      if (!s.ok()) {
        std::cerr << s.status() << "\n";
        return 1;
      }
      seconds[i].push_back(s->seconds);
      cpu[i].push_back(s->cpu_seconds);
      longest[i].push_back(s->longest_step);
    }
  }
  double load[3] = {0, 0, 0};
  getloadavg(load, 3);
  std::printf("model %s, %d prompts of %d tokens per step, %d rounds, load average %.2f\n",
              model_dir.c_str(), batch, len, absl::GetFlag(FLAGS_rounds), load[0]);
  std::printf("%-8s %14s %10s %18s %10s %16s\n", "chunk", "prompt tok/s", "loss",
              "tok per CPU second", "CPU loss", "longest step ms");
  double whole = 0, whole_cpu = 0;
  for (size_t i = 0; i < chunks.size(); ++i) {
    const double rate = batch * len / Median(seconds[i]);
    const double cpu_rate = batch * len / Median(cpu[i]);
    if (chunks[i] == 0) {
      whole = rate;
      whole_cpu = cpu_rate;
    }
    const std::string name = chunks[i] == 0 ? "whole" : std::to_string(chunks[i]);
    std::printf("%-8s %14.0f %9.1f%% %18.0f %9.1f%% %16.1f\n", name.c_str(), rate,
                whole > 0 ? 100.0 * (1 - rate / whole) : 0.0, cpu_rate,
                whole_cpu > 0 ? 100.0 * (1 - cpu_rate / whole_cpu) : 0.0,
                1000 * Median(longest[i]));
  }
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::Main();
}
