// Start-up of every pdserve binary: flag parsing where `--help` prints the
// binary's own flags and exits 0, and `--version` prints the project version.
//
// Abseil's own --help (Debian's Abseil 20220623) lists only flags defined in
// a file named after the binary, which no pdserve main is ("No flags
// matched"), and exits 1; ParseFlags answers the usage flags itself first.
#pragma once

#include <string>
#include <vector>

namespace pdserve {

// The CMake project version, e.g. "0.1.0".
const char* ProjectVersion();
// The CMake build type the binary was built with, e.g. "Release".
const char* BuildType();
// "0.1.0 (Release)": what start-up logs and --version print.
std::string VersionString();

// Parses the command line with Abseil and returns the positional arguments
// (argv[0] first). Before that, answers the usage flags and exits 0:
//   --help, --helpshort   `usage`, then the flags defined in `main_file`
//                         (pass __FILE__ from the main), then the usage flags
//   --helpfull            `usage`, then every flag linked into the binary
//   --version             "<program> <VersionString()>"
// Single-dash spellings (-help, -version) count too; nothing after "--" does.
// An unknown flag or a bad value exits 1 with Abseil's message, as before.
std::vector<char*> ParseFlags(int argc, char** argv, const char* usage, const char* main_file);

}  // namespace pdserve
