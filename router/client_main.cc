// pdserve_client: streams one generation from a router and prints the text as
// it arrives, then the usage and the latencies seen by the client and by the
// router.
//
//   pdserve_client --router=127.0.0.1:50051 --prompt="Hello" --max_tokens=32
#include <algorithm>
#include <fstream>
#include <iostream>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/cli.h"
#include "common/grpc_util.h"
#include "pdserve/v1/generation.grpc.pb.h"

ABSL_FLAG(std::string, router, "127.0.0.1:50051", "Router address (its client port)");
ABSL_FLAG(std::string, tls_ca_file, "",
          "PEM CA certificates to verify the router's TLS certificate (empty: plaintext)");
ABSL_FLAG(std::string, prompt, "", "Prompt text");
ABSL_FLAG(std::string, token_ids, "", "Prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(std::string, chat, "",
          "A user message, rendered by the router through the model's chat template "
          "(instead of --prompt)");
ABSL_FLAG(std::string, system, "", "With --chat: a system message before the user's");
ABSL_FLAG(std::string, chat_template_kwargs, "",
          "With --chat: boolean template variables, e.g. enable_thinking=false,x=true");
ABSL_FLAG(int, max_tokens, 32, "Tokens to generate");
ABSL_FLAG(double, temperature, 0.0, "0: greedy");
ABSL_FLAG(int, top_k, 0, "0: off");
ABSL_FLAG(double, top_p, 1.0, "1: off");
ABSL_FLAG(int64_t, seed, -1, "Sampling seed (-1: let the router choose)");
ABSL_FLAG(bool, add_bos, false,
          "Prepend the model's BOS token to a text prompt (true) or never (false); not given: "
          "as the model's tokenizer files say, the same as the OpenAI API");
ABSL_FLAG(bool, ignore_eos, false, "Do not stop at end-of-sequence");
ABSL_FLAG(int, timeout_ms, 60000, "Deadline of the call");
ABSL_FLAG(bool, print_ids, false, "Print token ids instead of text");

// Whether --add_bos / --noadd_bos is on the command line (the flag library
// does not say whether a flag was given).
bool AddBosGiven(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view a = argv[i];
    if (a == "--") break;
    for (absl::string_view name : {"add_bos", "noadd_bos"}) {
      for (absl::string_view dashes : {"-", "--"}) {
        const std::string flag = absl::StrCat(dashes, name);
        if (a == flag || absl::StartsWith(a, flag + "=")) return true;
      }
    }
  }
  return false;
}

int main(int argc, char** argv) {
  const bool add_bos_given = AddBosGiven(argc, argv);
  pdserve::ParseFlags(
      argc, argv, "Streams one generation from a pdserve router and prints it with its latencies",
      __FILE__);
  pdserve::v1::GenerateRequest request;
  if (!absl::GetFlag(FLAGS_token_ids).empty()) {
    for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_token_ids), ',')) {
      int id;
      if (!absl::SimpleAtoi(part, &id)) {
        std::cerr << "--token_ids: not a number: " << part << "\n";
        return 2;
      }
      request.mutable_token_ids()->add_ids(id);
    }
  } else if (!absl::GetFlag(FLAGS_chat).empty()) {
    if (!absl::GetFlag(FLAGS_system).empty()) {
      auto* m = request.mutable_chat()->add_messages();
      m->set_role("system");
      m->set_content(absl::GetFlag(FLAGS_system));
    }
    auto* m = request.mutable_chat()->add_messages();
    m->set_role("user");
    m->set_content(absl::GetFlag(FLAGS_chat));
    for (absl::string_view item :
         absl::StrSplit(absl::GetFlag(FLAGS_chat_template_kwargs), ',', absl::SkipEmpty())) {
      std::pair<std::string, std::string> kv = absl::StrSplit(item, absl::MaxSplits('=', 1));
      bool value;
      if (!absl::SimpleAtob(kv.second, &value)) {
        std::cerr << "--chat_template_kwargs: \"" << item << "\" is not name=true|false\n";
        return 2;
      }
      (*request.mutable_chat()->mutable_chat_template_kwargs())[kv.first] = value;
    }
  } else {
    request.set_text(absl::GetFlag(FLAGS_prompt));
  }
  if (add_bos_given) {
    request.set_add_bos(absl::GetFlag(FLAGS_add_bos));
  }
  auto* s = request.mutable_sampling();
  s->set_max_tokens(absl::GetFlag(FLAGS_max_tokens));
  s->set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
  s->set_top_k(absl::GetFlag(FLAGS_top_k));
  s->set_top_p(static_cast<float>(absl::GetFlag(FLAGS_top_p)));
  s->set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
  if (absl::GetFlag(FLAGS_seed) >= 0) s->set_seed(static_cast<uint64_t>(absl::GetFlag(FLAGS_seed)));

  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!absl::GetFlag(FLAGS_tls_ca_file).empty()) {
    std::ifstream in(absl::GetFlag(FLAGS_tls_ca_file));
    if (!in) {
      std::cerr << "cannot read " << absl::GetFlag(FLAGS_tls_ca_file) << "\n";
      return 2;
    }
    grpc::SslCredentialsOptions tls;
    tls.pem_root_certs.assign(std::istreambuf_iterator<char>(in), {});
    credentials = grpc::SslCredentials(tls);
  }
  auto stub = pdserve::v1::Generation::NewStub(
      pdserve::MakeClientChannel(absl::GetFlag(FLAGS_router), credentials));
  grpc::ClientContext ctx;
  ctx.set_deadline(
      absl::ToChronoTime(absl::Now() + absl::Milliseconds(absl::GetFlag(FLAGS_timeout_ms))));
  const absl::Time start = absl::Now();
  auto reader = stub->Generate(&ctx, request);
  pdserve::v1::GenerateResponse response, last;
  std::vector<double> gaps_ms;
  absl::Time prev;
  double ttft_ms = -1;
  while (reader->Read(&response)) {
    const absl::Time now = absl::Now();
    if (response.token_ids_size() > 0) {
      if (ttft_ms < 0) {
        ttft_ms = absl::ToDoubleMilliseconds(now - start);
      } else {
        gaps_ms.push_back(absl::ToDoubleMilliseconds(now - prev));
      }
      prev = now;
    }
    if (absl::GetFlag(FLAGS_print_ids)) {
      for (int id : response.token_ids()) std::cout << id << ' ';
    } else {
      std::cout << response.text();
    }
    std::cout.flush();
    if (response.finish_reason() != pdserve::v1::FINISH_REASON_UNSPECIFIED) last = response;
  }
  grpc::Status status = reader->Finish();
  std::cout << "\n";
  if (!status.ok()) {
    std::cerr << "error: " << status.error_code() << " " << status.error_message() << "\n";
    return 1;
  }
  std::sort(gaps_ms.begin(), gaps_ms.end());
  auto pct = [&](double p) {
    return gaps_ms.empty() ? 0.0
                           : gaps_ms[std::min(gaps_ms.size() - 1, size_t(p * gaps_ms.size()))];
  };
  const auto& t = last.timings();
  std::cerr << absl::StrFormat(
      "finish=%s prompt_tokens=%d completion_tokens=%d\n"
      "client:  ttft=%.2f ms  itl p50=%.2f ms p99=%.2f ms  e2e=%.2f ms\n"
      "router:  ttft=%.2f ms  mean itl=%.2f ms  queue=%.2f ms  e2e=%.2f ms  (prefill %s, decode "
      "%s)\n",
      pdserve::v1::FinishReason_Name(last.finish_reason()), last.usage().prompt_tokens(),
      last.usage().completion_tokens(), ttft_ms, pct(0.5), pct(0.99),
      absl::ToDoubleMilliseconds(absl::Now() - start), t.time_to_first_token_seconds() * 1e3,
      t.mean_inter_token_seconds() * 1e3, t.queue_seconds() * 1e3, t.e2e_seconds() * 1e3,
      t.prefill_worker(), t.decode_worker());
  return 0;
}
