#!/usr/bin/env bash
# Issue 8, "Hide the optimizer behind backward": the offload overhead benchmark (GPT-2 124M shape,
# micro-batch 4 x seq 64, bf16, stage 1, world 1) with the optimizer stepped at the end
# (--early-step false), with the early per-unit step (the default), and with --delayed-update,
# for --offload-optimizer none / cpu / nvme, in interleaved rounds of the same run; each
# setting's best mean s/step (steps 2..N) over the rounds, as a ratio to no offload stepped at
# the end. "exposed swap" is --profile's swap wait per step (swap I/O the pipeline did not hide);
# the share hidden is 1 - exposed / (bytes moved per step at bench_swap's throughput, same run).
# W4_CLIP=X adds --grad-clip X to every run: the early step then speculates and validates (Note
# [Speculative early step]; a clip above every norm validates every step, a small one takes the
# first step back and holds the rest back; mode "always" speculates on every step all the same,
# to measure what a wrong speculation costs). W4_OFFLOADS and W4_MODES pick a subset.
# Usage: [W4_THREADS=1 W4_ROUNDS=3 W4_STEPS=5 W4_CLIP= W4_OFFLOADS="none cpu nvme" W4_MODES="end early delayed"]
#        bash bench/w4_overlap.sh [DIR on the disk to test]   (after make; ~10 minutes)
set -euo pipefail
dir="${1:-/work}"
Z=build/zerone
py=python3
d=$(mktemp -d -p "$dir"); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
# Swap throughput on the same disk, same run: 64 MiB transfers as the optimizer's sub-groups.
build/bench/bench_swap "$d" 1024 64 2 1024 8 | tee "$d/swap_bw"
model=${W4_MODEL:-gpt2:layers=12,dim=768,heads=12,vocab=50257,ctx=64}
steps=${W4_STEPS:-5}
# OpenMP threads of the training thread. On a machine shared with other work, 1 avoids the OpenMP
# barrier stalls of a preempted team (which swamp everything else); --delayed-update's optimizer
# thread then has the second core.
threads=${W4_THREADS:-0}
for round in $(seq 1 ${W4_ROUNDS:-3}); do
  for off in ${W4_OFFLOADS:-none cpu nvme}; do
    for mode in ${W4_MODES:-end early delayed}; do
      [ $off = cpu ] && [ $mode = delayed ] && continue
      extra=(); [ $off = nvme ] && extra=(--nvme-path "$d/swap" --sub-group-size 20000000)
      [ -n "${W4_CLIP:-}" ] && extra+=(--grad-clip "$W4_CLIP")
      case $mode in end) extra+=(--early-step false);; delayed) extra+=(--delayed-update);; esac
      envs=(); [ $mode = always ] && envs=(ZERONE_SPECULATE=always)  # speculate after clipped steps too
      name="$off.$mode.$round"
      env "${envs[@]}" $Z train --model $model --steps $steps --micro-batch 4 --seq 64 --precision bf16 --zero-stage 1 --threads $threads \
        --offload-optimizer $off "${extra[@]}" --profile --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1
      $py - "$d/$name" "$off" "$mode" "$d/swap_bw" >> "$d/results" <<'PY'
import json, re, sys
base, off, mode, bw = sys.argv[1:]
rows = [json.loads(l) for l in open(base + ".jsonl")]
ms = [r["ms"] for r in rows[1:]]
log = open(base + ".log").read()
swap = re.search(r"swap [0-9.]+% \(([0-9.]+) ms/step\)", log)
mem = rows[-1]["mem"]
state = mem.get("nvme.optim", 0) + mem.get("nvme.master", 0)
rates = dict(re.findall(r"(read|write) MB/s ([0-9.]+)", open(bw).read()))
io_ms = 1e3 * state / 1e6 / float(rates["read"]) + 1e3 * state / 1e6 / float(rates["write"]) if state else 0
spec = re.search(r"early step \(.*?\): (\d+) speculative steps validated, (\d+) taken back", log)
mode = mode + (f"(v{spec.group(1)},r{spec.group(2)})" if spec else "")
print(off, mode, sum(ms) / len(ms) / 1000, swap.group(1) if swap else 0, io_ms, rows[-1]["loss"])
PY
      tail -1 "$d/results" | sed "s/^/W4-overlap round $round: /"
    done
  done
done
$py - "$d/results" <<'PY'
import sys
best = {}
for line in open(sys.argv[1]):
    off, mode, s, swap, io, loss = line.split()
    k = (off, mode)
    if k not in best or float(s) < best[k][0]:
        best[k] = (float(s), float(swap), float(io))
ref = best[("none", "end")][0] if ("none", "end") in best else min(v[0] for v in best.values())
print("| offload | optimizer step | s/step | vs none, at the end | exposed swap ms/step | swap I/O ms/step | hidden |")
print("|---|---|---|---|---|---|---|")
for (off, mode), (s, swap, io) in best.items():
    hidden = f"{100 * (1 - swap / io):.0f}%" if io > 0 and mode != "delayed" else "-"
    print(f"| {off} | {mode} | {s:.3f} | {s / ref:.2f}x | {swap:.0f} | {io:.0f} | {hidden} |")
PY
