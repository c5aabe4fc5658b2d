// Parser states and byte steps (see parse_state.h).
#include "engine/runtime/grammar/parse_state.h"

#include <algorithm>
#include <string_view>

namespace pdserve::engine::grammar {

int32_t StackArena::Push(int32_t node, int32_t parent) {
  const uint64_t key =
      (static_cast<uint64_t>(static_cast<uint32_t>(node)) << 32) | static_cast<uint32_t>(parent);
  auto [it, inserted] = index_.try_emplace(key, static_cast<int32_t>(entries_.size()));
  if (inserted) entries_.push_back({node, parent, grammar_.MinToEnd(node) + Cost(parent)});
  return it->second;
}

void StackArena::Rewind(size_t mark) {
  while (entries_.size() > mark) {
    const Entry& e = entries_.back();
    index_.erase((static_cast<uint64_t>(static_cast<uint32_t>(e.node)) << 32) |
                 static_cast<uint32_t>(e.parent));
    entries_.pop_back();
  }
}

void Close(const Grammar& g, StackArena& arena, int32_t node, int32_t parent, StepOut& out) {
  // Iterative over pops: each pop continues at the caller's node.
  while (true) {
    const Node& n = g.node(node);
    if (!n.bytes.empty()) out.configs.push_back({node, parent});
    for (const CallEdge& c : n.calls) {
      // Rules consume at least one byte before they can end, and never call
      // themselves before that (Build checks both), so this terminates.
      Close(g, arena, g.rule(c.rule).start, arena.Push(c.target, parent), out);
    }
    if (!n.final) return;
    if (parent == kNone) {
      out.bottom_reached = true;
      return;
    }
    node = arena.node(parent);
    parent = arena.parent(parent);
  }
}

namespace {
void SortUnique(std::vector<Config>& v) {
  if (v.size() < 2) return;
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
}
}  // namespace

void AdvanceByte(const Grammar& g, StackArena& arena, std::span<const Config> in, uint8_t byte,
                 StepOut& out) {
  out.configs.clear();
  out.bottom_reached = false;
  for (const Config& c : in) {
    const int32_t t = g.Next(c.node, byte);
    if (t != kNone) Close(g, arena, t, c.parent, out);
  }
  SortUnique(out.configs);
}

StepOut StartState(const Grammar& g, StackArena& arena) {
  StepOut s;
  Close(g, arena, g.root_start(), kNone, s);
  SortUnique(s.configs);
  return s;
}

int32_t MinToFinish(const StackArena& arena, const StepOut& state) {
  if (state.bottom_reached) return 0;
  int32_t best = kUnreachable;
  for (const Config& c : state.configs) best = std::min(best, arena.MinToFinish(c));
  return best;
}

bool AdvanceBytes(const Grammar& g, StackArena& arena, std::string_view bytes, StepOut& state,
                  StepOut& scratch) {
  if (bytes.empty()) return false;
  for (char ch : bytes) {
    // Nothing may follow the end of the output: paths that reached it die.
    if (state.configs.empty()) {
      state.bottom_reached = false;
      return false;
    }
    AdvanceByte(g, arena, state.configs, static_cast<uint8_t>(ch), scratch);
    std::swap(state, scratch);
  }
  return !state.configs.empty() || state.bottom_reached;
}

}  // namespace pdserve::engine::grammar
