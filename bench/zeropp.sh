#!/usr/bin/env bash
# ZeRO++ across hosts (issue 21; docs/BENCHMARKS.md "ZeRO++"): two test hosts (scripts/test_hosts.sh)
# linked at RATE (default 1gbit, tc tbf), one rank each (or RANKS per host), GPT layers=4,dim=384,
# bf16. Per configuration: the median step time of steps 2..N and the bytes per step per rank
# (metrics comm_bytes_intra / _inter, rank 0), as ratios to stage 0 and to plain stage 3 measured in
# the same run.   usage: bench/zeropp.sh build/zerone [RATE] [RANKS] [STEPS]
set -euo pipefail
Z="$(readlink -f "$1")"; RATE="${2:-1gbit}"; RANKS="${3:-1}"; STEPS="${4:-8}"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
printf 'The ships hung in the sky in much the same way that bricks do not. %.0s' $(seq 1 3000) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
hpz=(); [ "$RANKS" -gt 1 ] && hpz=(--hpz-partition-size "$RANKS")
cat > "$d/runs.sh" <<INNER
set -e
run() { local name="\$1"; shift
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -H host1:$RANKS,host2:$RANKS -n $((2 * RANKS)) "$Z" train \
    --model gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128 --data "$d/c_train.bin" --micro-batch 4 --seq 128 \
    --steps $STEPS --precision bf16 --threads $((2 / RANKS > 0 ? 2 / RANKS : 1)) --metrics "$d/\$name.jsonl" "\$@" > "$d/\$name.log" 2>&1
}
run stage0 --zero-stage 0
run stage3 --zero-stage 3
[ $RANKS -gt 1 ] && run hpz --zero-stage 3 ${hpz[*]}
run qwz --zero-stage 3 --quantized-weights
run qgz --zero-stage 3 --quantized-gradients 8
run all --zero-stage 3 ${hpz[*]} --quantized-weights --quantized-gradients 8
run all4 --zero-stage 3 ${hpz[*]} --quantized-weights --quantized-gradients 4
INNER
bash "$here/../scripts/test_hosts.sh" run 2 --rate "$RATE" -- bash "$d/runs.sh"
python3 - "$d" "$RATE" "$RANKS" <<'PY'
import json, os, statistics, sys
d, rate, ranks = sys.argv[1:]
def load(n):
    L = [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
    return statistics.median(l["ms"] for l in L[1:]), L[-1]["comm_bytes_intra"], L[-1]["comm_bytes_inter"], L[-1]["loss"]
names = [n for n in ("stage0", "stage3", "hpz", "qwz", "qgz", "all", "all4") if os.path.exists(f"{d}/{n}.jsonl")]
r = {n: load(n) for n in names}
print(f"2 hosts x {ranks} rank(s), {rate} links, GPT layers=4,dim=384 bf16, micro-batch 4 x seq 128")
print("| config | ms/step | vs stage 0 | inter-host MB/step/rank | vs stage 3 | intra-host MB/step/rank | loss at last step |")
print("|---|---|---|---|---|---|---|")
for n in names:
    ms, intra, inter, loss = r[n]
    print(f"| {n} | {ms:.0f} | {ms / r['stage0'][0]:.2f}x | {inter / 1e6:.2f} | {r['stage3'][2] / inter:.2f}x less | {intra / 1e6:.2f} | {loss:.4f} |")
PY
