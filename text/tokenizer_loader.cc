// Tokenizer selection for a model directory (see tokenizer_loader.h).
#include "text/tokenizer_loader.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "text/bpe_tokenizer.h"
#include "engine/model/config.h"

namespace pdserve::text {
namespace {

// Tokenizer files beyond this are refused rather than read into memory.
constexpr uintmax_t kMaxFileBytes = uintmax_t{512} << 20;

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) return absl::NotFoundError(absl::StrCat(path, ": ", ec.message()));
  if (size > kMaxFileBytes)
    return absl::InvalidArgumentError(absl::StrCat(path, ": file too large"));
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return text.str();
}

absl::Status WithPath(const absl::Status& s, const std::string& path) {
  return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& model_dir) {
  const std::string tokenizer_path = model_dir + "/tokenizer.json";
  const std::string tokenizer_config_path = model_dir + "/tokenizer_config.json";
  const std::string config_path = model_dir + "/config.json";
  std::error_code ec;

  if (std::filesystem::exists(tokenizer_path, ec)) {
    absl::StatusOr<std::string> json = ReadFile(tokenizer_path);
    if (!json.ok()) return json.status();
    std::string config_json;
    if (std::filesystem::exists(tokenizer_config_path, ec)) {
      absl::StatusOr<std::string> c = ReadFile(tokenizer_config_path);
      if (!c.ok()) return c.status();
      config_json = *std::move(c);
    }
    absl::StatusOr<std::unique_ptr<BpeTokenizer>> bpe = BpeTokenizer::FromJson(*json, config_json);
    if (!bpe.ok()) return WithPath(bpe.status(), tokenizer_path);
    if (std::filesystem::exists(config_path, ec)) {
      absl::StatusOr<engine::ModelConfig> config = engine::ModelConfig::FromFile(config_path);
      if (config.ok() && (*bpe)->vocab_size() > config->vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(tokenizer_path, ": token ids reach ", (*bpe)->vocab_size() - 1,
                         " but config.json has vocab_size ", config->vocab_size));
      }
    }
    return std::unique_ptr<Tokenizer>(*std::move(bpe));
  }

  absl::StatusOr<engine::ModelConfig> config = engine::ModelConfig::FromFile(config_path);
  if (!config.ok()) return config.status();
  if (config->vocab_size < 256) {
    return absl::FailedPreconditionError(
        absl::StrCat(model_dir,
                     ": no tokenizer.json, and the byte-level fallback needs "
                     "vocab_size >= 256 (config.json has ",
                     config->vocab_size, ")"));
  }
  return std::unique_ptr<Tokenizer>(std::make_unique<ByteTokenizer>(config->vocab_size));
}

}  // namespace pdserve::text
