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
                  .Register(r)),
      migrations(prometheus::BuildCounter()
                     .Name("pdserve_migrations_total")
                     .Help("Generations re-prefilled with their generated tokens and continued "
                           "on another worker pair after their first token, by reason "
                           "(worker_failed, stalled)")
                     .Register(r)),
      admission_queue_length(prometheus::BuildGauge()
                                 .Name("pdserve_admission_queue_length")
                                 .Help("Requests waiting at the router for the pools to have room")
                                 .Register(r)
                                 .Add({})),
      admission_wait_seconds(
          prometheus::BuildHistogram()
              .Name("pdserve_admission_queue_wait_seconds")
              .Help("Time requests waited at the router for the pools to have room")
              .Register(r)
              .Add({}, prometheus::Histogram::BucketBoundaries{0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                               0.5, 1, 2.5, 5, 10, 30, 60, 120})),
      pool_queued_requests(prometheus::BuildGauge()
                               .Name("pdserve_pool_queued_requests")
                               .Help("Work waiting in each pool as its workers report it: prompts "
                                     "queued on prefill workers, sequences held on decode "
                                     "workers, by pool")
                               .Register(r)) {
  for (const std::string& pool : kPools) {
    worker_failures.Add({{"pool", pool}});
    retries.Add({{"pool", pool}});
    pool_queued_requests.Add({{"pool", pool}});
  }
  for (const std::string& reason : kMigrationReasons) migrations.Add({{"reason", reason}});
}

}  // namespace pdserve::router
