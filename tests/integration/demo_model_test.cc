// The trained demo model (tools/demo_model: a small Llama trained on the
// Dhammapada by tools/train_demo_model.py) served by a real router, prefill
// worker and decode worker on loopback: greedy generation from the opening
// words of a verse must continue it word for word, as the training text has
// it, and the streamed text must be what the model's tokenizer makes of the
// streamed ids.
#include <filesystem>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/generate_client.h"
#include "tests/integration/local_cluster.h"
#include "text/tokenizer.h"
#include "text/tokenizer_loader.h"

namespace pdserve::testing {
namespace {

struct Passage {
  std::string prompt;
  std::string continuation;  // what greedy decoding must stream first
};

// Verses 5, 13 and 39 of the training text (F. Max Mueller's translation).
const std::vector<Passage> kPassages = {
    {"For hatred does not cease by hatred at any time:",
     " hatred ceases by love, this is an old rule. 5"},
    {"As rain breaks through an ill-thatched house,",
     " passion will break through an unreflecting mind. 13"},
    {"If a man's thoughts are not dissipated,",
     " if his mind is not perplexed, if he has ceased to think of good or evil, then there is "
     "no fear for him while he is watchful. 39"},
};

TEST(DemoModelTest, GreedyGenerationContinuesTheTrainingText) {
  const std::string model_dir = std::string(PDSERVE_SOURCE_DIR) + "/tools/demo_model";
  const std::string work_dir = ::testing::TempDir() + "/pdserve_demo_model_test";
  std::filesystem::remove_all(work_dir);
  std::filesystem::create_directories(work_dir);
  LocalCluster cluster(ClusterOptions{.model_dir = model_dir, .work_dir = work_dir});
  absl::Status started = cluster.Start();
  ASSERT_TRUE(started.ok()) << started;
  auto stub = cluster.NewClient();
  auto tokenizer = text::LoadTokenizer(model_dir);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();

  for (const Passage& p : kPassages) {
    const int want_tokens = static_cast<int>((*tokenizer)->Encode(p.continuation).size());
    v1::GenerateRequest request;
    request.set_text(p.prompt);
    request.set_add_bos(true);
    request.mutable_sampling()->set_temperature(0.0f);
    request.mutable_sampling()->set_max_tokens(want_tokens + 8);
    StreamResult got = RunGenerate(*stub, request);
    ASSERT_TRUE(got.status.ok()) << got.status.error_message();
    EXPECT_EQ(got.text.substr(0, p.continuation.size()), p.continuation) << p.prompt;
    // The router streamed what the tokenizer makes of the ids (text
    // continuing the prompt, so with its leading space).
    text::IncrementalDetokenizer detok(**tokenizer);
    std::string streamed;
    for (int32_t id : got.tokens) streamed += detok.Push(id);
    EXPECT_EQ(got.text, streamed + detok.Flush());
    EXPECT_EQ(got.last.usage().completion_tokens(), want_tokens + 8);
  }
}

}  // namespace
}  // namespace pdserve::testing
