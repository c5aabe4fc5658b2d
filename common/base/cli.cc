#include "common/base/cli.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string_view>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/parse.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/str_cat.h"

namespace pdserve {
namespace {

enum class Usage { kNone, kHelp, kHelpFull, kVersion };

// The first usage flag on the command line, up to "--".
Usage FindUsageFlag(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    if (arg == "help" || arg == "helpshort") return Usage::kHelp;
    if (arg == "helpfull") return Usage::kHelpFull;
    if (arg == "version") return Usage::kVersion;
  }
  return Usage::kNone;
}

std::string ProgramName(const char* argv0) {
  std::string_view name = argv0 != nullptr ? argv0 : "pdserve";
  if (size_t slash = name.rfind('/'); slash != std::string_view::npos)
    name.remove_prefix(slash + 1);
  return std::string(name);
}

// One flag as "  --name=DEFAULT" and its help text indented below.
void PrintFlag(std::ostream& out, const absl::CommandLineFlag& flag) {
  out << "  --" << flag.Name() << "=" << flag.DefaultValue() << "\n";
  if (const std::string help = flag.Help(); !help.empty()) out << "      " << help << "\n";
}

void PrintHelp(std::ostream& out, const std::string& program, const char* usage,
               const char* main_file, bool all) {
  out << program << " " << VersionString() << ": " << usage << "\n\nFlags:\n";
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (flag->IsRetired()) continue;
    if (all || flag->Filename() == main_file) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](const auto* a, const auto* b) { return a->Name() < b->Name(); });
  for (const absl::CommandLineFlag* flag : flags) PrintFlag(out, *flag);
  out << "\n  --help       these flags\n"
      << "  --helpfull   every flag linked into " << program << " (Abseil's included)\n"
      << "  --version    the version and build type\n";
}

}  // namespace

std::string VersionString() { return absl::StrCat(ProjectVersion(), " (", BuildType(), ")"); }

std::vector<char*> ParseFlags(int argc, char** argv, const char* usage, const char* main_file) {
  const std::string program = ProgramName(argc > 0 ? argv[0] : nullptr);
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  config.version_string = [program] { return absl::StrCat(program, " ", VersionString(), "\n"); };
  // Flag file names as the compiler wrote them, so they compare equal to the
  // main's __FILE__.
  config.normalize_filename = [](absl::string_view file) { return std::string(file); };
  absl::SetFlagsUsageConfig(config);
  switch (FindUsageFlag(argc, argv)) {
    case Usage::kNone:
      break;
    case Usage::kHelp:
      PrintHelp(std::cout, program, usage, main_file, /*all=*/false);
      std::exit(0);
    case Usage::kHelpFull:
      PrintHelp(std::cout, program, usage, main_file, /*all=*/true);
      std::exit(0);
    case Usage::kVersion:
      std::cout << program << " " << VersionString() << "\n";
      std::exit(0);
  }
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace pdserve
