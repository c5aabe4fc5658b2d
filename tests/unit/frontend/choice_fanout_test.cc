// ChoiceFanout: the n choices of one request as sessions of their own,
// choice 0 first and the others once its first output is out; seeds s + i;
// every choice relayed to its end under its index; Stop ends all of them.
#include "frontend/choice_fanout.h"

#include <map>
#include <memory>
#include <set>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "prometheus/registry.h"
#include "tests/unit/frontend/fake_orchestrator.h"
#include "tests/util/poll.h"
#include "text/tokenizer.h"

namespace pdserve::frontend {
namespace {

using testing::FakeGeneration;
using testing::Finished;
using testing::GenerationLog;
using testing::Step;
using testing::Tokens;

// Starts generations from scripts in start order (the last repeats); the
// first one says nothing until `gate` opens. Thread-safe.
class ScriptedOrchestrator final : public Orchestrator {
 public:
  std::vector<std::deque<Step>> scripts;
  std::atomic<bool> gate{true};
  GenerationLog log;

  absl::StatusOr<std::unique_ptr<Generation>> Start(GenerationJob job) override {
    absl::MutexLock lock(&mu_);
    const size_t i = log.jobs.size();
    log.jobs.push_back(std::move(job));
    log.started.fetch_add(1);
    std::deque<Step> script = scripts[std::min(i, scripts.size() - 1)];
    if (i == 0) return std::make_unique<Gated>(std::move(script), &log, &gate);
    return std::make_unique<FakeGeneration>(std::move(script), &log);
  }
  std::vector<GenerationJob> jobs() {
    absl::MutexLock lock(&mu_);
    return log.jobs;
  }

 private:
  class Gated final : public Generation {
   public:
    Gated(std::deque<Step> script, GenerationLog* log, std::atomic<bool>* gate)
        : inner_(std::move(script), log), gate_(gate) {}
    absl::Status Next(absl::Duration timeout, std::vector<GenerationEvent>* out) override {
      if (!gate_->load()) {
        absl::SleepFor(std::min(timeout, absl::Milliseconds(2)));
        return absl::OkStatus();
      }
      return inner_.Next(timeout, out);
    }
    void Cancel() override { inner_.Cancel(); }
    Placement placement() const override { return inner_.placement(); }

   private:
    FakeGeneration inner_;
    std::atomic<bool>* gate_;
  };
  absl::Mutex mu_;
};

class ChoiceFanoutTest : public ::testing::Test {
 protected:
  ChoiceFanoutTest() : metrics_(registry_) {
    source_.config.vocab_size = 300;
    source_.config.max_position_embeddings = 64;
    source_.tokenizer = std::make_unique<text::ByteTokenizer>(300);
    sessions_ =
        std::make_unique<SessionManager>(SessionOptions{}, &source_, &orchestrator_, &metrics_);
  }
  static Request TextRequest(std::optional<uint64_t> seed) {
    Request r;
    r.input = Request::Input::kText;
    r.text = "hello";
    r.sampling.max_tokens = 8;
    r.seed = seed;
    return r;
  }
  // Every output until each of `n` choices finished or failed, by index.
  static std::map<int, std::vector<absl::StatusOr<Delta>>> Drain(ChoiceFanout& fanout, int n) {
    std::map<int, std::vector<absl::StatusOr<Delta>>> out;
    int ended = 0;
    const absl::Time deadline = absl::Now() + pdserve::testing::kGenerousDeadline;
    while (ended < n && absl::Now() < deadline) {
      std::optional<ChoiceFanout::Output> o = fanout.Next(absl::Milliseconds(20));
      if (!o.has_value()) continue;
      if (!o->delta.ok() || o->delta->finished) ++ended;
      out[o->index].push_back(std::move(o->delta));
    }
    return out;
  }
  double Requests(const std::string& label) {
    return metrics_.requests.Add({{"finish_reason", label}}).Value();
  }

  prometheus::Registry registry_;
  ClientMetrics metrics_;
  PromptSource source_;
  ScriptedOrchestrator orchestrator_;
  std::unique_ptr<SessionManager> sessions_;
};

TEST(ChoiceRequestsTest, IdsAndSeedStreams) {
  Request base;
  base.seed = 41;
  std::vector<Request> r = ChoiceRequests(base, "cmpl-x", 3);
  ASSERT_EQ(r.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(r[i].request_id, "cmpl-x-" + std::to_string(i));
    EXPECT_EQ(r[i].seed, 41u + i);
  }
  base.seed.reset();
  for (const Request& x : ChoiceRequests(base, "c", 2)) EXPECT_FALSE(x.seed.has_value());
}

TEST_F(ChoiceFanoutTest, FollowersStartAfterTheFirstChoiceFirstOutput) {
  orchestrator_.scripts = {
      {Step{{Tokens({'a', 'b'})}}, Step{{Finished(engine::FinishReason::kLength)}}}};
  orchestrator_.gate = false;
  absl::StatusOr<std::unique_ptr<ChoiceFanout>> fanout;
  std::thread starter([&] {
    fanout = ChoiceFanout::Start(
        *sessions_, ChoiceRequests(TextRequest(7), "r", 3), CallInfo{}, [] { return false; },
        absl::Milliseconds(5));
  });
  ASSERT_TRUE(pdserve::testing::PollUntil([&] { return orchestrator_.log.started.load() == 1; },
                                          pdserve::testing::kGenerousDeadline));
  // While choice 0 has produced nothing, no follower starts (they would
  // compute the prompt again instead of finding it cached).
  for (int i = 0; i < 20; ++i) {
    absl::SleepFor(absl::Milliseconds(5));
    EXPECT_EQ(orchestrator_.log.started.load(), 1);
  }
  orchestrator_.gate = true;
  starter.join();
  ASSERT_TRUE(fanout.ok()) << fanout.status();
  auto outputs = Drain(**fanout, 3);
  ASSERT_EQ(outputs.size(), 3u);
  for (auto& [index, deltas] : outputs) {
    std::string text;
    for (const auto& d : deltas) {
      ASSERT_TRUE(d.ok()) << index << ": " << d.status();
      text += d->text;
    }
    EXPECT_EQ(text, "ab") << index;
    EXPECT_TRUE(deltas.back()->finished);
    EXPECT_EQ(deltas.back()->completion_tokens, 2);
  }
  // One session each: seeds s + i, ids <id>-<i>, counted as three requests.
  const std::vector<GenerationJob> jobs = orchestrator_.jobs();
  ASSERT_EQ(jobs.size(), 3u);
  std::vector<uint64_t> seeds;
  for (const GenerationJob& j : jobs) seeds.push_back(j.sampling.seed);
  EXPECT_THAT(seeds, ::testing::UnorderedElementsAre(7u, 8u, 9u));
  EXPECT_EQ(jobs[0].request_id, "r-0");
  fanout->reset();
  EXPECT_EQ(Requests("length"), 3);
  EXPECT_EQ(sessions_->in_flight(), 0);
}

TEST_F(ChoiceFanoutTest, WithoutASeedEachChoiceDrawsItsOwn) {
  orchestrator_.scripts = {{Step{{Tokens({'a'}), Finished(engine::FinishReason::kLength)}}}};
  auto fanout = ChoiceFanout::Start(
      *sessions_, ChoiceRequests(TextRequest(std::nullopt), "r", 4), CallInfo{},
      [] { return false; }, absl::Milliseconds(5));
  ASSERT_TRUE(fanout.ok()) << fanout.status();
  EXPECT_EQ(Drain(**fanout, 4).size(), 4u);
  std::set<uint64_t> seeds;
  for (const GenerationJob& j : orchestrator_.jobs()) seeds.insert(j.sampling.seed);
  EXPECT_EQ(seeds.size(), 4u);
}

TEST_F(ChoiceFanoutTest, AFailedChoiceIsAnOutputAndStopCancelsTheOthers) {
  // Choice 0 streams without end; the first follower fails; the second
  // streams without end.
  orchestrator_.scripts = {{Step{{Tokens({'a'})}}},
                           {Step{{Tokens({'b'})}, absl::InternalError("decode worker lost")}},
                           {Step{{Tokens({'c'})}}}};
  auto fanout = ChoiceFanout::Start(
      *sessions_, ChoiceRequests(TextRequest(1), "r", 3), CallInfo{}, [] { return false; },
      absl::Milliseconds(5));
  ASSERT_TRUE(fanout.ok()) << fanout.status();
  absl::Status failure;
  const absl::Time deadline = absl::Now() + pdserve::testing::kGenerousDeadline;
  while (failure.ok() && absl::Now() < deadline) {
    std::optional<ChoiceFanout::Output> o = (*fanout)->Next(absl::Milliseconds(20));
    if (o.has_value() && !o->delta.ok()) failure = o->delta.status();
  }
  EXPECT_EQ(failure.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(failure.message(), ::testing::HasSubstr("decode worker lost"));
  (*fanout)->Stop();
  fanout->reset();  // joins
  // Choice 2 may not have started when Stop came (then it never starts);
  // every session that did start ended: the failed one as an error, the
  // others (choice 0 at least) cancelled.
  const int started = static_cast<int>(orchestrator_.jobs().size());
  EXPECT_GE(started, 2);
  EXPECT_EQ(Requests("error"), 1);
  EXPECT_EQ(Requests("cancelled"), started - 1);
  EXPECT_EQ(orchestrator_.log.destroyed.load(), started);
  EXPECT_EQ(sessions_->in_flight(), 0);
}

TEST_F(ChoiceFanoutTest, AClientGoneBeforeTheFirstOutputCancelsChoiceZero) {
  orchestrator_.scripts = {{}};
  orchestrator_.gate = false;
  std::atomic<int> asked{0};
  auto fanout = ChoiceFanout::Start(
      *sessions_, ChoiceRequests(TextRequest(1), "r", 3), CallInfo{}, [&] { return ++asked > 3; },
      absl::Milliseconds(5));
  ASSERT_FALSE(fanout.ok());
  EXPECT_EQ(fanout.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(orchestrator_.log.started.load(), 1);
  EXPECT_EQ(Requests("cancelled"), 1);
  EXPECT_EQ(sessions_->in_flight(), 0);
}

}  // namespace
}  // namespace pdserve::frontend
