#!/usr/bin/env bash
# `zerone prepare --tokenizer` through the real program:
#  - SentencePiece: a model trained here with spm_train (Debian's sentencepiece) encodes a document
#    exactly as spm_encode does, BOS before each document;
#  - GPT-2 BPE (tests/data/gpt2_bpe): <|endoftext|> before each document, the same ids as the
#    reference encodings of tests/data/gpt2_bpe/golden.json, and a model trains on the shards.
set -u
Z="$(readlink -f "$1")"
data="$(cd "$(dirname "$0")/../data" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
# One-line documents (spm_encode encodes line by line).
tr '\n' ' ' < /usr/share/common-licenses/GPL-3 | tr -s ' ' > "$d/gpl.txt"
tr '\n' ' ' < /usr/share/common-licenses/Apache-2.0 | tr -s ' ' > "$d/apache.txt"
tokens() {  # tokens SHARD: the ids of an llm.c shard, one per line
  python3 - "$1" <<'PY'
import struct, sys
b = open(sys.argv[1], "rb").read()
magic, version, n = struct.unpack("<3i", b[:12])
fmt = "H" if version == 1 else "I"
print("\n".join(map(str, struct.unpack(f"<{n}{fmt}", b[1024:1024 + n * (2 if version == 1 else 4)]))))
PY
}

for type in unigram bpe; do
  spm_train --input=/usr/share/common-licenses/GPL-3 --model_prefix="$d/spm_$type" --vocab_size=400 --model_type=$type \
    --character_coverage=1.0 --minloglevel=2 > /dev/null 2>&1 || { echo "FAIL: spm_train $type"; fail=1; continue; }
  "$Z" prepare --text "$d/apache.txt" --tokenizer "$d/spm_$type.model" --out "$d/s_$type" --val-fraction 0 > "$d/p.out" \
    || { echo "FAIL spm_$type: prepare failed"; cat "$d/p.out"; fail=1; continue; }
  spm_encode --model="$d/spm_$type.model" --output_format=id < "$d/apache.txt" | tr ' ' '\n' > "$d/want"
  tokens "$d/s_${type}_train.bin" > "$d/got"
  if [ "$(head -n 1 "$d/got")" = 1 ] && diff <(tail -n +2 "$d/got") "$d/want" > /dev/null; then
    echo "ok   sentencepiece_$type: $(wc -l < "$d/want") ids equal spm_encode's, BOS first"
  else
    echo "FAIL sentencepiece_$type: ids differ from spm_encode"; diff <(tail -n +2 "$d/got") "$d/want" | head -5; fail=1
  fi
done

# GPT-2 BPE: two documents, each starting with <|endoftext|> (50256).
python3 - "$data/gpt2_bpe/golden.json" "$d" <<'PY'
import json, sys
g = json.load(open(sys.argv[1]))
open(f"{sys.argv[2]}/doc1.txt", "w").write(g[1]["text"])
open(f"{sys.argv[2]}/doc2.txt", "w").write(g[6]["text"])
open(f"{sys.argv[2]}/want", "w").write("\n".join(map(str, [50256] + g[1]["ids"] + [50256] + g[6]["ids"])) + "\n")
PY
"$Z" prepare --text "$d/doc1.txt" "$d/doc2.txt" --tokenizer "$data/gpt2_bpe/encoder.json" --out "$d/g" --val-fraction 0 \
  > "$d/g.out" || { echo "FAIL gpt2: prepare failed"; cat "$d/g.out"; fail=1; }
if diff <(tokens "$d/g_train.bin") "$d/want" > /dev/null && grep -q "vocabulary 50257" "$d/g.out"; then
  echo "ok   gpt2_bpe: documents start with <|endoftext|>, ids equal the reference encoder's"
else
  echo "FAIL gpt2_bpe"; diff <(tokens "$d/g_train.bin") "$d/want" | head -5; cat "$d/g.out"; fail=1
fi
for i in $(seq 1 30); do cat "$d/doc1.txt" "$d/doc2.txt"; done > "$d/big.txt"
"$Z" prepare --text "$d/big.txt" --tokenizer "$data/gpt2_bpe" --out "$d/gb" > /dev/null \
  && "$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=50257,ctx=32 --data "$d/gb_train.bin" --val-data "$d/gb_val.bin" \
       --seq 16 --micro-batch 2 --steps 3 --threads 1 > "$d/t.out" 2>&1 \
  && echo "ok   gpt2_bpe_trains: $(tail -n 1 "$d/t.out")" || { echo "FAIL gpt2_bpe_trains"; tail -n 3 "$d/t.out"; fail=1; }

# Errors name the tokenizer file.
printf 'not a tokenizer' > "$d/junk.model"
"$Z" prepare --text "$d/doc1.txt" --tokenizer "$d/junk.model" --out "$d/x" 2> "$d/err"; rc=$?
if [ $rc -eq 1 ] && grep -q "^zerone: error: --tokenizer: '.*junk.model' is neither" "$d/err"; then echo "ok   bad_tokenizer"; else
  echo "FAIL bad_tokenizer: exit $rc"; cat "$d/err"; fail=1; fi
exit $fail
