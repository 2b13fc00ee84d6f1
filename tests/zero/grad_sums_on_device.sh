#!/usr/bin/env bash
# Note [Gradient sums on the device] (zero/partition.h): with the optimizer offloaded, stages 2-3
# may keep the micro-steps' f32 gradient sums on the device and stage each to a host buffer for its
# update, instead of keeping them in host memory and taking them to the device and back for every
# later micro-step.
#  1. The trajectory is bit for bit that of --grad-accumulators host: same losses and gradient
#     norms, byte-identical final checkpoints, at --grad-accum 3, for GPT-2 and LLaMA, stages 2-3,
#     world 1-3, the optimizer in host memory, on NVMe (whole, split with host memory, with the
#     parameters on NVMe too), with --grad-clip (the norm measured on the device; on NVMe the
#     speculative early step taken back and redone), fp16 loss scaling, the update at the end
#     (--early-step false: every sum staged at its update), --delayed-update (the sums copied into
#     its own host gradients from the device), SGD on an image classifier; on the
#     simulated device (whose deferred copies read NaN where a copy is not waited for) and on cpu.
#  2. The bytes: the run's peak gradient bytes per place are the estimate's (the sums on the
#     device, two staging buffers of the largest shard on the host, no grads.swp).
#  3. auto (the default): on the device where a separate device accumulates micro-steps and the
#     run fits it; host sums under a --device-mem-limit that the device sums would pass; host on
#     the cpu device. `zerone plan` keeps a given place in the config it writes.
#  4. device or host where it cannot apply: a notice naming why, the same results.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=tests/zero/metrics_lib.sh
source "$here/metrics_lib.sh"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Sum on the device, cross the link once a step. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
python3 "$here/../cli/make_idx.py" "$d/images" 64 10 8 8 4
gpt2=(--model gpt2:layers=3,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --seq 16)
llama=(--model llama:layers=3,dim=48,heads=4,kv_heads=2,ffn=96,vocab=257,ctx=16,tied=0 --data "$d/c_train.bin" --seq 16)
images=(--model seq:in=1x8x8,maxpool=2,flatten,linear=16,relu,linear=16,relu,linear=4
        --data "$d/images" --optimizer sgd --momentum 0.9)
common=(train --micro-batch 2 --steps 4 --lr 1e-3 --weight-decay 0.1 --no-shuffle --threads 1
        --reduce-bucket-size 3000 --stage3-param-persistence-threshold 500)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 2)
fail=0
run() {  # run NAME WORLD ARGS... (the final weights saved in DIR/NAME/, except the image models')
  local name="$1" world="$2" save=(); shift 2
  [[ " $* " == *" --optimizer sgd "* ]] || save=(--save "$d/$name/")
  [[ " $* " == *" --grad-accum "* ]] || set -- "$@" --grad-accum 3
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" "$@" --metrics "$d/$name.jsonl" "${save[@]}" \
    > "$d/$name.log" 2>&1 || { echo "FAIL $name:"; tail -n 20 "$d/$name.log"; fail=1; return 1; }
}
# peak NAME: the run's peak gradient bytes per place (metrics_lib.sh).
peak() { grad_peak "$d/$1.jsonl"; }
on_device() { grep -q "(gradient sums on the device)" "$d/$1.log"; }
# pair NAME WORLD ARGS...: --grad-accumulators device against host, bitwise; the device run says
# so in its header and holds its sums on the device.
pair() {
  local name="$1" world="$2"; shift 2
  run "${name}_host" "$world" "$@" --grad-accumulators host || return 0
  run "${name}_device" "$world" "$@" --grad-accumulators device || return 0
  if { [ -d "$d/${name}_host" ] && ! diff -r "$d/${name}_host" "$d/${name}_device" >/dev/null; } || \
     ! diff <(losses "$d/${name}_host.jsonl") <(losses "$d/${name}_device.jsonl") >/dev/null; then
    echo "FAIL $name: gradient sums on the device change the trajectory"
    paste <(losses "$d/${name}_host.jsonl") <(losses "$d/${name}_device.jsonl") | head -5; fail=1; return 0
  fi
  if on_device "${name}_host" || ! on_device "${name}_device"; then
    echo "FAIL $name: the headers do not say where the sums are"; fail=1; return 0
  fi
  echo "ok   $name: bitwise equal; gradient bytes $(peak "${name}_host") -> $(peak "${name}_device")"
}

# 1. Bitwise, on the simulated device.
sim=(--device sim)
pair sim_w1_s2_cpu 1 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu
pair sim_w2_s2_cpu 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu
pair sim_w3_s3_cpu 3 "${gpt2[@]}" "${sim[@]}" --zero-stage 3 --offload-optimizer cpu
pair sim_w2_s2_nvme 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 "${nvme[@]}"
pair sim_w2_s2_nvme_split 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 "${nvme[@]}" --offload-optimizer-nvme-ratio 0.5
pair sim_w2_s3_params_nvme 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 3 "${nvme[@]}" --offload-param nvme
pair sim_w2_s3_params_cpu 2 "${llama[@]}" "${sim[@]}" --zero-stage 3 --offload-optimizer cpu --offload-param cpu
pair sim_w2_s2_llama_bf16 2 "${llama[@]}" "${sim[@]}" --zero-stage 2 --precision bf16 --offload-optimizer cpu
pair sim_w2_s2_clip 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu --grad-clip 0.05
pair sim_w2_s2_nvme_clip 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 "${nvme[@]}" --grad-clip 0.05
pair sim_w1_s2_fp16 1 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --precision fp16 --offload-optimizer cpu
pair sim_w2_s2_at_end 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu --early-step false
pair sim_w2_s3_images 2 "${images[@]}" "${sim[@]}" --zero-stage 3 --offload-optimizer cpu
# --delayed-update copies the sums into the optimizer's own host gradients, now from the device.
pair sim_w2_s2_delayed 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu --delayed-update
pair sim_w2_s3_delayed_nvme 2 "${llama[@]}" "${sim[@]}" --zero-stage 3 "${nvme[@]}" --delayed-update --grad-clip 0.05
# One micro-step a step where transient gradients cannot be (clipping): the sum is the reduction.
run_one=(--grad-accum 1 --grad-clip 0.05)
pair sim_w1_s2_one_step 1 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu "${run_one[@]}"
# The cpu device, where the device is host memory: the same code, the same bits.
pair cpu_w2_s2_cpu 2 "${gpt2[@]}" --zero-stage 2 --offload-optimizer cpu

# 2. The run's peak gradient bytes per place are the estimate's.
for args in "--offload-optimizer cpu" "--offload-optimizer nvme --nvme-path $d/swap"; do
  name="bytes_$(echo "$args" | cut -d' ' -f2)"
  # shellcheck disable=SC2086 # one word per flag
  run "$name" 2 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 $args || continue
  # shellcheck disable=SC2086
  want=$("$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --world 2 --zero-stage 2 \
         --reduce-bucket-size 3000 "${sim[@]}" $args --json |
         python3 -c 'import json,sys; p=json.load(sys.stdin)["stages"][0]["model_state_places"]; print(" ".join(f"{k}={p.get(k,0)}" for k in ("device.grad","host.grad","nvme.grad")))')
  got=$(peak "$name")
  if [ "$got" = "$want" ] && on_device "$name" && [[ "$got" == *"nvme.grad=0"* ]]; then
    echo "ok   $name: auto put the sums on the device; gradient bytes $got as estimated"
  else echo "FAIL $name: gradient bytes $got, estimate $want (or the sums not on the device)"; fail=1; fi
  # The offloaded update's kept staging (Note [Installing staged operands]) within the estimate's
  # bound (Note [Working-set bound]: host_scratch).
  # shellcheck disable=SC2086
  bound=$("$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --world 2 --zero-stage 2 \
          --reduce-bucket-size 3000 "${sim[@]}" $args --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0]["working_set"]["host_scratch"])')
  scratch=$(python3 -c 'import json,sys; print(max(json.loads(l).get("mem", {}).get("host.scratch", 0) for l in open(sys.argv[1])))' "$d/$name.jsonl")
  if [ "$scratch" -gt 0 ] && [ "$scratch" -le "$bound" ]; then echo "ok   $name: host scratch $scratch <= bound $bound"
  else echo "FAIL $name: host scratch $scratch, bound $bound"; fail=1; fi
done

# 3. auto: host sums where the device sums would not fit; host on the cpu device; the planner.
need=$("$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --world 1 --zero-stage 2 \
       --reduce-bucket-size 3000 "${sim[@]}" --offload-optimizer cpu --json |
       python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0]["device"])')
host_need=$("$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --world 1 --zero-stage 2 \
            --reduce-bucket-size 3000 "${sim[@]}" --offload-optimizer cpu --grad-accumulators host --json |
            python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0]["device"])')
limit=$(python3 -c "print(($need + $host_need) / 2 / 2**30)")
# zerone estimate says where: on the device, and on the host under the tight limit.
sums_at() {
  "$Z" estimate "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --world 1 --zero-stage 2 \
    --reduce-bucket-size 3000 "${sim[@]}" --offload-optimizer cpu "$@" --json |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["stages"][0].get("grad_sums"))'
}
if [ "$(sums_at)" = device ] && [ "$(sums_at --device-mem-limit "$limit")" = host ]; then
  echo "ok   estimate: grad_sums device, host under --device-mem-limit $limit GiB"
else echo "FAIL estimate: grad_sums $(sums_at), under the limit $(sums_at --device-mem-limit "$limit")"; fail=1; fi
if [ "$need" -gt "$host_need" ] && run auto_tight 1 "${gpt2[@]}" "${sim[@]}" --zero-stage 2 --offload-optimizer cpu \
     --device-mem-limit "$limit" && ! on_device auto_tight && run auto_cpu 1 "${gpt2[@]}" --zero-stage 2 --offload-optimizer cpu &&
   ! on_device auto_cpu && diff <(losses "$d/auto_tight.jsonl") <(losses "$d/sim_w1_s2_cpu_host.jsonl") >/dev/null; then
  echo "ok   auto: host sums under --device-mem-limit $limit GiB (device sums need $need B, host sums $host_need B) and on cpu"
else
  echo "FAIL auto: expected host sums under a tight --device-mem-limit and on the cpu device"; fail=1
fi
# The planner keeps a given place (its choice between the two on a GPU: tests/zero/planner_test.cc).
"$Z" plan "${gpt2[@]:0:2}" --seq 16 --micro-batch 2 --grad-accum 3 --zero-stage 2 --offload-optimizer cpu \
  --offload-optimizer-ratio 1 --grad-accumulators device "${sim[@]}" --out "$d/plan.json" > "$d/plan.log" 2>&1 || true
if grep -q -- "--grad-accumulators device" "$d/plan.log" && run planned 1 --config "$d/plan.json" "${gpt2[@]}" "${sim[@]}" &&
   on_device planned; then
  echo "ok   plan: keeps --grad-accumulators device, and its config runs so"
else echo "FAIL plan: --grad-accumulators device not kept"; tail -20 "$d/plan.log"; fail=1; fi

# 4. Where it cannot apply: a notice, the same results.
for why in "--zero-stage 2 --offload-optimizer none:--offload-optimizer none" \
           "--zero-stage 1 --offload-optimizer cpu:--zero-stage below 2" \
           "--zero-stage 2 --offload-optimizer cpu --offload-optimizer-ratio 0.5:--offload-optimizer-ratio below 1"; do
  flags="${why%%:*}" reason="${why#*:}"; name="notice_$(echo "$flags" | tr -dc 'a-z0-9')"
  # shellcheck disable=SC2086
  run "$name" 1 "${gpt2[@]}" "${sim[@]}" $flags --grad-accumulators device || continue
  # shellcheck disable=SC2086
  run "${name}_plain" 1 "${gpt2[@]}" "${sim[@]}" $flags || continue
  if grep -q -- "--grad-accumulators device: no effect with $reason" "$d/$name.log" && diff -r "$d/$name" "$d/${name}_plain" >/dev/null &&
     ! on_device "$name"; then
    echo "ok   $name: notice, same results"
  else
    echo "FAIL $name: expected the notice '--grad-accumulators device: no effect with $reason'"
    grep -i notice "$d/$name.log" || true; fail=1
  fi
done
exit $fail
