#!/usr/bin/env bash
# README's tour: prepare a real text file, train on it with validation and metrics, save an llm.c
# checkpoint, sample from it.
set -euo pipefail
Z="$1"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
text=/usr/share/common-licenses/GPL-3
[ -f "$text" ] || { printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 2000) > "$d/t.txt"; text="$d/t.txt"; }
"$Z" prepare --text "$text" --out "$d/lic" | tee "$d/prepare.log"
grep -q "lic_train.bin" "$d/prepare.log"
"$Z" train --data "$d/lic_train.bin" --val-data "$d/lic_val.bin" --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=64 \
  --seq 64 --micro-batch 8 --steps 40 --lr 3e-3 --val-every 20 --metrics "$d/m.jsonl" --save "$d/model.bin" | tee "$d/train.log"
[ "$(wc -l < "$d/m.jsonl")" -eq 40 ]
grep -q '"val_loss"' "$d/m.jsonl"
last=$(tail -n 1 "$d/train.log")
echo "$last" | grep -Eq '^final loss [0-9.]+ nats/token \(validation\)$'
loss=$(echo "$last" | awk '{print $3}')
python3 -c "import sys; l=float('$loss'); sys.exit(0 if l < 3.5 else 1)" || { echo "validation loss $loss did not fall below 3.5 (ln 257 = 5.55)"; exit 1; }
"$Z" sample --init "$d/model.bin" --prompt "The " --tokens 40 --seed 3 > "$d/sample.txt"
[ "$(wc -c < "$d/sample.txt")" -ge 40 ]
echo "sample: $(cat "$d/sample.txt")"
# sample --init DIR: the same training written as a Hugging Face directory samples the same text
# (same weights, same seed), and a LLaMA directory samples too.
"$Z" train --data "$d/lic_train.bin" --val-data "$d/lic_val.bin" --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=64 \
  --seq 64 --micro-batch 8 --steps 40 --lr 3e-3 --val-every 20 --save "$d/hf/" > /dev/null
"$Z" sample --init "$d/hf" --prompt "The " --tokens 40 --seed 3 > "$d/sample_hf.txt"
cmp "$d/sample.txt" "$d/sample_hf.txt" || { echo "sample from the HF directory differs from the llm.c file"; exit 1; }
"$Z" train --data "$d/lic_train.bin" --model llama:layers=1,dim=32,heads=4,kv_heads=2,ffn=64,vocab=257,ctx=64 \
  --seq 64 --micro-batch 4 --steps 5 --save "$d/llama/" > /dev/null
"$Z" sample --init "$d/llama" --prompt "The " --tokens 20 --temperature 0 > "$d/sample_llama.txt"
[ "$(wc -c < "$d/sample_llama.txt")" -ge 20 ]
echo "sample (HF directory): same as the llm.c file; LLaMA: $(wc -c < "$d/sample_llama.txt") bytes"
