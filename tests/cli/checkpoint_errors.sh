#!/usr/bin/env bash
# Bad checkpoints (issue 9): each is one clear "zerone: error:" line naming the file, exit 1 on every
# rank, no hang, nothing half-loaded, and the previous checkpoint survives a failed save.
set -u
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
model="gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16"
printf 'A checkpoint is a promise that no work is lost. %.0s' $(seq 1 200) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null || { echo "prepare failed"; exit 1; }
train=(train --model "$model" --data "$d/c_train.bin" --micro-batch 2 --seq 16 --threads 1 --precision fp32)
"${MPI[@]}" -n 2 "$Z" "${train[@]}" --steps 2 --zero-stage 2 --checkpoint-dir "$d/good" >/dev/null 2>&1 \
  || { echo "FAIL: the reference save failed"; exit 1; }
ck="$d/good/step-00000002"
fresh() {  # fresh NAME: a copy of the good checkpoint root to damage
  rm -rf "$d/$1"; cp -r "$d/good" "$d/$1"; echo "$d/$1"
}
resume=("$Z" "${train[@]}" --steps 4 --resume)

# A truncated shard, a flipped byte, a missing rank file: found before or while loading, never trained on.
r=$(fresh trunc); truncate -s 1000 "$r/step-00000002/rank-00001.bin"
check "rank-00001.bin' has 1000 bytes, the manifest records" "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh flip); python3 - "$r/step-00000002/rank-00000.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(5000); b = f.read(1); f.seek(5000); f.write(bytes([b[0] ^ 0x10]))
PY
check "rank-00000.bin' is corrupted: checksum mismatch" "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh missing); rm "$r/step-00000002/rank-00001.bin"
check "is missing its file 'rank-00001.bin'" "${resume[@]}" --checkpoint-dir "$r"
# The same failures at world 2: every rank exits, no hang.
r=$(fresh flip2); python3 - "$r/step-00000002/rank-00001.bin" <<'PY'
import sys
f = open(sys.argv[1], "r+b"); f.seek(100); b = f.read(1); f.seek(100); f.write(bytes([b[0] ^ 1]))
PY
check "checksum mismatch" timeout 120 "${MPI[@]}" -n 2 "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh missing2); rm "$r/step-00000002/rank-00000.bin"
check "is missing its file 'rank-00000.bin'" timeout 120 "${MPI[@]}" -n 2 "${resume[@]}" --checkpoint-dir "$r"

# The manifest: another model, an unknown version, a truncated file, a file list without a rank.
check "holds model gpt2:layers=2,dim=32.* disagrees|disagrees with checkpoint" \
  "$Z" train --model gpt2:layers=3,dim=32,heads=2,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16 \
  --steps 4 --resume --checkpoint-dir "$d/good"
r=$(fresh othermodel); sed -i 's/"model": "gpt2:layers=2,/"model": "gpt2:layers=3,/' "$r/step-00000002/manifest.json"
check "has 4 units, the model 5" "$Z" train --data "$d/c_train.bin" --micro-batch 2 --seq 16 \
  --threads 1 --precision fp32 --steps 4 --resume --checkpoint-dir "$r"
r=$(fresh version); sed -i 's/"version": 1/"version": 99/' "$r/step-00000002/manifest.json"
check "checkpoint format version 99 is not supported" "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh truncmanifest); truncate -s 300 "$r/step-00000002/manifest.json"
check "manifest.json' is not valid JSON" "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh dropped); python3 - "$r/step-00000002/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); m["files"] = m["files"][:1]; json.dump(m, open(sys.argv[1], "w"))
PY
check "covers .* of .* elements|lacks param" "${resume[@]}" --checkpoint-dir "$r"
check "was trained in fp32, this run computes in bf16" "$Z" train --model "$model" --data "$d/c_train.bin" --micro-batch 2 \
  --seq 16 --threads 1 --precision bf16 --steps 4 --resume --checkpoint-dir "$d/good"
# Another micro-batch resumes (the position counts samples, tests/zero/resume_anywhere.sh); so does
# a checkpoint that counts micro-batches (next_chunk), but only at its --seq.
if "$Z" train --model "$model" --data "$d/c_train.bin" --micro-batch 4 --seq 16 --threads 1 --precision fp32 --steps 3 \
     --resume --checkpoint-dir "$(fresh micro4)" > "$d/micro4.log" 2>&1 && grep -q "resumed from" "$d/micro4.log" &&
   ! grep -q "global batch changes" "$d/micro4.log"; then
  echo "ok: world 2 x micro-batch 2 resumes at world 1 x micro-batch 4 (the same global batch, no notice)"
else
  echo "FAIL: another --micro-batch:"; cat "$d/micro4.log"; fail=1
fi

# Directories that are not checkpoints; `latest` naming nothing.
mkdir -p "$d/junk"; echo hi > "$d/junk/notes.txt"
check "holds 'notes.txt' but no 'latest' pointer" "${resume[@]}" --checkpoint-dir "$d/junk"
check "is a directory, but neither a Hugging Face model directory" "$Z" train --init "$d/junk" --data "$d/c_train.bin" --micro-batch 2 --seq 16 --steps 1
r=$(fresh dangling); echo step-00000077 > "$r/latest"
check "names 'step-00000077', which does not exist" "${resume[@]}" --checkpoint-dir "$r"
r=$(fresh badlatest); echo '../../etc' > "$r/latest"
check "expected the name of a checkpoint directory" "${resume[@]}" --checkpoint-dir "$r"
echo x > "$d/afile"
check "--checkpoint-dir '.*afile' is not a directory" "$Z" "${train[@]}" --steps 1 --checkpoint-dir "$d/afile"
check "--checkpoint-every needs --checkpoint-dir" "$Z" "${train[@]}" --steps 1 --checkpoint-every 2
check "--resume needs --checkpoint-dir" "$Z" "${train[@]}" --steps 1 --resume
check "parent '/nonexistent' is not an existing directory" "$Z" "${train[@]}" --steps 1 --checkpoint-dir /nonexistent/ck

# Hostile manifests: numbers out of range or overflowing are refused before anything trains (a
# negative optimizer step count reached AdamW's internal assert; a trainer step beyond int restarted
# the run at step 1; a piece offset near 2^64 wrapped past the size check into a failed pread).
edit() {  # edit NAME PYTHON: a fresh copy whose manifest dict m was changed by PYTHON
  local r; r=$(fresh "$1")
  python3 - "$r/step-00000002/manifest.json" "$2" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(m, open(sys.argv[1], "w"))
PY
  echo "$r"
}
r=$(edit optsteps 'm["optimizer"]["steps"] = -7')
check '"optimizer" "steps" -7 is out of range' "${resume[@]}" --checkpoint-dir "$r"
r=$(edit optsteps2 'm["optimizer"]["steps"] = 2**31 + 5')
check '"optimizer" "steps" 2147483653 is out of range' "${resume[@]}" --checkpoint-dir "$r"
r=$(edit hugestep 'm["trainer"]["step"] = 2**40')
check 'trainer state "step" 1099511627776 is out of range' "${resume[@]}" --checkpoint-dir "$r"
r=$(edit otherstep 'm["trainer"]["step"] = 3')
check "the trainer state is at step 3, the manifest at step 2" "${resume[@]}" --checkpoint-dir "$r"
r=$(edit lradv 'm["trainer"]["lr_schedule_advances"] = -100')
check 'trainer state "lr_schedule_advances" -100 is out of range' "${resume[@]}" --checkpoint-dir "$r"
r=$(edit offset 'm["files"][1]["pieces"][0]["offset"] = 2**64 - 16')
check "piece param \\[6400, \\+6400\\) of unit 0 in 'rank-00001.bin' does not fit the unit or the file" \
  timeout 120 "${MPI[@]}" -n 2 "${resume[@]}" --checkpoint-dir "$r"
# A model spec spelled another way is the same model; one that is no spec names the checkpoint.
r=$(edit spelled 'm["model"] = "gpt2:dim=32,layers=2,heads=2,vocab=257,ctx=16"')
if "${resume[@]}" --checkpoint-dir "$r" > "$d/spelled.log" 2>&1 && grep -q "resumed from" "$d/spelled.log"; then
  echo "ok: a manifest spelling the model spec in another key order resumes"
else
  echo "FAIL: a manifest spelling the model spec in another key order:"; cat "$d/spelled.log"; fail=1
fi
r=$(edit nospec 'm["model"] = "gpt2:banana=1"')
check "holds model 'gpt2:banana=1', which is not a model spec" "${resume[@]}" --checkpoint-dir "$r"
r=$(edit chunks 'm["trainer"]["next_chunk"] = m["trainer"].pop("consumed_samples") // 2; del m["trainer"]["epoch_samples"]')
check "counts its data position in micro-batches of 2 x 16 tokens .*: resume with --seq 16" "$Z" train --model "$model" \
  --data "$d/c_train.bin" --micro-batch 2 --seq 8 --threads 1 --precision fp32 --steps 4 --resume --checkpoint-dir "$r"
r=$(edit fewerstate 'm["optimizer"]["state"] = ["exp_avg"]')
check "holds adamw state \\(exp_avg\\), this run's optimizer is adamw \\(exp_avg, exp_avg_sq\\)" "${resume[@]}" --checkpoint-dir "$r"
# Resumed at --steps: nothing trains and no loss is reported (it said "final loss 0.0000").
"$Z" "${train[@]}" --steps 2 --resume --checkpoint-dir "$d/good" > "$d/done.log" 2>&1
if grep -q "nothing left to train" "$d/done.log" && ! grep -q "final loss" "$d/done.log"; then
  echo "ok: a resume with nothing left to train reports no loss"
else
  echo "FAIL: a resume with nothing left to train:"; cat "$d/done.log"; fail=1
fi
# A dangling symlink as `latest` is a broken pointer, not "no pointer".
r=$(fresh dangling_link); rm "$r/latest"; ln -s nowhere "$r/latest"
check "checkpoint pointer: cannot open '.*dangling_link/latest': No such file" "${resume[@]}" --checkpoint-dir "$r"
# --checkpoint-dir is created at start-up: the same path as --save or --metrics is refused (an
# llm.c --save became a Hugging Face directory inside the checkpoint root).
check "--checkpoint-dir '.*same.bin' and --save '.*same.bin' name the same path" \
  "$Z" "${train[@]}" --steps 1 --checkpoint-dir "$d/same.bin" --save "$d/same.bin"
check "--checkpoint-dir '.*same/' and --metrics '.*same' name the same path" \
  "$Z" "${train[@]}" --steps 1 --checkpoint-dir "$d/same/" --metrics "$d/same"
[ ! -e "$d/same.bin" ] && [ ! -e "$d/same" ] && echo "ok: nothing was created" || { echo "FAIL: a refused run created its outputs"; fail=1; }

# A disk that fills during a save: the error names the file, the previous checkpoint survives and
# --resume continues from it. A 700 KiB tmpfs in a private mount namespace holds one checkpoint of
# this model (~0.45 MiB) but not two.
mkdir -p "$d/full"
if unshare -m true 2>/dev/null; then
  unshare -m bash -c "mount -t tmpfs -o size=700k none '$d/full'
    '$Z' ${train[*]} --steps 6 --checkpoint-dir '$d/full/ck' --checkpoint-every 2 > '$d/full.log' 2>&1; echo \$? > '$d/full.rc'
    ls -a '$d/full/ck' > '$d/full.ls'; cat '$d/full/ck/latest' > '$d/full.latest'
    '$Z' ${train[*]} --steps 2 --checkpoint-dir '$d/full/ck' --resume > '$d/full.resume.log' 2>&1; echo \$? > '$d/full.resume.rc'"
  rc=$(cat "$d/full.rc" 2>/dev/null || echo none)
  if [ "$rc" = 1 ] && grep -qE "^zerone: error: .*(No space left on device)" "$d/full.log" && \
     grep -q "step-0000000" "$d/full.latest" && [ "$(cat "$d/full.resume.rc")" = 0 ] && \
     ! grep -q '^\.tmp-' "$d/full.ls" && \
     grep -q "nothing left to train" "$d/full.resume.log"; then
    echo "ok: disk full during a save: $(grep -o 'zerone: error: .*' "$d/full.log" | head -c 200); latest still $(cat "$d/full.latest"), resumable"
  else
    echo "FAIL: disk full during a save: rc $rc"; cat "$d/full.log" "$d/full.ls" "$d/full.resume.log" 2>/dev/null; fail=1
  fi
else
  echo "FAIL: cannot create a mount namespace for the disk-full case (needs root)"; fail=1
fi
exit $fail
