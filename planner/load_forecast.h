// A short-term forecast of a load series (tokens/s): Holt's linear
// exponential smoothing with irregular sampling times. The level follows
// the observations with weight `alpha`, the trend (per second) follows the
// level's changes with weight `beta`; the forecast `horizon` ahead is
// level + trend x horizon, never below zero. Pure: time is an input.
#pragma once

#include <optional>

#include "absl/time/time.h"

namespace pdserve::planner {

class LoadForecast {
 public:
  struct Options {
    double alpha = 0.5;
    double beta = 0.3;
  };
  explicit LoadForecast(Options options) : options_(options) {}
  LoadForecast() : LoadForecast(Options{}) {}

  // `update_trend` false: the level restarts from `value` and the trend is
  // kept (a jump that is not growth: served throughput rising because
  // workers were added).
  void Add(absl::Time time, double value, bool update_trend = true);
  void ResetTrend() { trend_ = 0; }
  // Level + trend x horizon (>= 0); none before the first value.
  std::optional<double> Forecast(absl::Duration horizon) const;
  double trend_per_s() const { return trend_; }

 private:
  Options options_;
  std::optional<absl::Time> last_;
  double level_ = 0;
  double trend_ = 0;  // per second
};

}  // namespace pdserve::planner
