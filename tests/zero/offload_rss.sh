#!/usr/bin/env bash
# NVMe offload of optimizer and parameters (issue 8): a rank's peak RSS stays well under half of the
# model-state bytes it would hold without offload (stage 3, world 1: 18 bytes per parameter in
# bf16). What remains in memory: the f32 gradient shard accumulators (4 bytes per parameter), the
# staging buffers, the stage-3 working set (two units and the prefetch window) and the activations.
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
printf 'Out of memory, into the disk. %.0s' $(seq 1 200) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
model=gpt2:layers=20,dim=512,heads=8,vocab=257,ctx=16   # ~63M parameters
args=(--model $model --micro-batch 1 --seq 16 --precision bf16 --zero-stage 3 --stage3-prefetch-bucket-size 2000000
      --reduce-bucket-size 1000000 --stage3-param-persistence-threshold 0)
"$Z" train --data "$d/c_train.bin" "${args[@]}" --steps 3 --threads 2 --offload-optimizer nvme --offload-param nvme \
  --nvme-path "$d/swap" --sub-group-size 2000000 --offload-buffer-count 2 --metrics "$d/m.jsonl" > "$d/log" 2>&1 || { cat "$d/log"; exit 1; }
"$Z" estimate --world 1 "${args[@]}" --json > "$d/none.json"
python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
est = json.load(open(f"{d}/none.json"))["stages"][0]
model_state = est["model_state"]
lines = [json.loads(l) for l in open(f"{d}/m.jsonl")]
rss = lines[-1]["mem"]["peak_rss"]
losses = [l["loss"] for l in lines]
ok = rss < 0.45 * model_state and losses[-1] < losses[0]
print(f"{'ok  ' if ok else 'FAIL'} peak RSS {rss} = {rss / model_state:.2f} of the model-state bytes without offload "
      f"({model_state}); losses {losses}")
sys.exit(0 if ok else 1)
PY
