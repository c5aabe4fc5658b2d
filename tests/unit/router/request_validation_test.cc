#include "router/request_validation.h"

#include "gtest/gtest.h"

namespace pdserve::router {
namespace {

engine::ModelConfig Config() {
  engine::ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.vocab_size = 300;
  c.max_position_embeddings = 64;
  c.bos_token_id = 256;
  c.eos_token_ids = {257};
  return c;
}

v1::GenerateRequest Text(const std::string& text, int max_tokens) {
  v1::GenerateRequest r;
  r.set_text(text);
  r.mutable_sampling()->set_max_tokens(max_tokens);
  return r;
}

TEST(RequestValidationTest, TokenizesTextAndResolvesDefaults) {
  engine::ByteTokenizer tok(300);
  v1::GenerateRequest r = Text("hi", 5);
  r.set_add_bos(true);
  auto v = ValidateRequest(r, Config(), tok, 77);
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(v->prompt, (std::vector<int32_t>{256, 'h', 'i'}));
  EXPECT_EQ(v->sampling.seed, 77u);
  EXPECT_EQ(v->sampling.top_p, 1.0f);  // unset reads as off
  EXPECT_EQ(v->sampling.max_tokens, 5);
  r.mutable_sampling()->set_seed(5);
  EXPECT_EQ(ValidateRequest(r, Config(), tok, 77)->sampling.seed, 5u);
}

TEST(RequestValidationTest, RejectsBadInputNamingTheField) {
  engine::ByteTokenizer tok(300);
  struct Case {
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  cases.push_back({v1::GenerateRequest(), "input"});
  cases.push_back({Text("", 4), "text"});
  cases.push_back({Text(std::string(64, 'a'), 4), "input"});
  cases.push_back({Text("a", 0), "max_tokens"});
  cases.push_back({Text(std::string(60, 'a'), 5), "max_tokens"});
  {
    v1::GenerateRequest r;
    r.mutable_token_ids()->add_ids(300);
    r.mutable_sampling()->set_max_tokens(1);
    cases.push_back({r, "token_ids"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_temperature(101);
    cases.push_back({r, "temperature"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_top_k(301);
    cases.push_back({r, "top_k"});
  }
  {
    v1::GenerateRequest r = Text("a", 4);
    r.mutable_sampling()->set_top_p(-0.5f);
    cases.push_back({r, "top_p"});
  }
  for (const Case& c : cases) {
    auto v = ValidateRequest(c.request, Config(), tok, 1);
    ASSERT_FALSE(v.ok()) << c.field;
    EXPECT_EQ(v.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(v.status().message().find(c.field), absl::string_view::npos) << v.status();
  }
}

}  // namespace
}  // namespace pdserve::router
