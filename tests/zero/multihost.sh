#!/usr/bin/env bash
# Across hosts (issue 21): two test hosts (scripts/test_hosts.sh: network + UTS namespaces on a
# bridge of their own, nothing leaves the machine), two ranks each.
#   - topology: the start-up names 2 hosts x 2 ranks and which ranks are where;
#   - invariance: stages 0-3 (1-2 with the optimizer on the host, 3 with optimizer and parameters
#     on the host) reproduce the single-rank run (compare_runs.py's f32 tolerances);
#   - a link cut mid-run: host2's cable is pulled after the first checkpoint; the job (run with
#     --comm-timeout 20) ends within about that bound, with zerone's own error line from rank 0
#     naming ranks 2 and 3 (Note [Collective timeout] in zerone/comm/mpi_communicator.h; the
#     launcher's daemon keepalive is set above the timeout for this run so that zerone, not Open
#     MPI, reports it), and --resume on host1's two ranks continues from the last checkpoint: the
#     cut run's losses up to the checkpoint and the resumed run's after it follow one single-rank
#     run of the same global batch (f32, 1e-5 relative as compare_runs.py).
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
Z="$1" d="$2"; shift 2; common=("$@"); failed=0
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:2,host2:2 -n 4)
for stage in 0 1 2 3; do
  off=(); [ $stage -ge 1 ] && off=(--offload-optimizer cpu); [ $stage = 3 ] && off+=(--offload-param cpu)
  "${MPI[@]}" "$Z" "${common[@]}" --steps 8 --grad-accum 1 --zero-stage $stage "${off[@]}" \
    --metrics "$d/h2_s$stage.jsonl" --save "$d/h2_s$stage.bin" > "$d/h2_s$stage.log" 2>&1 \
    || { echo "FAIL h2_s$stage: exit $?"; tail -n 20 "$d/h2_s$stage.log"; failed=1; }
done

# The link cut: a long stage-3 run that checkpoints every 2 steps; once a checkpoint exists,
# host2's link goes down. The daemons' keepalive (test_hosts.sh: 2 s) is raised above
# --comm-timeout for this run: the launcher must not end the job before zerone names the ranks.
# Once rank 0 has, the launcher (in this head namespace) sends host2's daemon the abort, which
# the cut link never acknowledges: TCP gives that up after tcp_retries2 retransmissions (~6 s at 4
# instead of the default 15, ~15 minutes), a setting of this namespace only, not the ranks'.
sysctl -qw net.ipv4.tcp_retries2=4 || { echo "FAIL cut: cannot set tcp_retries2 in the head namespace"; failed=1; }
"${MPI[@]}" --mca oob_tcp_keepalive_time 60 "$Z" "${common[@]}" --grad-accum 1 --zero-stage 3 --steps 100000 \
  --comm-timeout 20 --checkpoint-dir "$d/ckpt" --checkpoint-every 2 --keep-last 2 --metrics "$d/cut.jsonl" \
  > "$d/cut.log" 2>&1 &
job=$!
for _ in $(seq 1 600); do [ -e "$d/ckpt/latest" ] && break; sleep 0.1; done
[ -e "$d/ckpt/latest" ] || { echo "FAIL cut: no checkpoint appeared"; failed=1; }
start=$(date +%s.%N)
"$ZERONE_TEST_HOSTS" cut host2 || { echo "FAIL cut: test_hosts.sh cut host2: exit $?"; failed=1; }
( sleep 120; kill -KILL $job 2>/dev/null ) & watchdog=$!
# When rank 0's error line arrives (zerone's part); the job's end after it is the launcher's abort.
( until grep -qE "^zerone: error \(rank 0 of 4\)" "$d/cut.log"; do sleep 0.2; done; date +%s.%N > "$d/error_at" ) &
poller=$!
wait $job; rc=$?
kill $watchdog 2>/dev/null; wait $watchdog 2>/dev/null
kill $poller 2>/dev/null; wait $poller 2>/dev/null
error_seconds=-1; [ -s "$d/error_at" ] && error_seconds=$(echo "$(cat "$d/error_at") - $start" | bc)
echo "cut_rc=$rc cut_seconds=$(echo "$(date +%s.%N) - $start" | bc) error_seconds=$error_seconds" > "$d/cut.result"
"$ZERONE_TEST_HOSTS" restore host2 || { echo "FAIL cut: test_hosts.sh restore host2: exit $?"; failed=1; }
# The remaining host's two ranks resume (grad-accum 2: the same global batch of 8 sequences).
resumed_from=$(( 10#$(sed 's/^step-//' < "$d/ckpt/latest" 2>/dev/null || echo 0) ))
mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:2 -n 2 "$Z" "${common[@]}" --grad-accum 2 \
  --zero-stage 3 --steps $((resumed_from + 4)) \
  --checkpoint-dir "$d/ckpt" --resume --metrics "$d/resume.jsonl" > "$d/resume.log" 2>&1
echo "resume_rc=$? resumed_from=$resumed_from" >> "$d/cut.result"
exit $failed
EOF
ZERONE_TEST_HOSTS="$HOSTS" bash "$HOSTS" run 2 -- bash "$d/across.sh" "$Z" "$d" "${common[@]}" \
  || { echo "FAIL test_hosts.sh run: exit $?"; fail=1; }

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
  # Rank 0 names both of host2's ranks (they never arrived, or stopped answering) with the timeout.
  line=$(grep -m1 -E "^zerone: error \(rank 0 of 4\): ranks 2, 3 (did not arrive|stopped answering|did not arrive \([0-9]\) or stopped answering \([0-9]\)) in .* within --comm-timeout 20 s; rank 2: .*; rank 3: " "$d/cut.log")
  if [ "$cut_rc" = 0 ] || [ "$cut_rc" = 137 ]; then
    echo "FAIL cut: exit $cut_rc after ${cut_seconds}s (137: killed by the 120 s watchdog)"; tail -n 20 "$d/cut.log"; fail=1
  elif [ -z "$line" ]; then
    echo "FAIL cut: exit $cut_rc after ${cut_seconds}s without rank 0's line naming ranks 2, 3:"; tail -n 20 "$d/cut.log"; fail=1
  elif [ "$(echo "$error_seconds > 20 + 10" | bc)" = 1 ]; then
    # The collective in flight when the link went down times out 20 s after it began, so at most
    # 20 s after the cut, plus rank 0's ping of the others (1 s); the collectives queued behind it
    # fail at once (Note [A failed worker fails fast]), so a second timeout in a row (40 s) is a
    # failure. The job's end after the line is Open MPI's abort over the cut link (seen 8-48 s):
    # bounded by the 120 s watchdog above.
    echo "FAIL cut: rank 0's error came ${error_seconds}s after the cut, beyond --comm-timeout 20 s + 10 s: $line"; fail=1
  else
    echo "ok   cut: rank 0's error ${error_seconds}s after the cut (--comm-timeout 20), the job's end ${cut_seconds}s: $line"
  fi
  if [ "$resume_rc" != 0 ] || ! grep -q "resumed from" "$d/resume.log"; then
    echo "FAIL resume: exit $resume_rc"; tail -n 20 "$d/resume.log"; fail=1
  else
    # The reference: one rank, the same global batch, uninterrupted to the resumed run's end.
    "$Z" "${common[@]}" --steps $((resumed_from + 4)) --grad-accum 4 --zero-stage 0 --metrics "$d/ref.jsonl" \
      > "$d/ref.log" 2>&1 || { cat "$d/ref.log"; exit 1; }
    python3 - "$d" "$resumed_from" <<'PY' || fail=1
import json, sys
d, k = sys.argv[1], int(sys.argv[2])
def losses(name): return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{name}.jsonl"))}
ref, cut, res = losses("ref"), losses("cut"), losses("resume")
want = list(range(k + 1, k + 5))
ok = k >= 2 and sorted(res) == want and all(s in cut for s in range(1, k + 1))
bad = [(s, got[s], ref[s]) for got, steps in ((cut, range(1, k + 1)), (res, want)) for s in steps
       if s in got and abs(got[s] - ref[s]) > 1e-5 * abs(ref[s])]
if ok and not bad:
    print(f"ok   resume: from step {k}, steps {want[0]}-{want[-1]} on host1's 2 ranks continue the cut run's "
          f"trajectory (steps 1-{k}): every loss within 1e-5 of one uninterrupted rank "
          f"(step {k} {cut[k]:.6f}, step {k + 1} {res[k + 1]:.6f})")
    sys.exit(0)
print(f"FAIL resume from step {k}: resumed steps {sorted(res)} (want {want}), cut run steps {sorted(cut)[:3]}..; "
      f"(step, loss, reference) beyond 1e-5: {bad[:5]}")
sys.exit(1)
PY
  fi
fi
exit $fail
