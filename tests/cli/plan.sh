#!/usr/bin/env bash
# The memory planner through the real binary (issue 20): a plan runs unchanged from its config
# (`zerone train --config plan.json`) with the ledger's model state equal to the plan's bytes and
# its peak within the budget, at world 1 and 2; a budget a few percent below a plan's need is
# refused or gets a smaller plan; nothing fitting names the smallest budget, which then fits;
# --auto-fit plans and trains (every rank the same plan); estimate reads --config and counts
# ranks per host; the newcomer cases of the issue: each refusal names a fix that then works, and
# the advice never proposes what is already set.
set -uo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
fail=0
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fail=1; }
printf 'Memory is the treasury and guardian of all things. %.0s' $(seq 1 200) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
M=gpt2:layers=4,dim=256,heads=4,vocab=257,ctx=64
speeds=(--gemm-tflops 0.2 --memory-bandwidth 5)  # given: the plans do not depend on the load
json() { python3 -c "import json,sys; j=json.load(open('$1')); print($2)"; }

# A plan's run: model state in the metrics equals the plan's bytes, the peak stays in the budget.
check_run() {  # NAME PLAN_JSON METRICS LOG BUDGET_GIB [RANKS_PER_HOST]
  python3 - "$@" <<'PY'
import json, re, sys
name, plan, metrics, log, budget = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3], open(sys.argv[4]).read(), float(sys.argv[5])
ranks = int(sys.argv[6]) if len(sys.argv) > 6 else 1
chosen = plan["chosen"]["model_state_per_rank"]
mem = json.loads(open(metrics).readlines()[-1])["mem"]
for k in ("param", "grad", "master", "optim"):
    for place in ("device", "host", "nvme"):
        want, got = chosen.get(f"{place}.{k}", 0), mem.get(f"{place}.{k}", 0)
        if want != got:
            sys.exit(f"FAIL {name}: ledger {place}.{k} {got} != plan {want}")
units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
peak = sum(float(v) * units[u] for v, u in re.findall(r"peak memory, \w+: ([0-9.]+) (B|KiB|MiB|GiB)", log))
peak *= ranks  # rank 0's peak, for each rank on the host (equal shards)
if peak == 0 or peak > budget * 2**30:
    sys.exit(f"FAIL {name}: ledger peak {peak} outside the budget {budget} GiB")
print(f"ok   {name}: ledger model state == plan, peak {peak / 2**20:.1f} MiB within {budget} GiB")
PY
  [ $? -eq 0 ] || fail=1
}

# 1. Plans that run, at world 1 (roomy and tight budgets) and world 2.
"$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem 1 "${speeds[@]}" --json --out "$d/roomy.json" > "$d/roomy.plan" || bad "plan roomy"
# Tight: halfway between the roomy plan's need and the least any plan needs.
roomy=$(json "$d/roomy.plan" "j['chosen']['need']['memory_per_host']")
"$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem 0.001 "${speeds[@]}" --json > "$d/least.plan"
least=$(json "$d/least.plan" "j['smallest_budget']['memory_per_host']")
tight=$(python3 -c "print(round(($roomy + $least) / 2 / 2**30, 6))")
"$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem "$tight" "${speeds[@]}" --json --out "$d/tight.json" > "$d/tight.plan" || bad "plan tight"
python3 -c "
import json; j = json.load(open('$d/tight.plan'))
assert j['chosen']['need']['memory_per_host'] <= $tight * 2**30, j['chosen']
" && ok "tight plan ($tight GiB, below the roomy plan's need): $(json "$d/tight.plan" "j['chosen']['family']")" || bad "tight plan"
for p in roomy tight; do
  budget=$([ $p = roomy ] && echo 1 || echo "$tight")
  if "$Z" train --config "$d/$p.json" --data "$d/c_train.bin" --steps 2 --threads 1 --metrics "$d/$p.jsonl" > "$d/$p.log" 2>&1; then
    check_run "runs_$p" "$d/$p.plan" "$d/$p.jsonl" "$d/$p.log" "$budget"
  else bad "runs_$p: $(tail -2 "$d/$p.log")"; fi
done
# World 2 on one host: 0.1 GiB for both ranks, below what two unsharded ranks need.
"$Z" plan --model $M --seq 64 --micro-batch 2 --world 2 --host-mem 0.1 "${speeds[@]}" --json --out "$d/w2.json" > "$d/w2.plan" || bad "plan world 2"
if "${MPI[@]}" -n 2 "$Z" train --config "$d/w2.json" --data "$d/c_train.bin" --steps 2 --threads 1 --metrics "$d/w2.jsonl" > "$d/w2.log" 2>&1; then
  check_run "runs_world2 ($(json "$d/w2.plan" "j['chosen']['family']"))" "$d/w2.plan" "$d/w2.jsonl" "$d/w2.log" 0.1 2
else bad "runs_world2: $(tail -2 "$d/w2.log")"; fi

# 2. A budget 3% below a plan's need: refused, or a plan that needs less.
need=$(json "$d/tight.plan" "j['chosen']['need']['memory_per_host']")
below=$(python3 -c "print($need * 0.97 / 2**30)")
if "$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem "$below" "${speeds[@]}" --json > "$d/below.plan"; then
  python3 -c "import json; j=json.load(open('$d/below.plan')); assert j['chosen']['need']['memory_per_host'] <= $below * 2**30" \
    && ok "3% below the tight plan: another plan that fits" || bad "below: the plan does not fit"
else
  grep -q smallest_budget "$d/below.plan" && ok "3% below the tight plan: refused with the smallest budget" || bad "below"
fi

# 3. Nothing fits: exit 1 with the smallest budget, which then fits.
if "$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem 0.001 "${speeds[@]}" > "$d/none.out"; then bad "nothing fits: exited 0"
elif grep -q "nothing fits; the smallest budget that would fit, per place" "$d/none.out" \
     && "$Z" plan --model $M --seq 64 --micro-batch 4 --host-mem "$(python3 -c "print($least / 2**30)")" "${speeds[@]}" > "$d/smallest.out"; then
  ok "nothing fits at 1 MiB (exit 1); the smallest budget named ($least bytes) fits"
else bad "smallest budget: $(cat "$d/none.out" "$d/smallest.out" 2>/dev/null | tail -3)"; fi

# 4. --auto-fit plans and trains, at world 1 and 2 (the ranks agree on the plan, or the
# start-up consistency check refuses).
if "$Z" train --auto-fit --model $M --data "$d/c_train.bin" --steps 2 --threads 1 > "$d/auto.log" 2>&1 \
   && grep -q "^chosen: " "$d/auto.log" && grep -q "^--auto-fit: training with" "$d/auto.log" && grep -q "final loss" "$d/auto.log"; then
  ok "auto_fit: planned and trained"
else bad "auto_fit: $(tail -3 "$d/auto.log")"; fi
mkdir -p "$d/swap"
if "$Z" train --auto-fit --model $M --data "$d/c_train.bin" --steps 2 --threads 1 --nvme-path "$d/swap" > "$d/autonvme.log" 2>&1 \
   && grep -q "final loss" "$d/autonvme.log" && [ -z "$(ls -A "$d/swap")" ]; then
  ok "auto_fit with --nvme-path: $(grep "^--auto-fit" "$d/autonvme.log")"
else bad "auto_fit with --nvme-path: $(tail -3 "$d/autonvme.log")"; fi
if "${MPI[@]}" -n 2 "$Z" train --auto-fit --model $M --data "$d/c_train.bin" --steps 2 --threads 1 --train-batch-size 8 > "$d/auto2.log" 2>&1 \
   && grep -q "final loss" "$d/auto2.log"; then
  ok "auto_fit world 2: $(grep "^--auto-fit" "$d/auto2.log")"
else bad "auto_fit world 2: $(tail -3 "$d/auto2.log")"; fi

# 5. estimate reads --config and counts ranks per host.
echo "{\"model\": \"$M\", \"seq\": 32, \"zero_stage\": 2, \"micro_batch\": 2}" > "$d/est.json"
one=$("$Z" estimate --config "$d/est.json" --world 2 --json | python3 -c "import json,sys; j=json.load(sys.stdin); assert j['seq'] == 32 and j['micro_batch'] == 2; print(j['stages'][0]['total'])")
fits=$("$Z" estimate --config "$d/est.json" --world 2 --ranks-per-host 2 --host-mem "$(python3 -c "print(1.5 * $one / 2**30)")" --json \
       | python3 -c "import json,sys; print(json.load(sys.stdin)['stages'][0]['fits'])")
[ "$fits" = False ] && ok "estimate --config: 2 ranks per host need twice one rank's memory" || bad "estimate ranks per host: fits=$fits"

# No stage fits: estimate gives the advice for the run's own stage, ending with the plan command.
"$Z" estimate --model gpt2-1.5b --world 1 --host-mem 4 > "$d/est_none.out"
grep -qE "^no stage fits; at --zero-stage 0 does not fit: memory .*Largest over budget: .*zerone plan --model gpt2-1.5b" "$d/est_none.out" \
  && ok "estimate: no stage fits, advice for the run's stage" || bad "estimate advice: $(tail -1 "$d/est_none.out")"

# 6. The newcomer cases. (a) GPT-2 350M at stage 3 with CPU offload under --device-mem-limit 2,
# with DeepSpeed's bucket sizes: the refusal names the bucket, never "a higher stage"; with the
# bucket it names, it trains (the device arena refuses any allocation past the cap).
old=(--reduce-bucket-size 500000000 --stage3-prefetch-bucket-size 50000000)
run350=(train --model gpt2-350m --zero-stage 3 --offload-optimizer cpu --offload-param cpu --device-mem-limit 2
        --data "$d/c_train.bin" --steps 1 --threads 2)
"$Z" "${run350[@]}" "${old[@]}" > "$d/n1.out" 2>&1
fix=$(grep -oE "Each of these fits by itself \(checked by the estimate\): --reduce-bucket-size [0-9]+" "$d/n1.out" | grep -oE "[0-9]+$")
if [ -z "$fix" ]; then bad "newcomer 350M: no bucket fix named: $(tail -1 "$d/n1.out")"
elif grep -qE "higher stage|--zero-stage [0-9]|--offload-(optimizer|param) cpu" "$d/n1.out"; then bad "newcomer 350M: proposes what is set: $(tail -1 "$d/n1.out")"
elif "$Z" "${run350[@]}" --reduce-bucket-size "$fix" --stage3-prefetch-bucket-size 50000000 > "$d/n1fix.out" 2>&1; then
  ok "newcomer 350M: refused naming --reduce-bucket-size $fix, which trains under the 2 GiB cap"
else bad "newcomer 350M: the fix fails: $(tail -2 "$d/n1fix.out")"; fi
# The defaults (auto) fit as they are.
"$Z" estimate --model gpt2-350m --world 1 --zero-stage 3 --offload-optimizer cpu --offload-param cpu --device-mem-limit 2 | grep -qE "^3 .* yes$" \
  && ok "newcomer 350M: fits with the default (auto) buckets" || bad "newcomer 350M: defaults do not fit"
# (b) Llama-3.2-1B (4 x 1024 tokens, checkpointing) on NVMe with sub-group 1e9 x 4 buffers: the
# refusal names host swap and the sub-group fix, which fits; the defaults need less memory than
# no offload at stage 0.
mkdir -p "$d/swap"
# (--host-mem 22: the sub-group run needs 22.9 GiB since the logits are kept in bf16.)
L=(--model llama-3.2-1b --world 1 --micro-batch 4 --seq 1024 --activation-checkpointing --precision bf16 --host-mem 22 --nvme-path "$d/swap" --disk-free 100)
"$Z" estimate "${L[@]}" --zero-stage 3 --offload-optimizer nvme --offload-param nvme --sub-group-size 1000000000 > "$d/n2.out"
fix=$(grep -oE -- "--sub-group-size [0-9]+ --offload-buffer-count 2" "$d/n2.out")
if grep -q "Largest over budget: host swap" "$d/n2.out" && [ -n "$fix" ] && ! grep -qE "offload-(optimizer|param) nvme \(|higher stage" "$d/n2.out" \
   && "$Z" estimate "${L[@]}" --zero-stage 3 --offload-optimizer nvme --offload-param nvme $fix | grep -qE "^3 .* yes$"; then
  ok "newcomer Llama-3.2-1B: refused naming host swap and '$fix', which fits"
else bad "newcomer Llama-3.2-1B: $(tail -1 "$d/n2.out")"; fi
python3 - "$Z" "$d/swap" <<'PY' && ok "newcomer Llama-3.2-1B: NVMe offload by default needs less memory than stage 0 without offload" || fail=1
import json, subprocess, sys
z, swap = sys.argv[1], sys.argv[2]
base = [z, "estimate", "--model", "llama-3.2-1b", "--world", "1", "--micro-batch", "4", "--seq", "1024",
        "--activation-checkpointing", "--precision", "bf16", "--json"]
def total(*extra):
    return json.loads(subprocess.check_output(base + list(extra)))["stages"][0]["total"]
off = total("--zero-stage", "3", "--offload-optimizer", "nvme", "--offload-param", "nvme", "--nvme-path", swap, "--disk-free", "100")
none = total("--zero-stage", "0")
if not off < none:
    sys.exit(f"FAIL offload {off} >= no offload {none}")
PY
# The train refusal of the same run at micro-batch 8 names the swap staging (it needs 25.7 GiB,
# above this host's memory).
"$Z" train --model llama-3.2-1b --micro-batch 8 --seq 1024 --activation-checkpointing --precision bf16 --zero-stage 3 \
  --offload-optimizer nvme --offload-param nvme --sub-group-size 1000000000 --nvme-path "$d/swap" --data "$d/c_train.bin" --steps 1 > "$d/n2t.out" 2>&1
grep -qE "Largest over budget: host swap .*zerone plan --model llama-3.2-1b" "$d/n2t.out" \
  && ok "newcomer Llama-3.2-1B: train's refusal names the swap staging and the plan command" || bad "newcomer train refusal: $(tail -1 "$d/n2t.out")"
# Note [Device speeds]: a plan for a GPU takes the GPU's figures (measured there, or given when
# planning from elsewhere), never the host's GEMM rate. Without a GPU here the flags are required;
# with them the sources name them and the GPU's memory makes the memory-bound term small.
G=(--model gpt2-350m --micro-batch 4 --seq 1024 --precision bf16 --device cuda --device-mem-limit 79 --host-mem 100 --json)
if ! "$Z" info 2>/dev/null | grep -qE "^devices .*cuda"; then
  "$Z" plan "${G[@]}" > "$d/g0.out" 2> "$d/g0.err" && bad "plan --device cuda without a GPU or its speeds ran" ||
    { grep -q "^zerone: error: --device cuda: no such device here to measure its speeds; .*--gemm-tflops, --device-bandwidth and --host-device-bandwidth" "$d/g0.err" \
      && ok "plan --device cuda without a GPU asks for the GPU's speeds" || bad "plan --device cuda without a GPU: $(cat "$d/g0.err")"; }
fi
"$Z" plan "${G[@]}" --gemm-tflops 700 --device-bandwidth 3000 --host-device-bandwidth 50 --memory-bandwidth 20 > "$d/g1.json" 2> "$d/g1.err" \
  && python3 - "$d/g1.json" <<'PY' && ok "plan --device cuda with the GPU's speeds given: device terms at the GPU's figures" || bad "plan --device cuda with speeds: $(cat "$d/g1.err")"
import json, sys
j = json.load(open(sys.argv[1]))
s = j["speed"]
assert s["gemm_flop_per_s"] == 700e12 and s["device_memory_bytes_per_s"] == 3000e9 and s["host_device_bytes_per_s"] == 50e9, s
assert s["memory_bytes_per_s"] == 20e9, s
assert any(x.startswith("device: GEMM 700.0 TFLOP/s (--gemm-tflops), memory 3000.00 GB/s (--device-bandwidth)") for x in j["sources"]), j["sources"]
c = j["chosen"]["cost"]
assert set(c) >= {"compute_s", "memory_s", "optimizer_s", "nvme_s", "comm_s", "transfer_s"}, c
assert j["chosen"]["need"]["device_per_rank"] <= 79 * 2**30
PY
for bad_flags in "--device-bandwidth 3000" "--host-device-bandwidth 50"; do
  "$Z" plan --model "$M" "${speeds[@]}" $bad_flags > /dev/null 2> "$d/g2.err" && bad "plan on the cpu accepted $bad_flags" ||
    { grep -q "^zerone: error: --device-bandwidth and --host-device-bandwidth describe a GPU of its own: give them with --device cuda" "$d/g2.err" \
      && ok "plan on the cpu refuses $bad_flags" || bad "plan $bad_flags: $(cat "$d/g2.err")"; }
done
"$Z" plan --model "$M" --gemm-tflops -1 --memory-bandwidth 5 > /dev/null 2> "$d/g3.err" && bad "plan accepted --gemm-tflops -1" ||
  { grep -q "^zerone: error: --gemm-tflops -1 is out of range: expected a speed > 0 (or 0: measured)" "$d/g3.err" \
    && ok "plan refuses a negative speed" || bad "plan --gemm-tflops -1: $(cat "$d/g3.err")"; }
exit $fail
