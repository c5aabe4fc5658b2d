// A context-free grammar over bytes, as structured output compiles it
// (json_schema.h builds one from a JSON schema): rules whose bodies are
// regular expressions over bytes and calls of other rules. Each rule body
// is compiled to a deterministic automaton (nodes with byte-range edges and
// rule-call edges), so a parser state is a stack of nodes, and a set of
// stacks where alternatives share a prefix (grammar_matcher.h).
//
// Construction: GrammarBuilder takes rule bodies as Expr trees (bytes,
// calls, sequences, alternatives, bounded or unbounded repetition),
// compiles each to a DFA (Thompson automaton, then subset construction with
// rule calls as symbols), drops nodes that cannot reach their rule's end,
// and computes what the matcher and the mask precomputation need: the
// fewest bytes from each node to its rule's end, the bytes that may follow
// each rule, and a 256-entry transition table per node.
//
// Build refuses (INVALID_ARGUMENT) grammars the matcher cannot run: a rule
// that can be empty, a rule that calls itself before consuming a byte
// (directly or through others), and a rule that cannot end (unsatisfiable).
#pragma once

#include <array>
#include <bitset>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace pdserve::engine::grammar {

// A rule body: a regular expression over bytes and rule calls.
struct Expr {
  enum class Kind { kBytes, kCall, kSeq, kAlt, kRepeat };
  Kind kind = Kind::kSeq;
  uint8_t lo = 0, hi = 0;   // kBytes: one byte in [lo, hi]
  int32_t rule = -1;        // kCall
  std::vector<Expr> items;  // kSeq, kAlt; kRepeat: items[0]
  int min = 0, max = -1;    // kRepeat: max -1 = unbounded

  static Expr Bytes(uint8_t lo, uint8_t hi);
  static Expr Byte(uint8_t b) { return Bytes(b, b); }
  static Expr Literal(std::string_view text);  // empty text: the empty sequence
  static Expr Call(int32_t rule);
  static Expr Seq(std::vector<Expr> items);
  static Expr Alt(std::vector<Expr> items);
  static Expr Repeat(Expr item, int min, int max);
  static Expr Optional(Expr item) { return Repeat(std::move(item), 0, 1); }
};

inline constexpr int32_t kNone = -1;
inline constexpr int32_t kUnreachable = 1 << 30;  // min_to_end of nothing

struct ByteEdge {
  uint8_t lo = 0, hi = 0;
  int32_t target = kNone;
};
struct CallEdge {
  int32_t rule = kNone;
  int32_t target = kNone;  // where the caller goes on once `rule` ended
};

struct Node {
  int32_t rule = 0;
  bool final = false;           // the rule may end here
  std::vector<ByteEdge> bytes;  // sorted, disjoint
  std::vector<CallEdge> calls;  // at most one per rule
};

struct Rule {
  std::string name;
  int32_t start = kNone;
};

// Bytes that may follow a rule's end; `end` when the grammar may end there.
struct FollowSet {
  std::bitset<256> bytes;
  bool end = false;
};

class Grammar {
 public:
  int32_t num_nodes() const { return static_cast<int32_t>(nodes_.size()); }
  const Node& node(int32_t id) const { return nodes_[id]; }
  const Rule& rule(int32_t id) const { return rules_[id]; }
  int32_t num_rules() const { return static_cast<int32_t>(rules_.size()); }
  int32_t root_rule() const { return root_; }
  int32_t root_start() const { return rules_[root_].start; }

  // The node a byte leads to from `node`, kNone if none (rule automata are
  // deterministic over bytes).
  int32_t Next(int32_t node, uint8_t byte) const { return next_[node][byte]; }
  bool HasBytes(int32_t node) const { return !nodes_[node].bytes.empty(); }
  // Fewest bytes from `node` to the end of its rule (calls included).
  int32_t MinToEnd(int32_t node) const { return min_to_end_[node]; }
  // Fewest bytes of a whole output.
  int32_t MinLength() const { return min_to_end_[root_start()]; }
  const FollowSet& Follow(int32_t rule) const { return follow_[rule]; }

  // Human-readable dump (tests, debugging).
  std::string DebugString() const;

 private:
  friend class GrammarBuilder;
  std::vector<Node> nodes_;
  std::vector<Rule> rules_;
  int32_t root_ = 0;
  std::vector<std::array<int32_t, 256>> next_;
  std::vector<int32_t> min_to_end_;
  std::vector<FollowSet> follow_;
};

class GrammarBuilder {
 public:
  // Declares a rule (its body may call rules declared later, itself
  // included); returns its id.
  int32_t AddRule(std::string name);
  void SetBody(int32_t rule, Expr body);
  const std::string& RuleName(int32_t rule) const { return names_[rule]; }
  int32_t num_rules() const { return static_cast<int32_t>(names_.size()); }

  // Compiles every rule (each must have a body) with `root` as the start.
  absl::StatusOr<Grammar> Build(int32_t root) const;

 private:
  std::vector<std::string> names_;
  std::vector<Expr> bodies_;
  std::vector<bool> has_body_;
};

}  // namespace pdserve::engine::grammar
