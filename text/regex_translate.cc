// Oniguruma -> PCRE2 pattern rewriting (see regex_translate.h).
#include "text/regex_translate.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdio>

#include "absl/status/status.h"
#include "text/unicode_properties.h"
#include "text/unicode_tables.h"

namespace pdserve::text {
namespace {

std::string EngineUnicodeVersion() {
  std::array<char, 32> version{};
  if (pcre2_config(PCRE2_CONFIG_UNICODE_VERSION, version.data()) < 0) return "";
  return version.data();
}

// "14.0.0" -> {14, 0, 0}; zeros for what does not parse.
std::array<int, 3> ParseVersion(std::string_view v) {
  std::array<int, 3> out{};
  std::sscanf(std::string(v).c_str(), "%d.%d.%d", &out[0], &out[1], &out[2]);
  return out;
}

PropertyForm Resolve(PropertyForm form) {
  if (form != PropertyForm::kAuto) return form;
  static const PropertyForm resolved =
      ParseVersion(EngineUnicodeVersion()) >= ParseVersion(unicode_tables::BaseVersion())
          ? PropertyForm::kEngineWithAdditions
          : PropertyForm::kRanges;
  return resolved;
}

// Writes property `p` (negated when `negated`) for the inside of a class or
// as a class of its own.
void AppendProperty(const UnicodeProperty& p, bool negated, bool in_class, PropertyForm form,
                    std::string* out) {
  const bool engine = form == PropertyForm::kEngineWithAdditions && !p.engine_name.empty();
  if (in_class) {
    if (negated) {
      *out += ClassItems(Complement(p.set));
    } else if (engine || p.set.empty()) {
      // An empty set (Cs: surrogates are never in UTF-8 text) has no range
      // to write; PCRE2's name for it matches nothing either.
      *out += "\\p{" + p.engine_name + "}" + ClassItems(p.added);
    } else {
      *out += ClassItems(p.set);
    }
    return;
  }
  if (engine && p.added.empty()) {
    *out += (negated ? "\\P{" : "\\p{") + p.engine_name + "}";
  } else if (engine) {
    *out += (negated ? "[^\\p{" : "[\\p{") + p.engine_name + "}" + ClassItems(p.added) + "]";
  } else if (p.set.empty()) {
    *out += (negated ? "\\P{" : "\\p{") + p.engine_name + "}";
  } else {
    *out += (negated ? "[^" : "[") + ClassItems(p.set) + "]";
  }
}

}  // namespace

absl::StatusOr<std::string> TranslateRegex(std::string_view pattern, PropertyForm form) {
  form = Resolve(form);
  const UnicodeProperty& white_space = *FindUnicodeProperty("White_Space");
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  size_t class_start = 0;  // index in `pattern` just after '[' or '[^'
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c == '\\') {
      if (i + 1 >= pattern.size()) {
        return absl::InvalidArgumentError("regex ends with a lone backslash");
      }
      const char e = pattern[++i];
      if (e == 's' || e == 'S') {
        // White_Space is written as ranges in every form but kEngineOnly's
        // \p: PCRE2's \s is not White_Space.
        AppendProperty(white_space, e == 'S', in_class, PropertyForm::kRanges, &out);
        continue;
      }
      if ((e == 'p' || e == 'P') && form != PropertyForm::kEngineOnly && i + 1 < pattern.size() &&
          pattern[i + 1] == '{') {
        const size_t close = pattern.find('}', i + 2);
        if (close != std::string_view::npos) {
          std::string_view name = pattern.substr(i + 2, close - i - 2);
          bool negated = e == 'P';
          if (name.starts_with('^')) {
            negated = !negated;
            name.remove_prefix(1);
          }
          if (const UnicodeProperty* p = FindUnicodeProperty(name)) {
            AppendProperty(*p, negated, in_class, form, &out);
            i = close;
            continue;
          }
        }
      }
      out.push_back(c);
      out.push_back(e);
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out.push_back(c);
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out.push_back(pattern[++i]);
      class_start = i + 1;
      continue;
    }
    if (in_class && c == '[' && i + 1 < pattern.size() && pattern[i + 1] == ':') {
      // POSIX class [:name:] inside a class: copy through ":]".
      const size_t end = pattern.find(":]", i + 2);
      if (end == std::string_view::npos) return absl::InvalidArgumentError("regex: unclosed [:");
      out.append(pattern.substr(i, end + 2 - i));
      i = end + 1;
      continue;
    }
    if (in_class && c == ']' && i != class_start) in_class = false;
    out.push_back(c);
  }
  if (in_class) return absl::InvalidArgumentError("regex: unclosed character class");
  return out;
}

std::string RegexUnicodeVersion(PropertyForm form) {
  if (Resolve(form) == PropertyForm::kEngineOnly) return EngineUnicodeVersion();
  const std::string engine = EngineUnicodeVersion();
  if (Resolve(form) == PropertyForm::kEngineWithAdditions &&
      ParseVersion(engine) > ParseVersion(unicode_tables::Version())) {
    return engine;
  }
  return std::string(unicode_tables::Version());
}

}  // namespace pdserve::text
