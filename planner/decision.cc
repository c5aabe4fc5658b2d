#include "planner/decision.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pdserve::planner {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

bool Frozen(const PoolDecision& d) { return d.reason == Reason::kMissingMetrics; }

}  // namespace

const char* ReasonName(Reason reason) {
  switch (reason) {
    case Reason::kSteady:
      return "steady";
    case Reason::kSloBreached:
      return "slo_breached";
    case Reason::kPredictedBreach:
      return "predicted_breach";
    case Reason::kSpareCapacity:
      return "spare_capacity";
    case Reason::kBudget:
      return "budget";
    case Reason::kCooldown:
      return "cooldown";
    case Reason::kStabilizing:
      return "stabilizing";
    case Reason::kMissingMetrics:
      return "missing_metrics";
    case Reason::kAtMin:
      return "at_min";
    case Reason::kAtMax:
      return "at_max";
    case Reason::kNoModel:
      return "no_model";
    case Reason::kKvPressure:
      return "kv_pressure";
  }
  return "";
}

absl::Status PlannerOptions::Validate() const {
  if (!(ttft_slo_s > 0) || !(itl_slo_s > 0)) {
    return absl::InvalidArgumentError("the TTFT and ITL SLOs must be > 0");
  }
  for (Pool pool : kPools) {
    if (min_workers[pool] < 1 || max_workers[pool] < min_workers[pool]) {
      return absl::InvalidArgumentError(
          absl::StrCat(PoolName(pool), ": want 1 <= min <= max workers, got min ",
                       min_workers[pool], " max ", max_workers[pool]));
    }
  }
  if (max_total_workers < 0 ||
      (max_total_workers > 0 && max_total_workers < min_workers.prefill + min_workers.decode)) {
    return absl::InvalidArgumentError(
        "the total worker budget must be 0 (none) or at least the pools' minimums together");
  }
  if (!(scale_down_target > 0) || !(scale_down_target < scale_up_target) ||
      !(scale_up_target <= 1)) {
    return absl::InvalidArgumentError(
        "want 0 < scale_down_target < scale_up_target <= 1 (the dead band between them)");
  }
  if (!(latency_quantile > 0 && latency_quantile < 1)) {
    return absl::InvalidArgumentError("want 0 < latency_quantile < 1");
  }
  if (!(kv_usage_high > 0 && kv_usage_high <= 1)) {
    return absl::InvalidArgumentError("want 0 < kv_usage_high <= 1");
  }
  if (max_step_up < 1 || !(extrapolation_limit >= 1)) {
    return absl::InvalidArgumentError("want max_step_up >= 1 and extrapolation_limit >= 1");
  }
  return absl::OkStatus();
}

Planner::Planner(PlannerOptions options) : options_(std::move(options)) {
  for (Pool pool : kPools) {
    LatencyModel::Options model = options_.model;
    model.y0_ceiling = options_.prior_idle_fraction * Slo(pool);
    state_[pool].model = LatencyModel(model);
    state_[pool].forecast = LoadForecast(options_.forecast);
  }
}

double Planner::Slo(Pool pool) const {
  return pool == Pool::kPrefill ? options_.ttft_slo_s : options_.itl_slo_s;
}

double Planner::PredictAt(Pool pool, absl::Time now, double load, int workers) const {
  std::optional<LatencyModel::Fit> fit = state_[pool].model.Curve(now);
  if (!fit.has_value()) return kNaN;
  if (workers <= 0) return kInf;
  return LatencyModel::Predict(*fit, load / workers);
}

double Planner::PriorPrefillTtft(const Observation& o, double load, int workers,
                                 bool recent_prompts) const {
  if (!o.prefill_tokens_per_busy_s.has_value() || !std::isfinite(*o.prefill_tokens_per_busy_s) ||
      *o.prefill_tokens_per_busy_s <= 0 || !(load > 0) || workers <= 0) {
    return kNaN;
  }
  const double speed = *o.prefill_tokens_per_busy_s;
  // One prompt's compute time, from the mean prompt of the window's
  // requests; 0 while none has finished (then only a pool that cannot keep
  // up at all, load >= its speed, is short).
  double service_s = 0;
  if (recent_prompts && o.recent_request_rate.has_value() && *o.recent_request_rate > 0 &&
      o.recent_prompt_tokens_per_s.has_value()) {
    service_s = *o.recent_prompt_tokens_per_s / *o.recent_request_rate / speed;
  } else if (o.request_rate.has_value() && *o.request_rate > 0 &&
             o.prompt_tokens_per_s.has_value()) {
    service_s = *o.prompt_tokens_per_s / *o.request_rate / speed;
  }
  // A single queue (M/M/1): the time in system is exponential with mean
  // service / (1 - utilisation); its quantile q is -ln(1 - q) x the mean.
  const double utilisation = load / (workers * speed);
  if (utilisation >= 1) return kInf;
  return -std::log1p(-options_.latency_quantile) * service_s / (1 - utilisation);
}

double Planner::Pressure(Pool pool, const Observation& o, const PoolDecision& d,
                         int workers) const {
  double predicted = PredictAt(pool, o.time, d.forecast_load, workers);
  if (pool == Pool::kPrefill) {
    // Calibrated to ask for workers; raw to give one up, as for the veto on
    // a scale-down (a queue per worker errs high, by more at low load, so
    // the calibration at one load can be too kind at a higher one).
    const double scale = workers < d.current ? 1.0 : prior_scale_;
    const double prior = scale * PriorPrefillTtft(o, d.forecast_load, workers);
    if (!std::isnan(prior)) predicted = std::isnan(predicted) ? prior : std::max(predicted, prior);
  }
  double pressure = predicted / Slo(pool);
  if (std::isnan(pressure)) pressure = workers < d.current ? kInf : 0;  // no model: keep
  // The latency measured at the current size bounds it there and below.
  if (!std::isnan(d.latency_s) && workers <= d.current) {
    pressure = std::max(pressure, d.latency_s / Slo(pool));
  }
  return pressure;
}

int Planner::PriorPrefillSize(const Observation& o, double load, int lo, int hi,
                              double scale) const {
  if (std::isnan(PriorPrefillTtft(o, load, 1))) return 0;
  for (int n = std::max(1, lo); n <= hi; ++n) {
    if (scale * PriorPrefillTtft(o, load, n) <= options_.scale_up_target * options_.ttft_slo_s) {
      return n;
    }
  }
  return hi + 1;
}

PoolDecision Planner::Want(Pool pool, const Observation& o, int current) {
  PoolState& st = state_[pool];
  const absl::Time now = o.time;
  const double slo = Slo(pool);
  PoolDecision d{.current = current,
                 .desired = current,
                 .reason = Reason::kSteady,
                 .latency_s = kNaN,
                 .load = kNaN,
                 .forecast_load = kNaN,
                 .window_load = kNaN,
                 .predicted_latency_s = kNaN,
                 .capacity_per_worker = kNaN};
  // 1. Inputs.
  const bool prefill = pool == Pool::kPrefill;
  const std::optional<double>& latency = prefill ? o.ttft_s : o.itl_s;
  const std::optional<double>& count = prefill ? o.ttft_count : o.itl_count;
  const std::optional<double>& served = prefill ? o.prompt_tokens_per_s : o.output_tokens_per_s;
  const std::optional<int>& ready = o.ready_workers[pool];
  const std::optional<double>& recent =
      prefill ? o.recent_prompt_tokens_per_s : o.recent_output_tokens_per_s;
  std::optional<double> load;  // the demand now: the recent rate where there is one
  double window_load = 0;      // over the latency window
  if (served.has_value() && (!prefill || o.prefill_queued_tokens.has_value())) {
    // Queued prompt tokens are demand to be served within backlog_drain.
    const double backlog = prefill
                               ? *o.prefill_queued_tokens /
                                     std::max(1e-3, absl::ToDoubleSeconds(options_.backlog_drain))
                               : 0.0;
    window_load = *served + backlog;
    load = (recent.has_value() && std::isfinite(*recent) ? *recent : *served) + backlog;
    // Decode: what was just admitted asks for its share of max_tokens.
    // The tokens streamed now lag a shift to longer answers by about an
    // answer's length (sequences accumulate before their tokens do, and
    // a saturated pool streams no more than it can); the max_tokens of the
    // requests admitted now do not. The share their answers use is learnt
    // from the window's streamed and requested tokens.
    if (!prefill && o.requested_tokens_per_s.has_value() && *o.requested_tokens_per_s > 0 &&
        std::isfinite(*o.requested_tokens_per_s)) {
      const double decay = std::exp(-(st.last_share_time.has_value()
                                          ? absl::ToDoubleSeconds(now - *st.last_share_time)
                                          : 0.0) /
                                    std::max(1e-3, absl::ToDoubleSeconds(options_.model.memory)));
      st.streamed_sum = st.streamed_sum * decay + *served;
      st.requested_sum = st.requested_sum * decay + *o.requested_tokens_per_s;
      st.last_share_time = now;
    }
    if (!prefill && st.requested_sum > 0) {
      const std::optional<double>& admitted = o.recent_requested_tokens_per_s.has_value()
                                                  ? o.recent_requested_tokens_per_s
                                                  : o.requested_tokens_per_s;
      const double share = std::clamp(st.streamed_sum / st.requested_sum, 0.0, 1.0);
      d.answer_share = share;
      if (admitted.has_value() && std::isfinite(*admitted) && share * *admitted > *load) {
        load = share * *admitted;
        absl::StrAppendFormat(&d.detail, "admitted: %.4g max_tokens/s x %.2g used; ", *admitted,
                              share);
      }
    }
  }
  const bool kv_absent = !prefill && !o.decode_kv_usage.has_value();
  if (!latency.has_value() || !count.has_value() || !load.has_value() || !ready.has_value() ||
      kv_absent) {
    std::string missing;
    if (!latency.has_value() || !count.has_value())
      absl::StrAppend(&missing, prefill ? " ttft" : " itl");
    if (!served.has_value())
      absl::StrAppend(&missing, prefill ? " prompt_tokens" : " output_tokens");
    if (prefill && !o.prefill_queued_tokens.has_value())
      absl::StrAppend(&missing, " queued_tokens");
    if (!ready.has_value()) absl::StrAppend(&missing, " pool_workers");
    if (kv_absent) absl::StrAppend(&missing, " kv_usage");
    d.reason = Reason::kMissingMetrics;
    d.detail = absl::StrCat("absent:", missing, "; holding ", current);
    return d;
  }
  d.load = *load;
  d.window_load = window_load;
  const double min_count = prefill ? options_.min_ttft_count : options_.min_itl_count;
  const bool measured = *count >= min_count && std::isfinite(*latency) && *latency > 0;
  if (measured) d.latency_s = *latency;

  // 2. Learn. While the pool settles after a change, served throughput
  // moves with the size, not the demand: it does not feed the trend.
  const bool settled = !st.last_change.has_value() || now - *st.last_change >= options_.settle;
  st.forecast.Add(now, *load, /*update_trend=*/settled);
  if (measured && settled && *ready == current && *ready > 0) {
    st.model.Add(now, *served / *ready, *latency);
  }
  d.forecast_load = std::max(*load, st.forecast.Forecast(options_.forecast_horizon).value_or(0));
  // The queue model's level, calibrated: its prediction for the window's
  // load and this size against the TTFT measured there, only ever lowered
  // (a queue per worker ignores batching). Raw while nothing is measured.
  if (prefill) {
    prior_scale_ = 1;
    if (measured && settled && *ready == current) {
      const double at_window = PriorPrefillTtft(o, window_load, current, /*recent_prompts=*/false);
      if (std::isfinite(at_window) && at_window > 0) {
        prior_scale_ = std::min(1.0, *latency / at_window);
      }
    }
  }

  // 3. Size.
  std::optional<LatencyModel::Fit> fit = st.model.Curve(now);
  const int lo = options_.min_workers[pool], hi = options_.max_workers[pool];
  const bool breached = measured && *latency > slo;
  int want = current;
  if (!fit.has_value()) {
    d.reason = breached ? Reason::kSloBreached : Reason::kNoModel;
    if (breached) want = current + 1;
    // Before a curve exists, the workers' own step speed sizes the prefill
    // pool upward (never down: that waits for measured latency).
    if (prefill) {
      const int needed = PriorPrefillSize(o, d.forecast_load, lo, hi, prior_scale_);
      if (needed > want) {
        want = needed;
        if (!breached) d.reason = Reason::kPredictedBreach;
        absl::StrAppendFormat(&d.detail, "prior: %.4g tok/s per busy worker; ",
                              *o.prefill_tokens_per_busy_s);
      }
    }
  } else {
    d.capacity_per_worker = LatencyModel::CapacityAt(*fit, options_.scale_up_target * slo);
    int needed = hi + 1;  // none within the maximum
    for (int n = std::max(1, lo); n <= hi; ++n) {
      if (LatencyModel::Predict(*fit, d.forecast_load / n) <= options_.scale_up_target * slo) {
        needed = n;
        break;
      }
    }
    // The workers' measured speed also sizes the prefill pool up: the curve
    // maps load per worker to TTFT as it was when its points were taken,
    // and cannot see a worker slowed down since (by the decode work beside
    // it, or longer prompts); the speed measured now, and the demand now,
    // can, before the slower TTFTs fill a window.
    const int prior_needed =
        prefill ? PriorPrefillSize(o, d.forecast_load, lo, hi, prior_scale_) : 0;
    if (prior_needed > current && prior_needed > needed) {
      needed = prior_needed;
      absl::StrAppendFormat(&d.detail, "prior: %.4g tok/s per busy worker predicts %.3gs (x%.2g); ",
                            *o.prefill_tokens_per_busy_s,
                            prior_scale_ * PriorPrefillTtft(o, d.forecast_load, current),
                            prior_scale_);
    }
    if (needed > current) {
      want = needed;
      d.reason = breached ? Reason::kSloBreached : Reason::kPredictedBreach;
    } else if (breached) {
      want = current + 1;  // the model lags what is observed
      d.reason = Reason::kSloBreached;
    } else if (current > 1 && needed < current) {
      // 4. Hysteresis: one fewer must hold with margin.
      const int fewer = current - 1;
      // Shrinking needs the load over the whole latency window low too, not
      // only the recent demand (a lull of a few seconds is no reason).
      const double down_load = std::max(d.forecast_load, window_load);
      const double per_worker = down_load / fewer;
      const bool predicted_ok =
          LatencyModel::Predict(*fit, per_worker) <= options_.scale_down_target * slo;
      // Under load, only a measured latency is evidence; an idle pool may shrink.
      const bool observed_ok =
          measured ? *latency <= options_.scale_down_target * slo : down_load == 0;
      // The workers' measured speed vetoes a curve fitted from too narrow
      // a range of loads: the remaining workers must not be near saturation.
      const double prior = prefill ? PriorPrefillTtft(o, down_load, fewer) : kNaN;
      const bool prior_ok = std::isnan(prior) || prior <= options_.scale_down_target * slo;
      const bool known_load =
          per_worker <= options_.extrapolation_limit * fit->max_observed_x || down_load == 0;
      if (predicted_ok && observed_ok && known_load && prior_ok) {
        want = fewer;
        d.reason = Reason::kSpareCapacity;
      }
    }
  }
  if (!prefill && *o.decode_kv_usage > options_.kv_usage_high && want <= current) {
    want = current + 1;
    d.reason = Reason::kKvPressure;
  }
  if (want > hi) {
    want = hi;
    if (current >= hi) d.reason = Reason::kAtMax;
  }
  if (want < lo) {
    want = lo;
    if (current <= lo) d.reason = Reason::kAtMin;
  }
  d.desired = want;
  d.detail += absl::StrFormat("%s_q=%s n=%d/%d load=%.1ftok/s (window %.1f) forecast=%.1f",
                              prefill ? "ttft" : "itl",
                              measured ? absl::StrFormat("%.4gs", *latency) : std::string("none"),
                              *ready, current, d.load, window_load, d.forecast_load);
  if (fit.has_value()) {
    absl::StrAppendFormat(&d.detail, " model(y0=%.4gs x_max=%.4g seen<=%.4g)", fit->y0, fit->x_max,
                          fit->max_observed_x);
  }
  return d;
}

Decision Planner::Decide(const Observation& o, const PerPool<int>& current) {
  const absl::Time now = o.time;
  Decision out{.time = now};
  for (Pool pool : kPools) {
    PoolState& st = state_[pool];
    // A size the planner did not set (by hand, a failed actuation, a crash)
    // is a change too: its metrics need to settle.
    if (st.last_current.has_value() && *st.last_current != current[pool] &&
        st.last_applied != current[pool]) {
      st.last_change = now;
    }
    st.last_current = current[pool];
    out.pools[pool] = Want(pool, o, current[pool]);
  }
  PerPool<int> wanted;  // before the budget
  for (Pool pool : kPools) wanted[pool] = out.pools[pool].desired;

  // 6. Budget: pools' minimums (or frozen sizes) first, then one worker at a
  // time to the pool with the highest predicted latency over its SLO.
  const int budget = options_.max_total_workers;
  if (budget > 0 && out.pools.prefill.desired + out.pools.decode.desired > budget) {
    PerPool<int> alloc;
    int left = budget;
    for (Pool pool : kPools) {
      const PoolDecision& d = out.pools[pool];
      alloc[pool] = Frozen(d) ? d.current : std::min(d.desired, options_.min_workers[pool]);
      left -= alloc[pool];
    }
    while (left > 0) {
      std::optional<Pool> best;
      double best_pressure = -1;
      for (Pool pool : kPools) {
        const PoolDecision& d = out.pools[pool];
        if (Frozen(d) || alloc[pool] >= d.desired) continue;
        const double pressure = Pressure(pool, o, d, alloc[pool]);
        // On a tie (both saturated, say) the pool that has the worker keeps it.
        if (pressure > best_pressure || (pressure == best_pressure && alloc[pool] < d.current)) {
          best_pressure = pressure;
          best = pool;
        }
      }
      if (!best.has_value()) break;
      ++alloc[*best];
      --left;
    }
    for (Pool pool : kPools) {
      PoolDecision& d = out.pools[pool];
      if (alloc[pool] != d.desired) {
        d.desired = alloc[pool];
        d.reason = Reason::kBudget;
      }
    }
  }

  // 4-5. Stabilization and cool-downs; reductions first, so that growth
  // fits the budget with the sizes that actually result.
  auto up_cooling = [&](Pool pool) {
    const PoolState& st = state_[pool];
    return st.last_change.has_value() && now - *st.last_change < options_.scale_up_cooldown;
  };
  for (Pool pool : kPools) {
    PoolState& st = state_[pool];
    PoolDecision& d = out.pools[pool];
    if (d.desired >= d.current) {
      st.down_since.reset();
      continue;
    }
    if (!st.down_since.has_value()) {
      st.down_since = now;
      st.max_want_since_down = d.desired;
    }
    st.max_want_since_down = std::max(st.max_want_since_down, d.desired);
    // A move under the budget: the other pool wants to grow and the budget
    // holds it back (it is predicted to breach and needs the worker more
    // than this pool would keep it, or this pool would give the worker up
    // anyway). When this pool stays within its SLO with one fewer, it is
    // the other pool's scale-up, so it does not wait out a stabilization
    // window (only the longer one a move undone soon after earns), but it
    // waits for the other pool to be able to grow. A move that only trades
    // a breach for a smaller one waits like any scale-down, and so does
    // moving back a worker that this pool got by a move itself: in a lull
    // of its demand the worker would go back, and come again when the lull
    // ends, each move a drain and a start.
    const Pool other = pool == Pool::kPrefill ? Pool::kDecode : Pool::kPrefill;
    const PoolDecision& od = out.pools[other];
    const bool other_held =
        budget > 0 && !Frozen(od) && wanted[other] > od.current && d.current + od.current >= budget;
    const bool move = other_held && !st.moved_in && Pressure(pool, o, d, d.current - 1) <= 1;
    const absl::Duration stabilization = options_.stabilization * (st.backoff - (move ? 1 : 0));
    const bool cooling =
        st.last_change.has_value() && now - *st.last_change < options_.scale_down_cooldown;
    if (cooling || (move && up_cooling(other))) {
      absl::StrAppend(&d.detail, "; wants ", d.desired, ", cooling down",
                      cooling ? "" : absl::StrCat(" (", PoolName(other), " is)"));
      d.desired = d.current;
      d.reason = Reason::kCooldown;
    } else if (now - *st.down_since < stabilization || st.max_want_since_down >= d.current) {
      absl::StrAppend(&d.detail, "; wants ", d.desired, ", stabilizing");
      d.desired = d.current;
      d.reason = Reason::kStabilizing;
    } else {
      d.desired = std::max(st.max_want_since_down, d.current - 1);
    }
  }
  for (Pool pool : kPools) {
    PoolDecision& d = out.pools[pool];
    if (d.desired <= d.current) continue;
    if (up_cooling(pool)) {
      absl::StrAppend(&d.detail, "; wants ", d.desired, ", cooling down");
      d.desired = d.current;
      d.reason = Reason::kCooldown;
      continue;
    }
    d.desired = std::min(d.desired, d.current + options_.max_step_up);
    if (budget > 0) {
      const Pool other = pool == Pool::kPrefill ? Pool::kDecode : Pool::kPrefill;
      const int room = budget - out.pools[other].desired;
      if (d.desired > room) {
        absl::StrAppend(&d.detail, "; wants ", d.desired, ", budget leaves ", room);
        d.desired = std::max(d.current, room);
        d.reason = Reason::kBudget;
      }
    }
  }
  for (Pool pool : kPools) {
    PoolDecision& d = out.pools[pool];
    d.predicted_latency_s = PredictAt(pool, now, d.forecast_load, d.desired);
  }
  return out;
}

void Planner::Applied(Pool pool, int replicas, absl::Time time) {
  PoolState& st = state_[pool];
  const int before = st.last_current.value_or(replicas);
  // A scale-up soon after a scale-down undoes it: wait longer next time.
  // A long quiet spell forgives.
  if (st.last_down.has_value() && time - *st.last_down > 10 * options_.stabilization * st.backoff) {
    st.backoff = 1;
  }
  if (replicas > before && st.last_down.has_value() &&
      time - *st.last_down < 4 * options_.stabilization * st.backoff) {
    st.backoff = std::min(8, st.backoff * 2);
  }
  if (replicas < before) st.last_down = time;
  // Growth at the moment the other pool shrank: a move under the budget
  // (the caller applies reductions first).
  const PoolState& other = state_[pool == Pool::kPrefill ? Pool::kDecode : Pool::kPrefill];
  st.moved_in = replicas > before && other.last_down == time;
  st.last_change = time;
  st.last_applied = replicas;
  st.down_since.reset();
  st.forecast.ResetTrend();
}

}  // namespace pdserve::planner
