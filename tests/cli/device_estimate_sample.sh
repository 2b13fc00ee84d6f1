#!/usr/bin/env bash
# The device in `zerone estimate` and `zerone sample` (issue 18), through the real binary:
#  1. estimate == ledger on every device here: the activation bytes `zerone estimate --device D
#     --json` gives equal the ledger's (metrics "mem" device.activation) of a training run on D, for
#     cpu and sim, GPT-2 and LLaMA (GQA), with and without activation checkpointing.
#  2. estimate for cuda (no GPU needed: no backend is made) counts attention's saved state by
#     --cuda-attention (Note [Attention's saved state]): plain as cpu, flash L*B*NH*T*(T-1) floats
#     fewer; --cuda-attention is validated as train validates it.
#  3. sample --device sim gives byte-identical text to --device cpu (greedy and seeded, GPT-2 from
#     an llm.c file and a zerone checkpoint, LLaMA from a Hugging Face directory); --device cuda
#     without a GPU and an unknown device are one `zerone: error:` line each.
#  4. Note [cuBLASLt loaded on first use] (kernels/cuda/cublaslt.h): training, estimating and
#     sampling on cpu and sim (and `--device cuda` refused without a GPU) never load cuBLASLt (the
#     dynamic loader's own log, LD_DEBUG=files); `zerone info` does, and reports its version.
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail() { echo "FAIL $*"; exit 1; }
printf 'the quick brown fox jumps over the lazy dog. %.0s' $(seq 1 400) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 > /dev/null
gpt=gpt2:layers=2,dim=32,heads=4,vocab=257,ctx=32
llama=llama:layers=2,dim=32,heads=4,kv_heads=2,ffn=64,vocab=257,ctx=32
common=(--micro-batch 2 --seq 32 --threads 1 --no-shuffle --precision fp32)

# 1. estimate == ledger (activations; model state is tests/zero/memory.sh's, on sim too).
for dev in cpu sim; do
  for model in "$gpt" "$llama"; do
    for ckpt in "" --activation-checkpointing; do
      name="$dev.${model%%:*}${ckpt:+.ckpt}"
      "$Z" train --model "$model" --data "$d/c_train.bin" "${common[@]}" --steps 1 $ckpt --device $dev \
        --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; fail "$name: train"; }
      "$Z" estimate --model "$model" --world 1 --zero-stage 0 "${common[@]:0:4}" --precision fp32 $ckpt --device $dev \
        --json > "$d/$name.json" || fail "$name: estimate"
      python3 - "$d/$name.jsonl" "$d/$name.json" "$name" <<'PY'
import json, sys
mem = json.loads(open(sys.argv[1]).readlines()[-1])["mem"]
est = json.load(open(sys.argv[2]))["stages"][0]
got, want = mem.get("device.activation", 0), est["activation_places"]["device"]
assert got == want and got > 0, f"FAIL {sys.argv[3]}: ledger device.activation {got} != estimate {want}"
print(f"ok   {sys.argv[3]}: ledger device.activation {got} == estimate")
PY
    done
  done
done

# 2. The estimate for cuda: plain counts the (B, NH, T, T) probabilities as cpu does, flash the
# (B, NH, T) logsumexp. B=2, T=32, NH=4, L=2 layers (and one slot of them with checkpointing).
for ckpt in "" --activation-checkpointing; do
  for att in plain flash; do
    "$Z" estimate --model "$gpt" --world 1 --zero-stage 0 "${common[@]:0:4}" --precision fp32 $ckpt --device cuda \
      --cuda-attention $att --json > "$d/cuda_$att$ckpt.json" || fail "estimate --device cuda --cuda-attention $att"
  done
  python3 - "$d/cpu.gpt2${ckpt:+.ckpt}.json" "$d/cuda_plain$ckpt.json" "$d/cuda_flash$ckpt.json" "${ckpt:-plain}" <<'PY'
import json, sys
act = lambda p: json.load(open(p))["stages"][0]["activation_places"]["device"]
cpu, plain, flash = (act(p) for p in sys.argv[1:4])
slots = 1 if sys.argv[4] != "plain" else 2
B, NH, T = 2, 4, 32
assert plain == cpu, f"FAIL cuda plain {plain} != cpu {cpu}"
assert plain - flash == slots * B * NH * T * (T - 1) * 4, f"FAIL cuda flash {flash} vs plain {plain}"
j = json.load(open(sys.argv[3]))
assert j["device"] == "cuda" and j["cuda_attention"] == "flash" and not j["budget"]["unified"], j
print(f"ok   estimate --device cuda ({sys.argv[4]}): plain {plain} == cpu, flash {flash} = plain - {plain - flash}")
PY
done

expect_error() {  # NAME EXPECTED-SUBSTRING ARGS...
  local name="$1" want="$2"; shift 2
  if "$Z" "$@" > "$d/$name.out" 2> "$d/$name.err"; then fail "$name: exit 0"; fi
  [ "$(wc -l < "$d/$name.err")" -eq 1 ] || { cat "$d/$name.err"; fail "$name: expected one line"; }
  grep -q "^zerone: error: .*$want" "$d/$name.err" || { cat "$d/$name.err"; fail "$name: expected '$want'"; }
  echo "ok   $name: $(cat "$d/$name.err")"
}
expect_error estimate_attention "--cuda-attention 'tiled': expected flash or plain" estimate --model "$gpt" --world 1 \
  --device cuda --cuda-attention tiled
expect_error estimate_device "--device 'tpu': expected cpu, sim or cuda" estimate --model "$gpt" --world 1 --device tpu
# The GPU's memory is not known here: --device-mem-limit caps the device bytes of a cuda estimate
# (the GPU's own size joins it where a GPU is present: Note [Device budget]).
"$Z" estimate --model "$gpt" --world 1 --zero-stage 0 --seq 32 --device cuda --device-mem-limit 0.0001 | grep -qE "^0 .* no$" ||
  fail "estimate --device cuda under a 100 KiB device cap says it fits"

# 3. sample on sim == sample on cpu, byte for byte.
"$Z" train --model "$gpt" --data "$d/c_train.bin" "${common[@]}" --steps 30 --lr 3e-3 --save "$d/gpt.bin" \
  --checkpoint-dir "$d/ck" > /dev/null
"$Z" train --model "$llama" --data "$d/c_train.bin" "${common[@]}" --steps 10 --lr 3e-3 --save "$d/llama/" > /dev/null
same_text() {  # NAME ARGS...
  local name="$1"; shift
  for dev in cpu sim; do
    "$Z" sample "$@" --device $dev > "$d/$name.$dev.txt" 2> "$d/$name.$dev.err" || { cat "$d/$name.$dev.err"; fail "$name on $dev"; }
  done
  [ "$(wc -c < "$d/$name.cpu.txt")" -ge 20 ] || fail "$name: short output"
  cmp -s "$d/$name.cpu.txt" "$d/$name.sim.txt" || { diff "$d/$name.cpu.txt" "$d/$name.sim.txt"; fail "$name: sim differs from cpu"; }
  echo "ok   sample $name: sim == cpu ($(wc -c < "$d/$name.cpu.txt") bytes)"
}
same_text gpt_greedy --init "$d/gpt.bin" --prompt "the " --tokens 40 --temperature 0
same_text gpt_seeded --init "$d/gpt.bin" --prompt "the " --tokens 40 --seed 7 --top-k 20
same_text gpt_checkpoint --init "$d/ck" --prompt "the " --tokens 30 --seed 3 --precision bf16
same_text llama_seeded --init "$d/llama" --prompt "the " --tokens 30 --seed 5

expect_error sample_device "--device 'tpu': expected cpu, sim or cuda" sample --init "$d/gpt.bin" --device tpu
expect_error sample_attention "--cuda-attention 'x': expected flash or plain" sample --init "$d/gpt.bin" --cuda-attention x
for cmd in "estimate --model $gpt --world 1" "sample --init $d/gpt.bin"; do
  expect_error "${cmd%% *}_attention_on_sim" "--cuda-attention picks the attention kernels of --device cuda, but the device is sim" \
    $cmd --device sim --cuda-attention plain
done
# Without a GPU (here): --device cuda is one clear error (tests/zero/device_cuda.sh covers the GPU).
if ! "$Z" info | grep -q '^devices .*cuda'; then
  expect_error sample_cuda "--device cuda" sample --init "$d/gpt.bin" --device cuda --tokens 5
fi

# 4. cuBLASLt is loaded by a CUDA backend (or `info`), never by a cpu or sim process.
if "$Z" info | grep -q '^CUDA  *compiled in'; then
  loads_cublaslt() {  # loads_cublaslt NAME ARGS...: 0 when the process opened libcublasLt
    local name="$1"; shift
    LD_DEBUG=files LD_DEBUG_OUTPUT="$d/ld.$name" "$Z" "$@" > "$d/$name.ldlog" 2>&1 || true
    cat "$d/ld.$name".* 2>/dev/null | grep -q 'file=libcublasLt'
  }
  for dev in cpu sim; do
    if loads_cublaslt "train_$dev" train --model "$gpt" --data "$d/c_train.bin" "${common[@]}" --steps 2 --device $dev; then
      fail "train --device $dev loaded cuBLASLt"
    fi
    grep -q "final loss" "$d/train_$dev.ldlog" || { cat "$d/train_$dev.ldlog"; fail "train --device $dev did not finish"; }
    echo "ok   train --device $dev: cuBLASLt not loaded"
  done
  loads_cublaslt estimate_cuda estimate --model "$gpt" --world 1 --device cuda && fail "estimate --device cuda loaded cuBLASLt"
  loads_cublaslt sample_cpu sample --init "$d/gpt.bin" --prompt "the " --tokens 5 && fail "sample loaded cuBLASLt"
  echo "ok   estimate --device cuda, sample --device cpu: cuBLASLt not loaded"
  loads_cublaslt info info || fail "info did not load cuBLASLt"
  grep -Eq '^  libraries  cuBLASLt [0-9]+\.[0-9]+\.[0-9]+' "$d/info.ldlog" || { cat "$d/info.ldlog"; fail "info: no cuBLASLt version"; }
  echo "ok   info: $(grep '^  libraries' "$d/info.ldlog" | sed 's/^ *//')"
fi
