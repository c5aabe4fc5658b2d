// A weight matrix of the CPU backend: row-major [rows, cols] (out x in, as
// torch.nn.Linear stores it) in fp32, bf16, int8 with one fp32 scale per
// group of 32 values of a row (kernels_gemv.h) or int4 with one fp16 scale
// per group of 32 (kernels_int4.h), and the matmul that reads it.
//
// Storage is one allocation in memory advised for transparent huge pages
// before its first touch: a 2 MiB-aligned mapping of its own for a matrix
// over 8 MiB, a share of a 32 MiB slab of such memory for a smaller one.
// Batch-1 decode streams every weight once per step, and over 4 KiB pages
// that stream runs at about half the rate (TLB misses, prefetchers stopping
// at page edges). Where a mapping fails the heap serves (64-byte aligned,
// 4 KiB pages).
//
// Thread safety: const methods may run concurrently; MatMul forks its own
// OpenMP threads, so call it from one thread at a time per process (the
// runner's engine thread).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "engine/cpu/kernels_gemv.h"
#include "engine/cpu/kernels_int4.h"
#include "engine/cpu/work_pool.h"
#include "engine/model/safetensors.h"
#include "engine/types/weight_dtype.h"

namespace pdserve::engine::cpu {

struct WeightSlab;  // shared huge-page memory of small matrices (weight_matrix.cc)

// Up to this many activation rows, fp32 and bf16 matrices multiply by GEMVs
// that read each weight once for all rows (GemvManyF32/GemvManyBf16) rather
// than by sgemm: a verification step's 1 + k rows and small decode batches.
inline constexpr int kManyGemvRows = 64;

class WeightMatrix {
 public:
  // What the values are stored as (never kAuto).
  enum class Storage { kF32, kBf16, kInt8, kInt4 };

  WeightMatrix() = default;  // 0 x 0
  WeightMatrix(WeightMatrix&&) noexcept = default;
  WeightMatrix& operator=(WeightMatrix&&) noexcept = default;

  // From rows * cols fp32 values. WeightDtype::kAuto stores bf16 when every
  // value is exactly a bf16 number, else fp32; kBf16 rounds to nearest even;
  // kInt8 quantizes (QuantizeInt8; MatMul rounds x to 16 bits, see MatMul);
  // kW8A8 quantizes and marks the matrix to
  // quantize its activations too (quantize_activations()); kInt4 quantizes
  // to 4 bits (QuantizeInt4; MatMul rounds x to int8, see MatMul).
  static WeightMatrix FromF32(std::span<const float> values, int64_t rows, int64_t cols,
                              WeightDtype dtype);
  // From a checkpoint tensor's raw little-endian bytes (F32, F16 or BF16;
  // exactly rows * cols values): as FromF32 of the values, except that a
  // BF16 tensor kept in bf16 is copied as is. INVALID_ARGUMENT for another
  // dtype or a size mismatch.
  static absl::StatusOr<WeightMatrix> FromRaw(StDtype src, std::span<const std::byte> bytes,
                                              int64_t rows, int64_t cols, WeightDtype dtype);

  Storage storage() const { return storage_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  bool empty() const { return rows_ == 0; }
  // kW8A8: MatMul rounds each row of x as QuantizeInt8 would (groups of 32,
  // scale max |x| / 127) and multiplies those values; int8 storage only.
  bool quantize_activations() const { return quantize_activations_; }
  // Bytes one pass over the matrix reads: values plus int8 / int4 scales.
  int64_t bytes() const;

  // out[r - first, :] = row r as fp32, for rows [first, first + count).
  void RowsToFloat(int64_t first, int64_t count, float* out) const;

  // y[m, rows] = x[m, cols] * W^T, accumulated in fp32. m == 1: the
  // streaming GEMV of kernels_gemv.h, on the threads of `pool` when given
  // (rows in chunks of about 128 KiB, claimed as threads come free), else
  // over at most `num_threads` OpenMP threads, each taking a block of rows;
  // m > 1: OpenBLAS sgemm, on `pool`'s threads (a block of rows each) when
  // given, else on at most `num_threads` OpenMP threads, with bf16 and int8
  // rows expanded to fp32 a block at a time (256 KiB, 2 MiB above
  // kManyGemvRows rows); except
  // that above kManyGemvRows rows (prefill) fp32 and bf16 storage run the
  // AVX-512 panel GEMM where the CPU has AVX-512 (kernels_gemm_float.h), on
  // `pool`'s threads when given, in chunks of 128 rows. With int8
  // storage x's rows are rounded first, to 16-bit integers in groups of 32
  // (Int16Activations; with quantize_activations(), to int8): at m == 1 for
  // GemvInt8 / GemvInt8Act, at 1 < m <= kManyGemvRows without
  // quantize_activations() to the same 16-bit values in fp32 for the sgemm
  // (a verification step's rows get the decode GEMV's numbers up to
  // summation order). Above kManyGemvRows rows (prefill), and from 2 rows
  // with quantize_activations(), int8 storage
  // runs the int8 GEMM (GemmInt8, kernels_gemm_int8.h): x's rows rounded to
  // int8 in groups of 32 (as llama.cpp's Q8_0, and as w8a8 always rounds),
  // exact int32 dot products per group, on `pool`'s threads when given, in
  // chunks of 64 rows. With int4
  // storage x's rows are rounded to int8 in groups of 32 (as QuantizeInt8):
  // at m == 1 for GemvInt4, at m > 1 for the int8 GEMM, which multiplies
  // them by the nibbles widened to int8 values 64 rows at a time
  // (Int4ToInt8): the GEMV's exact integer products, summed in another
  // order.
  void MatMul(const float* x, float* y, int m, int num_threads, WorkPool* pool = nullptr) const;

 private:
  // Frees storage from AllocateStorage: a share of a slab, an munmap of
  // `mapped_bytes` when non-zero, else std::free. (No member initialisers: a
  // nested class's are not usable before the enclosing class is complete;
  // unique_ptr value-initialises it.)
  struct Free {
    size_t mapped_bytes;
    WeightSlab* slab;
    void operator()(std::byte* p) const;
  };
  // `bytes` of huge-page memory (see the file comment), 256-byte aligned.
  static std::unique_ptr<std::byte, Free> AllocateStorage(size_t bytes);
  // Uninitialised storage for rows x cols values of `storage` (and the
  // scales of int8); sets the shape.
  void Allocate(Storage storage, int64_t rows, int64_t cols);
  const float* f32() const { return reinterpret_cast<const float*>(data_.get()); }
  const uint16_t* bf16() const { return reinterpret_cast<const uint16_t*>(data_.get()); }
  const int8_t* int8() const { return reinterpret_cast<const int8_t*>(data_.get()); }
  // int8 only: rows * Int8Groups(cols) scales after the values.
  const float* scales() const {
    return reinterpret_cast<const float*>(data_.get() + scales_offset_);
  }
  // int4 only: rows * Int4RowBytes(cols) bytes of nibbles, then rows *
  // Int8Groups(cols) fp16 scales.
  const uint8_t* int4() const { return reinterpret_cast<const uint8_t*>(data_.get()); }
  const uint16_t* half_scales() const {
    return reinterpret_cast<const uint16_t*>(data_.get() + scales_offset_);
  }
  // Rows [first, first + count) times x, m > 1, into y's columns (ldy = rows()).
  void BlockGemm(const float* x, float* y, int m, int64_t first, int64_t count) const;
  // Whether MatMul of m rows runs the int8 GEMM (Int8Gemm) or the fp32 /
  // bf16 panel GEMM (FloatPanelsGemm).
  bool UsesInt8Gemm(int m) const;
  bool UsesFloatPanels(int m) const;
  // rows(first, count) over all rows: on `pool`'s threads in chunks of
  // `chunk` rows when it has more than one thread, else in blocks of a
  // multiple of `chunk` rows over at most MatMulThreads OpenMP threads.
  void SplitRows(int m, int chunk, int num_threads, WorkPool* pool,
                 absl::FunctionRef<void(int, int)> rows) const;
  // MatMul of int8 (or int4, widened) storage by GemmInt8
  // (kernels_gemm_int8.h), x's rows quantized to int8 in groups of 32, rows
  // in chunks of 64.
  void Int8Gemm(const float* x, float* y, int m, int num_threads, WorkPool* pool) const;
  // MatMul of fp32 / bf16 storage by GemmF32Panels / GemmBf16Panels
  // (kernels_gemm_float.h), rows in chunks of 128.
  void FloatPanelsGemm(const float* x, float* y, int m, int num_threads, WorkPool* pool) const;
  // x as MatMul rounds it for one GEMV (for int8 storage, x8 under w8a8,
  // else x16; for int4, x4).
  struct RoundedX {
    Int8Activations x8;
    Int16Activations x16;
    Int4Activations x4;
  };
  // y[r] for rows [first, first + count), m == 1.
  void GemvRows(const float* x, const RoundedX& rounded, float* y, int first, int count) const;

  Storage storage_ = Storage::kF32;
  int64_t rows_ = 0;
  int64_t cols_ = 0;
  int64_t scales_offset_ = 0;  // bytes from data_ to the int8 or int4 scales
  bool quantize_activations_ = false;
  std::unique_ptr<std::byte, Free> data_;
};

const char* StorageName(WeightMatrix::Storage storage);  // "f32", "bf16", "int8", "int4"

}  // namespace pdserve::engine::cpu
