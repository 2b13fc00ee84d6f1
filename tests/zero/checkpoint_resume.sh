#!/usr/bin/env bash
# Checkpoints and resume (issue 9), through the real program:
#   1. Same world size, stage and offload: a run resumed from its step-3 checkpoint continues with
#      losses bitwise equal to the uninterrupted run and ends with byte-identical parameters
#      (fp32, bf16, fp16 with dynamic loss scaling; stages 0-3; NVMe offload of optimizer and
#      parameters; a partial optimizer offload; shuffled data; gradient accumulation and clipping),
#      also from an async save.
#   2. Another world size, stage or offload (2 ranks stage 2 -> 3 ranks stage 3, 4 -> 1, NVMe ->
#      none, 1 -> 2 stage 1, NVMe -> half on the host): the engine reshards while loading and the continued losses match the
#      uninterrupted run within 1e-5 (f32; only the order of the gradient sums differs).
#   3. SIGKILL at every point of a save (Note [Crash points]): --resume continues from the previous
#      checkpoint (or the new one, once `latest` names it) and reproduces the uninterrupted run.
#   4. --keep-last prunes; --resume with nothing saved yet starts at step 1; a stop signal saves.
#   5. Loading streams unit by unit: a resumed run peaks at the RSS of an uninterrupted one.
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'It was the best of times, it was the worst of times, it was the age of wisdom. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
        --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0 --warmup 2 --lr-schedule cosine --threads 1
        --reduce-bucket-size 5000 --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000
        --stage3-param-persistence-threshold 1000)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 700 --offload-buffer-count 2)
fail=0
run() {  # run NAME WORLD ACCUM ARGS...: metrics NAME.jsonl, final parameters NAME.bin, log NAME.log
  local name="$1" world="$2" accum="$3"; shift 3
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --steps 6 --grad-accum "$accum" "$@" \
    --metrics "$d/$name.jsonl" --save "$d/$name.bin" > "$d/$name.log" 2>&1 || { echo "FAIL $name:"; cat "$d/$name.log"; exit 1; }
}
# A checkpoint root holding only REF's checkpoint of step STEP, as if REF had stopped there.
stopped_at() {  # stopped_at REF STEP NEWROOT
  mkdir -p "$3"
  cp -r "$d/$1.ck/$(printf 'step-%08d' "$2")" "$3/"
  printf 'step-%08d\n' "$2" > "$3/latest"
}
losses_from() {  # losses_from NAME STEP: "step loss" lines from STEP on
  python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r["step"] >= int(sys.argv[2]): print(r["step"], r["loss"])' "$d/$1.jsonl" "$2"
}
bitwise() {  # bitwise REF NAME: losses of steps 4.. and final parameters identical
  if cmp -s "$d/$1.bin" "$d/$2.bin" && diff <(losses_from "$1" 4) <(losses_from "$2" 4) >/dev/null; then
    echo "ok   $2: bitwise equal to $1 from step 4"
  else
    echo "FAIL $2: differs from $1"; diff <(losses_from "$1" 4) <(losses_from "$2" 4) || true; fail=1
  fi
}
close() {  # close REF NAME: losses of steps 4.. within 1e-5 relative
  if python3 - "$d" "$1" "$2" <<'EOF'
import json, sys
d, ref, name = sys.argv[1:]
def losses(n): return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{n}.jsonl")) if r["step"] >= 4}
a, b = losses(ref), losses(name)
assert sorted(a) == sorted(b) == [4, 5, 6], (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"     max relative loss difference {worst:.2e}")
sys.exit(0 if worst <= 1e-5 else 1)
EOF
  then echo "ok   $2: within 1e-5 of $1 from step 4"; else echo "FAIL $2: not within 1e-5 of $1"; fail=1; fi
}

# 1. Bitwise resume in the same configuration.
same_cases=(
  "fp32_w1_s0|1|6|--precision fp32 --zero-stage 0"
  "bf16_w2_s2|2|3|--precision bf16 --zero-stage 2"
  "fp16_w1_s1|1|6|--precision fp16 --zero-stage 1"
  "fp32_w2_s3_nvme|2|3|--precision fp32 --zero-stage 3 ${nvme[*]} --offload-param nvme"
  "bf16_w3_s1_cpu|3|2|--precision bf16 --zero-stage 1 --offload-optimizer cpu"
  "bf16_w2_s2_partial|2|3|--precision bf16 --zero-stage 2 ${nvme[*]} --offload-optimizer-ratio 0.5"
  "bf16_w2_s3_nvme_host|2|3|--precision bf16 --zero-stage 3 ${nvme[*]} --offload-optimizer-nvme-ratio 0.5 --offload-optimizer-ratio 0.7"
)
for c in "${same_cases[@]}"; do
  IFS='|' read -r name world accum args <<< "$c"
  # shellcheck disable=SC2086
  run "$name" "$world" "$accum" $args --checkpoint-dir "$d/$name.ck" --checkpoint-every 3
  stopped_at "$name" 3 "$d/$name.resumed.ck"
  # shellcheck disable=SC2086
  run "$name.resumed" "$world" "$accum" $args --checkpoint-dir "$d/$name.resumed.ck" --resume
  grep -q "resumed from" "$d/$name.resumed.log" || { echo "FAIL $name.resumed: did not resume"; fail=1; }
  bitwise "$name" "$name.resumed"
done
# NVMe offload: the optimizer state is copied from its swap file disk to disk, not read back.
grep -q "copied disk to disk from the optimizer's swap file" "$d/fp32_w2_s3_nvme.log" \
  && echo "ok   fp32_w2_s3_nvme: the swapped optimizer state was copied disk to disk" \
  || { echo "FAIL fp32_w2_s3_nvme: the swapped optimizer state went through memory"; fail=1; }
# The async save writes the same files, and resuming from it is bitwise too.
run async 2 3 --precision bf16 --zero-stage 2 --checkpoint-dir "$d/async.ck" --checkpoint-every 3 --checkpoint-async
# Async with NVMe offload: the swapped state is copied before the next step, the rest in the background.
run async_nvme 2 3 --precision bf16 --zero-stage 2 "${nvme[@]}" --checkpoint-dir "$d/async_nvme.ck" --checkpoint-every 3 --checkpoint-async
stopped_at async_nvme 3 "$d/async_nvme.resumed.ck"
run async_nvme.resumed 2 3 --precision bf16 --zero-stage 2 --checkpoint-dir "$d/async_nvme.resumed.ck" --resume
bitwise bf16_w2_s2 async_nvme.resumed
for f in rank-00000.bin rank-00001.bin; do
  cmp -s "$d/bf16_w2_s2.ck/step-00000003/$f" "$d/async.ck/step-00000003/$f" && echo "ok   async: $f identical to the synchronous save" \
    || { echo "FAIL async: $f differs from the synchronous save"; fail=1; }
done
stopped_at async 3 "$d/async.resumed.ck"
run async.resumed 2 3 --precision bf16 --zero-stage 2 --checkpoint-dir "$d/async.resumed.ck" --resume
bitwise bf16_w2_s2 async.resumed

# 2. Resharding: another world size, stage or offload (same global batch of 12 sequences).
run ref_w2_s2 2 6 --precision fp32 --zero-stage 2 --checkpoint-dir "$d/ref_w2_s2.ck" --checkpoint-every 3
run ref_w2_s2_nvme 2 6 --precision fp32 --zero-stage 2 "${nvme[@]}" --checkpoint-dir "$d/ref_w2_s2_nvme.ck" --checkpoint-every 3
run ref_w4_s1 4 3 --precision fp32 --zero-stage 1 --checkpoint-dir "$d/ref_w4_s1.ck" --checkpoint-every 3
run ref_w1_s0 1 12 --precision fp32 --zero-stage 0 --checkpoint-dir "$d/ref_w1_s0.ck" --checkpoint-every 3
reshard_cases=(
  "ref_w2_s2|w2s2_to_w3s3|3|4|--zero-stage 3"
  "ref_w4_s1|w4s1_to_w1s0|1|12|--zero-stage 0"
  "ref_w2_s2_nvme|w2nvme_to_w1s1|1|12|--zero-stage 1"
  "ref_w1_s0|w1s0_to_w2s3nvme|2|6|--zero-stage 3 ${nvme[*]} --offload-param nvme"
  "ref_w2_s2_nvme|w2nvme_to_w3s2partial|3|4|--zero-stage 2 --offload-optimizer cpu --offload-optimizer-ratio 0.5 --sub-group-size 700"
  "ref_w2_s2_nvme|w2nvme_to_w1s2split|1|12|--zero-stage 2 ${nvme[*]} --offload-optimizer-nvme-ratio 0.4"
)
for c in "${reshard_cases[@]}"; do
  IFS='|' read -r ref name world accum args <<< "$c"
  stopped_at "$ref" 3 "$d/$name.ck"
  # shellcheck disable=SC2086
  run "$name" "$world" "$accum" --precision fp32 $args --checkpoint-dir "$d/$name.ck" --resume
  close "$ref" "$name"
done

# 3. SIGKILL during the save of step 4 (checkpoints every 2 steps), at each point of the protocol.
kill_args=(--precision fp32 --zero-stage 2 --checkpoint-every 2)
run kill_ref 2 3 "${kill_args[@]}" --checkpoint-dir "$d/kill_ref.ck"
for point in file manifest rename latest prune; do
  set +e
  ZERONE_CHECKPOINT_CRASH_AT=$point ZERONE_CHECKPOINT_CRASH_STEP=4 "${MPI[@]}" -n 2 "$Z" "${common[@]}" --steps 6 --grad-accum 3 \
    "${kill_args[@]}" --checkpoint-dir "$d/kill_$point.ck" --metrics "$d/kill_$point.jsonl" > "$d/kill_$point.crash.log" 2>&1
  rc=$?
  set -e
  [ $rc -ne 0 ] || { echo "FAIL kill_$point: the crash point was not reached"; fail=1; continue; }
  expected=2; [ $point = prune ] && expected=4  # `latest` is replaced just before pruning
  run "kill_$point.resumed" 2 3 "${kill_args[@]}" --checkpoint-dir "$d/kill_$point.ck" --resume
  first=$(losses_from "kill_$point.resumed" 1 | awk 'NR == 1 {print $1}')
  if [ "$first" = $((expected + 1)) ] && cmp -s "$d/kill_ref.bin" "$d/kill_$point.resumed.bin" && \
     diff <(losses_from kill_ref "$first") <(losses_from "kill_$point.resumed" 1) > /dev/null; then
    echo "ok   SIGKILL at '$point' of the step-4 save: resumed after step $expected; bitwise equal to the uninterrupted run"
  else
    echo "FAIL SIGKILL at '$point': resumed at step ${first:-?} (expected $((expected + 1))) or differs"; fail=1
  fi
done

# 4. --keep-last, --resume with nothing saved, a stop signal saves the last complete step.
run keep 1 6 --precision fp32 --checkpoint-dir "$d/keep.ck" --checkpoint-every 1 --keep-last 2
kept=$(cd "$d/keep.ck" && ls -d step-* | tr '\n' ' ')
[ "$kept" = "step-00000005 step-00000006 " ] && echo "ok   --keep-last 2 keeps: $kept" || { echo "FAIL --keep-last 2 keeps: $kept"; fail=1; }
run fresh 1 6 --precision fp32 --checkpoint-dir "$d/fresh.ck" --resume
grep -q "no checkpoint in" "$d/fresh.log" && cmp -s "$d/fresh.bin" "$d/fp32_w1_s0.bin" \
  && echo "ok   --resume with an empty --checkpoint-dir starts at step 1" || { echo "FAIL --resume from nothing"; fail=1; }
"$Z" "${common[@]}" --steps 1000000 --grad-accum 6 --precision fp32 --checkpoint-dir "$d/sig.ck" > "$d/sig.log" 2>&1 &
pid=$!
for _ in $(seq 1 200); do grep -q '^step  *[3-9]' "$d/sig.log" 2>/dev/null && break; sleep 0.1; done
set +e; kill -TERM $pid; wait $pid; rc=$?; set -e
if [ $rc -eq 143 ] && [ -f "$d/sig.ck/latest" ] && grep -q "checkpoint of step" "$d/sig.log"; then
  echo "ok   SIGTERM saved $(cat "$d/sig.ck/latest") and exited 143"
else
  echo "FAIL SIGTERM: rc $rc"; cat "$d/sig.log"; fail=1
fi
# A stop signal after the early step updated most units (one micro-step, no clipping: exact early
# updates, transient gradients, the optimizer on NVMe) finishes the step in progress and saves it;
# the resumed run then ends bitwise where the uninterrupted one does (a checkpoint of the step
# before would hold half of this step's update, applied twice on resume).
stop=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
      --lr 1e-3 --weight-decay 0.1 --threads 1 --steps 400 --precision fp32 --zero-stage 2 "${nvme[@]}")
"$Z" "${stop[@]}" --save "$d/stop_ref.bin" > "$d/stop_ref.log" 2>&1 ||
  { echo "FAIL stop_ref"; cat "$d/stop_ref.log"; fail=1; }
"$Z" "${stop[@]}" --checkpoint-dir "$d/stop.ck" > "$d/stop.log" 2>&1 &
pid=$!
for _ in $(seq 1 300); do grep -q '^step  *[0-9]*[3-9]/' "$d/stop.log" 2>/dev/null && break; sleep 0.05; done
set +e; kill -TERM $pid; wait $pid; rc=$?; set -e
"$Z" "${stop[@]}" --checkpoint-dir "$d/stop.ck" --resume --save "$d/stop_resumed.bin" \
  > "$d/stop_resumed.log" 2>&1 || { echo "FAIL stop_resumed"; cat "$d/stop_resumed.log"; fail=1; }
if [ $rc -eq 143 ] && cmp -s "$d/stop_ref.bin" "$d/stop_resumed.bin"; then
  echo "ok   SIGTERM during step $(grep -o 'during step [0-9]*' "$d/stop.log" | cut -d' ' -f3) saved it; the resumed run is bitwise the uninterrupted one"
else
  echo "FAIL SIGTERM mid-run with early updates: rc $rc, or the resumed run differs"; grep -E 'stopped|saved' "$d/stop.log"; fail=1
fi
# 5. Loading streams: a resumed run's peak RSS is the uninterrupted run's (no copy of the
#    checkpoint, ~165 MiB here, is ever held); allowed: one 16 MiB read-back block and noise.
M=gpt2:layers=8,dim=384,heads=4,vocab=257,ctx=16
rss_args=(train --model $M --data "$d/c_train.bin" --micro-batch 2 --seq 16 --steps 2 --precision fp32 --threads 1)
"$Z" "${rss_args[@]}" --checkpoint-dir "$d/rss.ck" --checkpoint-every 1 --metrics "$d/rss_fresh.jsonl" > "$d/rss_fresh.log" 2>&1
echo step-00000001 > "$d/rss.ck/latest"
"$Z" "${rss_args[@]}" --checkpoint-dir "$d/rss.ck" --resume --metrics "$d/rss_resumed.jsonl" > "$d/rss_resumed.log" 2>&1
if python3 - "$d/rss_fresh.jsonl" "$d/rss_resumed.jsonl" "$d/rss.ck/step-00000001" <<'EOF'
import json, os, sys
peak = lambda f: max(json.loads(l)["mem"]["peak_rss"] for l in open(f))
fresh, resumed = peak(sys.argv[1]), peak(sys.argv[2])
size = sum(os.path.getsize(os.path.join(sys.argv[3], f)) for f in os.listdir(sys.argv[3]))
print(f"     peak RSS fresh {fresh >> 20} MiB, resumed {resumed >> 20} MiB; checkpoint {size >> 20} MiB")
sys.exit(0 if resumed <= fresh + (24 << 20) else 1)
EOF
then echo "ok   loading streams: the resumed run's peak RSS is the fresh run's"; else echo "FAIL loading holds more than a block"; fail=1; fi
[ -n "${KEEP:-}" ] && cp -r "$d" /tmp/ckpt_debug
exit $fail
