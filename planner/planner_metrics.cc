#include "planner/planner_metrics.h"

#include <cmath>
#include <string>

namespace pdserve::planner {
namespace {

prometheus::Family<prometheus::Gauge>& Gauge(prometheus::Registry& r, const char* name,
                                             const char* help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

prometheus::Labels PoolLabel(Pool pool) { return {{"pool", std::string(PoolName(pool))}}; }

// NaN (no value this interval) is exported as NaN: a panel shows a gap.
void Set(prometheus::Family<prometheus::Gauge>& f, Pool pool, double v) {
  f.Add(PoolLabel(pool)).Set(v);
}

}  // namespace

PlannerMetrics::PlannerMetrics(prometheus::Registry& r)
    : desired_replicas(
          Gauge(r, "pdserve_planner_desired_replicas",
                "Replicas the planner wants for the pool (in dry-run mode: would set)")),
      current_replicas(Gauge(r, "pdserve_planner_current_replicas",
                             "Replicas the pool is set to, as the actuator reports")),
      ready_workers(Gauge(r, "pdserve_planner_ready_workers",
                          "Workers of the pool registered with the router")),
      decision(Gauge(r, "pdserve_planner_decision",
                     "1 on the reason of the latest decision for the pool, 0 on the others")),
      observed_latency(Gauge(r, "pdserve_planner_observed_latency_seconds",
                             "The SLO quantile over the window: TTFT (prefill), ITL (decode)")),
      predicted_latency(
          Gauge(r, "pdserve_planner_predicted_latency_seconds",
                "The capacity model's latency at the desired size and forecast load")),
      slo(Gauge(r, "pdserve_planner_slo_seconds", "The SLO: TTFT (prefill), ITL (decode)")),
      load(Gauge(r, "pdserve_planner_load_tokens_per_second",
                 "Demand on the pool: prompt tokens/s plus backlog (prefill), generated "
                 "tokens/s (decode)")),
      forecast_load(Gauge(r, "pdserve_planner_forecast_load_tokens_per_second",
                          "The load the pool is sized for: max(now, forecast at the horizon)")),
      capacity_per_worker(Gauge(r, "pdserve_planner_capacity_tokens_per_second",
                                "Learnt tokens/s one worker serves within the scale-up target")),
      scalings(prometheus::BuildCounter()
                   .Name("pdserve_planner_scalings_total")
                   .Help("Pool size changes carried out, by pool and direction (up, down)")
                   .Register(r)),
      actuation_failures(prometheus::BuildCounter()
                             .Name("pdserve_planner_actuation_failures_total")
                             .Help("Pool size changes the actuator failed to make")
                             .Register(r)),
      intervals(prometheus::BuildCounter()
                    .Name("pdserve_planner_intervals_total")
                    .Help("Planning intervals, by result (ok; error: the pool sizes could not "
                          "be read, nothing decided)")
                    .Register(r)),
      dry_run(prometheus::BuildGauge()
                  .Name("pdserve_planner_dry_run")
                  .Help("1 when the planner only reports its decisions")
                  .Register(r)
                  .Add({})),
      input(Gauge(r, "pdserve_planner_input",
                  "The workload as read over the window, by name: request_rate (requests/s), "
                  "mean_prompt_tokens, mean_output_tokens, mean_requested_tokens (max_tokens "
                  "admitted per request), decode_answer_share (the share of max_tokens "
                  "answers use, as learnt), queued_prompt_tokens, "
                  "prefill_tokens_per_busy_second, decode_sequences, decode_kv_usage "
                  "(NaN: absent)")) {
  for (Pool pool : kPools) {
    for (int i = 0; i < kNumReasons; ++i) {
      decision.Add({{"pool", std::string(PoolName(pool))},
                    {"reason", std::string(ReasonName(static_cast<Reason>(i)))}});
    }
    for (const char* dir : {"up", "down"}) {
      scalings.Add({{"pool", std::string(PoolName(pool))}, {"direction", dir}});
    }
    actuation_failures.Add(PoolLabel(pool));
  }
  intervals.Add({{"result", "ok"}});
  intervals.Add({{"result", "error"}});
}

void PlannerMetrics::Record(const Decision& d, const Observation& o,
                            const PlannerOptions& options) {
  const PerPool<std::optional<int>>& ready = o.ready_workers;
  auto value = [](const std::optional<double>& v) { return v.has_value() ? *v : std::nan(""); };
  auto per_request = [&](const std::optional<double>& tokens) {
    return tokens.has_value() && o.request_rate.has_value() && *o.request_rate > 0
               ? *tokens / *o.request_rate
               : std::nan("");
  };
  for (const auto& [name, v] :
       {std::pair{"request_rate", value(o.request_rate)},
        std::pair{"mean_prompt_tokens", per_request(o.prompt_tokens_per_s)},
        std::pair{"mean_output_tokens", per_request(o.output_tokens_per_s)},
        std::pair{"mean_requested_tokens", per_request(o.requested_tokens_per_s)},
        std::pair{"decode_answer_share", d.pools[Pool::kDecode].answer_share},
        std::pair{"queued_prompt_tokens", value(o.prefill_queued_tokens)},
        std::pair{"prefill_tokens_per_busy_second", value(o.prefill_tokens_per_busy_s)},
        std::pair{"decode_sequences", value(o.decode_sequences)},
        std::pair{"decode_kv_usage", value(o.decode_kv_usage)}}) {
    input.Add({{"name", name}}).Set(v);
  }
  for (Pool pool : kPools) {
    const PoolDecision& p = d.pools[pool];
    Set(desired_replicas, pool, p.desired);
    Set(current_replicas, pool, p.current);
    Set(ready_workers, pool, ready[pool].has_value() ? *ready[pool] : std::nan(""));
    for (int i = 0; i < kNumReasons; ++i) {
      const Reason r = static_cast<Reason>(i);
      decision.Add({{"pool", std::string(PoolName(pool))}, {"reason", std::string(ReasonName(r))}})
          .Set(r == p.reason ? 1 : 0);
    }
    Set(observed_latency, pool, p.latency_s);
    Set(predicted_latency, pool, p.predicted_latency_s);
    Set(slo, pool, pool == Pool::kPrefill ? options.ttft_slo_s : options.itl_slo_s);
    Set(load, pool, p.load);
    Set(forecast_load, pool, p.forecast_load);
    Set(capacity_per_worker, pool, p.capacity_per_worker);
  }
}

void PlannerMetrics::CountScaling(Pool pool, bool up) {
  scalings.Add({{"pool", std::string(PoolName(pool))}, {"direction", up ? "up" : "down"}})
      .Increment();
}

void PlannerMetrics::CountActuationFailure(Pool pool) {
  actuation_failures.Add(PoolLabel(pool)).Increment();
}

void PlannerMetrics::CountInterval(bool ok) {
  intervals.Add({{"result", ok ? "ok" : "error"}}).Increment();
}

}  // namespace pdserve::planner
