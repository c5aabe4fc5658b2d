// Weight loading by Hugging Face name, shape checks and the fingerprint;
// architecture-specific tensors (Qwen2 biases, Qwen3 q/k norms); sharded
// checkpoints and hostile index files; generation_config.json through
// CreateModelRunner; CreateModelRunner option handling.
#include "engine/model/weights.h"

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"
#include "engine/model/weight_source.h"
#include "engine/runner_factory.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/unit/engine/arch_models.h"
#include "tests/unit/engine/tiny_models.h"
#include "tools/model_writer.h"

namespace pdserve::engine {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing_models::TinyGqaConfig;
using testing_models::TinyTiedConfig;
using testing_models::WriteTinyModel;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Writes `config` as a sharded checkpoint into a fresh directory `name`.
std::string WriteSharded(const ModelConfig& config, int shards, const std::string& name,
                         const std::string& dtype = "f32") {
  const std::string dir = ::testing::TempDir() + "/" + name;
  std::filesystem::remove_all(dir);
  RandomModelOptions options;
  options.seed = 5;
  options.dtype = dtype;
  options.num_shards = shards;
  absl::Status s = WriteRandomModel(config, options, dir);
  EXPECT_TRUE(s.ok()) << s;
  return dir;
}

// Applies `edit` to `dir`/model.safetensors.index.json.
void EditIndex(const std::string& dir, const std::function<void(json&)>& edit) {
  const std::string path = dir + "/model.safetensors.index.json";
  json j = json::parse(ReadText(path));
  edit(j);
  std::ofstream(path, std::ios::trunc) << j.dump();
}

// Rewrites the header of the safetensors file at `path` with `edit` applied,
// keeping the data section as it is.
void EditHeader(const std::string& path, const std::function<void(json&)>& edit) {
  const std::string bytes = ReadText(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  json header = json::parse(bytes.substr(8, n));
  edit(header);
  const std::string text = header.dump();
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(uint64_t{text.size()} >> (8 * i));
  std::ofstream(path, std::ios::binary | std::ios::trunc) << out << text << bytes.substr(8 + n);
}

// Rewrites `dir`/model.safetensors without tensor `drop`.
void DropTensor(const std::string& dir, const std::string& drop) {
  const std::string path = dir + "/model.safetensors";
  std::vector<std::vector<float>> data;
  std::vector<TensorToWrite> keep;
  {
    auto file = SafetensorsFile::Open(path);
    ASSERT_TRUE(file.ok());
    for (const std::string& name : (*file)->names()) {
      if (name == drop) continue;
      const TensorInfo* info = (*file)->Find(name);
      data.push_back(*(*file)->ReadF32(name, info->shape));
      keep.push_back({name, info->shape, {}});
    }
  }
  for (size_t i = 0; i < keep.size(); ++i) keep[i].data = data[i];
  ASSERT_TRUE(WriteSafetensors(path, keep, StDtype::kF32).ok());
}

TEST(WeightsTest, LoadsAllTensorsWithShapes) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_load");
  auto w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->embed_tokens.size(), size_t{96 * 64});
  EXPECT_EQ(w->lm_head.size(), size_t{96 * 64});
  ASSERT_EQ(w->layers.size(), 2u);
  EXPECT_EQ(w->layers[1].k_proj.size(), size_t{32 * 64});
  EXPECT_EQ(w->layers[1].down_proj.size(), size_t{64 * 160});
  EXPECT_NE(w->fingerprint, 0u);
  EXPECT_EQ(w->fingerprint, ComputeFingerprint(c, *w));
}

TEST(WeightsTest, TiedModelHasNoLmHead) {
  const ModelConfig c = TinyTiedConfig();
  auto w = LoadModelWeights(c, WriteTinyModel(c, 1, "bf16", "weights_tied"));
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->lm_head.empty());
  EXPECT_EQ(&w->lm_head_or_embed(), &w->embed_tokens);
}

TEST(WeightsTest, FingerprintTracksWeights) {
  const ModelConfig c = TinyGqaConfig();
  auto a1 = LoadModelWeights(c, WriteTinyModel(c, 7, "f32", "fp_a1"));
  auto a2 = LoadModelWeights(c, WriteTinyModel(c, 7, "f32", "fp_a2"));
  auto b = LoadModelWeights(c, WriteTinyModel(c, 8, "f32", "fp_b"));
  auto a_bf16 = LoadModelWeights(c, WriteTinyModel(c, 7, "bf16", "fp_a_bf16"));
  ASSERT_TRUE(a1.ok() && a2.ok() && b.ok() && a_bf16.ok());
  EXPECT_EQ(a1->fingerprint, a2->fingerprint);
  EXPECT_NE(a1->fingerprint, b->fingerprint);
  EXPECT_NE(a1->fingerprint, a_bf16->fingerprint);
  // A change deep inside one tensor, at a sampled index, changes it too.
  ModelWeights changed = *std::move(a1);
  changed.layers[1].up_proj[257 * 3 + 64] += 1.0f;
  EXPECT_NE(ComputeFingerprint(c, changed), a2->fingerprint);
}

TEST(WeightsTest, MissingTensorIsNotFound) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_missing");
  DropTensor(dir, "model.layers.1.mlp.up_proj.weight");
  auto w = LoadModelWeights(c, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));
}

TEST(WeightsTest, UntiedConfigNeedsLmHead) {
  ModelConfig tied = TinyTiedConfig();
  const std::string dir = WriteTinyModel(tied, 1, "f32", "weights_no_head");
  tied.tie_word_embeddings = false;
  auto w = LoadModelWeights(tied, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("lm_head.weight"));
}

TEST(WeightsTest, WrongShapeNamesTensorAndShapes) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_shape");
  ModelConfig other = c;
  other.intermediate_size = 100;
  auto w = LoadModelWeights(other, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("[160, 64]"));
  EXPECT_THAT(w.status().message(), HasSubstr("[100, 64]"));
}

TEST(WeightsTest, WrongDtypeIsRefused) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteTinyModel(c, 1, "f32", "weights_dtype");
  // Same byte size, so the file stays well-formed; only the dtype is wrong.
  EditHeader(dir + "/model.safetensors",
             [](json& h) { h["model.layers.0.mlp.up_proj.weight"]["dtype"] = "I32"; });
  auto w = LoadModelWeights(c, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.mlp.up_proj.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("I32"));
}

// ---- WeightSource: tensors as stored ----

TEST(WeightSourceTest, ViewsHoldTheStoredValuesAndTheSameFingerprint) {
  const ModelConfig c = testing_models::TinyQwen2Config();
  for (const std::string dtype : {"f32", "bf16", "f16"}) {
    SCOPED_TRACE(dtype);
    const std::string dir = WriteSharded(c, dtype == "f16" ? 2 : 1, "source_" + dtype, dtype);
    auto source = WeightSource::Open(c, dir);
    ASSERT_TRUE(source.ok()) << source.status();
    auto weights = LoadModelWeights(c, dir);
    ASSERT_TRUE(weights.ok());
    EXPECT_EQ((*source)->fingerprint(), weights->fingerprint);
    const TensorView* up = (*source)->Layer(1, "mlp.up_proj.weight");
    ASSERT_NE(up, nullptr);
    EXPECT_EQ(up->dtype, dtype == "f32"    ? StDtype::kF32
                         : dtype == "bf16" ? StDtype::kBF16
                                           : StDtype::kF16);
    EXPECT_EQ(up->shape, (std::vector<int64_t>{c.intermediate_size, c.hidden_size}));
    std::vector<float> f32(static_cast<size_t>(up->num_elements));
    up->ToF32(f32);
    EXPECT_EQ(f32, weights->layers[1].up_proj);
    // A slice converts the same elements.
    std::vector<float> part(10);
    up->ToF32(part, 25);
    EXPECT_EQ(part, std::vector<float>(f32.begin() + 25, f32.begin() + 35));
    std::vector<uint16_t> bf16(static_cast<size_t>(up->num_elements));
    up->ToBf16(bf16);
    for (size_t i = 0; i < bf16.size(); i += 97) EXPECT_EQ(bf16[i], FloatToBf16(f32[i]));
    EXPECT_NE((*source)->Layer(0, "self_attn.q_proj.bias"), nullptr);  // Qwen2
    EXPECT_EQ((*source)->Find("model.embed_tokens.weight")->num_elements,
              int64_t{c.vocab_size} * c.hidden_size);
    EXPECT_EQ((*source)->Find("not.a.tensor"), nullptr);
  }
}

TEST(WeightSourceTest, RefusesWhatLoadWeightsRefuses) {
  const ModelConfig c = TinyGqaConfig();
  const std::string missing = WriteTinyModel(c, 1, "f32", "source_missing");
  DropTensor(missing, "model.layers.1.mlp.up_proj.weight");
  auto m = WeightSource::Open(c, missing);
  EXPECT_EQ(m.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(m.status().message(), HasSubstr("model.layers.1.mlp.up_proj.weight"));

  const std::string dir = WriteTinyModel(c, 1, "f32", "source_shape");
  ModelConfig other = c;
  other.intermediate_size = 100;
  auto s = WeightSource::Open(other, dir);
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.status().message(), HasSubstr("[160, 64]"));

  const std::string wrong = WriteTinyModel(c, 1, "f32", "source_dtype");
  EditHeader(wrong + "/model.safetensors",
             [](json& h) { h["model.layers.0.mlp.up_proj.weight"]["dtype"] = "I32"; });
  auto d = WeightSource::Open(c, wrong);
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(d.status().message(), HasSubstr("I32"));
}

// ---- architectures ----

TEST(ArchWeightsTest, Qwen2LoadsQkvBiases) {
  const ModelConfig c = testing_models::TinyQwen2Config();
  const std::string dir = WriteTinyModel(c, 1, "bf16", "weights_qwen2");
  auto w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[1].q_bias.size(), 64u);
  EXPECT_EQ(w->layers[1].k_bias.size(), 32u);
  EXPECT_EQ(w->layers[1].v_bias.size(), 32u);
  EXPECT_TRUE(w->layers[1].o_bias.empty());
  EXPECT_TRUE(w->layers[1].q_norm.empty());
  EXPECT_TRUE(w->lm_head.empty());  // tied
  DropTensor(dir, "model.layers.1.self_attn.k_proj.bias");
  w = LoadModelWeights(c, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.1.self_attn.k_proj.bias"));
}

TEST(ArchWeightsTest, Qwen3LoadsQkNorms) {
  const ModelConfig c = testing_models::TinyQwen3Config();  // head_dim 24
  const std::string dir = WriteTinyModel(c, 1, "f16", "weights_qwen3");
  auto w = LoadModelWeights(c, dir);
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_EQ(w->layers[0].q_norm.size(), 24u);
  EXPECT_EQ(w->layers[0].k_norm.size(), 24u);
  EXPECT_EQ(w->layers[0].q_proj.size(), size_t{4 * 24 * 64});
  EXPECT_TRUE(w->layers[0].q_bias.empty());
  EXPECT_EQ(ModelWeightSpecs(c).size(), 1 + 2 * 11 + 1 + 1u);
  // The norms are part of the fingerprint.
  ModelWeights changed = *w;
  changed.layers[0].k_norm[3] += 0.5f;
  EXPECT_NE(ComputeFingerprint(c, changed), w->fingerprint);
}

TEST(ArchWeightsTest, ParameterCountMatchesTensors) {
  for (const ModelConfig& c :
       {TinyGqaConfig(), TinyTiedConfig(), testing_models::TinyQwen2Config(),
        testing_models::TinyQwen3Config(), testing_models::TinyLlamaAttentionBiasConfig()}) {
    int64_t total = 0;
    for (const WeightSpec& spec : ModelWeightSpecs(c)) {
      int64_t n = 1;
      for (int64_t d : spec.shape) n *= d;
      total += n;
    }
    EXPECT_EQ(total, c.ParameterCount()) << c.architecture;
  }
}

// ---- sharded checkpoints ----

TEST(ShardedTest, LoadsLikeOneFile) {
  const ModelConfig c = testing_models::TinyQwen2Config();
  const std::string sharded = WriteSharded(c, 3, "sharded_ok");
  EXPECT_TRUE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(sharded + "/model.safetensors"));
  for (int i = 1; i <= 3; ++i) {
    EXPECT_TRUE(std::filesystem::exists(sharded + "/model-0000" + std::to_string(i) +
                                        "-of-00003.safetensors"));
  }
  auto checkpoint = SafetensorsCheckpoint::Open(sharded);
  ASSERT_TRUE(checkpoint.ok()) << checkpoint.status();
  EXPECT_EQ((*checkpoint)->num_files(), 3u);
  EXPECT_EQ((*checkpoint)->names().size(), ModelWeightSpecs(c).size());

  RandomModelOptions options;
  options.seed = 5;
  const std::string single = ::testing::TempDir() + "/sharded_ref";
  ASSERT_TRUE(WriteRandomModel(c, options, single).ok());
  auto a = LoadModelWeights(c, sharded);
  auto b = LoadModelWeights(c, single);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->fingerprint, b->fingerprint);
  EXPECT_EQ(a->layers[1].v_bias, b->layers[1].v_bias);
  EXPECT_EQ(a->final_norm, b->final_norm);

  // Rewriting the directory as one file removes the shards and the index.
  ASSERT_TRUE(WriteRandomModel(c, options, sharded).ok());
  EXPECT_FALSE(std::filesystem::exists(sharded + "/model.safetensors.index.json"));
  EXPECT_FALSE(std::filesystem::exists(sharded + "/model-00001-of-00003.safetensors"));
}

TEST(ShardedTest, MissingShardIsNamed) {
  const std::string dir = WriteSharded(TinyGqaConfig(), 2, "sharded_missing");
  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  auto w = LoadModelWeights(TinyGqaConfig(), dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
  EXPECT_THAT(w.status().message(), HasSubstr("does not exist"));
}

TEST(ShardedTest, TensorMappedToWrongShard) {
  const std::string dir = WriteSharded(TinyGqaConfig(), 2, "sharded_wrong");
  EditIndex(dir, [](json& j) {
    // model.norm.weight is in the last shard; point it at the first.
    j["weight_map"]["model.norm.weight"] = "model-00001-of-00002.safetensors";
  });
  auto w = LoadModelWeights(TinyGqaConfig(), dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(w.status().message(), HasSubstr("model.norm.weight"));
  EXPECT_THAT(w.status().message(), HasSubstr("does not contain it"));
}

TEST(ShardedTest, HostileIndexFiles) {
  const ModelConfig c = TinyGqaConfig();
  const std::string dir = WriteSharded(c, 2, "sharded_hostile");
  const std::string index = dir + "/model.safetensors.index.json";
  const std::string good = ReadText(index);
  auto open_status = [&](const std::string& text) {
    std::ofstream(index, std::ios::trunc) << text;
    return SafetensorsCheckpoint::Open(dir).status();
  };
  const std::vector<std::string> hostile = {
      "",
      "{",
      "[]",
      R"({"metadata": {}})",
      R"({"weight_map": []})",
      R"({"weight_map": {}})",
      R"({"weight_map": {"model.norm.weight": 3}})",
      R"({"weight_map": {"model.norm.weight": "../sharded_ok/model-00001-of-00003.safetensors"}})",
      R"({"weight_map": {"model.norm.weight": "/etc/passwd"}})",
      R"({"weight_map": {"model.norm.weight": ".."}})",
      R"({"weight_map": {"model.norm.weight": "config.json"}})",  // not safetensors
      std::string(100, '[') + std::string(100, ']'),
  };
  for (const std::string& text : hostile) {
    absl::Status s = open_status(text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr(dir)) << text;
  }
  // A tensor the map leaves out is simply missing.
  json j = json::parse(good);
  j["weight_map"].erase("model.layers.0.mlp.up_proj.weight");
  std::ofstream(index, std::ios::trunc) << j.dump();
  auto w = LoadModelWeights(c, dir);
  EXPECT_EQ(w.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(w.status().message(), HasSubstr("model.layers.0.mlp.up_proj.weight"));
  std::ofstream(index, std::ios::trunc) << good;
  EXPECT_TRUE(LoadModelWeights(c, dir).ok());
  // Neither file: NOT_FOUND naming the directory.
  std::filesystem::remove(index);
  EXPECT_EQ(SafetensorsCheckpoint::Open(dir).status().code(), absl::StatusCode::kNotFound);
}

TEST(ShardedTest, WriterValidatesShardCount) {
  RandomModelOptions options;
  options.num_shards = 0;
  EXPECT_FALSE(WriteRandomModel(TinyGqaConfig(), options, ::testing::TempDir() + "/s0").ok());
  options.num_shards = 1000;  // more shards than tensors
  EXPECT_FALSE(WriteRandomModel(TinyGqaConfig(), options, ::testing::TempDir() + "/s1000").ok());
  options.num_shards = static_cast<int>(ModelWeightSpecs(TinyGqaConfig()).size());  // one each
  const std::string dir = ::testing::TempDir() + "/s_each";
  ASSERT_TRUE(WriteRandomModel(TinyGqaConfig(), options, dir).ok());
  EXPECT_TRUE(LoadModelWeights(TinyGqaConfig(), dir).ok());
  options.dtype = "f8";
  EXPECT_FALSE(WriteRandomModel(TinyGqaConfig(), options, dir).ok());
}

// ---- generation_config.json and config errors through the factory ----

TEST(RunnerFactoryTest, GenerationConfigEosReachesTheRunner) {
  const ModelConfig c = TinyGqaConfig();  // eos {2}, bos 1
  const std::string dir = ::testing::TempDir() + "/factory_gen_config";
  RandomModelOptions options;
  options.write_generation_config = true;
  options.generation_eos_token_ids = {2, 7};
  options.generation_bos_token_id = 3;
  ASSERT_TRUE(WriteRandomModel(c, options, dir).ok());
  RunnerOptions ro;
  ro.model_dir = dir;
  ro.num_kv_blocks = 4;
  ro.num_threads = 1;
  auto runner = CreateModelRunner(ro);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_THAT((*runner)->config().eos_token_ids, testing::ElementsAre(2, 7));
  EXPECT_EQ((*runner)->config().bos_token_id, 3);

  std::ofstream(dir + "/generation_config.json", std::ios::trunc) << R"({"eos_token_id": 5000})";
  EXPECT_EQ(CreateModelRunner(ro).status().code(), absl::StatusCode::kInvalidArgument);
}

// Workers whose stored weights hold different numbers compute different KV:
// their fingerprints differ so the KV handshake refuses to pair them. Storage
// that keeps the checkpoint's numbers keeps its fingerprint.
TEST(RunnerFactoryTest, LossyWeightStorageChangesTheFingerprint) {
  RunnerOptions ro;
  ro.num_kv_blocks = 4;
  ro.num_threads = 1;
  auto fingerprint = [&ro](WeightDtype dtype) {
    ro.weight_dtype = dtype;
    auto r = CreateModelRunner(ro);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? (*r)->fingerprint() : 0;
  };
  ro.model_dir = WriteTinyModel(TinyGqaConfig(), 4, "f32", "factory_fp_f32");
  auto source = WeightSource::Open(TinyGqaConfig(), ro.model_dir);
  ASSERT_TRUE(source.ok());
  EXPECT_EQ(fingerprint(WeightDtype::kAuto), (*source)->fingerprint());
  EXPECT_EQ(fingerprint(WeightDtype::kF32), (*source)->fingerprint());
  EXPECT_NE(fingerprint(WeightDtype::kBf16), (*source)->fingerprint());  // rounded
  EXPECT_NE(fingerprint(WeightDtype::kInt8), (*source)->fingerprint());
  EXPECT_NE(fingerprint(WeightDtype::kInt8), fingerprint(WeightDtype::kBf16));
  // w8a8 stores int8's numbers but rounds activations: different KV again.
  EXPECT_NE(fingerprint(WeightDtype::kW8A8), fingerprint(WeightDtype::kInt8));
  EXPECT_NE(fingerprint(WeightDtype::kW8A8), (*source)->fingerprint());
  // A bf16 checkpoint kept in bf16 is its own numbers.
  ro.model_dir = WriteTinyModel(TinyGqaConfig(), 4, "bf16", "factory_fp_bf16");
  EXPECT_EQ(fingerprint(WeightDtype::kBf16), fingerprint(WeightDtype::kAuto));
  EXPECT_EQ(fingerprint(WeightDtype::kF32), fingerprint(WeightDtype::kAuto));
}

TEST(RunnerFactoryTest, UnknownArchitectureIsInvalidArgument) {
  const std::string dir = WriteTinyModel(TinyGqaConfig(), 1, "f32", "factory_arch");
  json j = json::parse(ReadText(dir + "/config.json"));
  j["architectures"] = {"GPT2LMHeadModel"};
  std::ofstream(dir + "/config.json", std::ios::trunc) << j.dump();
  RunnerOptions ro;
  ro.model_dir = dir;
  auto runner = CreateModelRunner(ro);
  EXPECT_EQ(runner.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(runner.status().message(), HasSubstr("GPT2LMHeadModel"));
}

TEST(RunnerFactoryTest, BackendsAndKvSizing) {
  const ModelConfig c = TinyGqaConfig();
  RunnerOptions options;
  options.model_dir = WriteTinyModel(c, 1, "f32", "factory");
  options.kv_block_size = 4;
  options.num_threads = 2;

  options.backend = "cuda";
  auto cuda = CreateModelRunner(options);
  if (FindBackend("cuda") == nullptr) {  // a build without the CUDA backend says so
    EXPECT_EQ(cuda.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(cuda.status().message(), HasSubstr("cuda backend not built"));
  } else {  // a CUDA build: a runner, or no usable device
    EXPECT_TRUE(cuda.ok() || cuda.status().code() == absl::StatusCode::kFailedPrecondition)
        << cuda.status();
  }
  options.backend = "tpu";
  EXPECT_EQ(CreateModelRunner(options).status().code(), absl::StatusCode::kInvalidArgument);

  options.backend = "cpu";
  options.kv_cache_bytes = 1 << 20;  // 512 B/token (2*2 layers*32*4) * 4 tokens/block
  auto runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok()) << runner.status();
  EXPECT_EQ((*runner)->num_kv_blocks(), 512);
  EXPECT_EQ((*runner)->kv_block_size(), 4);
  EXPECT_EQ((*runner)->kv_dtype(), KvDtype::kF32);
  EXPECT_EQ((*runner)->LayerKvBytes(10), size_t{2 * 10 * 32 * 4});

  options.kv_cache_bytes = 1;  // at least one block
  runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok());
  EXPECT_EQ((*runner)->num_kv_blocks(), 1);

  options.num_kv_blocks = 9;  // explicit count wins
  runner = CreateModelRunner(options);
  ASSERT_TRUE(runner.ok());
  EXPECT_EQ((*runner)->num_kv_blocks(), 9);

  options.kv_block_size = 0;
  EXPECT_EQ(CreateModelRunner(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.kv_block_size = 4;
  options.model_dir = ::testing::TempDir() + "/no_such_model";
  EXPECT_FALSE(CreateModelRunner(options).ok());
}

}  // namespace
}  // namespace pdserve::engine
