// Helpers the benchmarks share: lists of sizes from flags, the median of
// rounds, the process's CPU time and the machine's load average (other work
// on a shared machine skews every timing; docs/performance.md records it
// with each).
#pragma once

#include <time.h>

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace pdserve::bench {

// The positive integers of a comma-separated list ("1,8,32"); other items
// are skipped.
inline std::vector<int> Ints(absl::string_view list) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(list, ',', absl::SkipEmpty())) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

// The middle value (the upper one of an even count); 0 when empty.
inline double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// CPU time of the whole process (every thread) so far.
inline double CpuSeconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The 1-, 5- and 15-minute load averages, as /proc/loadavg prints them.
inline std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string a, b, c;
  in >> a >> b >> c;
  return a + " " + b + " " + c;
}

}  // namespace pdserve::bench
