#!/usr/bin/env bash
# W3: ZeRO scaling. A small GPT at world 2 and 4 (one core/thread per rank; on a 2-core machine
# world 4 is oversubscribed, so its absolute times are not meaningful, the stage ratios are),
# stages 0-3: mean step time relative to stage 0 at the same world size, the exposed communication
# (time the training thread waits on or launches collectives, from --profile), and per-rank
# model-state memory from the ledger beside the ZeRO formula (zerone estimate).
#   bash bench/w3_zero_scaling.sh [STEPS]
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$(readlink -f build/zerone)
steps=${1:-12}
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1
$Z prepare --text /usr/share/common-licenses/GPL-3 --out "$d/c" --val-fraction 0 >/dev/null
model=${W3_MODEL:-gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128}
printf "%-6s %-6s %10s %9s %10s %14s %14s %12s\n" world stage ms/step vs_stage0 exposed model_state_MiB formula_MiB peak_rss_MiB
for world in 2 4; do
  base=""
  for stage in 0 1 2 3; do
    mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $world $Z train --model $model \
      --data "$d/c_train.bin" --micro-batch 4 --seq 128 --steps $steps --threads 1 --precision bf16 \
      --zero-stage $stage --stage3-prefetch-bucket-size 2000000 --profile --metrics "$d/m.jsonl" > "$d/log" 2>&1
    ms=$(python3 -c "import json; v=[json.loads(l)['ms'] for l in open('$d/m.jsonl')][2:]; print(f'{sum(v)/len(v):.1f}')")
    exposed=$(grep -o 'comm [0-9.]*%' "$d/log" | head -1 | awk '{print $2}')
    state=$(python3 -c "import json; m=json.loads(open('$d/m.jsonl').readlines()[-1])['mem']; print(sum(m.get('host.'+k,0) for k in ('param','grad','master','optim')))")
    rss=$(python3 -c "import json; print(json.loads(open('$d/m.jsonl').readlines()[-1])['mem']['peak_rss'] / 2**20)")
    formula=$($Z estimate --model $model --world $world --zero-stage $stage --precision bf16 --json | python3 -c "import json,sys; print(json.load(sys.stdin)['stages'][0]['model_state'])")
    [ -n "$base" ] || base=$ms
    printf "%-6s %-6s %10s %9s %10s %14.2f %14.2f %12.1f\n" $world $stage $ms $(python3 -c "print(f'{$ms/$base:.3f}x')") "${exposed:-0%}" \
      $(python3 -c "print($state/2**20)") $(python3 -c "print($formula/2**20)") $rss
  done
done
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  timeout 600 /usr/bin/python3 bench/pytorch_zero_memory.py 2
fi
