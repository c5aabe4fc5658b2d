// How a step's batch maps onto the rows of the CUDA runner's forward pass:
// plain host code, no CUDA.
//
// Rows: first every sequence that brings one token (a decode token, or a
// one-token prompt chunk), in batch order: these rows attend through the
// paged decode kernel as one batch; then every other sequence's tokens,
// sequence by sequence: each such span runs chunked prefill attention (its
// own queries against its cached keys and its new ones). Each row has its
// token, its position and the flat cache slot its K/V goes to.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/runtime/model_runner.h"

namespace pdserve::cuda {

// A sequence of more than one new token.
struct PrefillSpan {
  int seq = 0;        // index in the batch
  int first_row = 0;  // rows first_row .. first_row + num_tokens - 1
  int num_tokens = 0;
  int num_cached = 0;  // tokens already in the cache before this step
  // First key position its attention reads: 0, or with a sliding window the
  // first key its first query sees.
  int k_position = 0;
  // With num_cached > 0 its keys are gathered from the cache through
  // prefill_tables[table_offset ..] (blocks covering num_cached + num_tokens).
  int table_offset = 0;
};

struct RowPlan {
  int num_rows = 0;
  int num_decode = 0;              // rows 0 .. num_decode - 1 use the decode kernel
  std::vector<int32_t> tokens;     // [num_rows]
  std::vector<int32_t> positions;  // [num_rows]
  std::vector<int64_t> slots;      // [num_rows]; -1: a padding row writes no K/V
  // Decode rows' block tables, [num_decode, decode_table_stride], padded
  // with block 0 (never read: positions bound what the kernel reads).
  int decode_table_stride = 0;
  std::vector<int32_t> decode_tables;
  int max_decode_context = 0;  // max position + 1 over decode rows (0: none)
  std::vector<PrefillSpan> prefill;
  std::vector<int32_t> prefill_tables;
  int max_prefill_keys = 0;  // max over spans of num_cached + num_tokens - k_position
  // The last row of every sampling sequence, in batch order (the rows whose
  // logits are computed), and those sequences' batch indices.
  std::vector<int32_t> sample_rows;
  std::vector<int> sample_seqs;
  // The rows whose logits verification returns (each verifying sequence's
  // last num_verify_rows rows, in batch order): LM rows after sample_rows.
  std::vector<int32_t> verify_rows;
};

// Plans `batch` (already validated). `pad_to_rows` > the decode row count
// appends padding rows (token 0, position 0, no K/V write, block table of
// block 0) up to that many: a captured decode graph's fixed batch.
// `min_table_stride` widens the decode tables (a graph's fixed width).
RowPlan PlanRows(const engine::StepBatch& batch, int block_size, int sliding_window,
                 int pad_to_rows = 0, int min_table_stride = 0);

// Whether every sequence brings exactly one token and samples: a decode
// step, which a captured graph can replay.
bool IsPureDecode(const engine::StepBatch& batch);

}  // namespace pdserve::cuda
