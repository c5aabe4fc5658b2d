#include "common/sampling_convert.h"

namespace pdserve {

engine::SamplingParams SamplingFromProto(const internal::v1::WorkerSampling& s) {
  engine::SamplingParams p;
  p.temperature = s.temperature();
  p.top_k = s.top_k();
  p.top_p = s.top_p();
  p.seed = s.seed();
  p.max_tokens = s.max_tokens();
  p.stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p.ignore_eos = s.ignore_eos();
  return p;
}

internal::v1::WorkerSampling SamplingToProto(const engine::SamplingParams& p) {
  internal::v1::WorkerSampling s;
  s.set_temperature(p.temperature);
  s.set_top_k(p.top_k);
  s.set_top_p(p.top_p);
  s.set_seed(p.seed);
  s.set_max_tokens(p.max_tokens);
  for (int32_t t : p.stop_token_ids) s.add_stop_token_ids(t);
  s.set_ignore_eos(p.ignore_eos);
  return s;
}

}  // namespace pdserve
