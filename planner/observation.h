// What the planner reads each interval: the router's and the pools' metrics
// over a trailing window, reduced to plain numbers. A metric source
// (metrics_source.h) fills it; the decision logic (decision.h) consumes it.
//
// An empty optional means the series was absent: a scrape failed, a target
// is down, a metric is not exported. The planner then freezes what depends
// on it; it never reads an absent series as zero. A series that is present
// with no observations in the window (no traffic) is a value: a rate of 0,
// a latency count of 0.
#pragma once

#include <array>
#include <optional>
#include <string_view>

#include "absl/time/time.h"

namespace pdserve::planner {

enum class Pool { kPrefill, kDecode };
inline constexpr std::array<Pool, 2> kPools = {Pool::kPrefill, Pool::kDecode};

constexpr const char* PoolName(Pool pool) {
  switch (pool) {
    case Pool::kPrefill:
      return "prefill";
    case Pool::kDecode:
      return "decode";
  }
  return "";
}

// A pair of values, one per pool.
template <typename T>
struct PerPool {
  T prefill{};
  T decode{};
  T& operator[](Pool pool) { return pool == Pool::kPrefill ? prefill : decode; }
  const T& operator[](Pool pool) const { return pool == Pool::kPrefill ? prefill : decode; }
};

struct Observation {
  absl::Time time;
  // Router, over the window: the latency quantile the SLOs are stated for
  // (seconds; NaN when the window holds no observation) and how many
  // observations it rests on.
  std::optional<double> ttft_s;
  std::optional<double> ttft_count;
  std::optional<double> itl_s;
  std::optional<double> itl_count;
  // Router, over the window: finished requests/s, prompt tokens/s of
  // admitted requests (demand on prefill), generated tokens/s streamed
  // (work done by decode).
  std::optional<double> request_rate;
  std::optional<double> prompt_tokens_per_s;
  std::optional<double> output_tokens_per_s;
  // The same three rates over a shorter trailing window (the source's
  // rate_window): the demand now. The window above pairs its rates with
  // its latency quantiles (what the capacity curves learn from) and lags a
  // shift in the mix by up to its length. Absent (no shorter window
  // configured, or not yet two scrapes in it): the window's rates stand in.
  std::optional<double> recent_request_rate;
  std::optional<double> recent_prompt_tokens_per_s;
  std::optional<double> recent_output_tokens_per_s;
  // Router: max_tokens of admitted requests per second, over the window and
  // over the shorter one (the most decode may be asked for). Absent where
  // the router does not export it: the decode pool's demand is then the
  // tokens it streams alone.
  std::optional<double> requested_tokens_per_s;
  std::optional<double> recent_requested_tokens_per_s;
  // Pools, now: prompt tokens waiting for a prefill batch (summed over the
  // pool), decode sequences held (running + waiting for KV, summed), and the
  // decode pool's mean KV-cache usage ratio.
  std::optional<double> prefill_queued_tokens;
  // Prefill pool, over the window: prompt tokens computed per second of
  // step wall time, summed over its workers' steps: how fast one worker
  // prefills while it computes (queueing excluded). NaN when no step ran in
  // the window (nothing to measure: a value, not an absence).
  std::optional<double> prefill_tokens_per_busy_s;
  std::optional<double> decode_sequences;
  std::optional<double> decode_kv_usage;
  // Workers per pool registered with the router (serving now).
  PerPool<std::optional<int>> ready_workers;
};

}  // namespace pdserve::planner
