// The planner's decision: how many workers each pool should have so that
// the router's TTFT (prefill) and ITL (decode) quantiles meet their SLOs at
// the least workers. Pure: it sees the metrics (Observation), the replica
// counts the actuator reports and the time, and keeps its own state (the
// learnt capacity models, load forecasts, cool-down clocks); no I/O.
//
// Each interval, for each pool:
//   1. Inputs. Absent inputs (latency, load, ready workers) freeze the pool
//      at its current size: a broken scrape never scales anything down.
//   2. Learn. When the pool has been stable for `settle` and every worker
//      it should have is serving, the point (throughput per worker over
//      the latency window, latency) joins its LatencyModel; the demand now
//      (the recent rates, Observation::recent_*) joins its LoadForecast.
//   3. Size. Load = max(demand now, forecast at `forecast_horizon`); for the
//      decode pool the demand now is at least the max_tokens admitted now
//      (Observation::recent_requested_tokens_per_s) times the share of them
//      answers have used (streamed / requested tokens, learnt with the model's
//      memory): it leads the streamed tokens at a shift to longer answers. The
//      size is the least n whose predicted latency at load / n is within
//      scale_up_target x SLO. For the prefill pool its workers' measured speed
//      while computing also sizes it up (a queue per worker: TTFT exponential
//      with mean prompt compute time / (1 - utilisation), so its quantile q is
//      -ln(1 - q) times that): alone until there is a curve, then beside it,
//      calibrated by the TTFT measured at the window's load (a factor <= 1): the
//      curve cannot see workers slowed since its points were taken. Uncalibrated,
//      it vetoes a scale-down the curve allows (a curve fitted at one load only).
//      An observed breach the model does not explain adds one worker anyway, and
//      so does a decode KV cache above kv_usage_high (it refuses requests before
//      it slows them).
//   4. Hysteresis. Scaling down needs the predicted latency after removing
//      a worker within scale_down_target x SLO (below scale_up_target: a
//      dead band), the observed latency there too, and a load per worker
//      no more than `extrapolation_limit` x the highest the model has seen,
//      for the latency window's load as well as the demand now.
//      With load, a scale-down also needs the latency measured (a window
//      with too few requests is no evidence); an idle pool may shrink.
//      A scale-down must have been wanted for `stabilization` (then to the
//      largest size wanted meanwhile), one worker at a time; a scale-down
//      that had to be undone soon after doubles the pool's stabilization
//      for the next one (up to 8x, back to 1x after a quiet spell).
//   5. Cool-downs. No scale-up within `scale_up_cooldown` of the pool's
//      last change, no scale-down within `scale_down_cooldown`; up by at
//      most `max_step_up` at once.
//   6. Limits. [min, max] per pool; with `max_total_workers`, the budget
//      goes to the pool under the most pressure (Pressure: predicted
//      latency / SLO; on a tie the pool that has the worker keeps it).
//      Taking a worker from a pool that stays within its SLO with one fewer,
//      for the other pool that wants to grow and is held by the budget, is
//      that pool's scale-up: no stabilization window (only the extra wait
//      an undone scale-down earned), once the receiver may grow (a shift in
//      the mix moves the worker early), whether the donor would have kept
//      the worker or given it up anyway.
//      Moving back a worker that the donor got by such a move itself waits
//      the stabilization window as a scale-down does: a lull of a few
//      seconds in the demand of the pool that just received a worker is no
//      reason to trade it back.
#pragma once

#include <limits>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "planner/latency_model.h"
#include "planner/load_forecast.h"
#include "planner/observation.h"

namespace pdserve::planner {

struct PlannerOptions {
  double ttft_slo_s = 2.0;        // on the router's TTFT quantile
  double itl_slo_s = 0.1;         // on the router's ITL quantile
  double latency_quantile = 0.9;  // the quantile both SLOs are stated for
  PerPool<int> min_workers{1, 1};
  PerPool<int> max_workers{8, 8};
  int max_total_workers = 0;  // over both pools; 0: no budget
  double scale_up_target = 0.8;
  double scale_down_target = 0.6;
  absl::Duration scale_up_cooldown = absl::Seconds(60);
  absl::Duration scale_down_cooldown = absl::Seconds(180);
  absl::Duration stabilization = absl::Seconds(120);
  absl::Duration forecast_horizon = absl::Seconds(60);  // a new worker's time to serve
  absl::Duration settle = absl::Seconds(60);            // metrics windows mixing two sizes
  int max_step_up = 2;
  double min_ttft_count = 5;  // observations a window needs to judge TTFT
  double min_itl_count = 50;  // token gaps a window needs to judge ITL
  double extrapolation_limit = 2.0;
  // Until a pool's curve has a fitted slope, its idle latency is taken as
  // at most this fraction of its SLO (LatencyModel::Options::y0_ceiling).
  double prior_idle_fraction = 0.25;
  // Decode KV-cache usage (pool mean) above this adds a decode worker
  // whatever the latency: a full cache refuses requests rather than slowing.
  double kv_usage_high = 0.9;
  // Queued prompt tokens count as demand to be served within this time.
  absl::Duration backlog_drain = absl::Seconds(2);
  LatencyModel::Options model;
  LoadForecast::Options forecast;

  absl::Status Validate() const;
};

// Why a pool has the size it is given. Bounded, so it can be a label.
enum class Reason {
  kSteady,           // the current size meets the SLO within the dead band
  kSloBreached,      // observed latency over the SLO
  kPredictedBreach,  // the model predicts a breach at the forecast load
  kSpareCapacity,    // one worker fewer still meets the SLO with margin
  kBudget,           // the total budget gave the worker to the other pool
  kCooldown,         // a change is wanted; the pool changed too recently
  kStabilizing,      // a scale-down wanted, not yet for the whole window
  kMissingMetrics,   // an input is absent: frozen at the current size
  kAtMin,            // fewer wanted than the pool's minimum
  kAtMax,            // more wanted than the pool's maximum
  kNoModel,          // no observation to size from yet: holding
  kKvPressure,       // the decode pool's KV cache is nearly full
};
inline constexpr int kNumReasons = 12;
const char* ReasonName(Reason reason);

struct PoolDecision {
  int current = 0;
  int desired = 0;
  Reason reason = Reason::kSteady;
  double latency_s = 0;            // observed quantile (NaN: none this window)
  double load = 0;                 // tokens/s now (NaN: absent)
  double forecast_load = 0;        // tokens/s at the horizon
  double window_load = 0;          // tokens/s over the latency window (NaN: absent)
  double predicted_latency_s = 0;  // at `desired` and the forecast load (NaN: no model)
  double capacity_per_worker = 0;  // tokens/s per worker at scale_up_target x SLO
  // Decode: the share of admitted max_tokens that answers use, as learnt
  // (NaN: prefill, or no max_tokens counted yet).
  double answer_share = std::numeric_limits<double>::quiet_NaN();
  std::string detail;              // one line of the numbers behind it
};

struct Decision {
  absl::Time time;
  PerPool<PoolDecision> pools;
};

class Planner {
 public:
  explicit Planner(PlannerOptions options);

  // `current`: each pool's replica count as the actuator reports it. The
  // decision changes nothing by itself: the caller actuates it and reports
  // what took effect with Applied (a dry run never does, so its decisions
  // start no cool-down).
  Decision Decide(const Observation& observation, const PerPool<int>& current);
  // `pool` was set to `replicas` at `time`: cool-downs and settling start.
  void Applied(Pool pool, int replicas, absl::Time time);

  const PlannerOptions& options() const { return options_; }
  // The pool's learnt curve (tests, metrics).
  std::optional<LatencyModel::Fit> Curve(Pool pool, absl::Time now) const {
    return state_[pool].model.Curve(now);
  }

 private:
  struct PoolState {
    LatencyModel model;
    LoadForecast forecast;
    std::optional<absl::Time> last_change;
    std::optional<int> last_current;
    std::optional<int> last_applied;
    std::optional<absl::Time> down_since;  // wanted fewer continuously since
    int max_want_since_down = 0;
    std::optional<absl::Time> last_down;  // the last scale-down applied
    int backoff = 1;                      // x stabilization, after undone scale-downs
    // The pool's last change was a worker moved in from the other pool
    // under the budget: moving it back waits the stabilization window.
    bool moved_in = false;
    // Decode: the tokens streamed and the max_tokens requested over the
    // latency window, summed over intervals with exponential memory
    // (model.memory): the share of max_tokens answers use.
    double streamed_sum = 0;
    double requested_sum = 0;
    std::optional<absl::Time> last_share_time;
  };
  // Steps 1-4 for one pool: the wanted size before budget and cool-downs.
  PoolDecision Want(Pool pool, const Observation& o, int current);
  // Before the prefill pool has a curve: the least size in [lo, hi] (hi + 1
  // when none) whose predicted TTFT at `load` is within scale_up_target x
  // SLO, from the workers' measured speed while computing
  // (Observation::prefill_tokens_per_busy_s) and a single queue per worker;
  // 0 when that speed is not known.
  // `scale` multiplies the prediction (prior_scale_).
  int PriorPrefillSize(const Observation& o, double load, int lo, int hi, double scale) const;
  // That prediction (of the latency_quantile of TTFT) for `workers`
  // workers (NaN: speed or load unknown; inf: the load reaches their
  // speed). It also vetoes a scale-down of the prefill pool that it
  // predicts above scale_down_target x SLO.
  // The mean prompt is the recent rates' where there are some
  // (`recent_prompts`), else the window's.
  double PriorPrefillTtft(const Observation& o, double load, int workers,
                          bool recent_prompts = true) const;
  // How far over its SLO `pool` is predicted to be with `workers` workers
  // at the forecast load (latency / SLO): the larger of its curve and, for
  // prefill, the workers' measured speed (calibrated at the current size
  // and above, raw below it); at most the current size, no less than the
  // latency measured now. A pool without a prediction is 0 (inf below its
  // current size: it keeps what it has).
  double Pressure(Pool pool, const Observation& o, const PoolDecision& d, int workers) const;
  double Slo(Pool pool) const;
  double PredictAt(Pool pool, absl::Time now, double load, int workers) const;

  PlannerOptions options_;
  PerPool<PoolState> state_;
  // This interval's calibration of the prefill queue model (<= 1): the
  // TTFT measured at the current size over what the model predicts for the
  // window's load there; 1 while nothing is measured.
  double prior_scale_ = 1;
};

}  // namespace pdserve::planner
