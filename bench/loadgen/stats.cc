#include "bench/loadgen/stats.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace pdserve::loadgen {

double RequestRecord::mean_itl_s() const {
  if (token_gaps_s.empty()) return 0;
  double sum = 0;
  for (double g : token_gaps_s) sum += g;
  return sum / static_cast<double>(token_gaps_s.size());
}

double Percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const double pos = q * static_cast<double>(values.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, values.size() - 1);
  return values[lo] + (values[hi] - values[lo]) * (pos - static_cast<double>(lo));
}

LatencySummary Summarize(std::vector<double> values) {
  LatencySummary s;
  s.count = static_cast<int>(values.size());
  if (values.empty()) return s;
  double sum = 0;
  for (double v : values) sum += v;
  s.mean = sum / static_cast<double>(values.size());
  s.max = *std::max_element(values.begin(), values.end());
  s.p50 = Percentile(values, 0.50);
  s.p90 = Percentile(values, 0.90);
  s.p99 = Percentile(std::move(values), 0.99);
  return s;
}

Summary Summarize(const std::vector<RequestRecord>& records, const Slo& slo) {
  Summary s;
  s.slo = slo;
  std::vector<double> ttft, itl, tpot, e2e;
  double first_send = std::numeric_limits<double>::infinity();
  double last_end = -std::numeric_limits<double>::infinity();
  int64_t output_tokens = 0, prompt_tokens = 0;
  for (const RequestRecord& r : records) {
    ++s.sent;
    if (r.warmup) continue;
    ++s.measured;
    first_send = std::min(first_send, r.send_s);
    last_end = std::max(last_end, r.send_s + r.e2e_s);
    if (!r.ok()) {
      ++s.failed;
      ++s.failures[StatusCodeName(r.status_code)];
      continue;
    }
    ++s.succeeded;
    output_tokens += r.output_tokens;
    prompt_tokens += r.prompt_tokens;
    ttft.push_back(r.ttft_s);
    e2e.push_back(r.e2e_s);
    itl.insert(itl.end(), r.token_gaps_s.begin(), r.token_gaps_s.end());
    if (r.output_tokens >= 2) tpot.push_back(r.mean_itl_s());
    if (r.ttft_s >= 0 && r.ttft_s <= slo.ttft_s && r.mean_itl_s() <= slo.itl_s) ++s.good;
  }
  s.window_s = s.measured > 0 ? std::max(last_end - first_send, 0.0) : 0;
  if (s.window_s > 0) {
    s.request_throughput = s.succeeded / s.window_s;
    s.output_token_throughput = static_cast<double>(output_tokens) / s.window_s;
    s.prompt_token_throughput = static_cast<double>(prompt_tokens) / s.window_s;
    s.goodput = s.good / s.window_s;
  }
  s.goodput_ratio = s.measured > 0 ? static_cast<double>(s.good) / s.measured : 0;
  s.ttft = Summarize(std::move(ttft));
  s.itl = Summarize(std::move(itl));
  s.tpot = Summarize(std::move(tpot));
  s.e2e = Summarize(std::move(e2e));
  return s;
}

std::string StatusCodeName(int code) {
  static const char* const kNames[] = {
      "OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT", "DEADLINE_EXCEEDED", "NOT_FOUND",
      "ALREADY_EXISTS", "PERMISSION_DENIED", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION",
      "ABORTED", "OUT_OF_RANGE", "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code >= 0 && code < static_cast<int>(std::size(kNames))) return kNames[code];
  return absl::StrFormat("CODE_%d", code);
}

namespace {
nlohmann::json LatencyJson(const LatencySummary& l) {
  return {{"count", l.count}, {"mean", l.mean}, {"p50", l.p50}, {"p90", l.p90}, {"p99", l.p99}, {"max", l.max}};
}
std::string Row(const char* name, const LatencySummary& l) {
  return absl::StrFormat("  %-22s %9.1f %9.1f %9.1f %9.1f %9.1f %8d\n", name, l.mean * 1e3, l.p50 * 1e3,
                         l.p90 * 1e3, l.p99 * 1e3, l.max * 1e3, l.count);
}
}  // namespace

nlohmann::json ToJson(const Summary& s) {
  nlohmann::json failures = nlohmann::json::object();
  for (const auto& [code, n] : s.failures) failures[code] = n;
  return {{"requests", {{"sent", s.sent}, {"measured", s.measured}, {"succeeded", s.succeeded},
                        {"failed", s.failed}, {"failures_by_code", failures}}},
          {"window_s", s.window_s},
          {"throughput", {{"requests_per_s", s.request_throughput},
                          {"output_tokens_per_s", s.output_token_throughput},
                          {"prompt_tokens_per_s", s.prompt_token_throughput}}},
          {"latency_s", {{"ttft", LatencyJson(s.ttft)}, {"itl", LatencyJson(s.itl)},
                         {"tpot", LatencyJson(s.tpot)}, {"e2e", LatencyJson(s.e2e)}}},
          {"goodput", {{"slo_ttft_s", s.slo.ttft_s}, {"slo_itl_s", s.slo.itl_s},
                       {"itl_statistic", "per-request mean (TPOT)"}, {"good_requests", s.good},
                       {"requests_per_s", s.goodput}, {"ratio", s.goodput_ratio}}}};
}

std::string ToTable(const Summary& s, const std::string& title) {
  std::string out = absl::StrFormat("== %s\n", title);
  out += absl::StrFormat("  requests: %d sent, %d measured (after warm-up), %d ok, %d failed\n", s.sent,
                         s.measured, s.succeeded, s.failed);
  for (const auto& [code, n] : s.failures) out += absl::StrFormat("    %-20s %d\n", code, n);
  out += absl::StrFormat("  window %.1f s: %.2f req/s, %.1f output tok/s, %.1f prompt tok/s\n", s.window_s,
                         s.request_throughput, s.output_token_throughput, s.prompt_token_throughput);
  out += absl::StrFormat("  %-22s %9s %9s %9s %9s %9s %8s\n", "latency (ms)", "mean", "p50", "p90", "p99", "max",
                         "n");
  out += Row("TTFT", s.ttft);
  out += Row("ITL (token gaps)", s.itl);
  out += Row("TPOT (req. mean ITL)", s.tpot);
  out += Row("E2E", s.e2e);
  out += absl::StrFormat("  goodput (TTFT <= %.0f ms and TPOT <= %.0f ms): %d requests, %.2f req/s, %.1f%% of measured\n",
                         s.slo.ttft_s * 1e3, s.slo.itl_s * 1e3, s.good, s.goodput, 100 * s.goodput_ratio);
  return out;
}

std::string MarkdownHeader() {
  return "| setup | ok / sent | req/s | out tok/s | TTFT p50 / p90 / p99 (ms) | ITL p50 / p90 / p99 (ms) "
         "| TPOT p50 / p90 (ms) | E2E p50 / p99 (ms) | goodput req/s (share) |\n"
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
}

std::string MarkdownRow(const Summary& s, const std::string& label) {
  return absl::StrFormat(
      "| %s | %d / %d | %.2f | %.1f | %.0f / %.0f / %.0f | %.1f / %.1f / %.1f | %.1f / %.1f | %.0f / %.0f "
      "| %.2f (%.0f%%) |\n",
      label, s.succeeded, s.measured, s.request_throughput, s.output_token_throughput, s.ttft.p50 * 1e3,
      s.ttft.p90 * 1e3, s.ttft.p99 * 1e3, s.itl.p50 * 1e3, s.itl.p90 * 1e3, s.itl.p99 * 1e3, s.tpot.p50 * 1e3,
      s.tpot.p90 * 1e3, s.e2e.p50 * 1e3, s.e2e.p99 * 1e3, s.goodput, 100 * s.goodput_ratio);
}

}  // namespace pdserve::loadgen
