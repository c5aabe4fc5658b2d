// StepState and the caller's handle (see step_state.h).
#include "engine/runtime/step_state.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

void StepState::WaitDone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &StepState::DoneLocked));
}

absl::Status StepState::WaitLayer(int layer) {
  absl::MutexLock lock(&mu_);
  auto ready = [this, layer]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return layers_done_ > layer || result_.has_value();
  };
  mu_.Await(absl::Condition(&ready));
  if (layers_done_ > layer) return absl::OkStatus();
  if (!result_->ok()) return result_->status();
  return absl::InvalidArgumentError(
      absl::StrCat("WaitLayer: layer ", layer, " outside [0, ", num_layers_, ")"));
}

absl::StatusOr<StepOutput> StepState::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(this, &StepState::DoneLocked));
  if (taken_) return absl::FailedPreconditionError("StepHandle::Wait called twice");
  taken_ = true;
  return std::move(*result_);
}

void StepState::LayerDone(int layer) {
  absl::MutexLock lock(&mu_);
  layers_done_ = layer + 1;
}

void StepState::Complete(absl::StatusOr<StepOutput> result) {
  absl::MutexLock lock(&mu_);
  result_ = std::move(result);
}

std::unique_ptr<StepHandle> CallerHandle(std::shared_ptr<StepState> state) {
  class Caller final : public StepHandle {
   public:
    explicit Caller(std::shared_ptr<StepState> s) : s_(std::move(s)) {}
    ~Caller() override { s_->WaitDone(); }
    absl::Status WaitLayer(int layer) override { return s_->WaitLayer(layer); }
    absl::StatusOr<StepOutput> Wait() override { return s_->Wait(); }
    void* LayerDeviceEvent(int layer) const override { return s_->LayerDeviceEvent(layer); }

   private:
    std::shared_ptr<StepState> s_;
  };
  return std::make_unique<Caller>(std::move(state));
}

}  // namespace pdserve::engine
