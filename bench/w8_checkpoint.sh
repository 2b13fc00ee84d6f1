#!/usr/bin/env bash
# W8 (issue 9): checkpoint save and load throughput of a GPT-2 350M run beside fio sequential
# O_DIRECT on the same disk, the async-save stall as a share of a training step, and the peak RSS
# of converting a GPT-2 1.5B checkpoint (llm.c -> zerone -> Hugging Face), all in one run.
#   bash bench/w8_checkpoint.sh [DIR]     (DIR: a directory on the disk to measure; default build/)
# Loads are measured with a cold page cache (drop_caches, root), as after a restart.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(readlink -f "${1:-build}")
Z=$(readlink -f "${ZERONE:-build/zerone}")
py=/usr/bin/python3
command -v fio >/dev/null || { echo "fio missing (apt-get install fio)"; exit 1; }
d=$(mktemp -d -p "$dir"); trap 'rm -rf "$d"' EXIT
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || echo "W8 (cannot drop the page cache: loads may be warm)"; }
size_mib=${W8_MIB:-4096}
for rw in write read; do
  bw=$(fio --name=w8 --directory="$d" --rw=$rw --bs=1M --direct=1 --ioengine=io_uring --iodepth=16 \
    --size=${size_mib}M --unlink=1 --output-format=json | $py -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$rw']; print(f\"{j['bw_bytes']/1e6:.0f}\")")
  echo "W8 fio $rw MB/s $bw"
  echo "fio_$rw $bw" >> "$d/results"
done

model=${W8_MODEL:-gpt2-350m}
printf 'The quick brown fox jumps over the lazy dog. %.0s' $(seq 1 2000) > "$d/t.txt"
$Z prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
base=(train --model "$model" --data "$d/c_train.bin" --precision bf16 --no-shuffle)
train=("${base[@]}" --micro-batch 1 --seq 64)
mb_per_s() {  # mb_per_s LOG PATTERN: "bytes seconds" of the first matching line -> MB/s
  $py - "$1" "$2" <<'EOF'
import re, sys
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
for line in open(sys.argv[1]):
    if sys.argv[2] not in line: continue
    m = re.search(r"\(([\d.]+) (\w+) from .* wrote its file in ([\d.]+) s", line) or \
        re.search(r"read ([\d.]+) (\w+) in ([\d.]+) s", line)
    if m:
        print(f"{float(m.group(1)) * units[m.group(2)] / float(m.group(3)) / 1e6:.0f}")
        break
EOF
}
for round in 1 2; do
  rm -rf "$d/ck"
  $Z "${train[@]}" --steps 2 --checkpoint-dir "$d/ck" --checkpoint-every 1 --metrics "$d/sync.jsonl" > "$d/sync.log" 2>&1
  save=$(mb_per_s "$d/sync.log" "step-00000002")
  step_s=$($py -c "import json; print(json.loads(open('$d/sync.jsonl').readlines()[-1])['ms'] / 1000)")
  echo "$(grep 'saved checkpoint' "$d/sync.log" | tail -1)"
  echo "W8 round $round save MB/s $save (step ${step_s} s)"
  echo "save $save" >> "$d/results"
  echo "step-00000001" > "$d/ck/latest"
  drop_caches
  $Z "${train[@]}" --steps 2 --checkpoint-dir "$d/ck" --resume > "$d/load.log" 2>&1
  load=$(mb_per_s "$d/load.log" "resumed from")
  echo "$(grep 'resumed from' "$d/load.log")"
  echo "W8 round $round load MB/s $load (cold cache; reading and verifying, without allocating the model and optimizer)"
  echo "load $load" >> "$d/results"
  rm -rf "$d/ck"
  # Async: the stall against a step of a realistic batch (4 x 256 tokens); the first save allocates
  # the staging, the second (step 4) reuses it.
  $Z "${base[@]}" --micro-batch 4 --seq 256 --steps 4 --checkpoint-dir "$d/ck" --checkpoint-every 2 --checkpoint-async \
    --metrics "$d/async.jsonl" > "$d/async.log" 2>&1
  stall=$(grep -o 'staged checkpoint of step 4 (stall [0-9.]*' "$d/async.log" | grep -o '[0-9.]*$')
  step_s=$($py -c "import json; v=[json.loads(l)['ms'] for l in open('$d/async.jsonl')][1:]; print(min(v) / 1000)")
  echo "W8 round $round async stall ${stall} s = $($py -c "print(f'{$stall / $step_s:.1%}')") of a ${step_s} s step"
done
$py - "$d/results" <<'EOF'
import sys
best = {}
for line in open(sys.argv[1]):
    k, v = line.split(); best[k] = max(best.get(k, 0.0), float(v))
print(f"W8 best: save {best['save']:.0f} MB/s = {best['save'] / best['fio_write']:.0%} of fio write {best['fio_write']:.0f}; "
      f"load {best['load']:.0f} MB/s = {best['load'] / best['fio_read']:.0%} of fio read {best['fio_read']:.0f}")
EOF

# Streaming conversion of GPT-2 1.5B: peak RSS of each conversion (/usr/bin/time's maximum resident set).
big=gpt2:layers=48,dim=1600,heads=25,vocab=50257,ctx=1024
$py - "$d/big.bin" <<'EOF'
import struct, sys
L, C, V, Vp, T = 48, 1600, 50257, 50304, 1024
n = Vp * C + T * C + L * (2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C) + 2 * C
with open(sys.argv[1], "wb") as f:
    f.write(struct.pack("<256i", 20240326, 3, T, V, L, 25, C, Vp, *([0] * 248)))
    f.truncate(1024 + 4 * n)  # zeros: a valid (sparse) f32 checkpoint of the right size
EOF
for step in "big.bin big_zerone --to zerone" "big_zerone big_hf --to hf --dtype bf16" "big_hf big_back.bin --dtype f32"; do
  set -- $step
  /usr/bin/time -f "%M" -o "$d/rss" $Z convert "$d/$1" "$d/$2" "${@:3}" > /dev/null
  echo "W8 convert $1 -> $2 ($big) peak RSS $(( $(cat "$d/rss") / 1024 )) MiB"
  if [ "$1" = big_zerone ]; then rm -f "$d/big.bin"; fi
done
