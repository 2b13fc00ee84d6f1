#!/usr/bin/env bash
# ZeRO invariance (issue 3): stages 0-3 at world 1, 2, 3 and 4 reproduce the single-rank trajectory.
# The global batch is 12 micro-batches per step: world w runs grad-accum 12/w, and with --no-shuffle
# micro-step k of step s on rank r reads the 2 samples from (s*12 + k*world + r)*2 (Note [Samples] in
# train/batch_source.h), so every run sees the same data. Unit sizes do not divide evenly by
# world*64 (padding is exercised); buckets are smaller than units (sliced all-gathers, reductions
# waited for beyond the bucket).
#   f32: losses within 1e-5 relative over 20 steps, final parameters within 1e-5.
#   bf16: over 10 steps (bf16 trajectories drift apart chaotically, see compare_runs.py), losses
#   within 2e-3 and parameters within one bf16 ulp in relative L2.
set -euo pipefail
Z="$(readlink -f "$1")"; PRECISION="${2:-fp32}"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'In the beginning the Universe was created. This has made a lot of people very angry. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
steps=20; [ "$PRECISION" = fp32 ] || steps=10
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
        --steps $steps --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0 --no-shuffle --precision "$PRECISION" --threads 1
        --reduce-bucket-size 5000 --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000
        --stage3-param-persistence-threshold 1000)
runs=()
for world in 1 2 3 4; do
  for stage in 0 1 2 3; do
    name="w${world}_s${stage}"
    accum=$((12 / world))
    "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --grad-accum "$accum" --zero-stage "$stage" \
      --metrics "$d/$name.jsonl" --save "$d/$name.bin" > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
    runs+=("$name")
  done
done
python3 "$here/compare_runs.py" "$PRECISION" "$d" "${runs[@]}"
