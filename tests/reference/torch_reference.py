#!/usr/bin/env python3
"""Independent reference forward pass for pdserve's supported architectures.

Reads a Hugging Face model directory (config.json and model.safetensors, or
model.safetensors.index.json plus shards) with a self-contained safetensors
reader (json + struct + numpy; transformers is not used or needed) and runs
the decoder in plain PyTorch on the CPU, in float64 by default, following the
Hugging Face modeling code:

  LlamaForCausalLM    modeling_llama.py: RMSNorm, rotate_half RoPE (inv_freq
                      from _compute_default_rope_parameters, or
                      _compute_llama3_parameters for rope_scaling "llama3"),
                      repeat_kv GQA, causal softmax attention with scaling
                      head_dim**-0.5, SwiGLU MLP; attention_bias on q/k/v/o
  MistralForCausalLM  Llama math; sliding_window: query i attends to keys j
                      with i - sliding_window < j <= i
  Qwen2ForCausalLM    biases on q/k/v projections
  Qwen3ForCausalLM    per-head RMSNorm (q_norm, k_norm) on q and k before RoPE

As in Hugging Face, inv_freq and the RoPE angles are computed in float32 and
cos/sin cast to the compute dtype. One deliberate difference: HF's eager
attention runs softmax in float32; here it runs in the compute dtype.

Usage as a tool:
  torch_reference.py MODEL_DIR 1,2,3 [--greedy N]   -> JSON logits on stdout
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch


# ---- safetensors ----

def read_safetensors(path):
    """Returns {name: float64 torch tensor} for every tensor of one file."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[base + begin:base + end]
        dtype = info["dtype"]
        if dtype == "F32":
            arr = np.frombuffer(raw, dtype="<f4")
        elif dtype == "F64":
            arr = np.frombuffer(raw, dtype="<f8")
        elif dtype == "F16":
            arr = np.frombuffer(raw, dtype="<f2")
        elif dtype == "BF16":
            # bf16 is the top half of an fp32: widen the bits, reinterpret.
            arr = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        out[name] = torch.from_numpy(arr.astype(np.float64).reshape(info["shape"]))
    return out


def load_checkpoint(model_dir):
    """All tensors of a single-file or sharded checkpoint."""
    single = os.path.join(model_dir, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    with open(os.path.join(model_dir, "model.safetensors.index.json")) as f:
        weight_map = json.load(f)["weight_map"]
    tensors = {}
    for shard in sorted(set(weight_map.values())):
        for name, t in read_safetensors(os.path.join(model_dir, shard)).items():
            if weight_map.get(name) == shard:
                tensors[name] = t
    missing = set(weight_map) - set(tensors)
    if missing:
        raise ValueError(f"tensors missing from their shards: {sorted(missing)[:5]}")
    return tensors


# ---- RoPE frequencies, as transformers/modeling_rope_utils.py ----

def default_inv_freq(base, dim):
    return 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim))


def llama3_inv_freq(base, dim, rope_scaling):
    inv_freq = default_inv_freq(base, dim)
    factor = rope_scaling["factor"]
    low_freq_factor = rope_scaling["low_freq_factor"]
    high_freq_factor = rope_scaling["high_freq_factor"]
    old_context_len = rope_scaling["original_max_position_embeddings"]

    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor

    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


# ---- the model ----

def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    """[kv_heads, seq, d] -> [kv_heads * n_rep, seq, d], each head repeated n_rep times."""
    if n_rep == 1:
        return x
    kv_heads, seq, d = x.shape
    return x[:, None, :, :].expand(kv_heads, n_rep, seq, d).reshape(kv_heads * n_rep, seq, d)


class ReferenceModel:
    SUPPORTED = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")

    def __init__(self, model_dir, dtype=torch.float64):
        with open(os.path.join(model_dir, "config.json")) as f:
            cfg = json.load(f)
        self.arch = cfg["architectures"][0]
        if self.arch not in self.SUPPORTED:
            raise ValueError(f"unsupported architecture {self.arch}")
        self.dtype = dtype
        self.hidden = cfg["hidden_size"]
        self.layers = cfg["num_hidden_layers"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads") or self.heads
        default_head_dim = 128 if self.arch == "Qwen3ForCausalLM" else self.hidden // self.heads
        self.head_dim = cfg.get("head_dim") or default_head_dim
        self.eps = cfg.get("rms_norm_eps", 1e-6)
        self.tied = cfg.get("tie_word_embeddings", False)
        theta = cfg.get("rope_theta", 10000.0)
        scaling = cfg.get("rope_scaling")
        rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
        if rope_type == "default":
            self.inv_freq = default_inv_freq(theta, self.head_dim)
        elif rope_type == "llama3":
            self.inv_freq = llama3_inv_freq(theta, self.head_dim, scaling)
        else:
            raise ValueError(f"unsupported rope_type {rope_type}")
        self.attention_bias = cfg.get("attention_bias", False)
        self.qkv_bias = self.arch == "Qwen2ForCausalLM" or (
            self.arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and self.attention_bias)
        self.o_bias = self.arch in ("LlamaForCausalLM", "Qwen3ForCausalLM") and self.attention_bias
        self.qk_norm = self.arch == "Qwen3ForCausalLM"
        self.sliding_window = cfg.get("sliding_window", 4096) if self.arch == "MistralForCausalLM" else None
        self.w = {k: v.to(dtype) for k, v in load_checkpoint(model_dir).items()}

    def rms_norm(self, x, weight):
        variance = x.pow(2).mean(-1, keepdim=True)
        return weight * (x * torch.rsqrt(variance + self.eps))

    def linear(self, x, prefix, bias):
        y = x @ self.w[prefix + ".weight"].T
        if bias:
            y = y + self.w[prefix + ".bias"]
        return y

    def rope_cos_sin(self, seq):
        # LlamaRotaryEmbedding.forward: float32 angles, cos/sin cast afterwards.
        inv = self.inv_freq[:, None].float()
        pos = torch.arange(seq, dtype=torch.int64)[None, :].float()
        freqs = (inv @ pos).T  # [seq, head_dim / 2]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def mask(self, seq):
        """Additive mask [seq, seq]: 0 where query i may see key j, -inf elsewhere."""
        i = torch.arange(seq)[:, None]
        j = torch.arange(seq)[None, :]
        allowed = j <= i
        if self.sliding_window:
            allowed = allowed & (j > i - self.sliding_window)
        m = torch.zeros(seq, seq, dtype=self.dtype)
        return m.masked_fill(~allowed, float("-inf"))

    def forward(self, tokens):
        """Logits [len(tokens), vocab] at every position."""
        seq = len(tokens)
        x = self.w["model.embed_tokens.weight"][torch.tensor(tokens, dtype=torch.long)]
        cos, sin = self.rope_cos_sin(seq)
        mask = self.mask(seq)
        hd = self.head_dim
        for layer in range(self.layers):
            p = f"model.layers.{layer}."
            h = self.rms_norm(x, self.w[p + "input_layernorm.weight"])
            q = self.linear(h, p + "self_attn.q_proj", self.qkv_bias).view(seq, self.heads, hd)
            k = self.linear(h, p + "self_attn.k_proj", self.qkv_bias).view(seq, self.kv_heads, hd)
            v = self.linear(h, p + "self_attn.v_proj", self.qkv_bias).view(seq, self.kv_heads, hd)
            if self.qk_norm:
                q = self.rms_norm(q, self.w[p + "self_attn.q_norm.weight"])
                k = self.rms_norm(k, self.w[p + "self_attn.k_norm.weight"])
            q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, seq, hd]
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            n_rep = self.heads // self.kv_heads
            k, v = repeat_kv(k, n_rep), repeat_kv(v, n_rep)
            scores = (q @ k.transpose(1, 2)) * hd ** -0.5 + mask
            attn = torch.softmax(scores, dim=-1) @ v  # [heads, seq, hd]
            attn = attn.transpose(0, 1).reshape(seq, self.heads * hd)
            x = x + self.linear(attn, p + "self_attn.o_proj", self.o_bias)
            h = self.rms_norm(x, self.w[p + "post_attention_layernorm.weight"])
            gate = self.linear(h, p + "mlp.gate_proj", False)
            up = self.linear(h, p + "mlp.up_proj", False)
            x = x + self.linear(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj", False)
        x = self.rms_norm(x, self.w["model.norm.weight"])
        head = self.w["model.embed_tokens.weight"] if self.tied else self.w["lm_head.weight"]
        return x @ head.T

    def greedy(self, prompt, num_tokens):
        """Greedy continuation (argmax, lowest id on ties), recomputed from scratch
        each step; returns (tokens, top-2 logit margins per step)."""
        seq = list(prompt)
        out, margins = [], []
        for _ in range(num_tokens):
            logits = self.forward(seq)[-1]
            top2 = torch.topk(logits, 2).values
            margins.append(float(top2[0] - top2[1]))
            nxt = int(torch.argmax(logits))
            out.append(nxt)
            seq.append(nxt)
        return out, margins


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("tokens", help="comma-separated prompt ids")
    parser.add_argument("--greedy", type=int, default=0, help="greedy tokens to generate")
    args = parser.parse_args()
    model = ReferenceModel(args.model_dir)
    tokens = [int(t) for t in args.tokens.split(",") if t]
    result = {"logits": model.forward(tokens).tolist()}
    if args.greedy:
        result["greedy_tokens"], _ = model.greedy(tokens, args.greedy)
    json.dump(result, sys.stdout)
    print()


if __name__ == "__main__":
    main()
