#include "engine/runtime/model_runner.h"

namespace pdserve::engine {

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kF16:
      return "f16";
  }
  return "unknown";
}

int KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kF16:
      return 2;
  }
  return 0;
}

absl::StatusOr<StepOutput> ModelRunner::Step(StepBatch batch) {
  absl::StatusOr<std::unique_ptr<StepHandle>> handle = Enqueue(std::move(batch));
  if (!handle.ok()) return handle.status();
  return (*handle)->Wait();
}

namespace {
// Greedy, so the step samples (and returns logits) without touching them.
const SamplingParams kLogitsOnly{};
}  // namespace

absl::Status PrefillForLogits(ModelRunner& runner, std::span<const PrefillSequence> seqs,
                              const LayerDoneFn& on_layer_done, std::vector<float>& logits) {
  logits.clear();
  StepBatch batch;
  batch.return_logits = true;
  for (const PrefillSequence& s : seqs) {
    batch.seqs.push_back({.tokens = s.tokens,
                          .num_cached = 0,
                          .block_table = s.block_table,
                          .sampling = &kLogitsOnly,
                          .history = {.prompt = s.tokens, .generated = {}}});
  }
  absl::StatusOr<std::unique_ptr<StepHandle>> handle = runner.Enqueue(std::move(batch));
  if (!handle.ok()) return handle.status();
  if (on_layer_done && !seqs.empty()) {
    for (int layer = 0; layer < runner.config().num_layers; ++layer) {
      if (absl::Status s = (*handle)->WaitLayer(layer); !s.ok()) {
        return (*handle)->Wait().status();
      }
      on_layer_done(layer);
    }
  }
  absl::StatusOr<StepOutput> out = (*handle)->Wait();
  if (!out.ok()) return out.status();
  logits = std::move(out->logits);
  return absl::OkStatus();
}

absl::Status DecodeForLogits(ModelRunner& runner, std::span<const DecodeSequence> seqs,
                             std::vector<float>& logits) {
  logits.clear();
  StepBatch batch;
  batch.return_logits = true;
  for (const DecodeSequence& s : seqs) {
    batch.seqs.push_back({.tokens = {&s.token, 1},
                          .num_cached = s.position,
                          .block_table = s.block_table,
                          .sampling = &kLogitsOnly,
                          .history = {}});
  }
  absl::StatusOr<StepOutput> out = runner.Step(std::move(batch));
  if (!out.ok()) return out.status();
  logits = std::move(out->logits);
  return absl::OkStatus();
}

}  // namespace pdserve::engine
