#!/usr/bin/env bash
# ZeRO++ across hosts (issue 21; docs/BENCHMARKS.md "ZeRO++"): two test hosts (scripts/test_hosts.sh)
# linked at RATE (default 1gbit, tc tbf), RANKS ranks each (default 1), ROUNDS rounds (default 1)
# in which every configuration runs once, in turn (stage0 stage3 ... stage0 stage3 ...), so that a
# machine whose speed drifts (other work on it) shifts all of a round alike. Per run: the median step
# time of steps 2..STEPS and the bytes per step per rank (metrics comm_bytes_intra / _inter, rank 0,
# exact). Per configuration: the step time as a ratio to stage 0 of the same round (min and median
# over rounds) and the inter-host bytes as a ratio to plain stage 3.
#   usage: bench/zeropp.sh build/zerone [RATE] [RANKS] [STEPS] [ROUNDS]
#   environment: ZEROPP_MODEL (default gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128),
#                ZEROPP_MICRO_BATCH (4), ZEROPP_SEQ (128), ZEROPP_PRECISION (bf16),
#                ZEROPP_THREADS (threads per rank; default 2 / RANKS, at least 1),
#                ZEROPP_CONFIGS (default: stage0 stage3 [hpz] qwz qgz all all4; hpz and all's hpZ
#                only with RANKS > 1; qwz_qgz is qwZ + qgZ int8 without hpZ)
set -euo pipefail
Z="$(readlink -f "$1")"; RATE="${2:-1gbit}"; RANKS="${3:-1}"; STEPS="${4:-8}"; ROUNDS="${5:-1}"
MODEL="${ZEROPP_MODEL:-gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128}"
THREADS="${ZEROPP_THREADS:-$(( 2 / RANKS > 0 ? 2 / RANKS : 1 ))}"
MB="${ZEROPP_MICRO_BATCH:-4}"; SEQ="${ZEROPP_SEQ:-128}"; PRECISION="${ZEROPP_PRECISION:-bf16}"
default_configs="stage0 stage3 $(if [ "$RANKS" -gt 1 ]; then echo hpz; fi) qwz qgz all all4"
CONFIGS="${ZEROPP_CONFIGS:-$default_configs}"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
printf 'The ships hung in the sky in much the same way that bricks do not. %.0s' $(seq 1 3000) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
hpz=""; [ "$RANKS" -gt 1 ] && hpz="--hpz-partition-size $RANKS"
cat > "$d/runs.sh" <<INNER
set -e
flags() {
  case "\$1" in
    stage0) echo --zero-stage 0 ;;
    stage3) echo --zero-stage 3 ;;
    hpz) echo --zero-stage 3 $hpz ;;
    qwz) echo --zero-stage 3 --quantized-weights ;;
    qgz) echo --zero-stage 3 --quantized-gradients 8 ;;
    qwz_qgz) echo --zero-stage 3 --quantized-weights --quantized-gradients 8 ;;
    all) echo --zero-stage 3 $hpz --quantized-weights --quantized-gradients 8 ;;
    all4) echo --zero-stage 3 $hpz --quantized-weights --quantized-gradients 4 ;;
    *) echo "bench/zeropp.sh: unknown configuration \$1" >&2; exit 2 ;;
  esac
}
for round in \$(seq 1 $ROUNDS); do
  for c in $CONFIGS; do
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:$RANKS,host2:$RANKS -n $((2 * RANKS)) "$Z" train \
      --model $MODEL --data "$d/c_train.bin" --micro-batch $MB --seq $SEQ --steps $STEPS --precision $PRECISION \
      --threads $THREADS --metrics "$d/\${c}_\$round.jsonl" \$(flags \$c) > "$d/\${c}_\$round.log" 2>&1 \
      || { echo "bench/zeropp.sh: \$c (round \$round) failed:"; tail -n 5 "$d/\${c}_\$round.log"; exit 1; }
  done
done
INNER
bash "$here/../scripts/test_hosts.sh" run 2 --rate "$RATE" -- bash "$d/runs.sh"
THREADS=$THREADS python3 - "$d" "$RATE" "$RANKS" "$ROUNDS" "$MODEL" "$MB" "$SEQ" "$PRECISION" "$STEPS" $CONFIGS <<'PY'
import json, os, statistics, sys
d, rate, ranks, rounds, model, mb, seq, precision, steps, *names = sys.argv[1:]
rounds = int(rounds)
def load(n, r):
    L = [json.loads(l) for l in open(f"{d}/{n}_{r}.jsonl")]
    return statistics.median(l["ms"] for l in L[1:]), L[-1]["comm_bytes_intra"], L[-1]["comm_bytes_inter"], L[-1]["loss"]
r = {(n, i): load(n, i) for n in names for i in range(1, rounds + 1)}
print(f"2 hosts x {ranks} rank(s), {rate} links, {model} {precision}, micro-batch {mb} x seq {seq}, "
      f"{os.environ.get('THREADS')} thread(s) per rank, "
      f"{steps} steps, {rounds} round(s)")
print("| config | ms/step (median over rounds) | vs stage 0, min | vs stage 0, median | inter-host MB/step/rank | vs stage 3 | intra-host MB/step/rank | loss at last step |")
print("|---|---|---|---|---|---|---|---|")
for n in names:
    ms = [r[(n, i)][0] for i in range(1, rounds + 1)]
    ratios = [r[(n, i)][0] / r[("stage0", i)][0] for i in range(1, rounds + 1)] if "stage0" in names else [float("nan")]
    _, intra, inter, loss = r[(n, 1)]
    vs3 = f"{r[('stage3', 1)][2] / inter:.2f}x less" if "stage3" in names and inter else ""
    print(f"| {n} | {statistics.median(ms):.0f} | {min(ratios):.2f}x | {statistics.median(ratios):.2f}x | {inter / 1e6:.2f} | "
          f"{vs3} | {intra / 1e6:.2f} | {loss:.4f} |")
print("per round, ms/step: " + "; ".join(f"{n} " + " ".join(f"{r[(n, i)][0]:.0f}" for i in range(1, rounds + 1)) for n in names))
PY
