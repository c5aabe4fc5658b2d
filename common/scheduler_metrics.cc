#include "common/scheduler_metrics.h"

#include "common/metrics_server.h"

namespace pdserve {

prometheus::Counter& MakePrefixCacheQueriesCounter(prometheus::Registry& r) {
  return MakeCounter(r, "pdserve_prefix_cache_queries_total",
                     "Prompt tokens looked up in the prefix cache at admission");
}

prometheus::Counter& MakePrefixCacheHitsCounter(prometheus::Registry& r) {
  return MakeCounter(r, "pdserve_prefix_cache_hits_total",
                     "Prompt tokens found in the prefix cache at admission (not computed)");
}

prometheus::Counter& MakePreemptionsCounter(prometheus::Registry& r) {
  return MakeCounter(r, "pdserve_preemptions_total",
                     "Sequences preempted for lack of KV blocks (their KV is recomputed later)");
}

}  // namespace pdserve
