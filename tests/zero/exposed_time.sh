#!/usr/bin/env bash
# Note [Exposed time] (core/profiler.h): where a step's time goes, as the run's summary and
# --profile say it.
#  1. On the simulated device with the optimizer in host memory (stage 2, two micro-steps), the
#     copies between host and device memory are timed as `transfer` (--profile lists it, the
#     summary's "transfers (exposed)" is above 0.0%), beside the compute the host ran itself.
#  2. On the cpu device (device memory is host memory) no copy is a transfer: none listed.
#  3. --profile changes no number: the same losses with it and without.
# (On a GPU, whose kernels run asynchronously, the summary counts the rest of the step as the
# device's compute: tests/zero/device_cuda.sh checks that line there.)
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
common=(train --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=32 --seq 32 --micro-batch 2 --grad-accum 2
        --steps 6 --zero-stage 2 --offload-optimizer cpu --threads 1 --no-shuffle)
fail=0
"$Z" "${common[@]}" --device sim --profile --metrics "$d/sim_profiled.jsonl" > "$d/sim.out" 2>&1 ||
  { cat "$d/sim.out"; echo "FAIL the sim run exited $?"; exit 1; }
"$Z" "${common[@]}" --device sim --metrics "$d/sim.jsonl" > "$d/sim_plain.out" 2>&1 ||
  { cat "$d/sim_plain.out"; echo "FAIL the sim run without --profile exited $?"; exit 1; }
"$Z" "${common[@]}" --device cpu --profile > "$d/cpu.out" 2>&1 || { cat "$d/cpu.out"; echo "FAIL the cpu run exited $?"; exit 1; }

profile_line() { grep -E '^time per step .* ms: ' "$1" || true; }
summary_line() { grep -E '^  time of steps 2\.\.6: ' "$1" || true; }
sim_profile="$(profile_line "$d/sim.out")" sim_summary="$(summary_line "$d/sim.out")"
echo "sim: $sim_profile"
echo "sim: $sim_summary"
grep -Eq ', transfer [0-9.]+% \([0-9.]+ ms/step\)' <<<"$sim_profile" ||
  { echo "FAIL sim --profile lists no transfer"; fail=1; }
grep -Eq '^gemm [0-9.]+%' <<<"${sim_profile#*ms: }" || { echo "FAIL sim --profile lists no gemm first"; fail=1; }
grep -Eq ', other [0-9.]+%' <<<"$sim_profile" || { echo "FAIL sim --profile names its remainder other"; fail=1; }
python3 - "$sim_summary" <<'PY' || fail=1
import re, sys
line = sys.argv[1]
m = re.search(r"transfers \(exposed\) ([0-9.]+)%", line)
if not m or float(m.group(1)) <= 0.0:
    print(f"FAIL the sim summary's transfers are not above 0.0%: {line!r}"); sys.exit(1)
if not line.startswith("  time of steps 2..6: compute ") or ", other " not in line:
    print(f"FAIL the sim summary does not measure compute with an 'other' rest: {line!r}"); sys.exit(1)
shares = [float(x) for x in re.findall(r"([0-9.]+)%", re.sub(r" \([^)]*\)", "", line))]
if abs(sum(shares) - 100.0) > 0.6:
    print(f"FAIL the sim summary's shares add to {sum(shares)}: {line!r}"); sys.exit(1)
print("ok   sim: transfers timed, shares add to 100%")
PY
cpu_profile="$(profile_line "$d/cpu.out")"
echo "cpu: $cpu_profile"
[ -n "$cpu_profile" ] || { echo "FAIL cpu --profile printed no line"; fail=1; }
if grep -q 'transfer' <<<"$cpu_profile"; then echo "FAIL cpu: a copy within host memory timed as a transfer"; fail=1; fi
if cmp -s <(grep -o '"loss":[^,]*' "$d/sim_profiled.jsonl") <(grep -o '"loss":[^,]*' "$d/sim.jsonl"); then
  echo "ok   --profile changes no loss"
else
  echo "FAIL --profile changed the losses"; fail=1
fi
exit $fail
