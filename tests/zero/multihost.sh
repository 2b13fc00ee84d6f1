#!/usr/bin/env bash
# Across hosts (issue 21): two test hosts (scripts/test_hosts.sh: network + UTS namespaces on a
# bridge of their own, nothing leaves the machine), two ranks each.
#   - topology: the start-up names 2 hosts x 2 ranks and which ranks are where;
#   - invariance: stages 0-3 (1-2 with the optimizer on the host, 3 with optimizer and parameters
#     on the host) reproduce the single-rank run (compare_runs.py's f32 tolerances);
#   - a link cut mid-run: host2's cable is pulled after the first checkpoint; the job ends with an
#     error naming the lost connection within the launcher's keepalive time (no --comm-timeout
#     exists yet: Open MPI's daemon keepalive, set by test_hosts.sh, is the bound), and --resume on
#     host1's two ranks continues from the last checkpoint to the end.
# Skips (exit 77) when the machine cannot make network namespaces (not root, no veth/bridge).
set -uo pipefail
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
HOSTS="$here/../../scripts/test_hosts.sh"
if ! why=$(bash "$HOSTS" check); then echo "SKIP: $why"; exit 77; fi
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1
printf 'So long, and thanks for all the fish. %.0s' $(seq 1 400) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
common=(train --model gpt2:layers=2,dim=40,heads=4,vocab=257,ctx=16 --data "$d/c_train.bin" --micro-batch 2 --seq 16
        --lr 1e-3 --weight-decay 0.1 --grad-clip 1.0 --no-shuffle --precision fp32 --threads 1
        --reduce-bucket-size 5000 --allgather-bucket-size 3000 --stage3-prefetch-bucket-size 30000
        --stage3-param-persistence-threshold 1000)
fail=0

# The single-rank reference, outside the test hosts.
"$Z" "${common[@]}" --steps 8 --grad-accum 4 --zero-stage 0 --metrics "$d/w1.jsonl" --save "$d/w1.bin" > "$d/w1.log" 2>&1 \
  || { cat "$d/w1.log"; exit 1; }

# Everything that runs across the hosts, in one set of hosts.
cat > "$d/across.sh" <<'EOF'
set -u
Z="$1" d="$2"; shift 2; common=("$@")
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:2,host2:2 -n 4)
for stage in 0 1 2 3; do
  off=(); [ $stage -ge 1 ] && off=(--offload-optimizer cpu); [ $stage = 3 ] && off+=(--offload-param cpu)
  "${MPI[@]}" "$Z" "${common[@]}" --steps 8 --grad-accum 1 --zero-stage $stage "${off[@]}" \
    --metrics "$d/h2_s$stage.jsonl" --save "$d/h2_s$stage.bin" > "$d/h2_s$stage.log" 2>&1 \
    || { echo "FAIL h2_s$stage: exit $?"; tail -n 20 "$d/h2_s$stage.log"; }
done

# The link cut: a long stage-3 run that checkpoints every 2 steps; once a checkpoint exists,
# host2's link goes down.
"${MPI[@]}" "$Z" "${common[@]}" --grad-accum 1 --zero-stage 3 --steps 100000 --checkpoint-dir "$d/ckpt" \
  --checkpoint-every 2 --keep-last 2 > "$d/cut.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -e "$d/ckpt/latest" ] && break; sleep 0.1; done
[ -e "$d/ckpt/latest" ] || echo "FAIL cut: no checkpoint appeared"
start=$(date +%s.%N)
"$ZERONE_TEST_HOSTS" cut host2
( sleep 90; kill -KILL $job 2>/dev/null ) & watchdog=$!
wait $job; rc=$?
kill $watchdog 2>/dev/null; wait $watchdog 2>/dev/null
echo "cut_rc=$rc cut_seconds=$(echo "$(date +%s.%N) - $start" | bc)" > "$d/cut.result"
"$ZERONE_TEST_HOSTS" restore host2
# The remaining host's two ranks resume.
mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:2 -n 2 "$Z" "${common[@]}" --grad-accum 2 \
  --zero-stage 3 --steps "$(( 10#$(sed 's/^step-//' < "$d/ckpt/latest" 2>/dev/null || echo 0) + 4 ))" \
  --checkpoint-dir "$d/ckpt" --resume --metrics "$d/resume.jsonl" > "$d/resume.log" 2>&1
echo "resume_rc=$?" >> "$d/cut.result"
EOF
ZERONE_TEST_HOSTS="$HOSTS" bash "$HOSTS" run 2 -- bash "$d/across.sh" "$Z" "$d" "${common[@]}"

# Topology at start-up.
if grep -qE "topology: 2 hosts x 2 ranks.*host1: ranks 0-1.*host2: ranks 2-3" "$d/h2_s3.log"; then
  echo "ok   topology: $(grep -m1 topology "$d/h2_s3.log")"
else
  echo "FAIL topology: start-up lacks the 2-host topology line"; grep -m3 zerone "$d/h2_s3.log"; fail=1
fi
runs=(w1)
for stage in 0 1 2 3; do [ -s "$d/h2_s$stage.bin" ] && runs+=("h2_s$stage") || fail=1; done
python3 "$here/compare_runs.py" fp32 "$d" "${runs[@]}" || fail=1

# The cut.
if [ ! -f "$d/cut.result" ]; then echo "FAIL cut: did not run"; fail=1; else
  . "$d/cut.result"
  if [ "$cut_rc" = 0 ] || [ "$cut_rc" = 137 ]; then
    echo "FAIL cut: exit $cut_rc after ${cut_seconds}s (137: killed by the 90 s watchdog)"; tail -n 20 "$d/cut.log"; fail=1
  elif ! grep -qiE "lost communication|connection|unreachable" "$d/cut.log"; then
    echo "FAIL cut: exit $cut_rc but no message about the lost link:"; tail -n 20 "$d/cut.log"; fail=1
  else
    echo "ok   cut: exit $cut_rc after ${cut_seconds}s: $(grep -m1 -iE 'lost communication|connection|unreachable' "$d/cut.log")"
  fi
  if [ "$resume_rc" != 0 ] || ! grep -q "resumed from" "$d/resume.log"; then
    echo "FAIL resume: exit $resume_rc"; tail -n 20 "$d/resume.log"; fail=1
  else
    echo "ok   resume: $(grep -m1 'resumed from' "$d/resume.log"); $(wc -l < "$d/resume.jsonl") steps after it"
  fi
fi
exit $fail
