// pdserve_planner: sizes the prefill and decode pools so that the router's
// TTFT and ITL quantiles meet their SLOs at the least workers
// (planner/decision.h says how it decides). Every --interval it reads the
// metrics (Prometheus with --prometheus_url, else it scrapes the processes
// itself), decides, exports pdserve_planner_* on its /metrics, logs each
// change with its reason, and carries the decision out through the chosen
// actuator (unless --dry_run):
//
//   # Kubernetes, in the planner's pod (deploy/k8s/planner):
//   pdserve_planner --actuator=kubernetes --prometheus_url=http://prometheus:9090
//     --prometheus_selector='namespace="pdserve"' --ttft_slo=2 --itl_slo=0.1
//   # A local cluster (deploy/local/cluster.sh), scraping its processes:
//   pdserve_planner --actuator=local --cluster_work=/tmp/pd
//     --cluster_sh=deploy/local/cluster.sh --ttft_slo=2 --itl_slo=0.05
//   # Watch only: what it would do, against any cluster
//   pdserve_planner --dry_run --router_metrics=127.0.0.1:9400 ...
#include <algorithm>
#include <atomic>
#include <iostream>
#include <memory>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/base/cli.h"
#include "common/base/logging.h"
#include "common/base/process.h"
#include "common/metrics_server.h"
#include "common/ready_file.h"
#include "planner/control_loop.h"
#include "planner/kubernetes_actuator.h"
#include "planner/local_actuator.h"
#include "planner/prometheus_source.h"
#include "planner/scrape_source.h"

ABSL_FLAG(double, ttft_slo, 2.0, "TTFT SLO in seconds, on the router's --latency_quantile");
ABSL_FLAG(double, itl_slo, 0.1, "Inter-token latency SLO in seconds, on the same quantile");
ABSL_FLAG(std::string, decode_latency, "itl",
          "What --itl_slo is on: itl (the router's every token gap, "
          "pdserve_inter_token_latency_seconds; a window needs 50 gaps) or tpot (each "
          "request's mean gap, pdserve_time_per_output_token_seconds, observed as it ends; "
          "a window needs 5 requests)");
ABSL_FLAG(double, latency_quantile, 0.9, "The quantile the SLOs are stated for (0.9: p90)");
ABSL_FLAG(absl::Duration, interval, absl::Seconds(15), "Time between decisions");
ABSL_FLAG(absl::Duration, window, absl::Seconds(60),
          "Rates and latency quantiles are taken over this trailing window");
ABSL_FLAG(absl::Duration, rate_window, absl::ZeroDuration(),
          "The demand now: the router's rates also over this shorter trailing window (0: the "
          "larger of 2 x --interval and --window / 4; at most --window)");
ABSL_FLAG(int, min_prefill, 1, "Fewest prefill workers");
ABSL_FLAG(int, max_prefill, 8, "Most prefill workers");
ABSL_FLAG(int, min_decode, 1, "Fewest decode workers");
ABSL_FLAG(int, max_decode, 8, "Most decode workers");
ABSL_FLAG(int, max_total_workers, 0,
          "Most workers of both pools together (0: no budget beyond the per-pool maximums)");
ABSL_FLAG(double, scale_up_target, 0.8,
          "Size each pool so its predicted latency is within this fraction of the SLO");
ABSL_FLAG(double, scale_down_target, 0.6,
          "Remove a worker only if the latency stays within this fraction of the SLO");
ABSL_FLAG(absl::Duration, scale_up_cooldown, absl::Seconds(60),
          "No scale-up of a pool within this time of its last change");
ABSL_FLAG(absl::Duration, scale_down_cooldown, absl::Seconds(180),
          "No scale-down of a pool within this time of its last change");
ABSL_FLAG(absl::Duration, stabilization, absl::Seconds(120),
          "A scale-down must be wanted for this long (then to the largest size wanted)");
ABSL_FLAG(absl::Duration, forecast_horizon, absl::Seconds(60),
          "Size for the load forecast this far ahead (a new worker's time to serve)");
ABSL_FLAG(absl::Duration, settle, absl::Seconds(60),
          "After a pool changes, its latency joins the capacity model only after this");
ABSL_FLAG(absl::Duration, model_memory, absl::Minutes(10),
          "Age at which an observation's weight in the capacity model has fallen to 1/e");
ABSL_FLAG(int, max_step_up, 2, "Workers added to a pool at once, at most");
ABSL_FLAG(double, kv_usage_high, 0.9,
          "Decode KV-cache usage (pool mean) above which a decode worker is added");
ABSL_FLAG(bool, dry_run, false, "Only print and export decisions; scale nothing");
ABSL_FLAG(std::string, actuator, "none",
          "kubernetes (scale the Deployments), local (deploy/local/cluster.sh) or none "
          "(needs --dry_run)");
ABSL_FLAG(std::string, prometheus_url, "",
          "Read metrics from this Prometheus (http[s]://host:port); else scrape the processes");
ABSL_FLAG(std::string, prometheus_selector, "",
          "Extra label matchers for every Prometheus query, e.g. namespace=\"pdserve\"");
ABSL_FLAG(std::string, router_metrics, "",
          "Scraping: the router's metrics host:port (comma-separated list)");
ABSL_FLAG(std::string, prefill_metrics, "",
          "Scraping: prefill workers' metrics host:port list; a name with several addresses "
          "(a headless Service) stands for all of them");
ABSL_FLAG(std::string, decode_metrics, "", "Scraping: decode workers' metrics host:port list");
ABSL_FLAG(std::string, cluster_work, "",
          "A local cluster's work directory (cluster.sh --work): scrape its processes, and the "
          "local actuator's cluster");
ABSL_FLAG(std::string, cluster_sh, "deploy/local/cluster.sh", "Local actuator: the cluster script");
ABSL_FLAG(std::string, kube_api_server, "",
          "Kubernetes API server URL (default: in-cluster, https://$KUBERNETES_SERVICE_HOST)");
ABSL_FLAG(std::string, kube_namespace, "", "Namespace of the Deployments (default: the pod's)");
ABSL_FLAG(std::string, prefill_deployment, "pdserve-prefill", "The prefill pool's Deployment");
ABSL_FLAG(std::string, decode_deployment, "pdserve-decode", "The decode pool's Deployment");
ABSL_FLAG(std::string, kube_token_file, "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "Bearer token for the API server (\"\": none)");
ABSL_FLAG(std::string, kube_ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "CA bundle that signed the API server's certificate");
ABSL_FLAG(std::string, decisions_out, "", "Append each decision as a JSON line here");
ABSL_FLAG(std::string, host, "127.0.0.1", "Address to bind the metrics server to");
ABSL_FLAG(int, metrics_port, 0, "Prometheus /metrics port (0: any free port)");
ABSL_FLAG(std::string, ready_file, "", "Write the metrics port here as JSON once running");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");

namespace pdserve::planner {
namespace {

std::vector<std::string> List(const std::string& csv) {
  return absl::StrSplit(csv, ',', absl::SkipWhitespace());
}

absl::StatusOr<PlannerOptions> OptionsFromFlags() {
  PlannerOptions o;
  o.ttft_slo_s = absl::GetFlag(FLAGS_ttft_slo);
  o.latency_quantile = absl::GetFlag(FLAGS_latency_quantile);
  o.itl_slo_s = absl::GetFlag(FLAGS_itl_slo);
  o.min_workers = {absl::GetFlag(FLAGS_min_prefill), absl::GetFlag(FLAGS_min_decode)};
  o.max_workers = {absl::GetFlag(FLAGS_max_prefill), absl::GetFlag(FLAGS_max_decode)};
  o.max_total_workers = absl::GetFlag(FLAGS_max_total_workers);
  o.scale_up_target = absl::GetFlag(FLAGS_scale_up_target);
  o.scale_down_target = absl::GetFlag(FLAGS_scale_down_target);
  o.scale_up_cooldown = absl::GetFlag(FLAGS_scale_up_cooldown);
  o.scale_down_cooldown = absl::GetFlag(FLAGS_scale_down_cooldown);
  o.stabilization = absl::GetFlag(FLAGS_stabilization);
  o.forecast_horizon = absl::GetFlag(FLAGS_forecast_horizon);
  o.settle = absl::GetFlag(FLAGS_settle);
  o.max_step_up = absl::GetFlag(FLAGS_max_step_up);
  o.kv_usage_high = absl::GetFlag(FLAGS_kv_usage_high);
  o.model.memory = absl::GetFlag(FLAGS_model_memory);
  o.backlog_drain = absl::Seconds(o.ttft_slo_s);
  const std::string decode_latency = absl::GetFlag(FLAGS_decode_latency);
  if (decode_latency == "tpot") {
    o.min_itl_count = o.min_ttft_count;  // requests, not gaps
  } else if (decode_latency != "itl") {
    return absl::InvalidArgumentError(
        absl::StrCat("--decode_latency=", decode_latency, " is not itl or tpot"));
  }
  if (absl::Status s = o.Validate(); !s.ok()) return s;
  return o;
}

int Main() {
  if (!SetLogLevelFlag(absl::GetFlag(FLAGS_log_level))) return 2;
  absl::StatusOr<PlannerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    std::cerr << options.status().message() << "\n";
    return 2;
  }
  const double quantile = absl::GetFlag(FLAGS_latency_quantile);
  const absl::Duration interval = absl::GetFlag(FLAGS_interval);
  if (!(quantile > 0 && quantile < 1) || interval <= absl::ZeroDuration()) {
    std::cerr << "want 0 < --latency_quantile < 1 and --interval > 0\n";
    return 2;
  }
  const std::string work = absl::GetFlag(FLAGS_cluster_work);
  const std::string decode_metric =
      absl::GetFlag(FLAGS_decode_latency) == "tpot" ? kTpotMetric : kItlMetric;
  const absl::Duration window = absl::GetFlag(FLAGS_window);
  absl::Duration rate_window = absl::GetFlag(FLAGS_rate_window);
  if (rate_window <= absl::ZeroDuration()) rate_window = std::max(2 * interval, window / 4);
  rate_window = std::min(rate_window, window);

  // Metrics source.
  std::unique_ptr<MetricsSource> source;
  const HttpOptions http{.timeout = std::min(absl::Seconds(10), interval)};
  if (const std::string url = absl::GetFlag(FLAGS_prometheus_url); !url.empty()) {
    source = std::make_unique<PrometheusSource>(
        PrometheusSourceOptions{.url = url,
                                .selector = absl::GetFlag(FLAGS_prometheus_selector),
                                .window = window,
                                .rate_window = rate_window,
                                .quantile = quantile,
                                .decode_latency_metric = decode_metric,
                                .http = http});
  } else {
    TargetDiscovery discovery;
    if (!work.empty()) {
      discovery = ClusterWorkTargets(work);
    } else if (!absl::GetFlag(FLAGS_router_metrics).empty()) {
      discovery = StaticTargets({.router = List(absl::GetFlag(FLAGS_router_metrics)),
                                 .prefill = List(absl::GetFlag(FLAGS_prefill_metrics)),
                                 .decode = List(absl::GetFlag(FLAGS_decode_metrics))});
    } else {
      std::cerr << "where are the metrics? --prometheus_url, --router_metrics (with "
                   "--prefill_metrics and --decode_metrics) or --cluster_work\n";
      return 2;
    }
    source = std::make_unique<ScrapeSource>(
        ScrapeSourceOptions{.window = window,
                            .rate_window = rate_window,
                            .quantile = quantile,
                            .decode_latency_metric = decode_metric},
        std::move(discovery), HttpFetch(http));
  }

  // Actuator.
  std::unique_ptr<Actuator> actuator;
  const std::string kind = absl::GetFlag(FLAGS_actuator);
  if (kind == "kubernetes") {
    auto k = KubernetesActuator::Create({.api_server = absl::GetFlag(FLAGS_kube_api_server),
                                         .namespace_ = absl::GetFlag(FLAGS_kube_namespace),
                                         .deployments = {absl::GetFlag(FLAGS_prefill_deployment),
                                                         absl::GetFlag(FLAGS_decode_deployment)},
                                         .token_file = absl::GetFlag(FLAGS_kube_token_file),
                                         .ca_file = absl::GetFlag(FLAGS_kube_ca_file)});
    if (!k.ok()) {
      std::cerr << k.status().message() << "\n";
      return 2;
    }
    actuator = *std::move(k);
  } else if (kind == "local") {
    if (work.empty()) {
      std::cerr << "--actuator=local needs --cluster_work\n";
      return 2;
    }
    auto l = LocalActuator::Create(
        {.cluster_sh = absl::GetFlag(FLAGS_cluster_sh), .work_dir = work}, HttpFetch(http));
    if (!l.ok()) {
      std::cerr << l.status().message() << "\n";
      return 2;
    }
    actuator = *std::move(l);
  } else if (kind != "none") {
    std::cerr << "--actuator must be kubernetes, local or none\n";
    return 2;
  } else if (!absl::GetFlag(FLAGS_dry_run)) {
    std::cerr << "--actuator=none only with --dry_run\n";
    return 2;
  }

  auto registry = std::make_shared<prometheus::Registry>();
  PlannerMetrics metrics(*registry);
  metrics.dry_run.Set(absl::GetFlag(FLAGS_dry_run) ? 1 : 0);
  auto server =
      MetricsServer::Start(registry, absl::GetFlag(FLAGS_host), absl::GetFlag(FLAGS_metrics_port));
  if (!server.ok()) {
    PDSERVE_LOG(ERROR) << server.status();
    return 1;
  }
  Planner planner(*options);
  ControlLoop loop({.dry_run = absl::GetFlag(FLAGS_dry_run),
                    .decisions_out = absl::GetFlag(FLAGS_decisions_out)},
                   planner, *source, actuator.get(), metrics);

  absl::Notification stop;
  std::thread signals([&stop] {
    const int sig = WaitForShutdownSignal();
    PDSERVE_LOG(INFO) << "signal " << sig << ": stopping";
    stop.Notify();
  });
  AnnounceReady(absl::GetFlag(FLAGS_ready_file), "", (*server)->port());
  PDSERVE_LOG(INFO) << "pdserve " << VersionString() << " planner: " << source->Describe() << "; "
                    << (actuator ? actuator->Describe() : std::string("no actuator"))
                    << (absl::GetFlag(FLAGS_dry_run) ? " (dry run)" : "") << "; TTFT SLO "
                    << options->ttft_slo_s << " s, ITL SLO (" << absl::GetFlag(FLAGS_decode_latency)
                    << ") " << options->itl_slo_s << " s at p"
                    << quantile * 100 << "; windows " << window << " (latency) and "
                    << rate_window << " (demand); metrics on port " << (*server)->port();
  while (!stop.HasBeenNotified()) {
    const absl::Time next = absl::Now() + interval;
    loop.Step();
    stop.WaitForNotificationWithDeadline(next);
  }
  signals.join();
  PDSERVE_LOG(INFO) << "planner stopped";
  return 0;
}

}  // namespace
}  // namespace pdserve::planner

int main(int argc, char** argv) {
  pdserve::BlockShutdownSignals();
  pdserve::ParseFlags(argc, argv,
                      "Sizes the prefill and decode pools for TTFT and ITL SLOs.\n"
                      "  pdserve_planner --actuator=kubernetes|local|none [--dry_run] ...",
                      __FILE__);
  return pdserve::planner::Main();
}
