// Runs a planned workload against a pdserve.v1.Generation server (the router
// of a disaggregated cluster, or pdserve_colocated) and records every
// request. Requests are sent at their planned times by a pool of
// `concurrency` threads, one call each: when every thread is busy a request
// waits for one (the concurrency cap), and its latencies count from when it
// was actually sent.
#pragma once

#include <string>
#include <vector>

#include "bench/loadgen/stats.h"
#include "bench/loadgen/workload.h"

namespace pdserve::loadgen {

struct RunOptions {
  std::string target;          // host:port
  int concurrency = 64;        // calls in flight at most
  double warmup_s = 0;         // requests planned before this are not measured
  double request_timeout_s = 300;
  float temperature = 0;       // 0: greedy
  bool progress = true;        // a line on stderr every 5 s
  // > 0: every request asks for max_tokens tokens, and the client ends its
  // stream after its planned output length (as a router does when a stop
  // string matches, or a model emitting its stop token), counting it a
  // success. 0: requests ask for exactly their planned output length.
  int max_tokens = 0;
};

std::vector<RequestRecord> RunLoad(const std::vector<PlannedRequest>& plan, const RunOptions& options);

}  // namespace pdserve::loadgen
