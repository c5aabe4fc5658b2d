// EngineCore driven by a scripted fake runner and a recording policy, one
// table row per scenario: what wakes the loop (an arrival, blocks freed, a
// transfer done), cancellation in the middle of a chunked prompt,
// preemption and readmission, shutdown with a step in flight, failed steps.
// The assertions are on the events and their order, never on wall time:
// every wait is for an event with a generous deadline, and the loop's idle
// poll is an hour, so a wake-up that the events did not cause would show as
// a missing event (and in WakeStats), not as a slow one.
#include "engine/core/engine_core.h"

#include <algorithm>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/unit/engine/tiny_models.h"

namespace pdserve::engine {
namespace {

constexpr absl::Duration kDeadline = absl::Seconds(60);
constexpr int32_t kToken = 7;  // what the fake runner samples (not an end token of the config)

// Steps complete only as the script allows (Allow), fail when told to
// (FailNext), and sample kToken for every sampling sequence.
class ScriptedRunner final : public ModelRunner {
 public:
  ScriptedRunner(int num_blocks, int block_size)
      : config_(testing_models::TinyGqaConfig()),
        num_blocks_(num_blocks),
        block_size_(block_size) {}

  void Allow(int steps) {
    absl::MutexLock lock(&mu_);
    permits_ += steps;
  }
  void FailNext(int steps) {
    absl::MutexLock lock(&mu_);
    fail_ += steps;
  }

  absl::StatusOr<std::unique_ptr<StepHandle>> Enqueue(StepBatch batch) override {
    return std::unique_ptr<StepHandle>(new Handle(this, batch.seqs.size()));
  }

  const ModelConfig& config() const override { return config_; }
  std::string_view backend() const override { return "scripted"; }
  uint64_t fingerprint() const override { return 1; }
  KvDtype kv_dtype() const override { return KvDtype::kF32; }
  int num_kv_blocks() const override { return num_blocks_; }
  int kv_block_size() const override { return block_size_; }
  int64_t DecodeWeightBytes() const override { return 0; }
  std::span<const KvRegion> kv_regions() const override { return {}; }
  size_t LayerKvBytes(int num_tokens) const override { return 0; }
  absl::Status ReadLayerKv(int, std::span<const int32_t>, int,
                           std::span<std::byte>) const override {
    return absl::UnimplementedError("scripted runner");
  }
  absl::Status WriteLayerKv(int, std::span<const int32_t>, int,
                            std::span<const std::byte>) override {
    return absl::UnimplementedError("scripted runner");
  }

 private:
  class Handle final : public StepHandle {
   public:
    Handle(ScriptedRunner* runner, size_t num_seqs) : runner_(runner), num_seqs_(num_seqs) {}
    absl::Status WaitLayer(int layer) override { return Gate(); }
    absl::StatusOr<StepOutput> Wait() override {
      if (absl::Status s = Gate(); !s.ok()) return s;
      StepOutput out;
      out.sampled.resize(num_seqs_, SampledToken{.token = kToken, .logprob = -0.5f});
      return out;
    }

   private:
    // The first call takes a permit (waiting for one); later ones repeat its
    // result.
    absl::Status Gate() {
      if (!gated_) {
        gated_ = true;
        absl::MutexLock lock(&runner_->mu_);
        auto allowed = [this]() ABSL_SHARED_LOCKS_REQUIRED(runner_->mu_) {
          return runner_->permits_ > 0;
        };
        runner_->mu_.Await(absl::Condition(&allowed));
        --runner_->permits_;
        if (runner_->fail_ > 0) {
          --runner_->fail_;
          result_ = absl::InternalError("scripted step failure");
        }
      }
      return result_;
    }
    ScriptedRunner* const runner_;
    const size_t num_seqs_;
    bool gated_ = false;
    absl::Status result_;
  };

  const ModelConfig config_;
  const int num_blocks_;
  const int block_size_;
  absl::Mutex mu_;
  int permits_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_ ABSL_GUARDED_BY(mu_) = 0;
};

// Records what the core asks of a role, in order: "before plan", "plan 1,2",
// "preempt 2", "token 1", "finish 1", "cancelled 1", "error 1", "deliver".
class RecordingPolicy final : public EnginePolicy {
 public:
  void BeforePlan() override { Log("before plan"); }
  void OnPlanned(const ScheduledStep& step, double) override {
    for (SeqId id : step.preempted) Log(absl::StrCat("preempt ", id));
    for (const auto& [id, why] : step.failed) Log(absl::StrCat("failed ", id));
  }
  std::unique_ptr<EngineStep> BeginStep(const ScheduledStep& step, absl::Time) override {
    Log(absl::StrCat("plan ", absl::StrJoin(step.ids, ",")));
    return std::make_unique<Step>(this);
  }

  void Log(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() {
    absl::MutexLock lock(&mu_);
    return events_;
  }
  int Count(const std::string& event) {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count(events_.begin(), events_.end(), event));
  }
  // Waits (kDeadline at most) until `event` was logged `times` times.
  bool WaitFor(const std::string& event, int times = 1) {
    absl::MutexLock lock(&mu_);
    auto seen = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return std::count(events_.begin(), events_.end(), event) >= times;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&seen), kDeadline);
  }

 private:
  class Step final : public EngineStep {
   public:
    explicit Step(RecordingPolicy* policy) : policy_(policy) {}
    void Apply(const std::vector<SequenceUpdate>& updates, const absl::StatusOr<StepOutput>&,
               const StepTiming&) override {
      for (const SequenceUpdate& u : updates) {
        if (u.cancelled) policy_->Log(absl::StrCat("cancelled ", u.id));
        if (!u.error.ok()) policy_->Log(absl::StrCat("error ", u.id));
        if (u.token.has_value()) policy_->Log(absl::StrCat("token ", u.id));
        if (u.finish != FinishReason::kNone) policy_->Log(absl::StrCat("finish ", u.id));
      }
    }
    void Deliver() override { policy_->Log("deliver"); }

   private:
    RecordingPolicy* const policy_;
  };

  absl::Mutex mu_;
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

struct Harness {
  Harness(const SchedulerOptions& scheduler, int num_blocks, int block_size,
          absl::Duration step_target = absl::ZeroDuration(), bool overlap_delivery = true)
      : runner(num_blocks, block_size),
        core(EngineCoreOptions{.scheduler = scheduler,
                               .overlap_delivery = overlap_delivery,
                               .idle_poll = absl::Hours(1),
                               .step_target = step_target},
             &runner, &policy) {}

  void AddPrompt(SeqId id, int tokens, int max_tokens) {
    auto access = core.Change();
    ASSERT_TRUE(access.scheduler()
                    .AddPrompt(id, std::vector<int32_t>(tokens, 3), {.max_tokens = max_tokens})
                    .ok());
  }
  // Waits until the loop waits for a change with none pending: it has
  // planned after every change made so far.
  bool WaitIdle() {
    const absl::Time deadline = absl::Now() + kDeadline;
    while (absl::Now() < deadline) {
      if (core.wake_stats().idle) return true;
      absl::SleepFor(absl::Milliseconds(1));
    }
    return false;
  }

  ScriptedRunner runner;
  RecordingPolicy policy;
  EngineCore core;
};

// `events` must appear in this order in `log` (others may come between).
bool InOrder(const std::vector<std::string>& log, const std::vector<std::string>& events) {
  size_t next = 0;
  for (const std::string& e : log) {
    if (next < events.size() && e == events[next]) ++next;
  }
  return next == events.size();
}

struct Case {
  std::string name;
  SchedulerOptions scheduler;
  int num_blocks = 16;
  int block_size = 4;
  // Drives the core (already started); returns with its own checks done.
  std::function<void(Harness&)> script;
  std::vector<std::string> ordered;  // then these, in this order, in the log
  std::vector<std::string> absent;   // and none of these
};

SchedulerOptions Prefill(int chunk = 0) {
  return {.role = SchedulerRole::kPrefill,
          .plan = {.max_num_seqs = 8, .max_batch_tokens = 64, .max_prefill_chunk_tokens = chunk}};
}
SchedulerOptions Colocated(int headroom) {
  return {.role = SchedulerRole::kColocated,
          .plan = {.max_num_seqs = 8, .max_batch_tokens = 64},
          .kv_headroom_tokens = headroom};
}
SchedulerOptions Decode() {
  return {.role = SchedulerRole::kDecode,
          .plan = {.max_num_seqs = 8, .max_batch_tokens = 16, .max_prefill_chunk_tokens = 8},
          .kv_headroom_tokens = 0};
}

const std::vector<Case>& Cases() {
  static const std::vector<Case> cases = {
      {.name = "ArrivalWakesTheIdleLoop",
       .scheduler = Prefill(),
       .script =
           [](Harness& h) {
             h.runner.Allow(100);
             ASSERT_TRUE(h.WaitIdle());
             h.AddPrompt(1, 8, 4);
             ASSERT_TRUE(h.policy.WaitFor("token 1"));
           },
       .ordered = {"plan 1", "token 1", "deliver"}},

      {.name = "BeforePlanRunsBeforeEveryPlan",
       // The hook a role gives the scheduler its input with (the decode
       // role's speculative proposals): once before each Schedule().
       .scheduler = Colocated(0),
       .script =
           [](Harness& h) {
             h.runner.Allow(100);
             h.AddPrompt(1, 8, 3);
             ASSERT_TRUE(h.policy.WaitFor("finish 1"));
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_EQ(static_cast<uint64_t>(h.policy.Count("before plan")),
                       h.core.wake_stats().plans);
           },
       .ordered = {"before plan", "plan 1", "token 1", "before plan", "plan 1", "token 1",
                   "before plan", "plan 1", "finish 1", "before plan"}},

      {.name = "BlocksFreedWakeAPromptWaitingForThem",
       // 4 blocks of 4: prompt 1 holds all of them until its KV is read
       // (Release); prompt 2 waits for blocks meanwhile.
       .scheduler = Prefill(),
       .num_blocks = 4,
       .script =
           [](Harness& h) {
             h.runner.Allow(100);
             h.AddPrompt(1, 16, 4);
             ASSERT_TRUE(h.policy.WaitFor("token 1"));
             h.AddPrompt(2, 8, 4);
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_EQ(h.policy.Count("plan 2"), 0) << "prompt 2 must wait for blocks";
             const absl::Time freed = absl::Now();
             {
               auto access = h.core.Change();
               access.scheduler().Release(1);
             }
             ASSERT_TRUE(h.policy.WaitFor("plan 2"));
             // A figure for the reader, not an assertion (a busy machine
             // may take longer): the 100 ms poll this replaces shows here.
             std::cout << "blocks freed -> waiting prompt planned: "
                       << absl::ToDoubleMilliseconds(absl::Now() - freed) << " ms\n";
             ASSERT_TRUE(h.policy.WaitFor("token 2"));
           },
       .ordered = {"plan 1", "token 1", "deliver", "plan 2", "token 2"}},

      {.name = "TransferDoneWakesTheDecodeLoop",
       .scheduler = Decode(),
       .script =
           [](Harness& h) {
             h.runner.Allow(100);
             {
               auto access = h.core.Change();
               ASSERT_TRUE(access.scheduler()
                               .AddRemote(1, std::vector<int32_t>(8, 3), {.max_tokens = 3})
                               .ok());
             }
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_EQ(h.policy.Count("plan 1"), 0) << "nothing to step before the KV is in";
             {
               auto access = h.core.Change();
               ASSERT_TRUE(access.scheduler().StartDecoding(1, kToken).ok());
             }
             ASSERT_TRUE(h.policy.WaitFor("finish 1"));
           },
       .ordered = {"plan 1", "token 1", "plan 1", "token 1", "finish 1"}},

      {.name = "CancelMidChunkStopsAtTheStepsEnd",
       // Chunks of 4: the 16-token prompt takes 4 steps; it is cancelled
       // while its second chunk runs.
       .scheduler = Prefill(4),
       .script =
           [](Harness& h) {
             h.AddPrompt(1, 16, 4);
             h.runner.Allow(1);
             ASSERT_TRUE(h.policy.WaitFor("plan 1", 2));  // the second chunk waits at the gate
             {
               auto access = h.core.Change();
               EXPECT_FALSE(access.scheduler().Cancel(1)) << "in a step: freed at its end";
             }
             h.runner.Allow(100);
             ASSERT_TRUE(h.policy.WaitFor("cancelled 1"));
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_EQ(h.policy.Count("plan 1"), 2);
             auto access = h.core.Read();
             EXPECT_EQ(access.scheduler().Find(1), nullptr);
             EXPECT_EQ(access.scheduler().kv().num_free_blocks(), 16);
           },
       // Step n's results go out once step n+1 is enqueued (overlap).
       .ordered = {"plan 1", "plan 1", "deliver", "cancelled 1", "deliver"},
       .absent = {"token 1"}},

      {.name = "PreemptedSequenceIsReadmittedAndFinishes",
       // 5 blocks of 4, no headroom: prompts of 8 and 12 tokens take all of
       // them; the older one's first decode needs a block, so the newer one
       // is preempted, recomputed once the older one finished, and both
       // finish.
       .scheduler = Colocated(0),
       .num_blocks = 5,
       .script =
           [](Harness& h) {
             h.AddPrompt(1, 8, 8);
             h.AddPrompt(2, 12, 8);
             h.runner.Allow(1000);
             ASSERT_TRUE(h.policy.WaitFor("finish 1"));
             ASSERT_TRUE(h.policy.WaitFor("finish 2"));
           },
       .ordered = {"plan 1,2", "preempt 2", "finish 1", "plan 2", "finish 2"},
       .absent = {"error 1", "error 2"}},

      {.name = "StopEndsAfterTheStepInFlight",
       // Chunks of 4: Stop() comes while the first chunk runs; that step is
       // applied and handed out, no further one is planned, and the
       // sequence stays for the role to fail.
       .scheduler = Prefill(4),
       .script =
           [](Harness& h) {
             h.AddPrompt(1, 16, 4);
             ASSERT_TRUE(h.policy.WaitFor("plan 1"));
             std::thread stopper([&h] {
               h.core.Stop();
               h.policy.Log("stopped");
             });
             h.core.RequestStop();  // Stop() may not have begun yet
             {
               auto access = h.core.Read();
               EXPECT_TRUE(access.stopping());
             }
             h.runner.Allow(100);
             stopper.join();
             EXPECT_EQ(h.policy.Count("plan 1"), 1);
             auto access = h.core.Read();
             EXPECT_NE(access.scheduler().Find(1), nullptr);
           },
       .ordered = {"plan 1", "deliver", "stopped"}},

      {.name = "FailedStepsMakeTheCoreUnhealthyUntilOneSucceeds",
       .scheduler = Prefill(),
       .script =
           [](Harness& h) {
             h.runner.FailNext(3);
             h.runner.Allow(100);
             for (SeqId id = 1; id <= 3; ++id) {
               h.AddPrompt(id, 4, 2);
               ASSERT_TRUE(h.policy.WaitFor(absl::StrCat("error ", id)));
             }
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_NE(h.core.progress().unhealthy_reason.find("scripted step failure"),
                       std::string::npos);
             h.AddPrompt(4, 4, 2);
             ASSERT_TRUE(h.policy.WaitFor("token 4"));
             ASSERT_TRUE(h.WaitIdle());
             EXPECT_EQ(h.core.progress().unhealthy_reason, "");
             EXPECT_EQ(h.core.progress().steps_completed, 4u);
           },
       .ordered = {"error 1", "error 2", "error 3", "token 4"}},
  };
  return cases;
}

class EngineCoreTest : public testing::TestWithParam<Case> {};

TEST_P(EngineCoreTest, EventsInOrderAndOnlyEventsWakeTheLoop) {
  const Case& c = GetParam();
  Harness h(c.scheduler, c.num_blocks, c.block_size);
  h.core.Start();
  c.script(h);
  h.runner.Allow(1000);
  h.core.Stop();
  const std::vector<std::string> log = h.policy.events();
  EXPECT_TRUE(InOrder(log, c.ordered)) << "expected in order: " << absl::StrJoin(c.ordered, " | ")
                                       << "\nlog: " << absl::StrJoin(log, " | ");
  for (const std::string& e : c.absent) {
    EXPECT_EQ(std::count(log.begin(), log.end(), e), 0) << e << " in " << absl::StrJoin(log, " | ");
  }
  // Every start was caused by a step's end or a change, never by the poll.
  const WakeStats stats = h.core.wake_stats();
  EXPECT_EQ(stats.poll_wakeups, 0u);
  EXPECT_EQ(stats.poll_found_work, 0u);
}

// --prefill_step_target_ms: once a step has measured the rate, a step's
// new tokens are capped at rate x target, never below one chunk, never
// above max_batch_tokens. Two 8-token prompts with chunks of 4 wait while a
// first prompt measures the rate; a target far below one chunk's time
// caps every later step at one chunk's tokens (4, shared by the prompts),
// a target far above it lets both prompts' chunks run in one step. Both figures are extremes, so
// the assertion does not depend on how fast this machine is.
TEST(EngineCoreStepTarget, StepsAreCappedAtTheMeasuredRateTimesTheTarget) {
  for (const bool tiny : {true, false}) {
    SCOPED_TRACE(tiny ? "target 1 ns" : "target 1 h");
    Harness h(Prefill(4), 16, 4, tiny ? absl::Nanoseconds(1) : absl::Hours(1));
    h.core.Start();
    h.AddPrompt(1, 4, 1);
    h.runner.Allow(1);
    ASSERT_TRUE(h.policy.WaitFor("token 1"));
    ASSERT_TRUE(h.WaitIdle());
    ASSERT_GT(h.core.progress().tokens_per_second, 0);
    {
      auto access = h.core.Change();
      ASSERT_TRUE(
          access.scheduler().AddPrompt(2, std::vector<int32_t>(8, 3), {.max_tokens = 1}).ok());
      ASSERT_TRUE(
          access.scheduler().AddPrompt(3, std::vector<int32_t>(8, 3), {.max_tokens = 1}).ok());
    }
    h.runner.Allow(100);
    ASSERT_TRUE(h.policy.WaitFor("token 2"));
    ASSERT_TRUE(h.policy.WaitFor("token 3"));
    h.core.Stop();
    const std::vector<std::string> log = h.policy.events();
    // Steps that ran prompts 2 and 3 (16 tokens): at most 4 tokens each
    // under the tiny target, chunks of 4 for both prompts under the long one.
    int steps = 0;
    for (const std::string& e : log) {
      steps += (e == "plan 2,3" || e == "plan 3,2" || e == "plan 2" || e == "plan 3");
    }
    if (tiny) {
      EXPECT_GE(steps, 4) << absl::StrJoin(log, " | ");
    } else {
      EXPECT_EQ(steps, 2) << absl::StrJoin(log, " | ");
    }
  }
}

// delivery_stats(): a prompt step and two decode steps are handed out three
// times. With overlap, the first two while the next step computes and the
// last before the loop waits; without it, none beside a step.
TEST(EngineCoreDelivery, StatsCountTheHandOutsThatRanBesideTheNextStep) {
  for (const bool overlap : {true, false}) {
    SCOPED_TRACE(overlap ? "overlap" : "no overlap");
    Harness h(Colocated(0), 16, 4, absl::ZeroDuration(), overlap);
    h.core.Start();
    h.runner.Allow(100);
    h.AddPrompt(1, 8, 3);
    ASSERT_TRUE(h.policy.WaitFor("finish 1"));
    ASSERT_TRUE(h.WaitIdle());
    const DeliveryStats stats = h.core.delivery_stats();
    EXPECT_EQ(stats.deliveries, 3u);
    EXPECT_EQ(h.policy.Count("deliver"), 3);
    EXPECT_EQ(stats.overlapped, overlap ? 2u : 0u);
    EXPECT_GE(stats.seconds, stats.overlapped_seconds);
    if (!overlap) {
      EXPECT_EQ(stats.overlapped_seconds, 0);
    }
    h.core.Stop();
  }
}

INSTANTIATE_TEST_SUITE_P(Table, EngineCoreTest, testing::ValuesIn(Cases()),
                         [](const testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace pdserve::engine
