#!/usr/bin/env bash
# Note [Early optimizer step] and Note [Delayed parameter update] (issue 8) across ranks and places.
#  1. The early per-unit step (the default) gives the trajectory of the step at the end
#     (--early-step false) bit for bit: same losses in the metrics, byte-identical final
#     checkpoints, at stages 0-3, world 1, 2 and 3 (uneven shards), with gradient accumulation and
#     weight decay, with the optimizer in memory, on the host (cpu) or on NVMe, and at stage 3 with
#     the parameters on the host or NVMe too. NVMe runs use small sub-groups and 2 staging buffers,
#     so the read-ahead crosses from one unit to the next many times per step.
#  2. Note [Speculative early step]: with --grad-clip and with fp16 loss scaling the early updates
#     are speculative and validated or taken back; the trajectory is still bit for bit that of
#     --early-step false at stages 1-3, world 1-3, optimizer in memory / on the host / on NVMe
#     (stage 3: parameters on the host / on NVMe too), with gradient accumulation, in three
#     regimes: a clip that never triggers (every speculation validated), a clip that triggers on
#     some steps (taken back and redone, the next step held back), and fp16 with a loss scale
#     that overflows (taken back and skipped). The counts the runs print prove that each regime
#     took the path it is there for. With the state in memory the engine speculates only when
#     told to (ZERONE_SPECULATE=memory; by default it steps at the end there, checked too).
#  3. --delayed-update: every stage at world 1-3 reproduces the world-1 stage-0 delayed trajectory
#     (compare_runs.py's f32 tolerance, as tests/zero/invariance.sh), and cpu / nvme optimizer
#     offload reproduce the in-memory delayed run bit for bit.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'So long, and thanks for all the fish. The dolphins had always known. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
        --steps 5 --lr 1e-3 --weight-decay 0.1 --no-shuffle --threads 1
        --reduce-bucket-size 5000 --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000
        --stage3-param-persistence-threshold 1000)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 2)
fail=0
run() {  # run NAME WORLD ARGS...
  local name="$1" world="$2"; shift 2
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --precision "${PREC:-fp32}" --grad-accum $((6 / world)) "$@" \
    --metrics "$d/$name.jsonl" --save "$d/$name.bin" > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
}
same() {  # same REF NAME: identical losses and checkpoint bytes
  local ref="$1" name="$2"
  if cmp -s "$d/$ref.bin" "$d/$name.bin" && \
     diff <(python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$d/$ref.jsonl") \
          <(python3 -c 'import json,sys; [print(json.loads(l)["loss"]) for l in open(sys.argv[1])]' "$d/$name.jsonl") >/dev/null; then
    echo "ok   $name: bitwise equal to $ref"
  else
    echo "FAIL $name: differs from $ref"; fail=1
  fi
}
for world in 1 2 3; do
  for stage in 0 1 2 3; do
    base="w${world}_s${stage}"
    run "${base}_end" $world --zero-stage $stage --early-step false
    run "${base}_early" $world --zero-stage $stage
    same "${base}_end" "${base}_early"
    [ $stage = 0 ] && continue
    param=(); [ $stage = 3 ] && param=(--offload-param cpu)
    run "${base}_early_cpu" $world --zero-stage $stage --offload-optimizer cpu "${param[@]}"
    same "${base}_end" "${base}_early_cpu"
    run "${base}_early_nvme" $world --zero-stage $stage "${nvme[@]}"
    same "${base}_end" "${base}_early_nvme"
    if [ $stage = 3 ]; then
      run "${base}_early_nvme_params" $world --zero-stage 3 "${nvme[@]}" --offload-param nvme
      same "${base}_end" "${base}_early_nvme_params"
    fi
  done
done
# Speculation: clip never triggers / clip triggers on some steps / fp16 overflows.
regimes=("never --grad-clip 1000" "some --grad-clip ${SOME_CLIP:-2.2}"
         "fp16 --initial-scale-power 24 --loss-scale-window 2 --hysteresis 1")
for regime in "${regimes[@]}"; do
  read -r rname rargs <<< "$regime"
  prec=fp32; [ $rname = fp16 ] && prec=fp16
  for world in 1 2 3; do
    for stage in 1 2 3; do
      base="spec_${rname}_w${world}_s${stage}"
      PREC=$prec run "${base}_end" $world --zero-stage $stage $rargs --early-step false
      if grep -q "^early step" "$d/${base}_end.log"; then echo "FAIL ${base}_end: speculated with --early-step false"; fail=1; fi
      # In memory the engine steps at the end unless told to speculate (ZERONE_SPECULATE=memory).
      param=(); [ $stage = 3 ] && param=(--offload-param cpu)
      ZERONE_SPECULATE=memory PREC=$prec run "${base}_early" $world --zero-stage $stage $rargs
      same "${base}_end" "${base}_early"
      ZERONE_SPECULATE=memory PREC=$prec run "${base}_early_cpu" $world --zero-stage $stage $rargs \
        --offload-optimizer cpu "${param[@]}"
      same "${base}_end" "${base}_early_cpu"
      param=(); [ $stage = 3 ] && param=(--offload-param nvme)
      PREC=$prec run "${base}_early_nvme" $world --zero-stage $stage $rargs "${nvme[@]}" "${param[@]}"
      same "${base}_end" "${base}_early_nvme"
    done
  done
  # Without ZERONE_SPECULATE and without NVMe offload: no speculation, the step at the end.
  PREC=$prec run "spec_${rname}_default_memory" 2 --zero-stage 2 $rargs
  same "spec_${rname}_w2_s2_end" "spec_${rname}_default_memory"
  if grep -q "^early step" "$d/spec_${rname}_default_memory.log"; then
    echo "FAIL spec_${rname}_default_memory: speculated with the state in memory"; fail=1
  else
    echo "ok   spec_${rname}_default_memory: no speculation with the state in memory"
  fi
  # "early step (...): V speculative steps validated, R taken back and redone (clipped), S taken
  # back and skipped (fp16 overflow), H stepped at the end after a clipped step", summed.
  read -r v r sk h < <(cat "$d"/spec_${rname}_*_early*.log | python3 -c '
import re, sys
t = [0, 0, 0, 0]
for m in re.finditer(r"early step \(.*?\): (\d+) speculative steps validated, (\d+) taken back and redone.*?, (\d+) taken back and skipped.*?, (\d+) stepped at the end", sys.stdin.read()):
    t = [a + int(b) for a, b in zip(t, m.groups())]
print(*t)')
  echo "     $rname: $v validated, $r redone, $sk skipped, $h held back"
  case $rname in
    never) ok=$(( v > 0 && r == 0 && sk == 0 && h == 0 ));;
    some) ok=$(( v > 0 && r > 0 && h > 0 && sk == 0 ));;
    fp16) ok=$(( v > 0 && sk > 0 && r == 0 ));;
  esac
  if [ $ok = 1 ]; then echo "ok   $rname: the runs took the paths the regime is for"; else echo "FAIL $rname: counts do not show the regime's paths"; fail=1; fi
done
# SGD with momentum in bf16 speculating (its undo copies: master and momentum buffer), in memory
# (ZERONE_SPECULATE=memory) and at stage 3 with the parameters on NVMe (the optimizer in memory):
# bitwise the step at the end, with steps taken back and redone.
for stage in 2 3; do
  param=(); [ $stage = 3 ] && param=(--offload-param nvme --nvme-path "$d/swap")
  spec=; [ $stage = 2 ] && spec=memory  # unset at stage 3: NVMe speculates by default
  PREC=bf16 run "sgd_s${stage}_end" 2 --zero-stage $stage --optimizer sgd --momentum 0.9 --grad-clip ${SOME_CLIP:-2.2} \
    "${param[@]}" --early-step false
  ZERONE_SPECULATE=$spec PREC=bf16 run "sgd_s${stage}_early" 2 --zero-stage $stage --optimizer sgd --momentum 0.9 \
    --grad-clip ${SOME_CLIP:-2.2} "${param[@]}"
  same "sgd_s${stage}_end" "sgd_s${stage}_early"
  if grep -Eq "early step \(.*\): [0-9]+ speculative steps validated, [1-9][0-9]* taken back and redone" "$d/sgd_s${stage}_early.log"; then
    echo "ok   sgd_s${stage}_early: speculated, took steps back and redid them"
  else
    echo "FAIL sgd_s${stage}_early: no step taken back"; grep "^early step" "$d/sgd_s${stage}_early.log"; fail=1
  fi
done
# --delayed-update across world sizes and stages, and across optimizer places.
runs=()
for world in 1 2 3; do
  for stage in 0 1 2 3; do
    run "dpu_w${world}_s${stage}" $world --zero-stage $stage --delayed-update --grad-clip 1.0
    runs+=("dpu_w${world}_s${stage}")
  done
done
python3 "$here/compare_runs.py" fp32 "$d" "${runs[@]}" || fail=1
run dpu_w2_s2_cpu 2 --zero-stage 2 --delayed-update --grad-clip 1.0 --offload-optimizer cpu
same dpu_w2_s2 dpu_w2_s2_cpu
run dpu_w2_s3_nvme 2 --zero-stage 3 --delayed-update --grad-clip 1.0 "${nvme[@]}" --offload-param cpu
same dpu_w2_s3 dpu_w2_s3_nvme
if [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL swap directories left behind: $(ls "$d/swap")"; fail=1; else echo "ok   no swap directory left behind"; fi
exit $fail
