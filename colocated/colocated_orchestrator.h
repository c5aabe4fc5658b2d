// The colocated baseline's orchestration (frontend/orchestrator.h) over its
// in-process engine: a job is submitted to the ColocatedEngine and the
// engine's outputs become generation events, so pdserve_colocated serves
// the same gRPC and OpenAI HTTP APIs through the same front end as the
// router. The engine returns no log-probabilities: jobs asking for them are
// refused (UNIMPLEMENTED).
#pragma once

#include <memory>
#include <string>

#include "colocated/colocated_engine.h"
#include "engine/runtime/grammar/grammar_constraint.h"
#include "frontend/orchestrator.h"

namespace pdserve::colocated {

class ColocatedOrchestrator final : public frontend::Orchestrator {
 public:
  // `engine` must outlive the orchestrator and every generation it started.
  // `worker_id` names this process in the responses' timings (prefill_worker
  // and decode_worker).
  // `grammars` (may be null: structured output is then refused) must
  // outlive it too.
  ColocatedOrchestrator(ColocatedEngine* engine, std::string worker_id,
                        engine::grammar::GrammarCompiler* grammars = nullptr);

  // Refusals are the engine's: INVALID_ARGUMENT (larger than the whole KV
  // cache), RESOURCE_EXHAUSTED (waiting queue full), UNAVAILABLE (stopping).
  absl::StatusOr<std::unique_ptr<frontend::Generation>> Start(frontend::GenerationJob job) override;

 private:
  ColocatedEngine* const engine_;
  const std::string worker_id_;
  engine::grammar::GrammarCompiler* const grammars_;
};

}  // namespace pdserve::colocated
