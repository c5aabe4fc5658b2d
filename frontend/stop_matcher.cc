#include "frontend/stop_matcher.h"

#include <algorithm>

namespace pdserve::frontend {
namespace {

// Whether a UTF-8 byte starts a character (is not a continuation byte).
bool IsCharStart(char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  std::erase_if(stops_, [](const std::string& s) { return s.empty(); });
  for (const std::string& s : stops_) max_len_ = std::max(max_len_, s.size());
}

StopMatcher::Result StopMatcher::Push(std::string_view text) {
  Result result;
  if (stopped_) return result;
  held_.append(text);
  if (stops_.empty()) {
    result.text = std::move(held_);
    held_.clear();
    return result;
  }
  // Earliest match wins; among matches at one position, the longest.
  size_t best = std::string::npos;
  const std::string* best_stop = nullptr;
  for (const std::string& stop : stops_) {
    const size_t at = held_.find(stop);
    if (at != std::string::npos && (at < best || (at == best && stop.size() > best_stop->size()))) {
      best = at;
      best_stop = &stop;
    }
  }
  if (best_stop != nullptr) {
    stopped_ = true;
    result.stopped = true;
    result.matched = *best_stop;
    result.text = held_.substr(0, best);
    held_.clear();
    return result;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t keep = 0;
  for (const std::string& stop : stops_) {
    for (size_t n = std::min(stop.size() - 1, held_.size()); n > keep; --n) {
      if (held_.compare(held_.size() - n, n, stop, 0, n) == 0) {
        keep = n;
        break;
      }
    }
  }
  size_t cut = held_.size() - keep;
  while (cut > 0 && cut < held_.size() && !IsCharStart(held_[cut])) --cut;  // whole characters
  result.text = held_.substr(0, cut);
  held_.erase(0, cut);
  return result;
}

std::string StopMatcher::Flush() {
  std::string out = stopped_ ? std::string() : std::move(held_);
  held_.clear();
  return out;
}

}  // namespace pdserve::frontend
