// Minimal leveled logging to stderr: `PDSERVE_LOG(INFO) << "text";`.
// Each line carries UTC time, level and thread id. Thread-safe: a line is
// written with one call. PDSERVE_CHECK aborts on broken invariants only.
#pragma once

#include <sstream>
#include <string_view>

namespace pdserve {

enum class LogLevel : int { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3, kFatal = 4 };

void SetMinLogLevel(LogLevel level);
LogLevel MinLogLevel();
// Parses "debug", "info", "warning", "error"; false on anything else.
bool ParseLogLevel(std::string_view text, LogLevel* level);

class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  std::ostream& stream() { return stream_; }

 private:
  LogLevel level_;
  std::ostringstream stream_;
};

}  // namespace pdserve

#define PDSERVE_LOG_LEVEL_DEBUG ::pdserve::LogLevel::kDebug
#define PDSERVE_LOG_LEVEL_INFO ::pdserve::LogLevel::kInfo
#define PDSERVE_LOG_LEVEL_WARNING ::pdserve::LogLevel::kWarning
#define PDSERVE_LOG_LEVEL_ERROR ::pdserve::LogLevel::kError
#define PDSERVE_LOG_LEVEL_FATAL ::pdserve::LogLevel::kFatal

namespace pdserve {
// Lets a stream expression be the discarded arm of `?:`.
struct LogVoidify {
  void operator&(std::ostream&) {}
};
}  // namespace pdserve

#define PDSERVE_LOG(level)                                    \
  (PDSERVE_LOG_LEVEL_##level < ::pdserve::MinLogLevel())      \
      ? (void)0                                               \
      : ::pdserve::LogVoidify() &                             \
            ::pdserve::LogMessage(PDSERVE_LOG_LEVEL_##level, __FILE__, __LINE__).stream()

#define PDSERVE_CHECK(cond)                                                                \
  (cond) ? (void)0                                                                         \
         : ::pdserve::LogVoidify() &                                                       \
               ::pdserve::LogMessage(::pdserve::LogLevel::kFatal, __FILE__, __LINE__).stream() \
                   << "Check failed: " #cond " "
