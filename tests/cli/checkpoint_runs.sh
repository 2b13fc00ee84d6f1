#!/usr/bin/env bash
# Never lose a run (issue 24): a stop signal during a save with NVMe optimizer state, a kill
# between a step directory and `latest`, two runs on one directory, an earlier run's directory
# without --resume, temporaries of killed runs, hostile manifest numbers, weights-only checkpoints,
# a signal during validation. Signals are synchronized on files (metrics lines), never on sleeps.
set -u
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cd "$d" || exit 1
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
model="gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16"
printf 'A checkpoint is a promise that no work is lost. %.0s' $(seq 1 200) > t.txt
"$Z" prepare --text t.txt --out c --val-fraction 0 >/dev/null || { echo "prepare failed"; exit 1; }
train=(train --model "$model" --data c_train.bin --micro-batch 2 --seq 16 --threads 1 --precision fp32 --no-shuffle)
nvme=(--zero-stage 2 --offload-optimizer nvme --nvme-path "$d/nv")
mkdir -p nv
# wait_lines FILE N PID: until FILE has N lines (or PID is gone).
wait_lines() {
  while [ "$({ wc -l < "$1"; } 2>/dev/null || echo 0)" -lt "$2" ] && kill -0 "$3" 2>/dev/null; do sleep 0.05; done
}
dead_pid() { sh -c 'echo $$'; }  # a process that has ended by the time its pid is used

# 1. SIGTERM while a save copies the NVMe-resident optimizer state: the handler unlinks the swap
# files, the copy must still read them through the run's descriptors, and the save completes. The
# run then stops after the step in progress (step 3), whose checkpoint is the latest.
for async in "" --checkpoint-async; do
  rm -rf ck1
  ZERONE_CHECKPOINT_CRASH_AT=copy:TERM ZERONE_CHECKPOINT_CRASH_STEP=2 "$Z" "${train[@]}" "${nvme[@]}" $async --steps 50 \
    --checkpoint-dir ck1 --checkpoint-every 2 > s1.log 2>&1
  rc=$?
  if [ $rc = 143 ] && [ -d ck1/step-00000002 ] && [ "$(cat ck1/latest 2>/dev/null)" = step-00000003 ] && ! ls -a ck1 | grep -q '^\.tmp-' &&
     ! grep -q "cannot open" s1.log; then
    ok "SIGTERM during the swap copy of a save ${async:-(sync)}: the save completed, latest $(cat ck1/latest)"
  else
    bad "SIGTERM during the swap copy of a save ${async:-(sync)}: rc $rc"; cat s1.log; ls -a ck1
  fi
done
# ... and the stop checkpoint written after the signal (every step's state is in the swap file).
rm -rf ck1b
"$Z" "${train[@]}" "${nvme[@]}" --steps 1000000 --checkpoint-dir ck1b --checkpoint-every 1000000 --metrics m1.jsonl > s1b.log 2>&1 &
p=$!; wait_lines m1.jsonl 3 $p; kill -TERM $p; wait $p; rc=$?
if [ $rc = 143 ] && grep -q "holds the last of them" s1b.log && [ -f ck1b/latest ] && ! ls -a ck1b | grep -q '^\.tmp-'; then
  ok "SIGTERM with NVMe offload: the stop checkpoint $(cat ck1b/latest) was written"
else
  bad "SIGTERM with NVMe offload: the stop checkpoint: rc $rc"; cat s1b.log; ls -a ck1b
fi
"$Z" "${train[@]}" "${nvme[@]}" --steps 1 --checkpoint-dir ck1b --resume > r1b.log 2>&1 && grep -q "nothing left to train" r1b.log \
  && ok "the stop checkpoint resumes" || { bad "the stop checkpoint does not resume"; cat r1b.log; }

# 2. SIGKILL between the step directory's rename and `latest` (and a leftover latest.tmp.<pid>):
# --resume takes the newest complete step directory and sweeps the leftover.
rm -rf ck2
ZERONE_CHECKPOINT_CRASH_AT=latest "$Z" "${train[@]}" --steps 2 --checkpoint-dir ck2 > /dev/null 2>&1
touch "ck2/latest.tmp.$(dead_pid)"
if [ -d ck2/step-00000002 ] && [ ! -e ck2/latest ]; then
  "$Z" "${train[@]}" --steps 4 --checkpoint-dir ck2 --resume > r2.log 2>&1; rc=$?
  if [ $rc = 0 ] && grep -q "resumed from 'ck2/step-00000002'" r2.log && grep -q "notice: 'ck2/latest' is missing" r2.log &&
     [ "$(cat ck2/latest)" = step-00000004 ] && ! ls ck2 | grep -q 'latest.tmp'; then
    ok "no latest after a kill: resumed from the newest complete step, leftover swept"
  else
    bad "no latest after a kill: rc $rc"; cat r2.log; ls -a ck2
  fi
else
  bad "the kill at 'latest' did not leave the expected state"; ls -a ck2
fi

# 3. Two runs on one directory: the second is refused, naming the process that holds it.
rm -rf ck3
"$Z" "${train[@]}" --steps 1000000 --checkpoint-dir ck3 --checkpoint-every 1000000 --metrics m3.jsonl > s3.log 2>&1 &
p=$!; wait_lines m3.jsonl 1 $p
check "--checkpoint-dir 'ck3' is in use by another zerone run \(process $p holds 'ck3/.zerone-lock'\)" \
  "$Z" "${train[@]}" --steps 5 --checkpoint-dir ck3 --resume
check "--checkpoint-dir 'ck3' is in use by another zerone run \(process $p " "$Z" "${train[@]}" --steps 5 --checkpoint-dir ck3
kill -TERM $p; wait $p

# 4. An earlier run's directory without --resume: refused; latest and its steps untouched.
rm -rf ck4
"$Z" "${train[@]}" --steps 30 --checkpoint-dir ck4 --checkpoint-every 10 > /dev/null 2>&1
check "--checkpoint-dir 'ck4' holds the checkpoints of an earlier run \(its 'latest' names 'step-00000030'\): give --resume" \
  "$Z" "${train[@]}" --steps 2 --checkpoint-dir ck4 --keep-last 1
[ "$(cat ck4/latest)" = step-00000030 ] && [ -d ck4/step-00000010 ] && [ -d ck4/step-00000020 ] && [ ! -e ck4/step-00000002 ] \
  && ok "the earlier run's checkpoints are untouched" || { bad "the earlier run's checkpoints changed"; ls ck4; }

# A directory holding other files but no checkpoints is no earlier run: the run saves there.
mkdir -p ck4b && echo notes > ck4b/notes.txt
"$Z" "${train[@]}" --steps 2 --checkpoint-dir ck4b > s4b.log 2>&1 && [ "$(cat ck4b/latest)" = step-00000002 ] \
  && ok "a directory with other files takes checkpoints" || { bad "a directory with other files"; cat s4b.log; }

# 5. Temporaries of killed runs are swept at start-up: a crashed save's .tmp-step-N, latest.tmp.<pid>,
# convert's DST.tmp.<pid>, and swap directories zerone-swap-<pid>-rank<r> of a process that is gone.
pid=$(dead_pid)
mkdir -p ck4/.tmp-step-00000031 "nv/zerone-swap-$pid-rank0" "conv.tmp.$pid"
touch ck4/.tmp-step-00000031/rank-00000.bin "ck4/latest.tmp.$pid" "nv/zerone-swap-$pid-rank0/optimizer.swp" "conv.tmp.$pid/x"
mkdir -p "nv/zerone-swap-$$-rank0"  # a live process's (this shell's): kept
"$Z" "${train[@]}" "${nvme[@]}" --steps 31 --checkpoint-dir ck4 --resume > r5.log 2>&1 || { bad "resume for the sweep"; cat r5.log; }
"$Z" convert ck4 conv --to zerone > c5.log 2>&1 || { bad "convert for the sweep"; cat c5.log; }
left=$(ls -d ck4/.tmp-step-00000031 "ck4/latest.tmp.$pid" "nv/zerone-swap-$pid-rank0" "conv.tmp.$pid" 2>/dev/null)
if [ -z "$left" ] && [ -d "nv/zerone-swap-$$-rank0" ]; then ok "stale temporaries swept, a live process's kept"
else bad "stale temporaries left: $left"; ls -a ck4 nv; fi
rmdir "nv/zerone-swap-$$-rank0"

# 6. Hostile manifest numbers: every field range-checked, printed as written.
"$Z" "${train[@]}" --steps 2 --checkpoint-dir good > /dev/null 2>&1 || bad "the reference save failed"
edit() {  # edit NAME PYTHON: a copy of good/ whose manifest dict m was changed by PYTHON
  rm -rf "$1"; cp -r good "$1"; rm -f "$1/.zerone-lock"
  python3 - "$1/step-00000002/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(m, open(sys.argv[1], "w"))
PY
}
resume=("$Z" "${train[@]}" --steps 4 --resume)
edit pos1 'm["trainer"]["consumed_samples"] = -5'
check 'trainer state "consumed_samples" -5 is out of range \(expected step..2\^62' "${resume[@]}" --checkpoint-dir pos1
edit pos2 'm["trainer"]["consumed_samples"] = 2**63'
check 'trainer state "consumed_samples" 9223372036854775808 is out of range' "${resume[@]}" --checkpoint-dir pos2
edit pos3 'm["trainer"]["consumed_samples"] = 1e15'
check 'trainer state "consumed_samples" 1e\+15 is out of range' "${resume[@]}" --checkpoint-dir pos3
edit pos4 'm["trainer"]["epoch_samples"] = 0'
check 'trainer state "epoch_samples" 0 is out of range' "${resume[@]}" --checkpoint-dir pos4
edit set1 'm["trainer"]["settings"]["lr"] = 0.5'
check 'trainer state setting "lr" is 0.5, expected a string' "${resume[@]}" --checkpoint-dir set1
# Checkpoints from before positions were counted in samples hold the micro-batch chunk index.
legacy='del m["trainer"]["consumed_samples"]; del m["trainer"]["epoch_samples"]; m["trainer"]["next_chunk"] = '
edit chunk1 "$legacy -5"
check 'trainer state "next_chunk" -5 is out of range \(expected step..step x 2\^32' "${resume[@]}" --checkpoint-dir chunk1
edit chunk2 "$legacy 10**15"
check 'trainer state "next_chunk" 1000000000000000 is out of range' "${resume[@]}" --checkpoint-dir chunk2
edit chunk3 "$legacy -10**18"
check 'trainer state "next_chunk" -1000000000000000000 is out of range' "${resume[@]}" --checkpoint-dir chunk3
edit chunk4 "$legacy 1e15"
check 'trainer state "next_chunk" 1e\+15 is out of range' "${resume[@]}" --checkpoint-dir chunk4
edit optsteps 'm["optimizer"]["steps"] = 1e30'
check '"optimizer" "steps" 1e\+30 is out of range' "${resume[@]}" --checkpoint-dir optsteps
edit mbatch 'm["trainer"]["micro_batch"] = 2**40'
check 'trainer state "micro_batch" 1099511627776 is out of range' "${resume[@]}" --checkpoint-dir mbatch
edit scale 'm["trainer"]["loss_scaler"]["scale"] = -3'
check 'trainer state "scale" -3 is out of range' "${resume[@]}" --checkpoint-dir scale

# 7. A weights-only checkpoint given to --resume names --init; --init converts its precision.
"$Z" convert good wonly --to zerone > /dev/null 2>&1 || bad "convert --to zerone"
mkdir -p wroot && cp -r wonly wroot/step-00000000 && echo step-00000000 > wroot/latest
check "checkpoint 'wroot/step-00000000' holds weights only .*start one from it with --init 'wroot/step-00000000'" \
  "$Z" "${train[@]}" --steps 4 --resume --checkpoint-dir wroot
"$Z" train --model "$model" --data c_train.bin --micro-batch 2 --seq 16 --threads 1 --precision bf16 --steps 1 --init good \
  > i7.log 2>&1 && ok "--init of an fp32 zerone checkpoint at --precision bf16" || { bad "--init of fp32 at bf16"; cat i7.log; }

# 8. A stop signal during validation ends the pass (it has no state to save) and keeps step 2.
python3 -c "
import random
random.seed(1)
w = ['alpha', 'beta', 'gamma', 'delta', 'run', 'lost', 'never', 'checkpoint', 'promise', 'work']
open('big.txt', 'w').write(' '.join(random.choice(w) for _ in range(400000)))"
"$Z" prepare --text big.txt --out b --val-fraction 0.5 > /dev/null || bad "prepare big"
# Step 2 takes milliseconds, its validation (every token of b_val.bin) seconds: the signal sent a
# second after step 1's metrics line arrives during the validation.
"$Z" train --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=64 --data b_train.bin --val-data b_val.bin --micro-batch 4 \
  --seq 64 --threads 1 --precision fp32 --steps 100 --val-every 2 --val-batches 1000000 --metrics m8.jsonl \
  --checkpoint-dir ck8 > s8.log 2>&1 &
p=$!; wait_lines m8.jsonl 1 $p; sleep 1; kill -INT $p; wait $p; rc=$?
if [ $rc = 130 ] && grep -q "stopped by SIGINT during the validation after step 2 of 100" s8.log &&
   [ "$(cat ck8/latest)" = step-00000002 ] && [ "$(wc -l < m8.jsonl)" = 2 ]; then
  ok "SIGINT during validation: stopped at once, step 2 kept"
else
  bad "SIGINT during validation: rc $rc"; cat s8.log
fi

exit $fail
