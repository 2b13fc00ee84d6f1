#!/usr/bin/env python3
"""Writes tests/data/llama_golden.bin: an independent PyTorch reference for tiny LLaMA models.

Run with Debian's python3-torch or the peers' environment (bench/peers/setup.sh):
`python3 tests/nn/make_llama_golden.py` (the peers' torch 2 reproduces the committed bytes). CI does
not run this; the outputs (this file and tests/data/hf_llama_*) are committed. The model is written
from scratch here in float64 (not imported from zerone), following Hugging Face's LlamaForCausalLM:
RMSNorm, rotate-half rotary embeddings (inv_freq with the llama3 scaling rule), grouped-query
attention (query head h uses kv head h // (NH/NKV), as repeat_kv), SwiGLU MLP, no biases, tied or
untied head.

File layout (little endian): int32 number of cases, then per case
  int32[16]: magic 20261122, version 1, L, C, NH, NKV, hs, F, V, ctx, tied, B, T, 0, 0, 0
  float32[8]: rope_theta, rms_norm_eps, rope_factor, rope_low, rope_high, rope_orig, 0, 0
  int32 inputs (B*T), int32 targets (B*T)
  float32 params in zerone's unit order (embedding wte; per block attn_norm, wqkv = [q; k; v],
          wo, mlp_norm, w_gate_up = [gate; up], w_down; final norm, lm_head if untied)
  float32 logits (B*T*V), float32 loss, float32 grads (same order as params)
"""
import math
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)


def inv_freq(hs, theta, factor, low, high, orig):
    f = 1.0 / (theta ** (torch.arange(0, hs, 2, dtype=torch.float64) / hs))
    if factor <= 0:
        return f
    out = []
    for x in f.tolist():
        wavelen = 2 * math.pi / x
        if wavelen < orig / high:
            out.append(x)
        elif wavelen > orig / low:
            out.append(x / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * x / factor + smooth * x)
    return torch.tensor(out)


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def case(seed, L, C, NH, NKV, hs, F, V, ctx, tied, B, T, theta, eps, factor, low, high, orig):
    torch.manual_seed(seed)
    R = (NH + 2 * NKV) * hs
    shapes = [("wte", (V, C))]
    for l in range(L):
        shapes += [(f"attn_norm{l}", (C,)), (f"wqkv{l}", (R, C)), (f"wo{l}", (C, NH * hs)), (f"mlp_norm{l}", (C,)),
                   (f"w_gate_up{l}", (2 * F, C)), (f"w_down{l}", (C, F))]
    shapes.append(("norm", (C,)))
    if not tied:
        shapes.append(("lm_head", (V, C)))
    p = {}
    for name, shape in shapes:
        t = 1.0 + 0.1 * torch.randn(shape) if "norm" in name else 0.15 * torch.randn(shape)
        p[name] = t.float().double().requires_grad_(True)  # f32-representable starting values
    inputs = torch.randint(0, V, (B, T))
    targets = torch.randint(0, V, (B, T))

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    freqs = inv_freq(hs, theta, factor, low, high, orig)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * freqs[None, :]  # (T, hs/2)
    cos = torch.cat((ang.cos(), ang.cos()), -1)
    sin = torch.cat((ang.sin(), ang.sin()), -1)
    x = p["wte"][inputs]  # (B, T, C)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)
    for l in range(L):
        h = rms(x, p[f"attn_norm{l}"])
        qkv = h @ p[f"wqkv{l}"].T
        q = qkv[..., : NH * hs].view(B, T, NH, hs).transpose(1, 2)
        k = qkv[..., NH * hs : (NH + NKV) * hs].view(B, T, NKV, hs).transpose(1, 2)
        v = qkv[..., (NH + NKV) * hs :].view(B, T, NKV, hs).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = NH // NKV
        k = k[:, :, None].expand(B, NKV, rep, T, hs).reshape(B, NH, T, hs)  # repeat_kv
        v = v[:, :, None].expand(B, NKV, rep, T, hs).reshape(B, NH, T, hs)
        s = (q @ k.transpose(-1, -2)) / math.sqrt(hs)
        s = s.masked_fill(mask, float("-inf")).softmax(-1)
        y = (s @ v).transpose(1, 2).reshape(B, T, NH * hs)
        x = x + y @ p[f"wo{l}"].T
        h = rms(x, p[f"mlp_norm{l}"])
        gu = h @ p[f"w_gate_up{l}"].T
        gate, up = gu[..., :F], gu[..., F:]
        x = x + (torch.nn.functional.silu(gate) * up) @ p[f"w_down{l}"].T
    h = rms(x, p["norm"])
    logits = h @ (p["wte"] if tied else p["lm_head"]).T
    loss = torch.nn.functional.cross_entropy(logits.view(-1, V), targets.view(-1))
    loss.backward()

    out = struct.pack("<16i", 20261122, 1, L, C, NH, NKV, hs, F, V, ctx, int(tied), B, T, 0, 0, 0)
    out += struct.pack("<8f", theta, eps, factor, low, high, orig, 0, 0)
    out += struct.pack(f"<{B*T}i", *inputs.flatten().tolist()) + struct.pack(f"<{B*T}i", *targets.flatten().tolist())
    flat = lambda ts: torch.cat([t.detach().flatten() for t in ts]).float().tolist()
    out += struct.pack(f"<{sum(math.prod(s) for _, s in shapes)}f", *flat([p[n] for n, _ in shapes]))
    out += struct.pack(f"<{B*T*V}f", *logits.detach().flatten().float().tolist())
    out += struct.pack("<f", loss.item())
    out += struct.pack(f"<{sum(math.prod(s) for _, s in shapes)}f", *flat([p[n].grad for n, _ in shapes]))
    hf_dir = {0: "hf_llama_untied", 1: "hf_llama_tied"}[0 if not tied else 1]
    write_hf(hf_dir, p, shapes, L, C, NH, NKV, hs, F, V, ctx, tied, theta, eps, factor, low, high, orig)
    if factor > 0:  # the same model as transformers 5 writes its config (rope_parameters)
        write_hf("hf_llama_rope_parameters", p, shapes, L, C, NH, NKV, hs, F, V, ctx, tied, theta, eps, factor, low,
                 high, orig, rope_parameters=True)
    return out


def write_safetensors(path, tensors):
    """A from-scratch safetensors writer (the format is an 8-byte header length, JSON, raw data)."""
    import json
    header, data, offset = {}, b"", 0
    for name, t in tensors:
        raw = struct.pack(f"<{t.numel()}f", *t.detach().flatten().float().tolist())
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        data += raw
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * ((8 - len(text) % 8) % 8)
    open(path, "wb").write(struct.pack("<Q", len(text)) + text + data)


def write_hf(name, p, shapes, L, C, NH, NKV, hs, F, V, ctx, tied, theta, eps, factor, low, high, orig,
             rope_parameters=False):
    """The same parameters as a Hugging Face LlamaForCausalLM directory (tests/data/NAME), so that
    zerone's --init of a Hugging Face checkpoint is checked against these golden logits. The rotary
    settings as transformers 4 writes them ("rope_theta", "rope_scaling"), or with rope_parameters
    as transformers 5 does: one "rope_parameters" object holding rope_type, rope_theta and the
    scaling (interop's check found zerone ignoring it)."""
    import json, os
    d = os.path.join(os.path.dirname(sys.argv[1] if len(sys.argv) > 1 else "tests/data/x"), name)
    os.makedirs(d, exist_ok=True)
    q, kv = NH * hs, NKV * hs
    t = [("model.embed_tokens.weight", p["wte"])]
    for l in range(L):
        w = p[f"wqkv{l}"]
        gu = p[f"w_gate_up{l}"]
        t += [(f"model.layers.{l}.input_layernorm.weight", p[f"attn_norm{l}"]),
              (f"model.layers.{l}.self_attn.q_proj.weight", w[:q]),
              (f"model.layers.{l}.self_attn.k_proj.weight", w[q:q + kv]),
              (f"model.layers.{l}.self_attn.v_proj.weight", w[q + kv:]),
              (f"model.layers.{l}.self_attn.o_proj.weight", p[f"wo{l}"]),
              (f"model.layers.{l}.post_attention_layernorm.weight", p[f"mlp_norm{l}"]),
              (f"model.layers.{l}.mlp.gate_proj.weight", gu[:F]),
              (f"model.layers.{l}.mlp.up_proj.weight", gu[F:]),
              (f"model.layers.{l}.mlp.down_proj.weight", p[f"w_down{l}"])]
    t.append(("model.norm.weight", p["norm"]))
    if not tied:
        t.append(("lm_head.weight", p["lm_head"]))
    write_safetensors(os.path.join(d, "model.safetensors"), t[::-1])  # any order: the reader goes by name
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": C,
              "intermediate_size": F, "num_hidden_layers": L, "num_attention_heads": NH,
              "num_key_value_heads": NKV, "head_dim": hs, "vocab_size": V, "max_position_embeddings": ctx,
              "rms_norm_eps": eps, "rope_theta": theta, "tie_word_embeddings": tied, "hidden_act": "silu",
              "torch_dtype": "float32",
              "rope_scaling": {"rope_type": "llama3", "factor": factor, "low_freq_factor": low,
                               "high_freq_factor": high, "original_max_position_embeddings": int(orig)}
              if factor > 0 else None}
    if rope_parameters:
        config["rope_parameters"] = {"rope_type": "llama3" if factor > 0 else "default", "rope_theta": theta,
                                     **({k: v for k, v in config.pop("rope_scaling").items() if k != "rope_type"}
                                        if factor > 0 else {})}
        del config["rope_theta"]
    json.dump(config, open(os.path.join(d, "config.json"), "w"), indent=2)


cases = [
    # Untied head, grouped-query attention (2 query heads per kv head), llama3 rope scaling whose
    # thresholds (orig / high = 8, orig / low = 32 positions of wavelength) put the 4 frequencies
    # (wavelengths 6.3, 19.9, 62.8, 198.7) in all three branches: kept, blended, divided.
    case(1234, L=2, C=32, NH=4, NKV=2, hs=8, F=48, V=50, ctx=16, tied=False, B=2, T=8, theta=100.0, eps=1e-5,
         factor=4.0, low=1.0, high=4.0, orig=32.0),
    # Tied head, multi-query attention (NKV = 1), plain rope, another eps.
    case(99, L=1, C=24, NH=3, NKV=1, hs=8, F=40, V=37, ctx=8, tied=True, B=3, T=5, theta=10000.0, eps=1e-6,
         factor=0.0, low=1.0, high=4.0, orig=8192.0),
]
path = sys.argv[1] if len(sys.argv) > 1 else "tests/data/llama_golden.bin"
with open(path, "wb") as f:
    f.write(struct.pack("<i", len(cases)) + b"".join(cases))
print(f"wrote {path}")
