#include "common/prometheus_text.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/numbers.h"

namespace pdserve {
namespace {

bool Space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }
std::string_view StripLeading(std::string_view s) {
  while (!s.empty() && Space(s.front())) s.remove_prefix(1);
  return s;
}
std::string_view Strip(std::string_view s) {
  s = StripLeading(s);
  while (!s.empty() && Space(s.back())) s.remove_suffix(1);
  return s;
}

bool ParseValue(std::string_view text, double* out) {
  if (text == "+Inf" || text == "Inf") {
    *out = std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "-Inf") {
    *out = -std::numeric_limits<double>::infinity();
    return true;
  }
  if (text == "NaN") {
    *out = std::numeric_limits<double>::quiet_NaN();
    return true;
  }
  return absl::SimpleAtod(absl::string_view(text.data(), text.size()), out);
}

// Parses `{a="x",b="y"}` starting at line[*pos] == '{'; leaves *pos after '}'.
bool ParseLabels(std::string_view line, size_t* pos, std::map<std::string, std::string>* labels) {
  size_t i = *pos + 1;
  while (i < line.size()) {
    while (i < line.size() && (line[i] == ' ' || line[i] == ',')) ++i;
    if (i < line.size() && line[i] == '}') {
      *pos = i + 1;
      return true;
    }
    const size_t eq = line.find('=', i);
    if (eq == std::string_view::npos || eq + 1 >= line.size() || line[eq + 1] != '"') return false;
    std::string key(Strip(line.substr(i, eq - i)));
    std::string value;
    size_t j = eq + 2;
    for (; j < line.size() && line[j] != '"'; ++j) {
      if (line[j] == '\\' && j + 1 < line.size()) {
        ++j;
        value.push_back(line[j] == 'n' ? '\n' : line[j]);
      } else {
        value.push_back(line[j]);
      }
    }
    if (j >= line.size()) return false;
    (*labels)[std::move(key)] = std::move(value);
    i = j + 1;
  }
  return false;
}

}  // namespace

std::vector<MetricSample> ParseExposition(std::string_view exposition) {
  std::vector<MetricSample> out;
  size_t start = 0;
  while (start < exposition.size()) {
    size_t end = exposition.find('\n', start);
    if (end == std::string_view::npos) end = exposition.size();
    std::string_view line = Strip(exposition.substr(start, end - start));
    start = end + 1;
    if (line.empty() || line[0] == '#') continue;
    MetricSample s;
    size_t pos = 0;
    while (pos < line.size() && line[pos] != '{' && line[pos] != ' ') ++pos;
    s.name = std::string(line.substr(0, pos));
    if (s.name.empty()) continue;
    if (pos < line.size() && line[pos] == '{' && !ParseLabels(line, &pos, &s.labels)) continue;
    std::string_view rest = StripLeading(line.substr(pos));
    const size_t space = rest.find(' ');
    if (!ParseValue(rest.substr(0, space), &s.value)) continue;
    out.push_back(std::move(s));
  }
  return out;
}

HistogramBuckets HistogramOf(const std::vector<MetricSample>& samples, std::string_view name) {
  HistogramBuckets out;
  const std::string bucket = std::string(name) + "_bucket";
  for (const MetricSample& s : samples) {
    if (s.name != bucket) continue;
    auto le = s.labels.find("le");
    double upper;
    if (le == s.labels.end() || !ParseValue(le->second, &upper)) continue;
    out[upper] += s.value;
  }
  return out;
}

double SumOf(const std::vector<MetricSample>& samples, std::string_view name,
             const std::map<std::string, std::string>& match, bool* found) {
  double sum = 0;
  bool any = false;
  for (const MetricSample& s : samples) {
    if (s.name != name) continue;
    bool ok = true;
    for (const auto& [k, v] : match) {
      auto it = s.labels.find(k);
      if (it == s.labels.end() || it->second != v) ok = false;
    }
    if (!ok) continue;
    sum += s.value;
    any = true;
  }
  if (found != nullptr) *found = any;
  return sum;
}

HistogramBuckets SubtractBuckets(const HistogramBuckets& after, const HistogramBuckets& before) {
  HistogramBuckets out;
  for (const auto& [le, count] : after) {
    auto it = before.find(le);
    out[le] = count - (it == before.end() ? 0 : it->second);
  }
  return out;
}

double HistogramQuantile(double q, const HistogramBuckets& buckets) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (q < 0) return -std::numeric_limits<double>::infinity();
  if (q > 1) return std::numeric_limits<double>::infinity();
  if (buckets.size() < 2 || !std::isinf(buckets.rbegin()->first)) return nan;
  std::vector<std::pair<double, double>> b(buckets.begin(), buckets.end());
  // Counts are cumulative; a decrease (a scrape of a restarted process) is
  // flattened as Prometheus's ensureMonotonic does.
  for (size_t i = 1; i < b.size(); ++i) b[i].second = std::max(b[i].second, b[i - 1].second);
  const double observations = b.back().second;
  if (observations == 0) return nan;
  double rank = q * observations;
  size_t i = 0;
  while (i < b.size() - 1 && b[i].second < rank) ++i;
  if (i == b.size() - 1) return b[b.size() - 2].first;
  if (i == 0 && b[0].first <= 0) return b[0].first;
  double start = 0;
  double count = b[i].second;
  if (i > 0) {
    start = b[i - 1].first;
    count -= b[i - 1].second;
    rank -= b[i - 1].second;
  }
  return start + (b[i].first - start) * (rank / count);
}

}  // namespace pdserve
