#!/usr/bin/env bash
# Issue 17, part 1: one settings table behind every flag, the config reader and --print-config,
# through the real program: --help grouped with defaults; --print-config's JSON read back by
# --config gives the same settings and the same losses; every DeepSpeed tuning key at every offload
# device runs; an unknown key is an error with "did you mean"; estimate's flags come from the table.
set -u
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d -p "${TMPDIR:-/var/tmp}"); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
bad() { echo "FAIL: $*"; fail=1; }
ok() { echo "ok    $*"; }

# 1. --help: grouped, with defaults, in agreement with README.
"$Z" train --help > "$d/help.txt" 2>&1 || bad "train --help failed"
for heading in "Model:" "Data and batches:" "Optimizer, schedule and loss scaling:" "ZeRO:" \
               "Offload and device memory:" "Checkpoints and saved weights:" "Output:" "Run:"; do
  grep -q "^$heading" "$d/help.txt" || bad "train --help lacks the group '$heading'"
done
grep -q -- "--lr.*\[default: 0.0003\]" "$d/help.txt" || bad "train --help does not show --lr's default"
grep -q -- "--save.*Hugging Face" "$d/help.txt" || bad "train --help: --save does not mention Hugging Face directories"
grep -q -- "--precision.*fp32, bf16 or fp16" "$d/help.txt" || bad "train --help: --precision does not list fp16"
grep -q -- "--comm-timeout.*\[default: 600\]" "$d/help.txt" || bad "train --help lacks --comm-timeout"
"$Z" estimate --help | grep -q "^Offload and device memory:" || bad "estimate --help is not grouped"
"$Z" sample --help | grep -q -- "--precision.*fp16" || bad "sample --help: --precision does not list fp16"
[ $fail = 0 ] && ok "--help grouped, with defaults"
# docs/CONFIG.md's flag table is --help's: the same flags, each with --help's default.
python3 - "$d/help.txt" "$here/../../docs/CONFIG.md" <<'PY' || fail=1
import re, sys
# An option's entry: its line, and the next when the name is too long for the column.
entries, flag = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"  (?:-\w,)?(--[a-z0-9-]+)", line)
    if m:
        flag = m.group(1)
        entries[flag] = line
    elif flag and line.startswith("      ") and line.strip():
        entries[flag] += line
    else:
        flag = None
help_defaults = {}
for f, text in entries.items():
    if f == "--help":
        continue
    d = re.search(r"\[default: (.*)\]\s*$", text)
    help_defaults[f] = d.group(1) if d else "\u2014"
doc_defaults = {}
for line in open(sys.argv[2]):
    m = re.match(r"^\| `(--[a-z0-9-]+)` \|", line)
    if m:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        doc_defaults[m.group(1)] = cells[2]
problems = [f"{f}: in --help, not in docs/CONFIG.md" for f in help_defaults if f not in doc_defaults]
problems += [f"{f}: in docs/CONFIG.md, not a flag of zerone train" for f in doc_defaults if f not in help_defaults]
problems += [f"{f}: docs/CONFIG.md says default '{doc_defaults[f]}', --help '{v}'"
             for f, v in help_defaults.items() if f in doc_defaults and doc_defaults[f] != v]
for p in problems:
    print("FAIL  " + p)
if not problems:
    print(f"ok    docs/CONFIG.md's flag table is --help's ({len(help_defaults)} flags, defaults equal)")
sys.exit(1 if problems else 0)
PY

# 2. --print-config round trip: the printed JSON, read back, prints itself and trains the same.
flags=(--steps 3 --micro-batch 2 --seq 16 --lr 0.002 --zero-stage 2 --grad-clip 1 --warmup 1 --precision fp32
       --lr-schedule warmup-cosine --total-steps 3 --weight-decay 0.1 --reduce-bucket-size 3000)
"$Z" train "${flags[@]}" --print-config > "$d/a.json" || bad "--print-config failed"
"$Z" train --config "$d/a.json" --print-config > "$d/b.json" || bad "--config of --print-config's output failed"
cmp -s "$d/a.json" "$d/b.json" && ok "--print-config reads back to itself" || { bad "--print-config does not round-trip"; diff "$d/a.json" "$d/b.json"; }
grep -q '"zero_stage": 2' "$d/a.json" && grep -q '"lr_schedule": "warmup-cosine"' "$d/a.json" ||
  bad "--print-config lacks settings: $(cat "$d/a.json")"
"$Z" train "${flags[@]}" --metrics "$d/m1.jsonl" > /dev/null 2>&1 || bad "training with flags failed"
"$Z" train --config "$d/a.json" --metrics "$d/m2.jsonl" > /dev/null 2>&1 || bad "training with the printed config failed"
python3 - "$d/m1.jsonl" "$d/m2.jsonl" <<'PY' || fail=1
import json, sys
a = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
b = [json.loads(l) for l in open(sys.argv[2]) if '"step"' in l]
la = [x["loss"] for x in a if "loss" in x]; lb = [x["loss"] for x in b if "loss" in x]
ok = len(la) == 3 and la == lb
print(("ok    " if ok else "FAIL  ") + f"flags and printed config train the same: {la} vs {lb}")
sys.exit(0 if ok else 1)
PY
# A DeepSpeed config's effective settings, printed as zerone's keys, run the same too.
cat > "$d/ds.json" <<'JSON'
{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,
 "bf16": {"enabled": false}, "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "betas": [0.8, 0.99]}},
 "zero_optimization": {"stage": 1, "reduce_bucket_size": 5e8}, "steps": 2, "seq": 16}
JSON
"$Z" train --config "$d/ds.json" --print-config > "$d/ds_eff.json" 2>/dev/null || bad "--print-config of a DeepSpeed config failed"
"$Z" train --config "$d/ds_eff.json" --print-config 2>/dev/null | cmp -s - "$d/ds_eff.json" || bad "DeepSpeed config's effective settings do not round-trip"
grep -q '"beta1": 0.8' "$d/ds_eff.json" && grep -q '"precision": "fp32"' "$d/ds_eff.json" ||
  bad "effective settings of the DeepSpeed config: $(cat "$d/ds_eff.json")"

# 3. Every DeepSpeed memory and buffering key at every offload device: runs, with one notice.
mkdir -p "$d/swap"
for dev in none cpu nvme; do
  path=null; [ $dev = nvme ] && path="\"$d/swap\""
  pdev=$dev; [ $dev = none ] && pdev=none
  cat > "$d/tune_$dev.json" <<JSON
{"train_micro_batch_size_per_gpu": 2, "steps": 1, "seq": 16,
 "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "grad_hooks": true,
   "sub_group_size": 1e9, "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9,
   "stage3_prefetch_bucket_size": 5e7, "stage3_param_persistence_threshold": 1e5,
   "stage3_gather_16bit_weights_on_model_save": true, "round_robin_gradients": true, "elastic_checkpoint": false,
   "ignore_unused_parameters": true,
   "offload_param": {"device": "$pdev", "nvme_path": $path, "pin_memory": true, "buffer_count": 5,
                     "buffer_size": 1e8, "max_in_cpu": 1e9},
   "offload_optimizer": {"device": "$dev", "nvme_path": $path, "pin_memory": true, "buffer_count": 4,
                         "fast_init": false, "pipeline_read": true, "pipeline_write": true}},
 "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": false, "overlap_events": true},
 "steps_per_print": 10, "wall_clock_breakdown": false, "memory_breakdown": false,
 "flops_profiler": {"enabled": false}, "comms_logger": {"enabled": false}}
JSON
  if "$Z" train --config "$d/tune_$dev.json" > "$d/tune_$dev.out" 2>&1; then
    grep -q "zerone: notice: config keys with no effect here: .*max_in_cpu" "$d/tune_$dev.out" &&
      ok "DeepSpeed tuning keys at offload device $dev: run, one notice" || bad "no notice at $dev: $(cat "$d/tune_$dev.out")"
  else
    bad "DeepSpeed tuning keys at offload device $dev: $(grep error "$d/tune_$dev.out")"
  fi
done

# 4. Unknown keys: an error naming the key, with the nearest real one.
echo '{"zero_optimization": {"stgae": 2}}' > "$d/u1.json"
check "key 'zero_optimization.stgae' is unknown; did you mean 'zero_optimization.stage'" "$Z" train --config "$d/u1.json"
echo '{"train_micro_batch_size_per_gpus": 2}' > "$d/u2.json"
check "did you mean 'train_micro_batch_size_per_gpu'" "$Z" train --config "$d/u2.json"
echo '{"aio": {"queue_dpeth": 2}}' > "$d/u3.json"
check "did you mean 'aio.queue_depth'" "$Z" train --config "$d/u3.json"
echo '{"optimizer": "lamb"}' > "$d/u4.json"
check "key 'optimizer' is \"lamb\", expected \"adamw\" or \"sgd\"" "$Z" train --config "$d/u4.json"

# 5. One range per setting, whichever way the value comes.
check "--aio-queue-depth 0 is out of range: expected an integer in 1..4096" "$Z" train --aio-queue-depth 0
echo '{"aio": {"queue_depth": 0}}' > "$d/r1.json"
check "key 'aio.queue_depth' is 0, expected an integer in 1..4096" "$Z" train --config "$d/r1.json"
check "--offload-buffer-count 100 is out of range: expected an integer in 1..64" "$Z" estimate --model gpt2-124m --world 2 --offload-buffer-count 100
check "--aio-block-size 5000 is out of range: expected an integer in 4096..1073741824, a multiple of 4096" "$Z" train --aio-block-size 5000
check "--comm-timeout 0 is out of range" "$Z" train --comm-timeout 0
exit $fail
