#!/usr/bin/env bash
# W3: ZeRO scaling. A small GPT at world 2 and 4 (one core/thread per rank; on a 2-core machine
# world 4 is oversubscribed, so its absolute times are not meaningful, the stage ratios are),
# stages 0-3: mean step time relative to stage 0 at the same world size, the exposed communication
# (time the training thread waits on or launches collectives, from --profile), and per-rank
# model-state memory from the ledger beside the ZeRO formula (zerone estimate), the pooled working
# set beside its bound, and peak RSS.
#   bash bench/w3_zero_scaling.sh [STEPS] [REPS]
# Each (world, stage) runs REPS times (default 3), interleaved so that a slow spell of a shared
# machine hits every stage alike; the table gives the median run (by step time).
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$(readlink -f build/zerone)
steps=${1:-12}
reps=${2:-3}
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
export OMPI_MCA_mpi_yield_when_idle=1
$Z prepare --text /usr/share/common-licenses/GPL-3 --out "$d/c" --val-fraction 0 >/dev/null
model=${W3_MODEL:-gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128}
zero_flags=(--stage3-prefetch-bucket-size 2000000)
for rep in $(seq 1 "$reps"); do
  for world in 2 4; do
    for stage in 0 1 2 3; do
      mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $world $Z train --model $model \
        --data "$d/c_train.bin" --micro-batch 4 --seq 128 --steps $steps --threads 1 --precision bf16 \
        --zero-stage $stage "${zero_flags[@]}" --profile --metrics "$d/m_${world}_${stage}_$rep.jsonl" \
        > "$d/log_${world}_${stage}_$rep" 2>&1
    done
  done
done
for world in 2 4; do
  for stage in 0 1 2 3; do
    $Z estimate --model $model --world $world --zero-stage $stage --precision bf16 --micro-batch 4 --seq 128 \
      "${zero_flags[@]}" --json > "$d/est_${world}_${stage}.json"
  done
done
python3 - "$d" "$reps" <<'PY'
import json, re, statistics, sys
d, reps = sys.argv[1], int(sys.argv[2])
print(f"{'world':<6}{'stage':<6}{'ms/step':>9}{'vs stage0':>11}{'runs (ms)':>24}{'exposed':>9}"
      f"{'state MiB':>11}{'formula':>9}{'pooled':>8}{'bound':>8}{'peak RSS':>10}")
for world in (2, 4):
    base = None
    for stage in range(4):
        runs = []
        for rep in range(1, reps + 1):
            lines = [json.loads(l) for l in open(f"{d}/m_{world}_{stage}_{rep}.jsonl")]
            ms = statistics.mean(l["ms"] for l in lines[2:])  # steps 3..: primitives and pool are warm
            log = open(f"{d}/log_{world}_{stage}_{rep}").read()
            m = re.search(r"comm ([0-9.]+)%", log)
            runs.append((ms, float(m.group(1)) if m else 0.0, lines[-1]["mem"]))
        runs.sort(key=lambda r: r[0])
        ms, exposed, mem = runs[len(runs) // 2]
        base = base or ms
        est = json.load(open(f"{d}/est_{world}_{stage}.json"))["stages"][0]
        state = sum(mem.get("host." + k, 0) for k in ("param", "grad", "master", "optim"))
        mib = lambda b: f"{b / 2**20:.2f}"
        print(f"{world:<6}{stage:<6}{ms:>9.1f}{ms / base:>10.3f}x{' '.join(f'{r[0]:.1f}' for r in runs):>24}"
              f"{exposed:>8.1f}%{mib(state):>11}{mib(est['model_state']):>9}{mib(mem.get('host.comm', 0)):>8}"
              f"{mib(est['working_set']['total']):>8}{mem['peak_rss'] / 2**20:>10.1f}")
PY
if /usr/bin/python3 -c "import torch" 2>/dev/null; then
  timeout 600 /usr/bin/python3 bench/pytorch_zero_memory.py 2
fi
