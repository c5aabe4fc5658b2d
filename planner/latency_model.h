// A pool's capacity, learnt from what the planner observes: latency y (the
// SLO quantile of TTFT for prefill, of ITL for decode) against throughput
// per worker x (prompt tokens/s for prefill, generated tokens/s for decode),
// as a curve
//
//     y(x) = y0 / (1 - x / x_max)
//
// y0 is the latency of an idle worker and x_max the throughput at which
// latency grows without bound. Both pools have this shape: a queue served
// at x_max tokens/s has a sojourn time of service / (1 - utilisation); a
// decode batch of B sequences with step time a + b B gives each sequence a
// token every a + b B seconds at x = B / (a + b B) tokens/s per worker,
// which is y = a / (1 - b x): y0 = a, x_max = 1 / b. Dynamo's planner
// profiles the same relation offline; here it is fitted online.
//
// 1 / y = 1 / y0 - x / (y0 x_max) is linear in x: a weighted least-squares
// line through (x, 1 / y), each point weighted by exp(-age / memory) so the
// model follows a changing workload. A steady load gives points at one x,
// from which no slope can be fitted: then the last fitted x_max is kept and
// y0 is solved through the points' weighted mean; before any fit, y0 is
// the lowest latency seen (at most Options::y0_ceiling) and x_max is
// solved through the mean. Pure: no
// I/O, time is an input.
#pragma once

#include <deque>
#include <optional>

#include "absl/time/time.h"

namespace pdserve::planner {

class LatencyModel {
 public:
  struct Options {
    absl::Duration memory = absl::Minutes(10);  // weight e-folding age of a point
    int max_points = 128;
    // Before any slope is fitted, y0 is taken as at most this (seconds;
    // 0: no ceiling). Without it, a first point observed under overload
    // would read as the idle latency, and adding workers would seem not
    // to help. The planner sets it to a fraction of the SLO.
    double y0_ceiling = 0;
  };
  explicit LatencyModel(Options options) : options_(options) {}
  LatencyModel() : LatencyModel(Options{}) {}

  // One observation: `latency_s` > 0 at `throughput_per_worker` >= 0.
  void Add(absl::Time time, double throughput_per_worker, double latency_s);

  struct Fit {
    double y0 = 0;     // seconds
    double x_max = 0;  // tokens/s per worker; +inf when no saturation is visible
    // The highest throughput per worker observed (memory-weighted points).
    double max_observed_x = 0;
  };
  // The curve as of the latest point, or none before the first point.
  std::optional<Fit> Curve(absl::Time now) const { return fit_; }

  // y(x) of `fit`; +inf at or beyond x_max.
  static double Predict(const Fit& fit, double throughput_per_worker);
  // The largest x with y(x) <= latency_s (0 when even y0 is above it).
  static double CapacityAt(const Fit& fit, double latency_s);

  size_t size() const { return points_.size(); }

 private:
  struct Point {
    absl::Time time;
    double x;
    double y;
  };
  void Refit(absl::Time now);

  Options options_;
  std::deque<Point> points_;  // oldest first
  std::optional<Fit> fit_;
  std::optional<double> fitted_x_max_;  // of the last fit that had a slope
};

}  // namespace pdserve::planner
