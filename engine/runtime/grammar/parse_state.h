// Parser states of a Grammar (grammar.h) and how bytes advance them.
//
// A configuration is a node that consumes a byte next (it has byte edges)
// and the stack of continuations below it: where each caller goes on once
// the rule it called ends. Stacks are persistent and shared: a StackArena
// interns (node, parent) pairs, so equal stacks have equal ids and a parse
// state is a small set of (node, stack id) pairs. Where alternatives share
// a prefix (anyOf branches, an optional part) the set holds one
// configuration per live alternative.
//
// The bottom of every stack is kNone. For the whole output that is the end
// of the grammar; the mask precomputation (token_masks.h) starts from a
// single node with kNone below it, and there reaching it means leaving the
// node's rule into a context it does not know.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "engine/runtime/grammar/grammar.h"

namespace pdserve::engine::grammar {

struct Config {
  int32_t node = kNone;
  int32_t parent = kNone;  // StackArena id, kNone at the bottom
  friend bool operator==(const Config&, const Config&) = default;
  friend auto operator<=>(const Config&, const Config&) = default;
};

// Interned continuation stacks. Not thread-safe.
class StackArena {
 public:
  explicit StackArena(const Grammar& grammar) : grammar_(grammar) {}

  // The stack `node` over `parent`.
  int32_t Push(int32_t node, int32_t parent);
  int32_t node(int32_t id) const { return entries_[id].node; }
  int32_t parent(int32_t id) const { return entries_[id].parent; }
  // Fewest bytes that finish every rule on the stack (0 for kNone).
  int32_t Cost(int32_t id) const { return id == kNone ? 0 : entries_[id].cost; }
  // Fewest bytes that finish the output from `c`.
  int32_t MinToFinish(const Config& c) const { return grammar_.MinToEnd(c.node) + Cost(c.parent); }

  // Entries pushed after Mark() are dropped again by Rewind (scratch work
  // such as checking candidate tokens).
  size_t Mark() const { return entries_.size(); }
  void Rewind(size_t mark);
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    int32_t node;
    int32_t parent;
    int32_t cost;
  };
  const Grammar& grammar_;
  std::vector<Entry> entries_;
  absl::flat_hash_map<uint64_t, int32_t> index_;
};

// The configurations a parse reaches and whether one of them ended the
// stack (popped its bottom).
struct StepOut {
  std::vector<Config> configs;  // sorted, unique
  bool bottom_reached = false;
};

// Adds the configurations `node` over `parent` stands for: the node itself
// if it has byte edges, the rules it calls (pushed), and, where the node may
// end its rule, the caller's continuation (popped). Does not sort.
void Close(const Grammar& g, StackArena& arena, int32_t node, int32_t parent, StepOut& out);

// One byte from every configuration of `in` into `out` (cleared first).
void AdvanceByte(const Grammar& g, StackArena& arena, std::span<const Config> in, uint8_t byte,
                 StepOut& out);

// The start state of the whole grammar.
StepOut StartState(const Grammar& g, StackArena& arena);

// Fewest bytes that finish the output from `state` (0 when it may end).
int32_t MinToFinish(const StackArena& arena, const StepOut& state);

// Advances `state` over `bytes` (a token). Returns false when no
// configuration survives and the end was not reached exactly at the last
// byte. `scratch` is reused.
bool AdvanceBytes(const Grammar& g, StackArena& arena, std::string_view bytes, StepOut& state,
                  StepOut& scratch);

}  // namespace pdserve::engine::grammar
