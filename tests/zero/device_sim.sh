#!/usr/bin/env bash
# The device seam (issue 16): training on the simulated device (--device sim, Note [Simulated
# device memory] in kernels/sim/sim_backend.h), whose memory the host cannot touch, gives the same
# bits as the cpu device: every step's loss and gradient norm equal, and the final weights (--save)
# byte-identical. Any host access to device memory that bypasses the backend crashes the sim run.
# Covers GPT-2 in f32/bf16/fp16 (loss scaling), ZeRO stages 0-3 at world 1-3 with gradient
# accumulation and clipping, activation checkpointing with cpu_checkpointing, the speculative early
# step and --delayed-update, optimizer and parameter offload to the host and NVMe, LLaMA (grouped-query attention, rope), an image classifier (conv,
# pooling, dropout, SGD with momentum), validation, and checkpoints saved on one device and resumed
# on the other. Bad device requests get one clear error.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
gpt_noclip=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --micro-batch 2 --seq 16 --steps 4 --lr 1e-3
     --weight-decay 0.1 --no-shuffle --threads 1 --grad-accum 2 --reduce-bucket-size 5000
     --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000 --stage3-param-persistence-threshold 1000)
gpt=("${gpt_noclip[@]}" --grad-clip 1.0)
llama=(train --model llama:layers=2,dim=48,heads=4,kv_heads=2,ffn=96,vocab=300,ctx=16 --micro-batch 2 --seq 16
       --steps 4 --lr 1e-3 --grad-clip 1.0 --no-shuffle --threads 1 --grad-accum 2
       --stage3-param-persistence-threshold 1000)
python3 "$here/../cli/make_idx.py" "$d/img" 96 40 12 12 5
seq=(train --model "seq:in=1x12x12,conv=4:k3:p1,maxpool=2,relu,conv=6:k3,relu,flatten,dropout=0.3,linear=16,relu,linear=5"
     --data "$d/img" --micro-batch 4 --epochs 1 --optimizer sgd --lr 0.015 --momentum 0.9 --weight-decay 1e-3
     --threads 1 --grad-accum 2 --stage3-param-persistence-threshold 100)

# same NAME WORLD ARGS...: the run on cpu and on sim, compared.
same() {
  local name="$1" world="$2"; shift 2
  local ext=.bin
  # LLaMA: a Hugging Face directory (llm.c files hold GPT-2 only); classifiers: no weights file to
  # write, the metrics (with validation at the epoch's end) carry the comparison.
  case "$name" in llama*) ext=/ ;; seq*) ext= ;; esac
  for dev in cpu sim; do
    local save=(); [ -z "$ext" ] || save=(--save "$d/$name.$dev$ext")
    "${MPI[@]}" -n "$world" "$Z" "$@" --device "$dev" --metrics "$d/$name.$dev.jsonl" "${save[@]}" \
      > "$d/$name.$dev.log" 2>&1 || { echo "FAIL $name on $dev"; cat "$d/$name.$dev.log"; exit 1; }
  done
  python3 - "$d/$name.cpu.jsonl" "$d/$name.sim.jsonl" "$name" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
keys = ("loss", "grad_norm", "val_loss", "val_accuracy", "loss_scale")
assert a and len(a) == len(b), f"{sys.argv[3]}: {len(a)} vs {len(b)} steps"
for x, y in zip(a, b):
    for k in keys:
        assert x.get(k) == y.get(k), f"{sys.argv[3]} step {x['step']}: {k} cpu {x.get(k)} sim {y.get(k)}"
PY
  [ -z "$ext" ] || diff -r "$d/$name.cpu$ext" "$d/$name.sim$ext" > /dev/null ||
    { echo "FAIL $name: the saved weights differ"; exit 1; }
  echo "ok $name"
}

for stage in 0 1 2 3; do same "gpt_fp32_w1_s$stage" 1 "${gpt[@]}" --precision fp32 --zero-stage $stage; done
for stage in 0 1 2 3; do same "gpt_bf16_w2_s$stage" 2 "${gpt[@]}" --precision bf16 --zero-stage $stage; done
same gpt_fp32_w3_s1 3 "${gpt[@]}" --precision fp32 --zero-stage 1
same gpt_fp32_w3_s3 3 "${gpt[@]}" --precision fp32 --zero-stage 3
same gpt_fp16_w1_s0 1 "${gpt[@]}" --precision fp16 --zero-stage 0
same gpt_fp16_w2_s2 2 "${gpt[@]}" --precision fp16 --zero-stage 2
same gpt_ckpt_w1_s0 1 "${gpt[@]}" --precision bf16 --activation-checkpointing --cpu-checkpointing
same gpt_ckpt_w2_s3 2 "${gpt[@]}" --precision fp32 --zero-stage 3 --activation-checkpointing --cpu-checkpointing
ZERONE_SPECULATE=always same gpt_speculative_w2_s2 2 "${gpt_noclip[@]}" --precision fp32 --zero-stage 2 --grad-clip 0.05
same gpt_delayed_w2_s1 2 "${gpt[@]}" --precision bf16 --zero-stage 1 --delayed-update
same gpt_endstep_w2_s3 2 "${gpt[@]}" --precision fp32 --zero-stage 3 --early-step false
same llama_w1_s0 1 "${llama[@]}" --precision fp32
same llama_w2_s3 2 "${llama[@]}" --precision bf16 --zero-stage 3
same seq_w2_s2 2 "${seq[@]}" --precision fp32 --zero-stage 2
# Offload (Note [Operands in another place] in optim/adamw.h): state on the host or NVMe while the
# parameters and gradients stay on the device, parameter shards on the host or NVMe at stage 3.
mkdir -p "$d/swap"
off=(--sub-group-size 700 --nvme-path "$d/swap")
same off_cpu_w1_s1_fp32 1 "${gpt[@]}" --precision fp32 --zero-stage 1 --offload-optimizer cpu
same off_cpu_w2_s2 2 "${gpt[@]}" --precision bf16 --zero-stage 2 --offload-optimizer cpu
same off_cpu_w2_s3 2 "${gpt[@]}" --precision bf16 --zero-stage 3 --offload-optimizer cpu --offload-param cpu
same off_ratio_w2_s2 2 "${gpt[@]}" --precision bf16 --zero-stage 2 --offload-optimizer nvme --offload-optimizer-ratio 0.5 "${off[@]}"
same off_split_w2_s2 2 "${gpt[@]}" --precision bf16 --zero-stage 2 --offload-optimizer nvme --offload-optimizer-nvme-ratio 0.5 "${off[@]}"
same off_nvme_w1_s1 1 "${gpt[@]}" --precision fp32 --zero-stage 1 --offload-optimizer nvme "${off[@]}"
same off_nvme_w2_s3 2 "${gpt[@]}" --precision bf16 --zero-stage 3 --offload-optimizer nvme --offload-param nvme "${off[@]}"
same off_delayed_w2_s1 2 "${gpt[@]}" --precision bf16 --zero-stage 1 --offload-optimizer cpu --delayed-update
ZERONE_SPECULATE=always same off_speculative_w2_s3 2 "${gpt_noclip[@]}" --precision fp16 --zero-stage 3 \
  --offload-optimizer nvme --grad-clip 0.05 "${off[@]}"
same seq_off_w2_s3 2 "${seq[@]}" --precision fp32 --zero-stage 3 --offload-optimizer cpu --offload-param cpu

# Checkpoints written on one device resume on the other to the same bits as a straight run: the
# step-2 checkpoint of a 4-step run on one device, continued to step 4 on the other.
for pair in "sim cpu" "cpu sim"; do
  set -- $pair
  ck="$d/ck_$1_$2"
  "${MPI[@]}" -n 2 "$Z" "${gpt[@]}" --precision bf16 --zero-stage 2 --device "$1" --checkpoint-dir "$ck" \
    --checkpoint-every 2 > "$d/ck1.log" 2>&1 || { cat "$d/ck1.log"; exit 1; }
  rm -rf "$ck/step-00000004"
  echo step-00000002 > "$ck/latest"
  "${MPI[@]}" -n 2 "$Z" "${gpt[@]}" --precision bf16 --zero-stage 2 --device "$2" --checkpoint-dir "$ck" --resume \
    --save "$d/resumed_$1_$2.bin" > "$d/ck2.log" 2>&1 || { cat "$d/ck2.log"; exit 1; }
  cmp -s "$d/resumed_$1_$2.bin" "$d/gpt_bf16_w2_s2.cpu.bin" || { echo "FAIL resume $1 -> $2: weights differ"; exit 1; }
  echo "ok resume saved on $1, continued on $2"
done

# Clear errors: an unknown device, cuda where there is none.
expect_error() {  # NAME EXPECTED-SUBSTRING ARGS...
  local name="$1" want="$2"; shift 2
  if "$Z" "$@" > "$d/$name.out" 2>&1; then echo "FAIL $name: exit 0"; exit 1; fi
  grep -q "zerone: error: .*$want" "$d/$name.out" || { echo "FAIL $name: expected '$want'"; cat "$d/$name.out"; exit 1; }
  echo "ok $name"
}
expect_error device_unknown "expected cpu, sim or cuda" "${gpt[@]}" --device tpu
# Without a GPU (CI): --device cuda says so (tests/zero/device_cuda.sh covers the GPU).
"$Z" info | grep -q '^devices .*cuda' || expect_error device_cuda "--device cuda" "${gpt[@]}" --device cuda
