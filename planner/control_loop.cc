#include "planner/control_loop.h"

#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

nlohmann::json Number(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

}  // namespace

bool ControlLoop::Step() {
  const Observation o = source_.Read(clock_());
  PerPool<int> current;
  if (actuator_ != nullptr) {
    absl::StatusOr<PerPool<int>> sizes = actuator_->Current();
    if (!sizes.ok()) {
      PDSERVE_LOG(WARNING) << "planner: cannot read the pool sizes: " << sizes.status()
                           << "; nothing decided this interval";
      metrics_.CountInterval(false);
      return false;
    }
    current = *sizes;
  } else {
    for (Pool pool : kPools) {
      if (!o.ready_workers[pool].has_value()) {
        PDSERVE_LOG(WARNING) << "planner: the router's pool sizes are absent; nothing decided";
        metrics_.CountInterval(false);
        return false;
      }
      current[pool] = *o.ready_workers[pool];
    }
  }
  const Decision d = planner_.Decide(o, current);
  metrics_.CountInterval(true);
  metrics_.Record(d, o, planner_.options());
  Log(d);
  if (!options_.decisions_out.empty()) Append(d, o);
  if (options_.dry_run || actuator_ == nullptr) return true;
  // Shrink first: a budget is never exceeded, even for a moment. One time
  // for the round: a shrink and a growth applied together are one move.
  const absl::Time applied_at = clock_();
  for (bool grow : {false, true}) {
    for (Pool pool : kPools) {
      const PoolDecision& p = d.pools[pool];
      if (p.desired == p.current || (p.desired > p.current) != grow) continue;
      absl::Status s = actuator_->Scale(pool, p.desired);
      if (s.ok()) {
        planner_.Applied(pool, p.desired, applied_at);
        metrics_.CountScaling(pool, grow);
      } else {
        PDSERVE_LOG(ERROR) << "planner: scaling " << PoolName(pool) << " to " << p.desired
                           << " failed: " << s;
        metrics_.CountActuationFailure(pool);
      }
    }
  }
  return true;
}

void ControlLoop::Log(const Decision& d) {
  for (Pool pool : kPools) {
    const PoolDecision& p = d.pools[pool];
    const bool news = p.desired != p.current || last_reason_[pool] != p.reason;
    last_reason_[pool] = p.reason;
    const std::string line =
        absl::StrCat("planner: ", PoolName(pool), " ", p.current, " -> ", p.desired, " (",
                     ReasonName(p.reason), options_.dry_run ? ", dry run" : "", "): ", p.detail);
    if (news) {
      PDSERVE_LOG(INFO) << line;
    } else {
      PDSERVE_LOG(DEBUG) << line;
    }
  }
}

void ControlLoop::Append(const Decision& d, const Observation& o) {
  std::ofstream out(options_.decisions_out, std::ios::app);
  for (Pool pool : kPools) {
    const PoolDecision& p = d.pools[pool];
    nlohmann::json line = {
        {"time", absl::ToDoubleSeconds(d.time - absl::UnixEpoch())},
        {"pool", PoolName(pool)},
        {"current", p.current},
        {"desired", p.desired},
        {"ready", o.ready_workers[pool].has_value() ? nlohmann::json(*o.ready_workers[pool])
                                                    : nlohmann::json()},
        {"reason", ReasonName(p.reason)},
        {"latency_s", Number(p.latency_s)},
        {"predicted_latency_s", Number(p.predicted_latency_s)},
        {"load", Number(p.load)},
        {"forecast_load", Number(p.forecast_load)},
        {"window_load", Number(p.window_load)},
        {"capacity_per_worker", Number(p.capacity_per_worker)},
        {"dry_run", options_.dry_run}};
    out << line.dump() << "\n";
  }
}

}  // namespace pdserve::planner
