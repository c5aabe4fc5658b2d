// Unit tests for the pre-tokenizer regexes' Unicode tables
// (text/unicode_tables, text/unicode_properties) and the rewriting of
// \p{...} for PCRE2 (text/regex_translate): the tables are Unicode 15.1,
// characters added in Unicode 15.0 and 15.1 split as a Unicode 15.1 engine
// splits them under the Llama 3 and DeepSeek V3 patterns (expected pieces
// worked out by hand from the patterns), PCRE2's table lookup plus the
// additions matches exactly what explicit ranges match on random text from
// every plane, and the known tokenizer patterns still JIT-compile.
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "text/pretokenizer.h"
#include "text/regex_translate.h"
#include "text/split_patterns.h"
#include "text/unicode_properties.h"
#include "text/unicode_tables.h"
#include "text/utf8.h"

namespace pdserve::text {
namespace {

using ::testing::ElementsAre;

// Characters new in Unicode 15.0 / 15.1 (unassigned in 14.0).
constexpr char kGoose[] = "\U0001FABF";           // U+1FABF GOOSE (15.0, So)
constexpr char kShakingFace[] = "\U0001FAE8";     // U+1FAE8 SHAKING FACE (15.0, So)
constexpr char kWireless[] = "\U0001F6DC";        // U+1F6DC WIRELESS (15.0, So)
constexpr char kLightBlueHeart[] = "\U0001FA75";  // U+1FA75 LIGHT BLUE HEART (15.0, So)
constexpr char kCjkExtI[] = "\U0002EBF0";         // U+2EBF0 CJK Ext. I (15.1, Lo)
constexpr char kKawiDigitOne[] = "\U00011F51";    // U+11F51 KAWI DIGIT ONE (15.0, Nd)

std::shared_ptr<const RegexSplitter> Compile(std::string_view pattern,
                                             PropertyForm form = PropertyForm::kAuto) {
  absl::StatusOr<std::unique_ptr<RegexSplitter>> r = RegexSplitter::Create(pattern, false, form);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? std::shared_ptr<const RegexSplitter>(*std::move(r)) : nullptr;
}

std::vector<std::string> Split(std::vector<std::string_view> patterns, std::string_view text) {
  std::vector<PreTokenizerStep> steps;
  for (std::string_view p : patterns) steps.push_back(SplitStep{Compile(p)});
  absl::StatusOr<PreTokenizer> pre = PreTokenizer::Create(std::move(steps));
  EXPECT_TRUE(pre.ok()) << pre.status();
  return pre.ok() ? pre->Split(text) : std::vector<std::string>{};
}

std::vector<std::string> DeepSeekV3(std::string_view text) {
  return Split({split_patterns::kDeepSeekV3Digits, split_patterns::kDeepSeekV3Cjk,
                split_patterns::kDeepSeekV3Words},
               text);
}

std::vector<std::string> Llama3(std::string_view text) {
  return Split({split_patterns::kLlama3}, text);
}

std::string Cat(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out += p;
  return out;
}

TEST(UnicodeTablesTest, AreUnicode15_1WithTheirCategories) {
  EXPECT_EQ(unicode_tables::Version(), "15.1.0");
  EXPECT_EQ(RegexUnicodeVersion(), "15.1.0");
  const UnicodeProperty* so = FindUnicodeProperty("So");
  const UnicodeProperty* lo = FindUnicodeProperty("Other_Letter");
  const UnicodeProperty* cn = FindUnicodeProperty("Cn");
  ASSERT_NE(so, nullptr);
  ASSERT_NE(lo, nullptr);
  ASSERT_NE(cn, nullptr);
  for (char32_t cp : {0x1FABF, 0x1FAE8, 0x1F6DC, 0x1FA75}) {
    EXPECT_TRUE(Contains(so->set, cp)) << std::hex << static_cast<uint32_t>(cp);
    EXPECT_TRUE(Contains(so->added, cp)) << std::hex << static_cast<uint32_t>(cp);  // Cn in 14.0
    EXPECT_FALSE(Contains(cn->set, cp)) << std::hex << static_cast<uint32_t>(cp);
  }
  EXPECT_TRUE(Contains(lo->set, 0x2EBF0));
  EXPECT_TRUE(Contains(FindUnicodeProperty("L")->set, 0x2EBF0));
  EXPECT_TRUE(Contains(FindUnicodeProperty("Nd")->set, 0x11F51));
  EXPECT_TRUE(Contains(FindUnicodeProperty("Han")->set, 0x2EBF0));
  EXPECT_TRUE(Contains(cn->set, 0x2EE60));  // still unassigned in 15.1
  EXPECT_FALSE(Contains(so->set, 'a'));
  // Oniguruma's loose names.
  EXPECT_EQ(FindUnicodeProperty("letter"), FindUnicodeProperty("L"));
  EXPECT_EQ(FindUnicodeProperty("Uppercase Letter"), FindUnicodeProperty("Lu"));
  EXPECT_EQ(FindUnicodeProperty("white-space"), FindUnicodeProperty("White_Space"));
  EXPECT_EQ(FindUnicodeProperty("Hani"), FindUnicodeProperty("Han"));
  EXPECT_EQ(FindUnicodeProperty("NoSuchProperty"), nullptr);
  // White_Space: the 25 code points of PropList.txt.
  EXPECT_EQ(FindUnicodeProperty("White_Space")->set, (CodePointSet{{0x9, 0xD},
                                                                   {0x20, 0x20},
                                                                   {0x85, 0x85},
                                                                   {0xA0, 0xA0},
                                                                   {0x1680, 0x1680},
                                                                   {0x2000, 0x200A},
                                                                   {0x2028, 0x2029},
                                                                   {0x202F, 0x202F},
                                                                   {0x205F, 0x205F},
                                                                   {0x3000, 0x3000}}));
  // General categories partition the code points (surrogates aside).
  size_t total = 0;
  for (std::string_view c : {"L", "M", "N", "P", "S", "Z", "C"}) {
    for (const CodePointRange& r : FindUnicodeProperty(c)->set) total += r.last - r.first + 1;
  }
  EXPECT_EQ(total, 0x110000u - 0x800u);
}

TEST(UnicodeTablesTest, ComplementAndClassItems) {
  const CodePointSet set = {{0x41, 0x5A}, {0x61, 0x61}, {0x10FFFF, 0x10FFFF}};
  EXPECT_EQ(Complement(set),
            (CodePointSet{{0x0, 0x40}, {0x5B, 0x60}, {0x62, 0xD7FF}, {0xE000, 0x10FFFE}}));
  EXPECT_EQ(Complement(Complement(set)), set);
  EXPECT_EQ(ClassItems({{0x41, 0x5A}, {0x61, 0x62}, {0x1F600, 0x1F600}}),
            R"(\x{41}-\x{5a}\x{61}\x{62}\x{1f600})");
}

TEST(RegexTranslateTest, WritesPropertiesForPcre2) {
  const UnicodeProperty& l = *FindUnicodeProperty("L");
  // PCRE2's table plus what L gained since the base version.
  EXPECT_EQ(*TranslateRegex(R"(\p{L}+)", PropertyForm::kEngineWithAdditions),
            "[\\p{L}" + ClassItems(l.added) + "]+");
  EXPECT_EQ(*TranslateRegex(R"([^\p{L}\p{Lu}x])", PropertyForm::kEngineWithAdditions),
            "[^\\p{L}" + ClassItems(l.added) + "\\p{Lu}x]");  // Lu gained nothing
  EXPECT_EQ(*TranslateRegex(R"(\P{Letter})", PropertyForm::kEngineWithAdditions),
            "[^\\p{L}" + ClassItems(l.added) + "]");
  EXPECT_EQ(*TranslateRegex(R"(\p{^L})", PropertyForm::kEngineWithAdditions),
            "[^\\p{L}" + ClassItems(l.added) + "]");
  // A negated property inside a class, and Cn (which shrinks), as ranges.
  EXPECT_EQ(*TranslateRegex(R"([x\P{L}])", PropertyForm::kEngineWithAdditions),
            "[x" + ClassItems(Complement(l.set)) + "]");
  EXPECT_EQ(*TranslateRegex(R"(\p{Cn})", PropertyForm::kEngineWithAdditions),
            "[" + ClassItems(FindUnicodeProperty("Cn")->set) + "]");
  EXPECT_EQ(*TranslateRegex(R"(\p{L})", PropertyForm::kRanges), "[" + ClassItems(l.set) + "]");
  // Left alone: kEngineOnly, names not in the tables, escaped backslashes.
  EXPECT_EQ(*TranslateRegex(R"(\p{L}+)", PropertyForm::kEngineOnly), R"(\p{L}+)");
  EXPECT_EQ(*TranslateRegex(R"(\p{Greek_And_Coptic}\pL)"), R"(\p{Greek_And_Coptic}\pL)");
  EXPECT_EQ(*TranslateRegex(R"(\\p{L})"), R"(\\p{L})");
  EXPECT_FALSE(TranslateRegex(R"([\p{L})").ok());
}

TEST(UnicodeRegexTest, DeepSeekV3SplitsUnicode15EmojiAsSymbols) {
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+ takes one non-letter, non-symbol
  // before a word: an emoji (So) is a symbol, so it does not join the word.
  // With Unicode 14 tables (Cn) it did: "🪿hi" was one piece.
  EXPECT_THAT(DeepSeekV3(Cat({kGoose, "hi"})), ElementsAre(kGoose, "hi"));
  // " ?[\p{P}\p{S}]+" takes the space and the run of symbols.
  EXPECT_THAT(DeepSeekV3(Cat({" ", kShakingFace, kGoose})),
              ElementsAre(Cat({" ", kShakingFace, kGoose})));
  EXPECT_THAT(DeepSeekV3(Cat({"a", kWireless, "b"})), ElementsAre("a", kWireless, "b"));
  EXPECT_THAT(DeepSeekV3(Cat({kLightBlueHeart, "!"})), ElementsAre(Cat({kLightBlueHeart, "!"})));
  EXPECT_THAT(DeepSeekV3(Cat({"Hello ", kGoose, kShakingFace, " world"})),
              ElementsAre("Hello", Cat({" ", kGoose, kShakingFace}), " world"));
  // A CJK Ext. I ideograph (Lo, outside the literal CJK split) is a letter:
  // it joins the word and takes the space before it.
  EXPECT_THAT(DeepSeekV3(Cat({"x", kCjkExtI})), ElementsAre(Cat({"x", kCjkExtI})));
  EXPECT_THAT(DeepSeekV3(Cat({"a ", kCjkExtI, kCjkExtI})),
              ElementsAre("a", Cat({" ", kCjkExtI, kCjkExtI})));
  // \p{N}{1,3} takes a Kawi digit with two ASCII ones.
  EXPECT_THAT(DeepSeekV3(Cat({"1", kKawiDigitOne, "23"})),
              ElementsAre(Cat({"1", kKawiDigitOne, "2"}), "3"));
}

TEST(UnicodeRegexTest, Llama3SplitsUnicode15LettersAndEmoji) {
  // A letter joins the word ([^\r\n\p{L}\p{N}]?\p{L}+); Unicode 14 tables
  // split "a" from the unassigned code point.
  EXPECT_THAT(Llama3(Cat({"a", kCjkExtI, " ", kCjkExtI})),
              ElementsAre(Cat({"a", kCjkExtI}), Cat({" ", kCjkExtI})));
  // An emoji is neither letter nor number: " ?[^\s\p{L}\p{N}]+" takes it.
  EXPECT_THAT(Llama3(Cat({"hi ", kGoose, kShakingFace, "!"})),
              ElementsAre("hi", Cat({" ", kGoose, kShakingFace, "!"})));
  // \p{N}{1,3}: a Kawi digit is a number.
  EXPECT_THAT(Llama3(Cat({"12", kKawiDigitOne, "3"})),
              ElementsAre(Cat({"12", kKawiDigitOne}), "3"));
}

TEST(UnicodeRegexTest, PcreOwnTablesSplitDifferentlyWhereOlder) {
  // What the tables change: with PCRE2's own tables (kEngineOnly) the goose
  // is unassigned where PCRE2 predates Unicode 15 (Debian 12: 14.0).
  const std::string engine_version = RegexUnicodeVersion(PropertyForm::kEngineOnly);
  std::shared_ptr<const RegexSplitter> own =
      Compile(split_patterns::kDeepSeekV3Words, PropertyForm::kEngineOnly);
  ASSERT_NE(own, nullptr);
  const std::string text = Cat({kGoose, "hi"});
  const auto pieces = own->FindAll(text);
  if (engine_version < "15") {
    EXPECT_THAT(pieces, ElementsAre(std::make_pair(size_t{0}, text.size()))) << engine_version;
  } else {
    EXPECT_EQ(pieces.size(), 2u) << engine_version;
  }
}

// Random text: ASCII, code points added since the base version, and code
// points from every plane.
std::string RandomText(std::mt19937* rng) {
  std::vector<char32_t> added;
  for (std::string_view name : {"L", "M", "N", "P", "S", "Cf"}) {
    for (const CodePointRange& r : FindUnicodeProperty(name)->added) {
      added.push_back(r.first);
      added.push_back(r.last);
    }
  }
  constexpr std::string_view kAscii = "ab Z9'\n\t.-_!";
  std::string out;
  const int length = std::uniform_int_distribution<int>(1, 24)(*rng);
  for (int i = 0; i < length; ++i) {
    char32_t cp = 0;
    switch (std::uniform_int_distribution<int>(0, 3)(*rng)) {
      case 0:
        cp = static_cast<unsigned char>(kAscii[(*rng)() % kAscii.size()]);
        break;
      case 1:
        cp = added[(*rng)() % added.size()];
        break;
      case 2:
        cp = std::uniform_int_distribution<char32_t>(0x80, 0x2FFFF)(*rng);
        break;
      default:
        cp = std::uniform_int_distribution<char32_t>(0, 0x10FFFF)(*rng);
        break;
    }
    if (cp >= 0xD800 && cp <= 0xDFFF) cp = 'x';
    utf8::Append(cp, &out);
  }
  return out;
}

TEST(UnicodeRegexTest, EngineWithAdditionsMatchesExplicitRanges) {
  // PCRE2's own table plus the additions must match exactly what the
  // tables' explicit ranges match (any PCRE2 from the base version on).
  const std::vector<std::string_view> patterns = {
      split_patterns::kGpt2,
      split_patterns::kLlama3,
      split_patterns::kQwen2,
      split_patterns::kDeepSeekV3Words,
      split_patterns::kO200k,
      R"([\P{L}\p{Nd}]+|\p{^N}+|[^\p{Lu}\P{Ll}]|[\S]+)",
      R"(\p{C}+|\p{Cn}|\p{Han}+|[\p{Hiragana}\p{Katakana}]+|\p{LC}+|\p{Z})",
      R"(\p{Lm}\p{Mn}*|\p{Mc}|\p{Me}|\p{Nl}|\p{No}|\p{Pd}|\p{Po}|\p{So}+|\p{Cf}|\p{Any})",
  };
  std::mt19937 rng(20261128);
  std::vector<std::string> texts;
  for (int i = 0; i < 400; ++i) texts.push_back(RandomText(&rng));
  for (std::string_view pattern : patterns) {
    std::shared_ptr<const RegexSplitter> engine =
        Compile(pattern, PropertyForm::kEngineWithAdditions);
    std::shared_ptr<const RegexSplitter> ranges = Compile(pattern, PropertyForm::kRanges);
    ASSERT_NE(engine, nullptr) << pattern;
    ASSERT_NE(ranges, nullptr) << pattern;
    for (const std::string& text : texts) {
      ASSERT_EQ(engine->FindAll(text), ranges->FindAll(text)) << pattern << "\n" << text;
    }
  }
}

TEST(UnicodeRegexTest, KnownPatternsJitCompileInEveryForm) {
  for (std::string_view pattern :
       {split_patterns::kGpt2, split_patterns::kLlama3, split_patterns::kQwen2,
        split_patterns::kDeepSeekV3Digits, split_patterns::kDeepSeekV3Cjk,
        split_patterns::kDeepSeekV3Words, split_patterns::kO200k}) {
    for (PropertyForm form :
         {PropertyForm::kAuto, PropertyForm::kEngineWithAdditions, PropertyForm::kRanges}) {
      std::shared_ptr<const RegexSplitter> r = Compile(pattern, form);
      ASSERT_NE(r, nullptr) << pattern;
      EXPECT_TRUE(r->jit()) << pattern;
    }
  }
}

}  // namespace
}  // namespace pdserve::text
