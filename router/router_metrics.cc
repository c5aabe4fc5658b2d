#include "router/router_metrics.h"

namespace pdserve::router {

RouterMetrics::RouterMetrics(prometheus::Registry& r)
    : pool_size(prometheus::BuildGauge()
                    .Name("pdserve_pool_workers")
                    .Help("Live workers per pool")
                    .Register(r)),
      worker_failures(prometheus::BuildCounter()
                          .Name("pdserve_worker_failures_total")
                          .Help("Worker calls that failed after the request was placed on the "
                                "worker (prefill call error, decode stream cut), by pool")
                          .Register(r)),
      retries(prometheus::BuildCounter()
                  .Name("pdserve_retries_total")
                  .Help("Requests offered to another worker of the pool after one refused or "
                        "failed, by pool")
                  .Register(r)) {
  for (const std::string& pool : kPools) {
    worker_failures.Add({{"pool", pool}});
    retries.Add({{"pool", pool}});
  }
}

}  // namespace pdserve::router
