// pdserve_spec_bench: decode speed with and without speculative decoding,
// side by side in one run, on the decode worker's engine path (the
// scheduler, the runner and engine/spec's SpecDecoder; no transport).
//
//   pdserve_spec_bench [--model_dir=tools/demo_model]
//       [--draft_model_dir=tools/demo_model/draft] [--methods=off,ngram,draft]
//       (a method may carry its own k: ngram:7)
//       [--workloads=copy,verse,sampled] [--batches=1,8] [--k=0] [--rounds=3]
//       [--max_tokens=64] [--threads=0] [--step_costs] [--trace]
//       [--ngram_min_n=N] [--ngram_max_n=N] [--row_cost=0] [--widen=0]
//
// --widen=K runs against the target widened K times (tools/widen_model.h:
// the same logits, K^2 times the weights, written to a temporary directory
// and removed at exit): the demo model's 6.6 MB stay in a CPU's last-level
// cache, where a decode step is bound by arithmetic and a verification row
// costs half a step; a real checkpoint streams its weights from memory,
// where rows are cheap. The widened demo model is a target of that kind
// with the demo model's tokens, and the draft stays as it is.
//
// Workloads over eight paragraphs of the demo model's training text (public
// domain, tools/demo_model/README.md):
//   copy          the paragraph, a blank line, the paragraph before it in the
//                 text, a blank line, then the paragraph's first eight words;
//                 max_tokens is the rest of the paragraph's tokens (the
//                 answer's length). The answer is the given text: the demo
//                 model continues a verse from memory where its context is
//                 the one it was trained in, so the output copies the prompt
//                 (what summaries and edits look like to n-gram lookup)
//   copy_open     the workload called copy before 2026-11-28: the paragraph,
//                 a blank line, its first eight words, --max_tokens; the
//                 model leaves the paragraph after a few words in most
//                 requests and goes on with text the prompt does not hold
//   copy_bounded  copy_open's prompts with copy's max_tokens
//   verse         the first words alone: greedy continuation of the verse
//   sampled       the first words, temperature 1.5 and seeded: poor proposals
//                 (back-off is what keeps the cost low)
// Batch 1 runs the eight requests one after the other (a single stream);
// batch 8 runs them together. Methods are alternated within each round (the
// order rotates per round) and the median of the rounds is printed, by wall
// time and by the process's CPU time (which other load on a shared machine
// disturbs far less), with the load average before and after. Tokens/s
// counts tokens of decode steps only (after each prompt's first token);
// greedy output is checked identical across methods. "tok/step" is decode
// tokens per decode step: at batch 1 the most speculation can gain if a
// verification cost no more than a plain step. --step_costs also prints,
// per method, the runner's CPU time per decode step by the step's rows (a
// plain batch-1 step has 1, a verification 1 + its proposals). --trace
// prints, per request at batch 1, its decode steps inside the copy of the
// paragraph's remainder (the output's leading tokens equal to it) and after
// it: how many verified proposals, and how many plain ones found no n-gram.
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/bench_common.h"
#include "engine/runner_factory.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/spec_factory.h"
#include "text/tokenizer.h"
#include "text/tokenizer_loader.h"
#include "tools/widen_model.h"

ABSL_FLAG(std::string, model_dir, "tools/demo_model", "Target model");
ABSL_FLAG(std::string, draft_model_dir, "tools/demo_model/draft", "Draft model (method draft)");
ABSL_FLAG(std::string, methods, "off,ngram,draft", "Methods to compare: off, ngram, draft");
ABSL_FLAG(std::string, workloads, "copy,verse,sampled", "copy, verse, sampled");
ABSL_FLAG(std::string, batches, "1,8", "Batch sizes");
ABSL_FLAG(int, k, 0,
          "--num_speculative_tokens, 0: the method's default as the worker's (a method written "
          "name:k has its own)");
ABSL_FLAG(int, ngram_min_n, pdserve::engine::spec::NgramOptions{}.min_n,
          "Shortest n-gram the n-gram proposer matches");
ABSL_FLAG(int, ngram_max_n, pdserve::engine::spec::NgramOptions{}.max_n,
          "Longest n-gram the n-gram proposer matches");
ABSL_FLAG(int, max_batch, -1,
          "--speculative_max_batch as the worker's (-1: the method's default, 2 for ngram and 1 "
          "for draft; 0: no limit)");
ABSL_FLAG(double, draft_cost, 0, "--speculative_draft_cost as the worker's (0: estimated)");
ABSL_FLAG(double, row_cost, 0,
          "--speculative_row_cost as the worker's (0: the runner's VerificationRowCost)");
ABSL_FLAG(int, widen, 0,
          "K >= 2: the target widened K times (same logits), written to a temporary directory");
ABSL_FLAG(int, rounds, 3, "Rounds; each runs every method once");
ABSL_FLAG(int, max_tokens, 64, "Tokens per request at most");
ABSL_FLAG(int, threads, 0, "Runner threads (0: all cores)");
ABSL_FLAG(bool, step_costs, false,
          "Print the runner's CPU time per decode step by its rows, and the proposer's");
ABSL_FLAG(bool, trace, false,
          "Batch 1: per request and method, where its decode steps verified proposals, inside "
          "the copy of the paragraph's remainder and after it");

namespace pdserve {
namespace {

using bench::CpuSeconds;
using bench::LoadAverage;
using bench::Median;
using Clock = std::chrono::steady_clock;

// Eight paragraphs of F. Max Mueller's 1881 translation of the Dhammapada.
constexpr const char* kParagraphs[] = {
    "All that we are is the result of what we have thought: it is founded on our thoughts, it is "
    "made up of our thoughts. If a man speaks or acts with an evil thought, pain follows him, as "
    "the wheel follows the foot of the ox that draws the carriage. 1",
    "He who lives without looking for pleasures, his senses well controlled, moderate in his food, "
    "faithful and strong, him Mara will certainly not overthrow, any more than the wind throws "
    "down a rocky mountain. 8",
    "The thoughtless man, even if he can recite a large portion (of the law), but is not a doer of "
    "it, has no share in the priesthood, but is like a cowherd counting the cows of others. 19",
    "As many kinds of wreaths can be made from a heap of flowers, so many good things may be "
    "achieved by a mortal when once he is born. 53",
    "\"One is the road that leads to wealth, another the road that leads to Nirvana;\" if the "
    "Bhikshu, the disciple of Buddha, has learnt this, he will not yearn for honour, he will "
    "strive after separation from the world. 75",
    "Even though a Gatha (poem) be a thousand (of words), but made up of senseless words, one "
    "word of a Gatha is better, which if a man hears, he becomes quiet. 101",
    "Self is the lord of self, who else could be the lord? With self well subdued, a man finds a "
    "lord such as few can find. 160",
    "He who does not rouse himself when it is time to rise, who, though young and strong, is full "
    "of sloth, whose will and thought are weak, that lazy and idle man will never find the way to "
    "knowledge. 280",
};

// The paragraph before each of kParagraphs in the training text (before the
// first: its chapter's title).
constexpr const char* kPrevious[] = {
    "1. The Twin-Verses",
    "He who lives looking for pleasures only, his senses uncontrolled, immoderate in his food, "
    "idle, and weak, Mara (the tempter) will certainly overthrow him, as the wind throws down a "
    "weak tree. 7",
    "The virtuous man is happy in this world, and he is happy in the next; he is happy in both. "
    "He is happy when he thinks of the good he has done; he is still more happy when going on the "
    "good path. 18",
    "But, like a beautiful flower, full of colour and full of scent, are the fine and fruitful "
    "words of him who acts accordingly. 52",
    "\"May both the layman and he who has left the world think that this is done by me; may they "
    "be subject to me in everything which is to be done or is not to be done,\" thus is the mind "
    "of the fool, and his desire and pride increase. 74",
    "Even though a speech be a thousand (of words), but made up of senseless words, one word of "
    "sense is better, which if a man hears, he becomes quiet. 100",
    "If a man make himself as he teaches others to be, then, being himself well subdued, he may "
    "subdue (others); one's own self is indeed difficult to subdue. 159",
    "`All forms are unreal,' he who knows and sees this becomes passive in pain; this is the way "
    "that leads to purity. 279",
};

// The first `n` words of `text`.
std::string FirstWords(const std::string& text, int n) {
  size_t at = 0;
  for (int i = 0; i < n && at != std::string::npos; ++i) at = text.find(' ', at + 1);
  return at == std::string::npos ? text : text.substr(0, at);
}

struct Request {
  std::vector<int32_t> prompt;
  engine::SamplingParams sampling;
};

// One decode step of one sequence: the output position of its first new
// token, the proposals it verified and kept, the tokens it produced.
struct StepTrace {
  int pos = 0;
  int proposed = 0;
  int accepted = 0;
  int produced = 0;
};

struct Run {
  double seconds = 0;      // decode steps, wall
  double cpu_seconds = 0;  // decode steps, the process's CPU time
  int64_t tokens = 0;      // tokens of decode steps
  int64_t steps = 0;       // decode steps
  // Rows of a decode step -> (steps, the runner's CPU seconds in them).
  std::map<int, std::pair<int64_t, double>> step_cpu;
  double propose_cpu = 0;  // CPU seconds in SpecDecoder::ProposeFor (with --step_costs)
  int64_t proposed = 0, accepted = 0, verifications = 0;
  std::map<engine::SeqId, std::vector<int32_t>> outputs;
  // Per sequence, its decode steps (with --trace).
  std::map<engine::SeqId, std::vector<StepTrace>> trace;
};

// Runs `requests` to completion, `batch` at a time (ids from `first_id`).
void RunBatch(engine::ModelRunner& runner, const std::vector<Request>& requests, size_t first,
              size_t count, engine::spec::SpecDecoder* spec, Run& run) {
  engine::Scheduler scheduler(
      {.role = engine::SchedulerRole::kColocated,
       .plan = {.max_num_seqs = static_cast<int>(count), .max_batch_tokens = 4096},
       .kv_headroom_tokens = 32},
      runner.config(), runner.num_kv_blocks(), runner.kv_block_size());
  for (size_t i = first; i < first + count; ++i) {
    (void)scheduler.AddPrompt(i + 1, requests[i].prompt, requests[i].sampling);
  }
  size_t done = 0;
  while (done < count) {
    const auto start = Clock::now();
    const double cpu_start = CpuSeconds();
    if (spec != nullptr) {
      const double propose_start = absl::GetFlag(FLAGS_step_costs) ? CpuSeconds() : 0;
      (void)spec->ProposeFor(scheduler);
      if (absl::GetFlag(FLAGS_step_costs)) run.propose_cpu += CpuSeconds() - propose_start;
    }
    engine::ScheduledStep step = scheduler.Schedule();
    if (step.empty()) {
      std::fprintf(stderr, "nothing to run\n");
      std::exit(1);
    }
    const bool decode = !step.prompt_work;
    // (Only when asked: a clock read more per step.)
    const bool step_cost = decode && absl::GetFlag(FLAGS_step_costs);
    const double step_start = step_cost ? CpuSeconds() : 0;
    // Through the runner's thread, as the engine core runs a step (Step
    // may run it on this thread instead, as the draft model's steps do).
    absl::StatusOr<std::unique_ptr<engine::StepHandle>> handle = runner.Enqueue(step.batch);
    const absl::StatusOr<engine::StepOutput> out =
        handle.ok() ? (*handle)->Wait() : absl::StatusOr<engine::StepOutput>(handle.status());
    if (step_cost) {
      std::pair<int64_t, double>& cost = run.step_cpu[step.num_tokens];
      ++cost.first;
      cost.second += CpuSeconds() - step_start;
    }
    if (!out.ok()) {
      std::fprintf(stderr, "step failed: %s\n", out.status().ToString().c_str());
      std::exit(1);
    }
    const std::vector<engine::SequenceUpdate> updates = scheduler.Complete(step, out);
    int64_t tokens = 0;
    for (const engine::SequenceUpdate& u : updates) {
      if (!u.token.has_value()) continue;
      std::vector<int32_t>& o = run.outputs[u.id];
      if (decode && absl::GetFlag(FLAGS_trace)) {
        run.trace[u.id].push_back({.pos = static_cast<int>(o.size()),
                                   .proposed = u.num_proposed,
                                   .accepted = u.num_accepted,
                                   .produced = 1 + static_cast<int>(u.more_tokens.size())});
      }
      o.push_back(u.token->token);
      for (const engine::SampledToken& t : u.more_tokens) o.push_back(t.token);
      tokens += 1 + static_cast<int64_t>(u.more_tokens.size());
      done += u.finish != engine::FinishReason::kNone;
    }
    if (spec != nullptr) {
      const engine::spec::SpecStepStats stats = spec->Observe(updates);
      run.proposed += stats.proposed;
      run.accepted += stats.accepted;
      run.verifications += stats.verifications;
    }
    if (decode) {
      run.seconds += std::chrono::duration<double>(Clock::now() - start).count();
      run.cpu_seconds += CpuSeconds() - cpu_start;
      run.tokens += tokens;
      ++run.steps;
    }
  }
}

// The tokens of `para` after its first eight words (what a copy of the
// paragraph continues with after the prompt's opening); empty if the
// opening's tokens are not a prefix of the paragraph's.
std::vector<int32_t> Remainder(const text::Tokenizer& tokenizer, const std::string& para) {
  const std::vector<int32_t> all = tokenizer.Encode(para);
  const std::vector<int32_t> head = tokenizer.Encode(FirstWords(para, 8));
  if (head.size() > all.size() || !std::equal(head.begin(), head.end(), all.begin())) return {};
  return {all.begin() + static_cast<std::ptrdiff_t>(head.size()), all.end()};
}

// The eight requests of a workload (see the top of this file).
absl::StatusOr<std::vector<Request>> MakeRequests(const std::string& workload,
                                                  const text::Tokenizer& tokenizer, int32_t bos) {
  std::vector<Request> requests;
  for (int i = 0; i < 8; ++i) {
    const std::string para = kParagraphs[i];
    const std::string opening = FirstWords(para, 8);
    Request r;
    r.sampling.max_tokens = absl::GetFlag(FLAGS_max_tokens);
    std::string text;
    if (workload == "copy") {
      text = para + "\n\n" + kPrevious[i] + "\n\n" + opening;
      r.sampling.max_tokens = static_cast<int>(Remainder(tokenizer, para).size());
    } else if (workload == "copy_open" || workload == "copy_bounded") {
      text = para + "\n\n" + opening;
      if (workload == "copy_bounded") {
        r.sampling.max_tokens = static_cast<int>(Remainder(tokenizer, para).size());
      }
    } else if (workload == "verse" || workload == "sampled") {
      text = opening;
      if (workload == "sampled") {
        r.sampling.temperature = 1.5f;
        r.sampling.seed = 100 + i;
      }
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "workload \"", workload, "\": expected copy, copy_open, copy_bounded, verse or sampled"));
    }
    if (r.sampling.max_tokens <= 0) {
      return absl::InternalError(absl::StrCat("paragraph ", i + 1, " has no remainder"));
    }
    r.prompt.push_back(bos);
    const std::vector<int32_t> ids = tokenizer.Encode(text);
    r.prompt.insert(r.prompt.end(), ids.begin(), ids.end());
    requests.push_back(std::move(r));
  }
  return requests;
}

// What --trace prints for one method's run at batch 1: per request, its
// decode steps inside the copy of the paragraph's remainder (the output's
// leading tokens equal to it) and after it; "no match" counts the plain
// steps where the n-gram lookup (--ngram_min_n..--ngram_max_n) finds
// nothing in prompt + output.
void PrintTrace(const std::string& workload, const std::string& method, const Run& run,
                const std::vector<Request>& requests, const text::Tokenizer& tokenizer) {
  struct Part {
    int steps = 0, verifying = 0, no_match = 0, tokens = 0, proposed = 0, accepted = 0;
  };
  const int min_n = absl::GetFlag(FLAGS_ngram_min_n), max_n = absl::GetFlag(FLAGS_ngram_max_n);
  Part total[2];
  for (size_t i = 0; i < requests.size(); ++i) {
    const engine::SeqId id = i + 1;
    const std::vector<int32_t> remainder = Remainder(tokenizer, kParagraphs[i]);
    const auto out_it = run.outputs.find(id);
    const auto trace_it = run.trace.find(id);
    if (out_it == run.outputs.end() || trace_it == run.trace.end()) continue;
    const std::vector<int32_t>& out = out_it->second;
    size_t copy = 0;
    while (copy < out.size() && copy < remainder.size() && out[copy] == remainder[copy]) ++copy;
    Part part[2];
    for (const StepTrace& t : trace_it->second) {
      Part& p = part[t.pos < static_cast<int>(copy) ? 0 : 1];
      ++p.steps;
      p.tokens += t.produced;
      p.proposed += t.proposed;
      p.accepted += t.accepted;
      if (t.proposed > 0) {
        ++p.verifying;
        continue;
      }
      std::vector<int32_t> tokens = requests[i].prompt;
      tokens.insert(tokens.end(), out.begin(), out.begin() + t.pos);
      p.no_match += engine::spec::NgramLookup(tokens, min_n, max_n, 1).empty();
    }
    std::string after;
    for (size_t j = copy; j < out.size() && j < copy + 12; ++j) {
      after += tokenizer.TokenBytes(out[j]);
    }
    for (char& c : after) c = c == '\n' ? '|' : c;
    std::printf(
        "  trace %s %s #%zu: prompt %zu, output %zu, copy %zu of %zu | in copy: %d steps, %d "
        "verifying (%d/%d accepted), %d plain with no match, %d tokens | after: %d steps, %d "
        "verifying (%d/%d), %d no match, %d tokens | first step %s | after the copy: \"%s\"\n",
        workload.c_str(), method.c_str(), i + 1, requests[i].prompt.size(), out.size(), copy,
        remainder.size(), part[0].steps, part[0].verifying, part[0].accepted, part[0].proposed,
        part[0].no_match, part[0].tokens, part[1].steps, part[1].verifying, part[1].accepted,
        part[1].proposed, part[1].no_match, part[1].tokens,
        trace_it->second.empty() || trace_it->second[0].proposed == 0 ? "plain" : "verified",
        after.c_str());
    for (int r = 0; r < 2; ++r) {
      total[r].steps += part[r].steps;
      total[r].verifying += part[r].verifying;
      total[r].no_match += part[r].no_match;
      total[r].tokens += part[r].tokens;
      total[r].proposed += part[r].proposed;
      total[r].accepted += part[r].accepted;
    }
  }
  for (int r = 0; r < 2; ++r) {
    std::printf(
        "  trace %s %s, all requests, %s: %d steps, %d verifying (%d/%d accepted), %d plain with "
        "no match, %d tokens (%.2f tok/step)\n",
        workload.c_str(), method.c_str(), r == 0 ? "in the copy" : "after the copy", total[r].steps,
        total[r].verifying, total[r].accepted, total[r].proposed, total[r].no_match,
        total[r].tokens,
        total[r].steps > 0 ? static_cast<double>(total[r].tokens) / total[r].steps : 0.0);
  }
}

// A temporary directory, removed (with what it holds) when destroyed.
class TempDir {
 public:
  // Creates the directory; false if it could not.
  bool Create() {
    std::string pattern =
        (std::filesystem::temp_directory_path() / "pdserve_spec_bench_XXXXXX").string();
    if (mkdtemp(pattern.data()) == nullptr) return false;
    path_ = pattern;
    return true;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

int Main() {
  std::string model_dir = absl::GetFlag(FLAGS_model_dir);
  // Static: std::exit on a failed step still removes it.
  static TempDir widened;
  if (const int widen = absl::GetFlag(FLAGS_widen); widen != 0) {
    if (!widened.Create()) {
      std::fprintf(stderr, "cannot create a temporary directory\n");
      return 1;
    }
    const absl::Status s = engine::WidenCheckpoint(model_dir, widened.path(), {.factor = widen});
    if (!s.ok()) {
      std::fprintf(stderr, "--widen=%d: %s\n", widen, s.ToString().c_str());
      return 1;
    }
    std::printf("target %s widened %dx into %s\n", model_dir.c_str(), widen,
                widened.path().c_str());
    model_dir = widened.path();
  }
  engine::RunnerOptions options{.model_dir = model_dir,
                                .kv_block_size = 16,
                                .num_kv_blocks = 512,
                                .num_threads = absl::GetFlag(FLAGS_threads)};
  auto runner = engine::CreateModelRunner(options);
  if (!runner.ok()) {
    std::fprintf(stderr, "%s\n", runner.status().ToString().c_str());
    return 1;
  }
  auto tokenizer = text::LoadTokenizer(options.model_dir);
  if (!tokenizer.ok()) {
    std::fprintf(stderr, "%s\n", tokenizer.status().ToString().c_str());
    return 1;
  }
  const int32_t bos = (*runner)->config().bos_token_id;
  const std::vector<std::string> methods = absl::StrSplit(absl::GetFlag(FLAGS_methods), ',');
  const std::vector<std::string> workloads = absl::StrSplit(absl::GetFlag(FLAGS_workloads), ',');
  std::vector<int> batches;
  for (absl::string_view b : absl::StrSplit(absl::GetFlag(FLAGS_batches), ',')) {
    batches.push_back(std::stoi(std::string(b)));
  }
  const std::string load_before = LoadAverage();
  const int k = absl::GetFlag(FLAGS_k);
  std::printf(
      "model %s, draft %s, k %d for ngram and %d for draft, n-grams %d..%d, max_batch %d, %d "
      "rounds, max_tokens %d, threads %d\n",
      options.model_dir.c_str(), absl::GetFlag(FLAGS_draft_model_dir).c_str(),
      k > 0 ? k : engine::spec::kDefaultNgramTokens, k > 0 ? k : engine::spec::kDefaultDraftTokens,
      absl::GetFlag(FLAGS_ngram_min_n), absl::GetFlag(FLAGS_ngram_max_n),
      absl::GetFlag(FLAGS_max_batch), absl::GetFlag(FLAGS_rounds), absl::GetFlag(FLAGS_max_tokens),
      absl::GetFlag(FLAGS_threads));
  std::printf("load average before: %s\n", load_before.c_str());
  std::printf("%-12s %5s %-8s %10s %10s %8s %8s %10s %10s %9s %9s\n", "workload", "batch", "method",
              "tok/s", "cpu tok/s", "x wall", "x cpu", "accepted", "tok/verif", "tok/step",
              "identical");

  for (const std::string& workload : workloads) {
    absl::StatusOr<std::vector<Request>> requests = MakeRequests(workload, **tokenizer, bos);
    if (!requests.ok()) {
      std::fprintf(stderr, "%s\n", requests.status().ToString().c_str());
      return 2;
    }
    for (int batch : batches) {
      std::map<std::string, std::vector<double>> wall, cpu;
      std::map<std::string, Run> last;
      // Per method, over all rounds: rows -> (steps, CPU seconds).
      std::map<std::string, std::map<int, std::pair<int64_t, double>>> step_cpu;
      std::map<std::string, double> propose_cpu;  // per method, over all rounds
      for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
        for (size_t m = 0; m < methods.size(); ++m) {
          const std::string& method = methods[(m + round) % methods.size()];
          // "name" or "name:k".
          const std::vector<std::string> parts = absl::StrSplit(method, ':');
          absl::StatusOr<engine::spec::SpecMethod> parsed = engine::spec::ParseSpecMethod(parts[0]);
          int method_k = k;
          if (!parsed.ok() || (parts.size() > 1 && !absl::SimpleAtoi(parts[1], &method_k))) {
            std::fprintf(stderr, "method \"%s\": expected off, ngram or draft, then :k or not\n",
                         method.c_str());
            return 2;
          }
          auto spec = engine::spec::CreateSpecDecoder(
              {.method = *parsed,
               .num_speculative_tokens = method_k,
               .max_batch = absl::GetFlag(FLAGS_max_batch),
               .draft_cost = absl::GetFlag(FLAGS_draft_cost),
               .row_cost = absl::GetFlag(FLAGS_row_cost),
               .ngram = {.min_n = absl::GetFlag(FLAGS_ngram_min_n),
                         .max_n = absl::GetFlag(FLAGS_ngram_max_n)},
               .draft_model_dir = absl::GetFlag(FLAGS_draft_model_dir),
               .num_threads = absl::GetFlag(FLAGS_threads)},
              **runner);
          if (!spec.ok()) {
            std::fprintf(stderr, "%s: %s\n", method.c_str(), spec.status().ToString().c_str());
            return 1;
          }
          Run run;
          for (size_t first = 0; first < requests->size(); first += batch) {
            RunBatch(**runner, *requests, first, std::min<size_t>(batch, requests->size() - first),
                     spec->get(), run);
          }
          propose_cpu[method] += run.propose_cpu;
          for (const auto& [rows, cost] : run.step_cpu) {
            step_cpu[method][rows].first += cost.first;
            step_cpu[method][rows].second += cost.second;
          }
          wall[method].push_back(run.tokens / run.seconds);
          cpu[method].push_back(run.tokens / run.cpu_seconds);
          last[method] = std::move(run);
        }
      }
      const double base_wall = Median(wall[methods[0]]), base_cpu = Median(cpu[methods[0]]);
      for (const std::string& method : methods) {
        const Run& r = last[method];
        const bool identical = workload == "sampled" || r.outputs == last[methods[0]].outputs;
        std::printf(
            "%-12s %5d %-8s %10.1f %10.1f %8.2f %8.2f %9.1f%% %10.2f %9.2f %9s\n", workload.c_str(),
            batch, method.c_str(), Median(wall[method]), Median(cpu[method]),
            Median(wall[method]) / base_wall, Median(cpu[method]) / base_cpu,
            r.proposed > 0 ? 100.0 * r.accepted / r.proposed : 0.0,
            r.verifications > 0 ? 1.0 + static_cast<double>(r.accepted) / r.verifications : 0.0,
            r.steps > 0 ? static_cast<double>(r.tokens) / r.steps : 0.0, identical ? "yes" : "NO");
      }
      if (absl::GetFlag(FLAGS_trace) && batch == 1) {
        for (const std::string& method : methods) {
          PrintTrace(workload, method, last[method], *requests, **tokenizer);
        }
      }
      if (absl::GetFlag(FLAGS_step_costs)) {
        for (const std::string& method : methods) {
          std::printf("  %s %d %s, CPU us per decode step by rows (steps):", workload.c_str(),
                      batch, method.c_str());
          for (const auto& [rows, cost] : step_cpu[method]) {
            std::printf(" %d: %.0f (%lld)", rows, 1e6 * cost.second / cost.first,
                        static_cast<long long>(cost.first));
          }
          std::printf("; proposing %.1f ms per round\n",
                      1e3 * propose_cpu[method] / absl::GetFlag(FLAGS_rounds));
        }
      }
      std::fflush(stdout);
    }
  }
  std::printf("load average after: %s\n", LoadAverage().c_str());
  return 0;
}

}  // namespace
}  // namespace pdserve

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return pdserve::Main();
}
