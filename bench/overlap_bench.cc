// pdserve_overlap_bench: what EngineCoreOptions::overlap_delivery buys
// (engine/core/engine_core.h, "Overlap"). The colocated engine
// (colocated/colocated_engine.h: the EngineCore in its colocated role) on a
// real runner and model serves B streams of M tokens each; every stream is
// read by a consumer thread of its own, as the server's handler threads read
// theirs (the consumers only collect the tokens: no detokenizing, no
// network write). Overlap on and off alternate within each round (the order
// flips every round) and the median of the rounds is printed per batch and
// mode:
//   tok/s        tokens the consumers received in the decode phase (from
//                the moment every stream had its first token to the last
//                stream's end) per second of it
//   step ms      the decode phase per decode step (the loop's period)
//   runner ms    the runner's own time per decode step (enqueue to result;
//                pdserve_colocated_decode_step_seconds)
//   plan us      the scheduler's time per plan (Scheduler::Schedule;
//                pdserve_scheduler_step_seconds): host work between two
//                steps that overlap does not hide, as step n+1's tokens are
//                step n's samples
//   hand-out us  time per step in EngineStep::Deliver (stream pushes, step
//                metrics) and in releasing the step: EngineCore::delivery_stats()
//   beside       the share of that time that ran while the next step computed
//   gain         tok/s with overlap over tok/s without, on the "on" row
// Greedy outputs are compared across the modes (same tokens: "yes").
//
// --backend=cuda is the CUDA runner: the real one in CUDA builds, the CPU
// emulation of it in pdserve_overlap_bench_emulated (built where the
// emulation is and CUDA is not; its timings are CPU timings and say nothing
// of a GPU's, only how the loop behaves beside an asynchronous runner).
//
//   pdserve_overlap_bench [--model_dir=tools/demo_model] [--backend=cpu]
//       [--batches=1,8,32] [--tokens=128] [--prompt_len=16] [--rounds=3]
//       [--threads=0]
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_common.h"
#include "colocated/colocated_engine.h"
#include "colocated/colocated_metrics.h"
#include "common/base/cli.h"
#include "engine/runner_factory.h"
#include "prometheus/registry.h"

ABSL_FLAG(std::string, model_dir, "tools/demo_model", "Model directory");
ABSL_FLAG(std::string, backend, "cpu",
          "Runner: cpu, or cuda (a GPU in CUDA builds; the emulation in "
          "pdserve_overlap_bench_emulated)");
ABSL_FLAG(std::string, batches, "1,8,32", "Concurrent streams (B), comma-separated");
ABSL_FLAG(int, tokens, 128, "Tokens per stream (M), the first one included");
ABSL_FLAG(int, prompt_len, 16, "Prompt tokens per stream (distinct prompts)");
ABSL_FLAG(int, rounds, 3, "Rounds; each runs overlap on and off once");
ABSL_FLAG(int, threads, 0, "CPU runner threads (0: all cores)");

namespace pdserve::bench {
namespace {

// One stream as its consumer saw it.
struct Consumed {
  std::vector<int32_t> tokens;
  std::vector<std::pair<absl::Time, int>> arrivals;  // when, and how many tokens
  absl::Status error;
};

// Reads `stream` to its end (10 minutes at most), keeping its tokens.
void Consume(colocated::ColocatedStream& stream, Consumed& out) {
  const absl::Time deadline = absl::Now() + absl::Minutes(10);
  std::vector<colocated::ColocatedOutput> batch;
  while (absl::Now() < deadline) {
    batch.clear();
    if (!stream.Next(absl::Seconds(1), &batch)) continue;
    const absl::Time now = absl::Now();
    int n = 0;
    for (const colocated::ColocatedOutput& o : batch) {
      if (!o.error.ok()) {
        out.error = o.error;
        return;
      }
      out.tokens.insert(out.tokens.end(), o.tokens.begin(), o.tokens.end());
      n += static_cast<int>(o.tokens.size());
    }
    out.arrivals.emplace_back(now, n);
    if (batch.back().finished) return;
  }
  out.error = absl::DeadlineExceededError("the stream did not end within 10 minutes");
}

struct Figures {
  double tokens_per_second = 0;
  double step_ms = 0;
  double runner_ms = 0;
  double plan_us = 0;
  double hand_out_us = 0;
  double beside = 0;  // share of the hand-out time beside the next step
  std::vector<std::vector<int32_t>> outputs;
};

// Serves `batch` streams of `tokens` tokens on a fresh colocated engine.
absl::StatusOr<Figures> RunOnce(engine::ModelRunner& runner, int batch, int tokens, int prompt_len,
                                bool overlap) {
  prometheus::Registry registry;
  colocated::ColocatedMetrics metrics(registry);
  // Whole requests reserved at admission (no preemption), every prompt in
  // the first prompt step that has room for it, no prefix sharing.
  colocated::ColocatedEngine engine({.max_running = batch,
                                     .max_prefill_tokens = batch * prompt_len,
                                     .max_waiting = batch,
                                     .enable_prefix_caching = false,
                                     .kv_headroom_tokens = -1,
                                     .overlap_delivery = overlap},
                                    &runner, &metrics);
  const int vocab = runner.config().vocab_size;
  std::vector<Consumed> consumed(static_cast<size_t>(batch));
  std::vector<std::thread> consumers;
  for (int i = 0; i < batch; ++i) {
    colocated::ColocatedRequest request;
    for (int t = 0; t < prompt_len; ++t) {
      request.prompt.push_back(static_cast<int32_t>((int64_t{t} * 7919 + i * 104729 + 3) % vocab));
    }
    request.sampling.max_tokens = tokens;
    request.sampling.ignore_eos = true;
    absl::StatusOr<std::shared_ptr<colocated::ColocatedStream>> stream =
        engine.Submit(std::move(request));
    if (!stream.ok()) {
      for (std::thread& c : consumers) c.join();
      return stream.status();
    }
    consumers.emplace_back([s = *std::move(stream), &out = consumed[i]] { Consume(*s, out); });
  }
  for (std::thread& c : consumers) c.join();
  // The decode phase: from the moment every stream has its first token to
  // the last stream's end.
  Figures f;
  absl::Time first = absl::InfinitePast(), end = absl::InfinitePast();
  for (const Consumed& c : consumed) {
    if (!c.error.ok()) return c.error;
    if (static_cast<int>(c.tokens.size()) != tokens) {
      return absl::InternalError("a stream ended with fewer tokens than asked for");
    }
    first = std::max(first, c.arrivals.front().first);
    end = std::max(end, c.arrivals.back().first);
  }
  int64_t decoded = 0;  // tokens that arrived in the decode phase
  int steps = 0;        // decode steps in it: one token per stream each
  for (Consumed& c : consumed) {
    int mine = 0;
    for (const auto& [when, n] : c.arrivals) mine += when > first ? n : 0;
    decoded += mine;
    steps = std::max(steps, mine);
    f.outputs.push_back(std::move(c.tokens));
  }
  const engine::DeliveryStats delivery = engine.delivery_stats();
  const prometheus::ClientMetric::Histogram decode =
      metrics.decode_step_seconds.Collect().histogram;
  const double seconds = absl::ToDoubleSeconds(end - first);
  if (steps == 0 || seconds <= 0) {
    return absl::InvalidArgumentError("no decode phase to time: --tokens must be at least 2");
  }
  f.tokens_per_second = static_cast<double>(decoded) / seconds;
  f.step_ms = 1e3 * seconds / steps;
  f.runner_ms = decode.sample_count > 0
                    ? 1e3 * decode.sample_sum / static_cast<double>(decode.sample_count)
                    : 0;
  const prometheus::ClientMetric::Histogram plan =
      metrics.scheduler_step_seconds.Collect().histogram;
  f.plan_us =
      plan.sample_count > 0 ? 1e6 * plan.sample_sum / static_cast<double>(plan.sample_count) : 0;
  f.hand_out_us = delivery.deliveries > 0
                      ? 1e6 * delivery.seconds / static_cast<double>(delivery.deliveries)
                      : 0;
  f.beside = delivery.seconds > 0 ? delivery.overlapped_seconds / delivery.seconds : 0;
  return f;
}

int Main() {
  const std::vector<int> batches = Ints(absl::GetFlag(FLAGS_batches));
  const int tokens = absl::GetFlag(FLAGS_tokens);
  const int prompt_len = absl::GetFlag(FLAGS_prompt_len);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (batches.empty() || tokens < 2 || prompt_len < 1 || rounds < 1) {
    std::fprintf(stderr,
                 "--batches, --prompt_len and --rounds must be positive, --tokens at least 2\n");
    return 2;
  }
  int max_batch = 0;
  for (int b : batches) max_batch = std::max(max_batch, b);
  engine::RunnerOptions options{.model_dir = absl::GetFlag(FLAGS_model_dir),
                                .backend = absl::GetFlag(FLAGS_backend),
                                .kv_block_size = 16,
                                .num_threads = absl::GetFlag(FLAGS_threads)};
  const int blocks_per_stream =
      (prompt_len + tokens + options.kv_block_size - 1) / options.kv_block_size;
  options.num_kv_blocks = max_batch * blocks_per_stream + 8;
  absl::StatusOr<std::unique_ptr<engine::ModelRunner>> runner = engine::CreateModelRunner(options);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }
  std::printf("%s\n", engine::DescribeRunner(**runner, options).c_str());
  std::printf(
      "%d tokens per stream, prompts of %d tokens, %d rounds (overlap on and off "
      "alternated, medians)\n",
      tokens, prompt_len, rounds);
  std::printf("load average before: %s\n", LoadAverage().c_str());
  std::printf("%5s %-7s %10s %9s %10s %8s %12s %7s %7s %5s\n", "batch", "overlap", "tok/s",
              "step ms", "runner ms", "plan us", "hand-out us", "beside", "gain", "same");
  std::fflush(stdout);
  for (int batch : batches) {
    std::map<bool, std::vector<Figures>> runs;
    for (int round = 0; round < rounds; ++round) {
      for (int i = 0; i < 2; ++i) {
        const bool overlap = (i + round) % 2 == 0;
        absl::StatusOr<Figures> f = RunOnce(**runner, batch, tokens, prompt_len, overlap);
        if (!f.ok()) {
          std::fprintf(stderr, "batch %d, overlap %s: %s\n", batch, overlap ? "on" : "off",
                       f.status().ToString().c_str());
          return 1;
        }
        runs[overlap].push_back(*std::move(f));
      }
    }
    // Medians per mode: on first, then off.
    std::map<bool, Figures> median;
    for (const bool overlap : {true, false}) {
      std::vector<double> tps, step, run, plan, hand, beside;
      for (const Figures& f : runs[overlap]) {
        tps.push_back(f.tokens_per_second);
        step.push_back(f.step_ms);
        run.push_back(f.runner_ms);
        plan.push_back(f.plan_us);
        hand.push_back(f.hand_out_us);
        beside.push_back(f.beside);
      }
      median[overlap] = {.tokens_per_second = Median(tps),
                         .step_ms = Median(step),
                         .runner_ms = Median(run),
                         .plan_us = Median(plan),
                         .hand_out_us = Median(hand),
                         .beside = Median(beside)};
    }
    for (const bool overlap : {true, false}) {
      const Figures& m = median[overlap];
      const std::string gain =
          overlap
              ? absl::StrFormat("%+.1f%%",
                                100 * (m.tokens_per_second / median[false].tokens_per_second - 1))
              : "";
      const bool same = runs[true].front().outputs == runs[overlap].front().outputs;
      std::printf("%5d %-7s %10.1f %9.3f %10.3f %8.1f %12.1f %6.0f%% %7s %5s\n", batch,
                  overlap ? "on" : "off", m.tokens_per_second, m.step_ms, m.runner_ms, m.plan_us,
                  m.hand_out_us, 100 * m.beside, gain.c_str(), same ? "yes" : "NO");
    }
    std::fflush(stdout);
  }
  std::printf("load average after: %s\n", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve::bench

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv, "pdserve_overlap_bench [flags]", __FILE__);
  return pdserve::bench::Main();
}
