// The split regexes of well-known tokenizers, as their tokenizer.json files
// (or, for GPT-2, the ByteLevel pre-tokenizer) write them (Oniguruma
// syntax). The GPT-2 one is what ByteLevel(use_regex) splits with; the others
// are for tests, benchmarks and tools that build tokenizer files.
#pragma once

#include <string_view>

namespace pdserve::text::split_patterns {

inline constexpr std::string_view kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3 (and the cl100k_base pattern).
inline constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2 / Qwen3: digits one by one.
inline constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek V3: three Split steps in sequence (each Isolated).
inline constexpr std::string_view kDeepSeekV3Digits = R"(\p{N}{1,3})";
inline constexpr std::string_view kDeepSeekV3Cjk = "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+";
inline constexpr std::string_view kDeepSeekV3Words =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// o200k_base (GPT-4o, gpt-oss): words split on letter case.
inline constexpr std::string_view kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

}  // namespace pdserve::text::split_patterns
