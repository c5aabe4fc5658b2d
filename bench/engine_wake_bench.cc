// How soon a prompt waiting for KV blocks starts once they are freed, on the
// engine core (engine/core/engine_core.h) with a runner that completes every
// step at once, so the figure is the loop's own reaction time. Each round:
// prompt A holds every block (prefill role: held until its KV is read),
// prompt B waits for them, then A's blocks are released and the time until B
// is planned is measured. Two ways of releasing, alternated round by round:
//   wake:    Release through EngineCore::Change() (what the prefill engine
//            does when a KV send is done)
//   no-wake: Release under the lock without announcing a change (what the
//            prefill engine did before: B then starts at the loop's idle
//            poll, 100 ms by default)
//
//   pdserve_engine_wake_bench [--rounds=50] [--idle_poll_ms=100]
#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "engine/core/engine_core.h"

ABSL_FLAG(int, rounds, 50, "Rounds per way of releasing (alternated)");
ABSL_FLAG(int, idle_poll_ms, 100, "The engine loop's idle poll (EngineCoreOptions::idle_poll)");

namespace pdserve::engine {
namespace {

// Completes every step at once, sampling token 7.
class InstantRunner final : public ModelRunner {
 public:
  InstantRunner() {
    config_.architecture = "LlamaForCausalLM";
    config_.vocab_size = 32;
    config_.num_layers = 1;
    config_.max_position_embeddings = 1024;
  }
  absl::StatusOr<std::unique_ptr<StepHandle>> Enqueue(StepBatch batch) override {
    return std::unique_ptr<StepHandle>(new Done(batch.seqs.size()));
  }
  const ModelConfig& config() const override { return config_; }
  std::string_view backend() const override { return "instant"; }
  uint64_t fingerprint() const override { return 1; }
  KvDtype kv_dtype() const override { return KvDtype::kF32; }
  int num_kv_blocks() const override { return 4; }
  int kv_block_size() const override { return 16; }
  int64_t DecodeWeightBytes() const override { return 0; }
  std::span<const KvRegion> kv_regions() const override { return {}; }
  size_t LayerKvBytes(int) const override { return 0; }
  absl::Status ReadLayerKv(int, std::span<const int32_t>, int,
                           std::span<std::byte>) const override {
    return absl::UnimplementedError("instant runner");
  }
  absl::Status WriteLayerKv(int, std::span<const int32_t>, int,
                            std::span<const std::byte>) override {
    return absl::UnimplementedError("instant runner");
  }

 private:
  class Done final : public StepHandle {
   public:
    explicit Done(size_t n) : n_(n) {}
    absl::Status WaitLayer(int) override { return absl::OkStatus(); }
    absl::StatusOr<StepOutput> Wait() override {
      StepOutput out;
      out.sampled.resize(n_, SampledToken{.token = 7});
      return out;
    }

   private:
    const size_t n_;
  };
  ModelConfig config_;
};

// Notes when each sequence is first planned.
class StartTimes final : public EnginePolicy {
 public:
  void OnPlanned(const ScheduledStep&, double) override {}
  std::unique_ptr<EngineStep> BeginStep(const ScheduledStep& step, absl::Time now) override {
    absl::MutexLock lock(&mu_);
    for (SeqId id : step.ids) started_.try_emplace(id, now);
    return std::make_unique<Nothing>();
  }
  absl::Time WaitStarted(SeqId id) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return started_.contains(id); };
    mu_.AwaitWithTimeout(absl::Condition(&seen), absl::Seconds(30));
    return started_.contains(id) ? started_[id] : absl::InfiniteFuture();
  }

 private:
  struct Nothing final : EngineStep {
    void Apply(const std::vector<SequenceUpdate>&, const absl::StatusOr<StepOutput>&,
               const StepTiming&) override {}
  };
  absl::Mutex mu_;
  std::map<SeqId, absl::Time> started_ ABSL_GUARDED_BY(mu_);
};

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * (v.size() - 1) + 0.5))];
}

int Run() {
  InstantRunner runner;
  StartTimes policy;
  EngineCore core({.scheduler = {.role = SchedulerRole::kPrefill,
                                 .plan = {.max_num_seqs = 8, .max_batch_tokens = 256}},
                   .idle_poll = absl::Milliseconds(absl::GetFlag(FLAGS_idle_poll_ms))},
                  &runner, &policy);
  core.Start();
  std::vector<double> wake_ms, no_wake_ms;
  SeqId next = 1;
  for (int round = 0; round < 2 * absl::GetFlag(FLAGS_rounds); ++round) {
    const bool wake = round % 2 == 0;
    const SeqId a = next++, b = next++;
    {
      auto access = core.Change();
      (void)access.scheduler().AddPrompt(a, std::vector<int32_t>(64, 3), {.max_tokens = 1});
    }
    policy.WaitStarted(a);
    {
      auto access = core.Change();
      (void)access.scheduler().AddPrompt(b, std::vector<int32_t>(16, 3), {.max_tokens = 1});
    }
    // B found no blocks: the loop waits idle again.
    while (!core.wake_stats().idle) absl::SleepFor(absl::Microseconds(100));
    const absl::Time freed = absl::Now();
    if (wake) {
      auto access = core.Change();
      access.scheduler().Release(a);
    } else {
      auto access = core.Read();
      access.scheduler().Release(a);
    }
    const absl::Time started = policy.WaitStarted(b);
    (wake ? wake_ms : no_wake_ms).push_back(absl::ToDoubleMilliseconds(started - freed));
    // B holds the blocks now: free them for the next round.
    while (!core.wake_stats().idle) absl::SleepFor(absl::Microseconds(100));
    auto access = core.Change();
    access.scheduler().Release(b);
  }
  core.Stop();
  std::printf("blocks freed -> waiting prompt planned, %d rounds each (idle poll %d ms)\n",
              absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_idle_poll_ms));
  std::printf("  %-8s median %8.3f ms   p90 %8.3f ms   max %8.3f ms\n", "wake",
              Percentile(wake_ms, 0.5), Percentile(wake_ms, 0.9), Percentile(wake_ms, 1.0));
  std::printf("  %-8s median %8.3f ms   p90 %8.3f ms   max %8.3f ms\n", "no-wake",
              Percentile(no_wake_ms, 0.5), Percentile(no_wake_ms, 0.9),
              Percentile(no_wake_ms, 1.0));
  return 0;
}

}  // namespace
}  // namespace pdserve::engine

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::engine::Run();
}
