#include "kvtransfer/tcp/connection_slots.h"

#include "absl/strings/str_cat.h"

namespace pdserve::kvtransfer::tcp {

int ConnectionSlots::unauthenticated_from(const std::string& source) const {
  auto it = unauthenticated_by_source_.find(source);
  return it == unauthenticated_by_source_.end() ? 0 : it->second;
}

uint64_t ConnectionSlots::OldestIdle(const std::string* source,
                                     const std::function<bool(uint64_t)>& busy) const {
  for (uint64_t id : unauthenticated_) {
    if (source != nullptr && entries_.at(id).source != *source) continue;
    if (!busy(id)) return id;
  }
  return 0;
}

void ConnectionSlots::Remove(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  Entry& e = it->second;
  if (!e.authenticated) {
    unauthenticated_.erase(e.in_order);
    auto count = unauthenticated_by_source_.find(e.source);
    if (--count->second == 0) unauthenticated_by_source_.erase(count);
  }
  entries_.erase(it);
}

ConnectionSlots::Admission ConnectionSlots::Admit(uint64_t id, const std::string& source,
                                                  const std::function<bool(uint64_t)>& busy) {
  Admission out;
  if (unauthenticated_from(source) >= limits_.max_unauthenticated_per_source) {
    const uint64_t victim = OldestIdle(&source, busy);
    if (victim == 0) {
      out.refusal = absl::StrCat(unauthenticated_from(source), " connections from ", source,
                                 " are still in their handshake (limit per address)");
      return out;
    }
    Remove(victim);
    out.evicted.push_back(victim);
  }
  if (used() >= limits_.max_connections) {
    const uint64_t victim = OldestIdle(nullptr, busy);
    if (victim == 0) {
      out.refusal = absl::StrCat("all ", limits_.max_connections,
                                 " connection slots are taken by authenticated senders or "
                                 "handshakes in progress");
      return out;
    }
    Remove(victim);
    out.evicted.push_back(victim);
  }
  Entry& e = entries_[id];
  e.source = source;
  e.in_order = unauthenticated_.insert(unauthenticated_.end(), id);
  ++unauthenticated_by_source_[source];
  out.admitted = true;
  return out;
}

bool ConnectionSlots::Authenticate(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  Entry& e = it->second;
  if (e.authenticated) return true;
  unauthenticated_.erase(e.in_order);
  auto count = unauthenticated_by_source_.find(e.source);
  if (--count->second == 0) unauthenticated_by_source_.erase(count);
  e.authenticated = true;
  return true;
}

void ConnectionSlots::Release(uint64_t id) { Remove(id); }

}  // namespace pdserve::kvtransfer::tcp
