// ModelConfig parsing and validation of Hugging Face config.json text, the
// architecture features (Mistral, Qwen2, Qwen3, Llama 3.1 rope scaling),
// generation_config.json merging, and RoPE inverse frequencies.
#include "engine/model/config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// A Llama-3.2-1B-like config.json.
json GoodConfig() {
  return json::parse(R"({
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "vocab_size": 128256,
    "hidden_size": 2048,
    "intermediate_size": 8192,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-05,
    "rope_theta": 500000.0,
    "tie_word_embeddings": true,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "torch_dtype": "bfloat16"
  })");
}

TEST(ConfigTest, ParsesGoodConfig) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->architecture, "LlamaForCausalLM");
  EXPECT_EQ(c->vocab_size, 128256);
  EXPECT_EQ(c->hidden_size, 2048);
  EXPECT_EQ(c->intermediate_size, 8192);
  EXPECT_EQ(c->num_layers, 16);
  EXPECT_EQ(c->num_heads, 32);
  EXPECT_EQ(c->num_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(c->rope_theta, 500000.0f);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_THAT(c->eos_token_ids, testing::ElementsAre(128001, 128008, 128009));
  EXPECT_TRUE(c->IsEos(128009));
  EXPECT_FALSE(c->IsEos(128000));
  EXPECT_EQ(c->torch_dtype, "bfloat16");
  EXPECT_EQ(c->q_size(), 2048);
  EXPECT_EQ(c->kv_size(), 512);
  EXPECT_EQ(c->KvBytesPerToken(2), 32 * 1024);  // 32 KiB/token in bf16, as DESIGN.md says
}

TEST(ConfigTest, DefaultsForOptionalFields) {
  json j = GoodConfig();
  for (const char* key : {"num_key_value_heads", "head_dim", "rms_norm_eps", "rope_theta",
                          "tie_word_embeddings", "bos_token_id", "eos_token_id"}) {
    j.erase(key);
  }
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_kv_heads, 32);  // defaults to num_attention_heads
  EXPECT_EQ(c->head_dim, 64);      // hidden / heads
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_EQ(c->bos_token_id, -1);
  EXPECT_TRUE(c->eos_token_ids.empty());
}

TEST(ConfigTest, ToJsonRoundTrips) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());
  ASSERT_TRUE(c.ok());
  auto again = ModelConfig::FromJson(c->ToJson());
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToJson(), c->ToJson());
}

TEST(ConfigTest, MissingRequiredFields) {
  for (const char* key : {"architectures", "vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "max_position_embeddings"}) {
    json j = GoodConfig();
    j.erase(key);
    auto c = ModelConfig::FromJson(j.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(c.status().message(), HasSubstr(key));
  }
}

TEST(ConfigTest, RejectsNonObjectsAndWrongTypes) {
  EXPECT_FALSE(ModelConfig::FromJson("").ok());
  EXPECT_FALSE(ModelConfig::FromJson("{").ok());
  EXPECT_FALSE(ModelConfig::FromJson("[1]").ok());
  json j = GoodConfig();
  j["hidden_size"] = "2048";
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("hidden_size"));
  j = GoodConfig();
  j["vocab_size"] = -5;
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
  j = GoodConfig();
  j["num_hidden_layers"] = 0;
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("num_hidden_layers"));
  j = GoodConfig();
  j["eos_token_id"] = "x";
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
  j = GoodConfig();
  j["eos_token_id"] = 999999;
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
}

TEST(ConfigTest, HuggingFaceDefaultEps) {
  json j = GoodConfig();
  j.erase("rms_norm_eps");
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rms_norm_eps, 1e-6f);  // LlamaConfig's default
}

TEST(ConfigTest, UnsupportedArchitecture) {
  json j = GoodConfig();
  j["architectures"] = {"MixtralForCausalLM"};
  auto c = ModelConfig::FromJson(j.dump());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("MixtralForCausalLM"));
  j["architectures"] = json::array();
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
}

TEST(ConfigTest, BadHeadCounts) {
  json j = GoodConfig();
  j["num_key_value_heads"] = 5;  // 32 % 5 != 0
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("multiple"));
  j = GoodConfig();
  j.erase("head_dim");
  j["num_attention_heads"] = 30;  // 2048 % 30 != 0
  j["num_key_value_heads"] = 10;
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("divisible"));
  j = GoodConfig();
  j["head_dim"] = 63;  // RoPE needs an even head_dim
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("even"));
  j = GoodConfig();
  j["num_key_value_heads"] = 0;
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
}

TEST(ConfigTest, FromFileNamesThePath) {
  const std::string path = testing::TempDir() + "/missing_config.json";
  EXPECT_EQ(ModelConfig::FromFile(path).status().code(), absl::StatusCode::kNotFound);
}

// ---- architectures ----

json WithArch(const char* arch) {
  json j = GoodConfig();
  j["architectures"] = {arch};
  return j;
}

TEST(ArchitectureTest, LlamaHasNoExtrasUnlessAttentionBias) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->qkv_bias || c->o_bias || c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  json j = GoodConfig();
  j["attention_bias"] = true;
  c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->qkv_bias && c->o_bias);
}

TEST(ArchitectureTest, MistralSlidingWindow) {
  json j = WithArch("MistralForCausalLM");
  j["sliding_window"] = 4096;
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->sliding_window, 4096);
  EXPECT_FALSE(c->qkv_bias);
  j["sliding_window"] = nullptr;  // Mistral v0.2+: no window
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->sliding_window, 0);
  j.erase("sliding_window");  // absent: MistralConfig's default
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->sliding_window, 4096);
  j["sliding_window"] = "big";
  EXPECT_FALSE(ModelConfig::FromJson(j.dump()).ok());
  j = GoodConfig();
  j["sliding_window"] = 16;  // not a Llama key: ignored
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->sliding_window, 0);
}

TEST(ArchitectureTest, Qwen2HasQkvBiasOnly) {
  json j = WithArch("Qwen2ForCausalLM");
  j["use_sliding_window"] = false;
  j["sliding_window"] = 131072;  // ignored while use_sliding_window is false
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_FALSE(c->o_bias || c->qk_norm);
  EXPECT_EQ(c->sliding_window, 0);
  j["use_sliding_window"] = true;
  auto bad = ModelConfig::FromJson(j.dump());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bad.status().message(), HasSubstr("use_sliding_window"));
}

TEST(ArchitectureTest, Qwen3HasQkNormAndItsOwnHeadDim) {
  json j = WithArch("Qwen3ForCausalLM");
  j["head_dim"] = 128;  // hidden 2048 / 32 heads would be 64
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->qkv_bias || c->o_bias);
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->q_size(), 4096);
  j.erase("head_dim");  // Qwen3Config's default is 128, not hidden / heads
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->head_dim, 128);
  j["layer_types"] = {"full_attention", "sliding_attention"};
  EXPECT_THAT(ModelConfig::FromJson(j.dump()).status().message(), HasSubstr("layer_types"));
}

TEST(ArchitectureTest, UnsupportedFeaturesAreRefused) {
  for (auto [key, value] : {std::pair<const char*, json>{"hidden_act", "gelu"},
                            {"mlp_bias", true},
                            {"partial_rotary_factor", 0.5},
                            {"attention_bias", "yes"}}) {
    json j = GoodConfig();
    j[key] = value;
    auto c = ModelConfig::FromJson(j.dump());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(c.status().message(), HasSubstr(key));
  }
}

TEST(ArchitectureTest, ToJsonRoundTripsEveryFeature) {
  for (const char* arch :
       {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    json j = WithArch(arch);
    j["sliding_window"] = 512;
    j["attention_bias"] = true;
    j["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", 32.0},
                         {"low_freq_factor", 1.0},
                         {"high_freq_factor", 4.0},
                         {"original_max_position_embeddings", 8192}};
    auto c = ModelConfig::FromJson(j.dump());
    ASSERT_TRUE(c.ok()) << arch << ": " << c.status();
    auto again = ModelConfig::FromJson(c->ToJson());
    ASSERT_TRUE(again.ok()) << arch << ": " << again.status();
    EXPECT_EQ(again->ToJson(), c->ToJson()) << arch;
    EXPECT_EQ(again->qkv_bias, c->qkv_bias) << arch;
    EXPECT_EQ(again->o_bias, c->o_bias) << arch;
    EXPECT_EQ(again->qk_norm, c->qk_norm) << arch;
    EXPECT_EQ(again->sliding_window, c->sliding_window) << arch;
    EXPECT_EQ(again->rope_scaling.type, RopeScaling::Type::kLlama3) << arch;
    EXPECT_FLOAT_EQ(again->rope_scaling.factor, 32.0f) << arch;
    EXPECT_EQ(json::parse(c->ToJson())["model_type"],
              json::parse(R"({"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral",
                              "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"})")[arch]);
  }
}

// ---- rope scaling ----

json Llama31Scaling() {
  return {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192}};
}

TEST(RopeTest, DefaultInverseFrequencies) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());  // theta 500000, head_dim 64
  ASSERT_TRUE(c.ok());
  const std::vector<float> inv = c->RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), 32u);
  for (int i = 0; i < 32; ++i) {
    const double want = 1.0 / std::pow(500000.0, 2.0 * i / 64);
    EXPECT_NEAR(inv[i], want, 1e-6 * want) << i;
  }
}

// Llama 3.1 8B's real parameters (theta 500000, head_dim 128, factor 8,
// low 1, high 4, original context 8192) against the formula worked by hand
// in double: wavelength = 2 pi / f; below 8192/4 = 2048 kept; above 8192
// divided by 8; between, s = (8192/wavelength - 1) / 3 and
// f' = (1 - s) f / 8 + s f.
TEST(RopeTest, Llama3ScalingMatchesHandComputation) {
  json j = GoodConfig();
  j["head_dim"] = 128;
  j["num_attention_heads"] = 16;
  j["num_key_value_heads"] = 8;
  j["rope_scaling"] = Llama31Scaling();
  auto c = ModelConfig::FromJson(j.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  const std::vector<float> inv = c->RopeInverseFrequencies();
  ASSERT_EQ(inv.size(), 64u);
  int high = 0, medium = 0, low = 0;
  for (int i = 0; i < 64; ++i) {
    const double f = 1.0 / std::pow(500000.0, 2.0 * i / 128);
    const double wavelen = 2 * M_PI / f;
    double want;
    if (wavelen < 2048) {
      want = f;
      ++high;
    } else if (wavelen > 8192) {
      want = f / 8;
      ++low;
    } else {
      const double s = (8192 / wavelen - 1) / 3;
      want = (1 - s) * f / 8 + s * f;
      ++medium;
    }
    EXPECT_NEAR(inv[i], want, 2e-6 * want) << i;
  }
  // All three regimes are exercised: i < 29 high, 29..34 medium, 35.. low.
  EXPECT_EQ(high, 29);
  EXPECT_EQ(medium, 6);
  EXPECT_EQ(low, 29);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);
}

TEST(RopeTest, RopeScalingVariants) {
  json j = GoodConfig();
  j["rope_scaling"] = nullptr;
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->rope_scaling.type, RopeScaling::Type::kNone);
  j["rope_scaling"] = {{"type", "default"}};
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->rope_scaling.type, RopeScaling::Type::kNone);
  json legacy = Llama31Scaling();  // older configs spell it "type"
  legacy.erase("rope_type");
  legacy["type"] = "llama3";
  j["rope_scaling"] = legacy;
  EXPECT_EQ(ModelConfig::FromJson(j.dump())->rope_scaling.type, RopeScaling::Type::kLlama3);
  // transformers v5: "rope_parameters" carries rope_theta too.
  json v5 = GoodConfig();
  v5.erase("rope_theta");
  v5["rope_parameters"] = Llama31Scaling();
  v5["rope_parameters"]["rope_theta"] = 250000.0;
  auto c = ModelConfig::FromJson(v5.dump());
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FLOAT_EQ(c->rope_theta, 250000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
}

TEST(RopeTest, BadRopeScalingIsRefused) {
  auto status_with = [](json scaling) {
    json j = GoodConfig();
    j["rope_scaling"] = std::move(scaling);
    return ModelConfig::FromJson(j.dump()).status();
  };
  absl::Status s = status_with({{"rope_type", "yarn"}, {"factor", 4.0}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("yarn"));
  EXPECT_THAT(status_with({{"rope_type", "dynamic"}}).message(), HasSubstr("dynamic"));
  EXPECT_FALSE(status_with("llama3").ok());
  EXPECT_FALSE(status_with({{"rope_type", 3}}).ok());
  for (const char* key :
       {"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"}) {
    json scaling = Llama31Scaling();
    scaling.erase(key);
    s = status_with(scaling);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << key;
    EXPECT_THAT(s.message(), HasSubstr(key));
  }
  json equal = Llama31Scaling();
  equal["high_freq_factor"] = 1.0;  // would divide by zero
  EXPECT_FALSE(status_with(equal).ok());
  json negative = Llama31Scaling();
  negative["factor"] = -8.0;
  EXPECT_FALSE(status_with(negative).ok());
  json huge = Llama31Scaling();
  huge["factor"] = 1e300;
  EXPECT_FALSE(status_with(huge).ok());
}

// ---- generation_config.json ----

TEST(GenerationConfigTest, MergesEosAndBos) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());  // eos 128001, 128008, 128009
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE(c->MergeGenerationConfig(R"({"eos_token_id": [128009, 128004], "bos_token_id": 7,
                                          "do_sample": true, "temperature": 0.6})")
                  .ok());
  EXPECT_THAT(c->eos_token_ids, testing::ElementsAre(128001, 128008, 128009, 128004));
  EXPECT_EQ(c->bos_token_id, 7);
  ASSERT_TRUE(c->MergeGenerationConfig(R"({"eos_token_id": 5})").ok());  // int form
  EXPECT_TRUE(c->IsEos(5));
  EXPECT_EQ(c->bos_token_id, 7);  // absent bos leaves it
}

TEST(GenerationConfigTest, RejectsMalformed) {
  auto c = ModelConfig::FromJson(GoodConfig().dump());
  ASSERT_TRUE(c.ok());
  for (const char* text :
       {"", "[1]", R"({"eos_token_id": "x"})", R"({"eos_token_id": [1, -2]})",
        R"({"eos_token_id": 999999})", R"({"bos_token_id": 999999})", R"({"bos_token_id": 1.5})"}) {
    ModelConfig copy = *c;
    absl::Status s = copy.MergeGenerationConfig(text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(s.message(), HasSubstr("generation_config.json")) << text;
  }
}

TEST(GenerationConfigTest, FromModelDirReadsBothFiles) {
  const std::string dir = testing::TempDir() + "/gen_config_model";
  std::filesystem::create_directories(dir);
  json j = GoodConfig();
  j["eos_token_id"] = 128001;
  std::ofstream(dir + "/config.json") << j.dump();
  std::filesystem::remove(dir + "/generation_config.json");
  auto c = ModelConfig::FromModelDir(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, testing::ElementsAre(128001));

  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [128001, 128009]})";
  c = ModelConfig::FromModelDir(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->eos_token_ids, testing::ElementsAre(128001, 128009));

  std::ofstream(dir + "/generation_config.json") << "{not json";
  c = ModelConfig::FromModelDir(dir);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("generation_config.json"));
  EXPECT_EQ(ModelConfig::FromModelDir(dir + "/missing").status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace pdserve::engine
