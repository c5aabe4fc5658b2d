// ModelConfig parsing and validation of Hugging Face config.json text.
#include "engine/config.h"

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

}  // namespace
}  // namespace pdserve::engine
