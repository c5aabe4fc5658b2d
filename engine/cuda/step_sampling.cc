// Device sampling of a step's rows (see step_sampling.h).
#include "engine/cuda/step_sampling.h"

#include <algorithm>
#include <cstring>

#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/base/device_memory.h"
#include "engine/cuda/token_mask.cuh"

namespace pdserve::cuda {

SamplingPlan PlanSampling(const engine::StepBatch& batch, std::span<const int> sample_seqs,
                          std::span<const int> eos_ids, int vocab) {
  SamplingPlan plan;
  plan.rows = static_cast<int>(sample_seqs.size());
  plan.vocab = vocab;
  int max_logprobs = -1;
  for (int s : sample_seqs) {
    const engine::StepSequence& seq = batch.seqs[s];
    const engine::SamplingParams& p = *seq.sampling;
    plan.params.push_back(ToDeviceParams(p, static_cast<int>(seq.history.generated.size())));
    plan.penalties = plan.penalties || NeedsLogitsProcessors(p, seq.history);
    plan.penalty.AddRow(p, seq.history, eos_ids, vocab);
    max_logprobs = std::max(max_logprobs, p.logprobs);
    if (p.constraint != nullptr) {
      // Computed here, on the host, while nothing waits for it: the mask
      // depends only on the request's history.
      thread_local std::vector<uint32_t> mask;
      engine::FillConstraintMask(p, seq.history, eos_ids, vocab, mask);
      plan.mask_rows.push_back(static_cast<int32_t>(plan.masks.size() / mask.size()));
      plan.masks.insert(plan.masks.end(), mask.begin(), mask.end());
      plan.masked = true;
    } else {
      plan.mask_rows.push_back(-1);
    }
  }
  if (max_logprobs >= 0) plan.top_n = std::min({max_logprobs, vocab, kMaxTopLogprobs});
  return plan;
}

SamplingBuffers LayoutSampling(const SamplingPlan& plan, uintptr_t base) {
  ArenaLayout layout;
  auto take = [&](size_t bytes) { return reinterpret_cast<void*>(base + layout.Take(bytes)); };
  const size_t rows = static_cast<size_t>(plan.rows);
  const PenaltyInputs& p = plan.penalty;
  SamplingBuffers b;
  b.params = static_cast<DeviceSamplingParams*>(take(rows * sizeof(DeviceSamplingParams)));
  if (plan.penalties) {
    b.penalty_params = static_cast<DevicePenalty*>(take(rows * sizeof(DevicePenalty)));
    b.offsets = static_cast<int32_t*>(take(p.offsets.size() * 4));
    b.tokens = static_cast<int32_t*>(take(p.tokens.size() * 4));
    b.counts = static_cast<int32_t*>(take(p.counts.size() * 4));
    b.mask_offsets = static_cast<int32_t*>(take(p.mask_offsets.size() * 4));
    b.mask_tokens = static_cast<int32_t*>(take(p.mask_tokens.size() * 4));
  }
  if (plan.masked) {
    b.token_mask_rows = static_cast<int32_t*>(take(plan.mask_rows.size() * 4));
    b.token_masks = static_cast<uint32_t*>(take(plan.masks.size() * 4));
  }
  b.input_bytes = layout.size();
  if (plan.processed()) {
    b.processed = static_cast<float*>(take(rows * plan.vocab * sizeof(float)));
  }
  b.output_offset = layout.Take(LayoutSamplingOutputs(plan, 0).bytes);
  b.total_bytes = layout.size();
  return b;
}

SamplingOutputs LayoutSamplingOutputs(const SamplingPlan& plan, uintptr_t base) {
  ArenaLayout layout;
  auto take = [&](size_t bytes) { return reinterpret_cast<void*>(base + layout.Take(bytes)); };
  const size_t rows = static_cast<size_t>(plan.rows);
  const size_t top = plan.top_n > 0 ? static_cast<size_t>(plan.top_n) : 0;
  SamplingOutputs o;
  o.tokens = static_cast<int32_t*>(take(rows * 4));
  if (plan.top_n >= 0) {
    o.token_logprobs = static_cast<float*>(take(rows * 4));
    o.top_ids = static_cast<int32_t*>(take(rows * top * 4));
    o.top_logprobs = static_cast<float*>(take(rows * top * 4));
  }
  o.bytes = layout.size();
  return o;
}

void FillSamplingInputs(const SamplingPlan& plan, const SamplingBuffers& host) {
  auto copy = [](void* dst, const auto& v) {
    if (!v.empty()) std::memcpy(dst, v.data(), v.size() * sizeof(v[0]));
  };
  copy(host.params, plan.params);
  if (plan.masked) {
    copy(host.token_mask_rows, plan.mask_rows);
    copy(host.token_masks, plan.masks);
  }
  if (!plan.penalties) return;
  copy(host.penalty_params, plan.penalty.params);
  copy(host.offsets, plan.penalty.offsets);
  copy(host.tokens, plan.penalty.tokens);
  copy(host.counts, plan.penalty.counts);
  copy(host.mask_offsets, plan.penalty.mask_offsets);
  copy(host.mask_tokens, plan.penalty.mask_tokens);
}

absl::Status EnqueueSampling(const SamplingPlan& plan, const float* logits,
                             const SamplingBuffers& b, const SamplingOutputs& out,
                             cudaStream_t stream) {
  if (plan.rows == 0) return absl::OkStatus();
  const float* from = logits;
  if (plan.processed()) {
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(b.processed, logits,
                                                 size_t{sizeof(float)} * plan.rows * plan.vocab,
                                                 cudaMemcpyDeviceToDevice, stream));
    from = b.processed;
  }
  if (plan.penalties) {
    PenaltyArgs args;
    args.params = b.penalty_params;
    args.offsets = b.offsets;
    args.tokens = b.tokens;
    args.counts = b.counts;
    args.mask_offsets = b.mask_offsets;
    args.mask_tokens = b.mask_tokens;
    PDSERVE_CUDA_RETURN_IF_ERROR(ApplyPenalties(b.processed, plan.rows, plan.vocab, args, stream));
  }
  if (plan.masked) {
    PDSERVE_CUDA_RETURN_IF_ERROR(ApplyTokenMasks(b.processed, plan.rows, plan.vocab,
                                                 b.token_mask_rows, b.token_masks, stream));
  }
  PDSERVE_CUDA_RETURN_IF_ERROR(
      SampleTokens(from, plan.rows, plan.vocab, b.params, out.tokens, stream));
  if (plan.top_n >= 0) {
    PDSERVE_CUDA_RETURN_IF_ERROR(ComputeLogprobs(logits, plan.rows, plan.vocab, out.tokens,
                                                 plan.top_n, out.token_logprobs, out.top_ids,
                                                 out.top_logprobs, stream));
  }
  return absl::OkStatus();
}

void ReadSampled(const engine::StepBatch& batch, std::span<const int> sample_seqs,
                 const SamplingPlan& plan, const SamplingOutputs& host,
                 std::vector<engine::SampledToken>& sampled) {
  for (size_t i = 0; i < sample_seqs.size(); ++i) {
    const engine::SamplingParams& p = *batch.seqs[sample_seqs[i]].sampling;
    engine::SampledToken& t = sampled[sample_seqs[i]];
    t.token = host.tokens[i];
    if (p.logprobs < 0) continue;
    t.logprob = host.token_logprobs[i];
    const int n = std::min(p.logprobs, plan.top_n);
    for (int j = 0; j < n; ++j) {
      t.top.push_back({host.top_ids[i * plan.top_n + j], host.top_logprobs[i * plan.top_n + j]});
    }
  }
}

}  // namespace pdserve::cuda
