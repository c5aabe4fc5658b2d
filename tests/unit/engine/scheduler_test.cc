// The scheduler core, one step at a time: PlanStep against tables of inputs
// and expected plans, then the Scheduler in each role with model execution
// mocked (StepOutput built by hand): admission under a block budget (the
// burst that once aborted the prefill worker), chunking, FCFS, cancellation
// in and out of a step, holding prefill blocks until the KV is read, remote
// admission for decode, failed steps, and a random workload that must never
// lose a block.
#include "engine/scheduler/scheduler.h"

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/scheduler/plan_step.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

// ---- PlanStep tables ----

struct Expected {
  SeqId id;
  int tokens;
  int blocks;
  bool admit;
  bool samples;
};

struct PlanCase {
  std::string name;
  PlanInput input;
  PlanOptions options;
  std::vector<Expected> expected;
  std::vector<SeqId> preempted = {};
  std::vector<SeqId> too_large = {};
};

PlanSeq Waiting(SeqId id, int prompt, int reserve, int block_size) {
  return {.id = id,
          .prompt_len = prompt,
          .num_tokens = prompt,
          .num_computed = 0,
          .reserve_tokens = reserve,
          .admit_blocks = (reserve + block_size - 1) / block_size};
}
// A running sequence past its prompt, preemptable when ready (not awaiting
// its KV), holding `blocks` blocks of its own.
PlanSeq Decoding(SeqId id, int prompt, int generated, int blocks, bool ready = true) {
  return {.id = id,
          .prompt_len = prompt,
          .num_tokens = prompt + generated,
          .num_computed = prompt + generated - 1,
          .num_blocks = blocks,
          .ready = ready,
          .preemptable = ready,
          .free_on_preempt = blocks};
}
PlanSeq MidPrompt(SeqId id, int prompt, int computed, int blocks) {
  return {.id = id,
          .prompt_len = prompt,
          .num_tokens = prompt,
          .num_computed = computed,
          .num_blocks = blocks};
}

class PlanStepTable : public testing::TestWithParam<PlanCase> {};

TEST_P(PlanStepTable, MatchesTheExpectedPlan) {
  const PlanCase& c = GetParam();
  const StepPlan plan = PlanStep(c.input, c.options);
  ASSERT_EQ(plan.seqs.size(), c.expected.size());
  int tokens = 0, blocks = 0;
  for (size_t i = 0; i < c.expected.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(plan.seqs[i].id, c.expected[i].id);
    EXPECT_EQ(plan.seqs[i].num_new_tokens, c.expected[i].tokens);
    EXPECT_EQ(plan.seqs[i].new_blocks, c.expected[i].blocks);
    EXPECT_EQ(plan.seqs[i].admit, c.expected[i].admit);
    EXPECT_EQ(plan.seqs[i].samples, c.expected[i].samples);
    tokens += c.expected[i].tokens;
    blocks += c.expected[i].blocks;
  }
  EXPECT_EQ(plan.num_tokens, tokens);
  EXPECT_EQ(plan.new_blocks, blocks);
  EXPECT_EQ(plan.preempted, c.preempted);
  EXPECT_EQ(plan.too_large, c.too_large);
  // The budget holds, but for one whole prompt over it that runs alone.
  if (plan.seqs.size() > 1) EXPECT_LE(plan.num_tokens, c.options.max_batch_tokens);
  // Never over-commits the cache: what it takes fits in what is free plus
  // what the preempted sequences give back.
  int freed = 0;
  for (SeqId id : plan.preempted) {
    for (const PlanSeq& r : c.input.running) freed += r.id == id ? r.free_on_preempt : 0;
  }
  EXPECT_LE(plan.new_blocks, c.input.free_blocks + freed);
}

std::vector<PlanCase> PlanCases() {
  std::vector<PlanCase> cases;
  // Four 40-token prompts, 16-token blocks, 8 blocks: 3 blocks each, so two
  // are admitted and two wait (this burst once aborted the prefill worker).
  cases.push_back({.name = "BurstBeyondTheCacheIsQueued",
                   .input = {.waiting = {Waiting(1, 40, 40, 16), Waiting(2, 40, 40, 16),
                                         Waiting(3, 40, 40, 16), Waiting(4, 40, 40, 16)},
                             .free_blocks = 8,
                             .block_size = 16},
                   .expected = {{1, 40, 3, true, true}, {2, 40, 3, true, true}}});
  cases.push_back({.name = "NobodyOvertakesTheHead",
                   .input = {.waiting = {Waiting(1, 100, 100, 16), Waiting(2, 4, 4, 16)},
                             .free_blocks = 5,
                             .block_size = 16},
                   .expected = {}});
  cases.push_back({.name = "TokenBudgetStopsAdmission",
                   .input = {.waiting = {Waiting(1, 30, 30, 8), Waiting(2, 30, 30, 8)},
                             .free_blocks = 100,
                             .block_size = 8},
                   .options = {.max_batch_tokens = 50},
                   .expected = {{1, 30, 4, true, true}}});
  cases.push_back({.name = "APromptOverTheBudgetRunsAlone",
                   .input = {.waiting = {Waiting(1, 90, 90, 8), Waiting(2, 5, 5, 8)},
                             .free_blocks = 100,
                             .block_size = 8},
                   .options = {.max_batch_tokens = 50},
                   .expected = {{1, 90, 12, true, true}}});
  cases.push_back({.name = "ChunkedPromptsShareTheBudgetEvenly",
                   .input = {.waiting = {Waiting(1, 90, 90, 8), Waiting(2, 30, 30, 8)},
                             .free_blocks = 100,
                             .block_size = 8},
                   .options = {.max_batch_tokens = 50, .max_prefill_chunk_tokens = 32},
                   .expected = {{1, 25, 12, true, false}, {2, 25, 4, true, false}}});
  cases.push_back(
      {.name = "DecodesFirstThenChunksOfRunningPromptsThenAdmissions",
       .input = {.running = {MidPrompt(2, 100, 32, 13), Decoding(1, 10, 3, 2),
                             Decoding(3, 10, 1, 2, /*ready=*/false)},
                 .waiting = {Waiting(4, 20, 20, 8)},
                 .free_blocks = 10,
                 .block_size = 8,
                 .num_holding = 3},
       .options = {.max_batch_tokens = 40, .max_prefill_chunk_tokens = 32},
       // 39 tokens left after the decode, shared: 20 and 19.
       .expected = {{1, 1, 0, false, true}, {2, 20, 0, false, false}, {4, 19, 3, true, false}}});
  // The budget equals the chunk size: first-come-first-served chunks would
  // give the long prompt every step until its 1000 tokens are done.
  cases.push_back({.name = "ALongPromptDoesNotStarveAShortOneBehindIt",
                   .input = {.running = {MidPrompt(1, 1000, 64, 63)},
                             .waiting = {Waiting(2, 10, 10, 16)},
                             .free_blocks = 10,
                             .block_size = 16,
                             .num_holding = 1},
                   .options = {.max_batch_tokens = 64, .max_prefill_chunk_tokens = 64},
                   .expected = {{1, 54, 0, false, false}, {2, 10, 1, true, true}}});
  cases.push_back({.name = "ChunksOfManyPromptsInterleave",
                   .input = {.running = {MidPrompt(1, 500, 100, 32), MidPrompt(2, 300, 0, 19)},
                             .waiting = {Waiting(3, 300, 300, 16), Waiting(4, 5, 5, 16)},
                             .free_blocks = 30,
                             .block_size = 16,
                             .num_holding = 2},
                   .options = {.max_batch_tokens = 128, .max_prefill_chunk_tokens = 64},
                   // 5 for the short one, 41 each for the others (123 left, 3 ways).
                   .expected = {{1, 41, 0, false, false},
                                {2, 41, 0, false, false},
                                {3, 41, 19, true, false},
                                {4, 5, 1, true, true}}});
  cases.push_back(
      {.name = "AdmissionStopsWhenEveryTokenOfTheBudgetIsTaken",
       .input = {.waiting = {Waiting(1, 8, 8, 8), Waiting(2, 8, 8, 8), Waiting(3, 8, 8, 8)},
                 .free_blocks = 10,
                 .block_size = 8},
       .options = {.max_batch_tokens = 2, .max_prefill_chunk_tokens = 8},
       .expected = {{1, 1, 1, true, false}, {2, 1, 1, true, false}}});
  cases.push_back({.name = "ACachedPrefixStartsTheComputation",
                   // 40 tokens, 32 of them cached: only 8 are computed; admission takes
                   // the blocks FreeBlocksNeeded counted (here: one fresh, two evictable).
                   .input = {.waiting = {{.id = 1,
                                          .prompt_len = 40,
                                          .num_tokens = 40,
                                          .num_computed = 32,
                                          .reserve_tokens = 40,
                                          .admit_blocks = 3}},
                             .free_blocks = 3,
                             .block_size = 8},
                   .expected = {{1, 8, 3, true, true}}});
  cases.push_back({.name = "GrowthComesOutOfTheFreeBlocks",
                   // Sequence 1 fills its 2 blocks of 8 and needs a third;
                   // sequence 2 too, but only one block is free.
                   .input = {.running = {Decoding(1, 10, 7, 2), Decoding(2, 10, 7, 2)},
                             .free_blocks = 1,
                             .block_size = 8,
                             .num_holding = 2},
                   .expected = {{1, 1, 1, false, true}}});
  cases.push_back(
      {.name = "GrowthPreemptsTheNewest",
       // 1 and 2 need a block each; 3 (newest) gives back its 2.
       .input = {.running = {Decoding(1, 10, 7, 2), Decoding(2, 10, 7, 2), Decoding(3, 10, 2, 2)},
                 .waiting = {Waiting(4, 2, 2, 8)},
                 .free_blocks = 0,
                 .total_blocks = 6,
                 .block_size = 8,
                 .num_holding = 3},
       // Nothing is admitted in a step that preempts.
       .expected = {{1, 1, 1, false, true}, {2, 1, 1, false, true}},
       .preempted = {3}});
  cases.push_back(
      {.name = "PreemptionStopsAsSoonAsTheGrowthFits",
       .input = {.running = {Decoding(1, 10, 7, 2), Decoding(2, 10, 2, 2), Decoding(3, 10, 2, 2)},
                 .free_blocks = 0,
                 .total_blocks = 6,
                 .block_size = 8,
                 .num_holding = 3},
       .expected = {{1, 1, 1, false, true}, {2, 1, 0, false, true}},
       .preempted = {3}});
  cases.push_back(
      {.name = "SequencesAwaitingTheirKvAreNeverPreempted",
       .input = {.running = {Decoding(1, 10, 7, 2), Decoding(2, 10, 1, 2, /*ready=*/false)},
                 .free_blocks = 0,
                 .total_blocks = 4,
                 .block_size = 8,
                 .num_holding = 2},
       .expected = {}});
  cases.push_back({.name = "TheOldestIsNeverPreemptedForTheNewest",
                   // 2 needs a block; only 1, older, could give one: 2 waits.
                   .input = {.running = {Decoding(1, 10, 2, 2), Decoding(2, 10, 7, 2)},
                             .free_blocks = 0,
                             .total_blocks = 4,
                             .block_size = 8,
                             .num_holding = 2},
                   .expected = {{1, 1, 0, false, true}}});
  cases.push_back({.name = "ASequenceLargerThanTheWholeCacheFails",
                   // 24 tokens fill all 3 blocks of 8; the next needs a 4th,
                   // which no preemption can give.
                   .input = {.running = {Decoding(1, 10, 15, 3)},
                             .free_blocks = 0,
                             .total_blocks = 3,
                             .block_size = 8,
                             .num_holding = 1},
                   .expected = {},
                   .too_large = {1}});
  cases.push_back({.name = "MaxNumSeqsBoundsAdmission",
                   .input = {.running = {Decoding(1, 4, 1, 2)},
                             .waiting = {Waiting(2, 4, 4, 4), Waiting(3, 4, 4, 4)},
                             .free_blocks = 10,
                             .block_size = 4,
                             .num_holding = 1},
                   .options = {.max_num_seqs = 2},
                   .expected = {{1, 1, 0, false, true}, {2, 4, 1, true, true}}});
  cases.push_back({.name = "SeparatePrefillStepsPutPromptsFirst",
                   .input = {.running = {Decoding(1, 10, 3, 2)},
                             .waiting = {Waiting(2, 6, 9, 4)},
                             .free_blocks = 10,
                             .block_size = 4,
                             .num_holding = 1},
                   .options = {.separate_prefill_steps = true},
                   .expected = {{2, 6, 3, true, true}}});
  cases.push_back({.name = "SeparatePrefillStepsDecodeWhenNoPromptFits",
                   .input = {.running = {Decoding(1, 10, 3, 2), Decoding(2, 10, 5, 2)},
                             .waiting = {Waiting(3, 60, 60, 4)},
                             .free_blocks = 10,
                             .block_size = 8,
                             .num_holding = 2},
                   .options = {.separate_prefill_steps = true},
                   .expected = {{1, 1, 0, false, true}, {2, 1, 0, false, true}}});
  cases.push_back({.name = "NothingToDo",
                   .input = {.running = {Decoding(1, 4, 1, 1, /*ready=*/false)},
                             .free_blocks = 3,
                             .block_size = 4,
                             .num_holding = 1},
                   .expected = {}});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Cases, PlanStepTable, testing::ValuesIn(PlanCases()),
                         [](const testing::TestParamInfo<PlanCase>& info) {
                           return info.param.name;
                         });

TEST(ShareBudgetTest, MaxMinFair) {
  EXPECT_EQ(ShareBudget({}, 10), std::vector<int>{});
  EXPECT_EQ(ShareBudget({5, 5}, 0), (std::vector<int>{0, 0}));
  EXPECT_EQ(ShareBudget({100, 3, 100}, 50), (std::vector<int>{24, 3, 23}));
  EXPECT_EQ(ShareBudget({10, 10}, 100), (std::vector<int>{10, 10}));  // wants less than it could
  EXPECT_EQ(ShareBudget({4, 4, 4}, 2), (std::vector<int>{1, 1, 0}));  // the earliest first
  EXPECT_EQ(ShareBudget({7, 1, 7}, 9), (std::vector<int>{4, 1, 4}));
}

// ---- the Scheduler with execution mocked ----

ModelConfig Config() {
  ModelConfig c;
  c.vocab_size = 100;
  c.max_position_embeddings = 512;
  c.num_layers = 2;
  c.eos_token_ids = {2};
  return c;
}

std::vector<int32_t> Prompt(int n) { return std::vector<int32_t>(n, 7); }

SamplingParams MaxTokens(int n) {
  SamplingParams p;
  p.max_tokens = n;
  return p;
}

// The runner's answer to `step`: `token` for every sampling sequence.
StepOutput Sampled(const ScheduledStep& step, int32_t token) {
  StepOutput out;
  out.sampled.resize(step.ids.size());
  for (auto& t : out.sampled) t.token = token;
  return out;
}

TEST(SchedulerTest, PrefillRoleQueuesABurstAndHoldsBlocksUntilReleased) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill}, config, /*num_blocks=*/8, /*block_size=*/16);
  for (SeqId id = 1; id <= 4; ++id) ASSERT_TRUE(s.AddPrompt(id, Prompt(40), MaxTokens(8)).ok());
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids, (std::vector<SeqId>{1, 2}));
  EXPECT_EQ(s.kv().num_free_blocks(), 2);
  EXPECT_EQ(s.num_waiting(), 2);
  EXPECT_TRUE(s.Schedule().empty());  // the rest waits for blocks
  std::vector<SequenceUpdate> u = s.Complete(step, Sampled(step, 9));
  ASSERT_EQ(u.size(), 2u);
  EXPECT_EQ(u[0].token->token, 9);
  EXPECT_FALSE(u[0].freed);
  EXPECT_EQ(s.num_held(), 2);
  EXPECT_TRUE(s.Schedule().empty());  // held blocks are not free yet
  s.Release(1);
  s.Release(2);
  step = s.Schedule();
  EXPECT_EQ(step.ids, (std::vector<SeqId>{3, 4}));
  s.Complete(step, Sampled(step, 9));
  s.Release(3);
  s.Release(4);
  EXPECT_EQ(s.kv().num_free_blocks(), 8);
  EXPECT_EQ(s.num_holding(), 0);
}

TEST(SchedulerTest, PromptsThatCanNeverFitAreRefusedAtTheDoor) {
  const ModelConfig config = Config();
  Scheduler prefill({.role = SchedulerRole::kPrefill}, config, 2, 16);
  EXPECT_EQ(prefill.AddPrompt(1, Prompt(33), MaxTokens(1)).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(prefill.AddPrompt(2, Prompt(32), MaxTokens(100)).ok());  // prompt only
  Scheduler colocated({.role = SchedulerRole::kColocated}, config, 2, 16);
  EXPECT_EQ(colocated.AddPrompt(1, Prompt(32), MaxTokens(2)).code(),
            absl::StatusCode::kInvalidArgument);  // prompt + max_tokens - 1 = 33
  EXPECT_TRUE(colocated.AddPrompt(2, Prompt(32), MaxTokens(1)).ok());
  EXPECT_EQ(colocated.AddPrompt(2, Prompt(3), MaxTokens(1)).code(),
            absl::StatusCode::kAlreadyExists);
}

TEST(SchedulerTest, ChunkedPrefillSamplesOnlyAtTheEndOfThePrompt) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill, .plan = {.max_prefill_chunk_tokens = 16}}, config,
              16, 8);
  ASSERT_TRUE(s.AddPrompt(1, Prompt(40), MaxTokens(1)).ok());
  int computed = 0;
  for (int chunk = 0; chunk < 3; ++chunk) {
    ScheduledStep step = s.Schedule();
    ASSERT_EQ(step.ids.size(), 1u);
    const StepSequence& seq = step.batch.seqs[0];
    EXPECT_EQ(seq.num_cached, computed);
    EXPECT_EQ(seq.tokens.size(), chunk < 2 ? 16u : 8u);
    EXPECT_EQ(seq.sampling != nullptr, chunk == 2);
    EXPECT_GE(seq.block_table.size() * 8, static_cast<size_t>(computed) + seq.tokens.size());
    computed += static_cast<int>(seq.tokens.size());
    std::vector<SequenceUpdate> u = s.Complete(step, Sampled(step, 5));
    EXPECT_EQ(u[0].token.has_value(), chunk == 2);
  }
  EXPECT_EQ(s.Find(1)->num_computed, 40);
  EXPECT_EQ(s.num_held(), 1);
}

TEST(SchedulerTest, AStepTokenLimitCapsTheStepsPlannedFromThenOn) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill,
               .plan = {.max_batch_tokens = 64, .max_prefill_chunk_tokens = 16}},
              config, 64, 8);
  for (SeqId id = 1; id <= 4; ++id) ASSERT_TRUE(s.AddPrompt(id, Prompt(48), MaxTokens(1)).ok());
  ScheduledStep step = s.Schedule();
  EXPECT_EQ(step.num_tokens, 64);  // four chunks of 16
  s.Complete(step, Sampled(step, 5));
  s.set_step_token_limit(16);
  step = s.Schedule();
  EXPECT_EQ(step.num_tokens, 16);
  s.Complete(step, Sampled(step, 5));
  s.set_step_token_limit(1000);  // above max_batch_tokens: the option holds
  step = s.Schedule();
  EXPECT_EQ(step.num_tokens, 64);
  s.Complete(step, Sampled(step, 5));
  s.set_step_token_limit(0);
  step = s.Schedule();
  EXPECT_EQ(step.num_tokens, 48 * 4 - 64 - 16 - 64);
}

TEST(SchedulerTest, CancelDuringAStepIsAppliedWhenItEnds) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kColocated}, config, 16, 4);
  ASSERT_TRUE(s.AddPrompt(1, Prompt(6), MaxTokens(4)).ok());
  ASSERT_TRUE(s.AddPrompt(2, Prompt(6), MaxTokens(4)).ok());
  ASSERT_TRUE(s.AddPrompt(3, Prompt(6), MaxTokens(4)).ok());
  EXPECT_TRUE(s.Cancel(3));  // waiting: freed at once
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids.size(), 2u);
  EXPECT_FALSE(s.Cancel(1));  // in the step: deferred
  std::vector<SequenceUpdate> u = s.Complete(step, Sampled(step, 9));
  EXPECT_TRUE(u[0].cancelled);
  EXPECT_TRUE(u[0].freed);
  EXPECT_FALSE(u[0].token.has_value());
  EXPECT_EQ(u[1].token->token, 9);
  EXPECT_EQ(s.Find(1), nullptr);
  EXPECT_EQ(s.num_running(), 1);
  EXPECT_TRUE(s.Cancel(2));
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
  EXPECT_FALSE(s.Cancel(42));
}

TEST(SchedulerTest, ColocatedRunsToMaxTokensOrEosAndFreesEverything) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kColocated, .plan = {.separate_prefill_steps = true}}, config,
              16, 4);
  ASSERT_TRUE(s.AddPrompt(1, Prompt(5), MaxTokens(3)).ok());
  ASSERT_TRUE(s.AddPrompt(2, Prompt(5), MaxTokens(10)).ok());
  ScheduledStep step = s.Schedule();  // both prompts
  ASSERT_EQ(step.num_tokens, 10);
  s.Complete(step, Sampled(step, 9));
  step = s.Schedule();  // both decode
  ASSERT_EQ(step.num_tokens, 2);
  EXPECT_EQ(step.batch.seqs[0].num_cached, 5);
  EXPECT_EQ(step.batch.seqs[0].history.generated.size(), 1u);
  s.Complete(step, Sampled(step, 9));
  step = s.Schedule();
  StepOutput out = Sampled(step, 9);
  out.sampled[1].token = 2;  // EOS for sequence 2
  std::vector<SequenceUpdate> u = s.Complete(step, out);
  EXPECT_EQ(u[0].finish, FinishReason::kLength);
  EXPECT_EQ(u[1].finish, FinishReason::kStop);
  EXPECT_TRUE(u[0].freed && u[1].freed);
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
  EXPECT_TRUE(s.Schedule().empty());
}

TEST(SchedulerTest, DecodeRoleAdmitsRemoteSequencesAndRunsThemOnceTheirKvArrives) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kDecode, .plan = {.max_num_seqs = 2}}, config, 8, 4);
  // Whole requests reserved (no headroom set): 6 + 5 - 1 tokens, 3 blocks.
  absl::StatusOr<std::span<const int32_t>> table = s.AddRemote(1, Prompt(6), MaxTokens(5));
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->size(), 3u);
  ASSERT_TRUE(s.AddRemote(2, Prompt(6), MaxTokens(5)).ok());
  EXPECT_EQ(s.AddRemote(3, Prompt(2), MaxTokens(1)).status().code(),
            absl::StatusCode::kResourceExhausted);  // max_num_seqs
  EXPECT_TRUE(s.Schedule().empty());                // nothing has its KV yet
  EXPECT_EQ(*s.StartDecoding(1, 9), FinishReason::kNone);
  EXPECT_EQ(*s.StartDecoding(2, 2), FinishReason::kStop);  // EOS as the first token
  EXPECT_EQ(s.Find(2), nullptr);
  EXPECT_EQ(s.StartDecoding(1, 9).status().code(), absl::StatusCode::kFailedPrecondition);
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids, (std::vector<SeqId>{1}));
  EXPECT_EQ(step.batch.seqs[0].num_cached, 6);
  EXPECT_EQ(step.batch.seqs[0].tokens[0], 9);
  s.Complete(step, Sampled(step, 11));
  EXPECT_EQ(s.Find(1)->tokens.back(), 11);
  // Full reservation: running never needs more blocks.
  EXPECT_EQ(s.kv().num_free_blocks(), 5);
}

TEST(SchedulerTest, AFailedStepFailsAndFreesItsSequencesOnly) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kColocated, .plan = {.max_batch_tokens = 6}}, config, 16, 4);
  ASSERT_TRUE(s.AddPrompt(1, Prompt(5), MaxTokens(3)).ok());
  ASSERT_TRUE(s.AddPrompt(2, Prompt(5), MaxTokens(3)).ok());
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids, (std::vector<SeqId>{1}));  // the budget holds one prompt
  std::vector<SequenceUpdate> u = s.Complete(step, absl::InternalError("device lost"));
  EXPECT_EQ(u[0].error.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(u[0].freed);
  step = s.Schedule();
  EXPECT_EQ(step.ids, (std::vector<SeqId>{2}));
}

TEST(SchedulerTest, PrefixCachingStartsAfterTheCachedPrefixAndCountsHits) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill, .enable_prefix_caching = true}, config, 16, 8);
  std::vector<int32_t> first(40);
  for (int i = 0; i < 40; ++i) first[i] = i;
  ASSERT_TRUE(s.AddPrompt(1, first, MaxTokens(4)).ok());
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids.size(), 1u);
  EXPECT_EQ(step.batch.seqs[0].num_cached, 0);
  EXPECT_EQ(step.prefix_query_tokens, 40);
  EXPECT_EQ(step.prefix_hit_tokens, 0);
  s.Complete(step, Sampled(step, 9));
  s.Release(1);  // its five full blocks stay cached, evictable
  EXPECT_EQ(s.kv().num_evictable_blocks(), 5);
  EXPECT_EQ(s.kv().num_free_blocks(), 16);

  // Same 32 first tokens, then others: four blocks cached, eight tokens left.
  std::vector<int32_t> second(first.begin(), first.begin() + 32);
  for (int i = 0; i < 10; ++i) second.push_back(200 + i);
  ASSERT_TRUE(s.AddPrompt(2, second, MaxTokens(4)).ok());
  EXPECT_EQ(s.pending_prompt_tokens(), 10);  // the cached prefix is not work
  // The same prompt again: all five blocks are cached, but its last token
  // is computed so that the step samples: four blocks are shared.
  ASSERT_TRUE(s.AddPrompt(3, first, MaxTokens(4)).ok());
  step = s.Schedule();
  ASSERT_EQ(step.ids, (std::vector<SeqId>{2, 3}));
  EXPECT_EQ(step.batch.seqs[0].num_cached, 32);
  EXPECT_EQ(step.batch.seqs[0].tokens.size(), 10u);
  EXPECT_EQ(step.batch.seqs[1].num_cached, 32);
  EXPECT_EQ(step.batch.seqs[1].tokens.size(), 8u);
  EXPECT_NE(step.batch.seqs[0].sampling, nullptr);
  EXPECT_NE(step.batch.seqs[1].sampling, nullptr);
  EXPECT_EQ(step.prefix_query_tokens, 82);
  EXPECT_EQ(step.prefix_hit_tokens, 64);
  // Shared blocks: the same ids in both tables, read-only for both.
  for (int b = 0; b < 4; ++b) {
    EXPECT_EQ(step.batch.seqs[0].block_table[b], step.batch.seqs[1].block_table[b]);
    EXPECT_EQ(s.kv().RefCount(step.batch.seqs[0].block_table[b]), 2);
  }
  EXPECT_NE(step.batch.seqs[0].block_table[4], step.batch.seqs[1].block_table[4]);
  s.Complete(step, Sampled(step, 9));
  s.Release(2);
  s.Release(3);
  EXPECT_EQ(s.kv().num_free_blocks(), 16);
}

TEST(SchedulerTest, PrefixCachingOffComputesEveryToken) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill}, config, 16, 8);
  for (SeqId id : {1, 2}) {
    ASSERT_TRUE(s.AddPrompt(id, Prompt(40), MaxTokens(1)).ok());
    ScheduledStep step = s.Schedule();
    ASSERT_EQ(step.ids, std::vector<SeqId>{id});
    EXPECT_EQ(step.batch.seqs[0].num_cached, 0);
    EXPECT_EQ(step.prefix_query_tokens, 0);
    s.Complete(step, Sampled(step, 9));
    s.Release(id);
    EXPECT_EQ(s.kv().num_evictable_blocks(), 0);
  }
}

TEST(SchedulerTest, AdmissionsTakeTheirCachedBlocksBeforeAnyFreshBlock) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kPrefill, .enable_prefix_caching = true}, config, 8, 4);
  // Prompt A, then prompt B, computed and released: evictable A1 A0 B1 B0,
  // least recently freed first, and four plain free blocks.
  const std::vector<int32_t> a = {1, 1, 1, 1, 2, 2, 2, 2}, b = {3, 3, 3, 3, 4, 4, 4, 4};
  for (auto [id, prompt] : {std::pair<SeqId, std::vector<int32_t>>{1, a}, {2, b}}) {
    ASSERT_TRUE(s.AddPrompt(id, prompt, MaxTokens(1)).ok());
    ScheduledStep step = s.Schedule();
    s.Complete(step, Sampled(step, 9));
    s.Release(id);
  }
  ASSERT_EQ(s.kv().num_evictable_blocks(), 4);
  // A fresh 20-token prompt (5 blocks: the 4 plain ones and an evictable
  // one), then A plus one token (its 2 cached blocks and 1 fresh): 8 in
  // all. Were the fresh prompt's blocks taken first, it would evict A1.
  std::vector<int32_t> fresh(20, 5), a_more = a;
  a_more.push_back(6);
  ASSERT_TRUE(s.AddPrompt(3, fresh, MaxTokens(1)).ok());
  ASSERT_TRUE(s.AddPrompt(4, a_more, MaxTokens(1)).ok());
  ScheduledStep step = s.Schedule();
  ASSERT_EQ(step.ids, (std::vector<SeqId>{3, 4}));
  EXPECT_EQ(step.batch.seqs[0].num_cached, 0);
  EXPECT_EQ(step.batch.seqs[1].num_cached, 8);
  EXPECT_EQ(step.batch.seqs[1].tokens.size(), 1u);
  EXPECT_EQ(s.kv().num_free_blocks(), 0);
  s.Complete(step, Sampled(step, 9));
}

// Colocated, lazy growth with no headroom: two requests fill the cache,
// then the older one's growth preempts the newer, which comes back after it
// finishes and is recomputed from its prompt and generated tokens.
TEST(SchedulerTest, GrowthPreemptsTheNewestWhichIsRecomputedFromItsKnownTokens) {
  const ModelConfig config = Config();
  Scheduler s({.role = SchedulerRole::kColocated, .kv_headroom_tokens = 0}, config, 6, 4);
  ASSERT_TRUE(s.AddPrompt(1, Prompt(8), MaxTokens(12)).ok());
  ASSERT_TRUE(s.AddPrompt(2, Prompt(8), MaxTokens(12)).ok());
  ScheduledStep step = s.Schedule();  // both prompts: 2 blocks each, not 5
  ASSERT_EQ(step.ids, (std::vector<SeqId>{1, 2}));
  EXPECT_EQ(s.kv().num_free_blocks(), 2);
  s.Complete(step, Sampled(step, 10));
  int preempted_at = -1;
  for (int i = 0; i < 40 && preempted_at < 0; ++i) {
    step = s.Schedule();
    if (!step.preempted.empty()) {
      EXPECT_EQ(step.preempted, std::vector<SeqId>{2});
      EXPECT_EQ(step.ids, std::vector<SeqId>{1});
      preempted_at = i;
    }
    s.Complete(step, Sampled(step, 11 + i));
  }
  // Both grew into the two free blocks at token 9; the older needed a fifth
  // block at token 13 and took the newer's three.
  ASSERT_EQ(preempted_at, 4);
  const Scheduler::Sequence* two = s.Find(2);
  ASSERT_NE(two, nullptr);
  EXPECT_EQ(two->state, Scheduler::State::kWaiting);
  EXPECT_EQ(two->num_computed, 0);
  EXPECT_EQ(two->tokens.size(), 13u);  // prompt + 5 generated, kept
  EXPECT_EQ(two->num_preemptions, 1);
  EXPECT_EQ(s.num_available_blocks(), 0);
  // Sequence 1 runs to its 12 tokens, then 2 is readmitted: one step over
  // its 13 known tokens from position 0, sampling its 6th token.
  std::vector<SequenceUpdate> u;
  for (int i = 0; i < 40; ++i) {
    step = s.Schedule();
    ASSERT_FALSE(step.empty());
    if (step.ids == std::vector<SeqId>{2}) break;
    u = s.Complete(step, Sampled(step, 30 + i));
  }
  EXPECT_EQ(u.back().id, 1u);
  EXPECT_EQ(u.back().finish, FinishReason::kLength);
  ASSERT_EQ(step.batch.seqs.size(), 1u);
  const StepSequence& recompute = step.batch.seqs[0];
  EXPECT_EQ(recompute.num_cached, 0);
  EXPECT_EQ(recompute.tokens.size(), 13u);
  ASSERT_NE(recompute.sampling, nullptr);
  EXPECT_EQ(recompute.history.generated.size(), 5u);  // the draw of its 6th token
  EXPECT_TRUE(step.prompt_work);
  u = s.Complete(step, Sampled(step, 50));
  EXPECT_EQ(u[0].token->token, 50);
  while (s.Find(2) != nullptr) {
    step = s.Schedule();
    ASSERT_FALSE(step.empty());
    s.Complete(step, Sampled(step, 51));
  }
  EXPECT_EQ(s.kv().num_free_blocks(), 6);
}

TEST(SchedulerTest, DecodeRoleReservesThePromptPlusHeadroomAndKeepsSlotsForPreempted) {
  const ModelConfig config = Config();
  Scheduler s(
      {.role = SchedulerRole::kDecode, .plan = {.max_num_seqs = 4}, .kv_headroom_tokens = 4},
      config, 8, 4);
  // 6 + 4 tokens: 3 blocks, not the 6 + 20 - 1 of the whole request.
  absl::StatusOr<std::span<const int32_t>> table = s.AddRemote(1, Prompt(6), MaxTokens(20));
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->size(), 3u);
  // A request larger than the whole cache is refused at once.
  EXPECT_EQ(s.AddRemote(2, Prompt(6), MaxTokens(40)).status().code(),
            absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(s.AddRemote(3, Prompt(6), MaxTokens(20)).ok());
  EXPECT_EQ(s.kv().num_free_blocks(), 2);
  EXPECT_EQ(s.AddRemote(4, Prompt(6), MaxTokens(20)).status().code(),
            absl::StatusCode::kResourceExhausted);  // 3 blocks, 2 free
  ASSERT_EQ(*s.StartDecoding(1, 9), FinishReason::kNone);
  ASSERT_EQ(*s.StartDecoding(3, 9), FinishReason::kNone);
  // Decode until sequence 1 has to preempt sequence 3.
  ScheduledStep step;
  for (int i = 0; i < 30; ++i) {
    step = s.Schedule();
    if (!step.preempted.empty()) break;
    s.Complete(step, Sampled(step, 9));
  }
  ASSERT_EQ(step.preempted, std::vector<SeqId>{3});
  s.Complete(step, Sampled(step, 9));
  EXPECT_EQ(s.num_waiting(), 1);
  // What the preempted sequence needs is not available to newcomers.
  EXPECT_LT(s.num_available_blocks(), s.kv().num_free_blocks() + 1);
  EXPECT_EQ(s.AddRemote(5, Prompt(1), MaxTokens(1)).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(SchedulerTest, RandomWorkloadNeverLosesABlockAndAlwaysDrains) {
  const ModelConfig config = Config();
  struct Variant {
    SchedulerRole role;
    bool caching;
    int headroom;
  };
  for (const Variant& v :
       {Variant{SchedulerRole::kPrefill, false, -1}, Variant{SchedulerRole::kPrefill, true, -1},
        Variant{SchedulerRole::kColocated, false, -1}, Variant{SchedulerRole::kColocated, true, 0},
        Variant{SchedulerRole::kColocated, false, 3}}) {
    SCOPED_TRACE(absl::StrCat(std::string(SchedulerRoleName(v.role)), " caching=", v.caching,
                              " headroom=", v.headroom));
    Scheduler s({.role = v.role,
                 .plan = {.max_batch_tokens = 64, .max_prefill_chunk_tokens = 24},
                 .enable_prefix_caching = v.caching,
                 .kv_headroom_tokens = v.headroom},
                config, 24, 8);
    std::mt19937 rng(11);
    SeqId next = 1;
    int preemptions = 0;
    auto run_step = [&](bool faults) {
      ScheduledStep step = s.Schedule();
      preemptions += static_cast<int>(step.preempted.size());
      EXPECT_TRUE(step.failed.empty());  // nothing can outgrow the cache
      if (step.empty()) return false;
      if (faults && rng() % 20 == 0) s.Cancel(step.ids[rng() % step.ids.size()]);
      std::vector<SequenceUpdate> updates =
          faults && rng() % 50 == 0
              ? s.Complete(step, absl::InternalError("x"))
              : s.Complete(step, Sampled(step, static_cast<int32_t>(3 + rng() % 10)));
      for (const SequenceUpdate& u : updates) {
        if (v.role == SchedulerRole::kPrefill && u.token.has_value()) s.Release(u.id);
      }
      return true;
    };
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 0) {
        // Prompts of 7s share prefixes; a random tail makes them differ.
        std::vector<int32_t> prompt = Prompt(1 + static_cast<int>(rng() % 50));
        for (int t = 0; t < static_cast<int>(rng() % 20); ++t) prompt.push_back(rng() % 50);
        (void)s.AddPrompt(next++, prompt, MaxTokens(1 + static_cast<int>(rng() % 60)));
      } else if (kind == 1 && next > 1) {
        s.Cancel(1 + rng() % (next - 1));
      } else {
        run_step(/*faults=*/true);
      }
      ASSERT_EQ(s.kv().num_used_blocks() == 0, s.num_holding() == 0) << "op " << op;
    }
    // Drain without cancelling: every request runs to its end (preemption
    // never loops), and every block comes back.
    int steps = 0;
    while (s.num_holding() + s.num_waiting() > 0 && steps < 20000) {
      run_step(/*faults=*/false);
      ++steps;
    }
    EXPECT_LT(steps, 20000) << "did not drain";
    EXPECT_EQ(s.kv().num_free_blocks(), 24);
    EXPECT_EQ(s.num_holding() + s.num_waiting(), 0);
    if (v.headroom >= 0) EXPECT_GT(preemptions, 0) << "the workload should exercise preemption";
  }
}

}  // namespace
}  // namespace pdserve::engine
