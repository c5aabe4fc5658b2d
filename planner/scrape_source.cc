#include "planner/scrape_source.h"

#include <arpa/inet.h>
#include <netdb.h>
#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "nlohmann/json.hpp"

namespace pdserve::planner {
namespace {

// Every address the host of `host_port` resolves to, as host:port strings.
absl::StatusOr<std::vector<std::string>> Resolve(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat("not host:port: ", host_port));
  }
  std::string host = host_port.substr(0, colon);
  const std::string port = host_port.substr(colon + 1);
  if (host.size() > 1 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  if (int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &result); rc != 0) {
    return absl::UnavailableError(absl::StrCat("cannot resolve ", host, ": ", gai_strerror(rc)));
  }
  std::set<std::string> out;
  for (addrinfo* a = result; a != nullptr; a = a->ai_next) {
    char buf[INET6_ADDRSTRLEN] = {};
    if (a->ai_family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(a->ai_addr)->sin_addr, buf, sizeof(buf));
      out.insert(absl::StrCat(buf, ":", port));
    } else if (a->ai_family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(a->ai_addr)->sin6_addr, buf,
                sizeof(buf));
      out.insert(absl::StrCat("[", buf, "]:", port));
    }
  }
  freeaddrinfo(result);
  return std::vector<std::string>(out.begin(), out.end());
}

absl::StatusOr<std::vector<std::string>> ResolveAll(const std::vector<std::string>& targets) {
  std::vector<std::string> out;
  for (const std::string& t : targets) {
    absl::StatusOr<std::vector<std::string>> addresses = Resolve(t);
    if (!addresses.ok()) return addresses.status();
    out.insert(out.end(), addresses->begin(), addresses->end());
  }
  return out;
}

// pid and metrics_port of a ready file; none when unreadable.
std::optional<std::pair<int, int>> ReadyProcess(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("pid") || !j.contains("metrics_port")) return std::nullopt;
  int pid = 0, port = 0;
  if (!j["pid"].is_string() || !j["metrics_port"].is_string() ||
      !absl::SimpleAtoi(j["pid"].get<std::string>(), &pid) ||
      !absl::SimpleAtoi(j["metrics_port"].get<std::string>(), &port)) {
    return std::nullopt;
  }
  return std::make_pair(pid, port);
}

// Sum over the targets of one role: value now, or none if any target lacks it.
std::optional<double> SumNow(const std::vector<const std::vector<MetricSample>*>& scrapes,
                             const char* metric) {
  double sum = 0;
  for (const auto* samples : scrapes) {
    bool found = false;
    sum += SumOf(*samples, metric, {}, &found);
    if (!found) return std::nullopt;
  }
  return sum;
}

}  // namespace

TargetDiscovery StaticTargets(ScrapeTargets targets) {
  return [targets]() -> absl::StatusOr<ScrapeTargets> {
    ScrapeTargets out;
    for (auto [from, to] :
         {std::pair{&targets.router, &out.router}, std::pair{&targets.prefill, &out.prefill},
          std::pair{&targets.decode, &out.decode}}) {
      absl::StatusOr<std::vector<std::string>> resolved = ResolveAll(*from);
      if (!resolved.ok()) return resolved.status();
      *to = *std::move(resolved);
    }
    return out;
  };
}

TargetDiscovery ClusterWorkTargets(std::string work_dir) {
  return [work_dir]() -> absl::StatusOr<ScrapeTargets> {
    ScrapeTargets out;
    std::error_code ec;
    std::vector<std::filesystem::path> files;
    for (const auto& entry : std::filesystem::directory_iterator(work_dir, ec)) {
      if (entry.path().extension() == ".ready") files.push_back(entry.path());
    }
    if (ec)
      return absl::UnavailableError(absl::StrCat("cannot list ", work_dir, ": ", ec.message()));
    std::sort(files.begin(), files.end());
    for (const auto& path : files) {
      const std::string stem = path.stem().string();
      std::vector<std::string>* role = nullptr;
      if (stem == "router") role = &out.router;
      if (stem.rfind("prefill", 0) == 0) role = &out.prefill;
      if (stem.rfind("decode", 0) == 0) role = &out.decode;
      if (role == nullptr) continue;
      std::optional<std::pair<int, int>> p = ReadyProcess(path);
      if (!p.has_value() || kill(p->first, 0) != 0) continue;  // exited
      role->push_back(absl::StrCat("127.0.0.1:", p->second));
    }
    if (out.router.empty()) {
      return absl::UnavailableError(absl::StrCat("no live router in ", work_dir));
    }
    return out;
  };
}

Fetch HttpFetch(HttpOptions options) {
  return [options](const std::string& target) -> absl::StatusOr<std::string> {
    absl::StatusOr<HttpResponse> r =
        HttpRequest("GET", absl::StrCat("http://", target, "/metrics"), "", "", options);
    if (!r.ok()) return r.status();
    if (r->status != 200) {
      return absl::UnavailableError(absl::StrCat("GET http://", target, "/metrics: ", r->status));
    }
    return std::move(r->body);
  };
}

const ScrapeSource::Scrape* ScrapeSource::Baseline(const std::deque<Scrape>& history,
                                                   absl::Time now, absl::Duration window) {
  if (history.size() < 2) return nullptr;
  const Scrape* best = &history.front();
  for (size_t i = 0; i + 1 < history.size(); ++i) {
    if (history[i].time <= now - window) best = &history[i];
  }
  return best;
}

std::optional<double> ScrapeSource::BusyRate(const std::vector<const std::deque<Scrape>*>& pool,
                                             absl::Time now) const {
  const std::string tokens = absl::StrCat(kPrefillBatchTokensMetric, "_sum");
  const std::string seconds = absl::StrCat(kPrefillStepSecondsMetric, "_sum");
  double computed = 0, busy = 0;
  for (const auto* h : pool) {
    const Scrape* base = Baseline(*h, now);
    if (base == nullptr) continue;  // a worker seen once has no window yet
    bool found_tokens = false, found_seconds = false;
    const double t1 = SumOf(h->back().samples, tokens, {}, &found_tokens);
    const double s1 = SumOf(h->back().samples, seconds, {}, &found_seconds);
    if (!found_tokens || !found_seconds) return std::nullopt;
    const double t0 = SumOf(base->samples, tokens), s0 = SumOf(base->samples, seconds);
    const bool restarted = t1 < t0 || s1 < s0;  // counts from zero
    computed += restarted ? t1 : t1 - t0;
    busy += restarted ? s1 : s1 - s0;
  }
  return busy > 0 ? computed / busy : std::numeric_limits<double>::quiet_NaN();
}

Observation ScrapeSource::Read(absl::Time now) {
  Observation o{.time = now};
  absl::StatusOr<ScrapeTargets> targets = discovery_();
  if (!targets.ok()) {
    PDSERVE_LOG(WARNING) << "planner: target discovery failed: " << targets.status();
    return o;
  }
  // Scrape every target; a role with a failed target is incomplete.
  std::set<std::string> live;
  std::map<std::string, std::vector<const std::deque<Scrape>*>> by_role;
  std::map<std::string, bool> complete = {{"router", true}, {"prefill", true}, {"decode", true}};
  for (auto [role, list] :
       {std::pair{"router", &targets->router}, std::pair{"prefill", &targets->prefill},
        std::pair{"decode", &targets->decode}}) {
    for (const std::string& target : *list) {
      const std::string key = absl::StrCat(role, "/", target);
      live.insert(key);
      absl::StatusOr<std::string> text = fetch_(target);
      if (!text.ok()) {
        PDSERVE_LOG(WARNING) << "planner: " << role << " target " << target << ": "
                             << text.status();
        complete[role] = false;
        continue;
      }
      std::deque<Scrape>& h = history_[key];
      h.push_back({now, ParseExposition(*text)});
      while (h.size() > 2 && h[1].time <= now - 2 * options_.window) h.pop_front();
      by_role[role].push_back(&h);
    }
  }
  for (auto it = history_.begin(); it != history_.end();) {
    it = live.count(it->first) ? std::next(it) : history_.erase(it);
  }

  // Router: latency quantiles and rates over the window, pool sizes now.
  const auto& routers = by_role["router"];
  if (complete["router"] && !routers.empty()) {
    std::vector<const std::vector<MetricSample>*> latest;
    for (const auto* h : routers) latest.push_back(&h->back().samples);
    for (Pool pool : kPools) {
      bool found = false;
      double n = 0;
      for (const auto* s : latest) {
        bool f = false;
        n += SumOf(*s, kPoolWorkersMetric, {{"pool", std::string(PoolName(pool))}}, &f);
        found = found || f;
      }
      if (found) o.ready_workers[pool] = static_cast<int>(std::lround(n));
    }
    // A router counter's rate over `window`, summed over the routers;
    // none when a router lacks it or has no scrape that old.
    auto counter_rate = [&](const char* metric, absl::Duration window) -> std::optional<double> {
      double sum = 0;
      for (const auto* h : routers) {
        const Scrape* base = Baseline(*h, now, window);
        const double dt = base == nullptr ? 0 : absl::ToDoubleSeconds(h->back().time - base->time);
        bool found = false;
        const double after = SumOf(h->back().samples, metric, {}, &found);
        if (dt <= 0 || !found) return std::nullopt;
        const double before = SumOf(base->samples, metric);
        sum += (after >= before ? after - before : after) / dt;  // a restart counts from 0
      }
      return sum;
    };
    bool have_window = true;
    HistogramBuckets ttft, itl;
    for (const auto* h : routers) {
      const Scrape* base = Baseline(*h, now);
      if (base == nullptr) {
        have_window = false;
        break;
      }
      const Scrape& cur = h->back();
      const double dt = absl::ToDoubleSeconds(cur.time - base->time);
      if (dt <= 0) {
        have_window = false;
        break;
      }
      for (auto [metric, sum] : {std::pair{kTtftMetric, &ttft},
                                 std::pair{options_.decode_latency_metric.c_str(), &itl}}) {
        HistogramBuckets after = HistogramOf(cur.samples, metric);
        HistogramBuckets before = HistogramOf(base->samples, metric);
        if (after.empty()) {
          have_window = false;
          continue;
        }
        // A restart (counts went down) counts from zero.
        HistogramBuckets delta =
            (!before.empty() && before.rbegin()->second > after.rbegin()->second)
                ? after
                : SubtractBuckets(after, before);
        for (const auto& [le, c] : delta) (*sum)[le] += c;
      }
    }
    // The window's rates: every router must have all three counters.
    const std::optional<double> requests = counter_rate(kRequestsMetric, options_.window);
    const std::optional<double> prompt = counter_rate(kPromptTokensMetric, options_.window);
    const std::optional<double> generated = counter_rate(kGenerationTokensMetric, options_.window);
    if (!requests.has_value() || !prompt.has_value() || !generated.has_value()) {
      have_window = false;
    }
    const absl::Duration recent = std::min(options_.rate_window, options_.window);
    if (have_window && options_.rate_window > absl::ZeroDuration()) {
      // The same rates over the shorter window: the demand now.
      std::optional<double> recent_requests = counter_rate(kRequestsMetric, recent);
      std::optional<double> recent_prompt = counter_rate(kPromptTokensMetric, recent);
      std::optional<double> recent_generated = counter_rate(kGenerationTokensMetric, recent);
      if (recent_requests.has_value() && recent_prompt.has_value() &&
          recent_generated.has_value()) {
        o.recent_request_rate = recent_requests;
        o.recent_prompt_tokens_per_s = recent_prompt;
        o.recent_output_tokens_per_s = recent_generated;
        // max_tokens requested: optional (a router without it leaves it absent).
        o.recent_requested_tokens_per_s = counter_rate(kRequestedTokensMetric, recent);
      }
    }
    if (have_window) {
      o.requested_tokens_per_s = counter_rate(kRequestedTokensMetric, options_.window);
      o.ttft_s = HistogramQuantile(options_.quantile, ttft);
      o.ttft_count = ttft.empty() ? 0 : ttft.rbegin()->second;
      o.itl_s = HistogramQuantile(options_.quantile, itl);
      o.itl_count = itl.empty() ? 0 : itl.rbegin()->second;
      o.request_rate = requests;
      o.prompt_tokens_per_s = prompt;
      o.output_tokens_per_s = generated;
    }
  }
  // Pools, now.
  auto latest = [&](const char* role) {
    std::vector<const std::vector<MetricSample>*> out;
    for (const auto* h : by_role[role]) out.push_back(&h->back().samples);
    return out;
  };
  if (complete["prefill"]) {
    o.prefill_queued_tokens = SumNow(latest("prefill"), kQueuedTokensMetric);
    o.prefill_tokens_per_busy_s = BusyRate(by_role["prefill"], now);
  }
  if (complete["decode"]) {
    const auto decode = latest("decode");
    std::optional<double> running = SumNow(decode, kRunningSequencesMetric);
    std::optional<double> waiting = SumNow(decode, kWaitingKvSequencesMetric);
    if (running.has_value() && waiting.has_value()) o.decode_sequences = *running + *waiting;
    std::optional<double> kv = SumNow(decode, kKvUsageMetric);
    if (kv.has_value()) o.decode_kv_usage = decode.empty() ? 0 : *kv / decode.size();
  }
  return o;
}

}  // namespace pdserve::planner
