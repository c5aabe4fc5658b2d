// Verification of proposed tokens: see rejection_sampler.h.
#include "engine/spec/rejection_sampler.h"

#include <algorithm>

#include "engine/runtime/sampling_draw.h"

namespace pdserve::engine::spec {
namespace {

// The token drawn from max(0, p - q) normalised, inverse CDF in ascending
// id order with `uniform`; `target` is p (ascending ids), `q` dense. When p
// and q agree (no residual mass, only through rounding) the draw is from p.
int32_t DrawResidual(std::span<const TokenProb> target, std::span<const float> q, double uniform,
                     std::vector<double>& residual) {
  residual.resize(target.size());
  double total = 0.0;
  for (size_t i = 0; i < target.size(); ++i) {
    residual[i] = std::max(0.0, target[i].prob - static_cast<double>(q[target[i].token]));
    total += residual[i];
  }
  if (!(total > 0.0)) {
    for (size_t i = 0; i < target.size(); ++i) residual[i] = target[i].prob;
    total = 1.0;
  }
  const double at = uniform * total;
  double cum = 0.0;
  for (size_t i = 0; i < target.size(); ++i) {
    cum += residual[i];
    if (at < cum && residual[i] > 0.0) return target[i].token;
  }
  for (size_t i = target.size(); i-- > 0;) {
    if (residual[i] > 0.0) return target[i].token;
  }
  return target.empty() ? 0 : target.back().token;
}

}  // namespace

VerifyResult VerifyProposals(const VerifyInput& in, VerifyScratch& scratch) {
  const SamplingParams& params = *in.sampling;
  const size_t k = in.proposals.size();
  const size_t vocab = in.logits.size() / (k + 1);
  const bool sampled_proposals = !in.proposal_probs.empty();
  scratch.generated.assign(in.history.generated.begin(), in.history.generated.end());
  const int n = static_cast<int>(in.history.generated.size());
  VerifyResult result;
  for (size_t j = 0; j <= k; ++j) {
    const std::span<const float> row = in.logits.subspan(j * vocab, vocab);
    const TokenHistory history{.prompt = in.history.prompt, .generated = scratch.generated};
    const int step = n + static_cast<int>(j);
    if (j == k || !sampled_proposals) {
      // The plain draw of step n + j (greedy: the argmax).
      SampledToken token = Sample(row, params, history, in.eos_ids, scratch.processed);
      const bool stands = j < k && token.token == in.proposals[j];
      result.tokens.push_back(std::move(token));
      if (!stands) break;
      ++result.num_accepted;
      scratch.generated.push_back(in.proposals[j]);
      continue;
    }
    std::span<const float> processed = row;
    if (params.HasPenalties() || step < params.min_tokens) {
      scratch.processed.assign(row.begin(), row.end());
      ApplyLogitsProcessors(scratch.processed, params, history, in.eos_ids);
      processed = scratch.processed;
    }
    SamplingDistribution(processed, params, scratch.target);
    const int32_t x = in.proposals[j];
    const std::span<const float> q = in.proposal_probs.subspan(j * vocab, vocab);
    double px = 0.0;
    for (const TokenProb& t : scratch.target) {
      if (t.token == x) px = t.prob;
    }
    const double qx = static_cast<double>(q[x]);
    const double u = UniformForStep(params.seed ^ kAcceptStreamSalt, step);
    SampledToken token;
    const bool stands = qx > 0.0 && u * qx < px;
    token.token = stands ? x
                         : DrawResidual(scratch.target, q,
                                        UniformForStep(params.seed ^ kResidualStreamSalt, step),
                                        scratch.residual);
    if (params.logprobs >= 0) FillLogprobs(row, params.logprobs, token);
    result.tokens.push_back(std::move(token));
    if (!stands) break;
    ++result.num_accepted;
    scratch.generated.push_back(x);
  }
  return result;
}

}  // namespace pdserve::engine::spec
