// Both metric sources reduce the same series the same way: the scraper
// from text exposition it fetched (here handed in), the Prometheus source
// from query answers (here a fake API). Absent series stay absent.
#include <cmath>
#include <map>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "gtest/gtest.h"
#include "planner/prometheus_source.h"
#include "planner/scrape_source.h"

namespace pdserve::planner {
namespace {

const absl::Time kT0 = absl::FromUnixSeconds(1700000000);

// A router exposition: `ttft_fast` requests with TTFT in (0.1, 0.2], `slow`
// in (1, 2]; ITL gaps all in (0.01, 0.02].
std::string Router(double requests, double ttft_fast, double ttft_slow, double gaps, double prompt,
                   double generated, int prefill_workers, int decode_workers) {
  const double ttft = ttft_fast + ttft_slow;
  return absl::StrCat("# TYPE pdserve_time_to_first_token_seconds histogram\n",
                      "pdserve_time_to_first_token_seconds_bucket{le=\"0.1\"} 0\n",
                      "pdserve_time_to_first_token_seconds_bucket{le=\"0.2\"} ", ttft_fast, "\n",
                      "pdserve_time_to_first_token_seconds_bucket{le=\"1\"} ", ttft_fast, "\n",
                      "pdserve_time_to_first_token_seconds_bucket{le=\"2\"} ", ttft, "\n",
                      "pdserve_time_to_first_token_seconds_bucket{le=\"+Inf\"} ", ttft, "\n",
                      "pdserve_time_to_first_token_seconds_count ", ttft, "\n",
                      "pdserve_inter_token_latency_seconds_bucket{le=\"0.01\"} 0\n",
                      "pdserve_inter_token_latency_seconds_bucket{le=\"0.02\"} ", gaps, "\n",
                      "pdserve_inter_token_latency_seconds_bucket{le=\"+Inf\"} ", gaps, "\n",
                      "pdserve_requests_total{finish_reason=\"length\"} ", requests, "\n",
                      "pdserve_requests_total{finish_reason=\"stop\"} 0\n",
                      "pdserve_prompt_tokens_total ", prompt, "\n",
                      "pdserve_generation_tokens_total ", generated, "\n",
                      "pdserve_pool_workers{pool=\"prefill\"} ", prefill_workers, "\n",
                      "pdserve_pool_workers{pool=\"decode\"} ", decode_workers, "\n");
}

TEST(ScrapeSourceTest, RatesAndQuantilesOverTheWindow) {
  std::map<std::string, std::string> pages;
  ScrapeSource source({.window = absl::Seconds(10), .quantile = 0.9},
                      StaticTargets({.router = {"127.0.0.1:1"},
                                     .prefill = {"127.0.0.1:2"},
                                     .decode = {"127.0.0.1:3", "127.0.0.1:4"}}),
                      [&](const std::string& t) -> absl::StatusOr<std::string> {
                        auto it = pages.find(t);
                        if (it == pages.end()) return absl::UnavailableError("down");
                        return it->second;
                      });
  pages["127.0.0.1:1"] = Router(10, 10, 0, 100, 1000, 500, 1, 2);
  auto prefill_page = [](double computed, double step_seconds) {
    return absl::StrCat("pdserve_prefill_queued_tokens 300\npdserve_prefill_batch_tokens_sum ",
                        computed, "\npdserve_prefill_step_seconds_sum ", step_seconds, "\n");
  };
  pages["127.0.0.1:2"] = prefill_page(1000, 3);
  pages["127.0.0.1:3"] =
      "pdserve_decode_running_sequences 4\npdserve_decode_waiting_kv_sequences 1\n"
      "pdserve_kv_cache_usage_ratio 0.5\n";
  pages["127.0.0.1:4"] =
      "pdserve_decode_running_sequences 2\npdserve_decode_waiting_kv_sequences 0\n"
      "pdserve_kv_cache_usage_ratio 0.25\n";
  Observation first = source.Read(kT0);
  EXPECT_FALSE(first.ttft_s.has_value()) << "one scrape is no window";
  EXPECT_EQ(first.ready_workers.decode, 2);
  EXPECT_DOUBLE_EQ(*first.prefill_queued_tokens, 300);
  EXPECT_DOUBLE_EQ(*first.decode_sequences, 7);
  EXPECT_DOUBLE_EQ(*first.decode_kv_usage, 0.375);
  ASSERT_TRUE(first.prefill_tokens_per_busy_s.has_value());
  EXPECT_TRUE(std::isnan(*first.prefill_tokens_per_busy_s)) << "one scrape is no window";

  // 10 s later: 20 more requests, all slow; 2000 prompt tokens, 1000 generated.
  pages["127.0.0.1:1"] = Router(30, 10, 20, 300, 3000, 1500, 1, 2);
  pages["127.0.0.1:2"] = prefill_page(3000, 7);  // 2000 tokens in 4 s of steps
  Observation o = source.Read(kT0 + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(*o.prefill_tokens_per_busy_s, 500);
  ASSERT_TRUE(o.ttft_s.has_value());
  EXPECT_DOUBLE_EQ(*o.ttft_count, 20);
  EXPECT_NEAR(*o.ttft_s, 1.9, 1e-9);  // all 20 in (1, 2]: p90 interpolates to 1.9
  EXPECT_DOUBLE_EQ(*o.itl_count, 200);
  EXPECT_DOUBLE_EQ(*o.request_rate, 2);
  EXPECT_DOUBLE_EQ(*o.prompt_tokens_per_s, 200);
  EXPECT_DOUBLE_EQ(*o.output_tokens_per_s, 100);

  // No traffic: present, with no observations.
  Observation idle = source.Read(kT0 + absl::Seconds(20));
  ASSERT_TRUE(idle.ttft_s.has_value());
  EXPECT_TRUE(std::isnan(*idle.ttft_s));
  EXPECT_DOUBLE_EQ(*idle.ttft_count, 0);
  EXPECT_DOUBLE_EQ(*idle.prompt_tokens_per_s, 0);
  EXPECT_TRUE(std::isnan(*idle.prefill_tokens_per_busy_s)) << "no step: nothing to measure";

  // A decode worker stops answering: decode's gauges are absent, the rest stays.
  pages.erase("127.0.0.1:4");
  Observation partial = source.Read(kT0 + absl::Seconds(30));
  EXPECT_FALSE(partial.decode_sequences.has_value());
  EXPECT_FALSE(partial.decode_kv_usage.has_value());
  EXPECT_TRUE(partial.prefill_queued_tokens.has_value());
  EXPECT_TRUE(partial.ttft_s.has_value());

  // The router is gone: everything it reports is absent.
  pages.erase("127.0.0.1:1");
  Observation blind = source.Read(kT0 + absl::Seconds(40));
  EXPECT_FALSE(blind.ttft_s.has_value());
  EXPECT_FALSE(blind.ready_workers.prefill.has_value());
  EXPECT_FALSE(blind.output_tokens_per_s.has_value());
}

TEST(ScrapeSourceTest, ARestartedRouterCountsFromZero) {
  std::string page = Router(100, 100, 0, 1000, 10000, 5000, 1, 1);
  ScrapeSource source({.window = absl::Seconds(10)}, StaticTargets({.router = {"127.0.0.1:1"}}),
                      [&](const std::string&) -> absl::StatusOr<std::string> { return page; });
  source.Read(kT0);
  page = Router(5, 5, 0, 50, 500, 250, 1, 1);
  Observation o = source.Read(kT0 + absl::Seconds(10));
  EXPECT_DOUBLE_EQ(*o.prompt_tokens_per_s, 50);
  EXPECT_DOUBLE_EQ(*o.ttft_count, 5);
}

TEST(ScrapeSourceTest, DecodeLatencyFromThePerRequestHistogramWhenAsked) {
  // Gaps all in (0.01, 0.02]; the 8 requests' mean gaps in (0.005, 0.01].
  double gaps = 100, requests = 8;
  auto page = [&] {
    return absl::StrCat(Router(requests, requests, 0, gaps, 100, 100, 1, 1),
                        "pdserve_time_per_output_token_seconds_bucket{le=\"0.005\"} 0\n",
                        "pdserve_time_per_output_token_seconds_bucket{le=\"0.01\"} ", requests,
                        "\n", "pdserve_time_per_output_token_seconds_bucket{le=\"+Inf\"} ",
                        requests, "\n");
  };
  auto fetch = [&](const std::string&) -> absl::StatusOr<std::string> { return page(); };
  ScrapeSource gap({.window = absl::Seconds(10)}, StaticTargets({.router = {"127.0.0.1:1"}}),
                   fetch);
  ScrapeSource tpot({.window = absl::Seconds(10), .decode_latency_metric = kTpotMetric},
                    StaticTargets({.router = {"127.0.0.1:1"}}), fetch);
  gap.Read(kT0);
  tpot.Read(kT0);
  gaps = 300, requests = 18;
  Observation by_gap = gap.Read(kT0 + absl::Seconds(10));
  Observation by_request = tpot.Read(kT0 + absl::Seconds(10));
  EXPECT_NEAR(*by_gap.itl_s, 0.019, 1e-9);
  EXPECT_DOUBLE_EQ(*by_gap.itl_count, 200);
  EXPECT_NEAR(*by_request.itl_s, 0.0095, 1e-9);
  EXPECT_DOUBLE_EQ(*by_request.itl_count, 10);
  EXPECT_EQ(MakeQueries({.window = absl::Seconds(60), .decode_latency_metric = kTpotMetric}).itl,
            "histogram_quantile(0.9, sum by (le) (rate(pdserve_time_per_output_token_seconds_bucket"
            "{job=\"router\"}[60s])))");
}

TEST(ScrapeSourceTest, TheDemandNowOverTheShorterRateWindow) {
  // Scrapes every 2 s; 100 prompt tokens/s for 6 s, then 500/s. Over the
  // 10 s window the rate lags; over the last 4 s it is the new one.
  double prompt = 0, requests = 0, generated = 0;
  ScrapeSource source({.window = absl::Seconds(10), .rate_window = absl::Seconds(4)},
                      StaticTargets({.router = {"127.0.0.1:1"}}),
                      [&](const std::string&) -> absl::StatusOr<std::string> {
                        return Router(requests, requests, 0, 10, prompt, generated, 1, 1);
                      });
  Observation first = source.Read(kT0);
  EXPECT_FALSE(first.recent_prompt_tokens_per_s.has_value()) << "one scrape is no window";
  Observation o;
  for (int s = 2; s <= 10; s += 2) {
    const double rate = s <= 6 ? 100 : 500;
    prompt += 2 * rate;
    requests += 2 * rate / 100;
    generated += 2 * 50;
    o = source.Read(kT0 + absl::Seconds(s));
  }
  EXPECT_DOUBLE_EQ(*o.prompt_tokens_per_s, (600 + 2000) / 10.0);
  EXPECT_DOUBLE_EQ(*o.recent_prompt_tokens_per_s, 500);
  EXPECT_DOUBLE_EQ(*o.recent_request_rate, 5);
  EXPECT_DOUBLE_EQ(*o.recent_output_tokens_per_s, 50);

  // A router that does not export max_tokens requested leaves it absent,
  // and the rest of the window as it was.
  EXPECT_FALSE(o.requested_tokens_per_s.has_value());
  EXPECT_FALSE(o.recent_requested_tokens_per_s.has_value());

  // Without a rate window the recent rates are absent.
  ScrapeSource plain({.window = absl::Seconds(10)}, StaticTargets({.router = {"127.0.0.1:1"}}),
                     [&](const std::string&) -> absl::StatusOr<std::string> {
                       return Router(requests, requests, 0, 10, prompt, generated, 1, 1);
                     });
  plain.Read(kT0);
  prompt += 100;
  EXPECT_FALSE(plain.Read(kT0 + absl::Seconds(2)).recent_prompt_tokens_per_s.has_value());
}

TEST(ScrapeSourceTest, MaxTokensRequestedOverBothWindows) {
  // 40 requested tokens/s for 6 s, then 200/s.
  double requested = 0, generated = 0;
  ScrapeSource source({.window = absl::Seconds(10), .rate_window = absl::Seconds(4)},
                      StaticTargets({.router = {"127.0.0.1:1"}}),
                      [&](const std::string&) -> absl::StatusOr<std::string> {
                        return absl::StrCat(Router(1, 1, 0, 10, 100, generated, 1, 1),
                                            "pdserve_requested_max_tokens_total ", requested, "\n");
                      });
  EXPECT_FALSE(source.Read(kT0).requested_tokens_per_s.has_value()) << "one scrape is no window";
  Observation o;
  for (int s = 2; s <= 10; s += 2) {
    requested += 2 * (s <= 6 ? 40 : 200);
    generated += 2 * 30;
    o = source.Read(kT0 + absl::Seconds(s));
  }
  EXPECT_DOUBLE_EQ(*o.requested_tokens_per_s, (240 + 800) / 10.0);
  EXPECT_DOUBLE_EQ(*o.recent_requested_tokens_per_s, 200);
  EXPECT_DOUBLE_EQ(*o.output_tokens_per_s, 30);
}

TEST(PrometheusSourceTest, QueriesAndAnswers) {
  PrometheusSourceOptions options{.url = "http://unused",
                                  .selector = "namespace=\"pdserve\"",
                                  .window = absl::Seconds(60),
                                  .quantile = 0.9};
  const PrometheusQueries q = MakeQueries(options);
  EXPECT_EQ(q.ttft,
            "histogram_quantile(0.9, sum by (le) (rate(pdserve_time_to_first_token_seconds_bucket"
            "{job=\"router\",namespace=\"pdserve\"}[60s])))");
  EXPECT_EQ(q.queued_tokens,
            "sum(pdserve_prefill_queued_tokens{job=\"prefill\",namespace=\"pdserve\"})");
  EXPECT_EQ(q.prefill_busy_rate,
            "sum(rate(pdserve_prefill_batch_tokens_sum{job=\"prefill\",namespace=\"pdserve\"}"
            "[60s])) / sum(rate(pdserve_prefill_step_seconds_sum{job=\"prefill\","
            "namespace=\"pdserve\"}[60s]))");
  auto vector = [](const std::string& samples) {
    return absl::StrCat(R"({"status":"success","data":{"resultType":"vector","result":[)", samples,
                        "]}}");
  };
  auto one = [&](const std::string& v) {
    return vector(absl::StrCat(R"({"metric":{},"value":[1700000000,")", v, R"("]})"));
  };
  std::map<std::string, std::string> answers = {
      {q.ttft, one("1.5")},
      {q.ttft_count, one("40")},
      {q.itl, one("NaN")},
      {q.itl_count, one("0")},
      {q.request_rate, one("0.5")},
      {q.prompt_tokens, one("250")},
      {q.output_tokens, one("0")},
      {q.queued_tokens, vector("")},  // no series: absent
      {q.prefill_busy_rate, one("480")},
      {q.decode_sequences, one("3")},
      {q.kv_usage, one("0.2")},
      {q.requested_tokens, one("900")},
      {q.pool_workers, vector(R"({"metric":{"pool":"prefill"},"value":[1,"2"]},)"
                              R"({"metric":{"pool":"decode"},"value":[1,"1"]})")},
  };
  PrometheusSource source(options, [&](const std::string& promql) -> absl::StatusOr<std::string> {
    auto it = answers.find(promql);
    if (it == answers.end()) return absl::NotFoundError(promql);
    return it->second;
  });
  Observation o = source.Read(kT0);
  EXPECT_DOUBLE_EQ(*o.ttft_s, 1.5);
  EXPECT_DOUBLE_EQ(*o.ttft_count, 40);
  EXPECT_TRUE(std::isnan(*o.itl_s));
  EXPECT_DOUBLE_EQ(*o.prompt_tokens_per_s, 250);
  EXPECT_FALSE(o.prefill_queued_tokens.has_value());
  EXPECT_DOUBLE_EQ(*o.prefill_tokens_per_busy_s, 480);
  EXPECT_EQ(o.ready_workers.prefill, 2);
  EXPECT_EQ(o.ready_workers.decode, 1);
  EXPECT_DOUBLE_EQ(*o.requested_tokens_per_s, 900);
  EXPECT_EQ(q.requested_tokens,
            "sum(rate(pdserve_requested_max_tokens_total{job=\"router\",namespace=\"pdserve\"}"
            "[60s]))");

  answers[q.request_rate] = R"({"status":"error","error":"bad query"})";
  EXPECT_FALSE(source.Read(kT0).request_rate.has_value());
  EXPECT_FALSE(o.recent_prompt_tokens_per_s.has_value()) << "no rate window: not queried";

  // With a rate window, the router's rates over it too.
  options.rate_window = absl::Seconds(15);
  const PrometheusQueries r = MakeQueries(options);
  EXPECT_EQ(r.recent_prompt_tokens,
            "sum(rate(pdserve_prompt_tokens_total{job=\"router\",namespace=\"pdserve\"}[15s]))");
  EXPECT_TRUE(q.recent_prompt_tokens.empty());
  EXPECT_EQ(r.recent_requested_tokens,
            "sum(rate(pdserve_requested_max_tokens_total{job=\"router\",namespace=\"pdserve\"}"
            "[15s]))");
}

}  // namespace
}  // namespace pdserve::planner
