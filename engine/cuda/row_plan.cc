// Row plans of the CUDA runner's steps (see row_plan.h).
#include "engine/cuda/row_plan.h"

#include <algorithm>

namespace pdserve::cuda {
namespace {

int64_t Slot(std::span<const int32_t> table, int t, int block_size) {
  return int64_t{table[t / block_size]} * block_size + t % block_size;
}

int FirstVisible(int position, int window) {
  return window > 0 && position >= window ? position - window + 1 : 0;
}

int BlocksFor(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

bool IsPureDecode(const engine::StepBatch& batch) {
  if (batch.seqs.empty()) return false;
  for (const engine::StepSequence& s : batch.seqs) {
    if (s.tokens.size() != 1 || s.sampling == nullptr) return false;
  }
  return true;
}

RowPlan PlanRows(const engine::StepBatch& batch, int block_size, int sliding_window,
                 int pad_to_rows, int min_table_stride) {
  RowPlan p;
  std::vector<int> decode_seqs;
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    if (batch.seqs[s].tokens.size() == 1) decode_seqs.push_back(static_cast<int>(s));
  }
  p.num_decode = std::max(static_cast<int>(decode_seqs.size()), pad_to_rows);
  p.decode_table_stride = min_table_stride;
  for (int s : decode_seqs) {
    const engine::StepSequence& seq = batch.seqs[s];
    p.decode_table_stride =
        std::max(p.decode_table_stride, BlocksFor(seq.num_cached + 1, block_size));
    p.max_decode_context = std::max(p.max_decode_context, seq.num_cached + 1);
  }
  p.decode_tables.assign(static_cast<size_t>(p.num_decode) * p.decode_table_stride, 0);

  std::vector<int32_t> last_row(batch.seqs.size(), -1);
  auto add_row = [&p](int32_t token, int32_t position, int64_t slot) {
    p.tokens.push_back(token);
    p.positions.push_back(position);
    p.slots.push_back(slot);
    return static_cast<int32_t>(p.tokens.size() - 1);
  };
  for (size_t i = 0; i < decode_seqs.size(); ++i) {
    const engine::StepSequence& seq = batch.seqs[decode_seqs[i]];
    const int blocks = BlocksFor(seq.num_cached + 1, block_size);
    std::copy(seq.block_table.begin(), seq.block_table.begin() + blocks,
              p.decode_tables.begin() + static_cast<int64_t>(i) * p.decode_table_stride);
    last_row[decode_seqs[i]] =
        add_row(seq.tokens[0], seq.num_cached, Slot(seq.block_table, seq.num_cached, block_size));
  }
  for (int r = static_cast<int>(decode_seqs.size()); r < p.num_decode; ++r) add_row(0, 0, -1);

  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    const engine::StepSequence& seq = batch.seqs[s];
    if (seq.tokens.size() == 1) continue;
    PrefillSpan span;
    span.seq = static_cast<int>(s);
    span.first_row = static_cast<int>(p.tokens.size());
    span.num_tokens = static_cast<int>(seq.tokens.size());
    span.num_cached = seq.num_cached;
    span.k_position = FirstVisible(seq.num_cached, sliding_window);
    const int end = seq.num_cached + span.num_tokens;
    if (seq.num_cached > 0) {
      span.table_offset = static_cast<int>(p.prefill_tables.size());
      p.prefill_tables.insert(p.prefill_tables.end(), seq.block_table.begin(),
                              seq.block_table.begin() + BlocksFor(end, block_size));
    }
    for (int i = 0; i < span.num_tokens; ++i) {
      last_row[s] = add_row(seq.tokens[i], seq.num_cached + i,
                            Slot(seq.block_table, seq.num_cached + i, block_size));
    }
    p.max_prefill_keys = std::max(p.max_prefill_keys, end - span.k_position);
    p.prefill.push_back(span);
  }
  p.num_rows = static_cast<int>(p.tokens.size());

  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    if (batch.seqs[s].sampling == nullptr) continue;
    p.sample_rows.push_back(last_row[s]);
    p.sample_seqs.push_back(static_cast<int>(s));
  }
  for (size_t s = 0; s < batch.seqs.size(); ++s) {
    // A sequence's rows are consecutive (a decode row, or its prefill span).
    for (int r = last_row[s] - batch.seqs[s].num_verify_rows + 1; r <= last_row[s]; ++r) {
      p.verify_rows.push_back(r);
    }
  }
  return p;
}

}  // namespace pdserve::cuda
