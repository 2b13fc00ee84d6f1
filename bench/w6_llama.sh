#!/usr/bin/env bash
# W6 (issue 10): a LLaMA with the Llama-3.2-1B shape (C 2048, 32 heads, 8 kv heads, FFN 8192,
# V 128256, tied head), B=1, T=256, bf16, one rank: zerone s/step beside the PyTorch LLaMA of
# bench/pytorch_peer.py on PyTorch 2 (same shape, autocast bf16, fused AdamW, scaled_dot_product_attention;
# eager, and torch.compile with the compilation in untimed warm-up steps) and beside the limit, all in
# the same run. LAYERS (default 16, the whole model; 4 keeps both runs inside memory that is shared
# with other work): the full 1.24B model needs ~22 GiB for zerone (18 B/param + activations) and
# ~20 GiB for PyTorch (f32 weights + AdamW); the per-layer work is the same shape, the embedding
# and the 128256-wide head weigh more at 4 layers than at 16.
# GEMM limit: matmul FLOPs per step (6 x matmul params x tokens, plus the attention's batched
# GEMMs) at the best W6-shape bf16 GEMM throughput of build/bench/bench_matmul in this run.
# Usage: bash bench/w6_llama.sh [LAYERS] [STEPS]    (after make; zerone and the peers alternate, ROUNDS=2
#        rounds; TORCH="eager compile" the PyTorch modes; the peers from bench/peers/setup.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/limits.sh
L=${1:-16}; steps=${2:-4}; ROUNDS=${ROUNDS:-2}; TORCH=${TORCH:-"eager compile"}
Z=build/zerone
spec="llama:layers=$L,dim=2048,heads=32,kv_heads=8,ffn=8192,vocab=128256,ctx=256,theta=500000,tied=1"
py=$(peers_python)
[ -n "$py" ] || { echo "w6_llama.sh: the PyTorch peer needs the peers' environment (bash bench/peers/setup.sh)" >&2; exit 1; }
echo "W6 peers: $("$py" -c 'import torch; print("torch", torch.__version__)')"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
peak=$(gemm_peak_tflops W6 2> >(sed 's/^/W6 gemm: /' >&2))
# The triad is measured before and after each zerone run and the best reading is the limit: this
# machine's memory bandwidth drifts between minutes (41-70 GB/s seen), and a limit must not be the
# unluckier reading.
python3 - "$L" > "$d/flops" <<'PY'
import sys
L, C, NH, NKV, hs, F, V, T = int(sys.argv[1]), 2048, 32, 8, 64, 8192, 128256, 256
per_layer = C * (NH + 2 * NKV) * hs + NH * hs * C + C * 2 * F + F * C
matmul_params = L * per_layer + V * C  # the tied head is a GEMM too
attn = L * 2 * 2 * NH * T * T * hs / 2  # QK^T and PV, causal half, forward
print(6 * matmul_params * T + 3 * attn, L * (C * (NH + 2 * NKV) * hs + NH * hs * C + 3 * C * F + 2 * C) + V * C + C)
PY
read -r flops params < "$d/flops"
for round in $(seq 1 "$ROUNDS"); do
  triad_before=$(triad_gbs)
  $Z train --model "$spec" --micro-batch 1 --seq 256 --precision bf16 --steps $((steps + 1)) --lr 1e-4 \
    --metrics "$d/z$round.jsonl" > "$d/z$round.log" 2>&1 || { cat "$d/z$round.log"; exit 1; }
  z=$(python3 -c "import json; v=[json.loads(l)['ms'] for l in open('$d/z$round.jsonl')][1:]; print(sum(v)/len(v)/1000)")
  triad_after=$(triad_gbs)
  triad=$(python3 -c "print(max($triad_before, $triad_after))")
  echo "W6 triad: $triad_before GB/s before, $triad_after GB/s after zerone's run"
  gemm_s=$(python3 -c "print(f'{$flops/($peak*1e12):.3f}')")
  opt_s=$(python3 -c "print(f'{30*$params/($triad*1e9):.3f}')")
  limit_s=$(python3 -c "print(f'{$gemm_s+$opt_s:.3f}')")
  echo "W6 round $round: layers $L ($params params) zerone $z s/step, \
limit $limit_s s/step (GEMM $gemm_s s at $peak TFLOP/s + optimizer $opt_s s at $triad GB/s) = $(python3 -c "print(f'{100*$limit_s/$z:.0f}')")% of roofline \
(GEMM alone $(python3 -c "print(f'{100*$gemm_s/$z:.0f}')")%)"
  for mode in $TORCH; do
    p=$(OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} "$py" bench/pytorch_peer.py w6 "$L" "$mode" "$steps" 2>"$d/torch.err") ||
      { tail -5 "$d/torch.err"; continue; }
    echo "W6 round $round: PyTorch $mode $p s/step, pytorch/zerone $(python3 -c "print(f'{$p/$z:.2f}')")x"
  done
done
