#include "colocated/colocated_orchestrator.h"

#include <atomic>

#include "frontend/errors.h"

namespace pdserve::colocated {
namespace {

class ColocatedGeneration final : public frontend::Generation {
 public:
  ColocatedGeneration(ColocatedEngine* engine, std::shared_ptr<ColocatedStream> stream,
                      std::string worker_id)
      : engine_(engine), stream_(std::move(stream)), worker_id_(std::move(worker_id)) {}

  ~ColocatedGeneration() override {
    if (!finished_) Cancel();
  }

  absl::Status Next(absl::Duration timeout, std::vector<frontend::GenerationEvent>* out) override {
    if (cancelled_.load()) return absl::CancelledError("cancelled");
    outputs_.clear();
    if (!stream_->Next(timeout, &outputs_)) return absl::OkStatus();
    for (ColocatedOutput& output : outputs_) {
      if (!output.error.ok()) {
        finished_ = true;  // the engine freed the sequence
        return output.error;
      }
      frontend::GenerationEvent event;
      event.tokens = std::move(output.tokens);
      event.logprobs = std::move(output.logprobs);
      if (first_ && !event.tokens.empty()) {
        first_ = false;
        event.queue_seconds = output.queue_seconds;
      }
      event.finished = output.finished;
      event.finish_reason = output.finish_reason;
      finished_ = finished_ || output.finished;
      out->push_back(std::move(event));
    }
    return absl::OkStatus();
  }

  void Cancel() override {
    if (cancelled_.exchange(true)) return;
    engine_->Cancel(*stream_);
    stream_->Close();  // wakes a Next that waits
  }

  frontend::Placement placement() const override {
    return {.prefill_worker = worker_id_, .decode_worker = worker_id_};
  }

 private:
  ColocatedEngine* const engine_;
  const std::shared_ptr<ColocatedStream> stream_;
  const std::string worker_id_;
  std::atomic<bool> cancelled_{false};
  // Used by the session's thread only.
  std::vector<ColocatedOutput> outputs_;
  bool first_ = true;
  bool finished_ = false;
};

}  // namespace

ColocatedOrchestrator::ColocatedOrchestrator(ColocatedEngine* engine, std::string worker_id,
                                             engine::grammar::GrammarCompiler* grammars)
    : engine_(engine), worker_id_(std::move(worker_id)), grammars_(grammars) {}

absl::StatusOr<std::unique_ptr<frontend::Generation>> ColocatedOrchestrator::Start(
    frontend::GenerationJob job) {
  if (!job.sampling.grammar_spec.empty()) {
    if (grammars_ == nullptr) {
      return frontend::WithRejectReason(
          absl::FailedPreconditionError(
              "structured output: no tokenizer to build token masks from"),
          "invalid_argument");
    }
    absl::StatusOr<std::shared_ptr<const engine::TokenConstraint>> c =
        grammars_->Compile(job.sampling.grammar_spec);
    if (!c.ok()) return frontend::WithRejectReason(c.status(), "invalid_argument");
    job.sampling.constraint = *std::move(c);
  }
  absl::StatusOr<std::shared_ptr<ColocatedStream>> stream =
      engine_->Submit(ColocatedRequest{.request_id = std::move(job.request_id),
                                       .prompt = std::move(job.prompt),
                                       .sampling = std::move(job.sampling)});
  if (!stream.ok()) return stream.status();
  return std::make_unique<ColocatedGeneration>(engine_, *std::move(stream), worker_id_);
}

}  // namespace pdserve::colocated
