#!/usr/bin/env bash
# W6 (issue 10): a LLaMA with the Llama-3.2-1B shape (C 2048, 32 heads, 8 kv heads, FFN 8192,
# V 128256, tied head), B=1, T=256, bf16, one rank: zerone s/step beside the PyTorch LLaMA of
# bench/pytorch_peer.py (same shape, autocast bf16, AdamW foreach) and beside the GEMM limit, all in
# the same run. LAYERS (default 4 of the model's 16) keeps both runs inside memory that is shared
# with other work: the full 1.24B model needs ~22 GiB for zerone (18 B/param + activations) and
# ~20 GiB for PyTorch (f32 weights + AdamW); the per-layer work is the same shape, the embedding
# and the 128256-wide head weigh more at 4 layers than at 16.
# GEMM limit: matmul FLOPs per step (6 x matmul params x tokens, plus the attention's batched
# GEMMs) at the best W6-shape bf16 GEMM throughput of build/bench/bench_matmul in this run.
# Usage: bash bench/w6_llama.sh [LAYERS] [STEPS]    (after make; both runs alternate twice)
set -euo pipefail
L=${1:-16}; steps=${2:-4}
Z=build/zerone
spec="llama:layers=$L,dim=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,ctx=256,theta=500000,tied=1"
/usr/bin/python3 -c "import torch" 2>/dev/null ||
  { echo "w6_llama.sh: the PyTorch peer needs Debian's python3-torch (apt-get install python3-torch)" >&2; exit 1; }
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
peak=$(build/bench/bench_matmul --benchmark_filter=W6 --benchmark_counters_tabular=true 2>/dev/null | tee "$d/gemm" |
       awk '/^BM_MatmulW6/ { v = $NF; sub(/\/s$/, "", v); if (v + 0 > m) m = v + 0 } END { print m }')
cat "$d/gemm" | grep -E '^BM_' | sed 's/^/W6 gemm: /'
triad=$(build/bench/bench_adamw --benchmark_filter=Triad --benchmark_counters_tabular=true 2>/dev/null |
        awk '/^BM_Triad/ { v = $NF; sub(/G\/s$/, "", v); print v }')
echo "W6 triad: $triad GB/s"
python3 - "$L" > "$d/flops" <<'PY'
import sys
L, C, NH, NKV, hs, F, V, T = int(sys.argv[1]), 2048, 32, 8, 64, 8192, 128256, 256
per_layer = C * (NH + 2 * NKV) * hs + NH * hs * C + C * 2 * F + F * C
matmul_params = L * per_layer + V * C  # the tied head is a GEMM too
attn = L * 2 * 2 * NH * T * T * hs / 2  # QK^T and PV, causal half, forward
print(6 * matmul_params * T + 3 * attn, L * (C * (NH + 2 * NKV) * hs + NH * hs * C + 3 * C * F + 2 * C) + V * C + C)
PY
read -r flops params < "$d/flops"
for round in 1 2; do
  $Z train --model "$spec" --micro-batch 1 --seq 256 --precision bf16 --steps $((steps + 1)) --lr 1e-4 \
    --metrics "$d/z$round.jsonl" > "$d/z$round.log" 2>&1 || { cat "$d/z$round.log"; exit 1; }
  z=$(python3 -c "import json; v=[json.loads(l)['ms'] for l in open('$d/z$round.jsonl')][1:]; print(sum(v)/len(v)/1000)")
  p=$(OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} /usr/bin/python3 bench/pytorch_peer.py w6 "$L" "$steps")
  gemm_s=$(python3 -c "print(f'{$flops/($peak*1e12):.3f}')")
  opt_s=$(python3 -c "print(f'{30*$params/($triad*1e9):.3f}')")
  limit_s=$(python3 -c "print(f'{$gemm_s+$opt_s:.3f}')")
  echo "W6 round $round: layers $L ($params params) zerone $z s/step, PyTorch $p s/step, speed-up $(python3 -c "print(f'{$p/$z:.2f}')"), \
limit $limit_s s/step (GEMM $gemm_s s at $peak TFLOP/s + optimizer $opt_s s at $triad GB/s) = $(python3 -c "print(f'{100*$limit_s/$z:.0f}')")% of roofline \
(GEMM alone $(python3 -c "print(f'{100*$gemm_s/$z:.0f}')")%)"
done
