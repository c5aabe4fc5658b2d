// Prometheus metrics of the router's own (the client-facing series are the
// front end's, frontend/client_metrics.h).
#pragma once

#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/registry.h"

namespace pdserve::router {

struct RouterMetrics {
  // Registers the series in `registry`, which must outlive this struct.
  explicit RouterMetrics(prometheus::Registry& registry);

  prometheus::Family<prometheus::Gauge>& pool_size;  // label pool
};

}  // namespace pdserve::router
