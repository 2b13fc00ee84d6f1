#!/usr/bin/env bash
# Offload invariance (issue 8): --offload-optimizer cpu|nvme and --offload-param cpu|nvme reproduce the
# no-offload run bit for bit (same losses in the metrics, byte-identical final checkpoints) at
# stages 1-3, world 1, 2 and 3 (uneven shards), with gradient accumulation, clipping and weight
# decay. The update is one function for every placement (optim::AdamW::update_slice), so anything
# short of identical bytes is a bug (a sub-group boundary, a stale swap buffer, a missed write).
# NVMe runs use small sub-groups (several per shard, not dividing them) and 2 staging buffers, so
# the read-ahead / write-behind pipeline wraps around many times per step; one run per precision
# turns pipelining off. bf16 runs exercise the swapped master copy. Partial offload (a ratio below
# 1) splits the optimizer between the device and the host or NVMe, an NVMe ratio below 1 between
# NVMe and host memory (and both nest): the same bytes again.
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Far out in the uncharted backwaters of the unfashionable end of the western spiral arm. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
        --steps 6 --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0 --no-shuffle --threads 1
        --reduce-bucket-size 5000 --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000
        --stage3-param-persistence-threshold 1000)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 2)
fail=0
run() {  # run NAME WORLD ARGS...
  local name="$1" world="$2"; shift 2
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --grad-accum $((6 / world)) "$@" \
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
for precision in fp32 bf16; do
  worlds="1 2 3"; [ $precision = fp32 ] || worlds="2"
  for world in $worlds; do
    for stage in 1 2 3; do
      base="${precision}_w${world}_s${stage}"
      run "${base}_none" $world --precision $precision --zero-stage $stage
      param=(); [ $stage = 3 ] && param=(--offload-param cpu)
      run "${base}_cpu" $world --precision $precision --zero-stage $stage --offload-optimizer cpu "${param[@]}"
      same "${base}_none" "${base}_cpu"
      run "${base}_nvme" $world --precision $precision --zero-stage $stage "${nvme[@]}"
      same "${base}_none" "${base}_nvme"
      if [ $stage = 3 ]; then  # parameters on NVMe too, read ahead within the prefetch window
        run "${base}_nvme_params" $world --precision $precision --zero-stage 3 "${nvme[@]}" --offload-param nvme
        same "${base}_none" "${base}_nvme_params"
      fi
    done
  done
  # No pipelining, one staging buffer: the same numbers, only slower.
  run "${precision}_w2_s2_nvme_serial" 2 --precision $precision --zero-stage 2 --offload-optimizer nvme \
    --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 1 --pipeline-read false --pipeline-write false
  same "${precision}_w2_s2_none" "${precision}_w2_s2_nvme_serial"
done
# Partial offload (offload_optimizer.ratio, Note [Partial optimizer offload]): the first sub-groups
# on the host or NVMe, the rest on the device. Sub-groups of 700 elements put the boundary inside a
# shard, so one shard steps on both optimizers; ratio 0 keeps everything on the device.
partial=("fp32 1 2 nvme 0.5" "fp32 2 1 cpu 0.5" "fp32 3 3 nvme 0.3" "fp32 2 3 cpu 0.6" "fp32 2 2 nvme 0"
         "bf16 2 2 nvme 0.5" "bf16 2 3 cpu 0.4" "bf16 2 1 nvme 0.8")
for c in "${partial[@]}"; do
  read -r precision world stage dev ratio <<< "$c"
  name="${precision}_w${world}_s${stage}_${dev}_ratio${ratio}"
  extra=(--sub-group-size 700); [ $dev = nvme ] && extra=("${nvme[@]:2}")  # without --offload-optimizer nvme
  param=(); [ $stage = 3 ] && param=(--offload-param $dev)
  run "$name" $world --precision $precision --zero-stage $stage --offload-optimizer $dev --offload-optimizer-ratio $ratio \
    "${extra[@]}" "${param[@]}"
  same "${precision}_w${world}_s${stage}_none" "$name"
  # And the split is real: optimizer state on both places (ratio 0: on the device only).
  python3 - "$d/$name.jsonl" $dev $ratio <<'PY' || fail=1
import json, sys
mem = json.loads(open(sys.argv[1]).readlines()[-1])["mem"]
place = {"cpu": "host", "nvme": "nvme"}[sys.argv[2]]
want = (True, float(sys.argv[3]) > 0)
got = (mem.get("device.optim", 0) > 0, mem.get(place + ".optim", 0) > 0)
print(f"{'ok  ' if got == want else 'FAIL'} {sys.argv[1].split('/')[-1]}: optimizer state on device {got[0]}, on {place} {got[1]}")
sys.exit(got != want)
PY
done
# State split between NVMe and host memory (Note [Optimizer state on NVMe and in host memory]): the
# first sub-groups swapped, the rest stepped in host memory; nested in a partial offload, the last
# ones on the device too. The same bytes, and state in each place the split names.
split=("fp32 1 2 0.5 1" "fp32 3 3 0.3 1" "bf16 2 2 0.5 1" "bf16 2 1 0.8 1" "fp32 2 2 0.5 0.6" "bf16 2 3 0.4 0.7")
for c in "${split[@]}"; do
  read -r precision world stage nvme_ratio ratio <<< "$c"
  name="${precision}_w${world}_s${stage}_nvme${nvme_ratio}_ratio${ratio}"
  param=(); [ $stage = 3 ] && param=(--offload-param cpu)
  run "$name" $world --precision $precision --zero-stage $stage "${nvme[@]}" --offload-optimizer-nvme-ratio $nvme_ratio \
    --offload-optimizer-ratio $ratio "${param[@]}"
  same "${precision}_w${world}_s${stage}_none" "$name"
  python3 - "$d/$name.jsonl" $ratio <<'PY' || fail=1
import json, sys
mem = json.loads(open(sys.argv[1]).readlines()[-1])["mem"]
want = (float(sys.argv[2]) < 1, True, True)
got = tuple(mem.get(p + ".optim", 0) > 0 for p in ("device", "host", "nvme"))
print(f"{'ok  ' if got == want else 'FAIL'} {sys.argv[1].split('/')[-1]}: optimizer state on device/host/nvme {got}")
sys.exit(got != want)
PY
done
# Without clipping the engine steps each unit during the backward (Note [Early optimizer step]): a
# split shard's two parts step there too; and --delayed-update steps both parts on its thread.
noclip=(); skip=0
for a in "${common[@]}"; do
  if [ $skip = 1 ]; then skip=0; continue; fi
  if [ "$a" = --grad-clip ]; then skip=1; continue; fi
  noclip+=("$a")
done
common=("${noclip[@]}")
run early_w2_s3_end 2 --zero-stage 3 --early-step false
run early_w2_s3_nvme_ratio0.5 2 --zero-stage 3 "${nvme[@]}" --offload-optimizer-ratio 0.5 --offload-param nvme
same early_w2_s3_end early_w2_s3_nvme_ratio0.5
run early_w3_s2_cpu_ratio0.5 3 --zero-stage 2 --offload-optimizer cpu --offload-optimizer-ratio 0.5 --sub-group-size 700
run early_w3_s2_end 3 --zero-stage 2 --early-step false
same early_w3_s2_end early_w3_s2_cpu_ratio0.5
run early_w2_s2_nvme0.5 2 --zero-stage 2 "${nvme[@]}" --offload-optimizer-nvme-ratio 0.5
run early_w2_s2_end 2 --zero-stage 2 --early-step false
same early_w2_s2_end early_w2_s2_nvme0.5
run dpu_w2_s2 2 --zero-stage 2 --delayed-update
run dpu_w2_s2_nvme_ratio0.5 2 --zero-stage 2 --delayed-update "${nvme[@]}" --offload-optimizer-ratio 0.5
same dpu_w2_s2 dpu_w2_s2_nvme_ratio0.5
run dpu_w2_s2_nvme0.5 2 --zero-stage 2 --delayed-update "${nvme[@]}" --offload-optimizer-nvme-ratio 0.5
same dpu_w2_s2 dpu_w2_s2_nvme0.5
# Every swap directory is gone once the runs ended.
if [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL swap directories left behind: $(ls "$d/swap")"; fail=1; else echo "ok   no swap directory left behind"; fi
exit $fail
