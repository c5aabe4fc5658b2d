// Token sampling (see sampler.h). Pipeline for temperature > 0:
//   logits / T (in double; NaN -> -inf) -> top-k -> softmax -> min-p -> top-p
//   -> draw.
// The uniform draw is a counter-based hash of (seed, step)
// (engine/runtime/sampling_draw.h), so the result depends only on the logits, the
// parameters and the step: never on call order, thread, batch or machine.
// Small top-k keeps the k best through a bounded heap; large top-k and top-p
// use a hand-written quickselect (by count, or by probability mass; expected
// O(vocab), no full sort) whose pivots come from a hash. The draw then walks
// the kept candidates in ascending token id (inverse CDF), an order any
// backend can reproduce: the CUDA sampler (engine/cuda/sampling.cu) finds
// the same token with a prefix sum over ids.
#include "engine/runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <ranges>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "engine/runtime/sampling_draw.h"

namespace pdserve::engine {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();
constexpr double kPosInf = std::numeric_limits<double>::infinity();
// The nucleus may stop when its mass reaches top_p up to this relative slack:
// top_p arrives as a float (0.8f > 0.8) and the mass is a rounded sum.
constexpr double kTopPSlack = 1e-6;
// Up to this top_k a bounded heap over the logits beats a quickselect over
// all candidates.
constexpr size_t kHeapTopK = 256;

// Up to this share of the vocabulary the kept candidates are sorted by id
// for the draw; above it they are scattered into a dense array instead.
constexpr size_t kSortedDrawFraction = 8;

// Largest logit, ignoring NaN; -inf if there is none. Eight accumulators
// break the dependency chain (the compiler may not reorder a float max).
float MaxLogit(std::span<const float> logits) {
  constexpr float kLow = -std::numeric_limits<float>::infinity();
  float acc[8] = {kLow, kLow, kLow, kLow, kLow, kLow, kLow, kLow};
  size_t i = 0;
  for (; i + 8 <= logits.size(); i += 8) {
    for (int j = 0; j < 8; ++j) {
      const float x = logits[i + j];
      acc[j] = x > acc[j] ? x : acc[j];  // false for NaN
    }
  }
  for (; i < logits.size(); ++i) acc[0] = logits[i] > acc[0] ? logits[i] : acc[0];
  float m = acc[0];
  for (int j = 1; j < 8; ++j) m = acc[j] > m ? acc[j] : m;
  return m;
}

// Highest logit, lowest id on ties; NaN counts as -inf; 0 if nothing beats -inf.
int32_t Argmax(std::span<const float> logits) {
  const float m = MaxLogit(logits);
  if (m == -std::numeric_limits<float>::infinity()) return 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (logits[i] == m) return static_cast<int32_t>(i);
  }
  return 0;  // unreachable: m is one of the logits
}

struct Candidate {
  double value;  // scaled logit, then unnormalised probability
  int32_t id;
};

// Strict order: larger value first, then smaller id.
bool Before(const Candidate& a, const Candidate& b) {
  return (a.value > b.value) | ((a.value == b.value) & (a.id < b.id));  // no branches
}

// Lomuto partition of c[lo, hi) around a pivot picked by a hash of (lo, hi):
// afterwards c[lo, s) come Before the pivot, c[s] is the pivot and c(s, hi)
// come after it. Returns s. Written out (not std::partition) so the resulting
// order, and hence every draw, is the same with any standard library.
size_t Partition(std::span<Candidate> c, size_t lo, size_t hi) {
  const size_t p = lo + SplitMix64((uint64_t{lo} << 32) ^ hi) % (hi - lo);
  std::swap(c[p], c[hi - 1]);
  const Candidate pivot = c[hi - 1];
  size_t s = lo;
  for (size_t i = lo; i + 1 < hi; ++i) {
    // Branch-free: always swap, advance s when c[i] belonged in front. The
    // comparisons are unpredictable, and a branch here doubles the cost.
    const Candidate x = c[i];
    c[i] = c[s];
    c[s] = x;
    s += Before(x, pivot);
  }
  std::swap(c[s], c[hi - 1]);
  return s;
}

// Reorders `c` so that c[0, k) are its first k elements in Before order
// (expected O(n)). Needs 0 < k < c.size().
void SelectTopK(std::span<Candidate> c, size_t k) {
  size_t lo = 0, hi = c.size();
  // Invariant: c[0, lo) precede c[lo, c.size()), and c[0, hi) hold the first hi.
  while (lo < k && k < hi) {
    const size_t s = Partition(c, lo, hi);
    if (s < k) {
      lo = s + 1;
    } else {
      hi = s;
    }
  }
}

// Reorders `c` (values are probabilities, unnormalised) and returns n such
// that c[0, n) is the shortest prefix in Before order whose mass reaches
// `threshold` (all of `c` if none does). Expected O(n); nothing is sorted.
size_t SelectNucleus(std::span<Candidate> c, double threshold) {
  size_t lo = 0, hi = c.size();
  double need = threshold;  // mass still missing after c[0, lo)
  // Invariant: c[0, lo) precede c[lo, c.size()) and their mass falls short;
  // the nucleus ends in (lo, hi].
  while (hi > lo + 1) {
    const size_t s = Partition(c, lo, hi);
    double mass = 0.0;
    for (size_t i = lo; i < s; ++i) mass += c[i].value;
    if (mass >= need) {
      hi = s;
      continue;
    }
    need -= mass + c[s].value;
    lo = s + 1;
    if (need <= 0.0) return lo;
  }
  return hi;
}

// Inverse-CDF draw of `target` (in [0, total)) over `kept` taken in
// ascending id order: the first id whose cumulative mass exceeds `target`,
// or the largest kept id when rounding leaves none. Reorders `kept`.
int32_t DrawInIdOrder(std::span<Candidate> kept, double target, size_t vocab) {
  if (kept.size() > 64 && kept.size() * kSortedDrawFraction > vocab) {
    thread_local std::vector<double> dense;
    dense.assign(vocab, 0.0);  // not kept: no mass, never drawn
    int32_t last = 0;
    for (const Candidate& c : kept) {
      dense[c.id] = c.value;
      last = std::max(last, c.id);
    }
    double cum = 0.0;
    for (int32_t id = 0; id <= last; ++id) {
      cum += dense[id];
      if (target < cum) return id;
    }
    return last;
  }
  if (!std::ranges::is_sorted(kept, {}, &Candidate::id))
    std::ranges::sort(kept, {}, &Candidate::id);
  double cum = 0.0;
  for (const Candidate& c : kept) {
    cum += c.value;
    if (target < cum) return c.id;
  }
  return kept.back().id;
}

}  // namespace

absl::Status ValidateGenerationRequest(std::span<const int32_t> prompt,
                                       const SamplingParams& params, const ModelConfig& config) {
  if (prompt.empty()) return absl::InvalidArgumentError("prompt_token_ids is empty");
  for (int32_t t : prompt) {
    if (t < 0 || t >= config.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrCat("prompt_token_ids: token ", t, " outside [0, ", config.vocab_size, ")"));
    }
  }
  if (absl::Status s = ValidateSamplingParams(params, config.vocab_size); !s.ok()) return s;
  if (params.max_tokens < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sampling.max_tokens must be >= 1, got ", params.max_tokens));
  }
  if (static_cast<int64_t>(prompt.size()) + params.max_tokens > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sampling.max_tokens: prompt (", prompt.size(), ") + max_tokens (", params.max_tokens,
        ") exceeds the model context of ", config.max_position_embeddings));
  }
  return absl::OkStatus();
}

namespace {

// The candidates a draw at temperature > 0 chooses from, with their
// unnormalised probabilities, and their total; empty when every logit is
// -inf or NaN. A view of thread-local storage, valid until the next call on
// this thread.
std::span<Candidate> KeptCandidates(std::span<const float> logits, const SamplingParams& params,
                                    double& total_out) {
  total_out = 0.0;
  const float max_logit = MaxLogit(logits);
  if (max_logit == -std::numeric_limits<float>::infinity()) return {};  // all -inf / NaN

  // Scratch reused across calls on this thread: a 128k vocabulary would
  // otherwise cost a fresh 2 MiB allocation (and its page faults) per token.
  thread_local std::vector<Candidate> cands;
  thread_local std::vector<int32_t> top_ids;
  cands.clear();
  const auto key = [&](int32_t id) {  // NaN sorts as -inf
    const float x = logits[id];
    return x == x ? x : -std::numeric_limits<float>::infinity();
  };
  const auto push = [&](int32_t id) {
    const double x = static_cast<double>(logits[id]);
    if (x > kNegInf) cands.push_back({x, id});  // -inf and NaN never get mass
  };
  const size_t top_k = params.top_k > 0 ? static_cast<size_t>(params.top_k) : 0;
  if (top_k > 0 && top_k <= kHeapTopK && top_k < logits.size()) {
    // The k best ids in (logit descending, id ascending) order through a
    // bounded heap: about one comparison per logit.
    top_ids.resize(top_k);
    const auto all = std::views::iota(int32_t{0}, static_cast<int32_t>(logits.size()));
    std::ranges::partial_sort_copy(all, top_ids, [&](int32_t a, int32_t b) {
      const float ka = key(a), kb = key(b);
      return ka > kb || (ka == kb && a < b);
    });
    for (int32_t id : top_ids) push(id);
  } else {
    cands.reserve(logits.size());
    for (size_t i = 0; i < logits.size(); ++i) push(static_cast<int32_t>(i));
    if (top_k > 0 && top_k < cands.size()) {
      SelectTopK(cands, top_k);  // on raw logits: same order as scaled ones
      cands.resize(top_k);
    }
  }

  double max_value = 0.0;  // scaled max_logit
  if (max_logit == std::numeric_limits<float>::infinity()) {
    // Infinite logits take all the mass, shared equally.
    std::erase_if(cands, [](const Candidate& c) { return c.value != kPosInf; });
    for (Candidate& c : cands) c.value = 0.0;
  } else {
    // Scaled logits in double: x / T cannot overflow for any float T > 0, and
    // the order of the float logits is kept exactly.
    const double inv_t = 1.0 / static_cast<double>(params.temperature);
    max_value = static_cast<double>(max_logit) * inv_t;
    for (Candidate& c : cands) c.value *= inv_t;
  }
  std::span<Candidate> kept(cands);

  // Softmax numerators; normalised implicitly through `total`.
  double total = 0.0;
  for (Candidate& c : kept) {
    c.value = std::exp(c.value - max_value);
    total += c.value;
  }

  if (params.min_p > 0.0f && max_logit != std::numeric_limits<float>::infinity()) {
    // Numerators are relative to the largest logit (whose numerator is 1), so
    // p / p_max is the numerator itself. The most likely token always stays.
    const double floor = static_cast<double>(params.min_p);
    size_t n = 0;
    for (const Candidate& c : kept) {
      kept[n] = c;
      n += c.value >= floor;
    }
    kept = kept.first(std::max<size_t>(n, 1));
    total = 0.0;
    for (const Candidate& c : kept) total += c.value;
  }

  if (params.top_p < 1.0f && kept.size() > 1) {
    const double threshold =
        std::max(0.0, static_cast<double>(params.top_p) * total * (1.0 - kTopPSlack));
    // Cheap pre-filter: a candidate with n * w <= total - threshold has at
    // least `threshold` mass before it, so it is outside the nucleus. For
    // peaked distributions this drops most of the vocabulary before the select.
    const double floor = (total - threshold) / static_cast<double>(kept.size());
    size_t n = 0;
    for (const Candidate& c : kept) {
      kept[n] = c;
      n += c.value > floor;  // branch-free compaction
    }
    if (n > 0) kept = kept.first(n);  // n == 0 only through rounding: keep all
    kept = kept.first(std::max<size_t>(SelectNucleus(kept, threshold), 1));
    total = 0.0;
    for (const Candidate& c : kept) total += c.value;
  }

  total_out = total;
  return kept;
}

}  // namespace

int32_t SampleToken(std::span<const float> logits, const SamplingParams& params, int step) {
  return SampleTokenWithUniform(logits, params, UniformForStep(params.seed, step));
}

int32_t SampleTokenWithUniform(std::span<const float> logits, const SamplingParams& params,
                               double uniform) {
  if (logits.empty()) return 0;
  // Greedy for temperature 0, and for values validation would reject (NaN,
  // negative), so an unvalidated caller still gets a token.
  if (!(params.temperature > 0.0f)) return Argmax(logits);
  double total = 0.0;
  const std::span<Candidate> kept = KeptCandidates(logits, params, total);
  if (kept.empty()) return 0;
  return DrawInIdOrder(kept, uniform * total, logits.size());
}

void SamplingDistribution(std::span<const float> logits, const SamplingParams& params,
                          std::vector<TokenProb>& out) {
  out.clear();
  if (logits.empty()) return;
  if (!(params.temperature > 0.0f)) {
    out.push_back({Argmax(logits), 1.0});
    return;
  }
  double total = 0.0;
  const std::span<Candidate> kept = KeptCandidates(logits, params, total);
  if (kept.empty()) {
    out.push_back({0, 1.0});
    return;
  }
  std::ranges::sort(kept, {}, &Candidate::id);
  for (const Candidate& c : kept) out.push_back({c.id, c.value / total});
}

void FillConstraintMask(const SamplingParams& params, const TokenHistory& history,
                        std::span<const int> eos_ids, int vocab, std::vector<uint32_t>& mask) {
  mask.assign(TokenMaskWords(vocab), 0u);
  const int remaining = params.max_tokens - static_cast<int>(history.generated.size());
  params.constraint->FillMask(history.generated, std::max(remaining, 1), eos_ids, mask);
}

void ApplyLogitsProcessors(std::span<float> logits, const SamplingParams& params,
                           const TokenHistory& history, std::span<const int> eos_ids) {
  const int32_t vocab = static_cast<int32_t>(logits.size());
  if (params.repetition_penalty != 1.0f) {
    // Each distinct token once: mark, then penalise the marked.
    thread_local std::vector<uint8_t> seen;
    seen.assign(logits.size(), 0);
    for (auto part : {history.prompt, history.generated}) {
      for (int32_t t : part) {
        if (t >= 0 && t < vocab) seen[t] = 1;
      }
    }
    const float p = params.repetition_penalty;
    for (int32_t t = 0; t < vocab; ++t) {
      if (seen[t]) logits[t] = logits[t] > 0 ? logits[t] / p : logits[t] * p;
    }
  }
  if (params.presence_penalty != 0.0f || params.frequency_penalty != 0.0f) {
    thread_local std::vector<int32_t> counts;
    counts.assign(logits.size(), 0);
    for (int32_t t : history.generated) {
      if (t >= 0 && t < vocab) ++counts[t];
    }
    for (int32_t t : history.generated) {
      if (t < 0 || t >= vocab || counts[t] == 0) continue;
      logits[t] -=
          params.presence_penalty + params.frequency_penalty * static_cast<float>(counts[t]);
      counts[t] = 0;  // once per distinct token
    }
  }
  if (static_cast<int>(history.generated.size()) < params.min_tokens) {
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    if (!params.ignore_eos) {
      for (int eos : eos_ids) {
        if (eos >= 0 && eos < vocab) logits[eos] = kMasked;
      }
    }
    for (int32_t stop : params.stop_token_ids) {
      if (stop >= 0 && stop < vocab) logits[stop] = kMasked;
    }
  }
  if (params.constraint != nullptr) {
    thread_local std::vector<uint32_t> mask;
    FillConstraintMask(params, history, eos_ids, vocab, mask);
    constexpr float kMasked = -std::numeric_limits<float>::infinity();
    for (int32_t w = 0; w * 32 < vocab; ++w) {
      const uint32_t bits = mask[w];
      if (bits == ~0u) continue;
      const int32_t end = std::min(vocab, (w + 1) * 32);
      for (int32_t t = w * 32; t < end; ++t) {
        if (((bits >> (t & 31)) & 1u) == 0) logits[t] = kMasked;
      }
    }
  }
}

SampledToken Sample(std::span<const float> logits, const SamplingParams& params,
                    const TokenHistory& history, std::span<const int> eos_ids,
                    std::vector<float>& scratch) {
  const int step = static_cast<int>(history.generated.size());
  const bool masks_eos = step < params.min_tokens;
  SampledToken out;
  if (params.HasPenalties() || masks_eos || params.constraint != nullptr) {
    scratch.assign(logits.begin(), logits.end());
    ApplyLogitsProcessors(scratch, params, history, eos_ids);
    out.token = SampleToken(scratch, params, step);
  } else {
    out.token = SampleToken(logits, params, step);
  }
  if (params.logprobs >= 0) FillLogprobs(logits, params.logprobs, out);
  return out;
}

void FillLogprobs(std::span<const float> logits, int num_top, SampledToken& out) {
  out.top.clear();
  if (logits.empty()) return;
  // Log-softmax of the raw logits, in double; NaN counts as -inf.
  const float max_logit = MaxLogit(logits);
  double sum = 0.0;
  if (max_logit > -std::numeric_limits<float>::infinity()) {
    for (float x : logits) {
      if (x == x) sum += std::exp(static_cast<double>(x) - max_logit);
    }
  }
  const double log_z = static_cast<double>(max_logit) + std::log(sum);
  auto logprob = [&](int32_t id) {
    const float x = logits[id];
    return x == x ? static_cast<float>(static_cast<double>(x) - log_z)
                  : -std::numeric_limits<float>::infinity();
  };
  out.logprob = logprob(out.token);
  const size_t n = std::min<size_t>(static_cast<size_t>(std::max(num_top, 0)), logits.size());
  if (n > 0) {
    std::vector<int32_t> ids(n);
    const auto all = std::views::iota(int32_t{0}, static_cast<int32_t>(logits.size()));
    std::ranges::partial_sort_copy(all, ids, [&](int32_t a, int32_t b) {
      const float ka = logprob(a), kb = logprob(b);
      return ka > kb || (ka == kb && a < b);
    });
    for (int32_t id : ids) out.top.push_back({id, logprob(id)});
  }
}

}  // namespace pdserve::engine
