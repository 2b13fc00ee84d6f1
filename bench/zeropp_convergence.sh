#!/usr/bin/env bash
# ZeRO++ convergence (issue 21; docs/BENCHMARKS.md "ZeRO++"): exact stage 3 against qwZ + qgZ (int8,
# or BITS) at world 2 on this host (one all-to-all over the world: the numbers of 2 hosts x 1 rank),
# on the built-in Markov corpus: the default run (zerone train's defaults) and a W1-shape run
# (micro-batch 4, seq 64; MODEL, default a 6-layer, 384-wide GPT of GPT-2 124M's aspect: 64 wide per
# layer, 64 per head). Deterministic: the numbers do not depend on the machine's load.
# Prints the loss curves at a few steps and the final validation losses, with their relative gap.
#   usage: bench/zeropp_convergence.sh build/zerone [BITS] [MODEL] [W1_STEPS (default 300)]
#   ZEROPP_OUT=DIR keeps the metrics files there (and reuses finished ones: a run is repeated only
#   when its file lacks the final step).
set -euo pipefail
Z="$(readlink -f "$1")"; BITS="${2:-8}"; MODEL="${3:-gpt2:layers=6,dim=384,heads=6,vocab=257,ctx=64}"
W1_STEPS="${4:-300}"
if [ -n "${ZEROPP_OUT:-}" ]; then d="$ZEROPP_OUT"; mkdir -p "$d"; else d=$(mktemp -d); trap 'rm -rf "$d"' EXIT; fi
export OMPI_MCA_mpi_yield_when_idle=1
run() {  # run NAME STEPS ARGS...
  local name="$1" steps="$2"; shift 2
  [ -s "$d/$name.jsonl" ] && [ "$(wc -l < "$d/$name.jsonl")" -ge "$steps" ] && return 0
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 "$Z" train --threads 1 --zero-stage 3 \
    --metrics "$d/$name.jsonl" "$@" > "$d/$name.log" 2>&1 || { echo "$name failed:"; tail -n 5 "$d/$name.log"; exit 1; }
}
q=(--quantized-weights --quantized-gradients "$BITS")
run default_exact 300
run default_q 300 "${q[@]}"
run w1_exact "$W1_STEPS" --model "$MODEL" --micro-batch 4 --seq 64 --steps "$W1_STEPS"
run w1_q "$W1_STEPS" --model "$MODEL" --micro-batch 4 --seq 64 --steps "$W1_STEPS" "${q[@]}"
python3 - "$d" "$BITS" "$MODEL" "$W1_STEPS" <<'PY'
import json, sys
d, bits, model, w1_steps = sys.argv[1:]
def load(n): return [json.loads(l) for l in open(f"{d}/{n}.jsonl")]
for run, title in (("default", "default run (gpt2:layers=4,dim=256,heads=4, micro-batch 16 x seq 64 per rank, 300 steps)"),
                   ("w1", f"W1 shape ({model}, micro-batch 4 x seq 64 per rank, {w1_steps} steps)")):
    a, b = load(f"{run}_exact"), load(f"{run}_q")
    steps = sorted({s for s in (1, 2, 5, 10, 20, 30, 50, 75, 100, 150, 200, 250, 300) if s <= len(a)} | {len(a)})
    va, vb = a[-1]["val_loss"], b[-1]["val_loss"]
    print(f"\n{title}, world 2:")
    print("| step | " + " | ".join(map(str, steps)) + " | final validation |")
    print("|---" * (len(steps) + 2) + "|")
    print("| stage 3 exact | " + " | ".join(f"{a[s - 1]['loss']:.4f}" for s in steps) + f" | **{va:.4f}** |")
    print(f"| qwZ + qgZ int{bits} | " + " | ".join(f"{b[s - 1]['loss']:.4f}" for s in steps) + f" | **{vb:.4f}** |")
    print(f"final validation loss: qwZ + qgZ {vb:.4f} vs exact {va:.4f}: {100 * (vb - va) / va:+.2f}% "
          f"({'within' if abs(vb - va) / va <= 0.01 else 'NOT within'} 1%)")
PY
