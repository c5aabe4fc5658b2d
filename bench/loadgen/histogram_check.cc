#include "bench/loadgen/histogram_check.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/loadgen/stats.h"
#include "httplib.h"

namespace pdserve::loadgen {

Buckets ParseHistogram(const std::string& exposition, const std::string& name) {
  return HistogramOf(ParseExposition(exposition), name);
}

absl::StatusOr<std::string> Scrape(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: ", host_port));
  }
  httplib::Client client(host_port.substr(0, colon), port);
  client.set_connection_timeout(5);
  client.set_read_timeout(10);
  auto res = client.Get("/metrics");
  if (!res || res->status != 200) {
    return absl::UnavailableError(absl::StrCat("GET http://", host_port, "/metrics failed"));
  }
  return res->body;
}

HistogramCheck CheckHistogram(const std::string& metric, const Buckets& run_buckets,
                              const std::vector<double>& client_values) {
  HistogramCheck out{.metric = metric,
                     .observations = run_buckets.empty() ? 0 : run_buckets.rbegin()->second};
  std::vector<double> sorted = client_values;
  std::sort(sorted.begin(), sorted.end());
  for (double q : {0.5, 0.9, 0.99}) {
    const double rank = std::ceil(q * static_cast<double>(sorted.size()));
    const size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
    out.quantiles.push_back({.q = q,
                             .client = Percentile(client_values, q),
                             .client_rank_rule = sorted.empty() ? 0 : sorted[index],
                             .histogram = HistogramQuantile(q, run_buckets)});
  }
  return out;
}

nlohmann::json ToJson(const std::vector<HistogramCheck>& checks) {
  nlohmann::json out = nlohmann::json::object();
  for (const HistogramCheck& c : checks) {
    nlohmann::json m = {{"observations", c.observations}};
    for (const QuantileCheck& q : c.quantiles) {
      m[absl::StrCat("p", static_cast<int>(std::lround(q.q * 100)))] = {
          {"client_s", q.client},
          {"histogram_s", std::isnan(q.histogram) ? nlohmann::json() : nlohmann::json(q.histogram)},
          {"relative_difference", q.relative_difference()},
          {"client_rank_rule_s", q.client_rank_rule},
          {"bucket_error", q.bucket_error()}};
    }
    out[c.metric] = m;
  }
  return out;
}

namespace {
std::string Ms(double seconds) { return absl::StrFormat("%.1f", seconds * 1e3); }
std::string Cell(const QuantileCheck& q) {
  return absl::StrFormat("%s / %s (%+.0f%%)", Ms(q.client), Ms(q.histogram),
                         q.relative_difference() * 100);
}
}  // namespace

std::string ToTable(const std::vector<HistogramCheck>& checks) {
  std::string out =
      "server histograms against client percentiles (ms: client / histogram; then the client's "
      "value by Prometheus's rank rule)\n";
  for (const HistogramCheck& c : checks) {
    absl::StrAppend(&out,
                    absl::StrFormat("  %-40s %7.0f observations\n", c.metric, c.observations));
    for (const QuantileCheck& q : c.quantiles) {
      absl::StrAppend(&out, absl::StrFormat("    p%-3d %s; rank rule %s (%+.0f%%)\n",
                                            static_cast<int>(std::lround(q.q * 100)), Cell(q),
                                            Ms(q.client_rank_rule), q.bucket_error() * 100));
    }
  }
  return out;
}

std::string HistogramMarkdownHeader() {
  return "| run | TTFT p50 | TTFT p90 | TTFT p99 | ITL p50 | ITL p90 | ITL p99 | TTFT p99 bucket "
         "error | ITL p99 bucket error |\n"
         "| --- | --- | --- | --- | --- | --- | --- | --- | --- |\n";
}

std::string HistogramMarkdownRow(const std::vector<HistogramCheck>& checks,
                                 const std::string& label) {
  std::string row = absl::StrCat("| ", label);
  for (const HistogramCheck& c : checks) {
    for (const QuantileCheck& q : c.quantiles) absl::StrAppend(&row, " | ", Cell(q));
  }
  for (const HistogramCheck& c : checks) {
    if (!c.quantiles.empty()) {
      absl::StrAppend(&row, absl::StrFormat(" | %+.0f%%", c.quantiles.back().bucket_error() * 100));
    }
  }
  return row + " |\n";
}

}  // namespace pdserve::loadgen
