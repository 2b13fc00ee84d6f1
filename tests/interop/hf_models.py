"""make interop: zerone's Hugging Face model directories against the real `transformers`.

Usage: python hf_models.py ZERONE WORKDIR

Both directions, each check one `ok`/`FAIL` line:
  - from transformers: small random models that transformers builds and writes with
    save_pretrained (GPT-2; LLaMA with tied and untied heads, grouped-query attention, llama3 rope
    scaling, sharded safetensors) are trained by `zerone train --init DIR`; zerone's first-step
    training loss must equal the loss transformers computes on the same batch.
  - to transformers: what `zerone train --save DIR/` and `zerone convert CK DIR` write is loaded with
    GPT2LMHeadModel / LlamaForCausalLM.from_pretrained, and transformers' loss on the validation
    batch equals zerone's validation loss after the step that produced the saved weights.

The oracle: zerone's loss of a step is the mean next-token cross-entropy over its B x T positions,
the batch read in file order (--no-shuffle: sample b is tokens[b*T : b*T+T+1] of the shard; the
validation pass reads batch 0 at sample 0). transformers computes the same from its logits. Both
run in f32; the two differ only by the order of floating-point sums (GEMMs, softmax, attention),
whose rounding error is a few ulp times sqrt(terms): measured 1e-8 .. 5e-8 relative on these models.
TOLERANCE (1e-6 relative) leaves a margin of 20 over that, while any real difference (a transposed
weight, a wrong rotary frequency, a missing tied head) moves the loss by 1e-3 or more (ignoring
transformers 5's rope_parameters moved it by 2.5e-3): the weights below are drawn large (not
transformers' 0.02) so that every part of the model shapes the logits.
"""
import json
import math
import os
import struct
import subprocess
import sys

import numpy as np
import torch
import torch.nn.functional as F
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

TOLERANCE = 1e-6
B, T = 4, 32
VOCAB = 384

zerone, work = sys.argv[1], sys.argv[2]
torch.set_num_threads(2)
failures = 0


def report(ok, name, detail):
    global failures
    failures += 0 if ok else 1
    print(f"{'ok  ' if ok else 'FAIL'} {name}: {detail}", flush=True)


def write_shard(path, tokens):
    """An llm.c token shard: 256 int32 header (magic 20240520, version 1, count), uint16 tokens."""
    header = np.zeros(256, dtype=np.int32)
    header[:3] = [20240520, 1, len(tokens)]
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(tokens, dtype=np.uint16).tobytes())


def zerone_run(*args):
    """Runs zerone; returns its metrics JSONL lines. Raises with zerone's output on failure."""
    metrics = os.path.join(work, "metrics.jsonl")
    if os.path.exists(metrics):
        os.remove(metrics)
    cmd = [zerone, *args, "--precision", "fp32", "--threads", "2", "--metrics", metrics]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    lines = [json.loads(l) for l in open(metrics)]
    return [l for l in lines if "step" in l]


def hf_loss(model, tokens, first_sample=0):
    """transformers' mean next-token loss over the batch zerone reads at `first_sample` (file order)."""
    t = torch.as_tensor(np.asarray(tokens[first_sample * T: first_sample * T + B * T + 1], dtype=np.int64))
    inputs, targets = t[:-1].view(B, T), t[1:].view(B, T)  # (B, T) each
    with torch.no_grad():
        logits = model(input_ids=inputs).logits  # (B, T, V)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).double(), targets.reshape(-1)).item()


def compare(name, zerone_loss, transformers_loss, what):
    rel = abs(zerone_loss - transformers_loss) / abs(transformers_loss)
    report(rel <= TOLERANCE and math.isfinite(zerone_loss), name,
           f"{what}: zerone {zerone_loss:.7f}, transformers {transformers_loss:.7f} (relative {rel:.1e}, tolerance {TOLERANCE:.0e})")


def randomize(model, seed):
    """Large random weights: normal(0, 1/sqrt(fan_in)) matrices, N(0, 1) embeddings, norms 1 +- 0.2."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                base = 1.0 if ("ln_" in name or "norm" in name) and name.endswith("weight") else 0.0
                p.copy_(base + 0.2 * torch.randn(p.shape, generator=g))
            elif "wte" in name or "wpe" in name or "embed_tokens" in name:
                p.copy_(torch.randn(p.shape, generator=g))
            else:
                # GPT-2's Conv1D stores (in, out); nn.Linear (out, in).
                fan_in = p.shape[0] if isinstance(model, GPT2LMHeadModel) else p.shape[1]
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))
    return model


rng = np.random.default_rng(0)
train_tokens = rng.integers(0, VOCAB, size=8 * B * T + 1)
val_tokens = rng.integers(0, VOCAB, size=2 * B * T + 1)
train_shard, val_shard = os.path.join(work, "train.bin"), os.path.join(work, "val.bin")
write_shard(train_shard, train_tokens)
write_shard(val_shard, val_tokens)

gpt2 = dict(vocab_size=VOCAB, n_positions=64, n_embd=64, n_layer=2, n_head=4, layer_norm_epsilon=1e-5)
llama = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=176, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
             tie_word_embeddings=False)
# llama3 scaling with the original context at 16 positions: head_dim 16's wavelengths 6.3 .. 6283 fall in
# all three of its bands (kept below 4, smoothed between 4 and 16, divided by `factor` above).
llama3_rope = dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                   original_max_position_embeddings=16)
cases = [
    # (name, class, config, None | max_shard_size for a sharded save | "bf16" for a bf16 save)
    ("gpt2", GPT2LMHeadModel, GPT2Config(**gpt2), None),
    ("llama_untied", LlamaForCausalLM, LlamaConfig(**llama), None),
    ("llama_tied", LlamaForCausalLM, LlamaConfig(**{**llama, "tie_word_embeddings": True}), None),
    ("llama_gqa", LlamaForCausalLM, LlamaConfig(**{**llama, "num_key_value_heads": 2}), None),
    ("llama_mqa_rope_theta", LlamaForCausalLM, LlamaConfig(**{**llama, "num_key_value_heads": 1, "rope_theta": 500000.0}), None),
    ("llama3_rope_scaling", LlamaForCausalLM,
     LlamaConfig(**{**llama, "num_key_value_heads": 2, "rope_scaling": llama3_rope}), None),
    ("llama_head_dim", LlamaForCausalLM, LlamaConfig(**{**llama, "num_key_value_heads": 2, "head_dim": 32}), None),
    ("llama_bf16_file", LlamaForCausalLM, LlamaConfig(**{**llama, "num_key_value_heads": 2}), "bf16"),
    ("llama_sharded", LlamaForCausalLM, LlamaConfig(**{**llama, "num_key_value_heads": 2}), "100KB"),
    ("gpt2_sharded", GPT2LMHeadModel, GPT2Config(**gpt2), "100KB"),
]

print(f"transformers {transformers.__version__}, torch {torch.__version__}; B={B} T={T} vocab {VOCAB}, f32")
for i, (name, cls, config, shard_size) in enumerate(cases):
    src = os.path.join(work, f"hf_{name}")
    try:
        model = randomize(cls(config), seed=100 + i).float().eval()
        if shard_size == "bf16":  # a bf16 file: zerone --init converts to f32, as from_pretrained(...).float()
            model.to(torch.bfloat16).save_pretrained(src, safe_serialization=True)
            shard_size = None
        elif shard_size:
            model.save_pretrained(src, safe_serialization=True, max_shard_size=shard_size)
            shards = sorted(f for f in os.listdir(src) if f.endswith(".safetensors"))
            assert len(shards) > 1 and os.path.exists(os.path.join(src, "model.safetensors.index.json")), shards
        else:
            model.save_pretrained(src, safe_serialization=True)
        want = hf_loss(cls.from_pretrained(src).float().eval(), train_tokens)
        got = zerone_run("train", "--init", src, "--data", train_shard, "--no-shuffle", "--steps", "1",
                         "--micro-batch", str(B), "--seq", str(T))[0]["loss"]
        compare(f"from_transformers_{name}", got, want,
                "first training loss of zerone train --init (save_pretrained" +
                (f", {len(shards)} shards" if shard_size else "") + ")")
    except Exception as e:  # one failing case must not hide the others
        report(False, f"from_transformers_{name}", repr(e))

# zerone -> transformers. A model from --model (zerone writes config.json itself) and one continued
# from a transformers directory (zerone carries its config), each saved with --save and converted
# from a checkpoint with `zerone convert`.
exports = [
    ("gpt2", GPT2LMHeadModel, ["--model", "gpt2:layers=2,dim=64,heads=4,vocab=384,ctx=64"]),
    ("llama_gqa_untied", LlamaForCausalLM, ["--model", "llama:layers=2,dim=64,heads=4,kv_heads=2,ffn=176,vocab=384,ctx=64,tied=0"]),
    ("llama_tied", LlamaForCausalLM, ["--model", "llama:layers=2,dim=64,heads=4,kv_heads=4,ffn=176,vocab=384,ctx=64,tied=1"]),
    ("llama3_rope_scaling", LlamaForCausalLM, ["--init", os.path.join(work, "hf_llama3_rope_scaling")]),
    ("gpt2_from_sharded", GPT2LMHeadModel, ["--init", os.path.join(work, "hf_gpt2_sharded")]),
]
steps = 6
for name, cls, model_args in exports:
    out, ck, converted = (os.path.join(work, f"{k}_{name}") for k in ("out", "ck", "converted"))
    try:
        lines = zerone_run("train", *model_args, "--data", train_shard, "--val-data", val_shard, "--no-shuffle",
                           "--steps", str(steps), "--lr", "3e-3", "--micro-batch", str(B), "--seq", str(T),
                           "--val-every", str(steps), "--val-batches", "1", "--save", out + "/",
                           "--checkpoint-dir", ck)
        zerone_val = lines[-1]["val_loss"]
        for what, path, args in (("zerone train --save", out, None), ("zerone convert", converted, ["convert", ck, converted])):
            if args:
                p = subprocess.run([zerone, *args], capture_output=True, text=True)
                if p.returncode != 0:
                    raise RuntimeError(f"zerone convert exited {p.returncode}: {p.stdout}{p.stderr}")
            model = cls.from_pretrained(path).float().eval()
            compare(f"to_transformers_{name}_{what.split()[1]}", zerone_val, hf_loss(model, val_tokens),
                    f"{cls.__name__}.from_pretrained of {what}, validation loss after step {steps}")
    except Exception as e:
        report(False, f"to_transformers_{name}", repr(e))

sys.exit(1 if failures else 0)
