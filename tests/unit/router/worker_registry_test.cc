#include "router/worker_registry.h"

#include <utility>
#include <vector>

#include "engine/kvcache/kv_cache_manager.h"
#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1000);

WorkerDesc Desc(const std::string& id, Role role, uint64_t fingerprint = 42) {
  return WorkerDesc{.id = id,
                    .role = role,
                    .address = id + ":1",
                    .kv_endpoint = role == Role::kDecode ? "tcp://x:2" : "",
                    .model_fingerprint = fingerprint,
                    .kv_block_size = 16};
}

// The router's pool watcher: registry activity every 250 ms in [from, to).
void Tick(WorkerRegistry& registry, absl::Time from, absl::Time to) {
  for (absl::Time t = from; t < to; t += absl::Milliseconds(250)) {
    registry.CountLive(Role::kDecode, t);
  }
}

// A router stopped for longer than the ttl (SIGSTOP, a starved process)
// heard no heartbeats meanwhile: on resume every worker gets one ttl to be
// heard instead of the whole pool expiring at once. Workers that stay
// silent after that expire as usual.
TEST(WorkerRegistryTest, ARouterPausedLongerThanTheTtlDoesNotExpireItsPool) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d2", Role::kDecode), {}, kT0).ok());
  Tick(registry, kT0, kT0 + absl::Seconds(1));
  // Paused from kT0 + 1 s to kT0 + 11 s: nothing ran.
  const absl::Time resume = kT0 + absl::Seconds(11);
  EXPECT_EQ(registry.Live(Role::kDecode, resume).size(), 2u);
  EXPECT_EQ(registry.Live(Role::kPrefill, resume).size(), 1u);
  // d1 and p1 are heard within the grace, and go on; d2 is not.
  Tick(registry, resume, resume + absl::Seconds(1));
  for (absl::Time t = resume + absl::Seconds(1); t < resume + absl::Milliseconds(3500);
       t += absl::Milliseconds(250)) {
    EXPECT_TRUE(registry.Heartbeat("d1", {}, t));
    EXPECT_TRUE(registry.Heartbeat("p1", {}, t));
  }
  auto live = registry.Live(Role::kDecode, resume + absl::Milliseconds(3500));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].desc.id, "d1");
  EXPECT_EQ(registry.CountLive(Role::kPrefill, resume + absl::Milliseconds(3500)), 1);
}

// Without a pause, a silent worker expires one ttl after it was last heard
// while another worker is heard, however many other calls happen meanwhile.
TEST(WorkerRegistryTest, ASilentWorkerExpiresWhileTheRouterRuns) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  for (absl::Time t = kT0; t < kT0 + absl::Milliseconds(3250); t += absl::Milliseconds(250)) {
    EXPECT_TRUE(registry.Heartbeat("p1", {}, t));
    registry.CountLive(Role::kDecode, t);
  }
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Seconds(3)), 1);
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Milliseconds(3250)), 0);
}

// While no worker at all is heard (the router's heartbeat intake starved
// while requests still ran through it, or the whole machine starved), the
// pool does not empty after one ttl: heartbeats that arrive within two
// ttls keep every worker; one that stays silent longer expires.
TEST(WorkerRegistryTest, WhenNobodyIsHeardThePoolWaitsTwoTtls) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d2", Role::kDecode), {}, kT0).ok());
  Tick(registry, kT0, kT0 + absl::Seconds(5));  // requests run; no heartbeat
  EXPECT_EQ(registry.Live(Role::kDecode, kT0 + absl::Seconds(5)).size(), 2u);
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0 + absl::Seconds(5)).size(), 1u);
  // The stalled heartbeats arrive together, d2's not: the first does not
  // expire the others; once the others have been heard for half a ttl,
  // d2's silence counts, and it expires.
  EXPECT_TRUE(registry.Heartbeat("p1", {}, kT0 + absl::Seconds(5)));
  EXPECT_TRUE(registry.Heartbeat("d1", {}, kT0 + absl::Milliseconds(5001)));
  EXPECT_EQ(registry.Live(Role::kDecode, kT0 + absl::Milliseconds(5250)).size(), 2u);
  for (absl::Time t = kT0 + absl::Milliseconds(5250); t <= kT0 + absl::Seconds(6);
       t += absl::Milliseconds(250)) {
    EXPECT_TRUE(registry.Heartbeat("p1", {}, t));
    EXPECT_TRUE(registry.Heartbeat("d1", {}, t));
  }
  EXPECT_EQ(registry.Live(Role::kDecode, kT0 + absl::Seconds(6)).size(), 2u);
  // Half a ttl after the heartbeats resumed (5 s), and past two ttls: d2 goes.
  auto live = registry.Live(Role::kDecode, kT0 + absl::Milliseconds(6500));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].desc.id, "d1");
  // A lone worker's silence: dropped after two ttls.
  WorkerRegistry lone(absl::Seconds(3));
  ASSERT_TRUE(lone.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  Tick(lone, kT0, kT0 + absl::Seconds(6));
  EXPECT_EQ(lone.CountLive(Role::kDecode, kT0 + absl::Seconds(6)), 1);
  EXPECT_EQ(lone.CountLive(Role::kDecode, kT0 + absl::Milliseconds(6250)), 0);
}

// A worker whose connection a call found broken is not offered until it is
// heard from again; a live one is back after its next heartbeat.
TEST(WorkerRegistryTest, ALostConnectionHidesTheWorkerUntilItIsHeardFrom) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d2", Role::kDecode), {}, kT0).ok());
  registry.ReportDisconnected("d1");
  registry.ReportDisconnected("unknown");  // no effect
  EXPECT_EQ(registry.Judge("d1", 0, kT0).health, WorkerHealth::kDisconnected);
  auto live = registry.Live(Role::kDecode, kT0);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].desc.id, "d2");
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0), 2);  // still registered
  EXPECT_TRUE(registry.Heartbeat("d1", {}, kT0 + absl::Milliseconds(200)));
  EXPECT_EQ(registry.Live(Role::kDecode, kT0 + absl::Milliseconds(200)).size(), 2u);
}

TEST(WorkerRegistryTest, RegisterHeartbeatAndExpire) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d2", Role::kDecode), {}, kT0).ok());
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0).size(), 1u);
  EXPECT_EQ(registry.Live(Role::kDecode, kT0).size(), 2u);

  // d1 keeps beating, d2 goes silent.
  EXPECT_TRUE(registry.Heartbeat("d1", {.running_sequences = 3}, kT0 + absl::Seconds(2)));
  EXPECT_TRUE(registry.Heartbeat("p1", {}, kT0 + absl::Seconds(2)));
  auto live = registry.Live(Role::kDecode, kT0 + absl::Seconds(4));
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].desc.id, "d1");
  EXPECT_EQ(live[0].load.running_sequences, 3);
  // An expired worker is told it is unknown and must register again.
  EXPECT_FALSE(registry.Heartbeat("d2", {}, kT0 + absl::Seconds(4)));
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Seconds(4)), 1);
  registry.Deregister("d1");
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0 + absl::Seconds(4)), 0);
}

TEST(WorkerRegistryTest, DrainingWorkersAreNotOffered) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  EXPECT_TRUE(registry.Heartbeat("d1", {.draining = true}, kT0));
  EXPECT_TRUE(registry.Live(Role::kDecode, kT0).empty());
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0), 1);
}

TEST(WorkerRegistryTest, RejectsBadRegistrations) {
  WorkerRegistry registry(absl::Seconds(3));
  EXPECT_EQ(registry.Register(Desc("", Role::kPrefill), {}, kT0).code(),
            absl::StatusCode::kInvalidArgument);
  WorkerDesc no_kv = Desc("d", Role::kDecode);
  no_kv.kv_endpoint.clear();
  EXPECT_EQ(registry.Register(no_kv, {}, kT0).code(), absl::StatusCode::kInvalidArgument);
}

// The router's own model is the reference: a worker of another model is
// refused whatever registered before it (it cannot lock the right ones
// out), and the refusal names the field that differs, not the values.
TEST(WorkerRegistryTest, WorkersAreComparedWithTheRoutersModelNamingTheField) {
  WorkerRegistry registry(RegistryOptions{.ttl = absl::Seconds(3),
                                          .reference = {.config_fingerprint = 7,
                                                        .checkpoint_fingerprint = 8,
                                                        .weight_dtype = "int4",
                                                        .kv_dtype = "f32"}});
  auto desc = [](const std::string& id, uint64_t config, uint64_t checkpoint, const std::string& kv,
                 const std::string& weights = "int4") {
    WorkerDesc d = Desc(id, Role::kDecode);
    d.config_fingerprint = config;
    d.checkpoint_fingerprint = checkpoint;
    d.weight_dtype = weights;
    d.kv_dtype = kv;
    d.kv_layout = "paged_nhd";
    return d;
  };
  struct Case {
    WorkerDesc worker;
    std::string field;  // empty: accepted
  };
  const Case cases[] = {
      {desc("other-config", 9, 8, "f32"), "config"},
      {desc("other-weights", 7, 9, "f32"), "weights"},
      {desc("cuda-kv", 7, 8, "bf16"), "kv_dtype"},
      {desc("int8-weights", 7, 8, "f32", "int8"), "weight_dtype"},
      {desc("right", 7, 8, "f32"), ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.worker.id);
    const absl::Status s = registry.Register(c.worker, {}, kT0);
    if (c.field.empty()) {
      EXPECT_TRUE(s.ok()) << s;
      continue;
    }
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(s.message().find(c.field + " differs"), absl::string_view::npos) << s;
    EXPECT_EQ(s.message().find("0x"), absl::string_view::npos) << s;  // no raw fingerprints
  }
  EXPECT_EQ(registry.CountLive(Role::kDecode, kT0), 1);
  // Without a KV reference both element types register; pairs are formed
  // only where the KV matches.
  WorkerRegistry open(
      RegistryOptions{.ttl = absl::Seconds(3), .reference = {.config_fingerprint = 7}});
  EXPECT_TRUE(open.Register(desc("cpu", 7, 8, "f32"), {}, kT0).ok());
  EXPECT_TRUE(open.Register(desc("cuda", 7, 8, "bf16"), {}, kT0).ok());
  EXPECT_FALSE(KvCompatible(desc("cpu", 7, 8, "f32"), desc("cuda", 7, 8, "bf16")));
  EXPECT_TRUE(KvCompatible(desc("a", 7, 8, "f32"), desc("b", 7, 8, "f32")));
}

// A worker with work whose step count stops moving is hung after the hang
// timeout, however regularly it heartbeats; moving steps, or no work, keep
// it live; a worker that says it cannot serve is out until it says it can.
TEST(WorkerRegistryTest, LivenessIsJudgedFromTheWorkersProgress) {
  WorkerRegistry registry(
      RegistryOptions{.ttl = absl::Seconds(3), .hang_timeout = absl::Seconds(10)});
  ASSERT_TRUE(registry.Register(Desc("busy", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("hung", Role::kDecode), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("idle", Role::kDecode), {}, kT0).ok());
  for (int s = 1; s <= 24; ++s) {  // 12 s of heartbeats every 500 ms
    const absl::Time t = kT0 + absl::Milliseconds(500 * s);
    registry.Heartbeat("busy", {.progress = static_cast<uint64_t>(s), .has_work = true}, t);
    registry.Heartbeat("hung", {.progress = 5, .has_work = true}, t);
    registry.Heartbeat("idle", {.progress = 5, .has_work = false}, t);
  }
  const absl::Time now = kT0 + absl::Seconds(12);
  EXPECT_EQ(registry.Judge("busy", 0, now).health, WorkerHealth::kLive);
  EXPECT_EQ(registry.Judge("idle", 0, now).health, WorkerHealth::kLive);
  const Judgement hung = registry.Judge("hung", 0, now);
  EXPECT_EQ(hung.health, WorkerHealth::kHung);
  EXPECT_NE(hung.why.find("completed no step"), std::string::npos) << hung.why;
  EXPECT_EQ(registry.Live(Role::kDecode, now).size(), 2u);
  // It steps again: live at once.
  registry.Heartbeat("hung", {.progress = 6, .has_work = true}, now);
  EXPECT_EQ(registry.Judge("hung", 0, now).health, WorkerHealth::kLive);
  // Self-reported.
  registry.Heartbeat("idle", {.unhealthy_reason = "its last 3 steps failed: CUDA error"}, now);
  EXPECT_EQ(registry.Judge("idle", 0, now).health, WorkerHealth::kUnhealthy);
  EXPECT_EQ(registry.Live(Role::kDecode, now).size(), 2u);
  registry.Heartbeat("idle", {}, now);
  EXPECT_EQ(registry.Judge("idle", 0, now).health, WorkerHealth::kLive);
  // Gone: expired, unknown, or a new incarnation since the view was taken.
  const uint64_t incarnation = registry.Live(Role::kDecode, now)[0].incarnation;
  EXPECT_EQ(registry.Judge("nobody", 0, now).health, WorkerHealth::kGone);
  registry.Deregister("busy");
  ASSERT_TRUE(registry.Register(Desc("busy", Role::kDecode), {}, now).ok());
  EXPECT_EQ(registry.Judge("busy", incarnation, now).health, WorkerHealth::kGone);
}

TEST(WorkerRegistryTest, OutstandingIsTracked) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  OutstandingWork a = registry.StartWork("p1", 60);
  OutstandingWork b = registry.StartWork("p1", 40);
  OutstandingWork none = registry.StartWork("unknown", 1);  // empty handle
  b.Release();
  b.Release();  // once only
  auto live = registry.Live(Role::kPrefill, kT0);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].outstanding_requests, 1);
  EXPECT_EQ(live[0].outstanding_tokens, 60);
  OutstandingWork moved = std::move(a);
  a.Release();  // moved-from: no effect
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[0].outstanding_requests, 1);
  moved.Release();
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[0].outstanding_requests, 0);
}

// A load report taken while work was queued still counts it after this
// router saw the work finish; until the next report, views discount what
// finished (a stale report once sent a cached prefix's follow-up elsewhere).
TEST(WorkerRegistryTest, WorkFinishedSinceTheLastReportIsDiscounted) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("d1", Role::kDecode), {}, kT0).ok());
  OutstandingWork prefill = registry.StartWork("p1", 156);
  OutstandingWork decode = registry.StartWork("d1", 156);
  ASSERT_TRUE(registry.Heartbeat("p1", {.queued_prompt_tokens = 200, .queued_requests = 2}, kT0));
  ASSERT_TRUE(registry.Heartbeat("d1", {.running_sequences = 3}, kT0));
  prefill.Release();
  decode.Release();
  WorkerView p = registry.Live(Role::kPrefill, kT0)[0];
  EXPECT_EQ(p.load.queued_prompt_tokens, 44);
  EXPECT_EQ(p.load.queued_requests, 1);
  EXPECT_EQ(registry.Live(Role::kDecode, kT0)[0].load.running_sequences, 2);
  // The next report is taken as it is.
  ASSERT_TRUE(registry.Heartbeat("p1", {.queued_prompt_tokens = 30, .queued_requests = 1}, kT0));
  p = registry.Live(Role::kPrefill, kT0)[0];
  EXPECT_EQ(p.load.queued_prompt_tokens, 30);
  EXPECT_EQ(p.load.queued_requests, 1);
  // Never below zero.
  OutstandingWork big = registry.StartWork("p1", 500);
  big.Release();
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[0].load.queued_prompt_tokens, 0);
}

// A worker dropped for missed heartbeats and registered again starts from
// zero; work sent to it before must not drive its count negative (a negative
// count once made every burst pick that one worker).
TEST(WorkerRegistryTest, WorkOfAnEarlierIncarnationDoesNotCountAgainstTheNewOne) {
  WorkerRegistry registry(absl::Seconds(3));
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  std::vector<OutstandingWork> old_work;
  for (int i = 0; i < 5; ++i) old_work.push_back(registry.StartWork("p1", 100));
  const absl::Time later = kT0 + absl::Seconds(10);
  Tick(registry, kT0, later);                                 // the router runs, p1 is silent
  EXPECT_TRUE(registry.Live(Role::kPrefill, later).empty());  // expired
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, later).ok());
  OutstandingWork fresh = registry.StartWork("p1", 7);
  old_work.clear();  // the old requests end
  auto live = registry.Live(Role::kPrefill, later);
  ASSERT_EQ(live.size(), 1u);
  EXPECT_EQ(live[0].outstanding_requests, 1);
  EXPECT_EQ(live[0].outstanding_tokens, 7);
  // Re-registering while still live (a restart the router saw) keeps counts.
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, later).ok());
  fresh.Release();
  EXPECT_EQ(registry.Live(Role::kPrefill, later)[0].outstanding_requests, 0);
}

// Prompts of `n` tokens sharing a 64-token prefix (four blocks of 16).
std::vector<int32_t> SharedPrefixPrompt(int n, int32_t tail) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = i < 64 ? 1000 + i : tail + i;
  return p;
}

// The digest a worker would report after computing `prompt`: the hashes of
// its full blocks at digest positions, exactly as engine/kvcache makes them.
std::vector<uint64_t> DigestOf(const std::vector<int32_t>& prompt, int block_size) {
  std::vector<uint64_t> out;
  const std::vector<uint64_t> hashes = engine::BlockHashDigests(prompt, block_size);
  for (int i = 0; i < static_cast<int>(hashes.size()); ++i) {
    if (engine::IsDigestPosition(i)) out.push_back(hashes[i]);
  }
  return out;
}

TEST(WorkerRegistryTest, DigestsAndRoutedPrefixesShowInTheViews) {
  WorkerRegistry registry(absl::Seconds(3));
  const std::vector<int32_t> prompt = SharedPrefixPrompt(100, 7);
  const PrefillQuery query(prompt);
  ASSERT_TRUE(registry.Register(Desc("p1", Role::kPrefill), {}, kT0).ok());
  ASSERT_TRUE(registry.Register(Desc("p2", Role::kPrefill), {}, kT0).ok());
  std::vector<WorkerView> live = registry.Live(Role::kPrefill, kT0);
  EXPECT_EQ(CachedPrefixTokens(live[0], query), 0);

  // p1 reports a digest that holds the prompt's 6 lookup blocks (99 tokens
  // before the last): the deepest digest position among them is 3.
  ASSERT_TRUE(registry.Heartbeat("p1", {.cached_block_hashes = DigestOf(prompt, 16)}, kT0));
  live = registry.Live(Role::kPrefill, kT0);
  EXPECT_EQ(CachedPrefixTokens(live[0], query), 64);
  EXPECT_EQ(CachedPrefixTokens(live[1], query), 0);

  // Routed to p2: counted as cached there at once (before any digest), and
  // its outstanding tokens are what it does not hold.
  OutstandingWork work = registry.StartPrefill(live[1], query, kT0);
  live = registry.Live(Role::kPrefill, kT0);
  EXPECT_EQ(CachedPrefixTokens(live[1], query), 64);
  EXPECT_EQ(live[1].outstanding_tokens, 100);
  // A second prompt with the same prefix is counted without its cached part
  // (the view taken after the first was routed knows it).
  const std::vector<int32_t> other = SharedPrefixPrompt(80, 9);
  const PrefillQuery other_query(other);
  OutstandingWork second = registry.StartPrefill(live[1], other_query, kT0);
  EXPECT_EQ(registry.Live(Role::kPrefill, kT0)[1].outstanding_tokens, 100 + 80 - 64);

  // The note outlives digests that do not show it yet, then expires.
  ASSERT_TRUE(registry.Heartbeat("p1", {.cached_block_hashes = DigestOf(prompt, 16)},
                                 kT0 + absl::Seconds(2)));
  ASSERT_TRUE(registry.Heartbeat("p2", {}, kT0 + absl::Seconds(2)));
  EXPECT_EQ(CachedPrefixTokens(registry.Live(Role::kPrefill, kT0 + absl::Seconds(2))[1], query),
            64);
  ASSERT_TRUE(registry.Heartbeat("p1", {}, kT0 + absl::Seconds(4)));
  ASSERT_TRUE(registry.Heartbeat("p2", {}, kT0 + absl::Seconds(4)));
  live = registry.Live(Role::kPrefill, kT0 + absl::Seconds(4));
  EXPECT_EQ(CachedPrefixTokens(live[0], query), 0);  // p1's new digest forgot it
  EXPECT_EQ(CachedPrefixTokens(live[1], query), 0);  // the note expired
}

TEST(WorkerRegistryTest, PromptsAreHashedWithTheWorkersBlockSize) {
  WorkerRegistry registry(absl::Seconds(3));
  WorkerDesc desc = Desc("p1", Role::kPrefill);
  desc.kv_block_size = 8;
  const std::vector<int32_t> prompt = SharedPrefixPrompt(100, 7);
  ASSERT_TRUE(registry.Register(desc, {.cached_block_hashes = DigestOf(prompt, 8)}, kT0).ok());
  const PrefillQuery query(prompt);
  // 12 lookup blocks of 8 (99 tokens); digest positions 0-3 and 7: 8 blocks.
  EXPECT_EQ(CachedPrefixTokens(registry.Live(Role::kPrefill, kT0)[0], query), 64);
  EXPECT_EQ(query.LookupHashes(8).size(), 12u);
  EXPECT_EQ(query.LookupHashes(16).size(), 6u);
  EXPECT_TRUE(query.LookupHashes(0).empty());
}

}  // namespace
}  // namespace pdserve::router
