// KV row copies between layouts (see kv_copy.cuh): one thread per access
// unit of a row, K rows then V rows.
#include <algorithm>

#include "kvtransfer/device/kv_copy.cuh"

namespace pdserve::kvtransfer::device {
namespace {

constexpr unsigned kThreads = 256;

// One side of one launch: paged sides carry the blocks the launch touches.
struct View {
  std::byte* k;
  std::byte* v;
  int64_t block_stride;
  int block_size;  // 0: contiguous
  int first_slot;  // slot of the launch's first token in blocks[0]
  int32_t blocks[kMaxCopyBlocks];
};

struct Args {
  View src;
  View dst;
  int num_tokens;
  int64_t row_bytes;
};

struct alignas(16) Bytes16 {
  uint32_t w[4];
};

__device__ __forceinline__ std::byte* RowAddress(const View& view, bool value, int t,
                                                 int64_t row_bytes) {
  std::byte* base = value ? view.v : view.k;
  if (view.block_size == 0) return base + int64_t{t} * row_bytes;
  const int slot = view.first_slot + t;
  return base + int64_t{view.blocks[slot / view.block_size]} * view.block_stride +
         int64_t{slot % view.block_size} * row_bytes;
}

template <typename Unit>
__global__ void CopyKvRowsKernel(Args args) {
  const int64_t units = args.row_bytes / static_cast<int64_t>(sizeof(Unit));
  const int64_t per_side = int64_t{args.num_tokens} * units;
  const int64_t item = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (item >= 2 * per_side) return;
  const bool value = item >= per_side;
  const int64_t rest = value ? item - per_side : item;
  const int t = static_cast<int>(rest / units);
  const int64_t u = rest % units;
  const auto* from =
      reinterpret_cast<const Unit*>(RowAddress(args.src, value, t, args.row_bytes)) + u;
  auto* to = reinterpret_cast<Unit*>(RowAddress(args.dst, value, t, args.row_bytes)) + u;
  *to = *from;
}

// The widest unit (16, 8, 4, 2 or 1 bytes) dividing every address and size.
int UnitBytes(const KvRows& a, const KvRows& b, int64_t row_bytes) {
  uint64_t bits = static_cast<uint64_t>(row_bytes);
  for (const KvRows* s : {&a, &b}) {
    bits |= reinterpret_cast<uintptr_t>(s->k) | reinterpret_cast<uintptr_t>(s->v);
    if (s->block_size > 0) bits |= static_cast<uint64_t>(s->block_stride);
  }
  for (int unit = 16; unit > 1; unit /= 2) {
    if (bits % unit == 0) return unit;
  }
  return 1;
}

// The launch's view of `side` for tokens [offset, offset + count) of the range.
bool MakeView(const KvRows& side, int offset, int count, int64_t row_bytes, View* view) {
  *view = {};
  view->block_stride = side.block_stride;
  view->block_size = side.block_size;
  if (side.block_size == 0) {
    view->k = side.k + int64_t{offset} * row_bytes;
    view->v = side.v + int64_t{offset} * row_bytes;
    return true;
  }
  view->k = side.k;
  view->v = side.v;
  const int first = side.first_token + offset;
  const int first_block = first / side.block_size;
  const int last_block = (first + count - 1) / side.block_size;
  if (last_block - first_block + 1 > kMaxCopyBlocks ||
      last_block >= static_cast<int>(side.blocks.size())) {
    return false;
  }
  view->first_slot = first % side.block_size;
  std::copy(side.blocks.begin() + first_block, side.blocks.begin() + last_block + 1, view->blocks);
  return true;
}

template <typename Unit>
cudaError_t Launch(const Args& args, cudaStream_t stream) {
  const int64_t items = 2 * int64_t{args.num_tokens} * (args.row_bytes / sizeof(Unit));
  return cuda::Launch(CopyKvRowsKernel<Unit>,
                      {cuda::BlocksFor(items, kThreads), kThreads, 0, stream}, args);
}

}  // namespace

cudaError_t CopyKvRows(const KvRows& src, const KvRows& dst, int num_tokens, int64_t row_bytes,
                       cudaStream_t stream) {
  if (num_tokens < 0 || row_bytes <= 0) return cudaErrorInvalidValue;
  // Tokens per launch such that a paged side spans at most kMaxCopyBlocks blocks.
  int step = num_tokens;
  for (const KvRows* s : {&src, &dst}) {
    if (s->block_size > 0) step = std::min(step, (kMaxCopyBlocks - 1) * s->block_size);
  }
  const int unit = UnitBytes(src, dst, row_bytes);
  for (int offset = 0; offset < num_tokens; offset += step) {
    Args args;
    args.num_tokens = std::min(step, num_tokens - offset);
    args.row_bytes = row_bytes;
    if (!MakeView(src, offset, args.num_tokens, row_bytes, &args.src) ||
        !MakeView(dst, offset, args.num_tokens, row_bytes, &args.dst)) {
      return cudaErrorInvalidValue;
    }
    cudaError_t e = cudaSuccess;
    switch (unit) {
      case 16:
        e = Launch<Bytes16>(args, stream);
        break;
      case 8:
        e = Launch<uint64_t>(args, stream);
        break;
      case 4:
        e = Launch<uint32_t>(args, stream);
        break;
      case 2:
        e = Launch<uint16_t>(args, stream);
        break;
      default:
        e = Launch<uint8_t>(args, stream);
        break;
    }
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

}  // namespace pdserve::kvtransfer::device
