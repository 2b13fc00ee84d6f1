#!/usr/bin/env bash
# Faults (issue 3): every case ends with a non-zero exit and a clear message in bounded time,
# never a hang (each run is capped at 90 s; a timeout fails the test).
set -u
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Faults are found in the best of systems. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
base=(train --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=32 --data "$d/c_train.bin" --seq 32 --micro-batch 2
      --threads 1 --precision fp32)
fail=0

expect() {  # expect NAME REGEX MAX_SECONDS CMD...
  local name="$1" regex="$2" limit="$3"; shift 3
  local start=$(date +%s)
  timeout 90 "$@" > "$d/$name.out" 2>&1
  local rc=$? elapsed=$(( $(date +%s) - start ))
  if [ $rc -eq 124 ]; then echo "FAIL $name: hung (killed after 90 s)"; fail=1; return; fi
  if [ $rc -eq 0 ]; then echo "FAIL $name: exited 0"; fail=1; return; fi
  if ! grep -qE -- "$regex" "$d/$name.out"; then echo "FAIL $name: output lacks /$regex/:"; tail -n 20 "$d/$name.out"; fail=1; return; fi
  if [ $elapsed -gt "$limit" ]; then echo "FAIL $name: took $elapsed s > $limit s"; fail=1; return; fi
  echo "ok   $name: exit $rc in ${elapsed}s: $(grep -E -m1 -- "$regex" "$d/$name.out")"
}

# Ranks started with different settings: all of them stop at start-up with the same message.
# The message names the setting that differs.
expect config_mismatch "ranks disagree with rank 0 on: --lr \(rank 1\)" 60 \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" --steps 5 --lr 1e-3 : -n 1 "$Z" "${base[@]}" --steps 5 --lr 2e-3
expect stage_mismatch "ranks disagree with rank 0 on: --zero-stage \(rank 1\)" 60 \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" --steps 5 --zero-stage 2 : -n 1 "$Z" "${base[@]}" --steps 5 --zero-stage 3
# Output flags too: --save given to rank 1 alone used to write nothing and exit 0.
expect save_one_rank "ranks disagree with rank 0 on: --save \(rank 1\)" 60 \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" --steps 2 : -n 1 "$Z" "${base[@]}" --steps 2 --save "$d/only1.bin"
[ -e "$d/only1.bin" ] && { echo "FAIL save_one_rank: a file was written"; fail=1; }
expect metrics_one_rank "ranks disagree with rank 0 on: --metrics \(rank 1\)" 60 \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" --steps 2 : -n 1 "$Z" "${base[@]}" --steps 2 --metrics "$d/only1.jsonl"

# A rank that dies mid-training (SIGKILL after 4 s of a long run): the job ends, no hang.
expect rank_killed "(exited on signal|terminated|exited with non-zero|aborted|killed)" 60 \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" --steps 100000 --zero-stage 3 : \
              -n 1 timeout -s KILL 4 "$Z" "${base[@]}" --steps 100000 --zero-stage 3

# An error on one rank only, after the configuration check passed (same flags; the relative data
# path resolves to a truncated file in rank 1's working directory): MPI_Abort ends every rank.
mkdir -p "$d/r0" "$d/r1"
cp "$d/c_train.bin" "$d/r0/data.bin"
head -c 1500 "$d/c_train.bin" > "$d/r1/data.bin"
rel=("${base[@]/$d\/c_train.bin/data.bin}")
expect one_rank_error "rank 1 of 2.*data.bin' is truncated" 60 \
  "${MPI[@]}" -n 1 -wdir "$d/r0" "$Z" "${rel[@]}" --steps 100000 : -n 1 -wdir "$d/r1" "$Z" "${rel[@]}" --steps 100000

# SIGTERM to one rank (as a scheduler or mpiexec would send it): every rank stops at the same step
# boundary (the flag rides on the loss all-reduce), the job exits 143 and says what was kept.
"${MPI[@]}" -n 2 "$Z" "${base[@]}" --steps 100000 --zero-stage 3 --metrics "$d/term.jsonl" > "$d/term.out" 2>&1 &
job=$!
for _ in $(seq 1 100); do [ -s "$d/term.jsonl" ] && break; sleep 0.1; done
kill -TERM "$(pgrep -P $job | tail -n 1)"  # one rank (a child of mpiexec), not the launcher
wait $job; rc=$?
if [ $rc -ne 143 ] || ! grep -qE "stopped by SIGTERM( \(on another rank\))? during step [0-9]+" "$d/term.out"; then
  echo "FAIL sigterm_one_rank: exit $rc"; tail -n 20 "$d/term.out"; fail=1
elif ! python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$d/term.jsonl"; then
  echo "FAIL sigterm_one_rank: metrics file holds a broken line"; fail=1
else
  echo "ok   sigterm_one_rank: exit $rc: $(grep -m1 -E 'stopped by' "$d/term.out")"
fi

# Same flags, different files: each rank's working directory holds another data.bin (complete, just
# different). The ranks compare what they opened and refuse to train on different data.
mkdir -p "$d/w0" "$d/w1"
cp "$d/c_train.bin" "$d/w0/data.bin"
printf 'Another corpus entirely, of another length. %.0s' $(seq 1 200) > "$d/other.txt"
"$Z" prepare --text "$d/other.txt" --out "$d/w1/other" --val-fraction 0 >/dev/null
mv "$d/w1/other_train.bin" "$d/w1/data.bin"
expect different_data "ranks disagree with rank 0 on: the --data tokens \\(rank 1\\)" 60 \
  "${MPI[@]}" -n 1 -wdir "$d/w0" "$Z" "${rel[@]}" --steps 3 : -n 1 -wdir "$d/w1" "$Z" "${rel[@]}" --steps 3

# Bad values.
expect bad_stage "--zero-stage 4 is out of range" 30 "$Z" "${base[@]}" --zero-stage 4
expect bad_bucket "--reduce-bucket-size 3000000000 is out of range" 30 "$Z" "${base[@]}" --reduce-bucket-size 3000000000
expect bad_prefetch "--stage3-prefetch-bucket-size -5 is negative" 30 "$Z" "${base[@]}" --stage3-prefetch-bucket-size -5
printf '{"zero_optimization": {"stage": 2, "reduce_bucket_size": "big"}}' > "$d/z.json"
expect bad_bucket_json "zero_optimization.reduce_bucket_size' is \"big\", expected an integer" 30 "$Z" "${base[@]}" --config "$d/z.json"
exit $fail
