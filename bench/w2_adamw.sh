#!/usr/bin/env bash
# W2: the AdamW step over 67M f32 parameters: zerone's fused pass (build/bench/bench_adamw, with and
# without the bf16 parameter copy) beside the triad bandwidth of the same binary and, in the same run,
# PyTorch 2's AdamW(fused=True) and AdamW(foreach=True) and DeepSpeed's DeepSpeedCPUAdam
# (bench/pytorch_peer.py w2; DeepSpeed builds its op on first use, before the timed steps).
# Then the same step in one process, taking turns (pytorch_peer.py w2_interleaved, zerone's pass
# through build/bench/libzerone_adamw_shim.so): the ratio that separate processes on a shared
# machine cannot give (each process's speed depended on the order they ran in).
#   bash bench/w2_adamw.sh     env: PEER_STEPS=5, ROUNDS=30, OMP_NUM_THREADS=2
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/limits.sh
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
py=$(peers_python)
build/bench/bench_adamw --benchmark_counters_tabular=true 2>/dev/null | grep -E '^BM_' | sed 's/^/W2 zerone: /'
if [ -z "$py" ]; then echo "W2: note: the peers' environment (bench/peers/setup.sh) is missing; peers skipped"; exit 0; fi
echo "W2 peers: $("$py" -c 'import torch, deepspeed; print("torch", torch.__version__, "deepspeed", deepspeed.__version__)' 2>/dev/null)"
DS_ACCELERATOR=cpu "$py" bench/pytorch_peer.py w2 67108864 "${PEER_STEPS:-5}" 2>/dev/null | sed 's/^/W2 peer Gparam\/s: /'
shim=build/bench/libzerone_adamw_shim.so
if [ -f "$shim" ]; then
  DS_ACCELERATOR=cpu "$py" bench/pytorch_peer.py w2_interleaved 67108864 "${ROUNDS:-30}" "$shim" 2>/dev/null | sed 's/^/W2 one process: /'
else
  echo "W2: note: $shim is missing (cmake --build build --target zerone_adamw_shim); the one-process comparison skipped"
fi
