#!/usr/bin/env bash
# Note [Transient gradients] (zero/partition.h): at one micro-step a step, without clipping or fp16
# loss scaling, stages 2-3 hold each gradient shard only from its reduction to its update.
#  1. The trajectory is bit for bit that of --transient-gradients false (every shard held until
#     the optimizer has run): same losses, byte-identical final checkpoints, for GPT-2 (tied head:
#     the embedding's gradient waits for its own backward), LLaMA (grouped-query, untied) and an
#     image classifier with SGD, at stages 2 and 3, world 1-3 (uneven shards), with the optimizer
#     in memory, on the host or on NVMe (stage 3 also with the parameters offloaded), on the cpu
#     device and on the simulated one (which fails a host read of device memory).
#  2. The bytes: the run's peak gradient bytes are the estimate's, two buffers of the largest
#     shard, where the optimizer runs (host with offload, device without), and no grads.swp on
#     NVMe; with false, one accumulator per unit (or the swap file), as before. A model whose
#     largest unit outweighs the rest keeps its accumulators (two buffers would be more bytes).
#  3. Where it cannot apply (--grad-accum 2, --grad-clip, --delayed-update), --transient-gradients
#     true says so in a notice and the run keeps its gradients, with the same results.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/zero/metrics_lib.sh
source "$here/metrics_lib.sh"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'A gradient is read once, by its update, and then it is garbage. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
python3 "$here/../cli/make_idx.py" "$d/images" 64 10 8 8 4
gpt2=(--model gpt2:layers=3,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --seq 16)
llama=(--model llama:layers=3,dim=48,heads=4,kv_heads=2,ffn=96,vocab=257,ctx=16,tied=0 --data "$d/c_train.bin" --seq 16)
images=(--model seq:in=1x8x8,maxpool=2,flatten,linear=16,relu,linear=16,relu,linear=16,relu,linear=16,relu,linear=4
        --data "$d/images" --optimizer sgd --momentum 0.9)
# Its first layer holds most parameters: two buffers of it would outweigh the accumulators.
uneven=(--model seq:in=1x8x8,flatten,linear=24,relu,linear=4 --data "$d/images" --optimizer sgd --momentum 0.9)
common=(train --micro-batch 2 --steps 4 --lr 1e-3 --weight-decay 0.1 --no-shuffle --threads 1
        --reduce-bucket-size 3000 --stage3-param-persistence-threshold 500)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 2)
fail=0
run() {  # run NAME WORLD ARGS... (the final weights saved in DIR/NAME/, except the image models')
  local name="$1" world="$2" save=(); shift 2
  [[ " $* " == *" --optimizer sgd "* ]] || save=(--save "$d/$name/")
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" "$@" --metrics "$d/$name.jsonl" "${save[@]}" \
    > "$d/$name.log" 2>&1 || { echo "FAIL $name:"; tail -n 20 "$d/$name.log"; fail=1; return 1; }
}
# peak NAME: the run's peak gradient bytes per place (metrics_lib.sh).
peak() { grad_peak "$d/$1.jsonl"; }
# pair NAME WORLD ARGS...: transient (the default) against --transient-gradients false, bitwise;
# the transient run holds fewer gradient bytes than the other, and no gradient swap file.
pair() {
  local name="$1" world="$2"; shift 2
  run "${name}_held" "$world" "$@" --transient-gradients false || return 0
  run "${name}_transient" "$world" "$@" || return 0
  if { [ -d "$d/${name}_held" ] && ! diff -r "$d/${name}_held" "$d/${name}_transient" >/dev/null; } || \
     ! diff <(losses "$d/${name}_held.jsonl") <(losses "$d/${name}_transient.jsonl") >/dev/null; then
    echo "FAIL $name: transient gradients change the trajectory"; fail=1; return 0
  fi
  local held transient
  held=$(peak "${name}_held"); transient=$(peak "${name}_transient")
  if ! python3 - "$held" "$transient" <<'PY'
import sys
held = dict(kv.split("=") for kv in sys.argv[1].split())
trans = dict(kv.split("=") for kv in sys.argv[2].split())
total = lambda m: sum(int(v) for v in m.values())
sys.exit(0 if total(trans) < total(held) and int(trans["nvme.grad"]) == 0 else 1)
PY
  then
    echo "FAIL $name: gradient bytes not reduced (held: $held; transient: $transient)"; fail=1; return 0
  fi
  echo "ok   $name: bitwise equal; gradient bytes $held -> $transient"
}

for world in 1 2 3; do
  for stage in 2 3; do
    pair "gpt2_w${world}_s${stage}" $world "${gpt2[@]}" --zero-stage $stage
    pair "gpt2_w${world}_s${stage}_cpu" $world "${gpt2[@]}" --zero-stage $stage --offload-optimizer cpu
    pair "gpt2_w${world}_s${stage}_nvme" $world "${gpt2[@]}" --zero-stage $stage "${nvme[@]}"
  done
done
pair gpt2_w2_s3_params_cpu 2 "${gpt2[@]}" --zero-stage 3 --offload-optimizer cpu --offload-param cpu
pair gpt2_w2_s3_params_nvme 2 "${gpt2[@]}" --zero-stage 3 "${nvme[@]}" --offload-param nvme
pair gpt2_w1_s2_bf16_cpu 1 "${gpt2[@]}" --zero-stage 2 --precision bf16 --offload-optimizer cpu
pair gpt2_w2_s2_bf16_nvme 2 "${gpt2[@]}" --zero-stage 2 --precision bf16 "${nvme[@]}"
for world in 1 3; do
  pair "llama_w${world}_s2" $world "${llama[@]}" --zero-stage 2
  pair "llama_w${world}_s3_cpu" $world "${llama[@]}" --zero-stage 3 --offload-optimizer cpu
done
pair images_w2_s2 2 "${images[@]}" --zero-stage 2
pair images_w3_s3_cpu 3 "${images[@]}" --zero-stage 3 --offload-optimizer cpu
run uneven_held 2 "${uneven[@]}" --zero-stage 2 --transient-gradients false && run uneven 2 "${uneven[@]}" --zero-stage 2 && {
  if [ "$(peak uneven)" = "$(peak uneven_held)" ] && diff <(losses "$d/uneven.jsonl") <(losses "$d/uneven_held.jsonl") >/dev/null; then
    echo "ok   uneven: the accumulators kept ($(peak uneven)), the same trajectory"
  else echo "FAIL uneven: $(peak uneven) against $(peak uneven_held), or another trajectory"; fail=1; fi; }
# The simulated device: device buffers the host never reads (the offloaded shard lands in host
# memory by a copy, the device one is read by the device's optimizer).
pair sim_w1_s2 1 "${gpt2[@]}" --device sim --zero-stage 2
pair sim_w2_s2_cpu 2 "${gpt2[@]}" --device sim --zero-stage 2 --offload-optimizer cpu
pair sim_w2_s3_nvme 2 "${llama[@]}" --device sim --zero-stage 3 "${nvme[@]}"

# 2. The run's peak gradient bytes are the estimate's (two buffers of the largest shard).
for args in "--offload-optimizer cpu" "--offload-optimizer none"; do
  name="bytes_${args##* }"
  # shellcheck disable=SC2086 # one word per flag
  run "$name" 2 "${gpt2[@]}" --zero-stage 2 $args || continue
  # shellcheck disable=SC2086
  want=$("$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --world 2 --zero-stage 2 --reduce-bucket-size 3000 $args --json |
         python3 -c 'import json,sys; p=json.load(sys.stdin)["stages"][0]["model_state_places"]; print(" ".join(f"{k}={p.get(k,0)}" for k in ("device.grad","host.grad","nvme.grad")))')
  got=$(peak "$name")
  if [ "$got" = "$want" ]; then echo "ok   $name: gradient bytes $got as estimated"
  else echo "FAIL $name: gradient bytes $got, estimate $want"; fail=1; fi
done

# 3. Where it cannot apply: a notice, the gradients held, the same results.
for why in "--grad-accum 2:--grad-accum above 1" "--grad-clip 1000:--grad-clip" "--delayed-update:--delayed-update"; do
  flags="${why%%:*}" reason="${why#*:}"; name="notice_${flags%% *}"; name="${name//-/}"
  # shellcheck disable=SC2086
  run "$name" 1 "${gpt2[@]}" --zero-stage 2 --offload-optimizer cpu $flags --transient-gradients true || continue
  # shellcheck disable=SC2086
  run "${name}_plain" 1 "${gpt2[@]}" --zero-stage 2 --offload-optimizer cpu $flags || continue
  if grep -q -- "--transient-gradients: no effect with $reason" "$d/$name.log" && diff -r "$d/$name" "$d/${name}_plain" >/dev/null &&
     [ "$(peak "$name")" = "$(peak "${name}_plain")" ]; then
    echo "ok   $name: notice, gradients held, same results"
  else
    echo "FAIL $name: expected the notice '--transient-gradients: no effect with $reason' and the plain run's bytes"
    grep -i notice "$d/$name.log" || true; fail=1
  fi
done
exit $fail
