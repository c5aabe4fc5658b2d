#include "bench/loadgen/client.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/grpc_util.h"
#include "pdserve/v1/generation.grpc.pb.h"

namespace pdserve::loadgen {
namespace {

constexpr int kCallsPerChannel = 64;  // HTTP/2 streams per connection

std::shared_ptr<grpc::Channel> NewChannel(const std::string& target, int id) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(kMaxGrpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxGrpcMessageBytes);
  // A connection of its own, not shared with the other channels.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt("pdserve.loadgen_channel", id);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

RequestRecord RunOne(v1::Generation::Stub& stub, const PlannedRequest& planned, const RunOptions& options,
                     absl::Time run_start) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("loadgen-", planned.index));
  request.mutable_token_ids()->mutable_ids()->Assign(planned.prompt.begin(), planned.prompt.end());
  v1::SamplingParams* sampling = request.mutable_sampling();
  const bool client_stops = options.max_tokens > 0;
  const int wanted =
      client_stops ? std::min(planned.output_len, options.max_tokens) : planned.output_len;
  sampling->set_max_tokens(client_stops ? options.max_tokens : planned.output_len);
  sampling->set_ignore_eos(true);
  sampling->set_temperature(options.temperature);
  sampling->set_seed(static_cast<uint64_t>(planned.index) + 1);

  RequestRecord record;
  record.index = planned.index;
  record.scheduled_s = planned.send_at_s;
  record.warmup = planned.send_at_s < options.warmup_s;
  record.prompt_tokens = static_cast<int>(planned.prompt.size());

  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(options.request_timeout_s)));
  const absl::Time start = absl::Now();
  record.send_s = absl::ToDoubleSeconds(start - run_start);
  auto reader = stub.Generate(&ctx, request);
  v1::GenerateResponse response;
  absl::Time last_token;
  while (reader->Read(&response)) {
    const int n = response.token_ids_size();
    if (n == 0) continue;
    const absl::Time now = absl::Now();
    if (record.output_tokens == 0) {
      record.ttft_s = absl::ToDoubleSeconds(now - start);
    } else {
      record.token_gaps_s.push_back(absl::ToDoubleSeconds(now - last_token));
    }
    // The message's other tokens arrived with its first one: gap 0.
    for (int i = 1; i < n; ++i) record.token_gaps_s.push_back(0);
    record.output_tokens += n;
    last_token = now;
    if (client_stops && record.output_tokens >= wanted) break;
  }
  if (client_stops && record.output_tokens >= wanted) {
    // Done reading: the rest of the stream is not wanted.
    record.e2e_s = absl::ToDoubleSeconds(absl::Now() - start);
    ctx.TryCancel();
    while (reader->Read(&response)) {
    }
    reader->Finish();
    return record;
  }
  grpc::Status status = reader->Finish();
  record.e2e_s = absl::ToDoubleSeconds(absl::Now() - start);
  record.status_code = static_cast<int>(status.error_code());
  if (!status.ok()) record.error = status.error_message();
  return record;
}

}  // namespace

std::vector<RequestRecord> RunLoad(const std::vector<PlannedRequest>& plan, const RunOptions& options) {
  const int threads = std::max(1, std::min<int>(options.concurrency, static_cast<int>(plan.size())));
  std::vector<std::unique_ptr<v1::Generation::Stub>> stubs;
  for (int i = 0; i < (threads + kCallsPerChannel - 1) / kCallsPerChannel; ++i) {
    stubs.push_back(v1::Generation::NewStub(NewChannel(options.target, i)));
  }
  std::vector<RequestRecord> records(plan.size());
  std::atomic<size_t> next{0};
  std::atomic<int> in_flight{0}, done{0};
  const absl::Time run_start = absl::Now();

  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      v1::Generation::Stub& stub = *stubs[t / kCallsPerChannel];
      while (true) {
        const size_t i = next.fetch_add(1);
        if (i >= plan.size()) return;
        // Planned requests are in send order, so taking them in index order
        // and waiting for each one's time keeps the arrival process.
        const absl::Time at = run_start + absl::Seconds(plan[i].send_at_s);
        absl::SleepFor(at - absl::Now());
        in_flight.fetch_add(1);
        records[i] = RunOne(stub, plan[i], options, run_start);
        in_flight.fetch_sub(1);
        done.fetch_add(1);
      }
    });
  }
  if (options.progress) {
    while (done.load() < static_cast<int>(plan.size())) {
      for (int i = 0; i < 50 && done.load() < static_cast<int>(plan.size()); ++i) {
        absl::SleepFor(absl::Milliseconds(100));
      }
      std::fprintf(stderr, "loadgen: %.0f s, %d/%zu done, %d in flight\n",
                   absl::ToDoubleSeconds(absl::Now() - run_start), done.load(), plan.size(), in_flight.load());
    }
  }
  for (std::thread& t : pool) t.join();
  return records;
}

}  // namespace pdserve::loadgen
