#!/usr/bin/env bash
# DeepSpeed configs as users have them (issue 7), through the real program: a config in the style
# of DeepSpeed's examples and a Hugging Face Trainer "auto" config train a tiny model, with the
# precision, batch arithmetic and per-step learning rate DeepSpeed would use (the lr checked against
# tests/train/deepspeed_lr_schedules.py); each formerly silent mistake is now an error or a notice.
set -u
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
bad() { echo "FAIL: $*"; fail=1; }
model="gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=32"
printf 'hello world, this is a small corpus for zerone tests. ' > "$d/a.txt"
for i in $(seq 1 40); do cat "$d/a.txt"; done > "$d/b.txt"
"$Z" prepare --text "$d/b.txt" --out "$d/c" >/dev/null || { echo "prepare failed"; exit 1; }
tiny=(--model "$model" --seq 16 --data "$d/c_train.bin")

# expect_lr METRICS SCHEDULE_PYTHON: the lr of every step in METRICS is what DeepSpeed's scheduler
# (constructed by SCHEDULE_PYTHON, e.g. "WarmupLR(1e-3, warmup_max_lr=1e-3)") gives, skipped fp16
# steps not advancing it.
expect_lr() {
  python3 - "$1" "$2" "$here/../train" <<'PY' || fail=1
import json, sys
sys.path.insert(0, sys.argv[3])
from deepspeed_lr_schedules import *
lines = [json.loads(l) for l in open(sys.argv[1])]
scheduler = eval(sys.argv[2])
expected = run(scheduler, len(lines), {l["step"] for l in lines if l.get("skipped")})
got = [l["lr"] for l in lines]
ok = all(abs(g - e) <= 1e-7 * max(1e-3, abs(e)) for g, e in zip(got, expected))
print(("ok  " if ok else "FAIL") + f"  lr per step {got}, DeepSpeed {sys.argv[2]}: {expected}")
sys.exit(0 if ok else 1)
PY
}

# 1. DeepSpeed examples style (Megatron GPT-2 / bing_bert ds_config): fp16, train_batch_size with
# the micro-batch derives accumulation, ZeRO-2 tuning keys, WarmupDecayLR, logging keys.
cat > "$d/ds.json" <<'JSON'
{
  "train_batch_size": 4,
  "steps_per_print": 1,
  "wall_clock_breakdown": true,
  "gradient_clipping": 1.0,
  "prescale_gradients": false,
  "zero_allow_untested_optimizer": false,
  "optimizer": {"type": "Adam", "params": {"lr": 1.5e-4, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.01}},
  "scheduler": {"type": "WarmupDecayLR",
                "params": {"total_num_steps": 6, "warmup_min_lr": 1e-5, "warmup_max_lr": 1e-3,
                           "warmup_num_steps": 2, "warmup_type": "linear"}},
  "fp16": {"enabled": true, "loss_scale": 0, "initial_scale_power": 12, "loss_scale_window": 1000,
           "hysteresis": 2, "min_loss_scale": 1},
  "zero_optimization": {"stage": 2, "allgather_partitions": true, "allgather_bucket_size": 5e8,
                        "overlap_comm": true, "reduce_scatter": true, "reduce_bucket_size": 5e8,
                        "contiguous_gradients": true, "cpu_offload": false}
}
JSON
if "$Z" train "${tiny[@]}" --micro-batch 2 --steps 5 --config "$d/ds.json" --metrics "$d/ds.jsonl" >"$d/ds.out" 2>"$d/ds.err"; then
  grep -q ", fp16, micro-batch 2 x seq 16 x accum 2 x world 1, ZeRO stage 2," "$d/ds.out" \
    || bad "ds_config: start-up line lacks fp16 / accum 2 / stage 2: $(head -n 1 "$d/ds.out")"
  grep -q "^zerone: notice: config keys with no effect here: prescale_gradients, steps_per_print, wall_clock_breakdown, zero_allow_untested_optimizer, zero_optimization.cpu_offload$" "$d/ds.err" \
    || bad "ds_config: notice line: $(cat "$d/ds.err")"
  expect_lr "$d/ds.jsonl" "WarmupDecayLR(0, 6, warmup_min_lr=1e-5, warmup_max_lr=1e-3, warmup_num_steps=2, warmup_type='linear')"
else
  bad "ds_config run failed: $(cat "$d/ds.err")"
fi

# 2. Hugging Face Trainer's zero3 "auto" template (offload device "none"): every "auto" is the flag
# or zerone's default; the stage-3 keys are accepted and listed in one notice.
cat > "$d/hf.json" <<'JSON'
{
  "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16,
           "hysteresis": 2, "min_loss_scale": 1},
  "bf16": {"enabled": "auto"},
  "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
  "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto"}},
  "zero_optimization": {
    "stage": 3,
    "offload_optimizer": {"device": "none", "pin_memory": true},
    "offload_param": {"device": "none", "pin_memory": true},
    "overlap_comm": true,
    "contiguous_gradients": true,
    "sub_group_size": 1e9,
    "reduce_bucket_size": "auto",
    "stage3_prefetch_bucket_size": "auto",
    "stage3_param_persistence_threshold": "auto",
    "stage3_max_live_parameters": 1e9,
    "stage3_max_reuse_distance": 1e9,
    "stage3_gather_16bit_weights_on_model_save": true
  },
  "gradient_accumulation_steps": "auto",
  "gradient_clipping": "auto",
  "steps_per_print": 2000,
  "train_batch_size": "auto",
  "train_micro_batch_size_per_gpu": "auto",
  "wall_clock_breakdown": false
}
JSON
default_precision=$("$Z" info | awk '/^default precision/ {print $3}')
if "$Z" train "${tiny[@]}" --micro-batch 2 --steps 4 --lr 1e-3 --warmup 3 --config "$d/hf.json" --metrics "$d/hf.jsonl" >"$d/hf.out" 2>"$d/hf.err"; then
  grep -q "), $default_precision, micro-batch 2 x seq 16 x accum 1 x world 1, ZeRO stage 3," "$d/hf.out" \
    || bad "hf zero3: start-up line lacks $default_precision / stage 3: $(head -n 1 "$d/hf.out")"
  [ "$(grep -c 'config keys with no effect here' "$d/hf.err")" -eq 1 ] && grep -q "zero_optimization.stage3_max_live_parameters" "$d/hf.err" \
    || bad "hf zero3: expected one notice listing the stage-3 keys: $(cat "$d/hf.err")"
  grep -q "fp16.loss_scale, fp16.initial_scale_power, fp16.loss_scale_window, fp16.hysteresis, fp16.min_loss_scale: no effect, loss scaling applies to fp16 only" "$d/hf.err" \
    || bad "hf zero3: expected the loss-scaling notice: $(cat "$d/hf.err")"
  expect_lr "$d/hf.jsonl" "WarmupLR(1e-3, warmup_min_lr=0.0, warmup_max_lr=1e-3, warmup_num_steps=3)"
else
  bad "hf zero3 run failed: $(cat "$d/hf.err")"
fi

# 3. Explicit precision: bf16 disabled is fp32 (not bf16 on CPUs that have it); both on is an error.
printf '{"bf16": {"enabled": false}}' > "$d/fp32.json"
"$Z" train "${tiny[@]}" --micro-batch 2 --steps 1 --config "$d/fp32.json" >"$d/fp32.out" 2>&1 || bad "fp32 run failed"
grep -q "), fp32, micro-batch" "$d/fp32.out" || bad "bf16.enabled false did not train in fp32: $(head -n 1 "$d/fp32.out")"
printf '{"bfloat16": {"enabled": true}, "fp16": {"enabled": false}}' > "$d/bf16.json"
"$Z" train "${tiny[@]}" --micro-batch 2 --steps 1 --config "$d/bf16.json" >"$d/bf16.out" 2>&1 || bad "bfloat16 run failed"
grep -q "), bf16, micro-batch" "$d/bf16.out" || bad "bfloat16.enabled true did not train in bf16: $(head -n 1 "$d/bf16.out")"
"$Z" train "${tiny[@]}" --micro-batch 2 --steps 1 --config "$d/fp32.json" --precision bf16 >"$d/flag.out" 2>&1 || bad "--precision run failed"
grep -q "), bf16, micro-batch" "$d/flag.out" || bad "--precision did not win over the file: $(head -n 1 "$d/flag.out")"
printf '{"bf16": {"enabled": true}, "fp16": {"enabled": true}}' > "$d/both.json"
check "bf16.enabled and fp16.enabled are both true" "$Z" train "${tiny[@]}" --config "$d/both.json"

# 4. Numbers are range-checked, not wrapped or truncated; errors name the key.
printf '{"steps": 4294967298}' > "$d/n1.json"
check "key 'steps' is 4294967298, expected an integer in 1..100000000" "$Z" train "${tiny[@]}" --config "$d/n1.json"
printf '{"train_micro_batch_size_per_gpu": 4294967298}' > "$d/n2.json"
check "key 'train_micro_batch_size_per_gpu' is 4294967298, expected an integer in 1..65536" "$Z" train "${tiny[@]}" --config "$d/n2.json"
printf '{"train_micro_batch_size_per_gpu": 2.7}' > "$d/n3.json"
check "key 'train_micro_batch_size_per_gpu' is 2.7, expected an integer" "$Z" train "${tiny[@]}" --config "$d/n3.json"
printf '{"gradient_accumulation_steps": true}' > "$d/n4.json"
check "key 'gradient_accumulation_steps' is true, expected an integer" "$Z" train "${tiny[@]}" --config "$d/n4.json"
printf '{"optimizer": {"type": "AdamW", "params": {"lr": true}}}' > "$d/n5.json"
check "key 'optimizer.params.lr' is true, expected a number" "$Z" train "${tiny[@]}" --config "$d/n5.json"
printf '{"seed": -5}' > "$d/n6.json"
check "key 'seed' is -5, expected an integer in 0" "$Z" train "${tiny[@]}" --config "$d/n6.json"

# 5. Keys that would change results and are not implemented: an error naming the key.
printf '{"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "none", "ratio": 0.4}}}' > "$d/k1.json"
check "key 'zero_optimization.offload_optimizer.ratio' 0.4 offloads a part of the optimizer, but --offload-optimizer is none" "$Z" train "${tiny[@]}" --config "$d/k1.json"
printf '{"scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 1e-4}}}' > "$d/k2.json"
check "key 'scheduler.type' is \"OneCycle\": the OneCycle schedule is not implemented" "$Z" train "${tiny[@]}" --config "$d/k2.json"
printf '{"optimizer": {"type": "Adam", "params": {"adam_w_mode": false, "weight_decay": 0.1}}}' > "$d/k3.json"
check "Adam with L2 regularisation" "$Z" train "${tiny[@]}" --config "$d/k3.json"
printf '{"optimizer": {"type": "Lamb", "params": {"lr": 1e-3}}}' > "$d/k4.json"
check "key 'optimizer.type' is \"Lamb\"" "$Z" train "${tiny[@]}" --config "$d/k4.json"
# The activation_checkpointing block turns checkpointing on; its model-parallel keys get the notice.
printf '{"activation_checkpointing": {"partition_activations": true, "number_checkpoints": 4}, "aio": {"block_size": 1048576, "queue_depth": 8}}' > "$d/h.json"
if "$Z" train "${tiny[@]}" --micro-batch 2 --steps 1 --config "$d/h.json" >/dev/null 2>"$d/h.err"; then
  grep -q "config keys with no effect here: activation_checkpointing.number_checkpoints (zerone checkpoints every block), activation_checkpointing.partition_activations (it partitions across model-parallel ranks; zerone has none)$" "$d/h.err" \
    || bad "activation_checkpointing/aio notice: $(cat "$d/h.err")"
else
  bad "activation_checkpointing/aio config failed: $(cat "$d/h.err")"
fi

# activation_checkpointing.cpu_checkpointing (Note [CPU checkpointing]) is honoured: the saved block
# inputs leave the device, so a device cap that refuses plain checkpointing admits it; the flag alone
# (without checkpointing) is an error naming it.
ck_model="gpt2:layers=24,dim=64,heads=2,vocab=257,ctx=128"
ck=(train --model "$ck_model" --seq 128 --micro-batch 8 --steps 1 --data "$d/c_train.bin" --activation-checkpointing)
dev=$("$Z" estimate --world 1 --zero-stage 0 --model "$ck_model" --seq 128 --micro-batch 8 --activation-checkpointing --json |
      python3 -c "import json,sys; print(json.load(sys.stdin)['stages'][0]['device'])")
dev_cpu=$("$Z" estimate --world 1 --zero-stage 0 --model "$ck_model" --seq 128 --micro-batch 8 --activation-checkpointing \
          --cpu-checkpointing --json | python3 -c "import json,sys; s=json.load(sys.stdin)['stages'][0]; print(s['device'], s['activation_places']['host'])")
read -r dev_cpu host_act <<< "$dev_cpu"
[ "$host_act" -eq $((23 * 8 * 128 * 64 * 4)) ] || bad "estimate: host activations $host_act, expected L-1=23 saved (B,T,C) inputs"
# The cap: the CPU-checkpointing plan plus 4 MiB (the kernels' scratch, which the estimate leaves out,
# grows to about 3 MiB here: the bf16 run's attention widens qkv into f32 scratch), below the plain
# plan (5.77 MiB more: 22 block outputs of 8 x 128 x 64 f32).
[ $((dev - dev_cpu)) -eq $((22 * 8 * 128 * 64 * 4)) ] || bad "estimate: device saving $((dev - dev_cpu)), expected 22 block outputs"
cap=$(python3 -c "print(($dev_cpu + 4 * 2**20) / 2**30)")
if "$Z" "${ck[@]}" --device-mem-limit "$cap" >/dev/null 2>"$d/ck1.err"; then bad "device cap $cap GiB admitted plain checkpointing"; fi
grep -q "over --device-mem-limit" "$d/ck1.err" || bad "cap refusal: $(cat "$d/ck1.err")"
printf '{"activation_checkpointing": {"cpu_checkpointing": true}}' > "$d/ck.json"
"$Z" "${ck[@]}" --device-mem-limit "$cap" --config "$d/ck.json" >/dev/null 2>"$d/ck2.err" \
  || bad "cpu_checkpointing under the cap failed: $(cat "$d/ck2.err")"
grep -q "no effect" "$d/ck2.err" && bad "cpu_checkpointing reported as having no effect: $(cat "$d/ck2.err")"
"$Z" "${ck[@]:0:11}" --cpu-checkpointing >/dev/null 2>"$d/ck3.err" && bad "--cpu-checkpointing without checkpointing accepted"
grep -q "^zerone: error: --cpu-checkpointing keeps the inputs that activation checkpointing saves" "$d/ck3.err" \
  || bad "--cpu-checkpointing alone: $(cat "$d/ck3.err")"

# 6. train_batch_size is checked: train_batch_size = micro x accum x world, at world 1 and 2.
printf '{"train_batch_size": 10, "train_micro_batch_size_per_gpu": 3}' > "$d/tb.json"
check "train_batch_size 10 is not micro-batch 3 x gradient accumulation 3 x world size 1 \(= 9\)" "$Z" train "${tiny[@]}" --config "$d/tb.json"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2)
if command -v mpiexec >/dev/null; then
  printf '{"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2}' > "$d/tb8.json"
  if OMPI_MCA_mpi_yield_when_idle=1 timeout 120 "${MPI[@]}" "$Z" train "${tiny[@]}" --threads 1 --steps 2 --config "$d/tb8.json" >"$d/w2.out" 2>&1; then
    grep -q "micro-batch 2 x seq 16 x accum 2 x world 2" "$d/w2.out" || bad "world 2: accumulation not derived: $(grep 'zerone: model' "$d/w2.out")"
    echo "ok: world 2 derives accum 2 from train_batch_size 8"
  else
    bad "world 2 run failed: $(tail -n 5 "$d/w2.out")"
  fi
  printf '{"train_batch_size": 6, "gradient_accumulation_steps": 2, "train_micro_batch_size_per_gpu": 2}' > "$d/tb6.json"
  check "train_batch_size 6 is not micro-batch 2 x gradient accumulation 2 x world size 2 \(= 8\)" \
    env OMPI_MCA_mpi_yield_when_idle=1 timeout 120 "${MPI[@]}" "$Z" train "${tiny[@]}" --threads 1 --config "$d/tb6.json"
fi

# 7. Settings that would silently do nothing: errors or notices.
"$Z" train "${tiny[@]}" --micro-batch 2 --steps 1 --precision fp32 --hysteresis 3 --zero-stage 2 \
  --stage3-prefetch-bucket-size 1000 >/dev/null 2>"$d/n.err" || bad "notice run failed: $(cat "$d/n.err")"
grep -q "^zerone: notice: --hysteresis: no effect, loss scaling applies to fp16 only$" "$d/n.err" || bad "loss-scale notice: $(cat "$d/n.err")"
grep -q "^zerone: notice: --stage3-prefetch-bucket-size: no effect below ZeRO stage 3$" "$d/n.err" || bad "stage3 notice: $(cat "$d/n.err")"
check "--min-lr-frac applies only to --lr-schedule cosine or warmup-cosine; this run's schedule is constant" \
  "$Z" train "${tiny[@]}" --min-lr-frac 0.1
check "--val-every has nothing to validate on: give --val-data" "$Z" train "${tiny[@]}" --val-every 5
check "--total-steps applies only to --lr-schedule warmup-decay or warmup-cosine" "$Z" train "${tiny[@]}" --lr-schedule warmup-lr --total-steps 9
# The DeepSpeed schedules from flags.
"$Z" train "${tiny[@]}" --micro-batch 2 --steps 5 --lr 3e-3 --lr-schedule warmup-cosine --warmup 2 --warmup-type linear \
  --warmup-min-ratio 0.1 --total-steps 6 --metrics "$d/wc.jsonl" >/dev/null 2>&1 || bad "warmup-cosine run failed"
expect_lr "$d/wc.jsonl" "WarmupCosineLR(3e-3, 6, warmup_min_ratio=0.1, warmup_num_steps=2, warmup_type='linear')"

# 8. sample: --prompt beside --prompt-tokens, or with a vocabulary that is not byte-level.
"$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=300,ctx=32 --seq 16 --data "$d/c_train.bin" --steps 1 --save "$d/m300.bin" >/dev/null 2>&1 \
  || bad "training the vocab-300 model failed"
check "--prompt and --prompt-tokens both given" "$Z" sample --init "$d/m300.bin" --prompt "hi" --prompt-tokens 1,2 --tokens 2
check "--prompt without --tokenizer is encoded byte-level, but this model's vocabulary of 300 is not byte-level" "$Z" sample --init "$d/m300.bin" --prompt "hi" --tokens 2
exit $fail
