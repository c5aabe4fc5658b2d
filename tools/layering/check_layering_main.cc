// pdserve_check_layering ROOT [TABLE] [--edges]: checks the module layering
// of the source tree at ROOT against TABLE (default
// ROOT/tools/layering/allowed_edges.txt); prints each edge the table does not
// allow (and with --edges every edge between modules, module pairs once).
// Exit status 1 when one is found.
#include <fstream>
#include <iostream>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "tools/layering/layering.h"

int main(int argc, char** argv) {
  std::string root;
  std::string table_path;
  bool print_edges = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--edges") {
      print_edges = true;
    } else if (root.empty()) {
      root = arg;
    } else {
      table_path = arg;
    }
  }
  if (root.empty()) {
    std::cerr << "usage: pdserve_check_layering ROOT [TABLE] [--edges]\n";
    return 2;
  }
  if (table_path.empty()) table_path = root + "/tools/layering/allowed_edges.txt";
  std::ifstream in(table_path);
  std::ostringstream text;
  text << in.rdbuf();
  if (!in) {
    std::cerr << "cannot read " << table_path << "\n";
    return 2;
  }
  auto table = pdserve::layering::ParseLayeringTable(text.str());
  if (!table.ok()) {
    std::cerr << table.status() << "\n";
    return 2;
  }
  auto report = pdserve::layering::CheckLayering(root, *table);
  if (!report.ok()) {
    std::cerr << report.status() << "\n";
    return 2;
  }
  if (print_edges) {
    std::set<std::pair<std::string, std::string>> pairs;
    for (const auto& e : report->edges) {
      if (pairs.insert({e.from, e.to}).second) {
        std::cout << e.from << " -> " << e.to << "   (" << e.where << ")\n";
      }
    }
  }
  for (const std::string& u : report->unmapped) std::cout << "outside every module: " << u << "\n";
  for (const auto& v : report->violations) {
    std::cout << "not allowed: " << v.from << " -> " << v.to << " (" << v.where << ")\n";
  }
  for (const std::string& f : report->misplaced_flags) {
    std::cout << "flag outside a main or a *_flags.cc flag group: " << f << "\n";
  }
  return report->violations.empty() && report->unmapped.empty() && report->misplaced_flags.empty()
             ? 0
             : 1;
}
