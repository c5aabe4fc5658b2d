// The planner's own scraper: GETs /metrics of the router and of every
// prefill and decode worker each interval and keeps each target's recent
// scrapes, so counters and histograms become rates and quantiles over the
// window (per target: a worker that leaves takes its counters with it, one
// that restarts starts again from 0). Targets are found anew each interval:
//   - static host:port lists, where a host name that resolves to several
//     addresses (a Kubernetes headless Service) stands for all of them;
//   - or a local cluster's work directory (deploy/local/cluster.sh): the
//     ready files of its live processes.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/prometheus_text.h"
#include "planner/http_client.h"
#include "planner/metrics_source.h"

namespace pdserve::planner {

// host:port of each process's metrics, by role.
struct ScrapeTargets {
  std::vector<std::string> router;
  std::vector<std::string> prefill;
  std::vector<std::string> decode;
};
// Finds the targets; an error leaves the interval's observation empty.
using TargetDiscovery = std::function<absl::StatusOr<ScrapeTargets>()>;

// Static lists; each host resolved anew (every address it has).
TargetDiscovery StaticTargets(ScrapeTargets targets);
// The live processes of a cluster.sh work directory (router.ready,
// prefillN.ready, decodeN.ready with a running pid).
TargetDiscovery ClusterWorkTargets(std::string work_dir);

// GETs http://target/metrics.
using Fetch = std::function<absl::StatusOr<std::string>(const std::string& target)>;
Fetch HttpFetch(HttpOptions options);

struct ScrapeSourceOptions {
  absl::Duration window = absl::Seconds(30);
  // The router's rates also over this shorter window (Observation::recent_*);
  // zero: not computed.
  absl::Duration rate_window = absl::ZeroDuration();
  double quantile = 0.9;
  // The router's histogram the decode pool's latency is read from: every
  // token gap (kItlMetric) or each request's mean gap (kTpotMetric).
  std::string decode_latency_metric = kItlMetric;
};

class ScrapeSource final : public MetricsSource {
 public:
  ScrapeSource(ScrapeSourceOptions options, TargetDiscovery discovery, Fetch fetch)
      : options_(options), discovery_(std::move(discovery)), fetch_(std::move(fetch)) {}
  Observation Read(absl::Time now) override;
  std::string Describe() const override { return "scraping /metrics"; }

 private:
  struct Scrape {
    absl::Time time;
    std::vector<MetricSample> samples;
  };
  // The target's scrape nearest to `now - window` (at most that old when
  // possible), or none when it has only the latest.
  const Scrape* Baseline(const std::deque<Scrape>& history, absl::Time now) const {
    return Baseline(history, now, options_.window);
  }
  static const Scrape* Baseline(const std::deque<Scrape>& history, absl::Time now,
                                absl::Duration window);

  // The prefill pool's prompt tokens per second of step time over the
  // window (Observation::prefill_tokens_per_busy_s); none when a worker
  // does not export the step histograms.
  std::optional<double> BusyRate(const std::vector<const std::deque<Scrape>*>& pool,
                                 absl::Time now) const;

  ScrapeSourceOptions options_;
  TargetDiscovery discovery_;
  Fetch fetch_;
  std::map<std::string, std::deque<Scrape>> history_;  // by "role/target", oldest first
};

}  // namespace pdserve::planner
