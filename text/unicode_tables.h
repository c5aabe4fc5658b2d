// Unicode property tables for the pre-tokenizer's regexes, generated from the
// Unicode Character Database by tools/unicode_tables/generate.mjs into
// unicode_tables.cc (checked in; regenerate by hand, see that script). Raw
// data only: text/unicode_properties.h builds the property sets from it.
#pragma once

#include <span>
#include <string_view>

namespace pdserve::text::unicode_tables {

enum class TableKind { kGeneralCategory, kBinary, kScript };

// One property value's code points.
struct Table {
  std::string_view name;  // "Lu" (short General_Category alias), "White_Space", "Han"
  TableKind kind;
  // Inclusive [first, last] pairs, sorted and disjoint, at Version().
  std::span<const char32_t> ranges;
  // Pairs of the code points in `ranges` that were not in the property at
  // BaseVersion().
  std::span<const char32_t> added;
  // Every code point in the property at BaseVersion() is still in it.
  bool grew_only;
};

// The Unicode version of the tables ("15.1.0").
std::string_view Version();
// The version `added` and `grew_only` compare with ("14.0.0").
std::string_view BaseVersion();
// Every General_Category value but Cn, White_Space, and some scripts.
std::span<const Table> Tables();

}  // namespace pdserve::text::unicode_tables
