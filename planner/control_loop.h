// One planning interval: read the metrics, read the pool sizes, decide,
// export and log the decision, and (unless dry-running) carry it out,
// shrinking before growing so a worker budget is never exceeded. The I/O
// lives here and in the source and actuator; the decision stays pure.
#pragma once

#include <functional>
#include <map>
#include <string>

#include "absl/time/time.h"
#include "planner/actuator.h"
#include "planner/decision.h"
#include "planner/metrics_source.h"
#include "planner/planner_metrics.h"

namespace pdserve::planner {

struct ControlLoopOptions {
  bool dry_run = false;
  // Appends one JSON line per pool and interval here ("" = none).
  std::string decisions_out;
};

class ControlLoop {
 public:
  // `actuator` may be null only in a dry run (sizes are then the router's
  // pool gauges). Everything passed in must outlive the loop.
  ControlLoop(ControlLoopOptions options, Planner& planner, MetricsSource& source,
              Actuator* actuator, PlannerMetrics& metrics,
              std::function<absl::Time()> clock = absl::Now)
      : options_(std::move(options)),
        planner_(planner),
        source_(source),
        actuator_(actuator),
        metrics_(metrics),
        clock_(std::move(clock)) {}

  // Runs one interval; false when nothing could be decided (sizes unreadable).
  bool Step();

 private:
  void Log(const Decision& d);
  void Append(const Decision& d, const Observation& o);

  ControlLoopOptions options_;
  Planner& planner_;
  MetricsSource& source_;
  Actuator* actuator_;
  PlannerMetrics& metrics_;
  std::function<absl::Time()> clock_;
  PerPool<std::optional<Reason>> last_reason_;
};

}  // namespace pdserve::planner
