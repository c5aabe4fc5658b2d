// Sampling of a step's LM rows on the device with the CPU sampler's
// semantics (sampling.cuh): logits processors (penalties, min_tokens) on a
// copy when any row has them, the draw, and log-probabilities of the raw
// logits when any row asks. Only token ids and the asked log-probabilities
// come back to the host; vocabulary-sized arrays stay on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "engine/cuda/sampling.cuh"
#include "engine/cuda/sampling_inputs.h"
#include "engine/runtime/model_runner.h"

namespace pdserve::cuda {

// What the host sends for the sampling rows of a step.
struct SamplingPlan {
  int rows = 0;
  int vocab = 0;
  std::vector<DeviceSamplingParams> params;  // [rows]
  bool penalties = false;                    // some row needs ApplyPenalties
  PenaltyInputs penalty;                     // every row (empty lists where none)
  int top_n = -1;                            // top log-probabilities per row; -1: none
  // Structured output (token_mask.cuh): when some row has a constraint,
  // mask_rows[r] is row r's mask in `masks` (-1: none).
  bool masked = false;
  std::vector<int32_t> mask_rows;
  std::vector<uint32_t> masks;
  bool processed() const { return penalties || masked; }
};

// Row i samples for batch.seqs[sample_seqs[i]].
SamplingPlan PlanSampling(const engine::StepBatch& batch, std::span<const int> sample_seqs,
                          std::span<const int> eos_ids, int vocab);

// Device buffers of one sampling pass (inputs first), laid out from `base`.
struct SamplingBuffers {
  DeviceSamplingParams* params = nullptr;
  DevicePenalty* penalty_params = nullptr;
  int32_t* offsets = nullptr;
  int32_t* tokens = nullptr;
  int32_t* counts = nullptr;
  int32_t* mask_offsets = nullptr;
  int32_t* mask_tokens = nullptr;
  int32_t* token_mask_rows = nullptr;  // when masked
  uint32_t* token_masks = nullptr;
  size_t input_bytes = 0;
  float* processed = nullptr;  // [rows, vocab] when penalties or masked
  size_t output_offset = 0;    // where the outputs (SamplingOutputs) start
  size_t total_bytes = 0;
};
SamplingBuffers LayoutSampling(const SamplingPlan& plan, uintptr_t base);
void FillSamplingInputs(const SamplingPlan& plan, const SamplingBuffers& host);

// The results, copied back in one piece.
struct SamplingOutputs {
  int32_t* tokens = nullptr;        // [rows]
  float* token_logprobs = nullptr;  // [rows] when top_n >= 0
  int32_t* top_ids = nullptr;       // [rows, top_n]
  float* top_logprobs = nullptr;    // [rows, top_n]
  size_t bytes = 0;
};
SamplingOutputs LayoutSamplingOutputs(const SamplingPlan& plan, uintptr_t base);

// Enqueues the pass over `logits` ([rows, vocab], left unchanged).
absl::Status EnqueueSampling(const SamplingPlan& plan, const float* logits,
                             const SamplingBuffers& device, const SamplingOutputs& outputs,
                             cudaStream_t stream);

// Sampled tokens (and asked log-probabilities) of rows i into
// sampled[sample_seqs[i]], from host copies of the outputs.
void ReadSampled(const engine::StepBatch& batch, std::span<const int> sample_seqs,
                 const SamplingPlan& plan, const SamplingOutputs& host,
                 std::vector<engine::SampledToken>& sampled);

}  // namespace pdserve::cuda
