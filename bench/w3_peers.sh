#!/usr/bin/env bash
# W3 beside the peers (issue 22): zerone ZeRO stages 1-3 beside DeepSpeed ZeRO-1/2/3 and PyTorch FSDP2
# (reshard_after_forward False ~ ZeRO-2, True ~ ZeRO-3; FSDP2 has no ZeRO-1) at world 2 and 4, the
# same GPT (bench/w3_zero_scaling.sh's), micro-batch 4 x seq 128 per rank, bf16 compute with f32 master
# weights, AdamW lr 3e-4 (0.9, 0.999, 1e-8, no decay), one thread per rank, the same `zerone prepare`
# shard; zerone over Open MPI, the peers over gloo (torchrun). For each: mean s/step over steps 3..STEPS
# (steady state, timed by each engine around its step: zerone's metrics "ms", the peers' perf_counter
# around forward+backward+step) and the largest peak RSS of its ranks (VmHWM: /usr/bin/time for zerone,
# getrusage in each peer rank), and the first-step loss (rank 0's) to show the runs are comparable.
#   bash bench/w3_peers.sh [STEPS] [ROUNDS]        (defaults 12, 1)
#   W3_OUT=DIR keeps the runs in DIR (default: a temporary directory) and adds to those already there,
#   so several short locked invocations build up rounds; W3_WORLDS="2 4" picks world sizes.
# Every contender runs once per round, interleaved, so a slow spell of a shared machine hits all alike;
# the table gives each one's median over the rounds and zerone/peer ratios of those medians.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$(readlink -f build/zerone)
steps=${1:-12}
rounds=${2:-1}
py=$(bash bench/peers/setup.sh | tail -n 1)
torchrun=$(dirname "$py")/torchrun
out=${W3_OUT:-}
if [ -z "$out" ]; then out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
mkdir -p "$out"
out=$(readlink -f "$out")
[ -f "$out/c_train.bin" ] || $Z prepare --text /usr/share/common-licenses/GPL-3 --out "$out/c" --val-fraction 0 >/dev/null
model=${W3_MODEL:-gpt2:layers=4,dim=384,heads=6,vocab=257,ctx=128}
export OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1 DS_ACCELERATOR=cpu
common=(--model "$model" --data "$out/c_train.bin" --micro-batch 4 --seq 128 --steps "$steps" --threads 1)
first=$(find "$out" -maxdepth 1 -name "round_*" | wc -l)
for round in $(seq $((first + 1)) $((first + rounds))); do
  r="$out/round_$round"; mkdir -p "$r"
  for world in ${W3_WORLDS:-2 4}; do
    for stage in 1 2 3; do
      # zerone: each rank under /usr/bin/time for its peak RSS.
      mpiexec --allow-run-as-root --oversubscribe --bind-to none -n $world sh -c \
        'exec /usr/bin/time -f %M -o "$0.rss.$OMPI_COMM_WORLD_RANK" "$@"' "$r/zerone_${world}_$stage" \
        $Z train "${common[@]}" --precision bf16 --zero-stage $stage --stage3-prefetch-bucket-size 2000000 \
        --metrics "$r/zerone_${world}_$stage.jsonl" > "$r/zerone_${world}_$stage.log" 2>&1
      $torchrun --nproc-per-node $world --master-port $((29700 + round % 50)) bench/peers/deepspeed_train.py \
        "${common[@]}" --stage $stage --report "$r/deepspeed_${world}_$stage" > "$r/deepspeed_${world}_$stage.log" 2>&1 \
        || echo "w3-peers: DeepSpeed world $world stage $stage failed: $r/deepspeed_${world}_$stage.log" >&2
      if [ $stage -ge 2 ]; then
        $torchrun --nproc-per-node $world --master-port $((29750 + round % 50)) bench/peers/fsdp2_train.py \
          "${common[@]}" --stage $stage --report "$r/fsdp2_${world}_$stage" > "$r/fsdp2_${world}_$stage.log" 2>&1 \
          || echo "w3-peers: FSDP2 world $world stage $stage failed: $r/fsdp2_${world}_$stage.log" >&2
      fi
    done
  done
  echo "w3-peers: round $round done ($(date -u +%H:%M:%S))" >&2
done
"$py" - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rounds = sorted(glob.glob(f"{out}/round_*"))
def measure(r, engine, world, stage):
    """(mean s/step over steps 3.., max peak RSS MiB over ranks, rank-0 first loss) or None."""
    base = f"{r}/{engine}_{world}_{stage}"
    if engine == "zerone":
        if not os.path.exists(base + ".jsonl"):
            return None
        lines = [json.loads(l) for l in open(base + ".jsonl")]
        secs = [l["ms"] / 1e3 for l in lines]
        rss = max(int(open(f).read().split()[-1]) * 1024 for f in glob.glob(base + ".rss.*"))
        return statistics.mean(secs[2:]), rss / 2**20, lines[0]["loss"]
    reps = [json.load(open(f)) for f in glob.glob(base + ".rank*.json")]
    if len(reps) != world:
        return None
    reps.sort(key=lambda p: p["rank"])
    secs = statistics.mean(statistics.mean(p["secs"][2:]) for p in reps)
    return secs, max(p["peak_rss"] for p in reps) / 2**20, reps[0]["losses"][0]
worlds = sorted({int(os.path.basename(f).split("_")[1]) for r in rounds for f in glob.glob(f"{r}/zerone_*.jsonl")})
print(f"rounds: {len(rounds)}; s/step: median over rounds of the mean of steps 3..; RSS: largest rank, median over rounds")
print("| world | stage | engine | s/step | zerone/peer s/step | peak RSS / rank (MiB) | zerone/peer RSS | loss at step 1 | runs (s/step) |")
print("|---|---|---|---|---|---|---|---|---|")
for world in worlds:
    for stage in (1, 2, 3):
        rows = {}
        for engine in ("zerone", "deepspeed", "fsdp2"):
            ms = [m for m in (measure(r, engine, world, stage) for r in rounds) if m]
            if ms:
                rows[engine] = (statistics.median(m[0] for m in ms), statistics.median(m[1] for m in ms),
                                ms[0][2], [m[0] for m in ms])
        z = rows.get("zerone")
        for engine, (s, rss, loss, runs) in rows.items():
            name = {"zerone": f"zerone stage {stage}", "deepspeed": f"DeepSpeed ZeRO-{stage}",
                    "fsdp2": f"FSDP2 reshard_after_forward={stage == 3}"}[engine]
            ratio_s = f"{z[0] / s:.2f}x" if z and engine != "zerone" else ""
            ratio_m = f"{z[1] / rss:.2f}x" if z and engine != "zerone" else ""
            print(f"| {world} | {stage} | {name} | {s:.3f} | {ratio_s} | {rss:.0f} | {ratio_m} | {loss:.3f} | "
                  f"{' '.join(f'{x:.3f}' for x in runs)} |")
peer = [json.load(open(f)) for f in glob.glob(f"{rounds[0]}/deepspeed_*_1.rank0.json")]
if peer:
    print(f"DeepSpeed optimizers (ZeRO-1): {peer[0].get('zero_optimizer')} over {peer[0].get('adam')}; "
          f"RSS after importing torch+deepspeed: {peer[0]['rss_after_import'] / 2**20:.0f} MiB")
peer = [json.load(open(f)) for f in glob.glob(f"{rounds[0]}/fsdp2_*_3.rank0.json")]
if peer:
    print(f"FSDP2: RSS after importing torch: {peer[0]['rss_after_import'] / 2**20:.0f} MiB")
PY
