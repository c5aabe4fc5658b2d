#include "bench/loadgen/workload.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace pdserve::loadgen {
namespace {

absl::StatusOr<std::vector<double>> Numbers(std::vector<std::string> parts, const std::string& spec) {
  std::vector<double> out;
  for (size_t i = 1; i < parts.size(); ++i) {
    double v;
    if (!absl::SimpleAtod(parts[i], &v)) {
      return absl::InvalidArgumentError(absl::StrCat("length distribution \"", spec, "\": ",
                                                     parts[i], " is not a number"));
    }
    out.push_back(v);
  }
  return out;
}

}  // namespace

absl::StatusOr<LengthDistribution> LengthDistribution::Parse(const std::string& spec) {
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  auto nums = Numbers(parts, spec);
  if (!nums.ok()) return nums.status();
  const std::vector<double>& n = *nums;
  auto bad = [&](const char* why) {
    return absl::InvalidArgumentError(absl::StrCat("length distribution \"", spec, "\": ", why,
                                                   " (fixed:N, uniform:LO:HI, normal:MEAN:STD[:LO:HI])"));
  };
  LengthDistribution d;
  if (parts[0] == "fixed") {
    if (n.size() != 1 || n[0] < 1) return bad("fixed needs one value >= 1");
    d.kind = Kind::kFixed;
    d.a = std::round(n[0]);
    d.lo = d.hi = static_cast<int>(d.a);
  } else if (parts[0] == "uniform") {
    if (n.size() != 2 || n[0] < 1 || n[1] < n[0]) return bad("uniform needs 1 <= LO <= HI");
    d.kind = Kind::kUniform;
    d.a = std::round(n[0]);
    d.b = std::round(n[1]);
    d.lo = static_cast<int>(d.a);
    d.hi = static_cast<int>(d.b);
  } else if (parts[0] == "normal") {
    if (n.size() != 2 && n.size() != 4) return bad("normal needs MEAN:STD or MEAN:STD:LO:HI");
    if (n[0] < 1 || n[1] < 0) return bad("normal needs MEAN >= 1 and STD >= 0");
    d.kind = Kind::kNormal;
    d.a = n[0];
    d.b = n[1];
    d.lo = n.size() == 4 ? static_cast<int>(std::round(n[2])) : 1;
    d.hi = n.size() == 4 ? static_cast<int>(std::round(n[3])) : static_cast<int>(std::ceil(n[0] + 4 * n[1]));
    if (d.lo < 1 || d.hi < d.lo) return bad("normal needs 1 <= LO <= HI");
  } else if (parts[0] == "exponential") {
    if (n.size() != 1 && n.size() != 3) return bad("exponential needs MEAN or MEAN:LO:HI");
    if (n[0] < 1) return bad("exponential needs MEAN >= 1");
    d.kind = Kind::kExponential;
    d.a = n[0];
    d.lo = n.size() == 3 ? static_cast<int>(std::round(n[1])) : 1;
    d.hi =
        n.size() == 3 ? static_cast<int>(std::round(n[2])) : static_cast<int>(std::ceil(10 * n[0]));
    if (d.lo < 1 || d.hi < d.lo) return bad("exponential needs 1 <= LO <= HI");
  } else {
    return bad("unknown kind");
  }
  return d;
}

int LengthDistribution::Sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return lo;
    case Kind::kUniform:
      return std::uniform_int_distribution<int>(lo, hi)(rng);
    case Kind::kNormal: {
      const double v = std::round(std::normal_distribution<double>(a, b)(rng));
      return static_cast<int>(std::clamp(v, static_cast<double>(lo), static_cast<double>(hi)));
    }
    case Kind::kExponential: {
      const double v = std::round(std::exponential_distribution<double>(1.0 / a)(rng));
      return static_cast<int>(std::clamp(v, static_cast<double>(lo), static_cast<double>(hi)));
    }
  }
  return lo;
}

int LengthDistribution::max() const { return hi; }

std::string LengthDistribution::ToString() const {
  switch (kind) {
    case Kind::kFixed:
      return absl::StrCat("fixed:", lo);
    case Kind::kUniform:
      return absl::StrCat("uniform:", lo, ":", hi);
    case Kind::kNormal:
      return absl::StrCat("normal:", a, ":", b, ":", lo, ":", hi);
    case Kind::kExponential:
      return absl::StrCat("exponential:", a, ":", lo, ":", hi);
  }
  return "";
}

absl::StatusOr<Arrival> ParseArrival(const std::string& name) {
  if (name == "poisson") return Arrival::kPoisson;
  if (name == "fixed") return Arrival::kFixed;
  if (name == "burst") return Arrival::kBurst;
  return absl::InvalidArgumentError(absl::StrCat("arrival \"", name, "\": poisson, fixed or burst"));
}

const char* ArrivalName(Arrival arrival) {
  switch (arrival) {
    case Arrival::kPoisson: return "poisson";
    case Arrival::kFixed: return "fixed";
    case Arrival::kBurst: return "burst";
  }
  return "";
}

absl::StatusOr<std::vector<PlannedRequest>> PlanWorkload(const WorkloadOptions& options) {
  if (options.arrival != Arrival::kBurst && !(options.rate > 0)) {
    return absl::InvalidArgumentError("rate must be > 0");
  }
  if (!(options.duration_s > 0) && options.arrival != Arrival::kBurst) {
    return absl::InvalidArgumentError("duration must be > 0");
  }
  if (options.arrival == Arrival::kBurst && options.max_requests <= 0) {
    return absl::InvalidArgumentError("burst arrivals need max_requests");
  }
  if (options.vocab_size < 2) return absl::InvalidArgumentError("vocab_size must be >= 2");
  if (options.shared_prefix_len < 0 || options.num_shared_prefixes < 1) {
    return absl::InvalidArgumentError("shared prefixes need a length >= 0 and a count >= 1");
  }
  // Separate streams, so changing a length distribution leaves the arrival
  // times alone and the other way round.
  std::mt19937_64 arrivals(options.seed);
  std::mt19937_64 lengths(options.seed ^ 0x5851F42D4C957F2Dull);
  std::mt19937_64 tokens(options.seed ^ 0x14057B7EF767814Full);
  std::uniform_int_distribution<int32_t> token(1, options.vocab_size - 1);
  std::exponential_distribution<double> gap(options.arrival == Arrival::kBurst ? 1.0 : options.rate);
  // The shared prefixes and each request's pick: streams of their own.
  std::mt19937_64 prefix_tokens(options.seed ^ 0x2545F4914F6CDD1Dull);
  std::mt19937_64 prefix_picks(options.seed ^ 0x9E3779B97F4A7C15ull);
  std::vector<std::vector<int32_t>> prefixes;
  if (options.shared_prefix_len > 0) {
    for (int p = 0; p < options.num_shared_prefixes; ++p) {
      std::vector<int32_t>& prefix = prefixes.emplace_back(options.shared_prefix_len);
      for (int32_t& id : prefix) id = token(prefix_tokens);
    }
  }
  std::uniform_int_distribution<int> pick(0, options.num_shared_prefixes - 1);

  std::vector<PlannedRequest> plan;
  double t = 0;
  for (int i = 0; options.max_requests <= 0 || i < options.max_requests; ++i) {
    switch (options.arrival) {
      case Arrival::kPoisson: t = i == 0 ? gap(arrivals) : t + gap(arrivals); break;
      case Arrival::kFixed: t = i / options.rate; break;
      case Arrival::kBurst: t = 0; break;
    }
    if (options.arrival != Arrival::kBurst && t >= options.duration_s) break;
    PlannedRequest r;
    r.index = i;
    r.send_at_s = t;
    r.prompt.resize(options.prompt_len.Sample(lengths));
    r.output_len = options.output_len.Sample(lengths);
    for (int32_t& id : r.prompt) id = token(tokens);
    if (!prefixes.empty()) {
      r.prefix_index = pick(prefix_picks);
      r.prompt.insert(r.prompt.begin(), prefixes[r.prefix_index].begin(),
                      prefixes[r.prefix_index].end());
    }
    plan.push_back(std::move(r));
  }
  return plan;
}

}  // namespace pdserve::loadgen
