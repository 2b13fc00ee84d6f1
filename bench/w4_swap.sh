#!/usr/bin/env bash
# W4 (issue 8): zerone's NVMe swap throughput beside fio sequential O_DIRECT on the same disk, and
# the offload overhead on a model that fits without offload (step time with cpu / nvme offload as
# a ratio to none, and the swap wait the pipeline did not hide), all in one run.
#   bash bench/w4_swap.sh [DIR]     (DIR: a directory on the disk to measure; default build/)
set -euo pipefail
cd "$(dirname "$0")/.."
dir=$(readlink -f "${1:-build}")
Z=build/zerone
py=/usr/bin/python3
command -v fio >/dev/null || { echo "fio missing (apt-get install fio)"; exit 1; }
size_mib=${W4_MIB:-2048}
for rep in 1 2 3; do
  for rw in write read; do
    # fio: 1 MiB requests, 16 in flight (io_uring), O_DIRECT, one file of size_mib, sequential.
    bw=$(fio --name=w4 --directory="$dir" --rw=$rw --bs=1M --direct=1 --ioengine=io_uring --iodepth=16 \
      --size=${size_mib}M --unlink=1 --output-format=json | $py -c "import json,sys; j=json.load(sys.stdin)['jobs'][0]['$rw']; print(f\"{j['bw_bytes']/1e6:.0f}\")")
    echo "W4 rep $rep fio $rw MB/s $bw"
  done
  # zerone: 64 MiB transfers (a sub-group), 2 in flight, 1 MiB io_uring requests, queue depth 8.
  build/bench/bench_swap "$dir" $size_mib 64 2 1024 8 | sed "s/^/W4 rep $rep zerone /"
done
d=$(mktemp -d -p "$dir"); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
model=${W4_MODEL:-gpt2:layers=12,dim=768,heads=12,vocab=50257,ctx=64}
# Interleaved rounds (the machine may be shared): each setting's best mean s/step over the rounds.
for round in 1 2; do
  for off in none cpu nvme; do
    extra=(); [ $off = nvme ] && extra=(--nvme-path "$d/swap" --sub-group-size 20000000)
    $Z train --model $model --steps ${W4_STEPS:-6} --micro-batch 4 --seq 64 --precision bf16 --zero-stage 1 \
      --offload-optimizer $off "${extra[@]}" --profile --metrics "$d/$off.$round.jsonl" > "$d/$off.$round.log" 2>&1
    s=$($py -c "import json; v=[json.loads(l)['ms'] for l in open('$d/$off.$round.jsonl')][1:]; print(f'{sum(v)/len(v)/1000:.3f}')")
    rss=$($py -c "import json; print(json.loads(open('$d/$off.$round.jsonl').readlines()[-1])['mem']['peak_rss'])")
    echo "W4 round $round offload $off s/step $s peak_rss $rss; $(grep '^time per step' "$d/$off.$round.log")"
    echo "$off $s" >> "$d/times"
  done
done
$py - "$d/times" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    k, v = line.split(); best[k] = min(best.get(k, 1e9), float(v))
print("W4 offload best s/step: " + ", ".join(f"{k} {v:.3f}" for k, v in best.items()) +
      f"; ratio cpu/none {best['cpu']/best['none']:.2f}, nvme/none {best['nvme']/best['none']:.2f}")
PY
