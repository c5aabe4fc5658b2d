// Assembles what a client sees from the tokens a generation produces:
// incremental detokenization (whole UTF-8 characters only), stop strings
// matched across token boundaries (text that may still become a stop string
// is held back, and neither the stop string nor anything after it is
// returned), and the history of generated tokens. Pure logic, one per
// request, not thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "frontend/stop_matcher.h"
#include "text/tokenizer.h"

namespace pdserve::frontend {

class StreamAssembler {
 public:
  // `tokenizer` must outlive the assembler.
  StreamAssembler(const text::Tokenizer& tokenizer, std::vector<std::string> stop_strings);

  struct Piece {
    // How many of the pushed tokens belong to the output: all of them, or
    // those up to and including the one that completed a stop string.
    size_t num_tokens = 0;
    std::string text;  // safe to send now
    bool stopped = false;
    std::string matched_stop;  // when stopped
  };
  // Adds generated tokens, in order. After a stop, nothing more is taken.
  Piece Push(std::span<const int32_t> tokens);
  // End of the stream: the text still held back, with incomplete characters
  // as U+FFFD (which may still complete a stop string). Nothing after a stop.
  Piece Flush();

  // Every token taken so far (the generated-token history).
  const std::vector<int32_t>& generated() const { return generated_; }
  bool stopped() const { return stopped_; }

 private:
  text::IncrementalDetokenizer detokenizer_;
  StopMatcher stops_;
  std::vector<int32_t> generated_;
  bool stopped_ = false;
};

}  // namespace pdserve::frontend
