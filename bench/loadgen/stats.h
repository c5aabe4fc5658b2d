// What one load-generator run measured, per request and summed up: TTFT,
// inter-token latency, end-to-end latency, throughput, failures by status
// code, and goodput under TTFT and ITL SLOs. Pure: no clock, no I/O.
//
// Goodput follows DistServe: a request counts when it succeeded, its TTFT is
// within the TTFT SLO and its mean inter-token latency (time per output
// token, TPOT: (last token - first token) / (tokens - 1)) is within the ITL
// SLO. The mean, not a per-request p90, because the ITL SLO is a per-token
// rate budget; pooled ITL percentiles are reported separately.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace pdserve::loadgen {

struct RequestRecord {
  int index = 0;
  bool warmup = false;      // scheduled during the warm-up: excluded from stats
  double scheduled_s = 0;   // planned send time (offset from the run's start)
  double send_s = 0;        // actual send time (later when the concurrency cap held it)
  int status_code = 0;      // gRPC status code; 0 = OK
  std::string error;        // status message when failed
  int prompt_tokens = 0;
  int output_tokens = 0;    // tokens received
  double ttft_s = -1;       // send to first token; -1: no token came
  double e2e_s = 0;         // send to the end of the call
  // Gaps between consecutive tokens; tokens that arrive in one message share
  // the gap of the first and count 0 for the others (as the router's ITL).
  std::vector<double> token_gaps_s;

  bool ok() const { return status_code == 0; }
  // Mean inter-token latency (TPOT); 0 with fewer than 2 tokens.
  double mean_itl_s() const;
};

struct Slo {
  double ttft_s = 1.0;
  double itl_s = 0.1;  // on the per-request mean ITL (TPOT)
};

struct LatencySummary {
  int count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, max = 0;
};

struct Summary {
  int sent = 0;           // all requests, warm-up included
  int measured = 0;       // after the warm-up
  int succeeded = 0;      // measured and OK
  int failed = 0;         // measured and not OK
  std::map<std::string, int> failures;  // status code name -> count
  double window_s = 0;    // first measured send to last measured end
  double request_throughput = 0;        // succeeded / window
  double output_token_throughput = 0;   // tokens received by succeeded requests / window
  double prompt_token_throughput = 0;   // prompt tokens of succeeded requests / window
  LatencySummary ttft;    // succeeded requests
  LatencySummary itl;     // every token gap of succeeded requests, pooled
  LatencySummary tpot;    // per-request mean ITL
  LatencySummary e2e;     // succeeded requests
  Slo slo;
  int good = 0;           // succeeded, TTFT and TPOT within the SLOs
  double goodput = 0;     // good / window (requests/s)
  double goodput_ratio = 0;  // good / measured
};

// Linear interpolation between closest ranks (numpy's default); 0 if empty.
double Percentile(std::vector<double> values, double q);
LatencySummary Summarize(std::vector<double> values);
Summary Summarize(const std::vector<RequestRecord>& records, const Slo& slo);

// "OK", "UNAVAILABLE", ... for gRPC status codes.
std::string StatusCodeName(int code);

nlohmann::json ToJson(const Summary& summary);
// A fixed-width table for humans.
std::string ToTable(const Summary& summary, const std::string& title);
// One Markdown table row (latencies in ms) and its header, for docs.
std::string MarkdownHeader();
std::string MarkdownRow(const Summary& summary, const std::string& label);

}  // namespace pdserve::loadgen
