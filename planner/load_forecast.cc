#include "planner/load_forecast.h"

#include <algorithm>

namespace pdserve::planner {

void LoadForecast::Add(absl::Time time, double value, bool update_trend) {
  if (!last_.has_value()) {
    last_ = time;
    level_ = value;
    trend_ = 0;
    return;
  }
  const double dt = absl::ToDoubleSeconds(time - *last_);
  if (dt <= 0) {  // same instant (or out of order): fold into the level only
    level_ = options_.alpha * value + (1 - options_.alpha) * level_;
    return;
  }
  last_ = time;
  if (!update_trend) {  // a new regime: the level starts from it
    level_ = value;
    return;
  }
  const double previous = level_;
  level_ = options_.alpha * value + (1 - options_.alpha) * (level_ + trend_ * dt);
  trend_ = options_.beta * (level_ - previous) / dt + (1 - options_.beta) * trend_;
}

std::optional<double> LoadForecast::Forecast(absl::Duration horizon) const {
  if (!last_.has_value()) return std::nullopt;
  return std::max(0.0, level_ + trend_ * absl::ToDoubleSeconds(horizon));
}

}  // namespace pdserve::planner
