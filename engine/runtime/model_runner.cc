#include "engine/runtime/model_runner.h"

#include "absl/strings/str_cat.h"

namespace pdserve::engine {

std::string_view KvDtypeName(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return "f32";
    case KvDtype::kBF16:
      return "bf16";
    case KvDtype::kF16:
      return "f16";
  }
  return "unknown";
}

int KvDtypeBytes(KvDtype dtype) {
  switch (dtype) {
    case KvDtype::kF32:
      return 4;
    case KvDtype::kBF16:
      return 2;
    case KvDtype::kF16:
      return 2;
  }
  return 0;
}

absl::Status CheckBlockTable(std::span<const int32_t> table, int num_tokens, int block_size,
                             int num_blocks, const char* what, size_t index) {
  const int64_t needed = (int64_t{num_tokens} + block_size - 1) / block_size;
  if (static_cast<int64_t>(table.size()) < needed) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", index, ": block table of ",
                                                   table.size(), " blocks cannot hold ", num_tokens,
                                                   " tokens"));
  }
  for (int64_t i = 0; i < needed; ++i) {
    if (table[i] < 0 || table[i] >= num_blocks) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", index, ": block id ", table[i],
                                                     " out of range [0, ", num_blocks, ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateStepBatch(const StepBatch& batch, const ModelConfig& config, int block_size,
                               int num_blocks) {
  if (batch.seqs.size() > (size_t{1} << 20))
    return absl::InvalidArgumentError("step batch too large");
  int64_t total = 0;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const StepSequence& seq = batch.seqs[s];
    const int64_t n = static_cast<int64_t>(seq.tokens.size());
    if (n == 0) return absl::InvalidArgumentError(absl::StrCat("step sequence ", s, ": no tokens"));
    if (seq.num_cached < 0 || seq.num_cached + n > config.max_position_embeddings) {
      return absl::InvalidArgumentError(absl::StrCat(
          "step sequence ", s, ": positions ", seq.num_cached, "..", seq.num_cached + n - 1,
          " outside [0, max_position_embeddings ", config.max_position_embeddings, ")"));
    }
    for (int32_t t : seq.tokens) {
      if (t < 0 || t >= config.vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "step sequence ", s, ": token ", t, " out of range [0, ", config.vocab_size, ")"));
      }
    }
    if (absl::Status st = CheckBlockTable(seq.block_table, static_cast<int>(seq.num_cached + n),
                                          block_size, num_blocks, "step sequence", s);
        !st.ok()) {
      return st;
    }
    if (seq.num_verify_rows < 0 || seq.num_verify_rows > n ||
        (seq.num_verify_rows > 0 && seq.sampling != nullptr)) {
      return absl::InvalidArgumentError(absl::StrCat("step sequence ", s, ": num_verify_rows ",
                                                     seq.num_verify_rows, " must be in [0, ", n,
                                                     "] and 0 when the sequence samples"));
    }
    if (seq.sampling != nullptr) {
      if (absl::Status st = ValidateSamplingParams(*seq.sampling, config.vocab_size); !st.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("step sequence ", s, ": ", st.message()));
      }
    }
    total += n;
  }
  if (total > (int64_t{1} << 24)) {
    return absl::InvalidArgumentError(absl::StrCat("step of ", total, " tokens is too large"));
  }
  return absl::OkStatus();
}

absl::Status CheckLayerKvArgs(const char* what, const ModelConfig& config, int layer,
                              std::span<const int32_t> block_table, int num_tokens, int block_size,
                              int num_blocks, size_t buffer_bytes, size_t expected_bytes) {
  if (layer < 0 || layer >= config.num_layers || num_tokens < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": bad layer ", layer, " or token count ", num_tokens));
  }
  if (absl::Status s = CheckBlockTable(block_table, num_tokens, block_size, num_blocks,
                                       absl::StrCat(what, " table").c_str(), 0);
      !s.ok()) {
    return s;
  }
  if (buffer_bytes != expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": buffer of ", buffer_bytes, " bytes, need ", expected_bytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<StepOutput> ModelRunner::Step(StepBatch batch) {
  absl::StatusOr<std::unique_ptr<StepHandle>> handle = Enqueue(std::move(batch));
  if (!handle.ok()) return handle.status();
  return (*handle)->Wait();
}

namespace {
// Greedy, so the step samples (and returns logits) without touching them.
const SamplingParams kLogitsOnly{};
}  // namespace

absl::Status PrefillForLogits(ModelRunner& runner, std::span<const PrefillSequence> seqs,
                              const LayerDoneFn& on_layer_done, std::vector<float>& logits) {
  logits.clear();
  StepBatch batch;
  batch.return_logits = true;
  for (const PrefillSequence& s : seqs) {
    batch.seqs.push_back({.tokens = s.tokens,
                          .num_cached = 0,
                          .block_table = s.block_table,
                          .sampling = &kLogitsOnly,
                          .history = {.prompt = s.tokens, .generated = {}}});
  }
  absl::StatusOr<std::unique_ptr<StepHandle>> handle = runner.Enqueue(std::move(batch));
  if (!handle.ok()) return handle.status();
  if (on_layer_done && !seqs.empty()) {
    for (int layer = 0; layer < runner.config().num_layers; ++layer) {
      if (absl::Status s = (*handle)->WaitLayer(layer); !s.ok()) {
        return (*handle)->Wait().status();
      }
      on_layer_done(layer);
    }
  }
  absl::StatusOr<StepOutput> out = (*handle)->Wait();
  if (!out.ok()) return out.status();
  logits = std::move(out->logits);
  return absl::OkStatus();
}

absl::Status DecodeForLogits(ModelRunner& runner, std::span<const DecodeSequence> seqs,
                             std::vector<float>& logits) {
  logits.clear();
  StepBatch batch;
  batch.return_logits = true;
  for (const DecodeSequence& s : seqs) {
    batch.seqs.push_back({.tokens = {&s.token, 1},
                          .num_cached = s.position,
                          .block_table = s.block_table,
                          .sampling = &kLogitsOnly,
                          .history = {}});
  }
  absl::StatusOr<StepOutput> out = runner.Step(std::move(batch));
  if (!out.ok()) return out.status();
  logits = std::move(out->logits);
  return absl::OkStatus();
}

}  // namespace pdserve::engine
