#include "router/admission.h"

#include <algorithm>

namespace pdserve::router {
namespace {

constexpr int kDefaultBatchTokens = 4096;

int64_t QueuedPrefillTokens(const WorkerView& w) {
  return std::max(w.load.queued_prompt_tokens, w.outstanding_tokens);
}

bool PrefillTakes(const WorkerView& w, const AdmissionQuery& query,
                  const AdmissionOptions& options) {
  const int queued_requests = std::max(w.load.queued_requests, w.outstanding_requests);
  if (w.load.max_queued_requests > 0 && queued_requests >= w.load.max_queued_requests) {
    return false;
  }
  const int64_t queued = QueuedPrefillTokens(w);
  if (queued == 0) return true;
  const int64_t batch = w.load.max_batch_tokens > 0 ? w.load.max_batch_tokens : kDefaultBatchTokens;
  const int64_t after = queued + query.prompt_tokens;
  if (after > int64_t{options.prefill_queue_batches} * batch) return false;
  if (options.prefill_queue_seconds > 0 && w.load.tokens_per_second > 0) {
    return static_cast<double>(after) <= options.prefill_queue_seconds * w.load.tokens_per_second;
  }
  return true;
}

bool DecodeTakes(const WorkerView& w, const AdmissionQuery& query) {
  if (w.load.total_kv_blocks == 0) return true;  // never reported: the worker decides
  const int sequences = std::max(w.load.running_sequences, w.outstanding_requests);
  if (w.load.max_sequences > 0 && sequences >= w.load.max_sequences) return false;
  const int64_t free_tokens =
      int64_t{w.load.free_kv_blocks} * w.desc.kv_block_size - w.tokens_since_report;
  return free_tokens >= DecodeAdmissionTokens(w, {.prompt_tokens = query.prompt_tokens,
                                                  .max_tokens = query.max_tokens});
}

}  // namespace

bool HasCapacity(std::span<const WorkerView> prefill, std::span<const WorkerView> decode,
                 const AdmissionQuery& query, const AdmissionOptions& options) {
  if (prefill.empty() || decode.empty()) return true;
  // No pair whose KV matches at all: placing fails clearly, waiting would not help.
  const bool any_pair = std::any_of(decode.begin(), decode.end(), [&](const WorkerView& d) {
    return std::any_of(prefill.begin(), prefill.end(),
                       [&](const WorkerView& p) { return KvCompatible(p.desc, d.desc); });
  });
  if (!any_pair) return true;
  for (const WorkerView& d : decode) {
    if (!DecodeTakes(d, query)) continue;
    for (const WorkerView& p : prefill) {
      if (KvCompatible(p.desc, d.desc) && PrefillTakes(p, query, options)) return true;
    }
  }
  return false;
}

bool CouldEverFit(std::span<const WorkerView> decode, const AdmissionQuery& query) {
  for (const WorkerView& w : decode) {
    if (w.load.total_kv_blocks == 0) return true;
    const int64_t total = int64_t{w.load.total_kv_blocks} * w.desc.kv_block_size;
    if (total >= DecodeAdmissionTokens(
                     w, {.prompt_tokens = query.prompt_tokens, .max_tokens = query.max_tokens})) {
      return true;
    }
  }
  return decode.empty();
}

std::optional<absl::Duration> EstimateQueueWait(std::span<const WorkerView> prefill,
                                                int64_t router_tokens) {
  double rate = 0;
  int64_t tokens = router_tokens;
  for (const WorkerView& w : prefill) {
    rate += w.load.tokens_per_second;
    tokens += QueuedPrefillTokens(w);
  }
  if (rate <= 0) return std::nullopt;
  return absl::Seconds(static_cast<double>(tokens) / rate);
}

bool AdmissionQueue::Push(const Waiting& w, bool front) {
  if (keys_.contains(w.ticket)) return true;
  if (!front && size() >= options_.max_queued) return false;
  const Key key{w.priority, front ? next_front_-- : next_back_++};
  order_.emplace(key, w);
  keys_.emplace(w.ticket, key);
  tokens_ += w.tokens;
  return true;
}

const AdmissionQueue::Waiting* AdmissionQueue::Head() const {
  return order_.empty() ? nullptr : &order_.begin()->second;
}

bool AdmissionQueue::Remove(Ticket ticket) {
  auto it = keys_.find(ticket);
  if (it == keys_.end()) return false;
  auto entry = order_.find(it->second);
  tokens_ -= entry->second.tokens;
  order_.erase(entry);
  keys_.erase(it);
  return true;
}

std::vector<std::pair<AdmissionQueue::Ticket, AdmissionQueue::Why>> AdmissionQueue::Expire(
    absl::Time now) {
  std::vector<std::pair<Ticket, Why>> out;
  for (const auto& [key, w] : order_) {
    if (now >= w.deadline) {
      out.emplace_back(w.ticket, Why::kDeadline);
    } else if (now - w.enqueued >= options_.max_wait) {
      out.emplace_back(w.ticket, Why::kMaxWait);
    }
  }
  for (const auto& [ticket, why] : out) Remove(ticket);
  return out;
}

}  // namespace pdserve::router
