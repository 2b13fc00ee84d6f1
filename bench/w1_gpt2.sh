#!/usr/bin/env bash
# W1: GPT-2 124M (V 50257 padded to 50304, tied head), micro-batch 4, seq 64, one rank: zerone bf16 and
# fp32 beside PyTorch 2 eager and torch.compile (bench/pytorch_peer.py w1: bf16 by autocast, fused AdamW;
# compilation in untimed warm-up steps) and beside the limit, all in the same run.
# Limit (as W6's): the step's matmul FLOPs (6 x 123.5M matmul parameters x 256 tokens + the causal
# attention GEMMs = 190 GFLOP) at the best W1-shape GEMM throughput of build/bench/bench_matmul of this
# run (bf16 for bf16, f32 for fp32), plus the optimizer's bytes (30 per parameter with the bf16 copy, 28
# without) at the triad bandwidth (the better of the readings before and after zerone's runs).
#   bash bench/w1_gpt2.sh     env: STEPS=10 (zerone; mean of steps 3..), TORCH_STEPS=3,
#                                  TORCH="bf16:eager bf16:compile fp32:eager fp32:compile", OMP_NUM_THREADS=2
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/limits.sh
Z=build/zerone
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
STEPS=${STEPS:-10}; TORCH_STEPS=${TORCH_STEPS:-3}; TORCH=${TORCH:-"bf16:eager bf16:compile fp32:eager fp32:compile"}
py=$(peers_python)
[ -n "$py" ] || echo "W1: note: the peers' environment (bench/peers/setup.sh) is missing; PyTorch rows skipped"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
$Z prepare --text /usr/share/common-licenses/GPL-3 --out "$d/w1" >/dev/null  # byte tokens: any ids serve speed

peak_bf16=$(gemm_peak_tflops 'BM_Matmul/.*bf16:1' 2> >(sed 's/^/W1 gemm: /' >&2))
peak_f32=$(gemm_peak_tflops 'BM_Matmul/.*bf16:0' 2> >(sed 's/^/W1 gemm: /' >&2))
read -r flops params < <(python3 -c "
L, C, NH, T, Vp, V, N = 12, 768, 12, 64, 50304, 50257, 256
matmul = L * 12 * C * C + Vp * C
attn = L * 2 * 2 * NH * T * T * (C // NH) / 2 * (N // T)  # QK^T and PV, causal half, forward
params = Vp * C + 1024 * C + L * (12 * C * C + 13 * C) + 2 * C
print(6 * matmul * N + 3 * attn, params)")
triad_before=$(triad_gbs)
declare -A zs
for p in bf16 fp32; do
  $Z train --model gpt2:vocab=50257 --data "$d/w1_train.bin" --micro-batch 4 --seq 64 --steps "$STEPS" \
    --precision $p --threads "$OMP_NUM_THREADS" --profile --metrics "$d/$p.jsonl" > "$d/$p.log" 2>&1 || { cat "$d/$p.log"; exit 1; }
  zs[$p]=$(python3 -c "import json; v=[json.loads(l)['ms'] for l in open('$d/$p.jsonl')][2:]; print(f'{sum(v)/len(v)/1000:.4f}')")
  echo "W1 zerone $p ${zs[$p]} s/step; $(grep '^time per step' "$d/$p.log")"
done
triad=$(python3 -c "print(max($triad_before, $(triad_gbs)))")
for p in bf16 fp32; do
  peak=$peak_bf16; bytes=30
  [ $p = fp32 ] && { peak=$peak_f32; bytes=28; }
  python3 -c "
g = $flops / ($peak * 1e12); o = $bytes * $params / ($triad * 1e9); z = ${zs[$p]}
print(f'W1 limit $p: {g + o:.4f} s/step (GEMM {g:.4f} s at $peak TFLOP/s + optimizer {o:.4f} s at $triad GB/s); '
      f'zerone at {(g + o) / z:.2f} of the limit (GEMM alone {g / z:.2f})')"
done
[ -n "$py" ] || exit 0
echo "W1 peers: $("$py" -c 'import torch; print("torch", torch.__version__)')"
for pm in $TORCH; do
  p=${pm%%:*}; mode=${pm##*:}
  t=$("$py" bench/pytorch_peer.py w1 "$p" "$mode" "$TORCH_STEPS" 2>"$d/torch.err") || { tail -5 "$d/torch.err"; continue; }
  echo "W1 pytorch $p $mode $t s/step; pytorch/zerone $(python3 -c "print(f'{$t/${zs[$p]}:.2f}')")x"
done
