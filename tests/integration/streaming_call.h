// Test helper: one streamed Generate call read on its own thread, with each
// token's arrival time, so a test can wait for tokens, cancel as a client
// going away would, and measure gaps (fault and overload tests).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::testing {

class StreamingCall {
 public:
  StreamingCall(v1::Generation::Stub& stub, v1::GenerateRequest request, absl::Duration timeout)
      : request_(std::move(request)), started_(absl::Now()) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    thread_ = std::thread([this, &stub] { Run(stub); });
  }
  ~StreamingCall() {
    context_.TryCancel();
    thread_.join();
  }

  // Client cancellation (the client goes away).
  void Cancel() { context_.TryCancel(); }
  // True once `n` tokens arrived (false after `timeout`, or if it ended first).
  bool WaitTokens(int n, absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(tokens_.size()) >= n || done_;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), timeout) &&
           static_cast<int>(tokens_.size()) >= n;
  }
  // True once the stream ended; false: lost (still open after `timeout`).
  bool Wait(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
  }
  grpc::Status status() const {
    absl::MutexLock lock(&mu_);
    return status_;
  }
  // From the call's start to its first token; nullopt before one arrived.
  std::optional<absl::Duration> TimeToFirstToken() const {
    absl::MutexLock lock(&mu_);
    if (arrivals_.empty()) return std::nullopt;
    return arrivals_.front() - started_;
  }
  // A trailing metadata value of the ended call ("" when absent), e.g. the
  // `retry-after` hint of a refusal.
  std::string Trailer(const std::string& key) const {
    absl::MutexLock lock(&mu_);
    if (!done_) return "";
    const auto& trailers = context_.GetServerTrailingMetadata();
    auto it = trailers.find(key);
    return it == trailers.end() ? "" : std::string(it->second.data(), it->second.size());
  }
  std::vector<int32_t> tokens() const {
    absl::MutexLock lock(&mu_);
    return tokens_;
  }
  absl::Time ended() const {  // when the stream ended (once Wait returned true)
    absl::MutexLock lock(&mu_);
    return ended_;
  }
  v1::Timings timings() const {
    absl::MutexLock lock(&mu_);
    return timings_;
  }
  // The longest wait for a token after `t` (from `t` to the next token,
  // or between two tokens after it).
  absl::Duration LongestGapAfter(absl::Time t) const {
    absl::MutexLock lock(&mu_);
    absl::Duration longest = absl::ZeroDuration();
    absl::Time previous = t;
    for (absl::Time a : arrivals_) {
      if (a < t) continue;
      longest = std::max(longest, a - previous);
      previous = a;
    }
    return longest;
  }

 private:
  void Run(v1::Generation::Stub& stub) {
    auto reader = stub.Generate(&context_, request_);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
      absl::MutexLock lock(&mu_);
      for (int32_t t : response.token_ids()) {
        tokens_.push_back(t);
        arrivals_.push_back(absl::Now());
      }
      if (response.has_timings()) timings_ = response.timings();
    }
    grpc::Status status = reader->Finish();
    absl::MutexLock lock(&mu_);
    status_ = std::move(status);
    ended_ = absl::Now();
    done_ = true;
  }

  const v1::GenerateRequest request_;
  const absl::Time started_;
  grpc::ClientContext context_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> arrivals_ ABSL_GUARDED_BY(mu_);
  v1::Timings timings_ ABSL_GUARDED_BY(mu_);
  grpc::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time ended_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last
};

// The value of one exact series ("name{labels}") in a text exposition; -1
// when absent.
inline double SeriesValue(const std::string& text, const std::string& series) {
  const std::string key = series + " ";
  for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1)) {
    if (at == 0 || text[at - 1] == '\n') return std::stod(text.substr(at + key.size()));
  }
  return -1;
}

}  // namespace pdserve::testing
