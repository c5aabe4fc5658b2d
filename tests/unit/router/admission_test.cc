// The router's admission, pure: which requests the pools can take (table of
// worker reports), the queue's order (priority, then arrival; a refused
// request back at the head), its bounds and expiry, and the wait estimate.
#include "router/admission.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

WorkerView Prefill(int64_t queued_tokens, int batch = 1024, double rate = 0) {
  WorkerView w;
  w.desc = {.id = "p", .role = Role::kPrefill, .kv_block_size = 16};
  w.load.queued_prompt_tokens = queued_tokens;
  w.load.max_batch_tokens = batch;
  w.load.tokens_per_second = rate;
  return w;
}

WorkerView Decode(int free_blocks, int running = 0, int max_sequences = 0) {
  WorkerView w;
  w.desc = {.id = "d", .role = Role::kDecode, .kv_block_size = 16, .kv_headroom_tokens = 32};
  w.load.free_kv_blocks = free_blocks;
  w.load.total_kv_blocks = 1000;
  w.load.running_sequences = running;
  w.load.max_sequences = max_sequences;
  return w;
}

TEST(AdmissionTest, CapacityFollowsTheReports) {
  const AdmissionOptions options{.prefill_queue_batches = 4};
  const AdmissionQuery query{.prompt_tokens = 500, .max_tokens = 100};
  struct Case {
    std::string name;
    std::vector<WorkerView> prefill, decode;
    bool fits;
  };
  WorkerView other_kv = Decode(100);
  other_kv.desc.kv_dtype = "bf16";
  const Case cases[] = {
      {"room everywhere", {Prefill(0)}, {Decode(100)}, true},
      {"prefill queue at its bound", {Prefill(3800)}, {Decode(100)}, false},
      {"prefill queue under its bound", {Prefill(3500)}, {Decode(100)}, true},
      {"an empty prefill queue takes any prompt", {Prefill(0, 16)}, {Decode(100)}, true},
      // 500 + 32 headroom tokens need 34 blocks.
      {"decode KV short", {Prefill(0)}, {Decode(33)}, false},
      {"decode KV just enough", {Prefill(0)}, {Decode(34)}, true},
      {"decode slots full", {Prefill(0)}, {Decode(100, 8, 8)}, false},
      {"the only full decode worker takes another KV format",
       {Prefill(0)},
       {Decode(1), other_kv},
       false},
      {"no pair matches at all (placing says so)", {Prefill(0)}, {other_kv}, true},
      {"one of two decode workers fits", {Prefill(0)}, {Decode(1), Decode(100)}, true},
      {"empty pools fit (placing fails clearly)", {}, {Decode(0)}, true},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(HasCapacity(c.prefill, c.decode, query, options), c.fits) << c.name;
  }
  // Reservations started since the last report count against its free KV.
  WorkerView d = Decode(40);
  EXPECT_TRUE(HasCapacity(std::vector{Prefill(0)}, std::vector{d}, query, options));
  d.tokens_since_report = 200;
  EXPECT_FALSE(HasCapacity(std::vector{Prefill(0)}, std::vector{d}, query, options));
}

// With prefill_queue_seconds, a worker is also sent prompts only while its
// queue stays within that many seconds at its reported rate: the rest wait
// at the router, where a worker that joins takes them. A worker reporting
// no rate is bounded by its steps alone; an empty queue takes any prompt.
TEST(AdmissionTest, PrefillQueueSecondsHoldsTheBacklogAtTheRouter) {
  const AdmissionOptions timed{.prefill_queue_batches = 4, .prefill_queue_seconds = 0.5};
  const AdmissionOptions steps_only{.prefill_queue_batches = 4};
  const AdmissionQuery query{.prompt_tokens = 200, .max_tokens = 16};
  const std::vector<WorkerView> decode = {Decode(100)};
  struct Case {
    std::string name;
    WorkerView prefill;
    bool fits_timed, fits_steps_only;
  };
  const Case cases[] = {
      // 1000 tokens/s: 0.5 s is 500 tokens.
      {"300 queued + 200 is 0.5 s", Prefill(300, 1024, 1000), true, true},
      {"301 queued + 200 is over 0.5 s", Prefill(301, 1024, 1000), false, true},
      {"an empty queue takes any prompt", Prefill(0, 1024, 100), true, true},
      {"no rate reported: the steps bound alone", Prefill(3000, 1024, 0), true, true},
      {"the steps bound still holds", Prefill(3900, 1024, 1e6), false, false},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(HasCapacity(std::vector{c.prefill}, decode, query, timed), c.fits_timed) << c.name;
    EXPECT_EQ(HasCapacity(std::vector{c.prefill}, decode, query, steps_only), c.fits_steps_only)
        << c.name;
  }
  // Two workers: the backlog that one holds back goes to the one that joined.
  EXPECT_FALSE(HasCapacity(std::vector{Prefill(450, 1024, 1000)}, decode, query, timed));
  EXPECT_TRUE(HasCapacity(std::vector{Prefill(450, 1024, 1000), Prefill(0, 1024, 0)}, decode, query,
                          timed));
}

TEST(AdmissionTest, QueueOrderIsPriorityThenArrivalAndARefusedRequestGoesFirst) {
  AdmissionQueue q({.max_queued = 10});
  ASSERT_TRUE(q.Push({.ticket = 1, .priority = 0, .enqueued = kT0, .tokens = 10}));
  ASSERT_TRUE(q.Push({.ticket = 2, .priority = 0, .enqueued = kT0, .tokens = 20}));
  ASSERT_TRUE(q.Push({.ticket = 3, .priority = -1, .enqueued = kT0, .tokens = 30}));
  ASSERT_TRUE(q.Push({.ticket = 4, .priority = 5, .enqueued = kT0, .tokens = 40}));
  EXPECT_EQ(q.tokens(), 100);
  std::vector<AdmissionQueue::Ticket> order;
  while (q.Head() != nullptr) {
    order.push_back(q.Head()->ticket);
    if (order.size() == 2) {
      // Ticket 1 had its turn, a worker refused it: back at the head of its
      // priority, ahead of ticket 2.
      ASSERT_TRUE(q.Remove(1));
      ASSERT_TRUE(q.Push({.ticket = 1, .priority = 0, .enqueued = kT0, .tokens = 10}, true));
      order.push_back(q.Head()->ticket);
    }
    q.Remove(q.Head()->ticket);
  }
  EXPECT_EQ(order, (std::vector<AdmissionQueue::Ticket>{3, 1, 1, 2, 4}));
  EXPECT_EQ(q.tokens(), 0);
  EXPECT_FALSE(q.Remove(1));
}

TEST(AdmissionTest, TheQueueIsBoundedAndExpires) {
  AdmissionQueue q({.max_queued = 2, .max_wait = absl::Seconds(60)});
  ASSERT_TRUE(q.Push({.ticket = 1, .enqueued = kT0, .deadline = kT0 + absl::Seconds(5)}));
  ASSERT_TRUE(q.Push({.ticket = 2, .enqueued = kT0}));
  EXPECT_FALSE(q.Push({.ticket = 3, .enqueued = kT0}));
  EXPECT_TRUE(q.Push({.ticket = 3, .enqueued = kT0}, /*front=*/true));  // had its turn already
  EXPECT_TRUE(q.Expire(kT0 + absl::Seconds(4)).empty());
  const auto expired = q.Expire(kT0 + absl::Seconds(5));
  ASSERT_EQ(expired.size(), 1u);
  EXPECT_EQ(expired[0], std::make_pair(AdmissionQueue::Ticket{1}, AdmissionQueue::Why::kDeadline));
  const auto waited = q.Expire(kT0 + absl::Seconds(60));
  EXPECT_EQ(waited.size(), 2u);
  for (const auto& [ticket, why] : waited) EXPECT_EQ(why, AdmissionQueue::Why::kMaxWait);
  EXPECT_EQ(q.size(), 0);
}

TEST(AdmissionTest, TheWaitIsEstimatedFromTheReportedRates) {
  EXPECT_FALSE(EstimateQueueWait(std::vector{Prefill(1000)}, 0).has_value());
  const auto wait =
      EstimateQueueWait(std::vector{Prefill(1000, 1024, 500), Prefill(500, 1024, 500)}, 500);
  ASSERT_TRUE(wait.has_value());
  EXPECT_EQ(*wait, absl::Seconds(2));  // 2000 tokens at 1000 tokens/s
}

}  // namespace
}  // namespace pdserve::router
