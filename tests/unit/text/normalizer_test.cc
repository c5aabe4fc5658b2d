// Unit tests for text/normalizer: Unicode forms, Prepend, Replace (literal
// and regex) and their order in a sequence.
#include "text/normalizer.h"

#include "gtest/gtest.h"

namespace pdserve::text {
namespace {

Normalizer Make(std::vector<NormalizerStep> steps) {
  absl::StatusOr<Normalizer> n = Normalizer::Create(std::move(steps));
  EXPECT_TRUE(n.ok()) << n.status();
  return n.ok() ? *std::move(n) : Normalizer();
}

constexpr char kMeta[] = "\u2581";  // ▁

TEST(NormalizerTest, EmptyNormalizesNothing) {
  const Normalizer n = Make({});
  EXPECT_TRUE(n.empty());
  EXPECT_EQ(n.Normalize("e\xCC\x81 x"), "e\xCC\x81 x");
}

TEST(NormalizerTest, UnicodeForms) {
  EXPECT_EQ(Make({NormalizationForm::kNfc}).Normalize("e\xCC\x81"), "\xC3\xA9");  // é
  EXPECT_EQ(Make({NormalizationForm::kNfd}).Normalize("\xC3\xA9"), "e\xCC\x81");
  EXPECT_EQ(Make({NormalizationForm::kNfkc}).Normalize("\xEF\xAC\x81"), "fi");  // ﬁ ligature
  EXPECT_EQ(Make({NormalizationForm::kNfkd}).Normalize("\xC2\xBD"),
            "1\xE2\x81\x84"
            "2");  // ½
}

TEST(NormalizerTest, PrependOnlyBeforeNonEmptyText) {
  const Normalizer n = Make({PrependNormalizer{kMeta}});
  EXPECT_FALSE(n.empty());
  EXPECT_EQ(n.Normalize("Hello"), std::string(kMeta) + "Hello");
  EXPECT_EQ(n.Normalize(" x"), std::string(kMeta) + " x");
  EXPECT_EQ(n.Normalize(""), "");
}

TEST(NormalizerTest, ReplaceLiteralEveryOccurrence) {
  const Normalizer n = Make({ReplaceNormalizer{" ", false, kMeta}});
  const std::string m = kMeta;
  EXPECT_EQ(n.Normalize("a b  c "), "a" + m + "b" + m + m + "c" + m);
  EXPECT_EQ(n.Normalize("\ta\xC2\xA0"
                        "b"),
            "\ta\xC2\xA0"
            "b");  // only U+0020 is a space here
  // A literal pattern is not a regex.
  EXPECT_EQ(Make({ReplaceNormalizer{"a.", false, "X"}}).Normalize("ab a. a.."), "ab X X.");
  // Longer and shorter replacements; non-overlapping, left to right.
  EXPECT_EQ(Make({ReplaceNormalizer{"aa", false, "b"}}).Normalize("aaaaa"), "bba");
  EXPECT_EQ(Make({ReplaceNormalizer{"x", false, ""}}).Normalize("xaxbx"), "ab");
}

TEST(NormalizerTest, ReplaceRegex) {
  const Normalizer n = Make({ReplaceNormalizer{R"(\s+)", true, " "}});
  EXPECT_EQ(n.Normalize("a \t\n b\xE3\x80\x80"
                        "c"),
            "a b c");  // U+3000 is White_Space
  EXPECT_EQ(Make({ReplaceNormalizer{R"(\p{N}+)", true, "#"}}).Normalize("a12b3"), "a#b#");
}

TEST(NormalizerTest, SequenceAppliesStepsInOrder) {
  // Llama 2: Prepend("▁") then Replace(" " -> "▁").
  const std::string m = kMeta;
  const Normalizer llama2 = Make({PrependNormalizer{kMeta}, ReplaceNormalizer{" ", false, kMeta}});
  EXPECT_EQ(llama2.Normalize("Hello world"), m + "Hello" + m + "world");
  EXPECT_EQ(llama2.Normalize(" lead"), m + m + "lead");
  // The other order replaces the prefix too.
  const Normalizer swapped = Make({ReplaceNormalizer{kMeta, false, "_"}, PrependNormalizer{kMeta}});
  EXPECT_EQ(swapped.Normalize(m + "x"), m + "_x");
  // A form after a Replace sees the replaced text.
  EXPECT_EQ(
      Make({ReplaceNormalizer{"E", false, "e\xCC\x81"}, NormalizationForm::kNfc}).Normalize("cafE"),
      "caf\xC3\xA9");
}

TEST(NormalizerTest, BadStepsAreErrors) {
  EXPECT_EQ(Normalizer::Create({ReplaceNormalizer{"(", true, "x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalizer::Create({ReplaceNormalizer{"", false, "x"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalizer::Create({ReplaceNormalizer{"a", false, "\xFF"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Normalizer::Create({PrependNormalizer{"\xC3"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pdserve::text
