// Verification of proposed tokens (speculative decoding): given the target
// model's raw logits at the k + 1 positions of one sequence's verification
// step (its newest token, then the k proposed tokens), decides which
// proposals stand and draws the token after them, so that the output follows
// exactly the distribution of decoding without speculation (Leviathan et al.
// 2023, Chen et al. 2023).
//
// Position j (0-based) is generated token number n + j of the request, n the
// tokens generated before the step; its logits go through the request's own
// pipeline (penalties and min_tokens over the history including the
// proposals before j, then temperature, top-k, min-p, top-p:
// engine/runtime/sampler.h), giving the target distribution p_j.
//
// Deterministic proposals (n-gram lookup, a greedy draft: q_j is one-hot on
// x_j): the token of position j is drawn from p_j with the request's own
// seeded uniform for step n + j, exactly as decoding without speculation
// draws it, and x_j stands when it equals that token. This is the rejection
// rule for a one-hot q (x_j kept with probability p_j(x_j), otherwise a draw
// from p_j without x_j) coupled to the plain draw: the output is the same
// token sequence, seed for seed, as without speculation (greedy included).
//
// Sampled proposals (a draft model drawing x_j from its own distribution
// q_j): x_j stands when u < p_j(x_j) / q_j(x_j), u uniform from (seed, step)
// on an acceptance stream; at the first rejection the token is drawn from
// max(0, p_j - q_j), normalised, on a residual stream. The output follows p
// exactly and is reproducible for a seed given the same proposals.
//
// After k standing proposals the token of position k (the bonus) is drawn
// from p_k as without speculation. Pure, no I/O, thread-compatible.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/runtime/sampler.h"

namespace pdserve::engine::spec {

// Salts of the draft's and the verifier's uniform streams, xor-ed into the
// request's seed (the plain draw keeps the seed itself).
inline constexpr uint64_t kDraftStreamSalt = 0x5bd1e9955bd1e995ull;
inline constexpr uint64_t kAcceptStreamSalt = 0xc2b2ae3d27d4eb4full;
inline constexpr uint64_t kResidualStreamSalt = 0x165667b19e3779f9ull;

struct VerifyInput {
  // [proposals.size() + 1, vocab] raw target logits, position by position.
  std::span<const float> logits;
  std::span<const int32_t> proposals;
  // [proposals.size(), vocab] draft probabilities q_j the proposals were
  // drawn from; empty: deterministic proposals (one-hot q).
  std::span<const float> proposal_probs;
  const SamplingParams* sampling = nullptr;
  // The request's tokens before the step: the prompt, then `generated`.
  TokenHistory history;
  std::span<const int> eos_ids;
};

struct VerifyResult {
  // The standing proposals, then the drawn token: 1 .. proposals.size() + 1
  // tokens, with log-probabilities when sampling->logprobs >= 0.
  std::vector<SampledToken> tokens;
  int num_accepted = 0;  // proposals that stood
};

// Scratch reused across calls (one per thread).
struct VerifyScratch {
  std::vector<int32_t> generated;  // history.generated + proposals
  std::vector<float> processed;
  std::vector<TokenProb> target;
  std::vector<double> residual;
};

VerifyResult VerifyProposals(const VerifyInput& in, VerifyScratch& scratch);

}  // namespace pdserve::engine::spec
