// Reader and writer for the safetensors format
// (https://huggingface.co/docs/safetensors).
//
// File layout: an 8-byte little-endian header length N, then N bytes of a
// UTF-8 JSON object (possibly padded with trailing spaces), then the data
// section. Each JSON key other than "__metadata__" names a tensor:
//   {"dtype": "BF16", "shape": [rows, cols], "data_offsets": [begin, end]}
// where the offsets are bytes relative to the start of the data section and
// the data is row-major, little-endian.
//
// The reader treats files as hostile: every header field is validated and a
// malformed file yields INVALID_ARGUMENT naming the file (and tensor), never a
// crash. The file is memory-mapped; tensors are converted to fp32 on read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace pdserve::engine {

// Element types known to the format. Only the floating types F32, F16 and
// BF16 can be read as fp32; the others are accepted in headers (real
// checkpoints may carry them) but ReadF32 rejects them.
enum class StDtype { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool, kF8E4M3, kF8E5M2 };

std::string_view StDtypeName(StDtype dtype);  // "F32", "BF16", ...
int StDtypeBytes(StDtype dtype);

struct TensorInfo {
  std::string name;
  StDtype dtype = StDtype::kF32;
  std::vector<int64_t> shape;
  int64_t num_elements = 0;
  // Byte range [begin, end) relative to the start of the data section.
  uint64_t begin = 0;
  uint64_t end = 0;
};

// Formats a shape as "[2, 3]" for messages.
std::string ShapeString(std::span<const int64_t> shape);

class SafetensorsFile {
 public:
  // Memory-maps and validates `path`. NOT_FOUND if it cannot be opened,
  // INVALID_ARGUMENT if it is malformed.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Parses an in-memory copy of a file; `display_name` names it in messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromBuffer(std::string bytes,
                                                                     std::string display_name);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  // nullptr if there is no tensor `name`.
  const TensorInfo* Find(std::string_view name) const;
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  // The tensor's raw little-endian bytes; valid while this object lives.
  std::span<const std::byte> RawBytes(const TensorInfo& info) const;

  // Reads tensor `name` converted to fp32. NOT_FOUND if absent;
  // INVALID_ARGUMENT if its shape differs from `expected_shape` (both shapes
  // named) or its dtype is not F32/F16/BF16.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             std::span<const int64_t> expected_shape) const;
  // Same, into caller memory of exactly info.num_elements floats.
  absl::Status ReadF32Into(const TensorInfo& info, std::span<float> out) const;

 private:
  SafetensorsFile() = default;
  absl::Status Parse();

  std::string path_;
  // Exactly one of the two backs the bytes: a read-only mapping or a buffer.
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::string buffer_;
  const std::byte* data_ = nullptr;  // whole file
  size_t size_ = 0;                  // whole file, bytes
  size_t data_start_ = 0;            // 8 + header length
  std::vector<TensorInfo> tensors_;  // sorted by name
  std::unordered_map<std::string, size_t> index_;
};

// A Hugging Face checkpoint directory: either one `model.safetensors`, or
// `model.safetensors.index.json` plus the shards it names:
//   {"metadata": {...}, "weight_map": {"<tensor name>": "<shard file>", ...}}
// Shard names must be plain file names inside the directory. Open validates
// the whole index up front: every referenced shard must exist and parse, and
// every tensor must be in the shard the map names; violations are
// INVALID_ARGUMENT naming the tensor and shard. As in transformers,
// model.safetensors wins when both are present.
class SafetensorsCheckpoint {
 public:
  static absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> Open(const std::string& model_dir);
  // A checkpoint of one already-open file (tests, tools).
  static std::unique_ptr<SafetensorsCheckpoint> FromFile(std::unique_ptr<SafetensorsFile> file);

  // Where tensor `name` lives, or nullptr. `file` (optional) gets its file.
  const TensorInfo* Find(std::string_view name, const SafetensorsFile** file = nullptr) const;
  // As SafetensorsFile::ReadF32; NOT_FOUND names the checkpoint.
  absl::StatusOr<std::vector<float>> ReadF32(std::string_view name,
                                             std::span<const int64_t> expected_shape) const;
  // Every tensor name (mapped names for a sharded checkpoint), sorted.
  std::vector<std::string> names() const;
  size_t num_files() const { return files_.size(); }
  // The directory or file the checkpoint was opened from, for messages.
  const std::string& path() const { return path_; }

 private:
  SafetensorsCheckpoint() = default;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  // Tensor name -> index into files_. Empty for a single-file checkpoint.
  std::unordered_map<std::string, size_t> weight_map_;
};

// A tensor to write: `data` holds prod(shape) floats, row-major.
struct TensorToWrite {
  std::string name;
  std::vector<int64_t> shape;
  std::span<const float> data;
};

// Writes `tensors` to `path` in `dtype` (F32, F16 or BF16; floats are rounded
// to nearest even). The header lists tensors sorted by name, with data laid
// out in that order, "__metadata__" = {"format": "pt"}, and is padded with
// spaces so the data section starts 8-byte aligned. Names must be unique.
absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              StDtype dtype);

// Scalar conversions (IEEE round-to-nearest-even, NaN and Inf preserved,
// subnormals handled).
float Bf16ToFloat(uint16_t bits);
uint16_t FloatToBf16(float value);
float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);

}  // namespace pdserve::engine
