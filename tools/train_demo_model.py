#!/usr/bin/env python3
"""Trains pdserve's demo model: a small Llama on a public-domain text.

The text is F. Max Mueller's 1881 translation of the Dhammapada, as Debian's
display-dhammapada package ships it (/usr/share/display-dhammapada/
dhammapada-alternate.txt; public domain, see that package's copyright file).
The script
  1. unwraps the text (from the first chapter on) into one line per
     paragraph, paragraphs separated by a blank line;
  2. learns a byte-level BPE tokenizer from it with pdserve's own writer
     (pdserve_make_tokenizer: tokenizer.json + tokenizer_config.json) and
     takes the text's token ids as that tokenizer encodes them;
  3. trains a LlamaForCausalLM (the math of Hugging Face's modeling_llama:
     RMSNorm, rotate_half RoPE, grouped-query attention, SwiGLU MLP, tied
     embeddings) on windows that start at a paragraph and are preceded by
     BOS, which is how a client's prompt reaches the model (the router adds
     BOS to a text prompt);
  4. writes config.json, generation_config.json and model.safetensors (bf16)
     next to the tokenizer files, and checks that greedy decoding of the
     bf16 weights continues the passages of PASSAGES word for word.

Deterministic: the same text, arguments, thread count and PyTorch/BLAS
build give the same weights (fixed seeds, fixed sampling order, torch
deterministic algorithms). Needs Debian's python3-torch and python3-numpy
(CPU), display-dhammapada, and a built pdserve_make_tokenizer. Run from the
repository root:

  apt-get install display-dhammapada python3-torch python3-numpy
  cmake --build build --target pdserve_make_tokenizer
  /usr/bin/python3 tools/train_demo_model.py --out_dir=tools/demo_model

At the defaults: 1000 steps of 16 windows of 128 tokens, about 0.75 s of CPU
per step on one thread (PyTorch 1.13, OpenBLAS); on a machine busy with other
work, much longer in wall time. One thread on purpose: two OpenMP threads on
a shared two-core machine ran five times slower per step.
"""

import argparse
import importlib.util
import json
import math
import os
import re
import struct
import subprocess
import sys
import tempfile
import time

# A python3 earlier on PATH (pyenv, venv) may not see Debian's torch.
if (__name__ == "__main__" and importlib.util.find_spec("torch") is None
        and sys.executable != "/usr/bin/python3" and os.path.exists("/usr/bin/python3")):
    os.execv("/usr/bin/python3", ["/usr/bin/python3"] + sys.argv)

import numpy as np
import torch
import torch.nn.functional as F

SOURCE = "/usr/share/display-dhammapada/dhammapada-alternate.txt"
FIRST_LINE = "1. The Twin-Verses"

# Paragraph openings and the words the model must continue them with under
# greedy decoding (checked after training; the integration test and the demo
# use the first ones).
PASSAGES = [
    ("For hatred does not cease by hatred at any time:",
     " hatred ceases by love, this is an old rule. 5"),
    ("As rain breaks through an ill-thatched house,",
     " passion will break through an unreflecting mind. 13"),
    ("Earnestness is the path of immortality (Nirvana),",
     " thoughtlessness the path of death."),
    ("If a man's thoughts are not dissipated,",
     " if his mind is not perplexed, if he has ceased to think of good or evil,"
     " then there is no fear for him while he is watchful. 39"),
]

# Token ids fixed by tools/tokenizer_writer.h.
BOS_ID = 256
END_OF_TEXT_ID = 257
EOT_ID = 260


def read_corpus(path):
    """The text from its first chapter on, one line per paragraph."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    start = text.index(FIRST_LINE)
    paragraphs = [re.sub(r"\s+", " ", p).strip() for p in re.split(r"\n\s*\n", text[start:])]
    return "\n\n".join(p for p in paragraphs if p) + "\n"


# ---- the model (Hugging Face LlamaForCausalLM math, batched, float32) ----

def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Llama(torch.nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        h, inter, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
        self.heads, self.kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
        self.head_dim = cfg["head_dim"]
        self.eps = cfg["rms_norm_eps"]
        p = {}  # checkpoint name -> parameter
        p["model.embed_tokens.weight"] = torch.nn.Parameter(torch.randn(v, h) * h ** -0.5)
        for i in range(cfg["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            shapes = {
                "self_attn.q_proj.weight": (self.heads * self.head_dim, h),
                "self_attn.k_proj.weight": (self.kv_heads * self.head_dim, h),
                "self_attn.v_proj.weight": (self.kv_heads * self.head_dim, h),
                "self_attn.o_proj.weight": (h, self.heads * self.head_dim),
                "mlp.gate_proj.weight": (inter, h),
                "mlp.up_proj.weight": (inter, h),
                "mlp.down_proj.weight": (h, inter),
            }
            for name, shape in shapes.items():
                # Residual outputs start smaller, so the stack starts near identity.
                scale = shape[1] ** -0.5
                if name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
                    scale /= math.sqrt(2 * cfg["num_hidden_layers"])
                p[pre + name] = torch.nn.Parameter(torch.randn(*shape) * scale)
            p[pre + "input_layernorm.weight"] = torch.nn.Parameter(torch.ones(h))
            p[pre + "post_attention_layernorm.weight"] = torch.nn.Parameter(torch.ones(h))
        p["model.norm.weight"] = torch.nn.Parameter(torch.ones(h))
        # Module attribute names may not contain "."; keep the checkpoint names aside.
        self.names = list(p.keys())
        self.w = torch.nn.ParameterList([p[n] for n in self.names])
        self.index = {n: i for i, n in enumerate(self.names)}
        inv_freq = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, self.head_dim, 2).float() / self.head_dim))
        pos = torch.arange(cfg["max_position_embeddings"]).float()
        freqs = torch.outer(pos, inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def p(self, name):
        return self.w[self.index[name]]

    def rms_norm(self, x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))

    def forward(self, tokens):
        """tokens [batch, seq] -> logits [batch, seq, vocab]."""
        b, t = tokens.shape
        x = F.embedding(tokens, self.p("model.embed_tokens.weight"))
        cos, sin = self.cos[:t], self.sin[:t]
        mask = torch.full((t, t), float("-inf")).triu(1)
        rep = self.heads // self.kv_heads
        for i in range(self.cfg["num_hidden_layers"]):
            pre = f"model.layers.{i}."
            hN = self.rms_norm(x, self.p(pre + "input_layernorm.weight"))
            q = (hN @ self.p(pre + "self_attn.q_proj.weight").T).view(b, t, self.heads, self.head_dim)
            k = (hN @ self.p(pre + "self_attn.k_proj.weight").T).view(b, t, self.kv_heads, self.head_dim)
            v = (hN @ self.p(pre + "self_attn.v_proj.weight").T).view(b, t, self.kv_heads, self.head_dim)
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [b, heads, t, d]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
            scores = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5 + mask
            attn = torch.softmax(scores, dim=-1) @ v
            attn = attn.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
            x = x + attn @ self.p(pre + "self_attn.o_proj.weight").T
            hN = self.rms_norm(x, self.p(pre + "post_attention_layernorm.weight"))
            gate = hN @ self.p(pre + "mlp.gate_proj.weight").T
            up = hN @ self.p(pre + "mlp.up_proj.weight").T
            x = x + (F.silu(gate) * up) @ self.p(pre + "mlp.down_proj.weight").T
        x = self.rms_norm(x, self.p("model.norm.weight"))
        return x @ self.p("model.embed_tokens.weight").T  # tied LM head


def bf16_round(t):
    """t rounded to bf16 (round to nearest even), as float32."""
    bits = t.detach().contiguous().view(torch.int32).numpy().astype(np.int64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return torch.from_numpy(rounded.astype(np.uint32).view(np.float32).copy())


def write_safetensors(path, tensors):
    """tensors: {name: float32 tensor}, written as BF16 (names sorted)."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        bits = tensors[name].detach().contiguous().view(torch.int32).numpy().astype(np.int64)
        half = (((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF).astype("<u2").tobytes()
        header[name] = {"dtype": "BF16", "shape": list(tensors[name].shape),
                        "data_offsets": [offset, offset + len(half)]}
        blobs.append(half)
        offset += len(half)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        for blob in blobs:
            f.write(blob)


@torch.no_grad()
def greedy(model, prompt, n):
    ids = list(prompt)
    for _ in range(n):
        logits = model(torch.tensor([ids[-model.cfg["max_position_embeddings"]:]]))
        ids.append(int(logits[0, -1].argmax()))
    return ids[len(prompt):]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--source", default=SOURCE)
    ap.add_argument("--out_dir", default="tools/demo_model")
    ap.add_argument("--tokenizer_tool", default="build/tools/pdserve_make_tokenizer")
    ap.add_argument("--vocab_size", type=int, default=2048)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--intermediate", type=int, default=640)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--kv_heads", type=int, default=4)
    ap.add_argument("--context", type=int, default=512, help="max_position_embeddings")
    ap.add_argument("--window", type=int, default=128, help="training sequence length, BOS included")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--check_passages", type=int, default=1,
                    help="0: report the greedy passage check without failing on it (a draft model)")
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    os.makedirs(args.out_dir, exist_ok=True)

    # 1-2. Text and tokenizer.
    corpus = read_corpus(args.source)
    with tempfile.TemporaryDirectory() as tmp:
        corpus_path = os.path.join(tmp, "corpus.txt")
        ids_path = os.path.join(tmp, "ids.json")
        with open(corpus_path, "w", encoding="utf-8") as f:
            f.write(corpus)
        subprocess.run([args.tokenizer_tool, f"--corpus={corpus_path}",
                        f"--vocab_size={args.vocab_size}", f"--out_dir={args.out_dir}",
                        f"--ids_out={ids_path}"], check=True)
        with open(ids_path) as f:
            ids = json.load(f)

    # Paragraph starts: token boundaries right after a blank line.
    with open(os.path.join(args.out_dir, "tokenizer.json")) as f:
        vocab = json.load(f)["model"]["vocab"]
    token_bytes = token_byte_table(vocab)
    starts, text_so_far = [0], b""
    for i, t in enumerate(ids[:-1]):
        text_so_far = (text_so_far + token_bytes[t])[-2:]
        if text_so_far == b"\n\n":
            starts.append(i + 1)
    data = torch.tensor(ids + [END_OF_TEXT_ID] * args.window)

    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": args.vocab_size,
        "hidden_size": args.hidden,
        "intermediate_size": args.intermediate,
        "num_hidden_layers": args.layers,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.hidden // args.heads,
        "max_position_embeddings": args.context,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_bias": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": [END_OF_TEXT_ID, EOT_ID],
        "torch_dtype": "bfloat16",
    }
    model = Llama(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"corpus: {len(corpus)} bytes, {len(ids)} tokens, {len(starts)} paragraphs; "
          f"model: {n_params / 1e6:.2f} M parameters", flush=True)

    # 3. Training: AdamW, linear warm-up, cosine decay to lr/20.
    decay = [p for p in model.w if p.dim() == 2]  # matrices; norms are not decayed
    no_decay = [p for p in model.w if p.dim() != 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, args.steps // 20)
    gen = torch.Generator().manual_seed(args.seed)
    bos = torch.full((args.batch, 1), BOS_ID)
    offsets = torch.arange(args.window - 1)
    start_t = torch.tensor(starts)
    t0 = time.time()
    ema = None
    for step in range(1, args.steps + 1):
        lr = args.lr * (step / warmup if step <= warmup else
                        0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / (args.steps - warmup))))
        for g in opt.param_groups:
            g["lr"] = lr
        pick = start_t[torch.randint(len(starts), (args.batch,), generator=gen)]
        window = torch.cat([bos, data[pick[:, None] + offsets]], dim=1)  # [batch, window]
        logits = model(window[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), window[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        ema = loss.item() if ema is None else 0.95 * ema + 0.05 * loss.item()
        if step % 50 == 0 or step == args.steps:
            print(f"step {step:5d}  loss {loss.item():.4f}  (ema {ema:.4f})  lr {lr:.2e}  "
                  f"{time.time() - t0:.0f} s", flush=True)

    # 4. Weights rounded to bf16, as written; the loss over the text and the
    # passage check run on them. The loss is taken paragraph by paragraph,
    # each after BOS, as prompts reach the model.
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(bf16_round(p))
        total, count = 0.0, 0
        for i, s in enumerate(starts):
            end = starts[i + 1] if i + 1 < len(starts) else len(ids)
            chunk = torch.tensor([[BOS_ID] + ids[s:end][:args.context - 1]])
            logits = model(chunk[:, :-1])
            total += F.cross_entropy(logits[0], chunk[0, 1:], reduction="sum").item()
            count += chunk.shape[1] - 1
    print(f"final training loss (last step): {loss.item():.4f}; loss over every paragraph of "
          f"the text after BOS, bf16 weights: {total / count:.4f} nats/token", flush=True)

    tensors = {n: p for n, p in zip(model.names, model.w)}
    write_safetensors(os.path.join(args.out_dir, "model.safetensors"), tensors)
    with open(os.path.join(args.out_dir, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
        f.write("\n")
    with open(os.path.join(args.out_dir, "generation_config.json"), "w") as f:
        json.dump({"bos_token_id": BOS_ID, "eos_token_id": [END_OF_TEXT_ID, EOT_ID]}, f, indent=2)
        f.write("\n")

    # Greedy continuation of known passages, through the tokenizer tool's ids.
    failures = 0
    for prompt, want in PASSAGES:
        prompt_ids = encode_with(args.tokenizer_tool, args.out_dir, prompt)
        want_ids = encode_with(args.tokenizer_tool, args.out_dir, prompt + want)[len(prompt_ids):]
        got = greedy(model, [BOS_ID] + prompt_ids, len(want_ids))
        ok = got == want_ids
        failures += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {prompt!r} -> {decode(vocab, got)!r}", flush=True)
    print(f"wrote {args.out_dir}; {len(PASSAGES) - failures} of {len(PASSAGES)} passages continued exactly")
    return 0 if failures == 0 or not args.check_passages else 1


def encode_with(tool, model_dir, text):
    """Token ids of `text` as pdserve's tokenizer in `model_dir` encodes it (no BOS)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "text.txt")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        subprocess.run([tool, f"--out_dir={model_dir}", f"--encode={path}", f"--ids_out={path}.json"],
                       check=True, stdout=subprocess.DEVNULL)
        with open(path + ".json") as f:
            return json.load(f)


def token_byte_table(vocab):
    """{id: raw bytes} of a byte-level vocabulary."""
    alphabet = byte_alphabet()
    return {i: bytes(alphabet[c] for c in tok) if all(c in alphabet for c in tok) else b""
            for tok, i in vocab.items()}


def decode(vocab, ids):
    table = token_byte_table(vocab)
    return b"".join(table.get(i, b"") for i in ids).decode("utf-8", errors="replace")


def byte_alphabet():
    """GPT-2 bytes_to_unicode, reversed: character -> byte."""
    bs = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


if __name__ == "__main__":
    sys.exit(main())
