#include "frontend/generate_request_proto.h"

#include "absl/strings/str_cat.h"
#include "frontend/errors.h"
#include "frontend/request_limits.h"
#include "frontend/sampling_wire.h"
#include "gmock/gmock.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "gtest/gtest.h"

namespace pdserve::frontend {
namespace {

// `request` serialized, with the placeholder "@@@@" replaced by bytes that
// are not UTF-8 (protobuf would not serialize them itself).
std::string WithInvalidUtf8(const v1::GenerateRequest& request) {
  std::string bytes = request.SerializeAsString();
  const size_t at = bytes.find("@@@@");
  EXPECT_NE(at, std::string::npos);
  bytes.replace(at, 4, "\xFF\xFE\xC3\x28");
  return bytes;
}

TEST(GenerateRequestProtoTest, InvalidUtf8IsInvalidArgumentNamingTheField) {
  struct Case {
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r;
    r.set_text("a@@@@b");
    cases.push_back({r, "text"});
  }
  {
    v1::GenerateRequest r;
    r.set_request_id("@@@@");
    r.set_text("ok");
    cases.push_back({r, "request_id"});
  }
  {
    v1::GenerateRequest r;
    auto* chat = r.mutable_chat();
    chat->add_messages()->set_content("fine");
    chat->add_messages()->set_content("x@@@@");
    cases.push_back({r, "chat.messages[1].content"});
  }
  {
    v1::GenerateRequest r;
    r.mutable_chat()->add_messages()->set_role("@@@@");
    cases.push_back({r, "chat.messages[0].role"});
  }
  {
    v1::GenerateRequest r;
    r.set_text("ok");
    r.mutable_sampling()->add_stop("fine");
    r.mutable_sampling()->add_stop("@@@@");
    cases.push_back({r, "sampling.stop[1]"});
  }
  {
    v1::GenerateRequest r;
    (*r.mutable_chat()->mutable_chat_template_kwargs())["@@@@"] = true;
    cases.push_back({r, "chat.chat_template_kwargs.key"});
  }
  for (const Case& c : cases) {
    absl::StatusOr<Request> decoded = DecodeGenerateRequest(WithInvalidUtf8(c.request));
    ASSERT_FALSE(decoded.ok()) << c.field;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument) << c.field;
    EXPECT_EQ(decoded.status().message(), c.field + " is not valid UTF-8");
    EXPECT_EQ(ErrorField(decoded.status()), c.field);
  }
}

TEST(GenerateRequestProtoTest, MalformedBytesAreInvalidArgument) {
  for (const std::string& bytes :
       {std::string("\x0A\xFF\xFF\xFF\xFF\x0F", 6), std::string("\x12\x05"
                                                                "ab",
                                                                4)}) {
    absl::StatusOr<Request> decoded = DecodeGenerateRequest(bytes);
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
  }
}

TEST(GenerateRequestProtoTest, ReadsEveryFieldAsTheApiDocumentsIt) {
  v1::GenerateRequest r;
  r.set_request_id("id-1");
  r.mutable_chat()->add_messages()->set_role("user");
  r.mutable_chat()->mutable_messages(0)->set_content("hi");
  (*r.mutable_chat()->mutable_chat_template_kwargs())["b"] = true;
  (*r.mutable_chat()->mutable_chat_template_kwargs())["a"] = false;
  v1::SamplingParams* s = r.mutable_sampling();
  s->set_max_tokens(9);
  s->set_temperature(0.5f);
  s->set_seed(11);
  s->add_stop("x");
  s->set_logprobs(2);
  s->add_stop_token_ids(7);
  absl::StatusOr<Request> decoded = DecodeGenerateRequest(r.SerializeAsString());
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ(decoded->request_id, "id-1");
  EXPECT_EQ(decoded->input, Request::Input::kChat);
  ASSERT_EQ(decoded->chat.messages.size(), 1u);
  EXPECT_EQ(decoded->chat.messages[0].content, "hi");
  // Sorted: a protobuf map has no order.
  EXPECT_EQ(decoded->chat.template_flags,
            (std::vector<std::pair<std::string, bool>>{{"a", false}, {"b", true}}));
  EXPECT_EQ(decoded->sampling.max_tokens, 9);
  EXPECT_EQ(decoded->sampling.top_p, 1.0f);               // 0 reads as off
  EXPECT_EQ(decoded->sampling.repetition_penalty, 1.0f);  // 0 reads as off
  EXPECT_EQ(decoded->seed, 11u);
  EXPECT_EQ(decoded->stop, std::vector<std::string>{"x"});
  EXPECT_EQ(decoded->sampling.logprobs, 2);
  EXPECT_EQ(decoded->sampling.stop_token_ids, std::vector<int32_t>{7});

  s->clear_seed();
  s->clear_logprobs();
  decoded = RequestFromProto(r);
  ASSERT_TRUE(decoded.ok());
  EXPECT_FALSE(decoded->seed.has_value());
  EXPECT_EQ(decoded->sampling.logprobs, -1);
  s->set_logprobs(-1);
  EXPECT_THAT(RequestFromProto(r).status().message(), ::testing::HasSubstr("sampling.logprobs"));
}

TEST(GenerateRequestProtoTest, DeltasBecomeResponses) {
  Delta d;
  d.token_ids = {5, 6};
  d.logprobs = {{.token = 5, .logprob = -0.5f, .top = {{5, -0.5f}, {9, -1.5f}}},
                {.token = 6, .logprob = -0.25f}};
  d.text = "ab";
  v1::GenerateResponse r = DeltaToProto(d, "rid");
  EXPECT_EQ(r.request_id(), "rid");
  EXPECT_EQ(r.token_ids_size(), 2);
  ASSERT_EQ(r.logprobs_size(), 2);
  EXPECT_EQ(r.logprobs(0).top(1).token_id(), 9);
  EXPECT_EQ(r.finish_reason(), v1::FINISH_REASON_UNSPECIFIED);
  EXPECT_FALSE(r.has_usage());

  Delta last;
  last.finished = true;
  last.finish_reason = engine::FinishReason::kStop;
  last.matched_stop = "END";
  last.prompt_tokens = 3;
  last.completion_tokens = 2;
  last.timings.decode_worker = "d0";
  r = DeltaToProto(last, "rid");
  EXPECT_EQ(r.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(r.matched_stop(), "END");
  EXPECT_EQ(r.usage().completion_tokens(), 2);
  EXPECT_EQ(r.timings().decode_worker(), "d0");
}

TEST(SamplingWireTest, RoundTripsEveryField) {
  engine::SamplingParams p{.temperature = 0.7f,
                           .top_k = 5,
                           .top_p = 0.9f,
                           .min_p = 0.1f,
                           .seed = 99,
                           .max_tokens = 12,
                           .stop_token_ids = {3, 4},
                           .ignore_eos = true,
                           .repetition_penalty = 1.2f,
                           .presence_penalty = 0.5f,
                           .frequency_penalty = -0.5f,
                           .min_tokens = 2,
                           .logprobs = 3};
  const engine::SamplingParams q = SamplingFromProto(SamplingToProto(p));
  EXPECT_EQ(q.temperature, p.temperature);
  EXPECT_EQ(q.top_k, p.top_k);
  EXPECT_EQ(q.top_p, p.top_p);
  EXPECT_EQ(q.min_p, p.min_p);
  EXPECT_EQ(q.seed, p.seed);
  EXPECT_EQ(q.max_tokens, p.max_tokens);
  EXPECT_EQ(q.stop_token_ids, p.stop_token_ids);
  EXPECT_EQ(q.ignore_eos, p.ignore_eos);
  EXPECT_EQ(q.repetition_penalty, p.repetition_penalty);
  EXPECT_EQ(q.presence_penalty, p.presence_penalty);
  EXPECT_EQ(q.frequency_penalty, p.frequency_penalty);
  EXPECT_EQ(q.min_tokens, p.min_tokens);
  EXPECT_EQ(q.logprobs, p.logprobs);

  engine::SampledToken t{.token = 8, .logprob = -0.3f, .top = {{8, -0.3f}, {2, -2.0f}}};
  const engine::SampledToken u = LogprobsFromProto(8, LogprobsToProto(t));
  EXPECT_EQ(u.token, 8);
  EXPECT_EQ(u.logprob, t.logprob);
  ASSERT_EQ(u.top.size(), 2u);
  EXPECT_EQ(u.top[1].token, 2);
  EXPECT_EQ(u.top[1].logprob, -2.0f);
}

// Every repeated field a client can send has a limit, so a new one cannot
// be added without one.
void ExpectEveryListLimited(const google::protobuf::Descriptor& d, int depth) {
  ASSERT_LT(depth, 8);
  for (int i = 0; i < d.field_count(); ++i) {
    const google::protobuf::FieldDescriptor& f = *d.field(i);
    if (f.is_repeated()) {
      EXPECT_TRUE(WireLimit(f, {.max_prompt_token_ids = 4096}).has_value()) << f.full_name();
    }
    if (f.message_type() != nullptr && !f.is_map())
      ExpectEveryListLimited(*f.message_type(), depth + 1);
  }
}

TEST(GenerateRequestProtoTest, EveryRepeatedFieldOfTheRequestHasALimit) {
  ExpectEveryListLimited(*v1::GenerateRequest::descriptor(), 0);
}

// `n` stop token ids written one tag each (not packed), as a client may.
std::string UnpackedStopIds(int n) {
  std::string sampling;
  {
    google::protobuf::io::StringOutputStream raw(&sampling);
    google::protobuf::io::CodedOutputStream out(&raw);
    for (int i = 0; i < n; ++i) {
      out.WriteTag((6 << 3) | 0);  // SamplingParams.stop_token_ids, varint
      out.WriteVarint32(7);
    }
  }
  std::string request;
  {
    google::protobuf::io::StringOutputStream raw(&request);
    google::protobuf::io::CodedOutputStream out(&raw);
    out.WriteTag((2 << 3) | 2);  // GenerateRequest.text
    out.WriteVarint32(2);
    out.WriteRaw("hi", 2);
    out.WriteTag((4 << 3) | 2);  // GenerateRequest.sampling
    out.WriteVarint32(static_cast<uint32_t>(sampling.size()));
    out.WriteRaw(sampling.data(), static_cast<int>(sampling.size()));
  }
  return request;
}

TEST(GenerateRequestProtoTest, ListsOverTheirLimitsAreRefusedFromTheWire) {
  struct Case {
    v1::GenerateRequest request;
    std::string field;
  };
  std::vector<Case> cases;
  {
    v1::GenerateRequest r;
    r.set_text("x");
    for (int i = 0; i <= kMaxStopTokenIds; ++i) r.mutable_sampling()->add_stop_token_ids(i);
    cases.push_back({r, "sampling.stop_token_ids"});  // packed
  }
  {
    v1::GenerateRequest r;
    r.set_text("x");
    for (int i = 0; i <= kMaxStopStrings; ++i) r.mutable_sampling()->add_stop("s");
    cases.push_back({r, "sampling.stop"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i <= kMaxChatMessages; ++i) r.mutable_chat()->add_messages()->set_content("m");
    cases.push_back({r, "chat.messages"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i <= kMaxChatTemplateKwargs; ++i) {
      (*r.mutable_chat()->mutable_chat_template_kwargs())[absl::StrCat("k", i)] = true;
    }
    cases.push_back({r, "chat.chat_template_kwargs"});
  }
  {
    v1::GenerateRequest r;
    for (int i = 0; i <= 64; ++i) r.mutable_token_ids()->add_ids(1);
    cases.push_back({r, "input"});
  }
  for (const Case& c : cases) {
    auto decoded =
        DecodeGenerateRequest(c.request.SerializeAsString(), {.max_prompt_token_ids = 64});
    ASSERT_FALSE(decoded.ok()) << c.field;
    EXPECT_EQ(decoded.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(ErrorField(decoded.status()), c.field) << decoded.status();
    EXPECT_THAT(decoded.status().message(),
                ::testing::AnyOf(::testing::HasSubstr("at most"), ::testing::HasSubstr("context")))
        << decoded.status();
  }
  // Unpacked ids are counted too (here ~1.3 MB of them).
  auto unpacked = DecodeGenerateRequest(UnpackedStopIds(500000));
  ASSERT_FALSE(unpacked.ok());
  EXPECT_EQ(ErrorField(unpacked.status()), "sampling.stop_token_ids");
  EXPECT_THAT(unpacked.status().message(), ::testing::HasSubstr("holds 500000 entries"));
  // At the limit the request decodes.
  auto at_limit = DecodeGenerateRequest(UnpackedStopIds(kMaxStopTokenIds));
  ASSERT_TRUE(at_limit.ok()) << at_limit.status();
  EXPECT_EQ(at_limit->sampling.stop_token_ids.size(), static_cast<size_t>(kMaxStopTokenIds));
}

}  // namespace
}  // namespace pdserve::frontend
