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
};

PlanSeq Waiting(SeqId id, int prompt, int reserve, int block_size) {
  return {.id = id,
          .prompt_len = prompt,
          .num_tokens = prompt,
          .num_computed = 0,
          .reserve_tokens = reserve,
          .admit_blocks = (reserve + block_size - 1) / block_size};
}
PlanSeq Decoding(SeqId id, int prompt, int generated, int blocks, bool ready = true) {
  return {.id = id,
          .prompt_len = prompt,
          .num_tokens = prompt + generated,
          .num_computed = prompt + generated - 1,
          .num_blocks = blocks,
          .ready = ready};
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
  EXPECT_LE(plan.new_blocks, c.input.free_blocks);  // never over-commits the cache
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
  cases.push_back({.name = "ChunkedPromptsShareTheBudget",
                   .input = {.waiting = {Waiting(1, 90, 90, 8), Waiting(2, 30, 30, 8)},
                             .free_blocks = 100,
                             .block_size = 8},
                   .options = {.max_batch_tokens = 50, .max_prefill_chunk_tokens = 32},
                   .expected = {{1, 32, 12, true, false}, {2, 18, 4, true, false}}});
  cases.push_back(
      {.name = "DecodesFirstThenChunksOfRunningPromptsThenAdmissions",
       .input = {.running = {Decoding(1, 10, 3, 2), MidPrompt(2, 100, 32, 13),
                             Decoding(3, 10, 1, 2, /*ready=*/false)},
                 .waiting = {Waiting(4, 20, 20, 8)},
                 .free_blocks = 10,
                 .block_size = 8,
                 .num_holding = 3},
       .options = {.max_batch_tokens = 40, .max_prefill_chunk_tokens = 32},
       .expected = {{1, 1, 0, false, true}, {2, 32, 0, false, false}, {4, 7, 3, true, false}}});
  cases.push_back({.name = "GrowthComesOutOfTheFreeBlocks",
                   // Sequence 1 fills its 2 blocks of 8 and needs a third;
                   // sequence 2 too, but only one block is free.
                   .input = {.running = {Decoding(1, 10, 7, 2), Decoding(2, 10, 7, 2)},
                             .free_blocks = 1,
                             .block_size = 8,
                             .num_holding = 2},
                   .expected = {{1, 1, 1, false, true}}});
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
  absl::StatusOr<std::span<const int32_t>> table = s.AddRemote(1, Prompt(6), MaxTokens(5), 10);
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table->size(), 3u);
  ASSERT_TRUE(s.AddRemote(2, Prompt(6), MaxTokens(5), 10).ok());
  EXPECT_EQ(s.AddRemote(3, Prompt(2), MaxTokens(1), 2).status().code(),
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

TEST(SchedulerTest, RandomWorkloadNeverLosesABlock) {
  const ModelConfig config = Config();
  for (SchedulerRole role : {SchedulerRole::kPrefill, SchedulerRole::kColocated}) {
    Scheduler s({.role = role, .plan = {.max_batch_tokens = 64, .max_prefill_chunk_tokens = 24}},
                config, 24, 8);
    std::mt19937 rng(11);
    SeqId next = 1;
    for (int op = 0; op < 3000; ++op) {
      const int kind = static_cast<int>(rng() % 6);
      if (kind == 0) {
        (void)s.AddPrompt(next++, Prompt(1 + static_cast<int>(rng() % 70)),
                          MaxTokens(1 + static_cast<int>(rng() % 20)));
      } else if (kind == 1 && next > 1) {
        s.Cancel(1 + rng() % (next - 1));
      } else {
        ScheduledStep step = s.Schedule();
        if (step.empty()) continue;
        if (rng() % 20 == 0 && next > 1) s.Cancel(step.ids[rng() % step.ids.size()]);
        std::vector<SequenceUpdate> updates =
            rng() % 50 == 0 ? s.Complete(step, absl::InternalError("x"))
                            : s.Complete(step, Sampled(step, static_cast<int32_t>(rng() % 10)));
        for (const SequenceUpdate& u : updates) {
          if (role == SchedulerRole::kPrefill && u.token.has_value()) s.Release(u.id);
        }
      }
      ASSERT_EQ(s.kv().num_used_blocks() == 0, s.num_holding() == 0) << "op " << op;
    }
    // Drain: everything finishes or is cancelled, and every block comes back.
    for (SeqId id = 1; id < next; ++id) s.Cancel(id);
    EXPECT_EQ(s.kv().num_free_blocks(), 24) << SchedulerRoleName(role);
    EXPECT_EQ(s.num_holding() + s.num_waiting(), 0);
  }
}

}  // namespace
}  // namespace pdserve::engine
