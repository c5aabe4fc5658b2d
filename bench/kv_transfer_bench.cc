// pdserve_kv_transfer_bench: KV transfer bandwidth, and the transfer time
// left exposed after a prefill's compute, per transport, for prompts of the
// Llama-3.1-8B shape by default (32 layers, 8 KV heads, head_dim 128, bf16:
// 128 KiB per token). Sender and receiver run in this process over loopback,
// between KV regions with different block sizes.
//
//   pdserve_kv_transfer_bench --transport=tcp [--tokens=2048,8192] [--runs=3]
//       [--layers=32 --kv_heads=8 --head_dim=128 --dtype=bf16]
//       [--peak_flops=989e12 --mfu=0.55]
//
// Per prompt length, the median of --runs of:
//   bandwidth  every layer queued at once (no compute): bytes / (first
//              SendLayer -> the receiver has every token);
//   exposed    layer i queued when a modelled prefill finishes it, at
//              start + (i + 1) * TTFT / layers, with TTFT the shape's prefill
//              FLOPs (engine ModelConfig::PrefillFlops) at mfu x peak_flops
//              (an H100 at the design's 55% MFU target by default); exposed =
//              the receiver has every token - start - TTFT, also as a
//              fraction of TTFT (target: <= 5% at 2k tokens).
// Transports: tcp (host memory); nccl and ipc in builds with the device
// transport. Under the GPU emulation those run on host memory and emulated
// NCCL sockets: they prove the path, not GPU speed (use tiny shapes).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/base/cli.h"
#include "engine/model/config.h"
#include "kvtransfer/tcp/tcp_receiver.h"
#include "kvtransfer/tcp/tcp_sender.h"
#include "kvtransfer/transport.h"
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
#include "kvtransfer/device/device_receiver.h"
#include "kvtransfer/device/device_sender.h"
#endif

ABSL_FLAG(std::string, transport, "tcp",
          "tcp, nccl or ipc (the last two: device-transport builds)");
ABSL_FLAG(std::string, tokens, "2048,8192", "Prompt lengths, comma-separated");
ABSL_FLAG(int, runs, 3, "Runs per measurement (the median is reported)");
ABSL_FLAG(int, layers, 32, "Layers");
ABSL_FLAG(int, kv_heads, 8, "KV heads");
ABSL_FLAG(int, head_dim, 128, "Head dimension");
ABSL_FLAG(std::string, dtype, "bf16", "KV dtype: bf16, f16 or f32");
ABSL_FLAG(int, sender_block_size, 16, "Tokens per KV block on the sending side");
ABSL_FLAG(int, receiver_block_size, 32, "Tokens per KV block on the receiving side");
ABSL_FLAG(double, peak_flops, 989e12, "Prefill device peak FLOP/s for the TTFT model");
ABSL_FLAG(double, mfu, 0.55, "Prefill MFU for the TTFT model");

namespace pdserve::kvtransfer {
namespace {

// KV regions of `layers` layers holding `tokens` tokens in blocks of
// `block_size`, in host memory or (device transports) device memory.
class Regions {
 public:
  Regions(const TransferSpec& spec, int block_size, bool device) : device_(device) {
    const int num_blocks = (spec.num_tokens + block_size - 1) / block_size;
    const int64_t stride = static_cast<int64_t>(spec.TokenBytes()) * block_size;
    const size_t bytes = static_cast<size_t>(2 * stride * num_blocks * spec.num_layers);
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
    if (device) {
      void* p = nullptr;
      if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess) {
        std::fprintf(stderr, "cudaMalloc of %zu bytes: %s\n", bytes, cudaGetErrorName(e));
        std::exit(1);
      }
      base_ = static_cast<std::byte*>(p);
    }
#endif
    if (!device) {
      host_.assign(bytes, std::byte{1});
      base_ = host_.data();
    }
    const engine::KvDtype dtype = spec.bytes_per_element == 4 ? engine::KvDtype::kF32
                                  : spec.dtype == "f16"       ? engine::KvDtype::kF16
                                                              : engine::KvDtype::kBF16;
    for (int layer = 0; layer < spec.num_layers; ++layer) {
      std::byte* k = base_ + 2 * stride * num_blocks * layer;
      regions_.push_back(
          {.layer = layer,
           .memory = device ? engine::MemoryKind::kDevice : engine::MemoryKind::kHost,
           .k_base = k,
           .v_base = k + stride * num_blocks,
           .block_stride_bytes = stride,
           .num_blocks = num_blocks,
           .block_size = block_size,
           .num_kv_heads = spec.num_kv_heads,
           .head_dim = spec.head_dim,
           .dtype = dtype});
    }
    // Blocks in a shuffled order, as a paged cache hands them out.
    table_.resize(num_blocks);
    for (int b = 0; b < num_blocks; ++b) table_[b] = b;
    std::shuffle(table_.begin(), table_.end(), std::mt19937(block_size));
  }
  ~Regions() {
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
    if (device_) cudaFree(base_);
#endif
  }
  std::span<const engine::KvRegion> regions() const { return regions_; }
  const std::vector<int32_t>& table() const { return table_; }

 private:
  const bool device_;
  std::vector<std::byte> host_;
  std::byte* base_ = nullptr;
  std::vector<engine::KvRegion> regions_;
  std::vector<int32_t> table_;
};

// Records when the receiver has every token.
class TimedSink final : public ReceiveSink {
 public:
  void OnComplete(absl::StatusOr<int32_t> first_token) override {
    absl::MutexLock l(&mu_);
    status_ = first_token.status();
    end_ = absl::Now();
    done_ = true;
  }
  // The completion time, or the error.
  absl::StatusOr<absl::Time> Wait() {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(&done_));
    if (!status_.ok()) return status_;
    return end_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
  absl::Time end_ ABSL_GUARDED_BY(mu_);
};

struct Pair {
  std::unique_ptr<KvReceiver> receiver;
  std::unique_ptr<KvSender> sender;
};

absl::StatusOr<Pair> MakePair(const std::string& transport, const Regions& from,
                              const Regions& to) {
  Pair p;
  if (transport == "tcp") {
    auto receiver = TcpKvReceiver::Create("127.0.0.1", 0, to.regions());
    if (!receiver.ok()) return receiver.status();
    auto sender = TcpKvSender::Create(from.regions());
    if (!sender.ok()) return sender.status();
    p.receiver = std::move(*receiver);
    p.sender = std::move(*sender);
    return p;
  }
#if defined(PDSERVE_KV_DEVICE_TRANSPORT)
  if (transport == "nccl" || transport == "ipc") {
    device::DeviceTransportOptions options;
    options.allow_ipc = transport == "ipc";
    auto receiver = device::DeviceKvReceiver::Create("127.0.0.1", 0, to.regions(), options);
    if (!receiver.ok()) return receiver.status();
    auto sender = device::DeviceKvSender::Create(from.regions(), options);
    if (!sender.ok()) return sender.status();
    p.receiver = std::move(*receiver);
    p.sender = std::move(*sender);
    return p;
  }
#endif
  return absl::InvalidArgumentError("unknown or unbuilt --transport " + transport);
}

// One transfer; layer i is queued at `start` + layer_at[i]. Returns the
// receiver's completion time.
absl::StatusOr<absl::Time> Transfer(Pair& pair, TransferId id, const TransferSpec& spec,
                                    const Regions& from, const Regions& to, absl::Time start,
                                    absl::Duration per_layer) {
  auto sink = std::make_shared<TimedSink>();
  if (absl::Status s = pair.receiver->Expect(id, spec, to.table(), sink, absl::Seconds(600));
      !s.ok()) {
    return s;
  }
  auto session = pair.sender->Open(pair.receiver->endpoint(), id, spec);
  if (!session.ok()) return session.status();
  for (int layer = 0; layer < spec.num_layers; ++layer) {
    absl::SleepFor(start + per_layer * (layer + 1) - absl::Now());
    if (absl::Status s = (*session)->SendLayer({.layer = layer,
                                                .token_begin = 0,
                                                .num_tokens = spec.num_tokens,
                                                .block_table = from.table()});
        !s.ok()) {
      return s;
    }
  }
  absl::Mutex mu;
  bool sent = false;
  absl::Status sent_status;
  (*session)->Finish(0, [&](absl::Status s) {
    absl::MutexLock l(&mu);
    sent_status = s;
    sent = true;
  });
  absl::StatusOr<absl::Time> end = sink->Wait();
  absl::MutexLock l(&mu);
  mu.Await(absl::Condition(&sent));
  if (!sent_status.ok()) return sent_status;
  return end;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Main() {
  const std::string transport = absl::GetFlag(FLAGS_transport);
  engine::ModelConfig shape;  // Llama-3.1-8B but for the flags
  shape.architecture = "LlamaForCausalLM";
  shape.vocab_size = 128256;
  shape.hidden_size = 4096;
  shape.intermediate_size = 14336;
  shape.num_layers = absl::GetFlag(FLAGS_layers);
  shape.num_heads = 32;
  shape.num_kv_heads = absl::GetFlag(FLAGS_kv_heads);
  shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const bool device = transport != "tcp";
  std::printf("transport %s, %d layers x %d kv heads x %d head_dim, %s, blocks %d -> %d tokens\n",
              transport.c_str(), shape.num_layers, shape.num_kv_heads, shape.head_dim,
              dtype.c_str(), absl::GetFlag(FLAGS_sender_block_size),
              absl::GetFlag(FLAGS_receiver_block_size));
  std::printf(
      "| tokens | KV bytes | bandwidth GB/s | TTFT model ms | exposed ms | exposed / TTFT |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  TransferId next_id = 1;
  for (absl::string_view text : absl::StrSplit(absl::GetFlag(FLAGS_tokens), ',')) {
    int tokens = 0;
    if (!absl::SimpleAtoi(text, &tokens) || tokens <= 0) {
      std::fprintf(stderr, "bad --tokens entry '%s'\n", std::string(text).c_str());
      return 2;
    }
    TransferSpec spec;
    spec.model_fingerprint = 1;
    spec.dtype = dtype;
    spec.bytes_per_element = dtype == "f32" ? 4 : 2;
    spec.num_layers = shape.num_layers;
    spec.num_kv_heads = shape.num_kv_heads;
    spec.head_dim = shape.head_dim;
    spec.num_tokens = tokens;
    const Regions from(spec, absl::GetFlag(FLAGS_sender_block_size), device);
    const Regions to(spec, absl::GetFlag(FLAGS_receiver_block_size), device);
    absl::StatusOr<Pair> pair = MakePair(transport, from, to);
    if (!pair.ok()) {
      std::fprintf(stderr, "%s\n", pair.status().ToString().c_str());
      return 1;
    }
    const double bytes = static_cast<double>(spec.LayerBytes()) * spec.num_layers;
    const absl::Duration ttft = absl::Seconds(
        shape.PrefillFlops(tokens) / (absl::GetFlag(FLAGS_peak_flops) * absl::GetFlag(FLAGS_mfu)));
    std::vector<double> bandwidth, exposed;
    for (int run = 0; run <= absl::GetFlag(FLAGS_runs); ++run) {  // run 0 warms up
      absl::Time start = absl::Now();
      absl::StatusOr<absl::Time> end =
          Transfer(*pair, next_id++, spec, from, to, start, absl::ZeroDuration());
      if (!end.ok()) {
        std::fprintf(stderr, "transfer failed: %s\n", end.status().ToString().c_str());
        return 1;
      }
      if (run > 0) bandwidth.push_back(bytes / absl::ToDoubleSeconds(*end - start));
      start = absl::Now();
      end = Transfer(*pair, next_id++, spec, from, to, start, ttft / spec.num_layers);
      if (!end.ok()) {
        std::fprintf(stderr, "transfer failed: %s\n", end.status().ToString().c_str());
        return 1;
      }
      if (run > 0) exposed.push_back(absl::ToDoubleSeconds(*end - start - ttft));
    }
    const double exposed_s = std::max(0.0, Median(exposed));
    std::printf("| %d | %.0f MiB | %.2f | %.1f | %.1f | %.1f%% |\n", tokens, bytes / (1 << 20),
                Median(bandwidth) / 1e9, absl::ToDoubleMilliseconds(ttft), exposed_s * 1e3,
                100.0 * exposed_s / absl::ToDoubleSeconds(ttft));
  }
  return 0;
}

}  // namespace
}  // namespace pdserve::kvtransfer

int main(int argc, char** argv) {
  pdserve::ParseFlags(argc, argv, "KV transfer bandwidth and exposed transfer time per transport",
                      __FILE__);
  return pdserve::kvtransfer::Main();
}
