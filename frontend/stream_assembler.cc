#include "frontend/stream_assembler.h"

namespace pdserve::frontend {

StreamAssembler::StreamAssembler(const text::Tokenizer& tokenizer,
                                 std::vector<std::string> stop_strings)
    : detokenizer_(tokenizer), stops_(std::move(stop_strings)) {}

StreamAssembler::Piece StreamAssembler::Push(std::span<const int32_t> tokens) {
  Piece piece;
  if (stopped_) return piece;
  for (int32_t token : tokens) {
    generated_.push_back(token);
    ++piece.num_tokens;
    StopMatcher::Result r = stops_.Push(detokenizer_.Push(token));
    piece.text += r.text;
    if (r.stopped) {
      stopped_ = true;
      piece.stopped = true;
      piece.matched_stop = std::move(r.matched);
      break;
    }
  }
  return piece;
}

StreamAssembler::Piece StreamAssembler::Flush() {
  Piece piece;
  if (stopped_) return piece;
  StopMatcher::Result r = stops_.Push(detokenizer_.Flush());
  piece.text = std::move(r.text);
  if (r.stopped) {
    stopped_ = true;
    piece.stopped = true;
    piece.matched_stop = std::move(r.matched);
    return piece;
  }
  piece.text += stops_.Flush();
  return piece;
}

}  // namespace pdserve::frontend
