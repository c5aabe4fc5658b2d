// Emulated cuBLAS GEMMs on OpenBLAS; see cublas.h for the rules kept.
#include "gpu_emulation/cublas.h"

#include <cblas.h>

#include <algorithm>
#include <string>
#include <vector>

#include "gpu_emulation/internal.h"

namespace pdserve::gpuemu {

struct CublasContext {
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
};

namespace {

size_t ElementBytes(cudaDataType t) {
  switch (t) {
    case CUDA_R_32F:
      return 4;
    case CUDA_R_16F:
    case CUDA_R_16BF:
      return 2;
    default:
      return 0;
  }
}

float LoadAsFloat(const void* base, cudaDataType t, int64_t i) {
  switch (t) {
    case CUDA_R_32F:
      return static_cast<const float*>(base)[i];
    case CUDA_R_16F:
      return detail::HalfBitsToFloat(static_cast<const unsigned short*>(base)[i]);
    case CUDA_R_16BF:
      return detail::Bf16BitsToFloat(static_cast<const unsigned short*>(base)[i]);
    default:
      return 0.0f;
  }
}

void StoreFromFloat(void* base, cudaDataType t, int64_t i, float v) {
  switch (t) {
    case CUDA_R_32F:
      static_cast<float*>(base)[i] = v;
      break;
    case CUDA_R_16F:
      static_cast<unsigned short*>(base)[i] = detail::FloatToHalfBits(v);
      break;
    case CUDA_R_16BF:
      static_cast<unsigned short*>(base)[i] = detail::FloatToBf16Bits(v);
      break;
    default:
      break;
  }
}

bool ValidOp(cublasOperation_t op) {
  return op == CUBLAS_OP_N || op == CUBLAS_OP_T || op == CUBLAS_OP_C;
}

bool SupportedCompute(cublasComputeType_t c) {
  return c == CUBLAS_COMPUTE_32F || c == CUBLAS_COMPUTE_32F_PEDANTIC ||
         c == CUBLAS_COMPUTE_32F_FAST_16F || c == CUBLAS_COMPUTE_32F_FAST_16BF ||
         c == CUBLAS_COMPUTE_32F_FAST_TF32;
}

struct Gemm {
  cublasOperation_t ta, tb;
  int m, n, k;
  float alpha, beta;
  const void* a;
  cudaDataType at;
  int lda;
  long long stride_a;
  const void* b;
  cudaDataType bt;
  int ldb;
  long long stride_b;
  void* c;
  cudaDataType ct;
  int ldc;
  long long stride_c;
  int batch;
};

// Bytes a column-major rows x cols matrix with leading dimension ld spans.
size_t Span(int rows, int cols, int ld, size_t elem) {
  if (rows == 0 || cols == 0) return 0;
  return (static_cast<size_t>(cols - 1) * ld + rows) * elem;
}

// Copies the rows x cols column-major matrix at `src` into packed fp32.
void Unpack(const void* src, cudaDataType t, int rows, int cols, int ld, std::vector<float>& out) {
  out.resize(static_cast<size_t>(rows) * cols);
  for (int j = 0; j < cols; ++j) {
    for (int i = 0; i < rows; ++i) {
      out[static_cast<size_t>(j) * rows + i] =
          LoadAsFloat(src, t, i + static_cast<int64_t>(j) * ld);
    }
  }
}

void Run(const Gemm& g) {
  const int a_rows = g.ta == CUBLAS_OP_N ? g.m : g.k, a_cols = g.ta == CUBLAS_OP_N ? g.k : g.m;
  const int b_rows = g.tb == CUBLAS_OP_N ? g.k : g.n, b_cols = g.tb == CUBLAS_OP_N ? g.n : g.k;
  const size_t ea = ElementBytes(g.at), eb = ElementBytes(g.bt), ec = ElementBytes(g.ct);
  std::vector<float> a, b, c;
  for (int batch = 0; batch < g.batch; ++batch) {
    const char* pa =
        static_cast<const char*>(g.a) + batch * g.stride_a * static_cast<long long>(ea);
    const char* pb =
        static_cast<const char*>(g.b) + batch * g.stride_b * static_cast<long long>(eb);
    char* pc = static_cast<char*>(g.c) + batch * g.stride_c * static_cast<long long>(ec);
    const bool reads_ab = g.k > 0 && g.alpha != 0.0f;
    if ((reads_ab && (!DeviceRange(pa, Span(a_rows, a_cols, g.lda, ea)) ||
                      !DeviceRange(pb, Span(b_rows, b_cols, g.ldb, eb)))) ||
        !DeviceRange(pc, Span(g.m, g.n, g.ldc, ec))) {
      SetStickyError(cudaErrorIllegalAddress, "cuBLAS GEMM (batch " + std::to_string(batch) +
                                                  "): an operand lies outside device allocations");
      return;
    }
    c.assign(static_cast<size_t>(g.m) * g.n, 0.0f);
    if (g.beta != 0.0f) Unpack(pc, g.ct, g.m, g.n, g.ldc, c);  // beta == 0: C is not read
    if (reads_ab) {
      Unpack(pa, g.at, a_rows, a_cols, g.lda, a);
      Unpack(pb, g.bt, b_rows, b_cols, g.ldb, b);
      cblas_sgemm(CblasColMajor, g.ta == CUBLAS_OP_N ? CblasNoTrans : CblasTrans,
                  g.tb == CUBLAS_OP_N ? CblasNoTrans : CblasTrans, g.m, g.n, g.k, g.alpha, a.data(),
                  std::max(1, a_rows), b.data(), std::max(1, b_rows), g.beta, c.data(),
                  std::max(1, g.m));
    } else {
      for (float& x : c) x *= g.beta;
    }
    for (int j = 0; j < g.n; ++j) {
      for (int i = 0; i < g.m; ++i) {
        StoreFromFloat(pc, g.ct, i + static_cast<int64_t>(j) * g.ldc,
                       c[static_cast<size_t>(j) * g.m + i]);
      }
    }
  }
}

cublasStatus_t Enqueue(cublasHandle_t handle, Gemm g, const void* alpha, const void* beta,
                       cublasComputeType_t compute) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (!ValidOp(g.ta) || !ValidOp(g.tb) || g.m < 0 || g.n < 0 || g.k < 0 || g.batch < 0 ||
      alpha == nullptr || beta == nullptr) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (g.lda < std::max(1, g.ta == CUBLAS_OP_N ? g.m : g.k) ||
      g.ldb < std::max(1, g.tb == CUBLAS_OP_N ? g.k : g.n) || g.ldc < std::max(1, g.m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (!SupportedCompute(compute)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const bool ab_ok = g.at == g.bt && ElementBytes(g.at) != 0;
  const bool c_ok = g.ct == g.at || g.ct == CUDA_R_32F;
  if (!ab_ok || !c_ok) return CUBLAS_STATUS_NOT_SUPPORTED;
  // Host pointer mode: alpha and beta are read now.
  g.alpha = *static_cast<const float*>(alpha);
  g.beta = *static_cast<const float*>(beta);
  if (g.m == 0 || g.n == 0 || g.batch == 0) return CUBLAS_STATUS_SUCCESS;
  const cudaError_t e = Submit(handle->stream, {[g] { Run(g); }});
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

}  // namespace
}  // namespace pdserve::gpuemu

using pdserve::gpuemu::CublasContext;

cublasStatus_t cublasCreate(cublasHandle_t* handle) {
  if (handle == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *handle = new CublasContext();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t handle) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  delete handle;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t handle, cudaStream_t stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream(cublasHandle_t handle, cudaStream_t* stream) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (stream == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  *stream = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t handle, void* workspace, size_t bytes) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  if (bytes > 0 && workspace == nullptr) return CUBLAS_STATUS_INVALID_VALUE;
  handle->workspace = workspace;
  handle->workspace_bytes = bytes;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetMathMode(cublasHandle_t handle, cublasMath_t) {
  return handle == nullptr ? CUBLAS_STATUS_NOT_INITIALIZED : CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (handle == nullptr) return CUBLAS_STATUS_NOT_INITIALIZED;
  // Only host scalars are emulated; device-pointer alpha/beta are refused
  // rather than misread.
  return mode == CUBLAS_POINTER_MODE_HOST ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_NOT_SUPPORTED;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "license error";
  }
  return "unknown error";
}

cublasStatus_t cublasGemmEx(cublasHandle_t handle, cublasOperation_t transa,
                            cublasOperation_t transb, int m, int n, int k, const void* alpha,
                            const void* A, cudaDataType Atype, int lda, const void* B,
                            cudaDataType Btype, int ldb, const void* beta, void* C,
                            cudaDataType Ctype, int ldc, cublasComputeType_t computeType,
                            cublasGemmAlgo_t) {
  pdserve::gpuemu::Gemm g{transa, transb, m,     n,   k, 0, 0,     A,   Atype, lda,
                          0,      B,      Btype, ldb, 0, C, Ctype, ldc, 0,     1};
  return pdserve::gpuemu::Enqueue(handle, g, alpha, beta, computeType);
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa,
                                          cublasOperation_t transb, int m, int n, int k,
                                          const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B,
                                          cudaDataType Btype, int ldb, long long int strideB,
                                          const void* beta, void* C, cudaDataType Ctype, int ldc,
                                          long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t) {
  pdserve::gpuemu::Gemm g{transa,  transb, m,     n,   k,       0, 0,     A,   Atype,   lda,
                          strideA, B,      Btype, ldb, strideB, C, Ctype, ldc, strideC, batchCount};
  return pdserve::gpuemu::Enqueue(handle, g, alpha, beta, computeType);
}

cublasStatus_t cublasSgemm(cublasHandle_t handle, cublasOperation_t transa,
                           cublasOperation_t transb, int m, int n, int k, const float* alpha,
                           const float* A, int lda, const float* B, int ldb, const float* beta,
                           float* C, int ldc) {
  return cublasGemmEx(handle, transa, transb, m, n, k, alpha, A, CUDA_R_32F, lda, B, CUDA_R_32F,
                      ldb, beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
}
