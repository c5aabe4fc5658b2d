// pdserve_make_tokenizer: learns a byte-level BPE tokenizer from a text file
// and writes tokenizer.json + tokenizer_config.json (tools/tokenizer_writer.h);
// encodes a text file with the tokenizer of a directory. Used to train the
// demo model (tools/train_demo_model.py) on ids pdserve's own tokenizer makes.
//   pdserve_make_tokenizer --corpus=FILE --vocab_size=N --out_dir=DIR [--ids_out=IDS]
//       learn from FILE, write DIR's tokenizer files; IDS: FILE's ids
//   pdserve_make_tokenizer --out_dir=DIR --encode=FILE --ids_out=IDS
//       IDS: FILE's ids as DIR's tokenizer encodes them
// Ids are written as one JSON array, without BOS.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "text/tokenizer_loader.h"
#include "tools/tokenizer_writer.h"

ABSL_FLAG(std::string, corpus, "", "UTF-8 text file to learn the merges from");
ABSL_FLAG(int, vocab_size, 2048, "Vocabulary size: 256 bytes, 5 control tokens, the rest merges");
ABSL_FLAG(std::string, out_dir, "", "Directory of tokenizer.json and tokenizer_config.json");
ABSL_FLAG(std::string, encode, "", "Text file to encode (default: the corpus)");
ABSL_FLAG(std::string, ids_out, "", "Where to write the encoded ids (JSON array)");

namespace {

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

int Fail(const absl::Status& status) {
  std::cerr << "pdserve_make_tokenizer: " << status << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const std::string corpus_path = absl::GetFlag(FLAGS_corpus);
  const std::string out_dir = absl::GetFlag(FLAGS_out_dir);
  const std::string encode_path =
      absl::GetFlag(FLAGS_encode).empty() ? corpus_path : absl::GetFlag(FLAGS_encode);
  const std::string ids_out = absl::GetFlag(FLAGS_ids_out);
  if (out_dir.empty() || (corpus_path.empty() && encode_path.empty()) ||
      (!encode_path.empty() && ids_out.empty() && corpus_path.empty())) {
    std::cerr << "usage: pdserve_make_tokenizer --corpus=FILE --vocab_size=N --out_dir=DIR "
                 "[--ids_out=IDS], or --out_dir=DIR --encode=FILE --ids_out=IDS\n";
    return 2;
  }
  if (!corpus_path.empty()) {
    absl::StatusOr<std::string> corpus = ReadText(corpus_path);
    if (!corpus.ok()) return Fail(corpus.status());
    if (corpus->empty()) return Fail(absl::InvalidArgumentError(corpus_path + " is empty"));
    std::error_code ec;
    std::filesystem::create_directories(out_dir, ec);
    absl::Status status =
        pdserve::engine::WriteDemoTokenizer(absl::GetFlag(FLAGS_vocab_size), out_dir, *corpus);
    if (!status.ok()) return Fail(status);
  }
  absl::StatusOr<std::unique_ptr<pdserve::text::Tokenizer>> tokenizer =
      pdserve::text::LoadTokenizer(out_dir);
  if (!tokenizer.ok()) return Fail(tokenizer.status());
  absl::StatusOr<std::string> text = ReadText(encode_path);
  if (!text.ok()) return Fail(text.status());
  const std::vector<int32_t> ids = (*tokenizer)->Encode(*text);
  std::cout << out_dir << "/tokenizer.json: " << (*tokenizer)->vocab_size() << " ids; "
            << encode_path << ": " << text->size() << " bytes, " << ids.size() << " tokens\n";
  if (!ids_out.empty()) {
    std::ofstream out(ids_out, std::ios::trunc);
    out << nlohmann::json(ids).dump() << "\n";
    out.close();
    if (!out) return Fail(absl::InternalError(absl::StrCat("cannot write ", ids_out)));
  }
  return 0;
}
