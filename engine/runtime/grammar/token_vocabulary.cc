// TokenVocabulary (see token_vocabulary.h).
#include "engine/runtime/grammar/token_vocabulary.h"

#include <algorithm>
#include <utility>

namespace pdserve::engine::grammar {

TokenVocabulary::TokenVocabulary(std::vector<std::string> token_bytes, std::vector<int> eos_ids)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  for (size_t id = 0; id < bytes_.size(); ++id) {
    if (!bytes_[id].empty()) sorted_.push_back(static_cast<int32_t>(id));
  }
  std::sort(sorted_.begin(), sorted_.end(), [&](int32_t a, int32_t b) {
    return bytes_[a] != bytes_[b] ? bytes_[a] < bytes_[b] : a < b;
  });
  prefix_.resize(sorted_.size(), 0);
  for (size_t i = 0; i < sorted_.size(); ++i) {
    const std::string& s = bytes_[sorted_[i]];
    max_len_ = std::max(max_len_, static_cast<int>(s.size()));
    if (i == 0) continue;
    const std::string& p = bytes_[sorted_[i - 1]];
    const size_t n = std::min(s.size(), p.size());
    size_t k = 0;
    while (k < n && s[k] == p[k]) ++k;
    prefix_[i] = static_cast<int32_t>(k);
  }
}

}  // namespace pdserve::engine::grammar
