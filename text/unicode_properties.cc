// Unicode property sets from the generated tables (see unicode_properties.h).
#include "text/unicode_properties.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>
#include <span>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_format.h"
#include "text/unicode_tables.h"

namespace pdserve::text {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr CodePointRange kSurrogates = {0xD800, 0xDFFF};

// Sorts and merges overlapping or adjacent ranges, dropping surrogates.
CodePointSet Normalize(std::vector<CodePointRange> ranges) {
  std::vector<CodePointRange> split;
  split.reserve(ranges.size() + 1);
  for (const CodePointRange& r : ranges) {
    if (r.last < kSurrogates.first || r.first > kSurrogates.last) {
      split.push_back(r);
      continue;
    }
    if (r.first < kSurrogates.first) split.push_back({r.first, kSurrogates.first - 1});
    if (r.last > kSurrogates.last) split.push_back({kSurrogates.last + 1, r.last});
  }
  std::sort(split.begin(), split.end(),
            [](const CodePointRange& a, const CodePointRange& b) { return a.first < b.first; });
  CodePointSet out;
  for (const CodePointRange& r : split) {
    if (!out.empty() && r.first <= out.back().last + 1) {
      out.back().last = std::max(out.back().last, r.last);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

CodePointSet FromPairs(std::span<const char32_t> pairs) {
  std::vector<CodePointRange> ranges;
  ranges.reserve(pairs.size() / 2);
  for (size_t i = 0; i + 1 < pairs.size(); i += 2) ranges.push_back({pairs[i], pairs[i + 1]});
  return Normalize(std::move(ranges));
}

CodePointSet Union(std::initializer_list<const CodePointSet*> sets) {
  std::vector<CodePointRange> all;
  for (const CodePointSet* s : sets) all.insert(all.end(), s->begin(), s->end());
  return Normalize(std::move(all));
}

// The ranges of `set` that hold a code point of `added` (a subset of `set`):
// fewer ranges for PCRE2 to test than `added` itself, and the same union with
// any table between the base version and the tables' version.
CodePointSet Covering(const CodePointSet& set, const CodePointSet& added) {
  CodePointSet out;
  size_t a = 0;
  for (const CodePointRange& r : set) {
    while (a < added.size() && added[a].last < r.first) ++a;
    if (a < added.size() && added[a].first <= r.last) out.push_back(r);
  }
  return out;
}

// Oniguruma's loose name matching: lower case, no spaces, '_' or '-'.
std::string LooseName(std::string_view name) {
  std::string out;
  for (char c : name) {
    if (c == ' ' || c == '_' || c == '-') continue;
    out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  return out;
}

using PropertyMap = absl::flat_hash_map<std::string, const UnicodeProperty*>;

PropertyMap* BuildProperties() {
  absl::flat_hash_map<std::string_view, UnicodeProperty> leaf;  // table name -> property
  absl::flat_hash_map<std::string_view, bool> grew_only;
  for (const unicode_tables::Table& t : unicode_tables::Tables()) {
    UnicodeProperty p{FromPairs(t.ranges), "", {}};
    p.added = Covering(p.set, FromPairs(t.added));
    // A General_Category value that only grew can use PCRE2's own table plus
    // the additions. White_Space is short; PCRE2's script names mean
    // Script_Extensions: both are written as ranges.
    if (t.kind == unicode_tables::TableKind::kGeneralCategory && t.grew_only) {
      p.engine_name = std::string(t.name);
    }
    grew_only[t.name] = t.grew_only;
    leaf.emplace(t.name, std::move(p));
  }
  auto* map = new PropertyMap;
  auto add = [map](UnicodeProperty p, std::initializer_list<std::string_view> names) {
    const auto* stored = new UnicodeProperty(std::move(p));
    for (std::string_view n : names) (*map)[LooseName(n)] = stored;
  };
  // A union of General_Category values; `engine_name` when every part only
  // grew.
  auto combine = [&](std::string engine_name, std::initializer_list<std::string_view> parts) {
    std::vector<CodePointRange> set, added;
    bool stable = true;
    for (std::string_view part : parts) {
      const UnicodeProperty& p = leaf.at(part);
      set.insert(set.end(), p.set.begin(), p.set.end());
      added.insert(added.end(), p.added.begin(), p.added.end());
      stable = stable && grew_only.at(part);
    }
    CodePointSet full = Normalize(std::move(set));
    CodePointSet cover = Covering(full, Normalize(std::move(added)));
    return UnicodeProperty{std::move(full), stable ? std::move(engine_name) : "", std::move(cover)};
  };
  constexpr std::pair<std::string_view, std::string_view> kLeafNames[] = {
      {"Lu", "Uppercase_Letter"},    {"Ll", "Lowercase_Letter"},  {"Lt", "Titlecase_Letter"},
      {"Lm", "Modifier_Letter"},     {"Lo", "Other_Letter"},      {"Mn", "Nonspacing_Mark"},
      {"Mc", "Spacing_Mark"},        {"Me", "Enclosing_Mark"},    {"Nd", "Decimal_Number"},
      {"Nl", "Letter_Number"},       {"No", "Other_Number"},      {"Pc", "Connector_Punctuation"},
      {"Pd", "Dash_Punctuation"},    {"Ps", "Open_Punctuation"},  {"Pe", "Close_Punctuation"},
      {"Pi", "Initial_Punctuation"}, {"Pf", "Final_Punctuation"}, {"Po", "Other_Punctuation"},
      {"Sm", "Math_Symbol"},         {"Sc", "Currency_Symbol"},   {"Sk", "Modifier_Symbol"},
      {"So", "Other_Symbol"},        {"Zs", "Space_Separator"},   {"Zl", "Line_Separator"},
      {"Zp", "Paragraph_Separator"}, {"Cc", "Control"},           {"Cf", "Format"},
      {"Cs", "Surrogate"},           {"Co", "Private_Use"},
  };
  std::vector<const CodePointSet*> assigned_parts;
  for (const auto& [short_name, long_name] : kLeafNames) {
    add(leaf.at(short_name), {short_name, long_name});
    assigned_parts.push_back(&leaf.at(short_name).set);
  }
  add(combine("L", {"Lu", "Ll", "Lt", "Lm", "Lo"}), {"L", "Letter"});
  add(combine("L&", {"Lu", "Ll", "Lt"}), {"LC", "Cased_Letter"});
  add(combine("M", {"Mn", "Mc", "Me"}), {"M", "Mark", "Combining_Mark"});
  add(combine("N", {"Nd", "Nl", "No"}), {"N", "Number"});
  add(combine("P", {"Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po"}), {"P", "Punctuation"});
  add(combine("S", {"Sm", "Sc", "Sk", "So"}), {"S", "Symbol"});
  add(combine("Z", {"Zs", "Zl", "Zp"}), {"Z", "Separator"});
  std::vector<CodePointRange> assigned_all;
  for (const CodePointSet* s : assigned_parts)
    assigned_all.insert(assigned_all.end(), s->begin(), s->end());
  const CodePointSet assigned = Normalize(std::move(assigned_all));
  const CodePointSet unassigned = Complement(assigned);
  UnicodeProperty other = combine("", {"Cc", "Cf", "Cs", "Co"});
  other.set = Union({&other.set, &unassigned});
  other.engine_name.clear();  // unassigned code points shrink as versions go
  add(std::move(other), {"C", "Other"});
  add(UnicodeProperty{unassigned, "", {}}, {"Cn", "Unassigned"});
  add(UnicodeProperty{assigned, "", {}}, {"Assigned"});
  add(UnicodeProperty{Complement({}), "", {}}, {"Any"});
  add(leaf.at("White_Space"), {"White_Space", "WSpace", "Space"});
  constexpr std::pair<std::string_view, std::string_view> kScripts[] = {
      {"Latin", "Latn"},  {"Greek", "Grek"},    {"Cyrillic", "Cyrl"},   {"Armenian", "Armn"},
      {"Hebrew", "Hebr"}, {"Arabic", "Arab"},   {"Devanagari", "Deva"}, {"Thai", "Thai"},
      {"Hangul", "Hang"}, {"Hiragana", "Hira"}, {"Katakana", "Kana"},   {"Han", "Hani"},
  };
  for (const auto& [name, code] : kScripts) add(leaf.at(name), {name, code});
  return map;
}

}  // namespace

const UnicodeProperty* FindUnicodeProperty(std::string_view name) {
  static const PropertyMap* properties = BuildProperties();
  auto it = properties->find(LooseName(name));
  return it == properties->end() ? nullptr : it->second;
}

CodePointSet Complement(const CodePointSet& set) {
  std::vector<CodePointRange> out;
  char32_t next = 0;
  for (const CodePointRange& r : set) {
    if (r.first > next) out.push_back({next, r.first - 1});
    next = r.last + 1;
  }
  if (next <= kMaxCodePoint) out.push_back({next, kMaxCodePoint});
  return Normalize(std::move(out));
}

bool Contains(const CodePointSet& set, char32_t cp) {
  auto it = std::upper_bound(set.begin(), set.end(), cp,
                             [](char32_t c, const CodePointRange& r) { return c < r.first; });
  return it != set.begin() && cp <= std::prev(it)->last;
}

std::string ClassItems(const CodePointSet& set) {
  std::string out;
  out.reserve(set.size() * 18);
  for (const CodePointRange& r : set) {
    absl::StrAppendFormat(&out, "\\x{%x}", static_cast<uint32_t>(r.first));
    if (r.last == r.first) continue;
    if (r.last > r.first + 1) out.push_back('-');
    absl::StrAppendFormat(&out, "\\x{%x}", static_cast<uint32_t>(r.last));
  }
  return out;
}

}  // namespace pdserve::text
