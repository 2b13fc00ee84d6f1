#!/usr/bin/env bash
# W4 beside the peers (issue 22): zerone's ZeRO-Offload and ZeRO-Infinity beside DeepSpeed's
# offload_optimizer cpu / nvme and offload_param nvme (its async I/O op, libaio), one rank, the W4 model
# (GPT-2 124M, micro-batch 4 x seq 64, bf16 with f32 master weights, AdamW lr 3e-4), 2 threads, the
# same `zerone prepare` shard, swap files under DIR. Settings, each in both engines:
#   offload    stage 2, optimizer on cpu                     (ZeRO-Offload)
#   infinity1  stage 3, optimizer on nvme                    (ZeRO-Infinity, optimizer only)
#   infinity2  stage 3, optimizer and parameters on nvme     (ZeRO-Infinity)
# For each: mean s/step over steps 3..STEPS and the process's peak RSS (VmHWM).
#   bash bench/w4_peers.sh speed [DIR] [STEPS] [ROUNDS]      (defaults build/, 5, 1)
#   bash bench/w4_peers.sh largest [DIR] [TIMEOUT_S]         DeepSpeed's largest GPT here: ascending
#        shapes (micro-batch 1 x seq 64, vocab 50257), 2 steps each under a time bound, per setting
#        (none3: stage 3 without offload; infinity2: nvme optimizer + nvme parameters; cpu3, cpu
#        optimizer + cpu parameters, is the same RAM on this machine and not tried unless named in
#        W4_LARGEST_SETTINGS),
#        stopping at a setting's first failure. zerone's own: docs/BENCHMARKS.md "The largest GPT that
#        trains here" (3.28B with both on NVMe) and `zerone plan`.
#   W4_DS_SUB_GROUP_SIZE=N sets DeepSpeed's zero_optimization.sub_group_size (its default, 1e9 elements,
#   stages the optimizer state of a model up to 1e9 parameters in RAM at once; zerone's default stages
#   at most an eighth of it).
#   W4_OUT=DIR keeps the runs (default: a temporary directory) and adds rounds to those already there.
set -euo pipefail
cd "$(dirname "$0")/.."
Z=$(readlink -f build/zerone)
mode=${1:-speed}
dir=$(readlink -f "${2:-build}")
py=$(bash bench/peers/setup.sh | tail -n 1)
torchrun=$(dirname "$py")/torchrun
out=${W4_OUT:-}
if [ -z "$out" ]; then out=$(mktemp -d); trap 'rm -rf "$out"' EXIT; fi
mkdir -p "$out"; out=$(readlink -f "$out")
swap=$(mktemp -d -p "$dir" w4peers.XXXXXX); trap 'rm -rf "$swap"; [ -n "${W4_OUT:-}" ] || rm -rf "$out"' EXIT
[ -f "$out/c_train.bin" ] || $Z prepare --text /usr/share/common-licenses/GPL-3 --out "$out/c" --val-fraction 0 >/dev/null
export OMP_NUM_THREADS=2 DS_ACCELERATOR=cpu
settings=(offload infinity1 infinity2)
zerone_flags() {  # setting -> zerone's flags
  case $1 in
    offload) echo --zero-stage 2 --offload-optimizer cpu ;;
    infinity1) echo --zero-stage 3 --offload-optimizer nvme --nvme-path "$swap/z" ;;
    infinity2) echo --zero-stage 3 --offload-optimizer nvme --offload-param nvme --nvme-path "$swap/z" ;;
    none3) echo --zero-stage 3 ;;
    cpu3) echo --zero-stage 3 --offload-optimizer cpu --offload-param cpu ;;
  esac
}
ds_flags() {  # setting -> the DeepSpeed peer's flags
  case $1 in
    offload) echo --stage 2 --offload-optimizer cpu ;;
    infinity1) echo --stage 3 --offload-optimizer nvme --nvme-path "$swap/ds" ;;
    infinity2) echo --stage 3 --offload-optimizer nvme --offload-param nvme --nvme-path "$swap/ds" ;;
    none3) echo --stage 3 ;;
    cpu3) echo --stage 3 --offload-optimizer cpu --offload-param cpu ;;
  esac
}
run_pair() {  # setting model steps micro-batch seq prefix timeout_s: one zerone run (unless W4_PEER_ONLY) and one DeepSpeed run
  local s=$1 model=$2 steps=$3 B=$4 T=$5 p=$6 limit=$7 rc
  local common=(--model "$model" --data "$out/c_train.bin" --micro-batch "$B" --seq "$T" --steps "$steps" --threads 2)
  mkdir -p "$swap/z" "$swap/ds"
  if [ -z "${W4_PEER_ONLY:-}" ]; then
    rc=0; timeout "$limit" /usr/bin/time -f %M -o "$p.zerone.rss" $Z train "${common[@]}" --precision bf16 \
      $(zerone_flags "$s") --metrics "$p.zerone.jsonl" > "$p.zerone.log" 2>&1 || rc=$?
    echo $rc > "$p.zerone.rc"
  fi
  # oom_score_adj 1000: when a try runs out of memory, the kernel kills it and not a neighbour.
  rc=0; timeout "$limit" sh -c 'echo 1000 > /proc/self/oom_score_adj; exec "$@"' sh $torchrun --nproc-per-node 1 --master-port 29790 bench/peers/deepspeed_train.py \
    "${common[@]}" $(ds_flags "$s") ${W4_DS_SUB_GROUP_SIZE:+--sub-group-size $W4_DS_SUB_GROUP_SIZE} --report "$p.ds" > "$p.ds.log" 2>&1 || rc=$?
  echo $rc > "$p.ds.rc"
  rm -rf "$swap/z" "$swap/ds"
}

if [ "$mode" = speed ]; then
  steps=${3:-5}; rounds=${4:-1}
  first=$(find "$out" -maxdepth 1 -name "round_*" | wc -l)
  for round in $(seq $((first + 1)) $((first + rounds))); do
    mkdir -p "$out/round_$round"
    for s in "${settings[@]}"; do
      run_pair $s gpt2:layers=12,dim=768,heads=12,vocab=50257,ctx=64 "$steps" 4 64 "$out/round_$round/$s" 590
    done
    echo "w4-peers: round $round done ($(date -u +%H:%M:%S))" >&2
  done
  "$py" - "$out" <<'PY'
import glob, json, os, statistics, sys
out = sys.argv[1]
rounds = sorted(glob.glob(f"{out}/round_*"))
def zerone(p):
    if not os.path.exists(p + ".zerone.jsonl") or open(p + ".zerone.rc").read().strip() != "0":
        return None
    secs = [json.loads(l)["ms"] / 1e3 for l in open(p + ".zerone.jsonl")]
    return statistics.mean(secs[2:]), int(open(p + ".zerone.rss").read().split()[-1]) / 1024, \
        json.loads(open(p + ".zerone.jsonl").readline())["loss"]
def ds(p):
    if not os.path.exists(p + ".ds.rank0.json"):
        return None
    r = json.load(open(p + ".ds.rank0.json"))
    return statistics.mean(r["secs"][2:]), r["peak_rss"] / 2**20, r["losses"][0]
names = {"offload": ("stage 2, optimizer cpu (ZeRO-Offload)", "ZeRO-2, offload_optimizer cpu"),
         "infinity1": ("stage 3, optimizer nvme", "ZeRO-3, offload_optimizer nvme"),
         "infinity2": ("stage 3, optimizer + parameters nvme (ZeRO-Infinity)", "ZeRO-3, offload_optimizer + offload_param nvme")}
print(f"rounds: {len(rounds)}; s/step: median over rounds of the mean of steps 3..; RSS: median over rounds")
print("| setting | zerone s/step | DeepSpeed s/step | zerone/DeepSpeed s/step | zerone peak RSS (MiB) | DeepSpeed peak RSS (MiB) | zerone/DeepSpeed RSS | loss at step 1 (zerone, DeepSpeed) |")
print("|---|---|---|---|---|---|---|---|")
for s, (zn, dn) in names.items():
    zs = [m for m in (zerone(f"{r}/{s}") for r in rounds) if m]
    ds_ = [m for m in (ds(f"{r}/{s}") for r in rounds) if m]
    if not zs or not ds_:
        print(f"| {zn} / {dn} | {'failed' if not zs else ''} | {'failed' if not ds_ else ''} | | | | | |")
        continue
    z = [statistics.median(m[i] for m in zs) for i in range(2)]
    d = [statistics.median(m[i] for m in ds_) for i in range(2)]
    print(f"| {zn} / {dn} | {z[0]:.3f} | {d[0]:.3f} | {z[0] / d[0]:.2f}x | {z[1]:.0f} | {d[1]:.0f} | {z[1] / d[1]:.2f}x | "
          f"{zs[0][2]:.3f}, {ds_[0][2]:.3f} |")
PY
elif [ "$mode" = largest ]; then
  limit=${3:-300}
  # (layers, dim, heads): 0.35B, 0.77B, 1.56B (gpt2-1.5b), 2.15B, 3.28B (zerone's largest run here)
  shapes=("24 1024 16" "36 1280 20" "48 1600 25" "32 2304 18" "40 2560 20")
  [ -z "${W4_LARGEST_SHAPES:-}" ] || IFS=, read -r -a shapes <<<"$W4_LARGEST_SHAPES"  # "L C H,L C H,..."
  for s in ${W4_LARGEST_SETTINGS:-none3 infinity2}; do
    for shape in "${shapes[@]}"; do
      read -r L C H <<<"$shape"
      p="$out/largest_${s}_L${L}_C${C}"
      [ -f "$p.ds.rc" ] && { [ "$(cat "$p.ds.rc")" = 0 ] && continue || break; }
      W4_PEER_ONLY=1 run_pair $s gpt2:layers=$L,dim=$C,heads=$H,vocab=50257,ctx=64 2 1 64 "$p" "$limit"
      rc=$(cat "$p.ds.rc")
      echo "w4-peers: largest $s L$L C$C: rc $rc ($(date -u +%H:%M:%S))" >&2
      [ "$rc" = 0 ] || break
    done
  done
  "$py" - "$out" <<'PY'
import glob, json, os, re, sys
out = sys.argv[1]
print("| DeepSpeed setting | model (L, C) | parameters | result | s/step (step 2) | peak RSS (MiB) |")
print("|---|---|---|---|---|---|")
for rc_file in sorted(glob.glob(f"{out}/largest_*.ds.rc"), key=lambda f: (f.split("_")[1], int(re.search(r"_L(\d+)_C(\d+)", f).group(2)))):
    p = rc_file[:-6]
    s, L, C = re.search(r"largest_(\w+?)_L(\d+)_C(\d+)", p).groups()
    L, C = int(L), int(C)
    n = 12 * L * C * C + 13 * L * C + 50304 * C + 64 * C + 2 * C
    rc = int(open(rc_file).read())
    if rc == 0 and os.path.exists(p + ".ds.rank0.json"):
        r = json.load(open(p + ".ds.rank0.json"))
        print(f"| {s} | {L}, {C} | {n / 1e9:.2f}B | trains (loss {r['losses'][0]:.2f} -> {r['losses'][-1]:.2f}) | {r['secs'][-1]:.1f} | {r['peak_rss'] / 2**20:.0f} |")
    else:
        log = open(p + ".ds.log").read()
        why = "out of memory (killed)" if rc in (137, -9) or "Killed" in log or "exitcode: -9" in log else "over the time bound" if rc == 124 else \
            (re.findall(r"(\w*Error[^\n]*)", log) or [f"exit {rc}"])[-1][:120]
        print(f"| {s} | {L}, {C} | {n / 1e9:.2f}B | {why} | | |")
PY
else
  echo "w4_peers.sh: error: mode '$mode': expected speed or largest" >&2; exit 1
fi
