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

# 3. Every DeepSpeed key at every offload device. One config per device sets every key whose
# treatment is "notice" (a value of DeepSpeed's type for it), every "always on" key true, every
# "error when on" key off, and the run's honoured keys; the lists are docs/CONFIG.md's "Every
# DeepSpeed key, by treatment", which Config.DocumentedDeepSpeedKeysAreTheTable holds equal to
# kDeepSpeedKeys. bf16 and bfloat16 (its old name) may not both be given, so each device runs
# twice, once with each. Each run trains a step, exits 0 and prints one notice naming every notice key.
mkdir -p "$d/swap"
python3 - "$here/../../docs/CONFIG.md" "$d" <<'PY' || fail=1
import json, re, sys
doc, out = sys.argv[1], sys.argv[2]
lists = {}
for line in open(doc):
    m = re.match(r"- \*\*(Notice|True: honoured|Off, disabled or 0)[^(]*\(", line)
    if m:
        lists[m.group(1)] = re.findall(r"`([a-z0-9_.]+)`", line.split(" keys): ", 1)[1])
BIG = 9223372036854775807  # sys.maxsize, DeepSpeed's default for the model persistence threshold
# A value of DeepSpeed's type for each notice key (its config classes' fields).
notice_values = {
    "steps_per_print": 10, "wall_clock_breakdown": False, "memory_breakdown": False, "dump_state": False,
    "comment": "every DeepSpeed key", "prescale_gradients": False, "gradient_predivide_factor": 1.0,
    "zero_allow_untested_optimizer": False, "zero_force_ds_cpu_optimizer": True,
    "flops_profiler": {"enabled": False, "recompute_fwd_factor": 0.0, "profile_step": 1, "module_depth": -1,
                       "top_modules": 1, "detailed": True, "output_file": None},
    "comms_logger": {"enabled": False, "verbose": False, "prof_all": True, "debug": False, "prof_ops": []},
    "monitor_config": {"enabled": False},
    "compile": {"disable": False, "backend": "inductor", "kwargs": {}},
    "timers": {"throughput": {"enabled": True, "synchronized": True}},
    "nebula": {"enabled": False, "persistent_storage_path": None, "persistent_time_interval": 100,
               "num_of_version_in_retention": 2, "enable_nebula_load": True, "load_path": None},
    "eigenvalue": {"enabled": False, "verbose": False, "max_iter": 100, "tol": 1e-2, "stability": 1e-6,
                   "gas_boundary_resolution": 1, "layer_name": "bert.encoder.layer", "layer_num": 0},
    "pipeline": {"stages": "auto", "partition": "best", "seed_layers": False, "activation_checkpoint_interval": 0},
    "dataloader_drop_last": False, "sparse_gradients": False, "legacy_fusion": False,
    "seq_parallel_communication_data_type": "fp32", "disable_allgather": False, "fp32_allreduce": False,
    "graph_harvesting": False, "use_data_before_expert_parallelism": False,
    "fp16.auto_cast": False, "bf16.immediate_grad_update": False, "bf16.check_grad_overflow": False,
    "bfloat16.immediate_grad_update": False, "bfloat16.check_grad_overflow": False,
    "zero_optimization.round_robin_gradients": True, "zero_optimization.stage3_max_live_parameters": 1e9,
    "zero_optimization.max_live_parameters": 1e9, "zero_optimization.stage3_max_reuse_distance": 1e9,
    "zero_optimization.max_reuse_distance": 1e9, "zero_optimization.elastic_checkpoint": False,
    "zero_optimization.ignore_unused_parameters": True, "zero_optimization.legacy_stage1": False,
    "zero_optimization.memory_efficient_linear": True, "zero_optimization.use_multi_rank_bucket_allreduce": True,
    "zero_optimization.cpu_offload_use_pin_memory": False, "zero_optimization.log_trace_cache_warnings": False,
    "zero_optimization.stage3_module_granularity_threshold": 0, "zero_optimization.module_granularity_threshold": 0,
    "zero_optimization.use_all_reduce_for_fetch_params": False,
    "zero_optimization.stage3_model_persistence_threshold": BIG, "zero_optimization.model_persistence_threshold": BIG,
    "zero_optimization.pipeline_loading_checkpoint": False, "zero_optimization.override_module_apply": True,
    "zero_optimization.mics_hierarchical_params_gather": False,
    "zero_optimization.offload_optimizer.fast_init": False, "zero_optimization.offload_optimizer.super_offload": False,
    "zero_optimization.offload_optimizer.cpuadam_cores_perc": 0.8,
    "zero_optimization.offload_param.buffer_count": 5, "zero_optimization.offload_param.buffer_size": 1e8,
    "zero_optimization.offload_param.max_in_cpu": 1e9,
    "activation_checkpointing.partition_activations": True,  # false is what zerone does: no notice
    "activation_checkpointing.contiguous_memory_optimization": False, "activation_checkpointing.number_checkpoints": 2,
    "activation_checkpointing.synchronize_checkpoint_boundary": False, "activation_checkpointing.profile": False,
    "checkpoint.tag_validation": "Warn", "checkpoint.load_universal": False,
    "checkpoint.use_node_local_storage": False, "checkpoint.parallel_write": {"pipeline_stage": False},
}
# Off, as DeepSpeed's default, for each key that is an error only when on.
off_values = {"zero_optimization.zero_quantized_nontrainable_weights": False, "zero_optimization.mics_shard_size": -1,
              "fp16.consecutive_hysteresis": False, "fp16.fp16_master_weights_and_grads": False,
              "bf16.bf16_master_weights_and_grads": False, "bf16.bf16_optimizer_states": False,
              "bfloat16.bf16_master_weights_and_grads": False, "bfloat16.bf16_optimizer_states": False,
              "aio.use_gds": False}
notice, always_on, when_on = lists.get("Notice", []), lists.get("True: honoured", []), lists.get("Off, disabled or 0", [])
problems = [f"docs/CONFIG.md's '{name}' list is missing or empty" for name, l in
            (("Notice", notice), ("True: honoured", always_on), ("Off, disabled or 0", when_on)) if not l]
problems += [f"notice key {k} has no value in this test: give it one of DeepSpeed's type" for k in notice if k not in notice_values]
problems += [f"this test's value for {k} is for no notice key" for k in notice_values if k not in notice]
if problems:
    print("\n".join("FAIL  " + p for p in problems)); sys.exit(1)
def put(cfg, path, value):
    *blocks, leaf = path.split(".")
    for b in blocks: cfg = cfg.setdefault(b, {})
    cfg[leaf] = value
for dev in ("none", "cpu", "nvme"):
    for bf in ("bf16", "bfloat16"):
        other = "bfloat16" if bf == "bf16" else "bf16"
        path = out + "/swap" if dev == "nvme" else None
        # The run's honoured keys: batch, steps, stage 3 and the offload devices, their buffers and aio.
        cfg = {"train_micro_batch_size_per_gpu": 2, "steps": 1, "seq": 16,
               "zero_optimization": {"stage": 3, "sub_group_size": 1e9, "stage3_prefetch_bucket_size": 5e7,
                   "stage3_param_persistence_threshold": 1e5, "stage3_gather_16bit_weights_on_model_save": True,
                   "offload_param": {"device": dev, "nvme_path": path, "pin_memory": True},
                   "offload_optimizer": {"device": dev, "nvme_path": path, "pin_memory": True, "buffer_count": 4,
                                         "pipeline_read": True, "pipeline_write": True}},
               "aio": {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False,
                       "overlap_events": True}}
        keys = [k for k in notice if not k.startswith(other + ".")]
        for k in keys: put(cfg, k, notice_values[k])
        for k in always_on: put(cfg, k, True)
        for k in when_on:
            if k.startswith(other + "."): continue
            put(cfg, k, off_values[k] if k in off_values else {"enabled": False})
        with open(f"{out}/tune_{dev}_{bf}.json", "w") as f: json.dump(cfg, f, indent=1)
        with open(f"{out}/tune_{dev}_{bf}.keys", "w") as f: f.write("\n".join(keys) + "\n")
def paths(cfg, prefix=""):
    for k, v in cfg.items():
        yield prefix + k
        if isinstance(v, dict) and prefix + k not in notice: yield from paths(v, prefix + k + ".")
print(f"ok    each config sets {len(list(paths(cfg)))} keys: {len(keys)} notice, {len(always_on)} always on, "
      f"{len(when_on) - 2} off where on is an error, with bf16 or bfloat16")
PY
for dev in none cpu nvme; do
  for bf in bf16 bfloat16; do
    [ -f "$d/tune_${dev}_$bf.json" ] || continue
    out="$d/tune_${dev}_$bf.out"
    if "$Z" train --config "$d/tune_${dev}_$bf.json" > "$out" 2>&1; then
      n=$(grep -c "^zerone: notice: config keys with no effect here: " "$out")
      line=$(grep "^zerone: notice: config keys with no effect here: " "$out")
      missing=$(while read -r k; do
                  case ", ${line#*here: }, " in *", $k, "*|*", $k "*) ;; *) printf '%s ' "$k" ;; esac
                done < "$d/tune_${dev}_$bf.keys")
      if [ "$n" != 1 ]; then bad "every DeepSpeed key at offload device $dev ($bf): $n notices of keys with no effect"; cat "$out"
      elif [ -n "$missing" ]; then bad "every DeepSpeed key at offload device $dev ($bf): the notice lacks $missing"
      elif grep -q "error" "$out"; then bad "every DeepSpeed key at offload device $dev ($bf): $(grep error "$out")"
      elif ! grep -q '"step": *1\|step 1' "$out"; then bad "every DeepSpeed key at offload device $dev ($bf): no step 1 in $(cat "$out")"
      else ok "every DeepSpeed key at offload device $dev ($bf): trained one step, one notice naming all $(wc -l < "$d/tune_${dev}_$bf.keys") notice keys"
      fi
    else
      bad "every DeepSpeed key at offload device $dev ($bf): $(grep error "$out" || tail -3 "$out")"
    fi
  done
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
check "--grad-accumulators 'gpu': expected auto, device or host" "$Z" train --grad-accumulators gpu
echo '{"grad_accumulators": "gpu"}' > "$d/r2.json"
check "key 'grad_accumulators' is \"gpu\", expected \"auto\", \"device\" or \"host\"" "$Z" estimate --model gpt2-124m --world 1 --config "$d/r2.json"
exit $fail
