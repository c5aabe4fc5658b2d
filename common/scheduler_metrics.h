// Counters of the scheduler core (engine/scheduler) that several processes
// export under one name: prefix caching (prefill workers, the colocated
// baseline) and preemption (decode workers, the colocated baseline). Each
// is registered once on the process's registry and starts at 0.
#pragma once

#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace pdserve {

// pdserve_prefix_cache_queries_total: prompt tokens looked up in the prefix
// cache when their sequence was admitted.
prometheus::Counter& MakePrefixCacheQueriesCounter(prometheus::Registry& r);
// pdserve_prefix_cache_hits_total: of those, tokens found cached (not computed).
prometheus::Counter& MakePrefixCacheHitsCounter(prometheus::Registry& r);
// pdserve_preemptions_total: sequences preempted for lack of KV blocks.
prometheus::Counter& MakePreemptionsCounter(prometheus::Registry& r);

}  // namespace pdserve
