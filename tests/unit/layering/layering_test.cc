// The repository's module layering (tools/layering/allowed_edges.txt) holds
// for every #include and CMake link line, and the check does catch an edge
// the table does not allow: a copy of a small tree with one planted upward
// include fails it, naming the file and line.
#include "tools/layering/layering.h"

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace pdserve::layering {
namespace {

namespace fs = std::filesystem;

std::string Read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

void Write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string Describe(const std::vector<Edge>& edges) {
  std::string out;
  for (const Edge& e : edges) absl::StrAppend(&out, e.from, " -> ", e.to, " (", e.where, ")\n");
  return out;
}

TEST(LayeringTest, TheRepositoryKeepsItsAllowedEdges) {
  const fs::path root = PDSERVE_SOURCE_DIR;
  absl::StatusOr<LayeringTable> table =
      ParseLayeringTable(Read(root / "tools/layering/allowed_edges.txt"));
  ASSERT_TRUE(table.ok()) << table.status();
  absl::StatusOr<LayeringReport> report = CheckLayering(root, *table);
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->violations.empty())
      << "dependencies the table does not allow (tools/layering/allowed_edges.txt):\n"
      << Describe(report->violations);
  EXPECT_TRUE(report->unmapped.empty()) << "outside every module (add a `module` line):\n"
                                        << absl::StrJoin(report->unmapped, "\n");
  EXPECT_TRUE(report->misplaced_flags.empty())
      << "flags outside a main or a *_flags.cc flag group:\n"
      << absl::StrJoin(report->misplaced_flags, "\n");
  // The check saw the tree: includes and link lines between modules.
  EXPECT_GT(report->edges.size(), 100u);
}

class PlantedTreeTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / "layering_planted";
    fs::remove_all(root_);
    Write(root_ / "low/low.h", "#pragma once\n#include <vector>\n");
    Write(root_ / "high/high.h", "#pragma once\n#include \"low/low.h\"\n");
    Write(root_ / "low/CMakeLists.txt", "add_library(pdserve_low low.cc)\n");
    Write(root_ / "high/CMakeLists.txt",
          "add_library(pdserve_high high.cc)\n"
          "target_link_libraries(pdserve_high PUBLIC pdserve_low absl::status)\n");
    Write(root_ / "build/ignored.h", "#include \"high/high.h\"\n");  // build trees are skipped
  }
  void TearDown() override { fs::remove_all(root_); }

  LayeringTable Table() {
    absl::StatusOr<LayeringTable> table =
        ParseLayeringTable("module high high\nmodule low low\nallow high: low  # down only\n");
    EXPECT_TRUE(table.ok()) << table.status();
    return *table;
  }

  fs::path root_;
};

TEST_F(PlantedTreeTest, DownwardEdgesPass) {
  absl::StatusOr<LayeringReport> report = CheckLayering(root_, Table());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_TRUE(report->violations.empty()) << Describe(report->violations);
  EXPECT_EQ(report->edges.size(), 2u) << Describe(report->edges);  // the include and the link
}

TEST_F(PlantedTreeTest, APlantedUpwardIncludeFails) {
  Write(root_ / "low/low.cc", "#include \"low/low.h\"\n\n#include \"high/high.h\"  // planted\n");
  absl::StatusOr<LayeringReport> report = CheckLayering(root_, Table());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->violations.size(), 1u) << Describe(report->violations);
  EXPECT_EQ(report->violations[0].from, "low");
  EXPECT_EQ(report->violations[0].to, "high");
  EXPECT_EQ(report->violations[0].where, "low/low.cc:3 includes high/high.h");
}

TEST_F(PlantedTreeTest, APlantedUpwardLinkFails) {
  Write(
      root_ / "low/CMakeLists.txt",
      "add_library(pdserve_low low.cc)\ntarget_link_libraries(pdserve_low PRIVATE pdserve_high)\n");
  absl::StatusOr<LayeringReport> report = CheckLayering(root_, Table());
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_EQ(report->violations.size(), 1u) << Describe(report->violations);
  EXPECT_EQ(report->violations[0].where, "low/CMakeLists.txt: pdserve_low links pdserve_high");
}

TEST_F(PlantedTreeTest, AFolderOutsideEveryModuleFails) {
  Write(root_ / "stray/stray.h", "#pragma once\n");
  absl::StatusOr<LayeringReport> report = CheckLayering(root_, Table());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->unmapped, std::vector<std::string>{"stray/stray.h"});
}

TEST_F(PlantedTreeTest, AFlagOutsideAMainOrAFlagGroupFails) {
  Write(root_ / "low/low.cc",
        "#include \"low/low.h\"\nABSL_FLAG(int, depth, 1, \"planted\");\nABSL_FLAG(\n    "
        "int, width, 2, \"wrapped\");\n");
  Write(root_ / "low/low_flags.cc", "ABSL_FLAG(int, width, 1, \"a flag group\");\n");
  Write(root_ / "high/main.cc",
        "ABSL_FLAG(bool, verbose, false, \"a main's own\");\n"
        "int main(int argc, char** argv) { return 0; }\n");
  absl::StatusOr<LayeringReport> report = CheckLayering(root_, Table());
  ASSERT_TRUE(report.ok()) << report.status();
  EXPECT_EQ(report->misplaced_flags, (std::vector<std::string>{"low/low.cc:2 defines flag depth",
                                                               "low/low.cc:3 defines flag width"}));
}

TEST(LayeringTableTest, RefusesMalformedLinesAndUnknownModules) {
  EXPECT_FALSE(ParseLayeringTable("modul a a\n").ok());
  EXPECT_FALSE(ParseLayeringTable("module a a\nallow a: b\n").ok());
  EXPECT_FALSE(ParseLayeringTable("module a a\nallow b: a\n").ok());
  absl::StatusOr<LayeringTable> t =
      ParseLayeringTable("module a a\nmodule ab a/b\nmodule w a/wire\nallow a: *\n");
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->ModuleOf("a/x.h"), "a");
  EXPECT_EQ(t->ModuleOf("a/b/x.h"), "ab");      // the longest prefix
  EXPECT_EQ(t->ModuleOf("a/wire.h"), "w");      // a file stem
  EXPECT_EQ(t->ModuleOf("a/wireless.h"), "a");  // not a stem match
  EXPECT_EQ(t->ModuleOf("ab/x.h"), "");
  EXPECT_TRUE(t->Allows("a", "ab"));
  EXPECT_FALSE(t->Allows("ab", "a"));
}

}  // namespace
}  // namespace pdserve::layering
