#!/usr/bin/env bash
# zerone convert (issue 9) and Hugging Face GPT-2 directories with --init:
#   - tests/data/hf_gpt2 is a GPT-2 as GPT2LMHeadModel.save_pretrained stores it, with PyTorch's loss
#     on a fixed batch (tests/io/make_hf_gpt2_golden.py): --init reproduces that loss (f32, 1e-5).
#   - hf -> zerone -> hf and hf -> llmc -> zerone -> hf give back the same tensors, byte for byte,
#     under the same names, shapes and dtype (Conv1D weights (in, out), no lm_head, unpadded vocab).
#   - a training checkpoint (bf16 run) converts with --dtype f32 from its f32 master weights; the
#     HF export of a trained model gives the loss the trainer reports for it.
#   - bad conversions are one clear error.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
data="$here/../data"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
tensors() { python3 "$here/tensor_digest.py" "$1"; }  # tensors DIR: "name dtype shape sha256" lines, sorted
golden_loss=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' "$data/hf_gpt2/golden.json")
loss_of() {  # loss_of INIT [ARGS...]: the first step's loss (before any update) on the golden batch
  local init="$1"; shift
  "$Z" train --init "$init" --data "$data/hf_gpt2/tokens.bin" --micro-batch 2 --seq 16 --steps 1 --no-shuffle \
    --threads 1 --metrics "$d/loss.jsonl" "$@" > "$d/loss.log" 2>&1 || { cat "$d/loss.log"; exit 1; }
  python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).readline())["loss"])' "$d/loss.jsonl"
}
close() {  # close A B WHAT
  if python3 -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)' "$1" "$2"; then
    echo "ok   $3: loss $1 (PyTorch $2)"
  else
    echo "FAIL $3: loss $1, PyTorch $2"; fail=1
  fi
}

close "$(loss_of "$data/hf_gpt2" --precision fp32)" "$golden_loss" "--init of a Hugging Face GPT-2 directory"

# Round trips through every format.
tensors "$data/hf_gpt2" > "$d/golden.tensors"
"$Z" convert "$data/hf_gpt2" "$d/z" --to zerone >/dev/null
"$Z" convert "$d/z" "$d/hf1" --to hf >/dev/null
"$Z" convert "$data/hf_gpt2" "$d/m.bin" >/dev/null
"$Z" convert "$d/m.bin" "$d/z2" --to zerone >/dev/null
"$Z" convert "$d/z2" "$d/hf2/" >/dev/null
for out in hf1 hf2; do
  if diff <(tensors "$d/$out") "$d/golden.tensors" >/dev/null; then
    echo "ok   round trip to $out: the same tensors, names, shapes and bytes as the golden directory"
  else
    echo "FAIL round trip to $out differs:"; diff <(tensors "$d/$out") "$d/golden.tensors" | head; fail=1
  fi
done
python3 - "$d/hf1/config.json" <<'EOF' && echo "ok   config.json: GPT2LMHeadModel keys" || { echo "FAIL config.json"; fail=1; }
import json, sys
c = json.load(open(sys.argv[1]))
assert c["architectures"] == ["GPT2LMHeadModel"] and c["model_type"] == "gpt2", c
assert (c["n_layer"], c["n_embd"], c["n_head"], c["vocab_size"], c["n_positions"]) == (2, 32, 4, 257, 16), c
assert c["tie_word_embeddings"] is True and c["torch_dtype"] == "float32", c
EOF
close "$(loss_of "$d/z" --precision fp32)" "$golden_loss" "--init of a converted zerone checkpoint"

# bf16: hf -> bf16 hf -> f32 is the round-to-nearest-even of the original; llm.c v5 stores the same.
"$Z" convert "$data/hf_gpt2" "$d/hf_bf16" --dtype bf16 >/dev/null
"$Z" convert "$d/hf_bf16" "$d/bf16.bin" >/dev/null
"$Z" convert "$d/bf16.bin" "$d/hf_bf16_again" >/dev/null
tensors "$d/hf_bf16" > "$d/bf16.tensors"
if diff "$d/bf16.tensors" <(tensors "$d/hf_bf16_again") >/dev/null && grep -q BF16 "$d/bf16.tensors"; then
  echo "ok   bf16 round trip hf -> llm.c v5 -> hf is lossless"
else
  echo "FAIL bf16 round trip"; fail=1
fi

# A training checkpoint of a bf16 run: --dtype f32 takes the f32 master weights, and the exported
# model's loss on a batch is the one zerone computes from the checkpoint itself.
"$Z" train --init "$data/hf_gpt2" --data "$data/hf_gpt2/tokens.bin" --micro-batch 2 --seq 16 --steps 3 --no-shuffle \
  --lr 1e-2 --precision bf16 --threads 1 --checkpoint-dir "$d/ck" > "$d/train.log" 2>&1 || { cat "$d/train.log"; exit 1; }
"$Z" convert "$d/ck" "$d/trained_f32" --dtype f32 >/dev/null
"$Z" convert "$d/ck" "$d/trained_bf16" >/dev/null
"$Z" convert "$d/ck/step-00000003" "$d/trained_z" --to zerone --dtype f32 >/dev/null
a=$(loss_of "$d/trained_f32" --precision fp32); b=$(loss_of "$d/trained_z" --precision fp32)
[ "$a" = "$b" ] && echo "ok   a bf16 training checkpoint exports its f32 master weights (loss $a either way)" \
  || { echo "FAIL master export: $a vs $b"; fail=1; }
a=$(loss_of "$d/trained_bf16" --precision bf16); b=$(loss_of "$d/ck" --precision bf16)
[ "$a" = "$b" ] && echo "ok   the bf16 export computes what the checkpoint computes (loss $a)" \
  || { echo "FAIL bf16 export: $a vs $b"; fail=1; }
if python3 - "$d/trained_f32/model.safetensors" "$d/trained_bf16/model.safetensors" <<'EOF'
import json, struct, sys
def load(path):
    raw = open(path, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); return raw[8 + n:], h
f32, hf = load(sys.argv[1]); b16, hb = load(sys.argv[2])
def rne(x):  # f32 bits -> bf16 bits, round to nearest even
    return ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
for name, e in hf.items():
    if name == "__metadata__": continue
    a, b = e["data_offsets"]; c, d = hb[name]["data_offsets"]
    xs = struct.unpack(f"<{(b - a) // 4}I", f32[a:b]); ys = struct.unpack(f"<{(d - c) // 2}H", b16[c:d])
    assert all(rne(x) == y for x, y in zip(xs, ys)), name
EOF
then echo "ok   the bf16 export is the rounded f32 master"; else echo "FAIL bf16 export vs master"; fail=1; fi

# Bad conversions.
check "convert: cannot open '/nonexistent'" "$Z" convert /nonexistent "$d/x"
check "which an llm.c checkpoint \(GPT-2 only\) cannot hold" "$Z" convert "$data/hf_llama_tied" "$d/llama.bin"
check "llm.c checkpoints hold fp32 or bf16" "$Z" convert "$data/hf_gpt2" "$d/f16.bin" --dtype f16
check "exists; a zerone checkpoint is written as a new directory" "$Z" convert "$data/hf_gpt2" "$d/z" --to zerone
check "--to 'onnx': expected hf, llmc or zerone" "$Z" convert "$data/hf_gpt2" "$d/x" --to onnx
check "unknown precision 'f8'" "$Z" convert "$data/hf_gpt2" "$d/x" --dtype f8
mkdir "$d/empty"
check "is a directory, but neither a Hugging Face model directory" "$Z" convert "$d/empty" "$d/x"
head -c 3000 "$d/m.bin" > "$d/trunc.bin"
check "is truncated" "$Z" convert "$d/trunc.bin" "$d/x"
[ ! -e "$d/x" ] && echo "ok   no partial destination was left" || { echo "FAIL a partial destination was left"; fail=1; }

# A source that fails while being read (a flipped byte in a rank file) leaves no destination
# directory behind (an empty one was left), and an existing one keeps its files.
cp -r "$d/ck" "$d/ck_flip"
python3 - "$d/ck_flip/step-00000003/rank-00000.bin" <<'EOF'
import sys
f = open(sys.argv[1], "r+b"); f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 1]))
EOF
check "rank-00000.bin' is corrupted: checksum mismatch" "$Z" convert "$d/ck_flip" "$d/flip_hf"
[ ! -e "$d/flip_hf" ] && echo "ok   no destination directory was left" || { echo "FAIL $d/flip_hf was left"; fail=1; }
before=$(tensors "$d/hf1")
check "checksum mismatch" "$Z" convert "$d/ck_flip" "$d/hf1"
[ "$(tensors "$d/hf1")" = "$before" ] && echo "ok   an existing destination directory keeps its files" \
  || { echo "FAIL the existing destination changed"; fail=1; }

# SIGINT during a conversion: exit 130, nothing written, no temporary left (one as large as the
# model was). The source: a sparse llm.c file of an 85M-parameter GPT-2 (zeros), 1-3 s to convert.
mkdir "$d/sig"
python3 -c 'import struct, sys; open(sys.argv[1], "wb").write(struct.pack("<256i", 20240326, 3, 16, 257, 12, 12, 768, 384, *[0] * 248))' "$d/big.bin"
truncate -s 341453824 "$d/big.bin"
for to in hf zerone llmc; do
  "$Z" convert "$d/big.bin" "$d/sig/out_$to" --to "$to" > "$d/sig.log" 2>&1 & pid=$!
  sleep 0.4; kill -INT "$pid"; rc=0; wait "$pid" || rc=$?
  if [ "$rc" = 130 ] && grep -q "convert stopped by SIGINT" "$d/sig.log" && [ -z "$(ls -A "$d/sig")" ]; then
    echo "ok   SIGINT during convert --to $to: exit 130, nothing left beside the destination"
  else
    echo "FAIL SIGINT during convert --to $to: exit $rc, left: $(ls -A "$d/sig")"; cat "$d/sig.log"; fail=1
  fi
  rm -rf "$d/sig" && mkdir "$d/sig"
done
rm -f "$d/big.bin"
exit $fail
