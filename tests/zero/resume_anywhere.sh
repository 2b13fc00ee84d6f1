#!/usr/bin/env bash
# Resume anywhere (issue 17 §3): the data position is counted in samples (Note [Samples] in
# train/batch_source.h), so a checkpoint resumes at any world size, micro-batch and accumulation.
#   1. World 2 x micro-batch 3 and world 3 x micro-batch 2 (global batch 12, shuffled data) train
#      the same trajectory from step 1 (losses within 1e-5).
#   2. A checkpoint of world 2 x micro-batch 3 at step 3, resumed at world 3 x micro-batch 2,
#      continues the uninterrupted run within 1e-5 per step, with no notice.
#   3. Another global batch: a notice naming it, and it trains on.
#   4. Settings that change results (Note [Settings a resume compares]): one notice per changed
#      setting with the old and new value; another --seq is a notice; another optimizer or seed an error.
#   5. A checkpoint from before positions were counted in samples (next_chunk) resumes where it was.
#   6. Image data (shuffled epochs, dropout keyed by the sample's place): world 2 x micro-batch 3 ->
#      world 3 x micro-batch 2 across an epoch end within 1e-5; another global batch (another
#      epoch length) keeps the position within its epoch, with a notice.
set -euo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Whether I shall turn out to be the hero of my own life, or whether that station will be held by anybody else. %.0s' \
  $(seq 1 200) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --weight-decay 0.1
        --warmup 2 --lr-schedule cosine --precision fp32 --threads 1 --zero-stage 2)
fail=0
run() {  # [LR= CLIP= STEPS= SEQ=] run NAME WORLD MICRO ACCUM ARGS...: metrics NAME.jsonl, log NAME.log
  local name="$1" world="$2" micro="$3" accum="$4"; shift 4
  "${MPI[@]}" -n "$world" "$Z" "${common[@]}" --lr "${LR:-1e-3}" --grad-clip "${CLIP:-1.0}" --steps "${STEPS:-6}" \
    --seq "${SEQ:-16}" --micro-batch "$micro" --grad-accum "$accum" "$@" \
    --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 || { echo "FAIL $name:"; cat "$d/$name.log"; exit 1; }
}
stopped_at() {  # stopped_at REF STEP NEWROOT: a root holding only REF's checkpoint of STEP
  mkdir -p "$3"
  cp -r "$d/$1.ck/$(printf 'step-%08d' "$2")" "$3/"
  printf 'step-%08d\n' "$2" > "$3/latest"
}
close() {  # [LAST=] close REF NAME FIRST: losses of steps FIRST..LAST (6) within 1e-5 relative
  if python3 - "$d" "$1" "$2" "$3" "${LAST:-6}" <<'PY'
import json, sys
d, ref, name, first, last = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
def losses(n): return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{n}.jsonl")) if r["step"] >= first}
a, b = losses(ref), losses(name)
assert sorted(a) == sorted(b) == list(range(first, last + 1)), (sorted(a), sorted(b))
worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in a)
print(f"     max relative loss difference {worst:.2e} over steps {first}..{last}")
sys.exit(0 if worst <= 1e-5 else 1)
PY
  then echo "ok   $2: within 1e-5 of $1 from step $3"; else echo "FAIL $2: not within 1e-5 of $1"; fail=1; fi
}
has() {  # has NAME TEXT: NAME.log holds TEXT (a fixed string)
  if grep -qF -- "$2" "$d/$1.log"; then echo "ok   $1: says \"$2\""; else echo "FAIL $1: lacks \"$2\":"; cat "$d/$1.log"; fail=1; fi
}
lacks() {  # lacks NAME TEXT
  if grep -qF -- "$2" "$d/$1.log"; then echo "FAIL $1: says \"$2\":"; cat "$d/$1.log"; fail=1; else echo "ok   $1: no \"$2\""; fi
}

# 1. Another split of the same global batch from step 1.
run w2m3 2 3 2 --checkpoint-dir "$d/w2m3.ck" --checkpoint-every 3
run w3m2 3 2 2
close w2m3 w3m2 1

# 2. World 2 x micro 3 -> world 3 x micro 2 from the step-3 checkpoint.
stopped_at w2m3 3 "$d/to_w3m2.ck"
run to_w3m2 3 2 2 --checkpoint-dir "$d/to_w3m2.ck" --resume
has to_w3m2 "resumed from"
lacks to_w3m2 "notice"
close w2m3 to_w3m2 4
# ... and to world 1 x micro 4 x accum 3.
stopped_at w2m3 3 "$d/to_w1m4.ck"
run to_w1m4 1 4 3 --checkpoint-dir "$d/to_w1m4.ck" --resume
close w2m3 to_w1m4 4

# 3. Another global batch (4 instead of 12): a notice, and steps 4..6 train.
stopped_at w2m3 3 "$d/g4.ck"
run g4 1 2 2 --checkpoint-dir "$d/g4.ck" --resume
has g4 "zerone: notice: the global batch changes from 12 to 4 sequences at step 4"
python3 -c 'import json,sys; s=[json.loads(l)["step"] for l in open(sys.argv[1])]; sys.exit(s != [4, 5, 6])' "$d/g4.jsonl" \
  && echo "ok   g4: trained steps 4..6" || { echo "FAIL g4: did not train steps 4..6"; fail=1; }

# 4. Settings that change results.
stopped_at w2m3 3 "$d/lr.ck"
LR=2e-3 CLIP=0.5 run lr 2 3 2 --checkpoint-dir "$d/lr.ck" --resume --beta2 0.99
has lr "zerone: notice: --lr changes from 0.001 to 0.002 at step 4"
has lr "zerone: notice: --beta2 changes from 0.999 to 0.99 at step 4"
has lr "zerone: notice: --grad-clip changes from 1 to 0.5 at step 4"
[ "$(grep -c 'changes from' "$d/lr.log")" = 3 ] && echo "ok   lr: one line per changed setting" \
  || { echo "FAIL lr: not one notice per changed setting:"; cat "$d/lr.log"; fail=1; }
# A setting given by a config key is named by its key.
printf '{"optimizer": {"type": "AdamW", "params": {"eps": 1e-6}}}\n' > "$d/ds.json"
stopped_at w2m3 3 "$d/cfg.ck"
run cfg 2 3 2 --checkpoint-dir "$d/cfg.ck" --resume --config "$d/ds.json"
has cfg "zerone: notice: key 'optimizer.params.eps' changes from 1e-08 to 1e-06 at step 4"
stopped_at w2m3 3 "$d/steps.ck"
STEPS=8 run steps 2 3 2 --checkpoint-dir "$d/steps.ck" --resume
has steps "zerone: notice: --steps changes from 6 to 8: the cosine schedule decays over --steps"
stopped_at w2m3 3 "$d/seq.ck"
SEQ=8 run seq 2 3 2 --checkpoint-dir "$d/seq.ck" --resume
has seq "zerone: notice: --seq changes from 16 to 8 at step 4: the data position is kept in tokens"
stopped_at w2m3 3 "$d/sgd.ck"
if "${MPI[@]}" -n 2 "$Z" "${common[@]}" --lr 1e-3 --steps 6 --seq 16 --micro-batch 3 --grad-accum 2 \
     --checkpoint-dir "$d/sgd.ck" --resume --optimizer sgd --momentum 0.9 > "$d/sgd.log" 2>&1; then
  echo "FAIL sgd: resumed adamw state with --optimizer sgd"; fail=1
else
  has sgd "checkpoint '$d/sgd.ck/step-00000003' holds adamw state (exp_avg, exp_avg_sq), this run's optimizer is sgd"
fi

# 5. A checkpoint written before positions were counted in samples: next_chunk, no settings.
run old 2 3 2 --no-shuffle --checkpoint-dir "$d/old.ck" --checkpoint-every 3
stopped_at old 3 "$d/old_resumed.ck"
python3 - "$d/old_resumed.ck/step-00000003/manifest.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1])); t = m["trainer"]
t["next_chunk"] = t.pop("consumed_samples") // t["micro_batch"]; del t["epoch_samples"]; del t["settings"]
json.dump(m, open(sys.argv[1], "w"))
PY
run old_resumed 3 2 2 --no-shuffle --checkpoint-dir "$d/old_resumed.ck" --resume
has old_resumed "does not record the settings it was trained with"
close old old_resumed 4

# 6. Image data: 60 samples, 5 steps of 12 per epoch; the checkpoint of step 4 resumes across the epoch end.
python3 "$here/../cli/make_idx.py" "$d/img" 60 20 12 12 5
image=(train --model "seq:in=1x12x12,conv=4:k3:p1,maxpool=2,relu,flatten,dropout=0.3,linear=16,relu,linear=5"
       --data "$d/img" --optimizer sgd --lr 0.015 --momentum 0.9 --steps 8 --precision fp32 --threads 1 --zero-stage 1)
irun() {  # irun NAME WORLD MICRO ACCUM ARGS...
  local name="$1" world="$2" micro="$3" accum="$4"; shift 4
  "${MPI[@]}" -n "$world" "$Z" "${image[@]}" --micro-batch "$micro" --grad-accum "$accum" "$@" \
    --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 || { echo "FAIL $name:"; cat "$d/$name.log"; exit 1; }
}
irun img_w2m3 2 3 2 --checkpoint-dir "$d/img_w2m3.ck" --checkpoint-every 4
stopped_at img_w2m3 4 "$d/img_to_w3m2.ck"
irun img_to_w3m2 3 2 2 --checkpoint-dir "$d/img_to_w3m2.ck" --resume
lacks img_to_w3m2 "notice"
LAST=8 close img_w2m3 img_to_w3m2 5
stopped_at img_w2m3 4 "$d/img_g8.ck"
irun img_g8 1 4 2 --checkpoint-dir "$d/img_g8.ck" --resume
has img_g8 "zerone: notice: an epoch of the training data is 56 samples, it was 60 when the checkpoint was saved"
has img_g8 "the global batch changes from 12 to 8 sequences at step 5"
exit $fail
