// pdserve_loadgen: a load generator for any pdserve.v1.Generation server (the
// router of a disaggregated cluster, or pdserve_colocated). Plans the whole
// workload from a seed (arrival times, prompt and output lengths, prompt
// token ids), sends it, and reports TTFT, ITL, TPOT and E2E percentiles,
// request and token throughput, failures by status code, and goodput under
// TTFT and ITL SLOs, as a table and as JSON.
//
//   pdserve_loadgen --target=127.0.0.1:50051 --rate=4 --arrival=poisson
//     --duration_s=60 --warmup_s=10 --concurrency=64
//     --prompt_len=uniform:64:256 --output_len=normal:64:16:8:128
//     --slo_ttft_s=1 --slo_itl_s=0.1 --seed=1 --json_out=run.json
//
// Every request sets ignore_eos, so it produces exactly its planned output
// length unless it hits the model context (with --max_tokens, requests ask
// for more and the client stops reading at the planned length).
// --shared_prefix_len gives prompts common system prompts (prefix caching).
// Exit status: 0 when the run finished (whatever its failures), 2 for bad
// flags.
#include <fstream>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "bench/loadgen/client.h"
#include "bench/loadgen/histogram_check.h"
#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"
#include "common/base/cli.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051",
          "Generation server (router or pdserve_colocated), host:port");
ABSL_FLAG(std::string, arrival, "poisson",
          "Arrival process: poisson, fixed (constant rate) or burst (all at once)");
ABSL_FLAG(double, rate, 1.0, "Requests per second (poisson, fixed)");
ABSL_FLAG(double, duration_s, 60, "Requests are sent during this many seconds");
ABSL_FLAG(int, max_requests, 0, "Send at most this many requests (0: no cap; burst needs it)");
ABSL_FLAG(double, warmup_s, 5, "Requests planned in the first seconds are sent but not measured");
ABSL_FLAG(int, concurrency, 64, "Calls in flight at most; a request waits for a free slot");
ABSL_FLAG(std::string, prompt_len, "fixed:128",
          "Prompt tokens: fixed:N, uniform:LO:HI or normal:MEAN:STD[:LO:HI] (clamped)");
ABSL_FLAG(std::string, output_len, "fixed:64",
          "Output tokens (max_tokens, ignore_eos): as --prompt_len");
ABSL_FLAG(int, vocab_size, 256, "Prompt token ids are drawn from [1, vocab_size)");
ABSL_FLAG(int, shared_prefix_len, 0,
          "Every prompt starts with one of --num_shared_prefixes fixed prefixes of this many "
          "tokens (system prompts), then --prompt_len tokens of its own; 0: none");
ABSL_FLAG(int, num_shared_prefixes, 1, "Distinct shared prefixes, picked uniformly per request");
ABSL_FLAG(int, max_tokens, 0,
          "> 0: requests ask for this many tokens and the client ends each stream after its "
          "--output_len tokens (as a stop string would), counting it a success; 0: max_tokens is "
          "the output length");
ABSL_FLAG(double, temperature, 0.0, "Sampling temperature (0: greedy)");
ABSL_FLAG(uint64_t, seed, 1,
          "Seed of the workload (arrivals, lengths, token ids) and of each request's sampling");
ABSL_FLAG(double, slo_ttft_s, 1.0, "Goodput: a request's TTFT must be within this");
ABSL_FLAG(double, slo_itl_s, 0.1,
          "Goodput: a request's mean inter-token latency (TPOT) must be within this");
ABSL_FLAG(double, request_timeout_s, 300, "Deadline of each call");
ABSL_FLAG(std::string, label, "", "Name of the run in the table and the JSON");
ABSL_FLAG(std::string, json_out, "",
          "Write the JSON report here (default: stdout after the table)");
ABSL_FLAG(bool, progress, true, "Print progress to stderr every 5 s");
ABSL_FLAG(std::string, markdown_out, "",
          "Append one Markdown table row (header first if the file is new) here");
ABSL_FLAG(std::string, metrics_target, "",
          "host:port of the server's /metrics: compare its TTFT and ITL histograms over the run "
          "with the measured percentiles (warm-up included)");
ABSL_FLAG(std::string, histogram_markdown_out, "",
          "With --metrics_target: append the comparison as one Markdown table row here");

namespace pdserve::loadgen {
namespace {

int Main() {
  WorkloadOptions workload;
  auto arrival = ParseArrival(absl::GetFlag(FLAGS_arrival));
  auto prompt_len = LengthDistribution::Parse(absl::GetFlag(FLAGS_prompt_len));
  auto output_len = LengthDistribution::Parse(absl::GetFlag(FLAGS_output_len));
  for (const absl::Status& s : {arrival.status(), prompt_len.status(), output_len.status()}) {
    if (!s.ok()) {
      std::cerr << s.message() << "\n";
      return 2;
    }
  }
  workload.arrival = *arrival;
  workload.rate = absl::GetFlag(FLAGS_rate);
  workload.duration_s = absl::GetFlag(FLAGS_duration_s);
  workload.max_requests = absl::GetFlag(FLAGS_max_requests);
  workload.prompt_len = *prompt_len;
  workload.output_len = *output_len;
  workload.vocab_size = absl::GetFlag(FLAGS_vocab_size);
  workload.seed = absl::GetFlag(FLAGS_seed);
  workload.shared_prefix_len = absl::GetFlag(FLAGS_shared_prefix_len);
  workload.num_shared_prefixes = absl::GetFlag(FLAGS_num_shared_prefixes);
  auto plan = PlanWorkload(workload);
  if (!plan.ok()) {
    std::cerr << plan.status().message() << "\n";
    return 2;
  }
  if (plan->empty()) {
    std::cerr << "the workload is empty: raise --rate or --duration_s\n";
    return 2;
  }
  RunOptions run{.target = absl::GetFlag(FLAGS_target),
                 .concurrency = absl::GetFlag(FLAGS_concurrency),
                 .warmup_s = absl::GetFlag(FLAGS_warmup_s),
                 .request_timeout_s = absl::GetFlag(FLAGS_request_timeout_s),
                 .temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature)),
                 .progress = absl::GetFlag(FLAGS_progress),
                 .max_tokens = absl::GetFlag(FLAGS_max_tokens)};
  if (run.concurrency < 1) {
    std::cerr << "--concurrency must be >= 1\n";
    return 2;
  }
  const Slo slo{.ttft_s = absl::GetFlag(FLAGS_slo_ttft_s), .itl_s = absl::GetFlag(FLAGS_slo_itl_s)};

  std::cerr << "loadgen: " << plan->size() << " requests to " << run.target << " ("
            << ArrivalName(workload.arrival) << ", " << workload.rate << " req/s, concurrency "
            << run.concurrency << ")\n";
  const std::string started = absl::FormatTime(absl::RFC3339_sec, absl::Now(), absl::UTCTimeZone());
  const std::string metrics_target = absl::GetFlag(FLAGS_metrics_target);
  std::string metrics_before;
  if (!metrics_target.empty()) {
    absl::StatusOr<std::string> scraped = Scrape(metrics_target);
    if (!scraped.ok()) {
      std::cerr << scraped.status().message() << "\n";
      return 2;
    }
    metrics_before = *std::move(scraped);
  }
  std::vector<RequestRecord> records = RunLoad(*plan, run);
  const Summary summary = Summarize(records, slo);
  std::vector<HistogramCheck> histogram_checks;
  if (!metrics_target.empty()) {
    absl::StatusOr<std::string> after = Scrape(metrics_target);
    if (!after.ok()) {
      std::cerr << after.status().message() << "\n";
      return 1;
    }
    std::vector<double> ttft, itl;
    for (const RequestRecord& r : records) {
      if (!r.ok()) continue;
      ttft.push_back(r.ttft_s);
      itl.insert(itl.end(), r.token_gaps_s.begin(), r.token_gaps_s.end());
    }
    for (const auto& [metric, values] : {std::pair{"pdserve_time_to_first_token_seconds", &ttft},
                                         std::pair{"pdserve_inter_token_latency_seconds", &itl}}) {
      histogram_checks.push_back(CheckHistogram(
          metric, Subtract(ParseHistogram(*after, metric), ParseHistogram(metrics_before, metric)),
          *values));
    }
  }

  const std::string label =
      absl::GetFlag(FLAGS_label).empty() ? run.target : absl::GetFlag(FLAGS_label);
  std::cout << ToTable(summary, label);
  if (!histogram_checks.empty()) std::cout << ToTable(histogram_checks);
  nlohmann::json report = ToJson(summary);
  if (!histogram_checks.empty()) report["histogram_check"] = ToJson(histogram_checks);
  report["label"] = label;
  report["started_utc"] = started;
  report["config"] = {{"target", run.target},
                      {"arrival", ArrivalName(workload.arrival)},
                      {"rate", workload.rate},
                      {"duration_s", workload.duration_s},
                      {"max_requests", workload.max_requests},
                      {"warmup_s", run.warmup_s},
                      {"concurrency", run.concurrency},
                      {"prompt_len", workload.prompt_len.ToString()},
                      {"output_len", workload.output_len.ToString()},
                      {"temperature", run.temperature},
                      {"seed", workload.seed},
                      {"shared_prefix_len", workload.shared_prefix_len},
                      {"num_shared_prefixes", workload.num_shared_prefixes},
                      {"max_tokens", run.max_tokens}};
  // The first few failures, to say why.
  nlohmann::json errors = nlohmann::json::array();
  for (const RequestRecord& r : records) {
    if (!r.ok() && errors.size() < 5)
      errors.push_back(
          {{"index", r.index}, {"code", StatusCodeName(r.status_code)}, {"message", r.error}});
  }
  report["sample_errors"] = errors;
  if (const std::string md = absl::GetFlag(FLAGS_markdown_out); !md.empty()) {
    const bool fresh = !std::ifstream(md).good();
    std::ofstream out(md, std::ios::app);
    if (fresh) out << MarkdownHeader();
    out << MarkdownRow(summary, label);
  }
  if (const std::string md = absl::GetFlag(FLAGS_histogram_markdown_out);
      !md.empty() && !histogram_checks.empty()) {
    const bool fresh = !std::ifstream(md).good();
    std::ofstream out(md, std::ios::app);
    if (fresh) out << HistogramMarkdownHeader();
    out << HistogramMarkdownRow(histogram_checks, label);
  }
  const std::string path = absl::GetFlag(FLAGS_json_out);
  if (path.empty()) {
    std::cout << report.dump(2) << "\n";
  } else {
    std::ofstream out(path);
    out << report.dump(2) << "\n";
    if (!out) {
      std::cerr << "cannot write " << path << "\n";
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::loadgen

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv, "Load generator for pdserve.v1.Generation servers", __FILE__);
  return pdserve::loadgen::Main();
}
