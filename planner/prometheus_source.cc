#include "planner/prometheus_source.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

std::string Matchers(const std::string& job, const std::string& selector) {
  return absl::StrCat("{job=\"", job, "\"", selector.empty() ? "" : ",", selector, "}");
}

// Samples of an instant-vector answer: labels -> value. Error on a failed
// query; an empty map when it returned no series.
absl::StatusOr<std::vector<std::pair<nlohmann::json, double>>> ParseVector(
    const std::string& body) {
  nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || j.value("status", "") != "success") {
    return absl::UnavailableError(
        absl::StrCat("query failed: ",
                     j.is_object() ? j.value("error", body.substr(0, 200)) : body.substr(0, 200)));
  }
  const nlohmann::json& data = j["data"];
  if (!data.is_object() || data.value("resultType", "") != "vector" || !data["result"].is_array()) {
    return absl::UnavailableError("query answer is not an instant vector");
  }
  std::vector<std::pair<nlohmann::json, double>> out;
  for (const nlohmann::json& r : data["result"]) {
    if (!r.contains("value") || !r["value"].is_array() || r["value"].size() != 2 ||
        !r["value"][1].is_string()) {
      continue;
    }
    const std::string text = r["value"][1].get<std::string>();
    double v;
    if (text == "NaN") {
      v = std::nan("");
    } else if (!absl::SimpleAtod(text, &v)) {
      continue;
    }
    out.emplace_back(r.value("metric", nlohmann::json::object()), v);
  }
  return out;
}

}  // namespace

PrometheusQueries MakeQueries(const PrometheusSourceOptions& o) {
  const std::string router = Matchers("router", o.selector);
  const std::string prefill = Matchers("prefill", o.selector);
  const std::string decode = Matchers("decode", o.selector);
  const std::string w = absl::StrCat("[", absl::ToInt64Seconds(o.window), "s]");
  const std::string q = absl::StrCat(o.quantile);
  auto quantile = [&](const char* metric) {
    return absl::StrCat("histogram_quantile(", q, ", sum by (le) (rate(", metric, "_bucket", router,
                        w, ")))");
  };
  auto increase = [&](const char* metric) {
    return absl::StrCat("sum(increase(", metric, "_count", router, w, "))");
  };
  auto rate = [&](const char* metric) {
    return absl::StrCat("sum(rate(", metric, router, w, "))");
  };
  const int64_t recent_s = absl::ToInt64Seconds(std::min(o.rate_window, o.window));
  auto recent = [&](const char* metric) {
    return recent_s <= 0 ? std::string()
                         : absl::StrCat("sum(rate(", metric, router, "[", recent_s, "s]))");
  };
  return PrometheusQueries{
      .ttft = quantile(kTtftMetric),
      .ttft_count = increase(kTtftMetric),
      .itl = quantile(o.decode_latency_metric.c_str()),
      .itl_count = increase(o.decode_latency_metric.c_str()),
      .request_rate = rate(kRequestsMetric),
      .prompt_tokens = rate(kPromptTokensMetric),
      .output_tokens = rate(kGenerationTokensMetric),
      .queued_tokens = absl::StrCat("sum(", kQueuedTokensMetric, prefill, ")"),
      // Prompt tokens per second of step time (NaN with no step in the window).
      .prefill_busy_rate =
          absl::StrCat("sum(rate(", kPrefillBatchTokensMetric, "_sum", prefill, w, ")) / sum(rate(",
                       kPrefillStepSecondsMetric, "_sum", prefill, w, "))"),
      .decode_sequences = absl::StrCat("sum(", kRunningSequencesMetric, decode, ") + sum(",
                                       kWaitingKvSequencesMetric, decode, ")"),
      .kv_usage = absl::StrCat("avg(", kKvUsageMetric, decode, ")"),
      .pool_workers = absl::StrCat("sum by (pool) (", kPoolWorkersMetric, router, ")"),
      .requested_tokens = rate(kRequestedTokensMetric),
      .recent_request_rate = recent(kRequestsMetric),
      .recent_prompt_tokens = recent(kPromptTokensMetric),
      .recent_output_tokens = recent(kGenerationTokensMetric),
      .recent_requested_tokens = recent(kRequestedTokensMetric),
  };
}

PrometheusSource::PrometheusSource(PrometheusSourceOptions options)
    : PrometheusSource(options, nullptr) {
  HttpOptions http = options_.http;
  std::string base = options_.url;
  while (!base.empty() && base.back() == '/') base.pop_back();
  query_ = [http, base](const std::string& promql) -> absl::StatusOr<std::string> {
    absl::StatusOr<HttpResponse> r = HttpRequest(
        "GET", absl::StrCat(base, "/api/v1/query?query=", UrlEncode(promql)), "", "", http);
    if (!r.ok()) return r.status();
    if (r->status != 200 && r->status != 400 && r->status != 422) {
      return absl::UnavailableError(absl::StrCat("Prometheus answered HTTP ", r->status));
    }
    return std::move(r->body);
  };
}

PrometheusSource::PrometheusSource(PrometheusSourceOptions options, QueryFn query)
    : options_(std::move(options)), queries_(MakeQueries(options_)), query_(std::move(query)) {}

Observation PrometheusSource::Read(absl::Time now) {
  Observation o{.time = now};
  auto scalar = [&](const std::string& promql) -> std::optional<double> {
    absl::StatusOr<std::string> body = query_(promql);
    if (!body.ok()) {
      PDSERVE_LOG(WARNING) << "planner: " << promql << ": " << body.status();
      return std::nullopt;
    }
    auto samples = ParseVector(*body);
    if (!samples.ok()) {
      PDSERVE_LOG(WARNING) << "planner: " << promql << ": " << samples.status();
      return std::nullopt;
    }
    if (samples->empty()) return std::nullopt;
    return samples->front().second;
  };
  o.ttft_s = scalar(queries_.ttft);
  o.ttft_count = scalar(queries_.ttft_count);
  o.itl_s = scalar(queries_.itl);
  o.itl_count = scalar(queries_.itl_count);
  o.request_rate = scalar(queries_.request_rate);
  o.prompt_tokens_per_s = scalar(queries_.prompt_tokens);
  o.output_tokens_per_s = scalar(queries_.output_tokens);
  if (!queries_.recent_request_rate.empty()) {
    o.recent_request_rate = scalar(queries_.recent_request_rate);
    o.recent_prompt_tokens_per_s = scalar(queries_.recent_prompt_tokens);
    o.recent_output_tokens_per_s = scalar(queries_.recent_output_tokens);
    o.recent_requested_tokens_per_s = scalar(queries_.recent_requested_tokens);
  }
  o.requested_tokens_per_s = scalar(queries_.requested_tokens);
  o.prefill_queued_tokens = scalar(queries_.queued_tokens);
  o.prefill_tokens_per_busy_s = scalar(queries_.prefill_busy_rate);
  o.decode_sequences = scalar(queries_.decode_sequences);
  o.decode_kv_usage = scalar(queries_.kv_usage);
  absl::StatusOr<std::string> body = query_(queries_.pool_workers);
  if (body.ok()) {
    auto samples = ParseVector(*body);
    if (samples.ok()) {
      for (const auto& [labels, value] : *samples) {
        for (Pool pool : kPools) {
          if (labels.value("pool", "") == PoolName(pool) && std::isfinite(value)) {
            o.ready_workers[pool] = static_cast<int>(std::lround(value));
          }
        }
      }
    }
  }
  return o;
}

}  // namespace pdserve::planner
