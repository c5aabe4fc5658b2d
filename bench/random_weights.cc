#include "bench/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/weights.h"
#include "engine/runtime/sampling_draw.h"
#include "nlohmann/json.hpp"

namespace pdserve::bench {
namespace {

using engine::ModelConfig;

constexpr int64_t kChunk = int64_t{1} << 20;  // elements per random stream

struct Fill {
  std::byte* out = nullptr;  // bf16 elements
  int64_t n = 0;
  float center = 0;  // uniform in center +- half_width
  float half_width = 0;
  uint64_t key = 0;  // (seed, tensor)
};

// tools/model_writer.h's standard deviation of tensor `name`.
double StdDev(const ModelConfig& config, const engine::WeightSpec& spec) {
  if (spec.shape.size() == 1 && !spec.name.ends_with(".bias")) return 0.05;  // norm weights
  if (spec.name.ends_with(".bias")) return 0.5;
  if (spec.name == "model.embed_tokens.weight") {
    return config.tie_word_embeddings ? 1.0 / std::sqrt(static_cast<double>(config.hidden_size))
                                      : 1.0;
  }
  return 1.0 / std::sqrt(static_cast<double>(spec.shape.back()));
}

void FillChunk(const Fill& f, int64_t chunk) {
  const int64_t begin = chunk * kChunk, end = std::min(f.n, begin + kChunk);
  uint64_t state = engine::SplitMix64(f.key ^ static_cast<uint64_t>(chunk));
  for (int64_t i = begin; i < end; i += 4) {
    state = engine::SplitMix64(state);
    for (int64_t j = i; j < std::min(end, i + 4); ++j) {
      // 16 random bits -> [-1, 1).
      const float u =
          static_cast<float>(static_cast<int>((state >> (16 * (j - i))) & 0xffff) - 32768) *
          (1.0f / 32768.0f);
      const uint16_t bits = engine::FloatToBf16(f.center + f.half_width * u);
      std::memcpy(f.out + 2 * j, &bits, 2);
    }
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<engine::WeightSource>> RandomBf16Weights(const ModelConfig& config,
                                                                        uint64_t seed) {
  absl::StatusOr<ModelConfig> checked = ModelConfig::FromJson(config.ToJson());
  if (!checked.ok()) return checked.status();
  const std::vector<engine::WeightSpec> specs = engine::ModelWeightSpecs(*checked);

  // Header: tensors in spec order, data back to back.
  nlohmann::json header = nlohmann::json::object();
  std::vector<int64_t> offsets;
  int64_t data_bytes = 0;
  for (const engine::WeightSpec& spec : specs) {
    int64_t n = 1;
    for (int64_t d : spec.shape) n *= d;
    offsets.push_back(data_bytes);
    header[spec.name] = {{"dtype", "BF16"},
                         {"shape", spec.shape},
                         {"data_offsets", {data_bytes, data_bytes + 2 * n}}};
    data_bytes += 2 * n;
  }
  header["__metadata__"] = {{"format", "pt"}};
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // data 8-byte aligned

  const size_t start = 8 + text.size();
  std::string file(start + static_cast<size_t>(data_bytes), '\0');
  const uint64_t length = text.size();
  for (int i = 0; i < 8; ++i) file[i] = static_cast<char>((length >> (8 * i)) & 0xff);
  std::memcpy(file.data() + 8, text.data(), text.size());

  std::vector<Fill> fills;
  std::vector<std::pair<size_t, int64_t>> work;  // (fill, chunk)
  for (size_t t = 0; t < specs.size(); ++t) {
    const engine::WeightSpec& spec = specs[t];
    Fill f;
    f.out = reinterpret_cast<std::byte*>(file.data()) + start + offsets[t];
    f.n = 1;
    for (int64_t d : spec.shape) f.n *= d;
    const bool norm = spec.shape.size() == 1 && !spec.name.ends_with(".bias");
    f.center = norm ? 1.0f : 0.0f;
    f.half_width = static_cast<float>(StdDev(*checked, spec) * std::sqrt(3.0));
    f.key = engine::SplitMix64(engine::SplitMix64(seed) ^ (t << 40));
    fills.push_back(f);
    for (int64_t c = 0; c * kChunk < f.n; ++c) work.emplace_back(t, c);
  }
  std::atomic<size_t> next{0};
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned i = 0; i < threads; ++i) {
    pool.emplace_back([&] {
      for (size_t w = next++; w < work.size(); w = next++)
        FillChunk(fills[work[w].first], work[w].second);
    });
  }
  for (std::thread& t : pool) t.join();

  absl::StatusOr<std::unique_ptr<engine::SafetensorsFile>> parsed =
      engine::SafetensorsFile::FromBuffer(std::move(file), "random bf16 weights");
  if (!parsed.ok()) return parsed.status();
  return engine::WeightSource::FromCheckpoint(
      *checked, engine::SafetensorsCheckpoint::FromFile(*std::move(parsed)));
}

}  // namespace pdserve::bench
