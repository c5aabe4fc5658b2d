// The module layering check: see layering.h.
#include "tools/layering/layering.h"

#include <fstream>
#include <regex>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace pdserve::layering {
namespace fs = std::filesystem;

std::string LayeringTable::ModuleOf(absl::string_view path) const {
  std::string best_prefix;
  std::string best;
  for (const auto& [prefix, module] : module_of_prefix) {
    // A folder, or a file stem (frontend/sampling_wire: its .h and .cc).
    const bool matches =
        absl::StartsWith(path, prefix) &&
        (path.size() == prefix.size() || path[prefix.size()] == '/' || path[prefix.size()] == '.');
    if (matches && prefix.size() >= best_prefix.size()) {
      best_prefix = prefix;
      best = module;
    }
  }
  return best;
}

bool LayeringTable::Allows(const std::string& from, const std::string& to) const {
  if (from == to) return true;
  auto it = allowed.find(from);
  return it != allowed.end() && (it->second.contains(to) || it->second.contains("*"));
}

absl::StatusOr<LayeringTable> ParseLayeringTable(absl::string_view text) {
  LayeringTable table;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = line.substr(0, line.find('#'));
    std::vector<absl::string_view> words = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (words.empty()) continue;
    if (words[0] == "module" && words.size() >= 3) {
      for (size_t i = 2; i < words.size(); ++i) {
        table.module_of_prefix[std::string(words[i])] = std::string(words[1]);
      }
    } else if (words[0] == "allow" && words.size() >= 2 && absl::EndsWith(words[1], ":")) {
      std::set<std::string>& to = table.allowed[std::string(absl::StripSuffix(words[1], ":"))];
      for (size_t i = 2; i < words.size(); ++i) to.insert(std::string(words[i]));
    } else {
      return absl::InvalidArgumentError(absl::StrCat("layering table line ", line_number,
                                                     ": expected `module NAME PREFIX...` "
                                                     "or `allow NAME: NAME...`, got `",
                                                     line, "`"));
    }
  }
  std::set<std::string> modules;
  for (const auto& [prefix, module] : table.module_of_prefix) modules.insert(module);
  for (const auto& [from, to] : table.allowed) {
    for (const std::string& m : to) {
      if (m != "*" && !modules.contains(m)) {
        return absl::InvalidArgumentError(
            absl::StrCat("layering table: `allow ", from, ":` names unknown module ", m));
      }
    }
    if (!modules.contains(from)) {
      return absl::InvalidArgumentError(absl::StrCat("layering table: unknown module ", from));
    }
  }
  return table;
}

namespace {

bool Skipped(const fs::path& relative) {
  for (const fs::path& part : relative) {
    const std::string s = part.string();
    if (s == ".git" || s == "node_modules" || absl::StartsWith(s, "build")) return true;
  }
  return false;
}

std::string Slurp(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void AddEdge(const LayeringTable& table, std::string from, std::string to, std::string where,
             LayeringReport& report) {
  if (from.empty() || to.empty() || from == to) return;
  Edge edge{std::move(from), std::move(to), std::move(where)};
  if (!table.Allows(edge.from, edge.to)) report.violations.push_back(edge);
  report.edges.push_back(std::move(edge));
}

// The module an include names: a file under the root, a generated protobuf
// header (proto/...), or one beside the including file; empty otherwise
// (system and third-party headers).
std::string IncludedModule(const fs::path& root, const fs::path& file_dir,
                           const std::string& include, const LayeringTable& table) {
  if (fs::exists(root / include)) return table.ModuleOf(include);
  if (absl::EndsWith(include, ".pb.h")) return table.ModuleOf(include);
  const fs::path beside = file_dir / include;
  if (fs::exists(root / beside)) return table.ModuleOf(beside.lexically_normal().string());
  return "";
}

void ScanIncludes(const fs::path& root, const fs::path& relative, const LayeringTable& table,
                  LayeringReport& report) {
  const std::string from = table.ModuleOf(relative.string());
  if (from.empty()) {
    report.unmapped.push_back(relative.string());
    return;
  }
  static const std::regex kInclude(R"re(^\s*#\s*include\s*"([^"]+)")re");
  // A definition may wrap after "ABSL_FLAG(": the name is read on.
  static const std::regex kFlag(R"re(^\s*ABSL_FLAG\s*\(\s*[^,]*,\s*(\w+))re");
  const std::string text = Slurp(root / relative);
  const bool may_define_flags = absl::EndsWith(relative.filename().string(), "_flags.cc") ||
                                absl::StrContains(text, "int main(");
  std::istringstream in(text);
  std::string line;
  int number = 0;
  size_t next_offset = 0;
  while (std::getline(in, line)) {
    ++number;
    const size_t offset = next_offset;  // of this line in `text`
    next_offset += line.size() + 1;
    std::smatch m;
    if (!may_define_flags &&
        absl::StartsWith(absl::StripLeadingAsciiWhitespace(line), "ABSL_FLAG")) {
      std::smatch f;
      const std::string rest = text.substr(offset, 400);  // the definition, maybe wrapped
      report.misplaced_flags.push_back(
          absl::StrCat(relative.string(), ":", number, " defines flag ",
                       std::regex_search(rest, f, kFlag) ? f[1].str() : std::string("?")));
      continue;
    }
    if (!std::regex_search(line, m, kInclude)) continue;
    const std::string include = m[1].str();
    AddEdge(table, from, IncludedModule(root, relative.parent_path(), include, table),
            absl::StrCat(relative.string(), ":", number, " includes ", include), report);
  }
}

// One CMake command's arguments, comments removed.
struct CMakeCall {
  std::string name;
  std::vector<std::string> args;
  fs::path file;  // relative
};

std::vector<CMakeCall> ParseCMake(const fs::path& root, const fs::path& relative) {
  std::string text;
  {
    std::istringstream in(Slurp(root / relative));
    std::string line;
    while (std::getline(in, line)) {
      const size_t hash = line.find('#');
      text += line.substr(0, hash) + "\n";
    }
  }
  std::vector<CMakeCall> calls;
  static const std::regex kCall(R"re((add_library|add_executable|target_link_libraries)\s*\()re");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kCall);
       it != std::sregex_iterator(); ++it) {
    const size_t open = it->position(0) + it->length(0);
    int depth = 1;
    size_t close = open;
    for (; close < text.size() && depth > 0; ++close) {
      if (text[close] == '(') ++depth;
      if (text[close] == ')') --depth;
    }
    CMakeCall call{.name = (*it)[1].str(), .file = relative};
    for (absl::string_view word :
         absl::StrSplit(absl::string_view(text).substr(open, close - open - 1),
                        absl::ByAnyChar(" \t\n"), absl::SkipEmpty())) {
      call.args.emplace_back(word);
    }
    if (!call.args.empty()) calls.push_back(std::move(call));
  }
  return calls;
}

void ScanCMake(const std::vector<CMakeCall>& calls, const LayeringTable& table,
               LayeringReport& report) {
  static const std::set<std::string> kKeywords = {
      "STATIC", "SHARED",           "OBJECT", "MODULE",  "INTERFACE",   "ALIAS",        "IMPORTED",
      "GLOBAL", "EXCLUDE_FROM_ALL", "PUBLIC", "PRIVATE", "LINK_PUBLIC", "LINK_PRIVATE", "WIN32"};
  // A target's module: its first source's, else its CMakeLists folder's.
  std::map<std::string, std::string> module_of_target;
  for (const CMakeCall& call : calls) {
    if (call.name == "target_link_libraries") continue;
    const fs::path dir = call.file.parent_path();
    std::string module;
    for (size_t i = 1; i < call.args.size() && module.empty(); ++i) {
      const std::string& a = call.args[i];
      if (kKeywords.contains(a) || absl::StrContains(a, "$")) continue;
      module = table.ModuleOf((dir / a).lexically_normal().string());
    }
    if (module.empty()) module = table.ModuleOf((dir / "CMakeLists.txt").string());
    if (module.empty()) {
      report.unmapped.push_back(absl::StrCat(call.file.string(), ": target ", call.args[0]));
    }
    module_of_target[call.args[0]] = module;
  }
  for (const CMakeCall& call : calls) {
    if (call.name != "target_link_libraries") continue;
    auto from = module_of_target.find(call.args[0]);
    if (from == module_of_target.end()) continue;  // a target made elsewhere
    for (size_t i = 1; i < call.args.size(); ++i) {
      auto to = module_of_target.find(call.args[i]);
      if (to == module_of_target.end()) continue;  // third-party or keyword
      AddEdge(table, from->second, to->second,
              absl::StrCat(call.file.string(), ": ", call.args[0], " links ", call.args[i]),
              report);
    }
  }
}

}  // namespace

absl::StatusOr<LayeringReport> CheckLayering(const fs::path& root, const LayeringTable& table) {
  if (!fs::is_directory(root)) {
    return absl::NotFoundError(absl::StrCat("no source tree at ", root.string()));
  }
  LayeringReport report;
  std::vector<CMakeCall> calls;
  for (auto it = fs::recursive_directory_iterator(root); it != fs::recursive_directory_iterator();
       ++it) {
    const fs::path relative = fs::relative(it->path(), root);
    if (Skipped(relative)) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const std::string ext = relative.extension().string();
    if (ext == ".h" || ext == ".cc" || ext == ".cu" || ext == ".cuh") {
      ScanIncludes(root, relative, table, report);
    } else if (relative.filename() == "CMakeLists.txt") {
      std::vector<CMakeCall> more = ParseCMake(root, relative);
      calls.insert(calls.end(), more.begin(), more.end());
    }
  }
  ScanCMake(calls, table, report);
  return report;
}

}  // namespace pdserve::layering
