#include "frontend/generate_request_proto.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "frontend/errors.h"
#include "frontend/sampling_wire.h"
#include "frontend/structured_output.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/unknown_field_set.h"
#include "text/utf8.h"

namespace pdserve::frontend {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::FieldDescriptor;
using google::protobuf::UnknownField;
using google::protobuf::UnknownFieldSet;

constexpr int kMaxDepth = 8;  // GenerateRequest nests 3 deep

// Walks the wire form of a `descriptor` message without protobuf's own UTF-8
// check and names the first string field that is not valid UTF-8. Malformed
// wire data is left for the real parse to refuse.
absl::Status CheckStrings(const Descriptor& descriptor, std::string_view bytes,
                          const std::string& prefix, int depth) {
  if (depth > kMaxDepth) return absl::OkStatus();
  UnknownFieldSet fields;
  if (!fields.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    return absl::OkStatus();
  }
  std::map<int, int> seen;  // field number -> occurrences so far (repeated index)
  for (int i = 0; i < fields.field_count(); ++i) {
    const UnknownField& field = fields.field(i);
    const FieldDescriptor* fd = descriptor.FindFieldByNumber(field.number());
    if (fd == nullptr || field.type() != UnknownField::TYPE_LENGTH_DELIMITED) continue;
    const int index = seen[field.number()]++;
    std::string name = absl::StrCat(prefix, fd->name());
    if (fd->is_repeated() && !fd->is_map()) absl::StrAppend(&name, "[", index, "]");
    if (fd->type() == FieldDescriptor::TYPE_STRING) {
      if (!text::utf8::IsValid(field.length_delimited())) {
        return FieldError(name, " is not valid UTF-8");
      }
    } else if (fd->type() == FieldDescriptor::TYPE_MESSAGE) {
      if (absl::Status s = CheckStrings(*fd->message_type(), field.length_delimited(),
                                        absl::StrCat(name, "."), depth + 1);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::GenerateRequest> ParseGenerateRequest(std::string_view bytes) {
  if (absl::Status s = CheckStrings(*v1::GenerateRequest::descriptor(), bytes, "", 0); !s.ok()) {
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
  out.add_bos = in.add_bos();
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

absl::StatusOr<Request> DecodeGenerateRequest(std::string_view bytes) {
  absl::StatusOr<v1::GenerateRequest> request = ParseGenerateRequest(bytes);
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
