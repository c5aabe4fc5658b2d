// WeightMatrix: storage and matmul dispatch; see weight_matrix.h.
#include "engine/cpu/weight_matrix.h"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemm_float.h"
#include "engine/cpu/kernels_gemm_int8.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/kernels_int4.h"

namespace pdserve::engine::cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Matrices up to kSlabBytes / 4 share slabs of kSlabBytes; larger ones get a
// mapping of their own.
constexpr size_t kSlabBytes = size_t{32} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

// `size` bytes (a multiple of kHugePage) from a fresh mapping, 2 MiB-aligned
// and advised huge before anything touches them, or nullptr. Heap memory
// would not do: pages a freed buffer already faulted in stay 4 KiB pages
// whatever madvise says later, and a weight stream over 4 KiB pages ran at
// about half the rate (docs/performance.md). Where transparent huge pages
// are off or not built in, madvise fails or is a no-op and the mapping keeps
// 4 KiB pages.
std::byte* MapHuge(size_t size) {
  void* raw =
      mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  // Trim the mapping to a 2 MiB-aligned range of `size` bytes.
  auto* begin = static_cast<std::byte*>(raw);
  const size_t head =
      RoundUp(reinterpret_cast<uintptr_t>(begin), kHugePage) - reinterpret_cast<uintptr_t>(begin);
  if (head > 0) munmap(begin, head);
  munmap(begin + head + size, kHugePage - head);  // head < kHugePage
  madvise(begin + head, size, MADV_HUGEPAGE);     // advice only: failure is fine
  return begin + head;
}

}  // namespace

// Small matrices packed into shared huge-page slabs: a model's many small
// projections (an int8 k_proj of 768 x 256 is 200 KB) would otherwise sit
// on 4 KiB heap pages, or each round up to a 2 MiB mapping of its own. A
// slab is handed out front to back and unmapped when its last matrix is
// freed and it is no longer the one being filled.
struct WeightSlab {
  std::byte* base = nullptr;
  size_t used = 0;
  int live = 0;  // matrices in it not yet freed
};

namespace {

std::mutex slab_mutex;
WeightSlab* filling_slab = nullptr;  // guarded by slab_mutex

}  // namespace

const char* StorageName(WeightMatrix::Storage storage) {
  switch (storage) {
    case WeightMatrix::Storage::kF32:
      return "f32";
    case WeightMatrix::Storage::kBf16:
      return "bf16";
    case WeightMatrix::Storage::kInt8:
      return "int8";
    case WeightMatrix::Storage::kInt4:
      return "int4";
  }
  return "unknown";
}

void WeightMatrix::Free::operator()(std::byte* p) const {
  if (slab != nullptr) {
    std::lock_guard<std::mutex> lock(slab_mutex);
    if (--slab->live == 0 && slab != filling_slab) {
      munmap(slab->base, kSlabBytes);
      delete slab;
    }
  } else if (mapped_bytes > 0) {
    munmap(p, mapped_bytes);
  } else {
    std::free(p);
  }
}

std::unique_ptr<std::byte, WeightMatrix::Free> WeightMatrix::AllocateStorage(size_t bytes) {
  if (bytes <= kSlabBytes / 4) {
    const size_t need = RoundUp(std::max<size_t>(bytes, 1), 256);
    std::lock_guard<std::mutex> lock(slab_mutex);
    if (filling_slab == nullptr || filling_slab->used + need > kSlabBytes) {
      std::byte* base = MapHuge(kSlabBytes);
      if (base != nullptr) {
        if (filling_slab != nullptr && filling_slab->live == 0) {
          munmap(filling_slab->base, kSlabBytes);
          delete filling_slab;
        }
        filling_slab = new WeightSlab{base, 0, 0};
      }
    }
    if (filling_slab != nullptr && filling_slab->used + need <= kSlabBytes) {
      std::byte* p = filling_slab->base + filling_slab->used;
      filling_slab->used += need;
      ++filling_slab->live;
      return std::unique_ptr<std::byte, Free>(p, Free{0, filling_slab});
    }
  } else {
    const size_t size = RoundUp(bytes, kHugePage);
    if (std::byte* p = MapHuge(size))
      return std::unique_ptr<std::byte, Free>(p, Free{size, nullptr});
  }
  // The mapping failed: the heap serves (64-byte aligned, 4 KiB pages).
  void* p = std::aligned_alloc(64, RoundUp(std::max<size_t>(bytes, 1), 64));
  if (p == nullptr) throw std::bad_alloc();
  return std::unique_ptr<std::byte, Free>(static_cast<std::byte*>(p), Free{0, nullptr});
}

void WeightMatrix::Allocate(Storage storage, int64_t rows, int64_t cols) {
  storage_ = storage;
  rows_ = rows;
  cols_ = cols;
  const size_t n = static_cast<size_t>(rows * cols);
  size_t bytes = 0;
  switch (storage) {
    case Storage::kF32:
      bytes = n * sizeof(float);
      break;
    case Storage::kBf16:
      bytes = n * sizeof(uint16_t);
      break;
    case Storage::kInt8:
      scales_offset_ = static_cast<int64_t>(RoundUp(n, 64));
      bytes = static_cast<size_t>(scales_offset_) +
              static_cast<size_t>(rows * Int8Groups(cols)) * sizeof(float);
      break;
    case Storage::kInt4:
      scales_offset_ =
          static_cast<int64_t>(RoundUp(static_cast<size_t>(rows * Int4RowBytes(cols)), 64));
      bytes = static_cast<size_t>(scales_offset_) +
              static_cast<size_t>(rows * Int8Groups(cols)) * sizeof(uint16_t);
      break;
  }
  data_ = AllocateStorage(bytes);
}

WeightMatrix WeightMatrix::FromF32(std::span<const float> values, int64_t rows, int64_t cols,
                                   WeightDtype dtype) {
  WeightMatrix w;
  const int64_t n = rows * cols;
  if (dtype == WeightDtype::kAuto) {
    dtype = IsBf16Exact(values.data(), n) ? WeightDtype::kBf16 : WeightDtype::kF32;
  }
  switch (dtype) {
    case WeightDtype::kAuto:  // resolved above
    case WeightDtype::kF32:
      w.Allocate(Storage::kF32, rows, cols);
      std::memcpy(w.data_.get(), values.data(), static_cast<size_t>(n) * sizeof(float));
      break;
    case WeightDtype::kBf16: {
      w.Allocate(Storage::kBf16, rows, cols);
      auto* out = reinterpret_cast<uint16_t*>(w.data_.get());
      for (int64_t i = 0; i < n; ++i) out[i] = FloatToBf16(values[i]);
      break;
    }
    case WeightDtype::kInt8:
    case WeightDtype::kW8A8:
      w.Allocate(Storage::kInt8, rows, cols);
      QuantizeInt8(values.data(), rows, cols, reinterpret_cast<int8_t*>(w.data_.get()),
                   reinterpret_cast<float*>(w.data_.get() + w.scales_offset_));
      w.quantize_activations_ = dtype == WeightDtype::kW8A8;
      break;
    case WeightDtype::kInt4:
      w.Allocate(Storage::kInt4, rows, cols);
      QuantizeInt4(values.data(), rows, cols, reinterpret_cast<uint8_t*>(w.data_.get()),
                   reinterpret_cast<uint16_t*>(w.data_.get() + w.scales_offset_));
      break;
  }
  return w;
}

absl::StatusOr<WeightMatrix> WeightMatrix::FromRaw(StDtype src, std::span<const std::byte> bytes,
                                                   int64_t rows, int64_t cols, WeightDtype dtype) {
  if (src != StDtype::kF32 && src != StDtype::kF16 && src != StDtype::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat("WeightMatrix: cannot read ",
                                                   std::string(StDtypeName(src)),
                                                   " values (F32, F16 or BF16 only)"));
  }
  const int64_t n = rows * cols;
  if (rows < 0 || cols < 0 || static_cast<int64_t>(bytes.size()) != n * StDtypeBytes(src)) {
    return absl::InvalidArgumentError(absl::StrCat("WeightMatrix: ", bytes.size(),
                                                   " bytes do not hold ", rows, " x ", cols, " ",
                                                   std::string(StDtypeName(src)), " values"));
  }
  if (src == StDtype::kBF16 && (dtype == WeightDtype::kAuto || dtype == WeightDtype::kBf16)) {
    WeightMatrix w;
    w.Allocate(Storage::kBf16, rows, cols);
    std::memcpy(w.data_.get(), bytes.data(), bytes.size());
    return w;
  }
  std::vector<float> values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* p = bytes.data() + i * StDtypeBytes(src);
    if (src == StDtype::kF32) {
      std::memcpy(&values[i], p, sizeof(float));
    } else {
      uint16_t bits;
      std::memcpy(&bits, p, sizeof bits);
      values[i] = src == StDtype::kBF16 ? engine::Bf16ToFloat(bits) : HalfToFloat(bits);
    }
  }
  return FromF32(values, rows, cols, dtype);
}

int64_t WeightMatrix::bytes() const {
  const int64_t n = rows_ * cols_;
  switch (storage_) {
    case Storage::kF32:
      return n * static_cast<int64_t>(sizeof(float));
    case Storage::kBf16:
      return n * static_cast<int64_t>(sizeof(uint16_t));
    case Storage::kInt8:
      return n + rows_ * Int8Groups(cols_) * static_cast<int64_t>(sizeof(float));
    case Storage::kInt4:
      return rows_ *
             (Int4RowBytes(cols_) + Int8Groups(cols_) * static_cast<int64_t>(sizeof(uint16_t)));
  }
  return 0;
}

void WeightMatrix::RowsToFloat(int64_t first, int64_t count, float* out) const {
  const int64_t at = first * cols_, n = count * cols_;
  switch (storage_) {
    case Storage::kF32:
      std::memcpy(out, f32() + at, static_cast<size_t>(n) * sizeof(float));
      return;
    case Storage::kBf16:
      cpu::Bf16ToFloat(bf16() + at, out, n);
      return;
    case Storage::kInt8:
      DequantizeInt8(int8() + at, scales() + first * Int8Groups(cols_), count, cols_, out);
      return;
    case Storage::kInt4:
      DequantizeInt4(int4() + first * Int4RowBytes(cols_),
                     half_scales() + first * Int8Groups(cols_), count, cols_, out);
      return;
  }
}

void WeightMatrix::BlockGemm(const float* x, float* y, int m, int64_t first, int64_t count) const {
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  if (storage_ == Storage::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(count), k, 1.0f, x, k,
                f32() + first * k, k, 0.0f, y + first, n);
    return;
  }
  // Rows expanded to fp32 at a time: about 256 KiB, which stays in L2; for
  // prefill-sized products (more than kManyGemvRows rows of x) 2 MiB, since
  // sgemm packs all of x again per call (with 256 KiB blocks, 10% of a
  // 512-token bf16 prefill on a Zen 3 EPYC went to that packing).
  const int64_t block_floats = m > kManyGemvRows ? int64_t{1} << 19 : int64_t{1} << 16;
  const int64_t chunk = std::max<int64_t>(16, block_floats / std::max(1, k));
  thread_local std::vector<float> expanded;
  expanded.resize(static_cast<size_t>(chunk * k));
  for (int64_t c0 = 0; c0 < count; c0 += chunk) {
    const int64_t cb = std::min(chunk, count - c0);
    RowsToFloat(first + c0, cb, expanded.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(cb), k, 1.0f, x, k,
                expanded.data(), k, 0.0f, y + first + c0, n);
  }
}

void WeightMatrix::GemvRows(const float* x, const RoundedX& rounded, float* y, int first,
                            int count) const {
  const int k = static_cast<int>(cols_);
  const int64_t at = int64_t{first} * k;
  const Isa isa = BestIsa();
  switch (storage_) {
    case Storage::kF32:
      return GemvF32(f32() + at, x, y + first, count, k, isa);
    case Storage::kBf16:
      return GemvBf16(bf16() + at, x, y + first, count, k, isa);
    case Storage::kInt8: {
      const float* s = scales() + first * Int8Groups(k);
      if (quantize_activations_) {
        return GemvInt8Act(int8() + at, s, rounded.x8, y + first, count, k, isa);
      }
      return GemvInt8(int8() + at, s, rounded.x16, y + first, count, k, isa);
    }
    case Storage::kInt4:
      return GemvInt4(int4() + first * Int4RowBytes(k), half_scales() + first * Int8Groups(k),
                      rounded.x4, y + first, count, k, isa);
  }
}

bool WeightMatrix::UsesInt8Gemm(int m) const {
  // int4 and w8a8 from 2 rows: their activations are rounded to int8 at
  // every m, so the GEMM multiplies what the GEMV does; int8's rows of a
  // verification step keep the GEMV's 16-bit rounding (the sgemm path).
  if (storage_ == Storage::kInt4) return m > 1;
  if (storage_ != Storage::kInt8) return false;
  return quantize_activations_ ? m > 1 : m > kManyGemvRows;
}

bool WeightMatrix::UsesFloatPanels(int m) const {
  return (storage_ == Storage::kF32 || storage_ == Storage::kBf16) && m > kManyGemvRows &&
         HasFloatGemmPanels();
}

void WeightMatrix::SplitRows(int m, int chunk, int num_threads, WorkPool* pool,
                             absl::FunctionRef<void(int, int)> rows) const {
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  if (pool != nullptr && pool->num_threads() > 1) {
    // Chunks claimed as threads come free: a descheduled thread delays the
    // product by one chunk.
    pool->ParallelFor((n + chunk - 1) / chunk, [&](int64_t c) {
      const int first = static_cast<int>(c) * chunk;
      rows(first, std::min(chunk, n - first));
    });
    return;
  }
  const int threads = MatMulThreads(m, n, k, num_threads);
  if (threads == 1) return rows(0, n);
  const int block = ((n + threads - 1) / threads + chunk - 1) / chunk * chunk;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int n0 = 0; n0 < n; n0 += block) rows(n0, std::min(block, n - n0));
}

void WeightMatrix::Int8Gemm(const float* x, float* y, int m, int num_threads,
                            WorkPool* pool) const {
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  // Quantized once, here, before the threads split the rows; the threads
  // read this thread's buffer.
  thread_local Int8ActivationRows quantized;
  QuantizeActivationRows(x, m, k, quantized);
  const Int8ActivationRows& act = quantized;
  const Isa isa = BestIsa();
  const int64_t groups = Int8Groups(k);
  // Chunks of 64 rows: the kernel's repacking unit.
  SplitRows(m, 64, num_threads, pool, [&](int first, int count) {
    if (storage_ == Storage::kInt8) {
      return GemmInt8(int8() + int64_t{first} * k, scales() + first * groups, count, act, y + first,
                      n, isa);
    }
    // int4: a chunk's nibbles widened to int8 values and its fp16 scales to
    // fp32 (both exact), then the same GEMM.
    thread_local AlignedVector<int8_t> values;
    thread_local std::vector<float> value_scales;
    values.resize(static_cast<size_t>(count) * k);
    value_scales.resize(static_cast<size_t>(count * groups));
    Int4ToInt8(int4() + first * Int4RowBytes(k), half_scales() + first * groups, count, k,
               values.data(), value_scales.data());
    GemmInt8(values.data(), value_scales.data(), count, act, y + first, n, isa);
  });
}

void WeightMatrix::FloatPanelsGemm(const float* x, float* y, int m, int num_threads,
                                   WorkPool* pool) const {
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  // Chunks of 128 rows: the kernel's repacking unit.
  SplitRows(m, 128, num_threads, pool, [&](int first, int count) {
    if (storage_ == Storage::kF32) {
      GemmF32Panels(f32() + int64_t{first} * k, count, k, x, k, m, y + first, n);
    } else {
      GemmBf16Panels(bf16() + int64_t{first} * k, count, k, x, k, m, y + first, n);
    }
  });
}

void WeightMatrix::MatMul(const float* x, float* y, int m, int num_threads, WorkPool* pool) const {
  if (m == 0 || rows_ == 0) return;
  // Prefill-sized products (more than kManyGemvRows rows): the GEMMs of
  // kernels_gemm_int8.h and kernels_gemm_float.h.
  if (UsesInt8Gemm(m)) return Int8Gemm(x, y, m, num_threads, pool);
  if (UsesFloatPanels(m)) return FloatPanelsGemm(x, y, m, num_threads, pool);
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  // int8 and int4 storage: the activations rounded once, here, before the
  // threads split the rows (to int8 for w8a8 and int4, else to 16-bit
  // integers); the threads
  // read the caller's buffers. At m > 1 each row is rounded as the GEMV
  // rounds it and the fp32 sgemm path multiplies those values: the same
  // products up to fp32 summation order.
  // (References: a lambda naming a thread_local reads the running thread's
  // own; the pool's threads must read this thread's.)
  thread_local RoundedX rounded_buffer;
  thread_local std::vector<float> rounded_x;
  const RoundedX& rounded = rounded_buffer;
  if (storage_ == Storage::kInt8 || storage_ == Storage::kInt4) {
    const bool int8_x = quantize_activations_ || storage_ == Storage::kInt4;
    if (m == 1 && storage_ == Storage::kInt4) {
      QuantizeActivations(x, k, rounded_buffer.x4);
    } else if (m == 1 && quantize_activations_) {
      QuantizeActivations(x, k, rounded_buffer.x8);
    } else if (m == 1) {
      QuantizeActivations(x, k, rounded_buffer.x16);
    } else {
      rounded_x.resize(static_cast<size_t>(m) * k);
      RoundActivations(x, m, k, int8_x ? 8 : 16, rounded_x.data());
      x = rounded_x.data();
    }
  }
  // A few rows of fp32 or bf16 weights (a verification step, a small decode
  // batch): GEMVs that read each weight once for all of them and sum each
  // product as the batch-1 GEMV does, so results do not depend on the batch.
  // (int8 storage keeps the sgemm path on its rounded values.)
  const bool few_rows =
      m > 1 && m <= kManyGemvRows && (storage_ == Storage::kF32 || storage_ == Storage::kBf16);
  const auto rows = [&](int first, int count) {
    if (m == 1) {
      GemvRows(x, rounded, y, first, count);
    } else if (storage_ == Storage::kF32) {
      GemvManyF32(f32() + int64_t{first} * k, x, m, y + first, n, count, k, BestIsa());
    } else {
      GemvManyBf16(bf16() + int64_t{first} * k, x, m, y + first, n, count, k, BestIsa());
    }
  };
  if ((m == 1 || few_rows) && pool != nullptr && pool->num_threads() > 1) {
    // Chunks of whole 16-row groups, about 128 KiB of weights each: long
    // enough streams, few enough claims.
    const int64_t row_bytes = std::max<int64_t>(1, bytes() / rows_);
    const int chunk =
        static_cast<int>(std::max<int64_t>(1, (int64_t{128} << 10) / row_bytes / 16) * 16);
    return SplitRows(m, chunk, num_threads, pool, rows);
  }
  if (m > 1 && !few_rows && pool != nullptr && pool->num_threads() > 1) {
    // sgemm on the pool's threads (no OpenMP team spinning beside them), one
    // block of rows per thread: each call packs x again.
    const int threads = pool->num_threads();
    const int chunk = std::max(128, ((n + threads - 1) / threads + 15) / 16 * 16);
    return SplitRows(m, chunk, num_threads, pool,
                     [&](int first, int count) { BlockGemm(x, y, m, first, count); });
  }
  // Blocks of rows, a multiple of 16, one per thread.
  const int threads = MatMulThreads(m, n, k, num_threads);
  if (threads == 1) {  // no OpenMP region (its set-up is paid per call)
    if (m > 1 && !few_rows) {
      BlockGemm(x, y, m, 0, n);
    } else {
      rows(0, n);
    }
    return;
  }
  const int block = ((n + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int n0 = 0; n0 < n; n0 += block) {
    const int nb = std::min(block, n - n0);
    if (m > 1 && !few_rows) {
      BlockGemm(x, y, m, n0, nb);
    } else {
      rows(n0, nb);
    }
  }
}

}  // namespace pdserve::engine::cpu
