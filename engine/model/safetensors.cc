// Safetensors parsing, validation, fp32 conversion and writing. See
// safetensors.h for the format; every check below guards a hostile file.
#include "engine/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

namespace pdserve::engine {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = uint64_t{100} << 20;  // 100 MiB, as upstream
constexpr int kMaxJsonDepth = 64;                          // a valid header nests 3 deep
constexpr size_t kMaxNameInMessage = 200;

struct DtypeEntry {
  std::string_view name;
  StDtype dtype;
  int bytes;
};
constexpr DtypeEntry kDtypes[] = {
    {"F64", StDtype::kF64, 8},   {"F32", StDtype::kF32, 4},        {"F16", StDtype::kF16, 2},
    {"BF16", StDtype::kBF16, 2}, {"I64", StDtype::kI64, 8},        {"I32", StDtype::kI32, 4},
    {"I16", StDtype::kI16, 2},   {"I8", StDtype::kI8, 1},          {"U8", StDtype::kU8, 1},
    {"BOOL", StDtype::kBool, 1}, {"F8_E4M3", StDtype::kF8E4M3, 1}, {"F8_E5M2", StDtype::kF8E5M2, 1},
};

// Shortens attacker-controlled names before they go into messages.
std::string Printable(std::string_view s) {
  if (s.size() <= kMaxNameInMessage) return std::string(s);
  return std::string(s.substr(0, kMaxNameInMessage)) + "...";
}

// Max nesting depth of `text` as JSON, brackets inside strings skipped. Lets
// us refuse pathological nesting before the parser sees it.
int JsonDepth(std::string_view text) {
  int depth = 0, max_depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

uint16_t LoadU16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;  // little-endian host assumed (x86-64, aarch64)
}

}  // namespace

std::string_view StDtypeName(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.name;
  }
  return "?";
}

int StDtypeBytes(StDtype dtype) {
  for (const auto& e : kDtypes) {
    if (e.dtype == dtype) return e.bytes;
  }
  return 0;
}

std::string ShapeString(std::span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---- scalar conversions ----

float Bf16ToFloat(uint16_t bits) {
  uint32_t u = uint32_t{bits} << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToBf16(float value) {
  uint32_t u;
  std::memcpy(&u, &value, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even; overflow becomes Inf
  return static_cast<uint16_t>(u >> 16);
}

float HalfToFloat(uint16_t bits) {
  uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  uint32_t exp = (bits >> 10) & 0x1fu;
  uint32_t mant = bits & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in fp32.
    float f = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -f : f;
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);  // Inf or NaN (payload kept)
  } else {
    u = sign | ((exp + 112u) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t FloatToHalf(float value) {
  uint32_t x;
  std::memcpy(&x, &value, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // Inf or NaN
    return sign | 0x7c00u | (x > 0x7f800000u ? (0x200u | ((x >> 13) & 0x3ffu)) : 0u);
  }
  if (x >= 0x477ff000u) return sign | 0x7c00u;  // >= 65520 rounds to Inf
  if (x < 0x38800000u) {
    // Below the smallest normal half (2^-14): subnormal or zero. Scaling by
    // 2^24 is exact; nearbyint rounds to nearest even. 1024 encodes 2^-14.
    float f;
    std::memcpy(&f, &x, 4);
    return sign | static_cast<uint16_t>(std::nearbyint(f * 16777216.0f));
  }
  x += static_cast<uint32_t>((15 - 127) * (1 << 23)) + 0xfffu + ((x >> 13) & 1u);  // rebias + round
  return sign | static_cast<uint16_t>(x >> 13);
}

// ---- reader ----

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ != nullptr) munmap(mapping_, mapping_size_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return absl::NotFoundError(absl::StrCat("cannot open ", path, ": ", std::strerror(errno)));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = path;
  file->size_ = static_cast<size_t>(st.st_size);
  if (file->size_ > 0) {
    void* m = mmap(nullptr, file->size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (m == MAP_FAILED) {
      ::close(fd);
      return absl::InternalError(absl::StrCat("mmap ", path, ": ", std::strerror(errno)));
    }
    file->mapping_ = m;
    file->mapping_size_ = file->size_;
    file->data_ = static_cast<const std::byte*>(m);
  }
  ::close(fd);
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromBuffer(
    std::string bytes, std::string display_name) {
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile());
  file->path_ = std::move(display_name);
  file->buffer_ = std::move(bytes);
  file->data_ = reinterpret_cast<const std::byte*>(file->buffer_.data());
  file->size_ = file->buffer_.size();
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

absl::Status SafetensorsFile::Parse() {
  auto bad = [this](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": ", parts...));
  };
  if (size_ < 8) return bad("file too small for a safetensors header (", size_, " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | std::to_integer<uint64_t>(data_[i]);
  if (header_len > kMaxHeaderBytes)
    return bad("header length ", header_len, " exceeds the 100 MiB limit");
  if (header_len > size_ - 8) {
    return bad("header length ", header_len, " exceeds the file size ", size_);
  }
  data_start_ = 8 + header_len;
  const uint64_t data_size = size_ - data_start_;
  std::string_view header(reinterpret_cast<const char*>(data_ + 8), header_len);
  if (JsonDepth(header) > kMaxJsonDepth) return bad("header JSON nests too deeply");
  json j = json::parse(header.begin(), header.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return bad("header is not valid JSON");
  if (!j.is_object()) return bad("header is not a JSON object");

  tensors_.clear();
  tensors_.reserve(j.size());
  for (const auto& [key, value] : j.items()) {
    if (key == "__metadata__") continue;  // free-form string map; unused
    const std::string name = Printable(key);
    auto bad_tensor = [&](auto&&... parts) { return bad("tensor \"", name, "\": ", parts...); };
    if (!value.is_object()) return bad_tensor("entry is not an object");
    TensorInfo info;
    info.name = key;

    auto dtype_it = value.find("dtype");
    if (dtype_it == value.end() || !dtype_it->is_string())
      return bad_tensor("missing or invalid \"dtype\"");
    const std::string& dtype_name = dtype_it->get_ref<const std::string&>();
    const DtypeEntry* entry = nullptr;
    for (const auto& e : kDtypes) {
      if (e.name == dtype_name) entry = &e;
    }
    if (entry == nullptr) return bad_tensor("unknown dtype \"", Printable(dtype_name), "\"");
    info.dtype = entry->dtype;

    auto shape_it = value.find("shape");
    if (shape_it == value.end() || !shape_it->is_array())
      return bad_tensor("missing or invalid \"shape\"");
    if (shape_it->size() > 16) return bad_tensor("shape has too many dimensions");
    uint64_t elements = 1;
    for (const auto& dim : *shape_it) {
      if (!dim.is_number_unsigned())
        return bad_tensor("shape dimension is not a non-negative integer");
      uint64_t d = dim.get<uint64_t>();
      // Bounded by the file size, so no product below can overflow int64.
      if (d > (uint64_t{1} << 62) || __builtin_mul_overflow(elements, d, &elements) ||
          elements > (uint64_t{1} << 62)) {
        return bad_tensor("shape overflows");
      }
      info.shape.push_back(static_cast<int64_t>(d));
    }
    info.num_elements = static_cast<int64_t>(elements);

    auto off_it = value.find("data_offsets");
    if (off_it == value.end() || !off_it->is_array() || off_it->size() != 2 ||
        !(*off_it)[0].is_number_unsigned() || !(*off_it)[1].is_number_unsigned()) {
      return bad_tensor("missing or invalid \"data_offsets\"");
    }
    info.begin = (*off_it)[0].get<uint64_t>();
    info.end = (*off_it)[1].get<uint64_t>();
    if (info.end < info.begin)
      return bad_tensor("data_offsets end ", info.end, " < begin ", info.begin);
    if (info.end > data_size) {
      return bad_tensor("data_offsets [", info.begin, ", ", info.end, ") exceed the data section (",
                        data_size, " bytes)");
    }
    // elements <= data_size keeps the product far from overflow.
    if (elements > data_size ||
        elements * static_cast<uint64_t>(entry->bytes) != info.end - info.begin) {
      return bad_tensor("byte size ", info.end - info.begin, " does not match shape ",
                        ShapeString(info.shape), " of ", std::string(entry->name));
    }
    tensors_.push_back(std::move(info));
  }

  // No two non-empty tensors may share bytes.
  std::vector<const TensorInfo*> by_offset;
  for (const auto& t : tensors_) {
    if (t.end > t.begin) by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->begin < b->begin; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    if (by_offset[i]->begin < by_offset[i - 1]->end) {
      return bad("tensors \"", Printable(by_offset[i - 1]->name), "\" and \"",
                 Printable(by_offset[i]->name), "\" overlap");
    }
  }

  std::sort(tensors_.begin(), tensors_.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.name < b.name; });
  index_.clear();
  for (size_t i = 0; i < tensors_.size(); ++i) index_.emplace(tensors_[i].name, i);
  return absl::OkStatus();
}

const TensorInfo* SafetensorsFile::Find(std::string_view name) const {
  auto it = index_.find(std::string(name));
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(tensors_.size());
  for (const auto& t : tensors_) out.push_back(t.name);
  return out;
}

std::span<const std::byte> SafetensorsFile::RawBytes(const TensorInfo& info) const {
  return {data_ + data_start_ + info.begin, static_cast<size_t>(info.end - info.begin)};
}

absl::Status SafetensorsFile::ReadF32Into(const TensorInfo& info, std::span<float> out) const {
  if (out.size() != static_cast<size_t>(info.num_elements)) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", Printable(info.name),
                                                   "\": ", info.num_elements,
                                                   " elements, buffer holds ", out.size()));
  }
  const std::byte* src = RawBytes(info).data();
  const int64_t n = info.num_elements;
  switch (info.dtype) {
    case StDtype::kF32:
      if (n > 0) std::memcpy(out.data(), src, static_cast<size_t>(n) * 4);
      return absl::OkStatus();
    case StDtype::kBF16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) out[i] = Bf16ToFloat(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case StDtype::kF16:
#pragma omp parallel for schedule(static) if (n > (1 << 20))
      for (int64_t i = 0; i < n; ++i) out[i] = HalfToFloat(LoadU16(src + 2 * i));
      return absl::OkStatus();
    case StDtype::kF64:
    case StDtype::kI64:
    case StDtype::kI32:
    case StDtype::kI16:
    case StDtype::kI8:
    case StDtype::kU8:
    case StDtype::kBool:
    case StDtype::kF8E4M3:
    case StDtype::kF8E5M2:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", Printable(info.name),
                                                 "\": dtype ", std::string(StDtypeName(info.dtype)),
                                                 " cannot be read as F32 (need F32, F16 or BF16)"));
}

absl::StatusOr<std::vector<float>> SafetensorsFile::ReadF32(
    std::string_view name, std::span<const int64_t> expected_shape) const {
  const TensorInfo* info = Find(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": missing tensor \"", Printable(name), "\""));
  }
  if (!std::equal(info->shape.begin(), info->shape.end(), expected_shape.begin(),
                  expected_shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", Printable(name),
                                                   "\" has shape ", ShapeString(info->shape),
                                                   ", expected ", ShapeString(expected_shape)));
  }
  std::vector<float> out(static_cast<size_t>(info->num_elements));
  if (absl::Status s = ReadF32Into(*info, out); !s.ok()) return s;
  return out;
}

// ---- checkpoints (single file or sharded) ----

namespace {

constexpr uint64_t kMaxIndexBytes = uint64_t{64} << 20;
constexpr size_t kMaxShards = 100000;

// A shard name from an index: a plain file name, so a hostile index cannot
// reach outside the model directory.
bool IsPlainFileName(std::string_view name) {
  return !name.empty() && name.size() <= 255 && name != "." && name != ".." &&
         name.find('/') == std::string_view::npos && name.find('\\') == std::string_view::npos &&
         name.find('\0') == std::string_view::npos;
}

}  // namespace

std::unique_ptr<SafetensorsCheckpoint> SafetensorsCheckpoint::FromFile(
    std::unique_ptr<SafetensorsFile> file) {
  std::unique_ptr<SafetensorsCheckpoint> c(new SafetensorsCheckpoint());
  c->path_ = file->path();
  c->files_.push_back(std::move(file));
  return c;
}

absl::StatusOr<std::unique_ptr<SafetensorsCheckpoint>> SafetensorsCheckpoint::Open(
    const std::string& model_dir) {
  const std::string single = model_dir + "/model.safetensors";
  const std::string index_path = model_dir + "/model.safetensors.index.json";
  struct stat st;
  if (::stat(single.c_str(), &st) == 0 || ::stat(index_path.c_str(), &st) != 0) {
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(single);
    if (!file.ok()) {
      if (file.status().code() != absl::StatusCode::kNotFound) return file.status();
      return absl::NotFoundError(absl::StrCat(model_dir,
                                              ": neither model.safetensors nor "
                                              "model.safetensors.index.json can be opened"));
    }
    return FromFile(*std::move(file));
  }

  auto bad = [&](auto&&... parts) {
    return absl::InvalidArgumentError(absl::StrCat(index_path, ": ", parts...));
  };
  if (!S_ISREG(st.st_mode)) return bad("not a regular file");
  if (static_cast<uint64_t>(st.st_size) > kMaxIndexBytes) {
    return bad("index of ", st.st_size, " bytes exceeds the 64 MiB limit");
  }
  std::ifstream in(index_path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", index_path));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (JsonDepth(text) > kMaxJsonDepth) return bad("JSON nests too deeply");
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return bad("not a JSON object");
  auto map_it = j.find("weight_map");
  if (map_it == j.end() || !map_it->is_object() || map_it->empty()) {
    return bad("missing or empty \"weight_map\" object");
  }

  std::unique_ptr<SafetensorsCheckpoint> c(new SafetensorsCheckpoint());
  c->path_ = model_dir;
  std::map<std::string, size_t> shard_index;  // shard file name -> files_ index
  for (const auto& [name, shard] : map_it->items()) {
    if (!shard.is_string()) return bad("tensor \"", Printable(name), "\": shard is not a string");
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (!IsPlainFileName(shard_name)) {
      return bad("tensor \"", Printable(name), "\": shard \"", Printable(shard_name),
                 "\" is not a plain file name in the model directory");
    }
    auto [it, inserted] = shard_index.emplace(shard_name, c->files_.size());
    if (inserted) {
      if (c->files_.size() >= kMaxShards) return bad("more than ", kMaxShards, " shards");
      const std::string shard_path = model_dir + "/" + shard_name;
      absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
      if (!file.ok()) {
        if (file.status().code() == absl::StatusCode::kNotFound) {
          return bad("shard \"", Printable(shard_name), "\" (of tensor \"", Printable(name),
                     "\") does not exist");
        }
        return file.status();
      }
      c->files_.push_back(*std::move(file));
    }
    if (c->files_[it->second]->Find(name) == nullptr) {
      return bad("tensor \"", Printable(name), "\" is mapped to shard \"", Printable(shard_name),
                 "\", which does not contain it");
    }
    c->weight_map_.emplace(name, it->second);
  }
  return c;
}

const TensorInfo* SafetensorsCheckpoint::Find(std::string_view name,
                                              const SafetensorsFile** file) const {
  const SafetensorsFile* f = nullptr;
  if (weight_map_.empty()) {
    f = files_.empty() ? nullptr : files_[0].get();
  } else if (auto it = weight_map_.find(std::string(name)); it != weight_map_.end()) {
    f = files_[it->second].get();
  }
  const TensorInfo* info = f == nullptr ? nullptr : f->Find(name);
  if (file != nullptr) *file = info == nullptr ? nullptr : f;
  return info;
}

absl::StatusOr<std::vector<float>> SafetensorsCheckpoint::ReadF32(
    std::string_view name, std::span<const int64_t> expected_shape) const {
  const SafetensorsFile* file = nullptr;
  if (Find(name, &file) == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": missing tensor \"", Printable(name), "\""));
  }
  return file->ReadF32(name, expected_shape);
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  if (weight_map_.empty()) return files_.empty() ? std::vector<std::string>{} : files_[0]->names();
  std::vector<std::string> out;
  out.reserve(weight_map_.size());
  for (const auto& [name, index] : weight_map_) out.push_back(name);
  std::sort(out.begin(), out.end());
  return out;
}

// ---- writer ----

absl::Status WriteSafetensors(const std::string& path, std::span<const TensorToWrite> tensors,
                              StDtype dtype) {
  if (dtype != StDtype::kF32 && dtype != StDtype::kF16 && dtype != StDtype::kBF16) {
    return absl::InvalidArgumentError(
        absl::StrCat("WriteSafetensors: unsupported dtype ", std::string(StDtypeName(dtype))));
  }
  const uint64_t elem_bytes = static_cast<uint64_t>(StDtypeBytes(dtype));
  std::map<std::string, const TensorToWrite*> sorted;
  for (const auto& t : tensors) {
    if (t.name.empty() || t.name == "__metadata__") {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors: invalid name \"", t.name, "\""));
    }
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0)
        return absl::InvalidArgumentError(
            absl::StrCat("WriteSafetensors: negative dim in ", t.name));
      n *= d;
    }
    if (static_cast<size_t>(n) != t.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat("WriteSafetensors: tensor \"", t.name,
                                                     "\" has ", t.data.size(), " values, shape ",
                                                     ShapeString(t.shape), " needs ", n));
    }
    if (!sorted.emplace(t.name, &t).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("WriteSafetensors: duplicate tensor \"", t.name, "\""));
    }
  }

  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  for (const auto& [name, t] : sorted) {
    uint64_t bytes = t->data.size() * elem_bytes;
    header[name] = {{"dtype", std::string(StDtypeName(dtype))},
                    {"shape", t->shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');  // data starts 8-byte aligned

  const std::string tmp_path = path + ".tmp";
  std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
  if (!out) return absl::InternalError(absl::StrCat("cannot create ", tmp_path));
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) {
    len_bytes[i] = static_cast<unsigned char>(header_text.size() >> (8 * i));
  }
  out.write(reinterpret_cast<const char*>(len_bytes), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  std::vector<uint16_t> half;
  for (const auto& [name, t] : sorted) {
    if (dtype == StDtype::kF32) {
      out.write(reinterpret_cast<const char*>(t->data.data()),
                static_cast<std::streamsize>(t->data.size() * 4));
      continue;
    }
    half.resize(t->data.size());
    for (size_t i = 0; i < half.size(); ++i) {
      half[i] = dtype == StDtype::kBF16 ? FloatToBf16(t->data[i]) : FloatToHalf(t->data[i]);
    }
    out.write(reinterpret_cast<const char*>(half.data()),
              static_cast<std::streamsize>(half.size() * 2));
  }
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("write failed: ", tmp_path));
  if (std::rename(tmp_path.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat("rename ", tmp_path, " -> ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace pdserve::engine
