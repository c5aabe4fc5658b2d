// libFuzzer target for the safetensors reader (engine/model/safetensors.cc): parses
// arbitrary bytes with SafetensorsFile::FromBuffer and, when the header is
// accepted, reads every tensor back (raw bytes and fp32 conversion), so any
// offset, shape or dtype the parser lets through is also dereferenced.
// Contract under test: hostile input yields a Status, never a crash, leak,
// out-of-bounds access or undefined behaviour (built with ASan and UBSan).
// Build and run: tests/fuzz/run_fuzz.sh.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using pdserve::engine::SafetensorsFile;
  using pdserve::engine::TensorInfo;
  auto file = SafetensorsFile::FromBuffer(std::string(reinterpret_cast<const char*>(data), size),
                                          "fuzz.safetensors");
  if (!file.ok()) return 0;
  std::vector<float> values;
  for (const std::string& name : (*file)->names()) {
    const TensorInfo* info = (*file)->Find(name);
    if (info == nullptr) __builtin_trap();  // names() and Find disagree
    const auto raw = (*file)->RawBytes(*info);
    volatile uint8_t sink = 0;
    for (std::byte b : raw) sink = sink ^ static_cast<uint8_t>(b);
    if (info->num_elements > (int64_t{1} << 22)) continue;  // bounded by the input anyway
    values.assign(static_cast<size_t>(info->num_elements), 0.0f);
    (void)(*file)->ReadF32Into(*info, values);
    (void)(*file)->ReadF32(name, info->shape);
  }
  return 0;
}
