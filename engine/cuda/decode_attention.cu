// Paged split-K decode attention (see decode_attention.cuh).
//
// Block (kv head g, sequence b, partition s), kThreads threads, dynamic
// shared memory: the group's q vectors [G, D] fp32, scores [G, P] fp32,
// the partition's cache slots [P] and per-head (max, sum) [G, 2].
//   1. warps take keys in turn; per key, each lane dots a strided slice of
//      D for every head of the group and the warp reduces: scores;
//   2. one warp per head: max and exp-sum of the partition's scores;
//   3. threads take (head, d) outputs: sum_j p_j V[j, d]; one partition
//      writes out directly, several write (acc, max, sum) to the workspace
//      and a combine block per (sequence, head) merges them.
#include "engine/cuda/decode_attention.cuh"
#include "engine/cuda/device_utils.cuh"

namespace pdserve::cuda {
namespace {

constexpr unsigned kThreads = 128;
constexpr int kDefaultPartition = 256;
constexpr size_t kSharedBudget = 48 << 10;  // no opt-in needed

struct Plan {
  int group = 0;       // q heads per kv head
  int partition = 0;   // keys per partition
  int partitions = 0;  // per sequence, at most
  size_t shared_bytes = 0;
};

size_t SharedBytes(int group, int head_dim, int partition) {
  const size_t g = static_cast<size_t>(group);
  return (g * head_dim + g * partition + 2 * g) * sizeof(float) +
         static_cast<size_t>(partition) * sizeof(int32_t);
}

bool MakePlan(const DecodeAttentionArgs& a, Plan* plan) {
  if (a.q_heads <= 0 || a.kv_heads <= 0 || a.q_heads % a.kv_heads != 0 || a.head_dim <= 0 ||
      a.block_size <= 0 || a.max_context <= 0) {
    return false;
  }
  plan->group = a.q_heads / a.kv_heads;
  int p = a.partition_size > 0 ? a.partition_size : kDefaultPartition;
  while (p > kWarpSize && SharedBytes(plan->group, a.head_dim, p) > kSharedBudget) p /= 2;
  if (SharedBytes(plan->group, a.head_dim, p) > kSharedBudget) return false;
  plan->partition = p;
  const int visible =
      a.sliding_window > 0 && a.sliding_window < a.max_context ? a.sliding_window : a.max_context;
  plan->partitions = (visible + p - 1) / p;
  plan->shared_bytes = SharedBytes(plan->group, a.head_dim, p);
  return true;
}

// First visible key of a query at position p (the CPU runner's FirstVisible).
__device__ __forceinline__ int FirstVisible(int p, int window) {
  return window > 0 && p >= window ? p - window + 1 : 0;
}

template <typename T>
__global__ void DecodeAttentionKernel(const T* q, DecodeAttentionArgs a, Plan plan) {
  const int g = blockIdx.x, b = blockIdx.y, s = blockIdx.z;
  const int G = plan.group, D = a.head_dim, P = plan.partition;
  const int p = a.positions[b];
  const int first = FirstVisible(p, a.sliding_window);
  const int parts = (p + 1 - first + P - 1) / P;
  if (s >= parts) return;  // the whole block: this sequence is shorter
  const int k0 = first + s * P;
  const int n = p + 1 - k0 < P ? p + 1 - k0 : P;
  const int kv_size = a.kv_heads * D;
  const unsigned lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const unsigned warps = blockDim.x / kWarpSize;

  PDSERVE_DYNAMIC_SHARED(float, q_s);                          // [G * D]
  float* scores = q_s + G * D;                                 // [G * P]
  float* stats = scores + G * P;                               // [2 * G]: max, sum
  int32_t* slots = reinterpret_cast<int32_t*>(stats + 2 * G);  // [P]

  const T* qb = q + int64_t{b} * a.q_stride + int64_t{g} * G * D;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) q_s[i] = ToFloat(qb[i]);
  const int32_t* table = a.block_tables + int64_t{b} * a.block_table_stride;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const int key = k0 + t;
    slots[t] = table[key / a.block_size] * a.block_size + key % a.block_size;
  }
  __syncthreads();

  for (int t = warp; t < n; t += warps) {
    const __nv_bfloat16* k = a.k_cache + int64_t{slots[t]} * kv_size + int64_t{g} * D;
    for (int j = 0; j < G; ++j) {
      float dot = 0.0f;
      for (int d = lane; d < D; d += kWarpSize) dot += q_s[j * D + d] * __bfloat162float(k[d]);
      dot = WarpAllReduce(dot, SumOp{});
      if (lane == 0) scores[j * P + t] = dot * a.scale;
    }
  }
  __syncthreads();

  for (int j = warp; j < G; j += warps) {
    float m = -INFINITY;
    for (int t = lane; t < n; t += kWarpSize) m = fmaxf(m, scores[j * P + t]);
    m = WarpAllReduce(m, MaxOp{});
    float l = 0.0f;
    for (int t = lane; t < n; t += kWarpSize) {
      const float e = expf(scores[j * P + t] - m);
      scores[j * P + t] = e;
      l += e;
    }
    l = WarpAllReduce(l, SumOp{});
    if (lane == 0) {
      stats[2 * j] = m;
      stats[2 * j + 1] = l;
    }
  }
  __syncthreads();

  const int64_t ws_row = (int64_t{b} * a.q_heads + int64_t{g} * G) * plan.partitions + s;
  float* ws_acc = static_cast<float*>(a.workspace);
  float* ws_stats = ws_acc + int64_t{a.batch} * a.q_heads * plan.partitions * D;
  for (int i = threadIdx.x; i < G * D; i += blockDim.x) {
    const int j = i / D, d = i % D;
    float acc = 0.0f;
    for (int t = 0; t < n; ++t) {
      acc += scores[j * P + t] *
             __bfloat162float(a.v_cache[int64_t{slots[t]} * kv_size + int64_t{g} * D + d]);
    }
    if (parts == 1) {
      a.out[int64_t{b} * a.out_stride + int64_t{g * G + j} * D + d] =
          __float2bfloat16(acc / stats[2 * j + 1]);
    } else {
      const int64_t row = ws_row + int64_t{j} * plan.partitions;  // (b, g*G + j, s)
      ws_acc[row * D + d] = acc;
      if (d == 0) {
        ws_stats[2 * row] = stats[2 * j];
        ws_stats[2 * row + 1] = stats[2 * j + 1];
      }
    }
  }
}

// One block per (q head, sequence): merges the partitions' partial results.
__global__ void DecodeAttentionCombineKernel(DecodeAttentionArgs a, Plan plan) {
  const int h = blockIdx.x, b = blockIdx.y, D = a.head_dim;
  const int p = a.positions[b];
  const int parts =
      (p + 1 - FirstVisible(p, a.sliding_window) + plan.partition - 1) / plan.partition;
  if (parts <= 1) return;  // written directly
  const float* ws_acc = static_cast<const float*>(a.workspace);
  const float* ws_stats = ws_acc + int64_t{a.batch} * a.q_heads * plan.partitions * D;
  const int64_t row0 = (int64_t{b} * a.q_heads + h) * plan.partitions;
  float m = -INFINITY;
  for (int s = 0; s < parts; ++s) m = fmaxf(m, ws_stats[2 * (row0 + s)]);
  float l = 0.0f;
  for (int s = 0; s < parts; ++s) {
    l += ws_stats[2 * (row0 + s) + 1] * expf(ws_stats[2 * (row0 + s)] - m);
  }
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int s = 0; s < parts; ++s) {
      o += ws_acc[(row0 + s) * D + d] * expf(ws_stats[2 * (row0 + s)] - m);
    }
    a.out[int64_t{b} * a.out_stride + int64_t{h} * D + d] = __float2bfloat16(o / l);
  }
}

template <typename T>
cudaError_t Run(const T* q, const DecodeAttentionArgs& a, cudaStream_t stream) {
  if (a.batch <= 0) return cudaSuccess;
  Plan plan;
  if (!MakePlan(a, &plan)) return cudaErrorInvalidValue;
  if (plan.partitions > 1 && a.workspace == nullptr) return cudaErrorInvalidValue;
  const dim3 grid(a.kv_heads, a.batch, plan.partitions);
  if (const cudaError_t e =
          Launch(DecodeAttentionKernel<T>, {grid, kThreads, plan.shared_bytes, stream}, q, a, plan);
      e != cudaSuccess) {
    return e;
  }
  if (plan.partitions == 1) return cudaSuccess;
  return Launch(DecodeAttentionCombineKernel, {dim3(a.q_heads, a.batch), kThreads, 0, stream}, a,
                plan);
}

}  // namespace

size_t DecodeAttentionWorkspaceBytes(const DecodeAttentionArgs& a) {
  Plan plan;
  if (!MakePlan(a, &plan) || plan.partitions <= 1) return 0;
  const size_t rows = size_t(a.batch) * a.q_heads * plan.partitions;
  return rows * (a.head_dim + 2) * sizeof(float);
}

cudaError_t DecodeAttention(const float* q, const DecodeAttentionArgs& args, cudaStream_t stream) {
  return Run(q, args, stream);
}
cudaError_t DecodeAttention(const __nv_bfloat16* q, const DecodeAttentionArgs& args,
                            cudaStream_t stream) {
  return Run(q, args, stream);
}

}  // namespace pdserve::cuda
