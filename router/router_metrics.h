// Prometheus metrics of the router's own: its pools and its orchestration
// of the workers (the client-facing series are the front end's,
// frontend/client_metrics.h).
#pragma once

#include <string>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace pdserve::router {

// Every value the pool label takes; the series are created at start-up with
// value 0 (see frontend/client_metrics.h).
inline const std::vector<std::string> kPools = {"prefill", "decode"};
// Why a generation moved to another worker pair after its first token.
inline const std::vector<std::string> kMigrationReasons = {"worker_failed", "stalled"};

struct RouterMetrics {
  // Registers the series in `registry`, which must outlive this struct.
  explicit RouterMetrics(prometheus::Registry& registry);

  prometheus::Family<prometheus::Gauge>& pool_size;  // label pool
  // Worker calls that failed after the request was placed on the worker
  // (prefill call error, decode stream cut), label pool.
  prometheus::Family<prometheus::Counter>& worker_failures;
  // The request was offered to another worker of the pool after one refused
  // or failed, label pool.
  prometheus::Family<prometheus::Counter>& retries;
  // Generations re-prefilled (prompt + generated tokens) and continued on
  // another worker pair after their first token, label reason
  // (kMigrationReasons).
  prometheus::Family<prometheus::Counter>& migrations;
  // Admission: requests waiting at the router for capacity, and how long
  // each waited before its turn came.
  prometheus::Gauge& admission_queue_length;
  prometheus::Histogram& admission_wait_seconds;
  // What waits in each pool as the workers report it, label pool: prompts
  // queued on prefill workers, sequences held on decode workers.
  prometheus::Family<prometheus::Gauge>& pool_queued_requests;

  void CountWorkerFailure(const std::string& pool) {
    worker_failures.Add({{"pool", pool}}).Increment();
  }
  void CountRetry(const std::string& pool) { retries.Add({{"pool", pool}}).Increment(); }
  void CountMigration(const std::string& reason) {
    migrations.Add({{"reason", reason}}).Increment();
  }
};

}  // namespace pdserve::router
