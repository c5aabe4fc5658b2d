// The completion of one enqueued step, shared by the runner thread that
// reports it (LayerDone in layer order, then Complete) and the caller that
// waits for it (StepHandle's WaitLayer and Wait). Backends derive from it to
// add what their steps expose (e.g. device events). Thread-safe.
//
// CallerHandle wraps a state as the StepHandle Enqueue returns: dropping it
// waits for the step, because the batch's spans must outlive the step.
#pragma once

#include <memory>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::engine {

class StepState : public StepHandle {
 public:
  explicit StepState(int num_layers) : num_layers_(num_layers) {}

  // Blocks until the step is complete, without taking its result.
  void WaitDone();
  absl::Status WaitLayer(int layer) override;
  absl::StatusOr<StepOutput> Wait() override;

  // Runner thread: layers 0..layer have written their K/V.
  void LayerDone(int layer);
  // Runner thread, once: the step's outcome.
  void Complete(absl::StatusOr<StepOutput> result);

 protected:
  bool DoneLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_) { return result_.has_value(); }
  int num_layers() const { return num_layers_; }

  mutable absl::Mutex mu_;

 private:
  const int num_layers_;
  int layers_done_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<absl::StatusOr<StepOutput>> result_ ABSL_GUARDED_BY(mu_);
  bool taken_ ABSL_GUARDED_BY(mu_) = false;
};

// The caller's handle over `state` (see above).
std::unique_ptr<StepHandle> CallerHandle(std::shared_ptr<StepState> state);

}  // namespace pdserve::engine
