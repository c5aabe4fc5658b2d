// Device sampling (see sampling.cuh). One block of kThreads per row.
//
// Thresholds are found by bisection over the 32-bit ordered key of the
// logits, each step a deterministic block reduction (count or mass):
//   top-k: the largest key b with count(key >= b) >= k, then the lowest
//     ids among ties at b;
//   top-p: the largest key b with mass(key >= b) >= threshold, ties alike.
// The draw gives each thread a contiguous run of ids, scans the runs'
// masses in thread order and walks the run holding the target.
#include "engine/cuda/device_utils.cuh"
#include "engine/cuda/sampling.cuh"
#include "engine/runtime/sampling_draw.h"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 256;
constexpr double kTopPSlack = 1e-6;  // engine/runtime/sampler.cc

__device__ __forceinline__ uint32_t KeyOf(float x) {
  return OrderedKey(x != x ? -INFINITY : x);  // NaN sorts as -inf
}

__device__ __forceinline__ float FloatOfKey(uint32_t key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Packs (key, id) so that a larger value means a higher key, then a lower id.
__device__ __forceinline__ unsigned long long Packed(uint32_t key, int id) {
  return (static_cast<unsigned long long>(key) << 32) | (0xffffffffu - static_cast<uint32_t>(id));
}
__device__ __forceinline__ int IdOf(unsigned long long packed) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(packed));
}

// The kept-set predicate, built up stage by stage (every thread holds the
// same copy).
struct Filter {
  const float* x;
  int vocab;
  bool inf_mode;     // the max logit is +inf: only +inf logits, mass 1 each
  double inv_t;      // 1 / temperature
  double max_value;  // max logit / temperature (0 in inf_mode)
  bool use_k = false;
  uint32_t k_key = 0;
  int k_cut = 0;  // ties at k_key kept up to this id
  double min_p = 0.0;
  bool use_p = false;
  uint32_t p_key = 0;
  int p_cut = 0;

  __device__ double Value(float v) const {
    return inf_mode ? 1.0 : exp(static_cast<double>(v) * inv_t - max_value);
  }
  // Candidate, within top-k, and a +inf logit in inf_mode.
  __device__ bool Base(int i, float v, uint32_t key) const {
    if (!(v > -INFINITY)) return false;
    if (use_k && !(key > k_key || (key == k_key && i <= k_cut))) return false;
    return !inf_mode || v == INFINITY;
  }
  __device__ bool BeforeTopP(int i, float v, uint32_t key) const {
    return Base(i, v, key) && (min_p <= 0.0 || Value(v) >= min_p);
  }
  __device__ bool Kept(int i, float v, uint32_t key) const {
    return BeforeTopP(i, v, key) && (!use_p || key > p_key || (key == p_key && i <= p_cut));
  }
};

// Count of ids with pred(i, v, key), over the whole row.
template <typename Pred>
__device__ int CountIf(const Filter& f, Pred pred) {
  int n = 0;
  for (int i = threadIdx.x; i < f.vocab; i += blockDim.x) {
    const float v = f.x[i];
    n += pred(i, v, KeyOf(v)) ? 1 : 0;
  }
  return BlockAllReduce(n, SumOp{}, 0);
}

template <typename Pred>
__device__ double MassIf(const Filter& f, Pred pred) {
  double m = 0.0;
  for (int i = threadIdx.x; i < f.vocab; i += blockDim.x) {
    const float v = f.x[i];
    if (pred(i, v, KeyOf(v))) m += f.Value(v);
  }
  return BlockAllReduce(m, SumOp{}, 0.0);
}

// The largest key b with measure(b) >= need, measure non-increasing in b.
template <typename Measure, typename T>
__device__ uint32_t LargestKeyReaching(Measure measure, T need) {
  unsigned long long lo = 0, hi = 0xffffffffull;
  while (lo < hi) {
    const unsigned long long mid = lo + (hi - lo + 1) / 2;
    if (measure(static_cast<uint32_t>(mid)) >= need) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return static_cast<uint32_t>(lo);
}

// The r-th smallest id (r >= 1) with in_set(i, v, key) and key == `key`.
template <typename InSet>
__device__ int NthTieId(const Filter& f, InSet in_set, uint32_t key, int r) {
  int lo = 0, hi = f.vocab - 1;
  while (lo < hi) {
    const int mid = lo + (hi - lo) / 2;
    const int n = CountIf(
        f, [&](int i, float v, uint32_t k) { return i <= mid && k == key && in_set(i, v, k); });
    if (n >= r) {
      hi = mid;
    } else {
      lo = mid + 1;
    }
  }
  return lo;
}

// Greedy token of the row and its max logit.
__device__ int Argmax(const float* x, int vocab, float* max_logit) {
  unsigned long long best = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const unsigned long long p = Packed(KeyOf(x[i]), i);
    best = p > best ? p : best;
  }
  best = BlockAllReduce(best, MaxOp{}, 0ull);
  *max_logit = FloatOfKey(static_cast<uint32_t>(best >> 32));
  return *max_logit == -INFINITY ? 0 : IdOf(best);
}

__global__ void SampleGreedyKernel(const float* logits, int vocab, int32_t* tokens) {
  float max_logit;
  const int token = Argmax(logits + int64_t{blockIdx.x} * vocab, vocab, &max_logit);
  if (threadIdx.x == 0) tokens[blockIdx.x] = token;
}

__global__ void SampleKernel(const float* logits, int vocab, const DeviceSamplingParams* params,
                             int32_t* tokens) {
  const DeviceSamplingParams p = params[blockIdx.x];
  Filter f;
  f.x = logits + int64_t{blockIdx.x} * vocab;
  f.vocab = vocab;
  float max_logit;
  const int greedy = Argmax(f.x, vocab, &max_logit);
  if (!(p.temperature > 0.0f) || max_logit == -INFINITY) {
    if (threadIdx.x == 0) tokens[blockIdx.x] = greedy;
    return;
  }
  f.inf_mode = max_logit == INFINITY;
  f.inv_t = 1.0 / static_cast<double>(p.temperature);
  f.max_value = f.inf_mode ? 0.0 : static_cast<double>(max_logit) * f.inv_t;

  // top-k among the candidates.
  const int candidates = CountIf(f, [](int, float v, uint32_t) { return v > -INFINITY; });
  if (p.top_k > 0 && p.top_k < candidates) {
    const auto is_candidate = [](int, float v, uint32_t) { return v > -INFINITY; };
    f.k_key = LargestKeyReaching(
        [&](uint32_t b) {
          return CountIf(
              f, [&](int i, float v, uint32_t k) { return k >= b && is_candidate(i, v, k); });
        },
        p.top_k);
    const int above = CountIf(
        f, [&](int i, float v, uint32_t k) { return k > f.k_key && is_candidate(i, v, k); });
    f.k_cut = NthTieId(f, is_candidate, f.k_key, p.top_k - above);
    f.use_k = true;
  }

  // min-p (not with +inf logits: their values are all 1).
  if (p.min_p > 0.0f && !f.inf_mode) f.min_p = static_cast<double>(p.min_p);
  const auto before_top_p = [&](int i, float v, uint32_t k) { return f.BeforeTopP(i, v, k); };
  double total = MassIf(f, before_top_p);

  // top-p: the shortest prefix in (value desc, id asc) order reaching the
  // threshold; values fall with the key, so prefixes are key ranges.
  if (p.top_p < 1.0f && CountIf(f, before_top_p) > 1) {
    // A zero threshold (top_p that underflows) keeps the single best, as the
    // CPU's nucleus of at least one.
    const double threshold =
        fmax(1e-300, static_cast<double>(p.top_p) * total * (1.0 - kTopPSlack));
    f.p_key = LargestKeyReaching(
        [&](uint32_t b) {
          return MassIf(
              f, [&](int i, float v, uint32_t k) { return k >= b && before_top_p(i, v, k); });
        },
        threshold);
    const double above =
        MassIf(f, [&](int i, float v, uint32_t k) { return k > f.p_key && before_top_p(i, v, k); });
    const int ties = CountIf(
        f, [&](int i, float v, uint32_t k) { return k == f.p_key && before_top_p(i, v, k); });
    // Ties share one value: take the fewest that reach the threshold.
    const double w = f.Value(FloatOfKey(f.p_key));
    int r = 1;
    while (r < ties && above + r * w < threshold) ++r;
    f.p_cut = NthTieId(f, before_top_p, f.p_key, r);
    f.use_p = true;
    total = MassIf(f, [&](int i, float v, uint32_t k) { return f.Kept(i, v, k); });
  }

  // Inverse CDF over the kept ids in ascending order.
  const double target = engine::UniformForStep(p.seed, p.step) * total;
  const int run = (vocab + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
  const int begin = static_cast<int>(threadIdx.x) * run;
  const int end = begin + run < vocab ? begin + run : vocab;
  double mass = 0.0;
  for (int i = begin; i < end; ++i) {
    const float v = f.x[i];
    if (f.Kept(i, v, KeyOf(v))) mass += f.Value(v);
  }
  __shared__ double before[kThreads];
  before[threadIdx.x] = mass;
  __syncthreads();
  if (threadIdx.x == 0) {
    double cum = 0.0;
    for (unsigned t = 0; t < blockDim.x; ++t) {
      const double m = before[t];
      before[t] = cum;
      cum += m;
    }
  }
  __syncthreads();
  double cum = before[threadIdx.x];
  int found = vocab, last = -1;
  for (int i = begin; i < end; ++i) {
    const float v = f.x[i];
    if (!f.Kept(i, v, KeyOf(v))) continue;
    cum += f.Value(v);
    if (found == vocab && target < cum) found = i;
    last = i;
  }
  found = BlockAllReduce(found, MinOp{}, vocab);
  last = BlockAllReduce(last, MaxOp{}, -1);
  if (threadIdx.x == 0) tokens[blockIdx.x] = found < vocab ? found : last;
}

__global__ void ApplyPenaltiesKernel(float* logits, int vocab, PenaltyArgs a) {
  float* x = logits + int64_t{blockIdx.x} * vocab;
  const DevicePenalty pen = a.params[blockIdx.x];
  // Each listed id is distinct: one thread owns each logit it changes.
  for (int i = a.offsets[blockIdx.x] + threadIdx.x; i < a.offsets[blockIdx.x + 1];
       i += blockDim.x) {
    const int t = a.tokens[i];
    if (t < 0 || t >= vocab) continue;
    float v = x[t];
    if (pen.repetition != 1.0f) {
      v = v > 0.0f ? __fdiv_rn(v, pen.repetition) : __fmul_rn(v, pen.repetition);
    }
    if ((pen.presence != 0.0f || pen.frequency != 0.0f) && a.counts[i] > 0) {
      v = __fsub_rn(
          v, __fadd_rn(pen.presence, __fmul_rn(pen.frequency, static_cast<float>(a.counts[i]))));
    }
    x[t] = v;
  }
  __syncthreads();  // masks come last
  for (int i = a.mask_offsets[blockIdx.x] + threadIdx.x; i < a.mask_offsets[blockIdx.x + 1];
       i += blockDim.x) {
    const int t = a.mask_tokens[i];
    if (t >= 0 && t < vocab) x[t] = -INFINITY;
  }
}

__global__ void LogprobsKernel(const float* logits, int vocab, const int32_t* tokens, int top_n,
                               float* token_logprobs, int32_t* top_ids, float* top_logprobs) {
  const float* x = logits + int64_t{blockIdx.x} * vocab;
  float max_logit = -INFINITY;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (x[i] == x[i]) max_logit = fmaxf(max_logit, x[i]);
  }
  max_logit = BlockAllReduce(max_logit, MaxOp{}, -INFINITY);
  double sum = 0.0;
  if (max_logit > -INFINITY) {
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      if (x[i] == x[i]) sum += exp(static_cast<double>(x[i]) - max_logit);
    }
  }
  sum = BlockAllReduce(sum, SumOp{}, 0.0);
  const double log_z = static_cast<double>(max_logit) + log(sum);
  const auto logprob = [&](int id) {
    const float v = x[id];
    return v == v ? static_cast<float>(static_cast<double>(v) - log_z) : -INFINITY;
  };
  if (threadIdx.x == 0) token_logprobs[blockIdx.x] = logprob(tokens[blockIdx.x]);
  // top_n rounds of (logprob desc, id asc) selection, skipping earlier picks.
  __shared__ int picked[kMaxTopLogprobs];
  for (int n = 0; n < top_n; ++n) {
    unsigned long long best = 0;
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      bool taken = false;
      for (int j = 0; j < n; ++j) taken = taken || picked[j] == i;
      if (taken) continue;
      const unsigned long long key = Packed(KeyOf(logprob(i)), i);
      best = key > best ? key : best;
    }
    best = BlockAllReduce(best, MaxOp{}, 0ull);
    const int id = IdOf(best);
    if (threadIdx.x == 0) {
      picked[n] = id;
      top_ids[int64_t{blockIdx.x} * top_n + n] = id;
      top_logprobs[int64_t{blockIdx.x} * top_n + n] = logprob(id);
    }
    __syncthreads();  // picked[n] visible to every thread
  }
}

}  // namespace

cudaError_t SampleGreedy(const float* logits, int rows, int vocab, int32_t* tokens,
                         cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  return Launch(SampleGreedyKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, logits,
                vocab, tokens);
}

cudaError_t SampleTokens(const float* logits, int rows, int vocab,
                         const DeviceSamplingParams* params, int32_t* tokens, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0) return cudaErrorInvalidValue;
  return Launch(SampleKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, logits, vocab,
                params, tokens);
}

cudaError_t ApplyPenalties(float* logits, int rows, int vocab, const PenaltyArgs& args,
                           cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return Launch(ApplyPenaltiesKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, logits,
                vocab, args);
}

cudaError_t ComputeLogprobs(const float* logits, int rows, int vocab, const int32_t* tokens,
                            int top_n, float* token_logprobs, int32_t* top_ids, float* top_logprobs,
                            cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  if (vocab <= 0 || top_n < 0 || top_n > kMaxTopLogprobs || top_n > vocab) {
    return cudaErrorInvalidValue;
  }
  return Launch(LogprobsKernel, {static_cast<unsigned>(rows), kThreads, 0, stream}, logits, vocab,
                tokens, top_n, token_logprobs, top_ids, top_logprobs);
}

}  // namespace pdserve::cuda
