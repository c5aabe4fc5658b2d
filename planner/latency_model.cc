#include "planner/latency_model.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace pdserve::planner {
namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

void LatencyModel::Add(absl::Time time, double throughput_per_worker, double latency_s) {
  if (!(latency_s > 0) || !std::isfinite(latency_s) || !(throughput_per_worker >= 0) ||
      !std::isfinite(throughput_per_worker)) {
    return;
  }
  points_.push_back({time, throughput_per_worker, latency_s});
  while (static_cast<int>(points_.size()) > options_.max_points) points_.pop_front();
  Refit(time);
}

void LatencyModel::Refit(absl::Time now) {
  const double memory_s = std::max(1e-3, absl::ToDoubleSeconds(options_.memory));
  double sw = 0, sx = 0, sz = 0, sxx = 0, sxz = 0;
  double min_y = kInf, max_x = 0;
  for (const Point& p : points_) {
    const double age = std::max(0.0, absl::ToDoubleSeconds(now - p.time));
    const double w = std::exp(-age / memory_s);
    const double z = 1.0 / p.y;
    sw += w;
    sx += w * p.x;
    sz += w * z;
    sxx += w * p.x * p.x;
    sxz += w * p.x * z;
    min_y = std::min(min_y, p.y);
    max_x = std::max(max_x, p.x);
  }
  Fit fit{.max_observed_x = max_x};
  const double mean_x = sx / sw, mean_z = sz / sw;
  const double var_x = sxx / sw - mean_x * mean_x;
  // A slope needs x spread over at least 10% of its mean.
  if (mean_x > 0 && var_x > 0 && std::sqrt(var_x) >= 0.1 * mean_x) {
    const double beta = -(sxz / sw - mean_x * mean_z) / var_x;  // z = alpha - beta x
    const double alpha = mean_z + beta * mean_x;
    if (alpha > 0 && beta > 0) {
      fit.y0 = 1.0 / alpha;
      fit.x_max = alpha / beta;
      fitted_x_max_ = fit.x_max;
      fit_ = fit;
      return;
    }
    if (alpha > 0 && beta <= 0) {  // latency does not rise with load here
      fit.y0 = std::min(1.0 / alpha, min_y);
      fit.x_max = kInf;
      fit_ = fit;
      return;
    }
  }
  // Too little spread (or a fit that is not a saturation curve): the curve
  // passes through the weighted mean point, with the last fitted x_max
  // where there is one (and the mean is below it), else with y0 the
  // lowest latency seen.
  if (fitted_x_max_.has_value() && mean_x < *fitted_x_max_) {
    fit.x_max = *fitted_x_max_;
    fit.y0 = (1.0 - mean_x / fit.x_max) / mean_z;  // z is linear in x: means lie on the line
  } else {
    fit.y0 = options_.y0_ceiling > 0 ? std::min(min_y, options_.y0_ceiling) : min_y;
    const double y_mean = 1.0 / mean_z;
    fit.x_max = (y_mean > fit.y0 * 1.05 && mean_x > 0) ? mean_x / (1.0 - fit.y0 / y_mean) : kInf;
  }
  fit_ = fit;
}

double LatencyModel::Predict(const Fit& fit, double x) {
  if (x >= fit.x_max) return kInf;
  if (std::isinf(fit.x_max)) return fit.y0;
  return fit.y0 / (1.0 - x / fit.x_max);
}

double LatencyModel::CapacityAt(const Fit& fit, double latency_s) {
  if (latency_s <= fit.y0) return 0;
  if (std::isinf(fit.x_max)) return kInf;
  return fit.x_max * (1.0 - fit.y0 / latency_s);
}

}  // namespace pdserve::planner
