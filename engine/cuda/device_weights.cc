// Device weights loaded through a bounded staging buffer (see device_weights.h).
#include "engine/cuda/device_weights.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "engine/cuda/base/cuda_handles.h"
#include "engine/cuda/base/cuda_status.h"
#include "engine/cuda/convert.cuh"

namespace pdserve::cuda {
namespace {

using engine::StDtype;
using engine::TensorView;

int ElementBytes(StDtype dtype) { return dtype == StDtype::kF32 ? 4 : 2; }

// Streams tensors to the device through two halves of pinned memory: a
// half is refilled only after the copy (and conversion) that read it ran.
class StagedUploader {
 public:
  StagedUploader(cudaStream_t stream, size_t half) : stream_(stream), half_(half) {}

  absl::Status Init(bool convert) {
    absl::StatusOr<PinnedAllocation> host = PinnedAllocation::Create(2 * half_, "weight staging");
    if (!host.ok()) return host.status();
    host_ = *std::move(host);
    if (convert) {
      // The stored f32/f16 values on the device, before conversion.
      absl::StatusOr<DeviceAllocation> raw =
          DeviceAllocation::Create(2 * half_, "weight conversion staging");
      if (!raw.ok()) return raw.status();
      raw_ = *std::move(raw);
    }
    for (UniqueEvent& e : done_) {
      absl::StatusOr<UniqueEvent> event = NewEvent(cudaEventDisableTiming);
      if (!event.ok()) return event.status();
      e = *std::move(event);
    }
    return absl::OkStatus();
  }

  // Enqueues t's elements into dst (t.num_elements bf16 values).
  absl::Status Upload(const TensorView& t, __nv_bfloat16* dst) {
    const int elem = ElementBytes(t.dtype);
    const int64_t per_chunk = static_cast<int64_t>(half_ / elem);
    for (int64_t begin = 0; begin < t.num_elements; begin += per_chunk) {
      const int64_t count = std::min(per_chunk, t.num_elements - begin);
      const size_t bytes = static_cast<size_t>(count) * elem;
      const int h = next_;
      next_ ^= 1;
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_[h].get()));
      char* host = host_.as<char>(h * half_);
      std::memcpy(host, t.bytes.data() + begin * elem, bytes);
      if (t.dtype == StDtype::kBF16) {
        PDSERVE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(dst + begin, host, bytes, cudaMemcpyHostToDevice, stream_));
      } else {
        char* raw = raw_.as<char>(h * half_);
        PDSERVE_CUDA_RETURN_IF_ERROR(
            cudaMemcpyAsync(raw, host, bytes, cudaMemcpyHostToDevice, stream_));
        PDSERVE_CUDA_RETURN_IF_ERROR(
            t.dtype == StDtype::kF32
                ? ConvertF32ToBf16(reinterpret_cast<const float*>(raw), dst + begin, count, stream_)
                : ConvertF16ToBf16(reinterpret_cast<const __half*>(raw), dst + begin, count,
                                   stream_));
      }
      PDSERVE_CUDA_RETURN_IF_ERROR(cudaEventRecord(done_[h].get(), stream_));
    }
    return absl::OkStatus();
  }

  absl::Status Finish() {
    PDSERVE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }

 private:
  cudaStream_t stream_;
  size_t half_;  // bytes per half, a multiple of 4
  PinnedAllocation host_;
  DeviceAllocation raw_;
  std::array<UniqueEvent, 2> done_;  // each half's last copy (and conversion)
  int next_ = 0;
};

}  // namespace

absl::StatusOr<DeviceWeights> DeviceWeights::Load(const engine::WeightSource& source,
                                                  cudaStream_t stream, size_t staging_bytes) {
  const engine::ModelConfig& c = source.config();
  absl::Status missing = absl::OkStatus();
  auto need = [&](const engine::TensorView* t, const std::string& name) {
    if (t == nullptr && missing.ok()) {
      missing = absl::InternalError(absl::StrCat("weight source has no tensor ", name));
    }
    return t;
  };
  auto global = [&](const std::string& name) { return need(source.Find(name), name); };
  auto layer = [&](int l, const char* suffix) {
    return need(source.Layer(l, suffix), absl::StrCat("model.layers.", l, ".", suffix));
  };

  // Where each tensor goes: byte offsets into one allocation, fused tensors
  // back to back.
  struct Placement {
    const TensorView* tensor;
    size_t offset;
  };
  std::vector<Placement> places;
  ArenaLayout layout;
  auto place = [&](std::initializer_list<const TensorView*> parts) -> size_t {
    int64_t elements = 0;
    for (const TensorView* t : parts) elements += t == nullptr ? 0 : t->num_elements;
    const size_t at = layout.Take(static_cast<size_t>(elements) * sizeof(__nv_bfloat16));
    size_t offset = at;
    for (const TensorView* t : parts) {
      if (t == nullptr) continue;
      places.push_back({t, offset});
      offset += static_cast<size_t>(t->num_elements) * sizeof(__nv_bfloat16);
    }
    return at;
  };
  constexpr size_t kNone = ~size_t{0};
  struct LayerOffsets {
    size_t input_norm, wqkv, bqkv = kNone, q_norm = kNone, k_norm = kNone, wo, bo = kNone,
                             post_norm, wgu, wdown;
  };
  const size_t embed = place({global("model.embed_tokens.weight")});
  std::vector<LayerOffsets> offsets(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    LayerOffsets& o = offsets[l];
    o.input_norm = place({layer(l, "input_layernorm.weight")});
    o.wqkv = place({layer(l, "self_attn.q_proj.weight"), layer(l, "self_attn.k_proj.weight"),
                    layer(l, "self_attn.v_proj.weight")});
    if (c.qkv_bias) {
      o.bqkv = place({layer(l, "self_attn.q_proj.bias"), layer(l, "self_attn.k_proj.bias"),
                      layer(l, "self_attn.v_proj.bias")});
    }
    if (c.qk_norm) {
      o.q_norm = place({layer(l, "self_attn.q_norm.weight")});
      o.k_norm = place({layer(l, "self_attn.k_norm.weight")});
    }
    o.wo = place({layer(l, "self_attn.o_proj.weight")});
    if (c.o_bias) o.bo = place({layer(l, "self_attn.o_proj.bias")});
    o.post_norm = place({layer(l, "post_attention_layernorm.weight")});
    o.wgu = place({layer(l, "mlp.gate_proj.weight"), layer(l, "mlp.up_proj.weight")});
    o.wdown = place({layer(l, "mlp.down_proj.weight")});
  }
  const size_t final_norm = place({global("model.norm.weight")});
  const size_t lm_head = c.tie_word_embeddings ? embed : place({global("lm_head.weight")});
  if (!missing.ok()) return missing;

  DeviceWeights w;
  absl::StatusOr<DeviceAllocation> storage = DeviceAllocation::Create(layout.size(), "weights");
  if (!storage.ok()) return storage.status();
  w.storage_ = *std::move(storage);
  const auto at = [&w](size_t offset) -> const __nv_bfloat16* {
    return offset == kNone ? nullptr : w.storage_.as<__nv_bfloat16>(offset);
  };
  w.embed_ = at(embed);
  w.final_norm_ = at(final_norm);
  w.lm_head_ = at(lm_head);
  for (const LayerOffsets& o : offsets) {
    w.layers_.push_back({.input_norm = at(o.input_norm),
                         .wqkv = at(o.wqkv),
                         .bqkv = at(o.bqkv),
                         .q_norm = at(o.q_norm),
                         .k_norm = at(o.k_norm),
                         .wo = at(o.wo),
                         .bo = at(o.bo),
                         .post_norm = at(o.post_norm),
                         .wgu = at(o.wgu),
                         .wdown = at(o.wdown)});
  }

  // Every tensor but the input embedding is read by a decode step; the
  // embedding is, when it is also the LM head.
  int64_t read = 0;
  for (const Placement& p : places) read += p.tensor->num_elements;
  if (!c.tie_word_embeddings) read -= int64_t{c.vocab_size} * c.hidden_size;
  w.decode_bytes_ = read * static_cast<int64_t>(sizeof(__nv_bfloat16));

  bool convert = false;
  for (const Placement& p : places) convert = convert || p.tensor->dtype != StDtype::kBF16;
  StagedUploader uploader(stream, std::max<size_t>(staging_bytes / 2 / 4 * 4, 32));
  if (absl::Status s = uploader.Init(convert); !s.ok()) return s;
  for (const Placement& p : places) {
    if (absl::Status s = uploader.Upload(*p.tensor, w.storage_.as<__nv_bfloat16>(p.offset));
        !s.ok()) {
      cudaStreamSynchronize(stream);  // the staging buffers outlive what reads them
      return s;
    }
  }
  if (absl::Status s = uploader.Finish(); !s.ok()) return s;
  return w;
}

}  // namespace pdserve::cuda
