// Safetensors reader/writer: round trips, exact fp16/bf16 conversion, and
// hostile files (every malformed header must give a status, never a crash).
#include "engine/model/safetensors.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pdserve::engine {
namespace {

using ::testing::HasSubstr;

std::string TempPath(const std::string& name) { return testing::TempDir() + "/" + name; }

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A file with header text `header` and `data_bytes` zero bytes of data.
std::string RawFile(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(n >> (8 * i));
  return out + header + std::string(data_bytes, '\0');
}

absl::Status ParseStatus(const std::string& bytes) {
  return SafetensorsFile::FromBuffer(bytes, "test.safetensors").status();
}

struct Fixture {
  std::vector<float> a = {1.0f, -2.5f, 3.25f, 0.0f, 1e-3f, -7.0f};  // [2, 3]
  std::vector<float> b = {0.1f, 0.2f, 0.3f, 65504.0f};              // [4]
  std::vector<float> c = {42.0f};                                   // [] (scalar)
  std::vector<float> empty;                                         // [0, 5]
  std::vector<TensorToWrite> tensors() const {
    return {{"b", {4}, b}, {"a", {2, 3}, a}, {"c", {}, c}, {"empty", {0, 5}, empty}};
  }
};

std::string WriteFixture(StDtype dtype, const std::string& name) {
  Fixture f;
  const std::string path = TempPath(name);
  EXPECT_TRUE(WriteSafetensors(path, f.tensors(), dtype).ok());
  return path;
}

float RoundTrip(StDtype dtype, float v) {
  switch (dtype) {
    case StDtype::kBF16:
      return Bf16ToFloat(FloatToBf16(v));
    case StDtype::kF16:
      return HalfToFloat(FloatToHalf(v));
    default:
      return v;
  }
}

class RoundTripTest : public testing::TestWithParam<StDtype> {};

TEST_P(RoundTripTest, WriteThenRead) {
  const StDtype dtype = GetParam();
  const std::string path =
      WriteFixture(dtype, std::string("rt_") + std::string(StDtypeName(dtype)));
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(), testing::ElementsAre("a", "b", "c", "empty"));
  const std::string bytes = ReadBytes(path);
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ((8 + header_len) % 8, 0u) << "data section must be 8-byte aligned";

  Fixture f;
  const struct {
    const char* name;
    std::vector<int64_t> shape;
    const std::vector<float>* want;
  } cases[] = {{"a", {2, 3}, &f.a}, {"b", {4}, &f.b}, {"c", {}, &f.c}, {"empty", {0, 5}, &f.empty}};
  for (const auto& c : cases) {
    const TensorInfo* info = (*file)->Find(c.name);
    ASSERT_NE(info, nullptr) << c.name;
    EXPECT_EQ(info->dtype, dtype);
    EXPECT_EQ(info->shape, c.shape);
    auto got = (*file)->ReadF32(c.name, c.shape);
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), c.want->size());
    for (size_t i = 0; i < got->size(); ++i) {
      EXPECT_EQ((*got)[i], RoundTrip(dtype, (*c.want)[i])) << c.name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, RoundTripTest,
                         testing::Values(StDtype::kF32, StDtype::kBF16, StDtype::kF16),
                         [](const auto& info) { return std::string(StDtypeName(info.param)); });

TEST(ConversionTest, HalfSpecialValues) {
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(HalfToFloat(0x8000), -0.0f);
  EXPECT_TRUE(std::signbit(HalfToFloat(0x8000)));
  EXPECT_EQ(HalfToFloat(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(HalfToFloat(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(HalfToFloat(0x7e00)));
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);               // tie above max rounds to Inf
  EXPECT_EQ(FloatToHalf(1e-9f), 0x0000);                  // below half the smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);  // tie to even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);  // tie to even (2)
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
}

TEST(ConversionTest, HalfExhaustiveRoundTripAndTies) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    if ((bits & 0x7c00) == 0x7c00 && (bits & 0x3ff) != 0) continue;  // NaN
    ASSERT_EQ(FloatToHalf(HalfToFloat(bits)), bits) << std::hex << h;
  }
  // Midpoints between neighbours round to the even one; just above rounds up.
  for (uint16_t h = 0; h < 0x7bff; ++h) {
    const float lo = HalfToFloat(h), hi = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((static_cast<double>(lo) + hi) / 2);  // exact in fp32
    const uint16_t even = (h & 1) ? static_cast<uint16_t>(h + 1) : h;
    ASSERT_EQ(FloatToHalf(mid), even) << std::hex << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 1e9f)), h + 1) << std::hex << h;
    ASSERT_EQ(FloatToHalf(-std::nextafter(mid, 0.0f)), 0x8000 | h) << std::hex << h;
  }
}

TEST(ConversionTest, Bf16RoundTripAndTies) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    if ((bits & 0x7f80) == 0x7f80 && (bits & 0x7f) != 0) continue;  // NaN
    ASSERT_EQ(FloatToBf16(Bf16ToFloat(bits)), bits) << std::hex << b;
    if ((bits & 0x7f80) == 0x7f80) continue;
    // Exactly halfway to the next bf16: round to even.
    const uint32_t mid_bits = (uint32_t{bits} << 16) | 0x8000u;
    float mid;
    std::memcpy(&mid, &mid_bits, 4);
    const uint16_t even = (bits & 1) ? static_cast<uint16_t>(bits + 1) : bits;
    ASSERT_EQ(FloatToBf16(mid), even) << std::hex << b;
  }
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::nanf("")))));
}

TEST(SafetensorsTest, MetadataIgnoredAndPaddingAllowed) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"
      "      ";
  auto file = SafetensorsFile::FromBuffer(RawFile(header, 8), "mem");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->names(), testing::ElementsAre("x"));
}

TEST(SafetensorsTest, OpenMissingFileIsNotFound) {
  EXPECT_EQ(SafetensorsFile::Open(TempPath("does_not_exist.safetensors")).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, TruncatedFiles) {
  const std::string good = ReadBytes(WriteFixture(StDtype::kF32, "trunc.safetensors"));
  EXPECT_THAT(ParseStatus("").message(), HasSubstr("too small"));
  EXPECT_FALSE(ParseStatus(good.substr(0, 5)).ok());
  EXPECT_FALSE(ParseStatus(good.substr(0, 20)).ok());               // inside the header
  EXPECT_FALSE(ParseStatus(good.substr(0, good.size() - 1)).ok());  // inside the data
  const std::string path = TempPath("truncated.safetensors");
  std::ofstream(path, std::ios::binary) << good.substr(0, good.size() - 4);
  auto s = SafetensorsFile::Open(path).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST(SafetensorsTest, HeaderLengthTooLarge) {
  std::string bytes = RawFile("{}", 0);
  const uint64_t huge = uint64_t{200} << 20;
  std::memcpy(bytes.data(), &huge, 8);
  EXPECT_THAT(ParseStatus(bytes).message(), HasSubstr("100 MiB"));
  const uint64_t past_end = 1000;
  std::memcpy(bytes.data(), &past_end, 8);
  EXPECT_THAT(ParseStatus(bytes).message(), HasSubstr("exceeds the file size"));
  std::memset(bytes.data(), 0xff, 8);
  EXPECT_FALSE(ParseStatus(bytes).ok());
}

TEST(SafetensorsTest, MalformedHeaders) {
  const struct {
    std::string header;
    size_t data;
    std::string message;
  } cases[] = {
      {"not json at all", 0, "not valid JSON"},
      {"[1, 2, 3]", 0, "not a JSON object"},
      {R"({"x": 5})", 0, "\"x\": entry is not an object"},
      {R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4, "dtype"},
      {R"({"x":{"dtype":7,"shape":[1],"data_offsets":[0,4]}})", 4, "dtype"},
      {R"({"x":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,4]}})", 4, "unknown dtype"},
      {R"({"x":{"dtype":"F32","data_offsets":[0,4]}})", 4, "shape"},
      {R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4, "shape dimension"},
      {R"({"x":{"dtype":"F32","shape":[1.5],"data_offsets":[0,4]}})", 4, "shape dimension"},
      {R"({"x":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4, "shape"},
      {R"({"x":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,4]}})", 4,
       "overflow"},
      {R"({"x":{"dtype":"F32","shape":[1]}})", 4, "data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4, "data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}})", 4, "data_offsets"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8, "end 4 < begin 8"},
      {R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 2, "exceed the data section"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 8, "byte size 4"},
      {R"({"x":{"dtype":"BF16","shape":[2],"data_offsets":[0,8]}})", 8, "byte size 8"},
      {R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
       R"("y":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
       12, "overlap"},
      {std::string(1000, '[') + std::string(1000, ']'), 0, "nests too deeply"},
  };
  for (const auto& c : cases) {
    absl::Status s = ParseStatus(RawFile(c.header, c.data));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.header;
    EXPECT_THAT(s.message(), HasSubstr(c.message)) << c.header;
    EXPECT_THAT(s.message(), HasSubstr("test.safetensors")) << c.header;
  }
}

TEST(SafetensorsTest, ReadErrors) {
  auto file = SafetensorsFile::Open(WriteFixture(StDtype::kF32, "read_errors.safetensors"));
  ASSERT_TRUE(file.ok());
  auto missing = (*file)->ReadF32("nope", std::vector<int64_t>{1});
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr("\"nope\""));
  auto wrong = (*file)->ReadF32("a", std::vector<int64_t>{3, 2});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("\"a\" has shape [2, 3], expected [3, 2]"));

  auto ints = SafetensorsFile::FromBuffer(
      RawFile(R"({"i":{"dtype":"I32","shape":[2],"data_offsets":[0,8]}})", 8), "ints");
  ASSERT_TRUE(ints.ok()) << ints.status();
  EXPECT_THAT((*ints)->ReadF32("i", std::vector<int64_t>{2}).status().message(),
              HasSubstr("cannot be read as F32"));
}

TEST(SafetensorsTest, WriterRejectsBadInput) {
  std::vector<float> two = {1, 2};
  std::vector<TensorToWrite> bad_size = {{"x", {3}, two}};
  EXPECT_FALSE(WriteSafetensors(TempPath("w1"), bad_size, StDtype::kF32).ok());
  std::vector<TensorToWrite> dup = {{"x", {2}, two}, {"x", {2}, two}};
  EXPECT_FALSE(WriteSafetensors(TempPath("w2"), dup, StDtype::kF32).ok());
  std::vector<TensorToWrite> ok = {{"x", {2}, two}};
  EXPECT_FALSE(WriteSafetensors(TempPath("w3"), ok, StDtype::kI32).ok());
}

// Random byte mutations of a valid header: every one must parse or fail
// cleanly, and whatever parses must read (or refuse to read) cleanly.
TEST(SafetensorsTest, FuzzHeaderMutations) {
  const std::string good = ReadBytes(WriteFixture(StDtype::kBF16, "fuzz.safetensors"));
  uint64_t header_len = 0;
  std::memcpy(&header_len, good.data(), 8);
  const size_t header_end = 8 + header_len;
  std::mt19937_64 rng(12345);
  const std::string interesting = "{}[]\",:0123456789-.eE \\ufFBI";
  int parsed_ok = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = good;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      const size_t limit = std::min(header_end, bytes.size());
      if (limit == 0) break;
      const size_t pos = rng() % limit;
      switch (rng() % 4) {
        case 0:
          bytes[pos] = static_cast<char>(rng());
          break;
        case 1:
          bytes[pos] = interesting[rng() % interesting.size()];
          break;
        case 2:
          bytes[pos] ^= static_cast<char>(1 << (rng() % 8));
          break;
        case 3:
          bytes.erase(pos, 1 + rng() % 3);
          break;  // shifts the header
      }
    }
    if (rng() % 10 == 0) bytes.resize(rng() % (bytes.size() + 1));
    auto file = SafetensorsFile::FromBuffer(bytes, "fuzz");
    if (!file.ok()) {
      EXPECT_FALSE(file.status().message().empty());
      continue;
    }
    ++parsed_ok;
    for (const std::string& name : (*file)->names()) {
      const TensorInfo* info = (*file)->Find(name);
      ASSERT_NE(info, nullptr);
      auto data = (*file)->ReadF32(name, info->shape);
      if (data.ok()) {
        EXPECT_EQ(data->size(), static_cast<size_t>(info->num_elements));
      }
    }
  }
  // Most mutations break the header, but e.g. digits in values survive.
  EXPECT_GT(parsed_ok, 0);
  EXPECT_LT(parsed_ok, 2000);
}

}  // namespace
}  // namespace pdserve::engine
