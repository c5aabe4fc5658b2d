// PrefillEngine and DecodeEngine in one process, joined by the real TCP KV
// transport on loopback: the disaggregated path without gRPC, including its
// failure paths (every one must free the KV on both sides).
#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <thread>

#include "decode_worker/decode_engine.h"
#include "engine/runner_factory.h"
#include "engine/runtime/generator.h"
#include "engine/spec/spec_factory.h"
#include "gtest/gtest.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"
#include "prefill_worker/prefill_engine.h"
#include "tests/unit/engine/tiny_models.h"
#include "tests/util/constrained_output.h"
#include "tests/util/poll.h"
#include "tools/model_writer.h"
#include "tools/tokenizer_writer.h"

namespace pdserve {
namespace {

engine::ModelConfig TinyConfig() { return engine::testing_models::TinyDemoConfig(); }

std::string WriteModel(uint64_t seed) {
  const std::string dir = ::testing::TempDir() + "/disagg_model_" + std::to_string(seed);
  EXPECT_TRUE(engine::WriteRandomModel(TinyConfig(), seed, "f32", dir).ok());
  return dir;
}

std::unique_ptr<engine::ModelRunner> Runner(const std::string& dir, int blocks) {
  auto r = engine::CreateModelRunner(
      {.model_dir = dir, .kv_block_size = 16, .num_kv_blocks = blocks, .num_threads = 1});
  EXPECT_TRUE(r.ok()) << r.status();
  return std::move(*r);
}

// Drains a decode stream until it finishes or fails (bounded).
struct Drained {
  std::vector<int32_t> tokens;
  bool finished = false;
  absl::Status error;
};
Drained Drain(decode::DecodeStream& stream) {
  Drained d;
  const absl::Time deadline = absl::Now() + pdserve::testing::kGenerousDeadline;
  std::vector<decode::DecodeOutput> outs;
  while (absl::Now() < deadline) {
    outs.clear();
    stream.Next(absl::Milliseconds(50), &outs);
    for (auto& o : outs) {
      for (auto& t : o.tokens) d.tokens.push_back(t.token);
      if (!o.error.ok()) {
        d.error = o.error;
        return d;
      }
      if (o.finished) {
        d.finished = true;
        return d;
      }
    }
  }
  d.error = absl::DeadlineExceededError("test: stream never ended");
  return d;
}

class DisaggregatedEnginesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = WriteModel(3);
    prefill_runner_ = Runner(model_, 64);
    decode_runner_ = Runner(model_, 32);
    auto receiver = kvtransfer::TcpKvReceiver::Create("127.0.0.1", 0, decode_runner_->kv_regions());
    ASSERT_TRUE(receiver.ok());
    receiver_ = std::move(*receiver);
  }
  void TearDown() override {
    // Engines first (the tests' locals), then the senders reading their runners.
    senders_.clear();
  }

  std::unique_ptr<decode::DecodeEngine> MakeDecode(absl::Duration kv_timeout = absl::Seconds(10)) {
    return std::make_unique<decode::DecodeEngine>(
        decode::DecodeEngineOptions{.max_running = 8, .kv_timeout = kv_timeout},
        decode_runner_.get(), receiver_.get(), &decode_metrics_);
  }
  // A prefill engine on `runner`, with a KV sender reading that runner's regions.
  std::unique_ptr<prefill::PrefillEngine> MakePrefill(engine::ModelRunner* runner,
                                                      prefill::PrefillEngineOptions options = {}) {
    auto engine = std::make_unique<prefill::PrefillEngine>(options, runner, &prefill_metrics_);
    auto sender = kvtransfer::TcpKvSender::Create(runner->kv_regions());
    EXPECT_TRUE(sender.ok()) << sender.status();
    senders_[engine.get()] = std::move(*sender);
    return engine;
  }
  kvtransfer::KvSender& SenderOf(prefill::PrefillEngine& prefill) { return *senders_[&prefill]; }
  // Opens a session from `prefill` to the reservation of `stream`.
  std::unique_ptr<kvtransfer::SendSession> Session(prefill::PrefillEngine& prefill, int tokens,
                                                   const decode::DecodeStream& stream) {
    auto s = SenderOf(prefill).Open(receiver_->endpoint(), stream.transfer_id(),
                                    prefill.SpecFor(tokens));
    EXPECT_TRUE(s.ok()) << s.status();
    return s.ok() ? std::move(*s) : nullptr;
  }
  // pdserve_kv_transfer_failures_total, every reason.
  double Failures() {
    double total = 0;
    for (const auto& family : prefill_metrics_.kv_transfer_failures.Collect()) {
      for (const auto& metric : family.metric) total += metric.counter.value;
    }
    return total;
  }
  static absl::StatusOr<prefill::PrefillOutcome> Await(prefill::PrefillTicket& ticket) {
    absl::StatusOr<prefill::PrefillOutcome> out = absl::DeadlineExceededError("test: no outcome");
    ticket.Wait(absl::Seconds(20), &out);
    return out;
  }
  // Waits until the decode engine holds nothing.
  static bool DecodeEmpty(decode::DecodeEngine& d) {
    for (int i = 0; i < 400; ++i) {
      decode::DecodeLoad l = d.load();
      if (l.running == 0 && l.waiting_kv == 0 && l.free_blocks == l.total_blocks) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  // The prefill engine frees a batch's blocks just after completing its
  // tickets: wait (bounded) for the gauge to reach zero.
  bool PrefillEmpty() {
    for (int i = 0; i < 400; ++i) {
      if (prefill_metrics_.kv_cache_usage.Value() == 0) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return false;
  }

  std::string model_;
  std::unique_ptr<engine::ModelRunner> prefill_runner_;
  std::unique_ptr<engine::ModelRunner> decode_runner_;
  std::unique_ptr<kvtransfer::KvReceiver> receiver_;
  std::map<prefill::PrefillEngine*, std::unique_ptr<kvtransfer::KvSender>> senders_;
  prometheus::Registry registry_;
  decode::DecodeMetrics decode_metrics_{registry_};
  prometheus::Registry registry_small_;
  prometheus::Registry prefill_registry_;
  prefill::PrefillMetrics prefill_metrics_{prefill_registry_};
};

TEST_F(DisaggregatedEnginesTest, GeneratesWhatOneProcessGenerates) {
  auto decode = MakeDecode();
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt = {256, 5,  6,  7,  8,  9,  10, 11, 12,
                                       13,  14, 15, 16, 17, 18, 19, 20, 21};
  engine::SamplingParams params{
      .temperature = 0.7f, .seed = 9, .max_tokens = 20, .ignore_eos = true};
  auto expected = engine::GenerateLocally(*Runner(model_, 16), prompt, params);
  ASSERT_TRUE(expected.ok());

  auto stream = decode->Admit({.request_id = "r", .prompt = prompt, .sampling = params});
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto ticket = prefill->Submit({.request_id = "r",
                                 .prompt = prompt,
                                 .sampling = params,
                                 .kv_session = Session(*prefill, prompt.size(), **stream)});
  ASSERT_TRUE(ticket.ok());
  auto outcome = Await(**ticket);
  ASSERT_TRUE(outcome.ok()) << outcome.status();
  Drained d = Drain(**stream);
  ASSERT_TRUE(d.error.ok()) << d.error;
  ASSERT_TRUE(d.finished);
  std::vector<int32_t> all = {outcome->first_token.token};
  all.insert(all.end(), d.tokens.begin(), d.tokens.end());
  EXPECT_EQ(all, expected->tokens);
  EXPECT_TRUE(DecodeEmpty(*decode));
  EXPECT_TRUE(PrefillEmpty());
  // The workers' own latency histograms: one first token at the prefill
  // worker, one gap per token the decode worker generated (19 of 20).
  EXPECT_EQ(prefill_metrics_.time_to_first_token.Collect().histogram.sample_count, 1u);
  EXPECT_EQ(decode_metrics_.inter_token_latency.Collect().histogram.sample_count, 19u);
}

// The KV session opens only once the prompt starts (as the prefill service
// does): attached while the prompt computes, or only after it was computed
// (the first token then waits for it, and the blocks are held meanwhile),
// the KV arrives and the stream equals one process's.
TEST_F(DisaggregatedEnginesTest, ASessionAttachedOnceThePromptStartedCarriesItsKv) {
  auto decode = MakeDecode();
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt = {256, 60, 61, 62, 63, 64, 65, 66, 67, 68, 69, 70};
  const engine::SamplingParams params{
      .temperature = 0.7f, .seed = 31, .max_tokens = 10, .ignore_eos = true};
  auto expected = engine::GenerateLocally(*Runner(model_, 16), prompt, params);
  ASSERT_TRUE(expected.ok());
  for (const bool late : {false, true}) {
    SCOPED_TRACE(late ? "attached after the prompt was computed" : "attached once started");
    auto stream = decode->Admit({.request_id = "r", .prompt = prompt, .sampling = params});
    ASSERT_TRUE(stream.ok()) << stream.status();
    auto ticket = prefill->Submit({.request_id = "r", .prompt = prompt, .sampling = params});
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    // Not started: nothing to attach yet. Started: the caller opens it.
    const prefill::PrefillProgress started = (*ticket)->Await(absl::Seconds(20), false);
    ASSERT_TRUE(started.started);
    if (late) {
      // The prompt computes without a session: its first token waits.
      for (int i = 0; i < 20 && prefill->load().has_work; ++i) {
        absl::SleepFor(absl::Milliseconds(10));
      }
      absl::SleepFor(absl::Milliseconds(100));
      absl::StatusOr<prefill::PrefillOutcome> early;
      EXPECT_FALSE((*ticket)->Wait(absl::ZeroDuration(), &early));
      EXPECT_GT(prefill_metrics_.kv_cache_usage.Value(), 0);  // its blocks are held
    }
    prefill->AttachKvSession(*ticket, Session(*prefill, prompt.size(), **stream));
    auto outcome = Await(**ticket);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    Drained d = Drain(**stream);
    ASSERT_TRUE(d.error.ok()) << d.error;
    std::vector<int32_t> all = {outcome->first_token.token};
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    EXPECT_EQ(all, expected->tokens);
    EXPECT_TRUE(DecodeEmpty(*decode));
    EXPECT_TRUE(PrefillEmpty());
  }
}

// A session that cannot be opened fails the request with that status and
// frees its blocks; a cancelled request's late session is aborted.
TEST_F(DisaggregatedEnginesTest, ASessionThatCannotOpenFailsTheRequestAndFreesItsBlocks) {
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt = {256, 7, 8, 9, 10, 11, 12};
  auto ticket =
      prefill->Submit({.request_id = "r", .prompt = prompt, .sampling = {.max_tokens = 4}});
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE((*ticket)->Await(absl::Seconds(20), false).started);
  prefill->AttachKvSession(*ticket, absl::UnavailableError("cannot open KV transfer to x"));
  auto outcome = Await(**ticket);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kUnavailable) << outcome.status();
  EXPECT_NE(outcome.status().message().find("cannot open KV transfer"), absl::string_view::npos);
  EXPECT_TRUE(PrefillEmpty());
  EXPECT_GE(Failures(), 1);
}

// A continuation (the router moving a request after its decode worker
// failed): prompt + the tokens already generated are prefilled and decoded
// elsewhere; the rest of the stream equals the uninterrupted run's, with
// penalties and max_tokens counting the tokens generated before.
TEST_F(DisaggregatedEnginesTest, AContinuationGeneratesTheRestOfTheUninterruptedRun) {
  auto decode = MakeDecode();
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt = {256, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51};
  engine::SamplingParams params{.temperature = 0.9f,
                                .seed = 23,
                                .max_tokens = 24,
                                .ignore_eos = true,
                                .presence_penalty = 0.5f,
                                .frequency_penalty = 0.3f};
  auto expected = engine::GenerateLocally(*Runner(model_, 16), prompt, params);
  ASSERT_TRUE(expected.ok());
  ASSERT_EQ(expected->tokens.size(), 24u);
  for (int cut : {1, 9, 23}) {
    SCOPED_TRACE(cut);
    const std::vector<int32_t> generated(expected->tokens.begin(), expected->tokens.begin() + cut);
    auto stream = decode->Admit(
        {.request_id = "r", .prompt = prompt, .generated = generated, .sampling = params});
    ASSERT_TRUE(stream.ok()) << stream.status();
    auto ticket = prefill->Submit(
        {.request_id = "r",
         .prompt = prompt,
         .generated = generated,
         .sampling = params,
         .kv_session = Session(*prefill, prompt.size() + generated.size(), **stream)});
    ASSERT_TRUE(ticket.ok()) << ticket.status();
    auto outcome = Await(**ticket);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    Drained d = Drain(**stream);
    ASSERT_TRUE(d.error.ok()) << d.error;
    ASSERT_TRUE(d.finished);
    std::vector<int32_t> all = generated;
    all.push_back(outcome->first_token.token);
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    EXPECT_EQ(all, expected->tokens);
    EXPECT_TRUE(DecodeEmpty(*decode));
  }
  EXPECT_TRUE(PrefillEmpty());
  // Nothing is left to generate: refused on both sides.
  EXPECT_EQ(decode->Admit({.prompt = prompt, .generated = expected->tokens, .sampling = params})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(DisaggregatedEnginesTest, ModelMismatchFailsTheTransferAndFreesBothSides) {
  auto decode = MakeDecode();
  auto other_runner = Runner(WriteModel(4), 64);  // other weights: other fingerprint
  auto prefill = MakePrefill(other_runner.get());
  const std::vector<int32_t> prompt = {1, 2, 3, 4};
  engine::SamplingParams params{.max_tokens = 8};
  auto stream = decode->Admit({.prompt = prompt, .sampling = params});
  ASSERT_TRUE(stream.ok());
  auto session = SenderOf(*prefill).Open(receiver_->endpoint(), (*stream)->transfer_id(),
                                         prefill->SpecFor(prompt.size()));
  if (session.ok()) {  // the refusal may come with the handshake or later
    auto ticket =
        prefill->Submit({.prompt = prompt, .sampling = params, .kv_session = std::move(*session)});
    ASSERT_TRUE(ticket.ok());
    // The prefill's own outcome may go either way (its compute can finish
    // before the refusal arrives); the decode side's error is what counts.
    static_cast<void>(Await(**ticket));
  }
  Drained d = Drain(**stream);
  EXPECT_FALSE(d.error.ok());
  EXPECT_NE(d.error.message().find("fingerprint"), absl::string_view::npos) << d.error;
  EXPECT_TRUE(DecodeEmpty(*decode));
  EXPECT_TRUE(pdserve::testing::PollUntil([&] { return Failures() >= 1; }));
  EXPECT_EQ(prefill_metrics_.kv_transfer_failures.Add({{"reason", "refused"}}).Value(), Failures());
  EXPECT_TRUE(PrefillEmpty());
}

TEST_F(DisaggregatedEnginesTest, KvThatNeverArrivesTimesOut) {
  auto decode = MakeDecode(absl::Milliseconds(100));
  auto stream = decode->Admit({.prompt = {1, 2, 3}, .sampling = {.max_tokens = 4}});
  ASSERT_TRUE(stream.ok());
  Drained d = Drain(**stream);
  EXPECT_EQ(d.error.code(), absl::StatusCode::kDeadlineExceeded) << d.error;
  EXPECT_TRUE(DecodeEmpty(*decode));
}

TEST_F(DisaggregatedEnginesTest, CancelWhileWaitingOrRunningFreesBlocks) {
  auto decode = MakeDecode();
  auto waiting = decode->Admit({.prompt = {1, 2, 3}, .sampling = {.max_tokens = 4}});
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(decode->load().waiting_kv, 1);
  decode->Cancel(**waiting);
  EXPECT_TRUE(DecodeEmpty(*decode));

  // A long request, cancelled while it runs.
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5};
  engine::SamplingParams params{.max_tokens = 200, .ignore_eos = true};
  auto running = decode->Admit({.prompt = prompt, .sampling = params});
  ASSERT_TRUE(running.ok());
  auto ticket = prefill->Submit({.prompt = prompt,
                                 .sampling = params,
                                 .kv_session = Session(*prefill, prompt.size(), **running)});
  ASSERT_TRUE(ticket.ok());
  ASSERT_TRUE(Await(**ticket).ok());
  std::vector<decode::DecodeOutput> outs;
  ASSERT_TRUE(pdserve::testing::PollUntil([&] {
    (*running)->Next(absl::Milliseconds(10), &outs);
    return !outs.empty();
  })) << "no token before cancelling";
  decode->Cancel(**running);
  EXPECT_TRUE(DecodeEmpty(*decode));
}

TEST_F(DisaggregatedEnginesTest, AdmissionChecksInputAndCapacity) {
  auto decode = MakeDecode();
  EXPECT_EQ(decode->Admit({.prompt = {}, .sampling = {.max_tokens = 4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode->Admit({.prompt = {1, 100000}, .sampling = {.max_tokens = 4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decode->Admit({.prompt = {1}, .sampling = {.max_tokens = 300}}).status().code(),
            absl::StatusCode::kInvalidArgument);  // past the context
  // 32 blocks of 16 = 512 slots. Admission reserves the prompt plus the
  // headroom (200 + 32 tokens: 15 blocks), not prompt + max_tokens: two fit,
  // a third does not.
  std::vector<std::shared_ptr<decode::DecodeStream>> held;
  for (int i = 0; i < 2; ++i) {
    auto s =
        decode->Admit({.prompt = std::vector<int32_t>(200, 3), .sampling = {.max_tokens = 50}});
    ASSERT_TRUE(s.ok()) << s.status();
    held.push_back(*s);
  }
  EXPECT_EQ(decode->load().free_blocks, 2);
  EXPECT_EQ(decode->Admit({.prompt = std::vector<int32_t>(200, 3), .sampling = {.max_tokens = 50}})
                .status()
                .code(),
            absl::StatusCode::kResourceExhausted);
  for (auto& s : held) decode->Cancel(*s);
  EXPECT_TRUE(DecodeEmpty(*decode));
  // A request that could never fit a small cache is refused at once, with
  // the sizes in the message.
  auto small_runner = Runner(model_, 8);
  decode::DecodeMetrics small_metrics(registry_small_);
  decode::DecodeEngine small({.max_running = 8}, small_runner.get(), receiver_.get(),
                             &small_metrics);
  absl::Status refused =
      small.Admit({.prompt = std::vector<int32_t>(100, 3), .sampling = {.max_tokens = 100}})
          .status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message().find("whole cache of 8 blocks"), absl::string_view::npos) << refused;
}

TEST_F(DisaggregatedEnginesTest, CancelledPrefillAbortsTheTransfer) {
  auto decode = MakeDecode();
  // A prefill engine whose loop is busy: queue many prompts, cancel the last.
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<int32_t> prompt(64, 9);
  engine::SamplingParams params{.max_tokens = 4};
  std::vector<std::shared_ptr<decode::DecodeStream>> streams;
  std::vector<std::shared_ptr<prefill::PrefillTicket>> tickets;
  for (int i = 0; i < 6; ++i) {
    auto s = decode->Admit({.prompt = prompt, .sampling = params});
    ASSERT_TRUE(s.ok()) << s.status();
    auto t = prefill->Submit({.prompt = prompt,
                              .sampling = params,
                              .kv_session = Session(*prefill, prompt.size(), **s)});
    ASSERT_TRUE(t.ok());
    streams.push_back(*s);
    tickets.push_back(*t);
  }
  prefill->Cancel(tickets.back());
  auto last = Await(*tickets.back());
  // Either it was still queued (CANCELLED) or it had already run.
  if (!last.ok()) {
    EXPECT_EQ(last.status().code(), absl::StatusCode::kCancelled);
    Drained d = Drain(*streams.back());
    EXPECT_FALSE(d.error.ok());
  }
  for (size_t i = 0; i + 1 < streams.size(); ++i) {
    ASSERT_TRUE(Await(*tickets[i]).ok());
    EXPECT_TRUE(Drain(*streams[i]).finished);
  }
  EXPECT_TRUE(DecodeEmpty(*decode));
}

// A burst of prompts that together exceed the prefill worker's KV cache is
// queued and served; it once aborted the process ("Check failed:
// blocks_.Allocate(seq, n).ok()").
TEST_F(DisaggregatedEnginesTest, ABurstBeyondThePrefillCacheIsQueuedNotFatal) {
  auto decode = MakeDecode();
  auto small_runner = Runner(model_, /*blocks=*/8);  // 8 blocks of 16: two 40-token prompts
  auto prefill = MakePrefill(small_runner.get());
  engine::SamplingParams params{.max_tokens = 4, .ignore_eos = true};
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<decode::DecodeStream>> streams;
  std::vector<std::shared_ptr<prefill::PrefillTicket>> tickets;
  for (int i = 0; i < 4; ++i) {
    std::vector<int32_t> prompt(40);
    for (int t = 0; t < 40; ++t) prompt[t] = (t * 7 + i * 13) % 250;
    auto s = decode->Admit({.prompt = prompt, .sampling = params});
    ASSERT_TRUE(s.ok()) << s.status();
    auto t = prefill->Submit({.prompt = prompt,
                              .sampling = params,
                              .kv_session = Session(*prefill, prompt.size(), **s)});
    ASSERT_TRUE(t.ok()) << t.status();
    prompts.push_back(prompt);
    streams.push_back(*s);
    tickets.push_back(*t);
  }
  auto reference = Runner(model_, 16);
  for (int i = 0; i < 4; ++i) {
    auto outcome = Await(*tickets[i]);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    Drained d = Drain(*streams[i]);
    ASSERT_TRUE(d.finished) << d.error;
    std::vector<int32_t> all = {outcome->first_token.token};
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    EXPECT_EQ(all, engine::GenerateLocally(*reference, prompts[i], params)->tokens);
  }
  EXPECT_TRUE(DecodeEmpty(*decode));
  EXPECT_TRUE(PrefillEmpty());
}

TEST_F(DisaggregatedEnginesTest, ChunkedPrefillGeneratesTheSameTokens) {
  auto decode = MakeDecode();
  auto prefill =
      MakePrefill(prefill_runner_.get(), {.max_batch_tokens = 16, .max_prefill_chunk_tokens = 7});
  engine::SamplingParams params{
      .temperature = 0.8f, .seed = 5, .max_tokens = 6, .ignore_eos = true};
  auto reference = Runner(model_, 16);
  std::vector<std::vector<int32_t>> prompts = {std::vector<int32_t>(30, 11), {}, {3, 4}};
  for (int t = 0; t < 45; ++t) prompts[1].push_back((t * 31 + 2) % 250);
  std::vector<std::shared_ptr<decode::DecodeStream>> streams;
  std::vector<std::shared_ptr<prefill::PrefillTicket>> tickets;
  for (const auto& prompt : prompts) {
    auto s = decode->Admit({.prompt = prompt, .sampling = params});
    ASSERT_TRUE(s.ok()) << s.status();
    auto t = prefill->Submit({.prompt = prompt,
                              .sampling = params,
                              .kv_session = Session(*prefill, prompt.size(), **s)});
    ASSERT_TRUE(t.ok());
    streams.push_back(*s);
    tickets.push_back(*t);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto outcome = Await(*tickets[i]);
    ASSERT_TRUE(outcome.ok()) << outcome.status();
    Drained d = Drain(*streams[i]);
    ASSERT_TRUE(d.finished) << d.error;
    std::vector<int32_t> all = {outcome->first_token.token};
    all.insert(all.end(), d.tokens.begin(), d.tokens.end());
    EXPECT_EQ(all, engine::GenerateLocally(*reference, prompts[i], params)->tokens) << i;
  }
  // Prompts of 30 and 45 tokens in chunks of at most 7: more steps than prompts.
  EXPECT_GE(prefill_metrics_.batch_tokens.Collect().histogram.sample_count, 7u);
  EXPECT_TRUE(PrefillEmpty());
}

// A runner that lets steps start only as the test allows.
class GatedRunner final : public engine::ModelRunner {
 public:
  explicit GatedRunner(engine::ModelRunner* inner) : inner_(inner) {}
  void Allow(int steps) {
    absl::MutexLock lock(&mu_);
    permits_ += steps;
  }
  int started() {
    absl::MutexLock lock(&mu_);
    return started_;
  }
  absl::StatusOr<std::unique_ptr<engine::StepHandle>> Enqueue(engine::StepBatch batch) override {
    {
      absl::MutexLock lock(&mu_);
      auto allowed = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return permits_ > 0; };
      mu_.Await(absl::Condition(&allowed));
      --permits_;
      ++started_;
    }
    return inner_->Enqueue(std::move(batch));
  }
  const engine::ModelConfig& config() const override { return inner_->config(); }
  std::string_view backend() const override { return inner_->backend(); }
  uint64_t fingerprint() const override { return inner_->fingerprint(); }
  engine::KvDtype kv_dtype() const override { return inner_->kv_dtype(); }
  int num_kv_blocks() const override { return inner_->num_kv_blocks(); }
  int kv_block_size() const override { return inner_->kv_block_size(); }
  int64_t DecodeWeightBytes() const override { return inner_->DecodeWeightBytes(); }
  std::span<const engine::KvRegion> kv_regions() const override { return inner_->kv_regions(); }
  size_t LayerKvBytes(int n) const override { return inner_->LayerKvBytes(n); }
  absl::Status ReadLayerKv(int layer, std::span<const int32_t> table, int n,
                           std::span<std::byte> out) const override {
    return inner_->ReadLayerKv(layer, table, n, out);
  }
  absl::Status WriteLayerKv(int layer, std::span<const int32_t> table, int n,
                            std::span<const std::byte> in) override {
    return inner_->WriteLayerKv(layer, table, n, in);
  }

 private:
  engine::ModelRunner* const inner_;
  absl::Mutex mu_;
  int permits_ ABSL_GUARDED_BY(mu_) = 0;
  int started_ ABSL_GUARDED_BY(mu_) = 0;
};

// Starts `prompts` through `prefill` into `decode`, all at once, and
// returns each request's tokens (first token included) once every stream
// has ended; an empty vector for a request that failed (with ADD_FAILURE).
// `params_of(i, /*decode=*/b)` gives request i's sampling on each side (as
// each worker compiles its own constraint). `submitted`, when given, runs
// once every prompt is submitted, before any stream is read.
std::vector<std::vector<int32_t>> RunAll(
    prefill::PrefillEngine& prefill, decode::DecodeEngine& decode, kvtransfer::KvSender& sender,
    const std::vector<std::vector<int32_t>>& prompts,
    const std::function<engine::SamplingParams(size_t, bool)>& params_of,
    const std::function<void()>& submitted = {}) {
  std::vector<std::shared_ptr<decode::DecodeStream>> streams;
  std::vector<std::shared_ptr<prefill::PrefillTicket>> tickets;
  // Every reservation first: a request admitted after others started
  // decoding could find their growth holding every block (and be refused,
  // as a full decode worker refuses).
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto s = decode.Admit({.prompt = prompts[i], .sampling = params_of(i, true)});
    EXPECT_TRUE(s.ok()) << s.status();
    if (!s.ok()) return {};
    streams.push_back(*s);
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int32_t>& prompt = prompts[i];
    auto session = sender.Open(decode.kv_endpoint(), streams[i]->transfer_id(),
                               prefill.SpecFor(prompt.size()));
    EXPECT_TRUE(session.ok()) << session.status();
    if (!session.ok()) return {};
    auto t = prefill.Submit(
        {.prompt = prompt, .sampling = params_of(i, false), .kv_session = std::move(*session)});
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    tickets.push_back(*t);
  }
  if (submitted) submitted();
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    absl::StatusOr<prefill::PrefillOutcome> first = absl::DeadlineExceededError("no outcome");
    tickets[i]->Wait(absl::Seconds(30), &first);
    Drained d = Drain(*streams[i]);
    if (!first.ok() || !d.finished) {
      ADD_FAILURE() << "request " << i << ": " << first.status() << " / " << d.error;
      continue;
    }
    out[i] = {first->first_token.token};
    out[i].insert(out[i].end(), d.tokens.begin(), d.tokens.end());
  }
  return out;
}

std::vector<std::vector<int32_t>> RunAll(prefill::PrefillEngine& prefill,
                                         decode::DecodeEngine& decode, kvtransfer::KvSender& sender,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         const engine::SamplingParams& params,
                                         const std::function<void()>& submitted = {}) {
  return RunAll(
      prefill, decode, sender, prompts, [&](size_t, bool) { return params; }, submitted);
}

// For workloads that must preempt: holds the decode engine's steps at
// `gate` until every stream's KV has arrived, so that all of them decode
// (and grow) together however the prompts' prefills were spread in time.
std::function<void()> OpenWhenAllKvArrived(decode::DecodeEngine& decode, GatedRunner& gate) {
  return [&decode, &gate] {
    EXPECT_TRUE(pdserve::testing::PollUntil([&] { return decode.load().waiting_kv == 0; }))
        << "KV still missing for " << decode.load().waiting_kv << " streams";
    gate.Allow(1 << 30);
  };
}

TEST_F(DisaggregatedEnginesTest, APrefixCacheHitGeneratesWhatAMissGenerates) {
  auto decode = MakeDecode();
  auto prefill = MakePrefill(prefill_runner_.get());  // prefix caching on by default
  engine::SamplingParams params{
      .temperature = 0.9f, .seed = 21, .max_tokens = 8, .ignore_eos = true};
  // A 50-token "system prompt" (three full blocks of 16) and three questions.
  std::vector<int32_t> system;
  for (int t = 0; t < 50; ++t) system.push_back((t * 37 + 11) % 250);
  std::vector<std::vector<int32_t>> prompts;
  for (int q = 0; q < 3; ++q) {
    std::vector<int32_t> p = system;
    for (int t = 0; t < 5 + 4 * q; ++t) p.push_back((t * 13 + q * 7 + 1) % 250);
    prompts.push_back(p);
  }
  auto reference = Runner(model_, 16);
  // One after the other: the first computes the prefix, the others hit it.
  for (size_t i = 0; i < prompts.size(); ++i) {
    const double hits_before = prefill_metrics_.prefix_cache_hits.Value();
    std::vector<std::vector<int32_t>> got =
        RunAll(*prefill, *decode, SenderOf(*prefill), {prompts[i]}, params);
    ASSERT_EQ(got.size(), 1u);
    EXPECT_EQ(got[0], engine::GenerateLocally(*reference, prompts[i], params)->tokens) << i;
    EXPECT_EQ(prefill_metrics_.prefix_cache_hits.Value() - hits_before, i == 0 ? 0 : 48) << i;
    EXPECT_TRUE(PrefillEmpty());
  }
  EXPECT_EQ(prefill_metrics_.prefix_cache_queries.Value(),
            static_cast<double>(prompts[0].size() + prompts[1].size() + prompts[2].size()));
  // The router's digest names the cached prefix at its digest positions.
  const std::vector<uint64_t> digest = prefill->load().cached_block_hashes;
  const std::vector<uint64_t> hashes = engine::BlockHashDigests(system, 16);
  for (int b = 0; b < 3; ++b) {
    EXPECT_NE(std::find(digest.begin(), digest.end(), hashes[b]), digest.end()) << b;
  }
  EXPECT_TRUE(DecodeEmpty(*decode));
}

TEST_F(DisaggregatedEnginesTest, WithoutPrefixCachingNothingIsReused) {
  auto decode = MakeDecode();
  auto prefill = MakePrefill(prefill_runner_.get(), {.enable_prefix_caching = false});
  engine::SamplingParams params{.max_tokens = 2};
  const std::vector<int32_t> prompt(40, 5);
  for (int i = 0; i < 2; ++i)
    ASSERT_EQ(RunAll(*prefill, *decode, SenderOf(*prefill), {prompt}, params).size(), 1u);
  EXPECT_EQ(prefill_metrics_.prefix_cache_queries.Value(), 0);
  EXPECT_EQ(prefill_metrics_.prefix_cache_hits.Value(), 0);
  EXPECT_TRUE(prefill->load().cached_block_hashes.empty());
}

// Decode KV for 6 requests of 20 + 60 tokens would be 36 blocks of 16; the
// decode worker has 14. Lazy growth admits them all (2 blocks each), and
// growth preempts the newest, which are recomputed later on the decode
// worker: every stream must still equal an uninterrupted generation.
class PreemptionTest : public DisaggregatedEnginesTest, public ::testing::WithParamInterface<bool> {
 protected:
  // A decode engine on a runner of 14 blocks (the transfer writes into its
  // own KV regions), prefix caching as the parameter says.
  std::unique_ptr<decode::DecodeEngine> SmallDecode() {
    small_runner_ = Runner(model_, 14);
    auto receiver = kvtransfer::TcpKvReceiver::Create("127.0.0.1", 0, small_runner_->kv_regions());
    EXPECT_TRUE(receiver.ok()) << receiver.status();
    if (!receiver.ok()) return nullptr;
    small_receiver_ = std::move(*receiver);
    gate_ = std::make_unique<GatedRunner>(small_runner_.get());
    return std::make_unique<decode::DecodeEngine>(
        decode::DecodeEngineOptions{.max_running = 8,
                                    .kv_headroom_tokens = 8,
                                    .enable_prefix_caching = GetParam(),
                                    .recompute_chunk_tokens = 24},
        gate_.get(), small_receiver_.get(), &decode_metrics_);
  }
  // Six prompts of 20 tokens.
  static std::vector<std::vector<int32_t>> Prompts() {
    std::vector<std::vector<int32_t>> prompts;
    for (int r = 0; r < 6; ++r) {
      std::vector<int32_t> p;
      for (int t = 0; t < 20; ++t) p.push_back((t * 17 + r * 29 + 3) % 250);
      prompts.push_back(p);
    }
    return prompts;
  }

  std::unique_ptr<engine::ModelRunner> small_runner_;
  std::unique_ptr<GatedRunner> gate_;  // the decode engine's steps
  std::unique_ptr<kvtransfer::KvReceiver> small_receiver_;
};

TEST_P(PreemptionTest, PreemptedStreamsResumeExactly) {
  auto decode = SmallDecode();
  ASSERT_NE(decode, nullptr);
  auto prefill = MakePrefill(prefill_runner_.get());
  engine::SamplingParams params{
      .temperature = 0.8f, .seed = 3, .max_tokens = 60, .ignore_eos = true};
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  std::vector<std::vector<int32_t>> got = RunAll(*prefill, *decode, SenderOf(*prefill), prompts,
                                                 params, OpenWhenAllKvArrived(*decode, *gate_));
  ASSERT_EQ(got.size(), prompts.size());
  auto reference = Runner(model_, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    // The first token comes from the prefill worker, the rest from the
    // decode worker's stream: no gap, no repeat, the same draws.
    EXPECT_EQ(got[i], engine::GenerateLocally(*reference, prompts[i], params)->tokens) << i;
  }
  EXPECT_GT(decode_metrics_.preemptions.Value(), 0) << "the workload must preempt";
  EXPECT_TRUE(DecodeEmpty(*decode));
}

// The same workload under a JSON Schema (structured output): each worker
// compiles its own constraint, as the services do, and a preempted
// sequence is recomputed and resumes under the mask of its own history.
// Every reply parses, validates and equals one process's run of the same
// constrained request.
TEST_P(PreemptionTest, PreemptedConstrainedStreamsResumeUnderTheSameMask) {
  ASSERT_TRUE(engine::WriteDemoTokenizer(TinyConfig().vocab_size, model_).ok());
  auto grammars = engine::grammar::CreateGrammarCompiler(model_, TinyConfig());
  ASSERT_TRUE(grammars.ok()) << grammars.status();
  const nlohmann::ordered_json schema = testing::LongSchema(/*min_tags=*/5);
  const std::string spec = testing::SpecOf(schema);
  auto decode = SmallDecode();
  ASSERT_NE(decode, nullptr);
  auto prefill = MakePrefill(prefill_runner_.get());
  const std::vector<std::vector<int32_t>> prompts = Prompts();
  std::vector<engine::SamplingParams> params;
  for (int r = 0; r < 6; ++r) {
    params.push_back({.temperature = 0.8f, .seed = 3u + r, .max_tokens = 90});
  }
  std::vector<std::vector<int32_t>> got = RunAll(
      *prefill, *decode, SenderOf(*prefill), prompts,
      [&](size_t i, bool) { return testing::Constrained(params[i], **grammars, spec); },
      OpenWhenAllKvArrived(*decode, *gate_));
  ASSERT_EQ(got.size(), prompts.size());
  auto reference = Runner(model_, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto expected = engine::GenerateLocally(*reference, prompts[i],
                                            testing::Constrained(params[i], **grammars, spec));
    ASSERT_TRUE(expected.ok()) << expected.status();
    EXPECT_EQ(got[i], expected->tokens) << i;
    EXPECT_EQ(expected->finish_reason, engine::FinishReason::kStop) << i;
    EXPECT_EQ(testing::ReplyViolation(schema, testing::TextOf((*grammars)->vocab(), got[i])), "")
        << i;
  }
  EXPECT_GT(decode_metrics_.preemptions.Value(), 0) << "the workload must preempt";
  EXPECT_TRUE(DecodeEmpty(*decode));
}

INSTANTIATE_TEST_SUITE_P(PrefixCaching, PreemptionTest, ::testing::Bool());

// Speculative decoding (n-gram proposals) in the decode worker, in a cache
// small enough to preempt: the streams carry exactly the tokens of one
// process without speculation, greedy or seeded, and the metrics count what
// was proposed and kept.
class SpeculativeDecodeTest : public DisaggregatedEnginesTest,
                              public ::testing::WithParamInterface<float> {};

TEST_P(SpeculativeDecodeTest, StreamsAreTheTokensOfPlainDecoding) {
  auto small_runner = Runner(model_, 15);
  auto small_receiver =
      kvtransfer::TcpKvReceiver::Create("127.0.0.1", 0, small_runner->kv_regions());
  ASSERT_TRUE(small_receiver.ok()) << small_receiver.status();
  auto spec = engine::spec::CreateSpecDecoder(
      {.method = engine::spec::SpecMethod::kNgram, .num_speculative_tokens = 4, .max_batch = 0},
      *small_runner);
  ASSERT_TRUE(spec.ok()) << spec.status();
  GatedRunner gate(small_runner.get());
  auto decode = std::make_unique<decode::DecodeEngine>(
      decode::DecodeEngineOptions{
          .max_running = 8, .kv_headroom_tokens = 8, .recompute_chunk_tokens = 24},
      &gate, small_receiver->get(), &decode_metrics_, *std::move(spec));
  auto prefill = MakePrefill(prefill_runner_.get());
  engine::SamplingParams params{
      .temperature = GetParam(), .seed = 5, .max_tokens = 60, .ignore_eos = true};
  std::vector<std::vector<int32_t>> prompts;
  for (int r = 0; r < 5; ++r) {
    std::vector<int32_t> p;
    for (int t = 0; t < 24; ++t) p.push_back((t % 6 * 17 + r * 29 + 3) % 250);  // repeats
    prompts.push_back(p);
  }
  std::vector<std::vector<int32_t>> got = RunAll(*prefill, *decode, SenderOf(*prefill), prompts,
                                                 params, OpenWhenAllKvArrived(*decode, gate));
  ASSERT_EQ(got.size(), prompts.size());
  auto reference = Runner(model_, 16);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(got[i], engine::GenerateLocally(*reference, prompts[i], params)->tokens) << i;
  }
  EXPECT_GT(decode_metrics_.preemptions.Value(), 0) << "the workload must preempt";
  EXPECT_GT(decode_metrics_.spec.proposed_tokens.Value(), 0);
  EXPECT_GT(decode_metrics_.spec.accepted_tokens.Value(), 0);
  EXPECT_EQ(decode_metrics_.spec.acceptance_length.Collect().histogram.sample_count,
            decode_metrics_.spec.verifications.Value());
  // Every generated token counted once, however many a step brought.
  EXPECT_EQ(decode_metrics_.generation_tokens.Value(), prompts.size() * 59.0);
  EXPECT_TRUE(DecodeEmpty(*decode));
}

INSTANTIATE_TEST_SUITE_P(Temperature, SpeculativeDecodeTest, ::testing::Values(0.0f, 0.1f));

// A prompt that waits for blocks KV sends hold starts as soon as a send is
// done and frees them (the loop is woken by the release), never at a later
// poll of the engine loop.
TEST_F(DisaggregatedEnginesTest, APromptWaitingForBlocksStartsWhenASendFreesThem) {
  auto decode = MakeDecode();
  // 4 blocks of 16: the first prompt holds all of them until its KV is read.
  auto small_runner = Runner(model_, 4);
  auto prefill = MakePrefill(small_runner.get());
  const engine::SamplingParams params{.max_tokens = 4, .ignore_eos = true};
  const std::vector<int32_t> first(60, 21);
  const std::vector<int32_t> second(30, 22);
  auto first_stream = decode->Admit({.prompt = first, .sampling = params});
  auto second_stream = decode->Admit({.prompt = second, .sampling = params});
  ASSERT_TRUE(first_stream.ok() && second_stream.ok());
  auto first_ticket = prefill->Submit(
      {.prompt = first, .sampling = params, .kv_session = Session(*prefill, 60, **first_stream)});
  auto second_ticket = prefill->Submit(
      {.prompt = second, .sampling = params, .kv_session = Session(*prefill, 30, **second_stream)});
  ASSERT_TRUE(first_ticket.ok() && second_ticket.ok());
  ASSERT_TRUE(Await(**first_ticket).ok());
  ASSERT_TRUE(Await(**second_ticket).ok());
  EXPECT_TRUE(Drain(**first_stream).finished);
  EXPECT_TRUE(Drain(**second_stream).finished);
  // Every plan that found work was started by an event (an arrival, a step's
  // end, blocks freed), none by the idle poll.
  EXPECT_EQ(prefill->wake_stats().poll_found_work, 0u);
  EXPECT_GE(prefill->wake_stats().event_wakeups, 1u);
}

TEST_F(DisaggregatedEnginesTest, CancelStopsAChunkedPromptAtTheNextChunk) {
  auto decode = MakeDecode();
  GatedRunner gated(prefill_runner_.get());
  // One token per step: a 240-token prompt takes 240 steps.
  auto prefill = MakePrefill(&gated, {.max_prefill_chunk_tokens = 1});
  const std::vector<int32_t> prompt(240, 17);
  engine::SamplingParams params{.max_tokens = 4};
  auto stream = decode->Admit({.prompt = prompt, .sampling = params});
  ASSERT_TRUE(stream.ok()) << stream.status();
  auto ticket = prefill->Submit({.prompt = prompt,
                                 .sampling = params,
                                 .kv_session = Session(*prefill, prompt.size(), **stream)});
  ASSERT_TRUE(ticket.ok());
  gated.Allow(3);
  // The fourth step is planned and waits at the gate: the prompt is mid-way.
  ASSERT_TRUE(pdserve::testing::PollUntil([&] { return gated.started() >= 3; }));
  ASSERT_EQ(gated.started(), 3);
  prefill->Cancel(*ticket);
  gated.Allow(1000);
  auto outcome = Await(**ticket);
  EXPECT_EQ(outcome.status().code(), absl::StatusCode::kCancelled) << outcome.status();
  EXPECT_LE(gated.started(), 4);             // the step in flight at the cancel, no more
  EXPECT_FALSE(Drain(**stream).error.ok());  // the transfer was aborted
  EXPECT_TRUE(DecodeEmpty(*decode));
  EXPECT_TRUE(PrefillEmpty());
}

// A KV session that keeps Finish's `done` for the test to call.
class HeldSession final : public kvtransfer::SendSession {
 public:
  absl::Status SendLayer(const kvtransfer::LayerChunk&) override { return absl::OkStatus(); }
  void Finish(int32_t, std::function<void(absl::Status)> done) override {
    absl::MutexLock lock(&mu_);
    done_ = std::move(done);
  }
  void Abort(const absl::Status&) override {}
  static std::function<void(absl::Status)> Take(HeldSession* s) {
    for (int i = 0; i < 2000; ++i) {
      {
        absl::MutexLock lock(&s->mu_);
        if (s->done_) return std::move(s->done_);
      }
      absl::SleepFor(absl::Milliseconds(5));
    }
    return nullptr;
  }

 private:
  absl::Mutex mu_;
  std::function<void(absl::Status)> done_ ABSL_GUARDED_BY(mu_);
};

// Prefills a short prompt into a HeldSession; returns its `done` (empty on failure).
std::function<void(absl::Status)> PrefillIntoHeldSession(prefill::PrefillEngine& prefill) {
  auto session = std::make_unique<HeldSession>();
  HeldSession* held = session.get();
  auto ticket = prefill.Submit(
      {.prompt = {1, 2, 3}, .sampling = {.max_tokens = 2}, .kv_session = std::move(session)});
  if (!ticket.ok()) return nullptr;
  absl::StatusOr<prefill::PrefillOutcome> out = absl::DeadlineExceededError("no outcome");
  if (!(*ticket)->Wait(absl::Seconds(20), &out) || !out.ok()) return nullptr;
  return HeldSession::Take(held);
}

TEST_F(DisaggregatedEnginesTest, PromptBlocksAreHeldUntilTheSendIsDone) {
  auto prefill = MakePrefill(prefill_runner_.get());
  std::function<void(absl::Status)> done = PrefillIntoHeldSession(*prefill);
  ASSERT_TRUE(done);
  // The first token is out, but the transport may still read the blocks.
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_GT(prefill_metrics_.kv_cache_usage.Value(), 0);
  done(absl::OkStatus());
  EXPECT_TRUE(PrefillEmpty());
}

// The drain timeout outlasts the test: a destructor that slept through the
// ack instead of returning on it would hold the test until ctest's timeout.
TEST_F(DisaggregatedEnginesTest, DestructorReturnsAsSoonAsSendsAreAcknowledged) {
  auto prefill = MakePrefill(prefill_runner_.get(), {.send_drain_timeout = absl::Minutes(30)});
  std::function<void(absl::Status)> done = PrefillIntoHeldSession(*prefill);
  ASSERT_TRUE(done);
  // The receiver's ack arrives, most likely, during the destructor's wait.
  std::thread acker([&done] {
    absl::SleepFor(absl::Milliseconds(200));
    done(absl::OkStatus());
  });
  prefill.reset();
  acker.join();
  EXPECT_EQ(Failures(), 0);
}

TEST_F(DisaggregatedEnginesTest, ASendCompletingAfterShutdownLeavesTheMetricsAlone) {
  auto prefill = MakePrefill(prefill_runner_.get(), {.send_drain_timeout = absl::Milliseconds(20)});
  std::function<void(absl::Status)> done = PrefillIntoHeldSession(*prefill);
  ASSERT_TRUE(done);
  prefill.reset();  // gives up waiting after 20 ms; the session is gone too
  // The transport reports the transfer's end after the engine is gone (as
  // a sender shutting down does): the engine's metrics must not be written.
  done(absl::UnavailableError("kv sender shutting down"));
  EXPECT_EQ(Failures(), 0);
  EXPECT_EQ(prefill_metrics_.kv_transfer_bytes.Value(), 0);
}

}  // namespace
}  // namespace pdserve
