// Which connections hold the TCP KV receiver's slots, and which one gives
// its slot up when a new connection comes. Pure bookkeeping (ids, source
// addresses, order of arrival): no sockets, no clock, no locking (the
// receiver holds its lock around every call).
//
// A connection is unauthenticated from its accept until its first HEADER
// carries the cluster credential (or any well-formed HEADER where the
// cluster has none). Policy, for a new connection from address S:
//   1. S already has max_unauthenticated_per_source unauthenticated
//      connections: the oldest idle one of them is evicted; none idle: the
//      new connection is refused.
//   2. Every slot is taken: the oldest idle unauthenticated connection (from
//      any address) is evicted; none: the new connection is refused.
// "Idle" means no handshake bytes are waiting to be read (the caller's
// `busy` says which are not idle): a sender whose HEADER has arrived is
// about to authenticate and is left alone. An authenticated connection (a
// transfer in progress, or a sender's pooled connection between transfers)
// is never evicted, and authenticated connections from one address are not
// limited: they proved membership of the cluster.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace pdserve::kvtransfer::tcp {

struct SlotLimits {
  int max_connections = 256;
  int max_unauthenticated_per_source = 32;
};

class ConnectionSlots {
 public:
  explicit ConnectionSlots(SlotLimits limits) : limits_(limits) {}

  struct Admission {
    bool admitted = false;
    // Connections that lost their slot (oldest first): the caller closes
    // them. They are released already.
    std::vector<uint64_t> evicted;
    // Why the new connection was refused, for its error ACK.
    std::string refusal;
  };
  // Admits connection `id` (not yet known) from address `source`, evicting as
  // the policy says. `busy(id)` tells whether an unauthenticated connection
  // has handshake bytes waiting (then it is not evicted).
  Admission Admit(uint64_t id, const std::string& source,
                  const std::function<bool(uint64_t)>& busy);
  // Connection `id` presented a valid credential. False when it no longer
  // holds a slot (it was evicted): the caller closes it.
  bool Authenticate(uint64_t id);
  // Connection `id` closed; a no-op for an id that holds no slot.
  void Release(uint64_t id);

  int used() const { return static_cast<int>(entries_.size()); }
  int unauthenticated() const { return static_cast<int>(unauthenticated_.size()); }
  int unauthenticated_from(const std::string& source) const;

 private:
  struct Entry {
    std::string source;
    bool authenticated = false;
    std::list<uint64_t>::iterator in_order;  // into unauthenticated_, while unauthenticated
  };
  // The oldest idle unauthenticated connection (from `source` only, unless
  // it is empty); 0 when there is none.
  uint64_t OldestIdle(const std::string* source, const std::function<bool(uint64_t)>& busy) const;
  void Remove(uint64_t id);

  const SlotLimits limits_;
  absl::flat_hash_map<uint64_t, Entry> entries_;
  std::list<uint64_t> unauthenticated_;  // oldest first
  absl::flat_hash_map<std::string, int> unauthenticated_by_source_;
};

}  // namespace pdserve::kvtransfer::tcp
