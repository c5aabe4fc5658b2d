// Grammar construction (see grammar.h): Expr -> Thompson automaton -> DFA per
// rule, then pruning and the analyses the matcher needs.
#include "engine/runtime/grammar/grammar.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pdserve::engine::grammar {

Expr Expr::Bytes(uint8_t lo, uint8_t hi) {
  Expr e;
  e.kind = Kind::kBytes;
  e.lo = lo;
  e.hi = hi;
  return e;
}

Expr Expr::Literal(std::string_view text) {
  Expr e;
  e.kind = Kind::kSeq;
  for (char c : text) e.items.push_back(Byte(static_cast<uint8_t>(c)));
  return e;
}

Expr Expr::Call(int32_t rule) {
  Expr e;
  e.kind = Kind::kCall;
  e.rule = rule;
  return e;
}

Expr Expr::Seq(std::vector<Expr> items) {
  Expr e;
  e.kind = Kind::kSeq;
  e.items = std::move(items);
  return e;
}

Expr Expr::Alt(std::vector<Expr> items) {
  Expr e;
  e.kind = Kind::kAlt;
  e.items = std::move(items);
  return e;
}

Expr Expr::Repeat(Expr item, int min, int max) {
  Expr e;
  e.kind = Kind::kRepeat;
  e.items.push_back(std::move(item));
  e.min = min;
  e.max = max;
  return e;
}

namespace {

// Thompson automaton of one rule body.
struct Nfa {
  struct State {
    std::vector<int32_t> eps;
    std::vector<ByteEdge> bytes;
    std::vector<CallEdge> calls;
  };
  std::vector<State> states;

  int32_t Add() {
    states.emplace_back();
    return static_cast<int32_t>(states.size()) - 1;
  }

  // Adds `e` after state `in`; returns the state where it ends.
  int32_t Build(const Expr& e, int32_t in) {
    switch (e.kind) {
      case Expr::Kind::kBytes: {
        const int32_t s = Add();
        states[in].bytes.push_back({e.lo, e.hi, s});
        return s;
      }
      case Expr::Kind::kCall: {
        const int32_t s = Add();
        states[in].calls.push_back({e.rule, s});
        return s;
      }
      case Expr::Kind::kSeq: {
        int32_t cur = in;
        for (const Expr& item : e.items) cur = Build(item, cur);
        return cur;
      }
      case Expr::Kind::kAlt: {
        const int32_t out = Add();
        for (const Expr& item : e.items) {
          const int32_t s = Add();
          states[in].eps.push_back(s);
          const int32_t end = Build(item, s);
          states[end].eps.push_back(out);
        }
        return out;
      }
      case Expr::Kind::kRepeat: {
        const Expr& item = e.items[0];
        int32_t cur = in;
        for (int i = 0; i < e.min; ++i) cur = Build(item, cur);
        if (e.max < 0) {
          const int32_t loop = Add();
          states[cur].eps.push_back(loop);
          const int32_t end = Build(item, loop);
          states[end].eps.push_back(loop);
          return loop;
        }
        const int32_t out = Add();
        states[cur].eps.push_back(out);
        for (int i = e.min; i < e.max; ++i) {
          cur = Build(item, cur);
          states[cur].eps.push_back(out);
        }
        return out;
      }
    }
    return in;
  }

  std::vector<int32_t> Closure(std::vector<int32_t> set) const {
    std::vector<int32_t> stack = set;
    std::vector<bool> seen(states.size(), false);
    for (int32_t s : set) seen[s] = true;
    while (!stack.empty()) {
      const int32_t s = stack.back();
      stack.pop_back();
      for (int32_t t : states[s].eps) {
        if (!seen[t]) {
          seen[t] = true;
          set.push_back(t);
          stack.push_back(t);
        }
      }
    }
    std::sort(set.begin(), set.end());
    return set;
  }
};

// A rule's DFA with node ids local to the rule (0 = start).
struct RuleDfa {
  std::vector<Node> nodes;
};

RuleDfa Determinize(const Expr& body) {
  Nfa nfa;
  const int32_t start = nfa.Add();
  const int32_t accept = nfa.Build(body, start);
  RuleDfa dfa;
  std::map<std::vector<int32_t>, int32_t> ids;
  std::vector<std::vector<int32_t>> sets;
  auto intern = [&](std::vector<int32_t> set) {
    auto [it, inserted] = ids.emplace(set, static_cast<int32_t>(sets.size()));
    if (inserted) {
      sets.push_back(std::move(set));
      dfa.nodes.emplace_back();
    }
    return it->second;
  };
  intern(nfa.Closure({start}));
  for (size_t d = 0; d < sets.size(); ++d) {
    const std::vector<int32_t> set = sets[d];
    Node node;
    // Byte edges: split at every range boundary, group equal target sets.
    std::set<int> cuts;
    std::map<int32_t, std::vector<int32_t>> calls;
    for (int32_t s : set) {
      if (s == accept) node.final = true;
      for (const ByteEdge& e : nfa.states[s].bytes) {
        cuts.insert(e.lo);
        cuts.insert(e.hi + 1);
      }
      for (const CallEdge& c : nfa.states[s].calls) calls[c.rule].push_back(c.target);
    }
    const std::vector<int> points(cuts.begin(), cuts.end());
    for (size_t i = 0; i + 1 < points.size(); ++i) {
      const int lo = points[i], hi = points[i + 1] - 1;
      std::vector<int32_t> targets;
      for (int32_t s : set) {
        for (const ByteEdge& e : nfa.states[s].bytes) {
          if (e.lo <= lo && hi <= e.hi) targets.push_back(e.target);
        }
      }
      if (targets.empty()) continue;
      const int32_t t = intern(nfa.Closure(std::move(targets)));
      if (!node.bytes.empty() && node.bytes.back().target == t && node.bytes.back().hi + 1 == lo) {
        node.bytes.back().hi = static_cast<uint8_t>(hi);
      } else {
        node.bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi), t});
      }
    }
    for (auto& [rule, targets] : calls) {
      node.calls.push_back({rule, intern(nfa.Closure(std::move(targets)))});
    }
    dfa.nodes[d] = std::move(node);
  }
  return dfa;
}

// Merges equivalent nodes (Moore's partition refinement): the same
// finality and, per byte and per called rule, targets in the same class.
// Every node gets a token mask of its own, so fewer nodes is less work.
RuleDfa Minimize(const RuleDfa& dfa) {
  const size_t n = dfa.nodes.size();
  std::vector<int32_t> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = dfa.nodes[i].final ? 1 : 0;
  size_t num_classes = 0;
  while (true) {
    std::map<std::vector<int64_t>, int32_t> sig_ids;
    std::vector<int32_t> next(n);
    for (size_t i = 0; i < n; ++i) {
      const Node& node = dfa.nodes[i];
      std::vector<int64_t> sig = {cls[i]};
      for (const ByteEdge& e : node.bytes) {
        sig.push_back(e.lo);
        sig.push_back(e.hi);
        sig.push_back(cls[e.target]);
      }
      sig.push_back(-1);
      for (const CallEdge& c : node.calls) {
        sig.push_back(c.rule);
        sig.push_back(cls[c.target]);
      }
      next[i] = sig_ids.emplace(std::move(sig), static_cast<int32_t>(sig_ids.size())).first->second;
    }
    const size_t count = sig_ids.size();
    cls = std::move(next);
    if (count == num_classes) break;
    num_classes = count;
  }
  // Class of the start first, so node 0 stays the start.
  std::vector<int32_t> renumber(num_classes, kNone);
  int32_t used = 0;
  renumber[cls[0]] = used++;
  for (size_t i = 0; i < n; ++i) {
    if (renumber[cls[i]] == kNone) renumber[cls[i]] = used++;
  }
  RuleDfa out;
  out.nodes.resize(num_classes);
  std::vector<bool> done(num_classes, false);
  for (size_t i = 0; i < n; ++i) {
    const int32_t c = renumber[cls[i]];
    if (done[c]) continue;
    done[c] = true;
    Node node = dfa.nodes[i];
    for (ByteEdge& e : node.bytes) e.target = renumber[cls[e.target]];
    for (CallEdge& e : node.calls) e.target = renumber[cls[e.target]];
    // Adjacent ranges may now share a target.
    std::vector<ByteEdge> merged;
    for (const ByteEdge& e : node.bytes) {
      if (!merged.empty() && merged.back().target == e.target && merged.back().hi + 1 == e.lo) {
        merged.back().hi = e.hi;
      } else {
        merged.push_back(e);
      }
    }
    node.bytes = std::move(merged);
    out.nodes[c] = std::move(node);
  }
  return out;
}

}  // namespace

int32_t GrammarBuilder::AddRule(std::string name) {
  names_.push_back(std::move(name));
  bodies_.emplace_back();
  has_body_.push_back(false);
  return static_cast<int32_t>(names_.size()) - 1;
}

void GrammarBuilder::SetBody(int32_t rule, Expr body) {
  bodies_[rule] = std::move(body);
  has_body_[rule] = true;
}

absl::StatusOr<Grammar> GrammarBuilder::Build(int32_t root) const {
  Grammar g;
  g.root_ = root;
  const int32_t num_rules = static_cast<int32_t>(names_.size());
  for (int32_t r = 0; r < num_rules; ++r) {
    if (!has_body_[r])
      return absl::InternalError(absl::StrCat("grammar rule ", names_[r], " has no body"));
    RuleDfa dfa = Minimize(Determinize(bodies_[r]));
    const int32_t base = g.num_nodes();
    g.rules_.push_back({names_[r], base});
    for (Node& n : dfa.nodes) {
      n.rule = r;
      for (ByteEdge& e : n.bytes) e.target += base;
      for (CallEdge& c : n.calls) c.target += base;
      g.nodes_.push_back(std::move(n));
    }
  }
  const int32_t num_nodes = g.num_nodes();

  // Fewest bytes to each rule's end (Bellman-Ford over the call graph).
  g.min_to_end_.assign(num_nodes, kUnreachable);
  std::vector<int32_t> rule_min(num_rules, kUnreachable);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t id = 0; id < num_nodes; ++id) {
      const Node& n = g.nodes_[id];
      int64_t best = n.final ? 0 : kUnreachable;
      for (const ByteEdge& e : n.bytes) best = std::min<int64_t>(best, 1 + g.min_to_end_[e.target]);
      for (const CallEdge& c : n.calls) {
        best = std::min<int64_t>(best, int64_t{rule_min[c.rule]} + g.min_to_end_[c.target]);
      }
      best = std::min<int64_t>(best, kUnreachable);
      if (best < g.min_to_end_[id]) {
        g.min_to_end_[id] = static_cast<int32_t>(best);
        changed = true;
      }
    }
    for (int32_t r = 0; r < num_rules; ++r) {
      const int32_t m = g.min_to_end_[g.rules_[r].start];
      if (m < rule_min[r]) {
        rule_min[r] = m;
        changed = true;
      }
    }
  }
  if (rule_min[root] >= kUnreachable) {
    return absl::InvalidArgumentError("the grammar matches no output (unsatisfiable schema)");
  }
  // Drop edges into nodes that cannot reach their rule's end, and calls of
  // rules that cannot end: every node left leads somewhere.
  for (Node& n : g.nodes_) {
    std::erase_if(n.bytes,
                  [&](const ByteEdge& e) { return g.min_to_end_[e.target] >= kUnreachable; });
    std::erase_if(n.calls, [&](const CallEdge& c) {
      return rule_min[c.rule] >= kUnreachable || g.min_to_end_[c.target] >= kUnreachable;
    });
  }
  for (int32_t r = 0; r < num_rules; ++r) {
    if (rule_min[r] == 0) {
      return absl::InternalError(
          absl::StrCat("grammar rule ", names_[r], " matches the empty string"));
    }
  }
  // A rule calling itself before consuming a byte would make the matcher loop.
  {
    std::vector<int> color(num_rules, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> stack;
    for (int32_t r0 = 0; r0 < num_rules; ++r0) {
      if (color[r0] != 0) continue;
      stack.push_back({r0, 0});
      color[r0] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        const std::vector<CallEdge>& calls = g.nodes_[g.rules_[r].start].calls;
        if (i == calls.size()) {
          color[r] = 2;
          stack.pop_back();
          continue;
        }
        const int32_t s = calls[i++].rule;
        if (color[s] == 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "$ref: ", names_[s], " refers to itself before any output (left recursion)"));
        }
        if (color[s] == 0) {
          color[s] = 1;
          stack.push_back({s, 0});
        }
      }
    }
  }

  // Transition tables.
  g.next_.resize(num_nodes);
  for (int32_t id = 0; id < num_nodes; ++id) {
    g.next_[id].fill(kNone);
    for (const ByteEdge& e : g.nodes_[id].bytes) {
      for (int b = e.lo; b <= e.hi; ++b) g.next_[id][b] = e.target;
    }
  }

  // FIRST of each rule, then FOLLOW (fixed points).
  std::vector<std::bitset<256>> first(num_rules);
  auto node_first = [&](int32_t id) {
    std::bitset<256> f;
    for (const ByteEdge& e : g.nodes_[id].bytes) {
      for (int b = e.lo; b <= e.hi; ++b) f.set(b);
    }
    for (const CallEdge& c : g.nodes_[id].calls) f |= first[c.rule];
    return f;
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t r = 0; r < num_rules; ++r) {
      const std::bitset<256> f = node_first(g.rules_[r].start) | first[r];
      if (f != first[r]) {
        first[r] = f;
        changed = true;
      }
    }
  }
  g.follow_.assign(num_rules, {});
  g.follow_[root].end = true;
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t id = 0; id < num_nodes; ++id) {
      const Node& n = g.nodes_[id];
      for (const CallEdge& c : n.calls) {
        FollowSet add;
        add.bytes = node_first(c.target);
        if (g.nodes_[c.target].final) {
          add.bytes |= g.follow_[n.rule].bytes;
          add.end = g.follow_[n.rule].end;
        }
        FollowSet& f = g.follow_[c.rule];
        const std::bitset<256> merged = f.bytes | add.bytes;
        if (merged != f.bytes || (add.end && !f.end)) {
          f.bytes = merged;
          f.end = f.end || add.end;
          changed = true;
        }
      }
    }
  }
  return g;
}

std::string Grammar::DebugString() const {
  std::string out;
  for (int32_t r = 0; r < num_rules(); ++r) {
    absl::StrAppend(&out, "rule ", r, " ", rules_[r].name, r == root_ ? " (root)" : "", "\n");
    for (int32_t id = 0; id < num_nodes(); ++id) {
      const Node& n = nodes_[id];
      if (n.rule != r) continue;
      absl::StrAppend(&out, "  ", id, n.final ? "*" : "", " min=", min_to_end_[id], ":");
      for (const ByteEdge& e : n.bytes) {
        absl::StrAppend(&out, " [", static_cast<int>(e.lo), "-", static_cast<int>(e.hi), "]->",
                        e.target);
      }
      for (const CallEdge& c : n.calls) {
        absl::StrAppend(&out, " <", rules_[c.rule].name, ">->", c.target);
      }
      out += "\n";
    }
  }
  return out;
}

}  // namespace pdserve::engine::grammar
