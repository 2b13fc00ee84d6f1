#!/usr/bin/env bash
# The seed examples' data path through the real program (issue 11): training an image classifier
# on IDX files (raw and gzip) learns a learnable task, writes val_loss/val_accuracy at every epoch
# end; broken IDX files and absurd flags are one clear error each, exit 1, never a crash.
set -u
Z="$1"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
mlp="seq:in=1x8x8,flatten,linear=16,relu,linear=4"
python3 "$here/make_idx.py" "$d/raw" 256 64 8 8 4 || exit 1
mkdir -p "$d/gz" "$d/raw" && python3 "$here/make_idx.py" "$d/gz" 256 64 8 8 4 --gzip || exit 1

# 1. Trains: 3 epochs of 256/32 = 8 steps; validation at each epoch end; the task is learnable.
for form in raw gz; do
  "$Z" train --model "$mlp" --data "$d/$form" --optimizer sgd --momentum 0.9 --lr 0.1 --micro-batch 32 --epochs 3 \
    --precision fp32 --metrics "$d/$form.jsonl" > "$d/$form.log" 2>&1 || { echo "FAIL: training on $form"; cat "$d/$form.log"; exit 1; }
  python3 - "$d/$form.jsonl" "$form" <<'PY' || fail=1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
val = [l for l in lines if "val_accuracy" in l]
ok = len(lines) == 24 and [l["step"] for l in val] == [8, 16, 24] and all("samples_per_s" in l for l in lines)
ok = ok and val[-1]["val_accuracy"] >= 0.95 and val[-1]["val_loss"] < val[0]["val_loss"]
print(("ok: " if ok else "FAIL: ") + sys.argv[2] + f": {len(lines)} steps, val at {[l['step'] for l in val]}, "
      f"accuracy {[round(l['val_accuracy'], 3) for l in val]}")
sys.exit(0 if ok else 1)
PY
  grep -q "epoch 1 (step 8): val loss" "$d/$form.log" || { echo "FAIL: no epoch line on the progress output"; fail=1; }
done
# gzip and raw files hold the same bytes: the same trajectory.
python3 -c "
import json,sys
a=[json.loads(l)['loss'] for l in open('$d/raw.jsonl')]; b=[json.loads(l)['loss'] for l in open('$d/gz.jsonl')]
sys.exit(0 if a==b else 1)" && echo "ok: gzip and raw give the same losses" || { echo "FAIL: gzip and raw differ"; fail=1; }

# cifar-cnn on 3x32x32 images in IDX4 files (N, C, H, W): the preset trains, losses finite.
python3 "$here/make_idx.py" "$d/rgb" 32 16 32 32 10 --channels 3 || exit 1
"$Z" train --model cifar-cnn --data "$d/rgb" --optimizer sgd --momentum 0.9 --lr 0.01 --micro-batch 8 --epochs 1 \
  --precision fp32 --metrics "$d/rgb.jsonl" > "$d/rgb.log" 2>&1 && [ "$(wc -l < "$d/rgb.jsonl")" -eq 4 ] &&
  grep -q '"val_accuracy"' "$d/rgb.jsonl" && echo "ok: cifar-cnn trains on 3x32x32 IDX4 images" ||
  { echo "FAIL: cifar-cnn on IDX4"; cat "$d/rgb.log"; fail=1; }

# 2. Broken files.
img="$d/raw/train-images-idx3-ubyte"; lab="$d/raw/train-labels-idx1-ubyte"
mk() { rm -rf "$d/b"; mkdir -p "$d/b"; cp "$d/raw/"* "$d/b/"; }
run=("$Z" train --model "$mlp" --data "$d/b" --steps 1 --micro-batch 32)
mk; printf '\x00\x00\x08\x03\x00' | dd of="$d/b/train-images-idx3-ubyte" bs=1 count=5 conv=notrunc 2>/dev/null
head -c 1000 "$img" > "$d/b/train-images-idx3-ubyte"
check "train-images-idx3-ubyte' is truncated: its header promises 16384 bytes of data, it holds 984" "${run[@]}"
mk; printf '\x08\x03\x00\x00' | dd of="$d/b/train-images-idx3-ubyte" bs=1 count=4 conv=notrunc 2>/dev/null
check "is not an IDX file: its magic starts with 8 3, expected 0 0" "${run[@]}"
mk; printf '\x00\x00\x0d\x03' | dd of="$d/b/train-images-idx3-ubyte" bs=1 count=4 conv=notrunc 2>/dev/null
check "IDX element type 0xd is not supported: expected 0x08" "${run[@]}"
mk; printf '\x00\x00\x08\x02' | dd of="$d/b/train-labels-idx1-ubyte" bs=1 count=4 conv=notrunc 2>/dev/null
check "labels '.*train-labels-idx1-ubyte': the IDX file has 2 dimensions, expected 1" "${run[@]}"
mk; printf 'xyz' >> "$d/b/train-images-idx3-ubyte"
check "has 3 bytes after the 16384 its header describes" "${run[@]}"
mk; head -c 200 "$lab" > "$d/b/train-labels-idx1-ubyte"
check "truncated" "${run[@]}"
mk; python3 - "$d/b/train-labels-idx1-ubyte" <<'PY'
import struct, sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[8 + 17] = 7; open(p, "wb").write(b)
PY
check "label 7 of sample 17 is out of range for the model's 4 classes \(0..3\)" "${run[@]}"
mk; python3 - "$d/b/train-labels-idx1-ubyte" <<'PY'
import struct, sys
p = sys.argv[1]; b = open(p, "rb").read(); open(p, "wb").write(struct.pack(">BBBBI", 0, 0, 8, 1, 255) + b[8:8 + 255])
PY
check "holds 256 images but '.*train-labels-idx1-ubyte' holds 255 labels" "${run[@]}"
mk; rm -f "$d/b/train-images-idx3-ubyte"; gzip -c "$img" | head -c 300 > "$d/b/train-images-idx3-ubyte.gz"
check "(truncated|corrupt)" "${run[@]}"
check "holds 1x8x8 images, but the model takes 1x28x28 inputs" "$Z" train --model mnist-mlp --data "$d/raw" --steps 1
check "is not a directory" "$Z" train --model "$mlp" --data "$d/raw" --val-data "$d/nonexistent" --steps 1
mkdir -p "$d/empty"
check "has no t10k-images-idx3-ubyte" "$Z" train --model "$mlp" --data "$d/raw" --val-data "$d/empty" --steps 1
check "is an image classifier: give --data DIR.*'.*empty' is not one" "$Z" train --model "$mlp" --data "$d/empty" --steps 1
check "fewer than one global batch of 512" "$Z" train --model "$mlp" --data "$d/raw" --micro-batch 512 --steps 1

# 3. Flags that cannot take effect, or are absurd.
check "holds IDX images, but --model .* reads tokens" "$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=16 --data "$d/raw" --steps 1
check "--seq applies to token models" "$Z" train --model "$mlp" --data "$d/raw" --seq 16 --steps 1
check "--epochs and --steps both say how long to train" "$Z" train --model "$mlp" --data "$d/raw" --steps 3 --epochs 1
check "--epochs -1 is negative" "$Z" train --model "$mlp" --data "$d/raw" --epochs -1
check "--momentum 2 is out of range" "$Z" train --model "$mlp" --data "$d/raw" --optimizer sgd --momentum 2
check "--optimizer 'rmsprop': expected adamw or sgd" "$Z" train --model "$mlp" --data "$d/raw" --optimizer rmsprop
check "--nesterov needs a momentum above 0" "$Z" train --model "$mlp" --data "$d/raw" --optimizer sgd --nesterov
check "--momentum applies to --optimizer sgd" "$Z" train --model "$mlp" --data "$d/raw" --momentum 0.9
check "--beta1 applies to --optimizer adamw" "$Z" train --model "$mlp" --data "$d/raw" --optimizer sgd --beta1 0.8
check "--offload-optimizer nvme: sgd without momentum on fp32 parameters keeps no optimizer state to swap" "$Z" train --model "$mlp" --data "$d/raw" --optimizer sgd --zero-stage 1 --offload-optimizer nvme --nvme-path "$d" --precision fp32 --steps 1
check "--activation-checkpointing applies to the transformer models" "$Z" train --model "$mlp" --data "$d/raw" --activation-checkpointing --steps 1
check "cannot be saved" "$Z" train --model "$mlp" --data "$d/raw" --steps 1 --save "$d/out/"
check "unknown layer 'softmax'" "$Z" train --model "seq:in=1x8x8,flatten,softmax" --data "$d/raw" --steps 1
printf '{"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "betas": [0.9, 0.99]}}}' > "$d/sgd_bad.json"
check "key 'optimizer.params.betas' is unknown" "$Z" train --config "$d/sgd_bad.json" --model "$mlp" --data "$d/raw"
# The DeepSpeed config's SGD is the same run as the flags.
printf '{"optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9, "nesterov": true, "weight_decay": 1e-4}}}' > "$d/sgd.json"
"$Z" train --config "$d/sgd.json" --model "$mlp" --data "$d/raw" --micro-batch 32 --steps 5 --precision fp32 --metrics "$d/cfg.jsonl" >/dev/null 2>&1 || { echo "FAIL: SGD config run"; fail=1; }
"$Z" train --optimizer sgd --lr 0.1 --momentum 0.9 --nesterov --weight-decay 1e-4 --model "$mlp" --data "$d/raw" --micro-batch 32 --steps 5 --precision fp32 --metrics "$d/flags.jsonl" >/dev/null 2>&1 || { echo "FAIL: SGD flags run"; fail=1; }
python3 -c "
import json,sys
a=[json.loads(l)['loss'] for l in open('$d/cfg.jsonl')]; b=[json.loads(l)['loss'] for l in open('$d/flags.jsonl')]
sys.exit(0 if a==b and len(a)==5 else 1)" && echo "ok: optimizer.type SGD = --optimizer sgd" || { echo "FAIL: SGD config and flags differ"; fail=1; }
# Checkpoints (issue 9) of a classifier with SGD momentum, dropout and shuffling: 8 steps, resume
# to 16, bitwise the 16-step run.
m2="seq:in=1x8x8,flatten,dropout=0.2,linear=16,relu,linear=4"
ck=(train --model "$m2" --data "$d/raw" --optimizer sgd --momentum 0.9 --lr 0.05 --micro-batch 32 --precision fp32)
"$Z" "${ck[@]}" --steps 16 --metrics "$d/straight.jsonl" >/dev/null 2>&1 &&
  "$Z" "${ck[@]}" --steps 8 --checkpoint-dir "$d/ck" --metrics "$d/resumed.jsonl" >/dev/null 2>&1 &&
  "$Z" "${ck[@]}" --steps 16 --checkpoint-dir "$d/ck" --resume --metrics "$d/resumed.jsonl" >/dev/null 2>&1 ||
  { echo "FAIL: checkpoint runs"; fail=1; }
python3 -c "
import json,sys
a=[json.loads(l) for l in open('$d/straight.jsonl')]; b=[json.loads(l) for l in open('$d/resumed.jsonl')]
ok = len(a) == len(b) == 16 and [x['loss'] for x in a] == [x['loss'] for x in b] and a[-1]['val_loss'] == b[-1]['val_loss']
sys.exit(0 if ok else 1)" && echo "ok: SGD classifier resumes bitwise" || { echo "FAIL: resumed classifier run differs"; fail=1; }
# zerone convert: a classifier's checkpoint has no Hugging Face or llm.c form.
step_dir=$(ls -d "$d/ck"/step-* | tail -1)
check "which a Hugging Face directory \(GPT-2 or LLaMA\) cannot hold: use --to zerone" "$Z" convert "$step_dir" "$d/hf_out" --to hf
check "which an llm.c checkpoint \(GPT-2 only\) cannot hold" "$Z" convert "$step_dir" "$d/out.bin" --to llmc
exit $fail
