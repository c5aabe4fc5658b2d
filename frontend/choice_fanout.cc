#include "frontend/choice_fanout.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pdserve::frontend {

std::vector<Request> ChoiceRequests(const Request& base, const std::string& id, int n) {
  std::vector<Request> out(n, base);
  for (int i = 0; i < n; ++i) {
    out[i].request_id = absl::StrCat(id, "-", i);
    if (base.seed.has_value()) out[i].seed = *base.seed + static_cast<uint64_t>(i);
  }
  return out;
}

ChoiceFanout::ChoiceFanout(SessionManager& sessions, std::vector<Request> requests,
                           const CallInfo& call, absl::Duration poll)
    : sessions_(sessions), requests_(std::move(requests)), call_(call), poll_(poll) {}

absl::StatusOr<std::unique_ptr<ChoiceFanout>> ChoiceFanout::Start(SessionManager& sessions,
                                                                  std::vector<Request> requests,
                                                                  const CallInfo& call,
                                                                  const std::function<bool()>& gone,
                                                                  absl::Duration poll) {
  absl::StatusOr<std::unique_ptr<RequestSession>> leader = sessions.Start(requests[0], call);
  if (!leader.ok()) return leader.status();
  std::optional<Delta> first;
  while (!first.has_value()) {
    if (gone()) return (*leader)->Abandon();
    absl::StatusOr<std::optional<Delta>> next = (*leader)->Next(poll);
    if (!next.ok()) return next.status();
    first = *std::move(next);
  }
  std::unique_ptr<ChoiceFanout> fanout(new ChoiceFanout(sessions, std::move(requests), call, poll));
  const bool leader_done = first->finished;
  fanout->Push(0, *std::move(first));
  fanout->threads_.reserve(fanout->requests_.size());
  if (!leader_done) {
    fanout->threads_.emplace_back(&ChoiceFanout::Run, fanout.get(), 0, *std::move(leader));
  }
  for (int i = 1; i < fanout->size(); ++i) {
    fanout->threads_.emplace_back(&ChoiceFanout::Run, fanout.get(), i, nullptr);
  }
  return fanout;
}

ChoiceFanout::~ChoiceFanout() {
  Stop();
  for (std::thread& t : threads_) t.join();
}

void ChoiceFanout::Push(int index, absl::StatusOr<Delta> delta) {
  absl::MutexLock lock(&mu_);
  outputs_.push_back(Output{.index = index, .delta = std::move(delta)});
}

void ChoiceFanout::Run(int index, std::unique_ptr<RequestSession> session) {
  if (session == nullptr) {
    if (stop_.load()) return;
    absl::StatusOr<std::unique_ptr<RequestSession>> started =
        sessions_.Start(requests_[index], call_);
    if (!started.ok()) {
      Push(index, started.status());
      return;
    }
    session = *std::move(started);
  }
  absl::Status status = RunSession(
      *session,
      [&](const Delta& delta) {
        if (stop_.load()) return false;
        Push(index, delta);
        return true;
      },
      [&] { return stop_.load(); }, poll_);
  if (!status.ok()) Push(index, std::move(status));
}

std::optional<ChoiceFanout::Output> ChoiceFanout::Next(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !outputs_.empty(); };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (outputs_.empty()) return std::nullopt;
  Output out = std::move(outputs_.front());
  outputs_.pop_front();
  return out;
}

}  // namespace pdserve::frontend
