// WeightMatrix: storage and matmul dispatch; see weight_matrix.h.
#include "engine/cpu/weight_matrix.h"

#include <cblas.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cpu/kernels.h"
#include "engine/cpu/kernels_gemv.h"

namespace pdserve::engine::cpu {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

const char* StorageName(WeightMatrix::Storage storage) {
  switch (storage) {
    case WeightMatrix::Storage::kF32:
      return "f32";
    case WeightMatrix::Storage::kBf16:
      return "bf16";
    case WeightMatrix::Storage::kInt8:
      return "int8";
  }
  return "unknown";
}

void WeightMatrix::Free::operator()(std::byte* p) const {
  if (mapped_bytes > 0) {
    munmap(p, mapped_bytes);
  } else {
    std::free(p);
  }
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
  }
  // Large matrices: whole 2 MiB pages from a fresh mapping, advised huge
  // before anything touches them. Heap memory would not do: pages a freed
  // buffer already faulted in stay 4 KiB pages whatever madvise says later,
  // and a weight stream over 4 KiB pages ran at about half the rate
  // (docs/performance.md). Where transparent huge pages are off or not built
  // in, madvise fails or is a no-op and the mapping keeps 4 KiB pages; where
  // the mapping itself fails, the heap below serves instead.
  if (bytes >= kHugePage / 2) {
    const size_t size = RoundUp(bytes, kHugePage);
    void* raw =
        mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw != MAP_FAILED) {
      // Trim the mapping to a 2 MiB-aligned range of `size` bytes.
      auto* begin = static_cast<std::byte*>(raw);
      const size_t head = RoundUp(reinterpret_cast<uintptr_t>(begin), kHugePage) -
                          reinterpret_cast<uintptr_t>(begin);
      if (head > 0) munmap(begin, head);
      munmap(begin + head + size, kHugePage - head);  // head < kHugePage
      madvise(begin + head, size, MADV_HUGEPAGE);     // advice only: failure is fine
      data_ = std::unique_ptr<std::byte, Free>(begin + head, Free{size});
      return;
    }
  }
  void* p = std::aligned_alloc(64, RoundUp(std::max<size_t>(bytes, 1), 64));
  if (p == nullptr) throw std::bad_alloc();
  data_ = std::unique_ptr<std::byte, Free>(static_cast<std::byte*>(p), Free{0});
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
  }
}

void WeightMatrix::BlockGemm(const float* x, float* y, int m, int64_t first, int64_t count) const {
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  if (storage_ == Storage::kF32) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(count), k, 1.0f, x, k,
                f32() + first * k, k, 0.0f, y + first, n);
    return;
  }
  // Rows expanded to fp32 at a time: about 256 KiB, which stays in L2.
  const int64_t chunk = std::max<int64_t>(16, (int64_t{1} << 16) / std::max(1, k));
  thread_local std::vector<float> expanded;
  expanded.resize(static_cast<size_t>(chunk * k));
  for (int64_t c0 = 0; c0 < count; c0 += chunk) {
    const int64_t cb = std::min(chunk, count - c0);
    RowsToFloat(first + c0, cb, expanded.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, static_cast<int>(cb), k, 1.0f, x, k,
                expanded.data(), k, 0.0f, y + first + c0, n);
  }
}

void WeightMatrix::GemvRows(const float* x, const Int8Activations& xq, float* y, int first,
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
      if (quantize_activations_) return GemvInt8Act(int8() + at, s, xq, y + first, count, k, isa);
      return GemvInt8(int8() + at, s, x, y + first, count, k, isa);
    }
  }
}

void WeightMatrix::MatMul(const float* x, float* y, int m, int num_threads, WorkPool* pool) const {
  if (m == 0 || rows_ == 0) return;
  const int n = static_cast<int>(rows_), k = static_cast<int>(cols_);
  // w8a8: the activations rounded once, here, before the threads split the
  // rows; the threads read the caller's buffers.
  thread_local Int8Activations quantized_x;
  thread_local std::vector<float> rounded_x;
  if (quantize_activations_) {
    if (m == 1) {
      QuantizeActivations(x, k, quantized_x);
    } else {
      // Each row rounded as the GEMV rounds it, then the fp32 sgemm path:
      // the same products up to fp32 summation order.
      const int64_t groups = Int8Groups(k);
      std::vector<int8_t>& q = quantized_x.q;
      std::vector<float>& s = quantized_x.scales;
      q.resize(static_cast<size_t>(m) * k);
      s.resize(static_cast<size_t>(m * groups));
      rounded_x.resize(static_cast<size_t>(m) * k);
      QuantizeInt8(x, m, k, q.data(), s.data());
      DequantizeInt8(q.data(), s.data(), m, k, rounded_x.data());
      x = rounded_x.data();
    }
  }
  const Int8Activations& xq = quantized_x;
  if (m == 1 && pool != nullptr && pool->num_threads() > 1) {
    // Chunks of whole 16-row groups, about 128 KiB of weights each: long
    // enough streams, few enough claims.
    const int64_t row_bytes = std::max<int64_t>(1, bytes() / rows_);
    const int chunk =
        static_cast<int>(std::max<int64_t>(1, (int64_t{128} << 10) / row_bytes / 16) * 16);
    pool->ParallelFor((n + chunk - 1) / chunk, [&](int64_t c) {
      const int first = static_cast<int>(c) * chunk;
      GemvRows(x, xq, y, first, std::min(chunk, n - first));
    });
    return;
  }
  // Blocks of rows, a multiple of 16, one per thread.
  const int threads = MatMulThreads(m, n, k, num_threads);
  const int block = ((n + threads - 1) / threads + 15) / 16 * 16;
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1)
  for (int n0 = 0; n0 < n; n0 += block) {
    const int nb = std::min(block, n - n0);
    if (m > 1) {
      BlockGemm(x, y, m, n0, nb);
    } else {
      GemvRows(x, xq, y, n0, nb);
    }
  }
}

}  // namespace pdserve::engine::cpu
