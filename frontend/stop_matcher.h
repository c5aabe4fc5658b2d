// Stop strings matched on the streamed text, across token boundaries. Text
// that could still turn out to be the start of a stop string is held back, so
// neither a stop string nor anything after it reaches the client. Pure logic.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace pdserve::frontend {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to send now
    bool stopped = false;  // a stop string matched; `text` ends before it
    std::string matched;   // that stop string
  };
  // Adds newly decoded text (whole UTF-8 characters).
  Result Push(std::string_view text);
  // End of stream: everything held back.
  std::string Flush();

 private:
  std::vector<std::string> stops_;
  size_t max_len_ = 0;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace pdserve::frontend
