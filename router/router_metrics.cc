#include "router/router_metrics.h"

namespace pdserve::router {

RouterMetrics::RouterMetrics(prometheus::Registry& r)
    : pool_size(prometheus::BuildGauge()
                    .Name("pdserve_pool_workers")
                    .Help("Live workers per pool")
                    .Register(r)) {}

}  // namespace pdserve::router
