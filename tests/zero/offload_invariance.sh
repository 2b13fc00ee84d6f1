#!/usr/bin/env bash
# Offload invariance (issue 8): --offload-optimizer cpu|nvme and --offload-param cpu|nvme reproduce the
# no-offload run bit for bit (same losses in the metrics, byte-identical final checkpoints) at
# stages 1-3, world 1, 2 and 3 (uneven shards), with gradient accumulation, clipping and weight
# decay. The update is one function for every placement (optim::AdamW::update_slice), so anything
# short of identical bytes is a bug (a sub-group boundary, a stale swap buffer, a missed write).
# NVMe runs use small sub-groups (several per shard, not dividing them) and 2 staging buffers, so
# the read-ahead / write-behind pipeline wraps around many times per step; one run per precision
# turns pipelining off. bf16 runs exercise the swapped master copy.
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
# Every swap directory is gone once the runs ended.
if [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL swap directories left behind: $(ls "$d/swap")"; fail=1; else echo "ok   no swap directory left behind"; fi
exit $fail
