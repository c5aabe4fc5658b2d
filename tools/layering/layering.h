// The module layering check: which module may depend on which, read from a
// table kept in the repository (tools/layering/allowed_edges.txt), checked
// against the sources' includes and the CMake link lines.
//
// The table has two kinds of lines ('#' starts a comment):
//   module <name> <path prefix>...   files under a prefix (a folder, or a
//                                    file stem: its .h and .cc) belong to
//                                    <name>; the longest prefix wins
//   allow <name>: <name>...          <name> may depend on these ("*": any)
// A module may always depend on itself. Every source file and every CMake
// target must belong to a module: a new folder needs its line.
#pragma once

#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pdserve::layering {

struct LayeringTable {
  std::map<std::string, std::string> module_of_prefix;   // path prefix -> module
  std::map<std::string, std::set<std::string>> allowed;  // module -> modules it may use
  // The module of a path relative to the root; empty when none matches.
  std::string ModuleOf(absl::string_view path) const;
  bool Allows(const std::string& from, const std::string& to) const;
};

absl::StatusOr<LayeringTable> ParseLayeringTable(absl::string_view text);

// One dependency between modules, and where it was seen.
struct Edge {
  std::string from;
  std::string to;
  std::string where;  // "path:line includes x" or "path: target a links b"
};

struct LayeringReport {
  std::vector<Edge> edges;            // every edge between two different modules
  std::vector<Edge> violations;       // those the table does not allow
  std::vector<std::string> unmapped;  // files and targets outside every module
  // "path:line defines flag x": a flag defined outside a program's main file
  // (one defining `int main(`) and outside a flag-group file (*_flags.cc).
  std::vector<std::string> misplaced_flags;
};

// Flags belong to programs: defined in a main file, or in one flag-group file
// per concern (name ending in _flags.cc) that mains share.
//
// Scans C++/CUDA sources (.h .cc .cu .cuh) and CMakeLists.txt under `root`,
// skipping build trees (build*), .git and node_modules.
absl::StatusOr<LayeringReport> CheckLayering(const std::filesystem::path& root,
                                             const LayeringTable& table);

}  // namespace pdserve::layering
