#include "frontend/generate_request_proto.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "frontend/errors.h"
#include "frontend/request_limits.h"
#include "frontend/sampling_wire.h"
#include "frontend/structured_output.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/wire_format_lite.h"
#include "text/utf8.h"

namespace pdserve::frontend {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::internal::WireFormatLite;

constexpr int kMaxDepth = 8;  // GenerateRequest nests 3 deep

// Entries of a packed repeated field of `type` in `payload`.
int64_t PackedCount(FieldDescriptor::Type type, std::string_view payload) {
  switch (WireFormatLite::WireTypeForFieldType(static_cast<WireFormatLite::FieldType>(type))) {
    case WireFormatLite::WIRETYPE_FIXED32:
      return static_cast<int64_t>(payload.size() / 4);
    case WireFormatLite::WIRETYPE_FIXED64:
      return static_cast<int64_t>(payload.size() / 8);
    default:  // varints: one ends at each byte without the continuation bit
      return std::count_if(payload.begin(), payload.end(),
                           [](char c) { return (static_cast<unsigned char>(c) & 0x80) == 0; });
  }
}

// Walks the wire form of a `descriptor` message (without materializing it):
// names the first string field that is not valid UTF-8 (protobuf would
// refuse it without saying which), and counts each repeated field's entries
// against its limit (WireLimit) before any is stored. Malformed wire data
// is left for the real parse to refuse.
absl::Status CheckWire(const Descriptor& descriptor, std::string_view bytes,
                       const std::string& prefix, int depth, const DecodeLimits& limits) {
  if (depth > kMaxDepth) return absl::OkStatus();
  google::protobuf::io::CodedInputStream in(reinterpret_cast<const uint8_t*>(bytes.data()),
                                            static_cast<int>(bytes.size()));
  std::map<int, int64_t> counts;  // repeated field number -> entries so far
  while (true) {
    const uint32_t tag = in.ReadTag();
    if (tag == 0) break;  // the end, or malformed
    const int number = WireFormatLite::GetTagFieldNumber(tag);
    const FieldDescriptor* fd = descriptor.FindFieldByNumber(number);
    if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      if (fd != nullptr && fd->is_repeated()) ++counts[number];
      if (!WireFormatLite::SkipField(&in, tag)) break;
      continue;
    }
    uint32_t length = 0;
    if (!in.ReadVarint32(&length)) break;
    const int at = in.CurrentPosition();
    if (!in.Skip(static_cast<int>(length))) break;
    if (fd == nullptr) continue;
    const std::string_view payload = bytes.substr(static_cast<size_t>(at), length);
    const int64_t index = counts[number];
    counts[number] += fd->is_repeated() && fd->is_packable() ? PackedCount(fd->type(), payload) : 1;
    std::string name = absl::StrCat(prefix, fd->name());
    if (fd->is_repeated() && !fd->is_map()) absl::StrAppend(&name, "[", index, "]");
    if (fd->type() == FieldDescriptor::TYPE_STRING) {
      if (!text::utf8::IsValid(payload)) return FieldError(name, " is not valid UTF-8");
    } else if (fd->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s =
              CheckWire(*fd->message_type(), payload, absl::StrCat(name, "."), depth + 1, limits);
          !s.ok()) {
        return s;
      }
    }
  }
  for (const auto& [number, count] : counts) {
    const FieldDescriptor* fd = descriptor.FindFieldByNumber(number);
    const std::optional<int> limit = WireLimit(*fd, limits);
    if (!limit.has_value() || count <= *limit) continue;
    // The prompt's ids are named as validation names a prompt too long for
    // the context.
    if (fd->full_name() == "pdserve.v1.TokenIds.ids") {
      return FieldError("input", absl::StrCat(": the prompt has ", count,
                                              " token ids; the model context is ", *limit));
    }
    return FieldError(absl::StrCat(prefix, fd->name()),
                      absl::StrCat(" holds ", count, " entries; at most ", *limit));
  }
  return absl::OkStatus();
}

}  // namespace

std::optional<int> WireLimit(const FieldDescriptor& field, const DecodeLimits& limits) {
  const std::string& name = field.full_name();
  if (name == "pdserve.v1.SamplingParams.stop_token_ids") return kMaxStopTokenIds;
  if (name == "pdserve.v1.SamplingParams.stop") return kMaxStopStrings;
  if (name == "pdserve.v1.ChatMessages.messages") return kMaxChatMessages;
  if (name == "pdserve.v1.ChatMessages.chat_template_kwargs") return kMaxChatTemplateKwargs;
  if (name == "pdserve.v1.TokenIds.ids" && limits.max_prompt_token_ids > 0) {
    return limits.max_prompt_token_ids;
  }
  return std::nullopt;
}

absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view bytes,
                                                         const DecodeLimits& limits) {
  if (absl::Status s = CheckWire(*v1::GenerateRequest::descriptor(), bytes, "", 0, limits);
      !s.ok()) {
    return s;
  }
  v1::GenerateRequest request;
  if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::InvalidArgumentError("request: not a valid pdserve.v1.GenerateRequest");
  }
  return request;
}

absl::StatusOr<Request> RequestFromProto(const v1::GenerateRequest& in) {
  Request out;
  out.request_id = in.request_id();
  switch (in.input_case()) {
    case v1::GenerateRequest::kText:
      out.input = Request::Input::kText;
      out.text = in.text();
      break;
    case v1::GenerateRequest::kTokenIds:
      out.input = Request::Input::kTokenIds;
      out.token_ids.assign(in.token_ids().ids().begin(), in.token_ids().ids().end());
      break;
    case v1::GenerateRequest::kChat:
      out.input = Request::Input::kChat;
      for (const v1::ChatMessage& m : in.chat().messages()) {
        out.chat.messages.push_back({m.role(), m.content()});
      }
      for (const auto& [name, value] : in.chat().chat_template_kwargs()) {
        out.chat.template_flags.emplace_back(name, value);
      }
      // A map's order is unspecified; the template must not depend on it.
      std::sort(out.chat.template_flags.begin(), out.chat.template_flags.end());
      break;
    case v1::GenerateRequest::INPUT_NOT_SET:
      break;
  }
  if (in.has_add_bos()) out.add_bos = in.add_bos();
  out.priority = in.priority();

  const v1::SamplingParams& s = in.sampling();
  engine::SamplingParams& p = out.sampling;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p() == 0.0f ? 1.0f : s.top_p();
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  p.min_p = s.min_p();
  p.repetition_penalty = s.repetition_penalty() == 0.0f ? 1.0f : s.repetition_penalty();
  p.presence_penalty = s.presence_penalty();
  p.frequency_penalty = s.frequency_penalty();
  p.min_tokens = s.min_tokens();
  p.logprobs = s.has_logprobs() ? s.logprobs() : -1;
  if (s.has_logprobs() && s.logprobs() < 0) {
    return FieldError("sampling.logprobs", absl::StrCat(" must be in [0, 20], got ", s.logprobs()));
  }
  if (s.has_seed()) out.seed = s.seed();
  absl::StatusOr<std::string> spec =
      ProtoResponseFormatSpec(s.response_format(), "sampling.response_format");
  if (!spec.ok()) return spec.status();
  p.grammar_spec = *std::move(spec);
  out.stop.assign(s.stop().begin(), s.stop().end());
  return out;
}

absl::StatusOr<Request> DecodeGenerateRequest(std::string_view bytes, const DecodeLimits& limits) {
  absl::StatusOr<v1::GenerateRequest> request = ParseGenerateRequest(bytes, limits);
  if (!request.ok()) return request.status();
  return RequestFromProto(*request);
}

v1::GenerateResponse DeltaToProto(const Delta& delta, const std::string& request_id) {
  v1::GenerateResponse out;
  out.set_request_id(request_id);
  for (size_t i = 0; i < delta.token_ids.size(); ++i) {
    out.add_token_ids(delta.token_ids[i]);
    if (i < delta.logprobs.size()) {
      const engine::SampledToken& token = delta.logprobs[i];
      v1::TokenLogprob* lp = out.add_logprobs();
      lp->set_token_id(delta.token_ids[i]);
      lp->set_logprob(token.logprob);
      for (const engine::TopLogprob& top : token.top) {
        v1::TopLogprob* t = lp->add_top();
        t->set_token_id(top.token);
        t->set_logprob(top.logprob);
      }
    }
  }
  out.set_text(delta.text);
  if (delta.finished) {
    out.set_finish_reason(FinishReasonToProto(delta.finish_reason));
    out.set_matched_stop(delta.matched_stop);
    out.mutable_usage()->set_prompt_tokens(delta.prompt_tokens);
    out.mutable_usage()->set_completion_tokens(delta.completion_tokens);
    v1::Timings* t = out.mutable_timings();
    t->set_queue_seconds(delta.timings.queue_seconds);
    t->set_time_to_first_token_seconds(delta.timings.time_to_first_token_seconds);
    t->set_mean_inter_token_seconds(delta.timings.mean_inter_token_seconds);
    t->set_e2e_seconds(delta.timings.e2e_seconds);
    t->set_prefill_worker(delta.timings.prefill_worker);
    t->set_decode_worker(delta.timings.decode_worker);
  }
  return out;
}

}  // namespace pdserve::frontend
