#!/usr/bin/env bash
# --save consolidates the weights streaming (issue 17 §3, Note [Streaming save] in
# zerone/train/save_weights.h; DeepSpeed's stage3_gather_16bit_weights_on_model_save):
#   - at ZeRO stage 3, world 2 the saved Hugging Face tensors are byte for byte those of the same
#     run at stage 0 (world 2: each reduction is one addition, so the stages agree exactly), and
#     those of stage 0 at world 1 on data where both ranks' samples are world 1's;
#   - no rank holds the whole model while saving: rank 0's parameter memory at its largest during
#     the save (the memory ledger) is below the model's size at stage 3, and is the whole model at
#     stage 0 (the measurement sees what is held);
#   - a Hugging Face --init's tokenizer files are copied, bos/eos kept in config.json, and a
#     generation_config.json written; the directory loads back with --init and `zerone sample`
#     (which decodes with the copied tokenizer), and `convert` carries them too;
#   - stage3_gather_16bit_weights_on_model_save false with --save at stage 3 is an error at start-up.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
data="$here/../data"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
tensors() { python3 "$here/tensor_digest.py" "$1"; }  # tensors DIR: "name dtype shape sha256" lines, sorted

# A Hugging Face source with its tokenizer: the GPT-2 of tests/data/hf_gpt2 (vocabulary 257), a
# byte-level BPE tokenizer.json of 256 byte tokens and <|endoftext|> 256, and special token ids.
mkdir "$d/src"
cp "$data/hf_gpt2/model.safetensors" "$d/src/"
python3 - "$data/hf_gpt2/config.json" "$d/src" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["bos_token_id"] = 256; c["eos_token_id"] = 256
out = sys.argv[2]
json.dump(c, open(out + "/config.json", "w"), indent=2)
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]; n = 0
for b in range(256):
    if b not in bs: bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
vocab["<|endoftext|>"] = 256
tok = {"version": "1.0", "added_tokens": [{"id": 256, "content": "<|endoftext|>", "special": True}],
       "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
       "decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "vocab": vocab, "merges": []}}
json.dump(tok, open(out + "/tokenizer.json", "w"))
json.dump({"model_max_length": 16, "tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"},
          open(out + "/tokenizer_config.json", "w"))
json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|endoftext|>"}, open(out + "/special_tokens_map.json", "w"))
PY

run=(train --init "$d/src" --seq 16 --steps 3 --no-shuffle --grad-clip 0
     --precision fp32 --threads 1 --stage3-param-persistence-threshold 0)
"${MPI[@]}" -n 2 "$Z" "${run[@]}" --data "$data/hf_gpt2/tokens.bin" --micro-batch 1 --lr 1e-2 --zero-stage 3 --save "$d/s3/" > "$d/s3.log" 2>&1 \
  || { cat "$d/s3.log"; exit 1; }
"${MPI[@]}" -n 2 "$Z" "${run[@]}" --data "$data/hf_gpt2/tokens.bin" --micro-batch 1 --lr 1e-2 --zero-stage 0 --save "$d/s0/" > "$d/s0.log" 2>&1 \
  || { cat "$d/s0.log"; exit 1; }
tensors "$d/s3" > "$d/s3.tensors"
if diff "$d/s3.tensors" <(tensors "$d/s0") > /dev/null && ! diff -q "$d/s3.tensors" <(tensors "$d/src") > /dev/null; then
  ok "stage 3 (world 2) saves the trained tensors of stage 0, byte for byte"
else
  bad "stage 3 and stage 0 saves differ (or nothing was trained)"; diff "$d/s3.tensors" <(tensors "$d/s0") | head
fi

# World 2 against world 1: on a token stream of period 4 every 16-token window is the same
# sequence, so both ranks' gradients are world 1's g, their sum 2g halves to g exactly, and the
# runs are one run in exact arithmetic: the saves must agree to the byte.
python3 - "$d/periodic.bin" <<'PY'
import struct, sys
tokens = [5, 77, 200, 31] * 64 + [5]
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, len(tokens), *([0] * 253)) + struct.pack(f"<{len(tokens)}H", *tokens))
PY
periodic=("${run[@]}" --data "$d/periodic.bin" --micro-batch 1 --lr 1e-2)
"${MPI[@]}" -n 2 "$Z" "${periodic[@]}" --zero-stage 3 --save "$d/p3/" > "$d/l.log" 2>&1 || { cat "$d/l.log"; exit 1; }
"$Z" "${periodic[@]}" --zero-stage 0 --save "$d/p1/" > "$d/l.log" 2>&1 || { cat "$d/l.log"; exit 1; }
if diff <(tensors "$d/p3") <(tensors "$d/p1") > /dev/null && ! diff -q <(tensors "$d/p1") <(tensors "$d/src") > /dev/null; then
  ok "the stage-3 world-2 save is the stage-0 world-1 save of the same run, byte for byte"
else
  bad "stage 3 world 2 and stage 0 world 1 saves differ"; diff <(tensors "$d/p3") <(tensors "$d/p1") | head -5
fi

# What the export carries.
for f in tokenizer.json tokenizer_config.json special_tokens_map.json; do
  cmp -s "$d/src/$f" "$d/s3/$f" || bad "$f was not carried into the save"
done
python3 - "$d/s3" <<'PY' && ok "tokenizer files copied; bos/eos 256 in config.json and generation_config.json" || bad "generation_config / config"
import json, os, sys
g = json.load(open(sys.argv[1] + "/generation_config.json"))
c = json.load(open(sys.argv[1] + "/config.json"))
assert g == {"_from_model_config": True, "bos_token_id": 256, "eos_token_id": 256}, g
assert c["bos_token_id"] == 256 and c["eos_token_id"] == 256, c
assert not os.path.exists(sys.argv[1] + "/tokenizer.model")
PY

# Loads back: --init trains from it, and sample decodes with its tokenizer, greedily the same text
# as from the stage-0 save (the same weights).
"$Z" train --init "$d/s3" --data "$data/hf_gpt2/tokens.bin" --micro-batch 2 --seq 16 --steps 1 --threads 1 \
  --precision fp32 > "$d/back.log" 2>&1 && ok "--init of the stage-3 save trains" || { bad "--init of the save"; cat "$d/back.log"; }
"$Z" sample --init "$d/s3" --prompt "ab" --tokens 8 --temperature 0 > "$d/a.txt" 2> "$d/a.err" || { bad "sample"; cat "$d/a.err"; }
"$Z" sample --init "$d/s0" --prompt "ab" --tokens 8 --temperature 0 > "$d/b.txt" 2>&1 || bad "sample s0"
if [ -s "$d/a.txt" ] && cmp -s "$d/a.txt" "$d/b.txt"; then ok "sample from the save (its own tokenizer encodes the prompt)"; else bad "sample outputs differ"; fi
# The one weight source (io/weight_source.h): sample also reads a zerone checkpoint.
"$Z" convert "$d/s3" "$d/zck" --to zerone > /dev/null
"$Z" sample --init "$d/zck" --tokenizer "$d/s3" --prompt "ab" --tokens 8 --temperature 0 > "$d/c.txt" 2> "$d/c.err" \
  && cmp -s "$d/a.txt" "$d/c.txt" && ok "sample from a zerone checkpoint of the save: the same text" || { bad "sample --init zerone"; cat "$d/c.err"; }
"$Z" convert "$d/s3" "$d/conv" > /dev/null && cmp -s "$d/src/tokenizer.json" "$d/conv/tokenizer.json" \
  && cmp -s "$d/s3/generation_config.json" "$d/conv/generation_config.json" \
  && ok "convert carries the tokenizer and generation_config.json" || bad "convert lost the tokenizer"

# Memory: an 8-layer model, units gathered one at a time. Rank 0's parameter memory during the save
# (the shards plus one unit) is under the model at stage 3, the whole model at stage 0.
big=(train --model gpt2:layers=8,dim=64,heads=4,vocab=257,ctx=16 --data "$data/hf_gpt2/tokens.bin" --micro-batch 1
     --seq 16 --steps 1 --threads 1 --precision fp32 --stage3-param-persistence-threshold 0)
held() {  # held LOG: "HELD MODEL" bytes from the saved line
  sed -n 's/.*rank 0 held at most \([0-9]*\) bytes of parameters; the whole model is \([0-9]*\) bytes.*/\1 \2/p' "$1"
}
"${MPI[@]}" -n 2 "$Z" "${big[@]}" --zero-stage 3 --save "$d/big3/" > "$d/big3.log" 2>&1 || { cat "$d/big3.log"; exit 1; }
"${MPI[@]}" -n 2 "$Z" "${big[@]}" --zero-stage 0 --save "$d/big0/" > "$d/big0.log" 2>&1 || { cat "$d/big0.log"; exit 1; }
read -r h3 m3 <<< "$(held "$d/big3.log")"; read -r h0 m0 <<< "$(held "$d/big0.log")"
if [ -n "$h3" ] && [ -n "$h0" ] && [ $((4 * h3)) -lt $((3 * m3)) ] && [ "$h0" -ge "$m0" ]; then
  ok "stage 3 held at most $h3 of the model's $m3 parameter bytes while saving (stage 0: $h0)"
else
  bad "parameter memory while saving: stage 3 $h3 of $m3, stage 0 $h0 of $m0"; grep saved "$d/big3.log" "$d/big0.log"
fi
cmp -s <(tensors "$d/big3") <(tensors "$d/big0") && ok "the 8-layer saves agree across stages" || bad "8-layer saves differ"

# DeepSpeed's key: true is what --save does; false at stage 3 with --save is refused at start-up.
echo '{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": true}}' > "$d/on.json"
echo '{"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": false}}' > "$d/off.json"
"$Z" "${big[@]}" --config "$d/on.json" --save "$d/on/" > "$d/on.log" 2>&1 && [ -f "$d/on/model.safetensors" ] \
  && ! grep -q "gather_16bit.*no effect\|no effect.*gather_16bit" "$d/on.log" \
  && ok "stage3_gather_16bit_weights_on_model_save true: honoured, the save written" || { bad "key true"; cat "$d/on.log"; }
check "'zero_optimization.stage3_gather_16bit_weights_on_model_save' is false" "$Z" "${big[@]}" --config "$d/off.json" --save "$d/off/"
[ ! -e "$d/off" ] || bad "the refused run wrote '$d/off'"
"$Z" "${big[@]}" --config "$d/off.json" > /dev/null 2>&1 || bad "the key false without --save was refused"
exit $fail
