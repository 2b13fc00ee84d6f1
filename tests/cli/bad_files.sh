#!/usr/bin/env bash
# Corrupted and mismatched files through the real program: each is one clear error, exit 1.
set -u
Z="$1"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
model="gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=32"

printf 'hello world, this is a small corpus for zerone tests. ' > "$d/a.txt"
for i in $(seq 1 40); do cat "$d/a.txt"; done > "$d/b.txt"
"$Z" prepare --text "$d/b.txt" --out "$d/c" >/dev/null || { echo "prepare failed"; exit 1; }

head -c 2000 "$d/c_train.bin" > "$d/trunc_train.bin"
check "trunc_train.bin' is truncated" "$Z" train --model "$model" --data "$d/trunc_train.bin" --seq 16 --steps 1
printf 'garbage garbage garbage' > "$d/garbage.bin"
check "truncated" "$Z" train --model "$model" --data "$d/garbage.bin" --seq 16 --steps 1
python3 - "$d/magic.bin" <<'PY' || exit 1
import struct, sys
open(sys.argv[1], "wb").write(struct.pack("<256i", 777, 1, 0, *([0] * 253)))
PY
check "magic 777, expected 20240520" "$Z" train --model "$model" --data "$d/magic.bin" --seq 16 --steps 1
check "out of range for the model's vocabulary of 100" "$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=100,ctx=32 --data "$d/c_train.bin" --seq 16 --steps 1

"$Z" train --model "$model" --data "$d/c_train.bin" --seq 16 --steps 2 --save "$d/m.bin" >/dev/null || { echo "train failed"; exit 1; }
head -c 5000 "$d/m.bin" > "$d/m_trunc.bin"
check "m_trunc.bin' is truncated" "$Z" train --init "$d/m_trunc.bin" --data "$d/c_train.bin" --steps 1
check "disagrees with --init" "$Z" train --init "$d/m.bin" --model gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=32 --data "$d/c_train.bin" --steps 1
check "m_trunc.bin' is truncated" "$Z" sample --init "$d/m_trunc.bin"
# Saving into a missing directory fails cleanly and leaves no partial file.
check "does not exist: create it first" "$Z" train --model "$model" --data "$d/c_train.bin" --seq 16 --steps 1 --save "$d/missing/m.bin"
if ls "$d"/missing* >/dev/null 2>&1; then echo "FAIL: partial output left"; fail=1; fi
printf '{"train_micro_batch_size_per_gpu": 4,' > "$d/broken.json"
check "broken.json' is not valid JSON" "$Z" train --config "$d/broken.json"
printf '{"zero_optimization": {"stage": 5}}' > "$d/stage.json"
check "key 'zero_optimization.stage' is 5, expected an integer in 0..3" "$Z" train --config "$d/stage.json"
exit $fail
