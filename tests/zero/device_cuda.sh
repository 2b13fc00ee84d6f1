#!/usr/bin/env bash
# Whole training steps on the GPU (issue 18 §3): GPT-2, LLaMA (grouped-query attention, rope,
# swiglu) and an mnist-cnn-like image classifier (conv, pooling, dropout, SGD with momentum) trained
# for 10 steps on --device cuda reproduce the cpu run: in f32 every step's loss and gradient norm
# within 1e-5 relative, in bf16 within 2e-2 (the GPU sums in other orders; Note [CUDA against the
# cpu backend], tests/kernels/backend_ops_test.cc). Then a checkpoint written on the GPU resumes on
# the cpu and gives the cpu's own continuation; `zerone estimate --device cuda` equals the ledger
# (flash and plain attention); a run too large for the GPU is refused at start-up; `zerone sample
# --device cuda` decodes the cpu's text.
# Exit 77 (ctest: SKIPPED, never passed) when the build has no CUDA backend or the machine no GPU.
# World 1 without mpiexec; several ranks sharing the GPU: tests/zero/device_cuda_ranks.sh.
# ZERONE_CUDA_SKIP (an extended regex): the cases whose names match are skipped, each with a line;
# zero.device_cuda.emulated runs this script with the zerone tool on the emulated GPU (Note
# [Emulated warps], zerone/kernels/cuda/emulated_gpu.h) and skips the NCCL cases, which need a GPU.
# First run on an H200 on 2026-11-27 (docs/BENCHMARKS.md "GPU runs"); the MFU check at the end since.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
if ! "$Z" info 2>/dev/null | grep -q '^devices .*cuda'; then
  echo "SKIPPED: no CUDA GPU (or no CUDA backend in this build): $("$Z" info 2>&1 | grep -E '^(CUDA|  devices)' | tr '\n' ' ')"
  exit 77
fi
gpt=(train --model gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32 --micro-batch 4 --seq 32 --steps 10 --lr 1e-3
     --weight-decay 0.1 --grad-clip 1.0 --no-shuffle --threads 2 --grad-accum 2)
llama=(train --model llama:layers=2,dim=64,heads=4,kv_heads=2,ffn=128,vocab=300,ctx=32 --micro-batch 4 --seq 32
       --steps 10 --lr 1e-3 --grad-clip 1.0 --no-shuffle --threads 2 --grad-accum 2)
python3 "$here/../cli/make_idx.py" "$d/img" 160 40 28 28 10
cnn=(train --model "seq:in=1x28x28,conv=8:k3:p1,relu,maxpool=2,conv=16:k3:p1,relu,maxpool=2,flatten,dropout=0.25,linear=32,relu,linear=10"
     --data "$d/img" --micro-batch 16 --steps 10 --optimizer sgd --lr 0.02 --momentum 0.9 --weight-decay 1e-3
     --threads 2)

# Every case runs even after one failed (a GPU run is rare: it should say all it can); the script
# fails at the end if any did.
failed=()
# skipped NAME: whether ZERONE_CUDA_SKIP names the case (and says so).
skipped() {
  if [ -n "${ZERONE_CUDA_SKIP:-}" ] && [[ "$1" =~ $ZERONE_CUDA_SKIP ]]; then echo "skipped $1 (ZERONE_CUDA_SKIP)"; return 0; fi
  return 1
}
# close NAME TOLERANCE ARGS...: the run on cpu and on cuda, every step's numbers compared; the
# cuda run also gets the flags in cuda_only (e.g. --comm nccl).
cuda_only=()
close() {
  local name="$1" tol="$2"; shift 2
  skipped "$name" && return 0
  for dev in cpu cuda; do
    local extra=()
    [ "$dev" = cuda ] && extra=("${cuda_only[@]}")
    "$Z" "$@" --device "$dev" "${extra[@]}" --metrics "$d/$name.$dev.jsonl" > "$d/$name.$dev.log" 2>&1 ||
      { echo "FAIL $name on $dev"; tail -20 "$d/$name.$dev.log"; failed+=("$name"); return 0; }
  done
  python3 - "$d/$name.cpu.jsonl" "$d/$name.cuda.jsonl" "$name" "$tol" <<'PY' || failed+=("$name")
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
name, tol = sys.argv[3], float(sys.argv[4])
a = [x for x in a if "loss" in x]; b = [x for x in b if "loss" in x]
assert a and len(a) == len(b), f"{name}: {len(a)} vs {len(b)} steps"
worst = 0.0
for x, y in zip(a, b):
    for k in ("loss", "grad_norm", "val_loss"):
        if x.get(k) is None and y.get(k) is None: continue
        rel = abs(x[k] - y[k]) / max(abs(x[k]), 1e-30)
        worst = max(worst, rel)
        assert rel <= tol, f"{name} step {x.get('step')}: {k} cpu {x[k]!r} cuda {y[k]!r} (relative {rel:.3g} > {tol})"
print(f"ok {name}: {len(a)} steps, worst relative difference {worst:.3g} (tolerance {tol})")
PY
}

close gpt2_fp32 1e-5 "${gpt[@]}" --precision fp32
close gpt2_bf16 2e-2 "${gpt[@]}" --precision bf16
close gpt2_fp16 2e-2 "${gpt[@]}" --precision fp16
close llama_gqa_fp32 1e-5 "${llama[@]}" --precision fp32
close llama_gqa_bf16 2e-2 "${llama[@]}" --precision bf16
close cnn_fp32 1e-5 "${cnn[@]}" --precision fp32
close gpt2_fp32_ckpt 1e-5 "${gpt[@]}" --precision fp32 --activation-checkpointing
# Issue 19: NCCL at world 1 (Note [NCCL collectives]) and the offload paths through pinned host
# memory (Note [Pinned host memory]), against the cpu's run of the same stage.
cuda_only=(--comm nccl)
close gpt2_fp32_stage2_nccl 1e-5 "${gpt[@]}" --precision fp32 --zero-stage 2
close gpt2_fp32_stage3_offload_nccl 1e-5 "${gpt[@]}" --precision fp32 --zero-stage 3 --offload-optimizer cpu --offload-param cpu
cuda_only=()
close gpt2_fp32_stage3_offload_mpi 1e-5 "${gpt[@]}" --precision fp32 --zero-stage 3 --offload-optimizer cpu --offload-param cpu
# The offloaded optimizer's other paths on the GPU (docs/GPU.md "Asynchronous offload copies"):
# bf16 parameters installed from f32 masters (Note [Installing staged operands]), the delayed
# update's installs behind the gradients' copy, and the optimizer state on the disk.
close gpt2_bf16_stage2_offload 2e-2 "${gpt[@]}" --precision bf16 --zero-stage 2 --offload-optimizer cpu
close gpt2_fp32_stage2_delayed 1e-5 "${gpt[@]}" --precision fp32 --zero-stage 2 --offload-optimizer cpu --delayed-update
mkdir -p "$d/nvme"
close gpt2_fp32_stage1_nvme 1e-5 "${gpt[@]}" --precision fp32 --zero-stage 1 --offload-optimizer nvme --nvme-path "$d/nvme"
# One micro-step without clipping: transient gradients (Note [Transient gradients]) in device
# memory, in pinned host memory through NCCL, and with the optimizer state split between the
# disk and host memory (Note [Optimizer state on NVMe and in host memory]).
gpt1=(train --model gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32 --micro-batch 4 --seq 32 --steps 10 --lr 1e-3
      --weight-decay 0.1 --no-shuffle --threads 2)
close gpt2_fp32_stage2_transient 1e-5 "${gpt1[@]}" --precision fp32 --zero-stage 2
cuda_only=(--comm nccl)
close gpt2_bf16_stage2_transient_offload_nccl 2e-2 "${gpt1[@]}" --precision bf16 --zero-stage 2 --offload-optimizer cpu
cuda_only=()
close gpt2_fp32_stage2_nvme_split 1e-5 "${gpt1[@]}" --precision fp32 --zero-stage 2 --offload-optimizer nvme \
  --nvme-path "$d/nvme" --offload-optimizer-nvme-ratio 0.5

# Note [Exposed time]: a GPU's kernels run asynchronously, so the summary counts the rest of the
# step as the device's compute (no "other"), and the offloaded optimizer's copies are transfers.
# With --profile the device's operations are timed one by one (Note [Device compute itemized]):
# the summary's compute is measured, the profile names gemm, attention and elementwise, and the
# rest is the GPU's idle between operations.
exposed=("${gpt[@]}" --precision bf16 --zero-stage 2 --offload-optimizer cpu --device cuda)
if "$Z" "${exposed[@]}" > "$d/exposed.log" 2>&1 && "$Z" "${exposed[@]}" --profile > "$d/itemized.log" 2>&1; then
  line="$(grep -E '^  time of steps 2\.\.10: ' "$d/exposed.log" || true)"
  itemized="$(grep -E '^  time of steps 2\.\.10: ' "$d/itemized.log" || true)"
  profile="$(grep -E '^time per step ' "$d/itemized.log" || true)"
  if grep -Eq '^  time of steps 2\.\.10: device compute and launches [0-9.]+% \(the rest' <<<"$line" &&
     grep -Eq '^  time of steps 2\.\.10: compute [0-9.]+%.*, launches and gaps [0-9.]+% ' <<<"$itemized" &&
     ! grep -q 'other' <<<"$line$itemized$profile" && grep -Eq '(: |, )transfer [0-9.]+%' <<<"$profile" &&
     grep -Eq '(: |, )gemm [0-9.]+%' <<<"$profile" && grep -Eq ', attention [0-9.]+%' <<<"$profile" &&
     grep -Eq ', elementwise [0-9.]+%' <<<"$profile" && grep -Eq ', launches and gaps [0-9.]+%' <<<"$profile"; then
    echo "ok exposed time on cuda: $line; itemized: $profile"
  else
    echo "FAIL exposed time on cuda: '$line' / '$itemized' / '$profile'"; failed+=("exposed_time")
  fi
else
  echo "FAIL exposed time run on cuda"; tail -20 "$d/exposed.log" "$d/itemized.log"; failed+=("exposed_time")
fi

# A checkpoint written on one device resumes on the other: the step-5 checkpoint of a 10-step f32
# run, continued to step 10 on the other device, gives the straight cpu run's steps 6-10.
for pair in "cuda cpu" "cpu cuda"; do
  set -- $pair
  ck="$d/ck_$1_$2"
  "$Z" "${gpt[@]}" --precision fp32 --device "$1" --checkpoint-dir "$ck" --checkpoint-every 5 > "$d/ck1.log" 2>&1 ||
    { echo "FAIL checkpoint on $1"; tail -20 "$d/ck1.log"; failed+=("resume_$1_$2"); continue; }
  rm -rf "$ck/step-00000010"
  echo step-00000005 > "$ck/latest"
  "$Z" "${gpt[@]}" --precision fp32 --device "$2" --checkpoint-dir "$ck" --resume --metrics "$d/resume_$1_$2.jsonl" \
    > "$d/ck2.log" 2>&1 || { echo "FAIL resume on $2"; tail -20 "$d/ck2.log"; failed+=("resume_$1_$2"); continue; }
  python3 - "$d/gpt2_fp32.cpu.jsonl" "$d/resume_$1_$2.jsonl" "$1 -> $2" <<'PY' || failed+=("resume_$1_$2")
import json, sys
a = {x["step"]: x for x in map(json.loads, open(sys.argv[1])) if "loss" in x}
b = [x for x in map(json.loads, open(sys.argv[2])) if "loss" in x]
assert b and b[-1]["step"] == max(a), f"resume {sys.argv[3]}: steps {[x['step'] for x in b]}"
for y in b:
    x = a[y["step"]]
    rel = abs(x["loss"] - y["loss"]) / abs(x["loss"])
    assert rel <= 1e-5, f"resume {sys.argv[3]} step {y['step']}: loss {y['loss']} straight cpu run {x['loss']}"
print(f"ok resume saved on {sys.argv[3]}: {len(b)} steps agree with the straight cpu run")
PY
done
# estimate == ledger on the GPU (Note [Attention's saved state], Note [Device memory the ledger
# cannot see], Note [Backend scratch]): for GPT-2 with flash and plain attention, f32 and bf16, and
# an MLP in bf16 (its 10-class head's GEMMs have no 16-bit cuBLASLt algorithm: the f32 fallback's
# scratch), the ledger's device bytes per category after one step equal `zerone estimate --device
# cuda`'s, to the byte; its device scratch (the backend's slots and cuBLASLt's workspace) equals the
# estimate's but for the bound on the norm partials (at most 1 KiB over here).
gpt_small=(--model gpt2:layers=2,dim=64,heads=4,vocab=257,ctx=32 --micro-batch 4 --seq 32)
mlp=(--model mnist-mlp --micro-batch 16)
for run in gpt_flash_fp32 gpt_plain_fp32 gpt_flash_bf16 mlp_bf16; do
  case $run in
    gpt_*) shape=("${gpt_small[@]}" --cuda-attention "$(cut -d_ -f2 <<< "$run")") data=() ;;
    mlp_*) shape=("${mlp[@]}") data=(--data "$d/img") ;;
  esac
  precision=${run##*_}
  "$Z" train "${shape[@]}" "${data[@]}" --steps 1 --threads 2 --precision $precision --device cuda \
    --metrics "$d/ledger_$run.jsonl" > "$d/ledger_$run.log" 2>&1 ||
    { echo "FAIL ledger run ($run)"; tail -20 "$d/ledger_$run.log"; failed+=("ledger_$run"); continue; }
  "$Z" estimate "${shape[@]}" --world 1 --zero-stage 0 --precision $precision --device cuda --json \
    > "$d/estimate_$run.json" || { echo "FAIL estimate --device cuda ($run)"; failed+=("ledger_$run"); continue; }
  python3 - "$d/ledger_$run.jsonl" "$d/estimate_$run.json" "$run" <<'PY' || failed+=("ledger_$run")
import json, sys
mem = [json.loads(l) for l in open(sys.argv[1])][-1]["mem"]
est = json.load(open(sys.argv[2]))["stages"][0]
got = {k: mem.get(f"device.{k}", 0) for k in ("param", "grad", "master", "optim", "activation")}
want = {k: est[k] for k in ("param", "grad", "master", "optim")}
want["activation"] = est["activation_places"]["device"]
assert got == want, f"{sys.argv[3]}: ledger {got} != estimate {want}"
scratch = mem.get("device.scratch", 0)
counted = est["backend_scratch"] + est["model_state_places"].get("device.scratch", 0)
assert est["backend_scratch"] >= 32 << 20, f"{sys.argv[3]}: no cuBLASLt workspace in the estimate's {est['backend_scratch']}"
assert 0 <= counted - scratch <= 1024, f"{sys.argv[3]}: ledger device scratch {scratch}, estimate {counted}"
print(f"ok estimate == ledger on cuda ({sys.argv[3]}): {got}, scratch {scratch} (estimate {counted})")
PY
done

# A run that cannot fit the GPU is refused at start-up with one line naming the bytes needed and
# the GPU's (Note [Refuse what cannot fit], train/trainer.cc): GPT-2 124M at micro-batch 512 x 1024.
if "$Z" train --model gpt2-124m --micro-batch 512 --seq 1024 --steps 1 --device cuda > "$d/big.out" 2> "$d/big.err"; then
  echo "FAIL a 124M model at micro-batch 512 x 1024 was not refused"; failed+=("refuse_big")
elif [ "$(wc -l < "$d/big.err")" -ne 1 ] || ! grep -q "^zerone: error: the run needs .* of cuda device memory per rank, over the GPU's" "$d/big.err"; then
  echo "FAIL refusal: $(cat "$d/big.err")"; failed+=("refuse_big")
else
  echo "ok refused at start-up: $(cut -c1-200 "$d/big.err")"
fi

# zerone sample on the GPU decodes as the cpu does: greedy and seeded f32 decodes from a model
# trained on the cpu give the same text (the sampling runs on the host from the logits copied
# back; a near-tie of two logits could in principle flip, which the f32 tolerance above makes rare).
"$Z" "${gpt[@]}" --precision fp32 --device cpu --save "$d/sample_model.bin" > "$d/sample_train.log" 2>&1 ||
  { echo "FAIL training the sample model"; failed+=("sample"); }
for how in "--temperature 0" "--seed 7 --top-k 20"; do
  for dev in cpu cuda; do
    "$Z" sample --init "$d/sample_model.bin" --prompt "ab" --tokens 40 --precision fp32 $how --device $dev \
      > "$d/sample.$dev.txt" 2> "$d/sample.$dev.err" || { echo "FAIL sample on $dev ($how)"; cat "$d/sample.$dev.err"; }
  done
  if cmp -s "$d/sample.cpu.txt" "$d/sample.cuda.txt" && [ -s "$d/sample.cpu.txt" ]; then
    echo "ok sample --device cuda == cpu ($how): $(wc -c < "$d/sample.cpu.txt") bytes"
  else
    echo "FAIL sample --device cuda differs from cpu ($how)"; diff "$d/sample.cpu.txt" "$d/sample.cuda.txt" || true
    failed+=("sample $how")
  fi
done
# MFU on cuda (Note [Model FLOPs], train/trainer.cc): none against the host's GEMM peak, which says
# nothing of the GPU's; with --peak-tflops, tflop_per_s / that on every line.
mfu_run=("${gpt[@]}")   # the GPT-2 run, 2 steps (an option given twice is refused)
for i in "${!mfu_run[@]}"; do [ "${mfu_run[$i]}" != --steps ] || mfu_run[$((i + 1))]=2; done
for peak in "" 989; do
  "$Z" "${mfu_run[@]}" --device cuda ${peak:+--peak-tflops $peak} --metrics "$d/mfu$peak.jsonl" > "$d/mfu.log" 2>&1 ||
    { echo "FAIL training for the MFU check"; cat "$d/mfu.log"; failed+=("mfu"); continue; }
  if python3 - "$d/mfu$peak.jsonl" "$peak" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l]
peak = sys.argv[2]
if not peak:
    ok = all("mfu" not in l for l in lines) and "peak_tflop_per_s" not in lines[0]["run"]
else:
    ok = all(abs(l["mfu"] - l["tflop_per_s"] / float(peak)) < 1e-12 for l in lines)
sys.exit(0 if ok and lines else 1)
PY
  then if [ -n "$peak" ]; then echo "ok MFU on cuda against --peak-tflops $peak"; else echo "ok MFU on cuda: none without --peak-tflops"; fi
  else echo "FAIL MFU on cuda (--peak-tflops '${peak}'): $(head -c 400 "$d/mfu$peak.jsonl")"; failed+=("mfu $peak")
  fi
done
[ ${#failed[@]} -eq 0 ] || { echo "FAILED: ${failed[*]}"; exit 1; }
echo "all cuda step tests passed"
