// cuBLAS GEMM conventions on small hand-computed cases, before any kernel
// relies on them: column-major storage, transposes, leading dimensions,
// row-major tensors passed as their transposes, beta == 0 not reading C,
// strided batches, bf16/f16/f32 types, and the statuses of bad arguments.
// Built for the emulation and for real cuBLAS: the same expectations hold.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/cuda/base/cuda_compat.h"
#include "tests/unit/cuda/gpu_test_util.h"

namespace pdserve::cuda {
namespace {

using testing::DeviceBuffer;

class CublasTest : public testing::GpuTest {
 protected:
  void SetUp() override {
    testing::GpuTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cublasCreate(&handle_), CUBLAS_STATUS_SUCCESS);
  }
  void TearDown() override {
    if (handle_ != nullptr) {
      EXPECT_EQ(cublasDestroy(handle_), CUBLAS_STATUS_SUCCESS);
    }
    testing::GpuTest::TearDown();
  }
  // C = op(A) op(B) (alpha 1, beta 0) in fp32.
  cublasStatus_t Gemm(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                      const float* a, int lda, const float* b, int ldb, float* c, int ldc,
                      float beta = 0.0f) {
    const float alpha = 1.0f;
    return cublasGemmEx(handle_, ta, tb, m, n, k, &alpha, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb,
                        &beta, c, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  }

  cublasHandle_t handle_ = nullptr;
};

// A (2 x 3, column-major) = [1 2 3; 4 5 6] is stored {1, 4, 2, 5, 3, 6}.
// B (3 x 2) = [7 8; 9 10; 11 12] is stored {7, 9, 11, 8, 10, 12}.
// A B = [58 64; 139 154], stored {58, 139, 64, 154}.
TEST_F(CublasTest, ColumnMajorNoTranspose) {
  DeviceBuffer<float> a({1, 4, 2, 5, 3, 6}), b({7, 9, 11, 8, 10, 12}), c(4);
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, a.get(), 2, b.get(), 3, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.Download(), (std::vector<float>{58, 139, 64, 154}));
}

// op(A) = A^T with A stored 3 x 2 = [1 4; 2 5; 3 6] ({1, 2, 3, 4, 5, 6});
// op(B) = B^T with B stored 2 x 3 = [7 9 11; 8 10 12] ({7, 8, 9, 10, 11, 12}).
TEST_F(CublasTest, TransposesReadTheOtherLayout) {
  DeviceBuffer<float> a({1, 2, 3, 4, 5, 6}), b({7, 8, 9, 10, 11, 12}), c(4);
  ASSERT_EQ(Gemm(CUBLAS_OP_T, CUBLAS_OP_T, 2, 2, 3, a.get(), 3, b.get(), 2, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.Download(), (std::vector<float>{58, 139, 64, 154}));
}

// Row-major y[M=2, N=3] = x[2, K=2] W[3, 2]^T (torch Linear): in column-major
// terms y^T = W x^T with W read as its transpose (CUBLAS_OP_T, lda = K).
// x = [1 2; 3 4], W = [1 0; 0 1; 1 1] -> y = [1 2 3; 3 4 7].
TEST_F(CublasTest, RowMajorLinearAsTransposes) {
  DeviceBuffer<float> x({1, 2, 3, 4}), w({1, 0, 0, 1, 1, 1}), y(6);
  ASSERT_EQ(
      Gemm(CUBLAS_OP_T, CUBLAS_OP_N, /*m=*/3, /*n=*/2, /*k=*/2, w.get(), 2, x.get(), 2, y.get(), 3),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(y.Download(), (std::vector<float>{1, 2, 3, 3, 4, 7}));  // row-major y
}

// Row-major C[2, 2] = A[2, 3] B[3, 2]: C^T = B^T A^T, no transposes, the
// row-major arrays passed as they are.
TEST_F(CublasTest, RowMajorProductAsSwappedOperands) {
  DeviceBuffer<float> a({1, 2, 3, 4, 5, 6}), b({7, 8, 9, 10, 11, 12}), c(4);
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, b.get(), 2, a.get(), 3, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.Download(), (std::vector<float>{58, 64, 139, 154}));  // row-major C
}

// Leading dimensions larger than the rows: padding is skipped on input and
// left untouched on output.
TEST_F(CublasTest, LeadingDimensionsSkipPadding) {
  constexpr float kPad = -100.0f;
  DeviceBuffer<float> a({1, 4, kPad, 2, 5, kPad, 3, 6, kPad}), b({7, 9, 11, kPad, 8, 10, 12, kPad});
  DeviceBuffer<float> c(6);
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, a.get(), 3, b.get(), 4, c.get(), 3),
            CUBLAS_STATUS_SUCCESS);
  const std::vector<float> out = c.Download();
  EXPECT_EQ(out[0], 58);
  EXPECT_EQ(out[1], 139);
  EXPECT_TRUE(std::isnan(out[2]));  // padding of C: never written
  EXPECT_EQ(out[3], 64);
  EXPECT_EQ(out[4], 154);
  EXPECT_TRUE(std::isnan(out[5]));
}

TEST_F(CublasTest, BetaZeroIgnoresCAndBetaOneAccumulates) {
  DeviceBuffer<float> a({1, 4, 2, 5, 3, 6}), b({7, 9, 11, 8, 10, 12}), c(4);  // c: NaN
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, a.get(), 2, b.get(), 3, c.get(), 2, 0.0f),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, a.get(), 2, b.get(), 3, c.get(), 2, 1.0f),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.Download(), (std::vector<float>{116, 278, 128, 308}));
}

TEST_F(CublasTest, Bf16AndF16InputsWithFp32AndNarrowOutputs) {
  const std::vector<float> av = {1, 4, 2, 5, 3, 6}, bv = {7, 9, 11, 8, 10, 12};
  const float alpha = 0.5f, beta = 0.0f;
  {
    DeviceBuffer<__nv_bfloat16> a(testing::ToBf16(av)), b(testing::ToBf16(bv));
    DeviceBuffer<float> c32(4);
    DeviceBuffer<__nv_bfloat16> c16(4);
    ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a.get(), CUDA_R_16BF,
                           2, b.get(), CUDA_R_16BF, 3, &beta, c32.get(), CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(c32.Download(), (std::vector<float>{29, 69.5, 32, 77}));
    ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a.get(), CUDA_R_16BF,
                           2, b.get(), CUDA_R_16BF, 3, &beta, c16.get(), CUDA_R_16BF, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    // 29, 69.5, 32 and 77 have at most 8 significant bits: exact in bf16.
    EXPECT_EQ(testing::FromBf16(c16.Download()), (std::vector<float>{29, 69.5, 32, 77}));
  }
  {
    DeviceBuffer<__half> a(testing::ToF16(av)), b(testing::ToF16(bv));
    DeviceBuffer<float> c(4);
    ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, &alpha, a.get(), CUDA_R_16F,
                           2, b.get(), CUDA_R_16F, 3, &beta, c.get(), CUDA_R_32F, 2,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
              CUBLAS_STATUS_SUCCESS);
    EXPECT_EQ(c.Download(), (std::vector<float>{29, 69.5, 32, 77}));
  }
  // A bf16 result rounds to nearest even: 257 lies between 256 and 258.
  DeviceBuffer<__nv_bfloat16> big(testing::ToBf16({256, 1}));
  DeviceBuffer<__nv_bfloat16> r(1);
  const float unit = 1.0f;
  // r = [256 1] . [1 1]^T (k = 2): 257 -> 256 (even mantissa).
  DeviceBuffer<__nv_bfloat16> ones(testing::ToBf16({1, 1}));
  ASSERT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 2, &unit, big.get(), CUDA_R_16BF,
                         1, ones.get(), CUDA_R_16BF, 2, &beta, r.get(), CUDA_R_16BF, 1,
                         CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(testing::FromBf16(r.Download())[0], 256.0f);
}

// Three 2 x 2 products C_i = A_i B with B shared (stride 0).
TEST_F(CublasTest, StridedBatchedWithBroadcast) {
  // A_i = i * I (column-major 2 x 2, stride 4); B = [1 2; 3 4] ({1, 3, 2, 4}).
  DeviceBuffer<float> a({0, 0, 0, 0, 1, 0, 0, 1, 2, 0, 0, 2}), b({1, 3, 2, 4}), c(12);
  const float alpha = 1.0f, beta = 0.0f;
  ASSERT_EQ(
      cublasGemmStridedBatchedEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &alpha, a.get(),
                                 CUDA_R_32F, 2, 4, b.get(), CUDA_R_32F, 2, 0, &beta, c.get(),
                                 CUDA_R_32F, 2, 4, 3, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
      CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(c.Download(), (std::vector<float>{0, 0, 0, 0, 1, 3, 2, 4, 2, 6, 4, 8}));
}

TEST_F(CublasTest, BadArgumentsGiveCublasStatuses) {
  DeviceBuffer<float> a(64), b(64), c(64);
  DeviceBuffer<__nv_bfloat16> h(64);
  const float one = 1.0f, zero = 0.0f;
  // lda < m for CUBLAS_OP_N; lda < k for CUBLAS_OP_T; ldb; ldc.
  EXPECT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, a.get(), 3, b.get(), 3, c.get(), 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Gemm(CUBLAS_OP_T, CUBLAS_OP_N, 4, 2, 3, a.get(), 2, b.get(), 3, c.get(), 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_T, 4, 2, 3, a.get(), 4, b.get(), 1, c.get(), 4),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 4, 2, 3, a.get(), 4, b.get(), 3, c.get(), 3),
            CUBLAS_STATUS_INVALID_VALUE);
  EXPECT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, -1, 2, 3, a.get(), 4, b.get(), 3, c.get(), 4),
            CUBLAS_STATUS_INVALID_VALUE);
  // The same shapes with valid leading dimensions succeed.
  EXPECT_EQ(Gemm(CUBLAS_OP_T, CUBLAS_OP_T, 4, 2, 3, a.get(), 3, b.get(), 2, c.get(), 4),
            CUBLAS_STATUS_SUCCESS);
  // A and B of different types; f16 output from bf16 inputs.
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, h.get(), CUDA_R_16BF, 2,
                         a.get(), CUDA_R_32F, 2, &zero, c.get(), CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasGemmEx(handle_, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, h.get(), CUDA_R_16BF, 2,
                         h.get(), CUDA_R_16BF, 2, &zero, c.get(), CUDA_R_16F, 2, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cublasGemmEx(nullptr, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.get(), CUDA_R_32F, 2,
                         b.get(), CUDA_R_32F, 2, &zero, c.get(), CUDA_R_32F, 2, CUBLAS_COMPUTE_32F,
                         CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_NOT_INITIALIZED);
}

TEST_F(CublasTest, GemmRunsOnTheHandlesStream) {
  cudaStream_t s;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cublasSetStream(handle_, s), CUBLAS_STATUS_SUCCESS);
  DeviceBuffer<float> a({1, 4, 2, 5, 3, 6}), b({7, 9, 11, 8, 10, 12}), c(4);
  ASSERT_EQ(Gemm(CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 3, a.get(), 2, b.get(), 3, c.get(), 2),
            CUBLAS_STATUS_SUCCESS);
  std::vector<float> host(4);
  ASSERT_EQ(cudaMemcpyAsync(host.data(), c.get(), 4 * sizeof(float), cudaMemcpyDeviceToHost, s),
            cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(host, (std::vector<float>{58, 139, 64, 154}));
  ASSERT_EQ(cublasSetStream(handle_, nullptr), CUBLAS_STATUS_SUCCESS);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace pdserve::cuda
