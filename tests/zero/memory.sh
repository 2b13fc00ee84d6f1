#!/usr/bin/env bash
# Memory (issue 3): at world 4, for each stage, the ledger's model-state bytes (metrics "mem") equal
# `zerone estimate` exactly and follow the ZeRO formulas up to padding; the pooled working set
# (ledger "comm" at the end of a step) stays within the estimate's bound; stage 3 lowers peak RSS.
# The formulas hold every gradient shard until the step: --transient-gradients false (the bytes of
# transient gradients are tests/zero/transient_gradients.sh's).
set -euo pipefail
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 4)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Memory is the treasury and guardian of all things. %.0s' $(seq 1 200) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
# ~10M parameters so that model state dominates the process (peak RSS comparison).
model=gpt2:layers=4,dim=448,heads=7,vocab=257,ctx=16
for precision in bf16 fp32; do
  for stage in 0 1 2 3; do
    "${MPI[@]}" "$Z" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 --threads 1 \
      --precision $precision --zero-stage $stage --stage3-param-persistence-threshold 0 \
      --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 --transient-gradients false \
      --metrics "$d/${precision}_s$stage.jsonl" > "$d/${precision}_s$stage.log" 2>&1 || { cat "$d/${precision}_s$stage.log"; exit 1; }
  done
  "$Z" estimate --model $model --world 4 --precision $precision --micro-batch 1 --seq 16 \
    --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 \
    --transient-gradients false --json > "$d/${precision}_estimate.json"
done
python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
failed = False
for precision in ("bf16", "fp32"):
    est = {s["stage"]: s for s in json.load(open(f"{d}/{precision}_estimate.json"))["stages"]}
    params = json.load(open(f"{d}/{precision}_estimate.json"))["parameters"]
    N, ds = 4, 2 if precision == "bf16" else 4
    P, G, O = ds * params, 4 * params, (12 if precision == "bf16" else 8) * params
    formula = {0: P + G + O, 1: P + G + O / N, 2: P + (G + O) / N, 3: (P + G + O) / N}
    rss = {}
    for stage in range(4):
        mem = json.loads(open(f"{d}/{precision}_s{stage}.jsonl").readlines()[-1])["mem"]
        got = {k: mem.get(f"device.{k}", 0) for k in ("param", "grad", "master", "optim")}
        want = {k: est[stage][k] for k in ("param", "grad", "master", "optim")}
        total = sum(got.values())
        # Padding: each unit rounds up to a multiple of world*64 elements.
        pad_slack = 6 * N * 64 * (ds + 4 + 12)
        pooled, pool_bound = mem.get("device.comm", 0), est[stage]["working_set"]["total"]
        ok = got == want and abs(total - formula[stage]) <= pad_slack and pooled <= pool_bound
        failed |= not ok
        rss[stage] = mem["peak_rss"]
        print(f"{'ok  ' if ok else 'FAIL'} {precision} stage {stage}: ledger {got} estimate {want} "
              f"total {total} formula {formula[stage]:.0f}; pooled working set {pooled} <= bound {pool_bound}")
    # Stage 3 saves the model-state difference, less its working set (bounded by the estimate:
    # gathered and prefetched parameters, full gradients in backward and in flight), the rest of
    # the process being the same.
    # On a device that stages collectives through host memory (sim at world 4) the host buffers
    # of the collectives in flight add to stage 3's peak (Note [Staged collective bytes]); on cpu
    # the estimate's line is 0.
    working_set = est[3]["working_set"]["total"]
    staged = est[3]["staged_collectives"]
    bound = rss[0] - (formula[0] - formula[3]) + working_set + staged
    ok = rss[3] <= bound
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} {precision} peak RSS stage 0 {rss[0]}, stage 3 {rss[3]} <= {bound:.0f} "
          f"(stage 0 less the model-state saving {formula[0] - formula[3]:.0f}, plus the working set {working_set}"
          f" and staged collectives {staged})")
sys.exit(1 if failed else 0)
PY

# Offload (issue 8), world 2, bf16: for every offload setting the ledger's model state per
# (place, category), swap staging included, equals zerone estimate's to the byte; also with a
# partial optimizer offload (ratio below 1: Note [Partial optimizer offload], the boundary inside a
# block's shard of 4 sub-groups) and with --delayed-update's gradient and parameter copies.
# Each case: stage, optimizer offload, param offload, ratio, delayed update (0/1), and optionally the
# NVMe ratio (Note [Optimizer state on NVMe and in host memory]: the rest of the state in host memory).
cases=("1 cpu none 1 0" "2 cpu none 1 0" "3 cpu cpu 1 0" "3 none cpu 1 0" "1 nvme none 1 0" "2 nvme none 1 0"
       "3 nvme cpu 1 0" "3 none nvme 1 0" "3 nvme nvme 1 0"
       "2 cpu none 0.5 0" "1 nvme none 0.5 0" "3 nvme cpu 0.4 0" "3 nvme nvme 0.6 0" "3 cpu cpu 0 0"
       "0 none none 1 1" "1 none none 1 1" "2 none none 1 1" "3 cpu cpu 1 1" "2 nvme none 0.5 1" "1 cpu none 0.7 1"
       "2 nvme none 1 0 0.5" "3 nvme nvme 1 0 0.3" "1 nvme none 0.6 0 0.5")
mkdir "$d/swap"
for c in "${cases[@]}"; do
  read -r stage opt par ratio dpu nvme_ratio <<< "$c"
  name="off_s${stage}_${opt}_${par}_r${ratio}_d${dpu}${nvme_ratio:+_n$nvme_ratio}"
  extra=(); [ "$opt" != none ] && extra=(--sub-group-size 300000 --offload-buffer-count 3 --offload-optimizer-ratio $ratio)
  [ -n "$nvme_ratio" ] && extra+=(--offload-optimizer-nvme-ratio $nvme_ratio)
  [ "$dpu" = 1 ] && extra+=(--delayed-update)
  nvme=(); [ "$opt" = nvme ] || [ "$par" = nvme ] && nvme=(--nvme-path "$d/swap")
  "${MPI[@]:0:5}" -n 2 "$Z" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 --threads 1 \
    --precision bf16 --zero-stage $stage --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 \
    --reduce-bucket-size 1000000 --offload-optimizer $opt --offload-param $par "${extra[@]}" "${nvme[@]}" \
    --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
  "$Z" estimate --model $model --world 2 --precision bf16 --micro-batch 1 --seq 16 --zero-stage $stage \
    --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 \
    --offload-optimizer $opt --offload-param $par "${extra[@]}" --json > "$d/$name.estimate.json"
done
python3 - "$d" "${cases[@]}" <<'PY'
import json, sys
d, cases = sys.argv[1], sys.argv[2:]
failed = False
for c in cases:
    stage, opt, par, ratio, dpu, *nvme_ratio = c.split()
    name = f"off_s{stage}_{opt}_{par}_r{ratio}_d{dpu}" + "".join(f"_n{r}" for r in nvme_ratio)
    est = json.load(open(f"{d}/{name}.estimate.json"))["stages"][0]
    want = est["model_state_places"]
    mem = json.loads(open(f"{d}/{name}.jsonl").readlines()[-1])["mem"]
    cats = ("param", "grad", "master", "optim", "swap")
    got = {k: v for k, v in mem.items() if k.split(".")[-1] in cats}
    ws = est["working_set"]
    # Host staging: the NVMe parameter staging pool, and on a device that stages collectives the
    # host buffers of those in flight at the end of a step (stages 1-2: the next step's parameter
    # all-gathers; Note [Staged collective bytes]; 0 on cpu).
    host_bound = ws["host"] + est["staged_collectives"]
    ok = got == want and mem.get("device.comm", 0) <= ws["param"] + ws["grad"] + ws["comm"] and mem.get("host.comm", 0) <= host_bound
    # A partial offload puts optimizer state on both sides.
    if 0 < float(ratio) < 1:
        place = "host" if opt == "cpu" else "nvme"
        ok = ok and want.get("device.optim", 0) > 0 and want.get(f"{place}.optim", 0) > 0
    # An NVMe ratio below 1 puts it on NVMe and in host memory.
    if nvme_ratio:
        ok = ok and want.get("nvme.optim", 0) > 0 and want.get("host.optim", 0) > 0
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} stage {stage} optimizer {opt} (ratio {ratio}{', NVMe ratio ' + nvme_ratio[0] if nvme_ratio else ''}) param {par} delayed update {dpu}: "
          f"ledger {got} estimate {want}; host staging {mem.get('host.comm', 0)} <= {host_bound}")
sys.exit(1 if failed else 0)
PY

# Note [Speculative early step] (issue 8): with --grad-clip and NVMe offload the early step keeps
# undo copies in memory and spare swap slots on NVMe. What a clipped run holds beyond the same run without
# clipping, per (place, category), equals what zerone estimate --grad-clip adds, to the byte
# (kernels' own scratch is the same in both runs).
spec_cases=("1 nvme none" "3 nvme cpu" "3 none nvme" "3 nvme nvme")
for c in "${spec_cases[@]}"; do
  read -r stage opt par <<< "$c"
  name="off_s${stage}_${opt}_${par}_r1_d0"  # the ratio-1, no-delayed-update run above
  extra=(); [ "$opt" = nvme ] || [ "$par" = nvme ] && extra=(--nvme-path "$d/swap" --sub-group-size 300000 --offload-buffer-count 3)
  "${MPI[@]:0:5}" -n 2 "$Z" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 --threads 1 \
    --precision bf16 --zero-stage $stage --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 \
    --reduce-bucket-size 1000000 --offload-optimizer $opt --offload-param $par "${extra[@]}" --grad-clip 1000 \
    --metrics "$d/$name.clip.jsonl" > "$d/$name.clip.log" 2>&1 || { cat "$d/$name.clip.log"; exit 1; }
  "$Z" estimate --model $model --world 2 --precision bf16 --micro-batch 1 --seq 16 --zero-stage $stage \
    --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 \
    --offload-optimizer $opt --offload-param $par "${extra[@]:2}" --grad-clip 1000 --json > "$d/$name.clip.estimate.json"
done
python3 - "$d" "${spec_cases[@]}" <<'PY'
import json, sys
d, cases = sys.argv[1], sys.argv[2:]
failed = False
def delta(a, b):
    return {k: a.get(k, 0) - b.get(k, 0) for k in set(a) | set(b) if a.get(k, 0) != b.get(k, 0)}
for c in cases:
    stage, opt, par = c.split()
    name = f"off_s{stage}_{opt}_{par}_r1_d0"
    est = json.load(open(f"{d}/{name}.clip.estimate.json"))["stages"][0]
    est0 = json.load(open(f"{d}/{name}.estimate.json"))["stages"][0]
    want = delta(est["model_state_places"], est0["model_state_places"])
    mem = {k: v for k, v in json.loads(open(f"{d}/{name}.clip.jsonl").readlines()[-1])["mem"].items() if k.split(".")[-1] != "peak_rss" and not k.endswith(".comm") and k != "peak_rss"}
    mem0 = {k: v for k, v in json.loads(open(f"{d}/{name}.jsonl").readlines()[-1])["mem"].items() if not k.endswith(".comm") and k != "peak_rss"}
    got = delta(mem, mem0)
    # The speculation's bytes are the scratch; the rest of the difference is the gradients, which
    # the unclipped run holds only until their updates (Note [Transient gradients]) and the
    # clipped one until the step (in grads.swp with the optimizer on NVMe), as estimated too.
    scratch = sum(v for k, v in want.items() if k.endswith(".scratch"))
    ok = got == want and scratch == est.get("speculation", 0) > 0
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} speculation stage {stage} optimizer {opt} param {par}: ledger adds {got}, "
          f"estimate adds {want} (speculation {est.get('speculation', 0)})")
sys.exit(1 if failed else 0)
PY
# SGD (issue 11): the optimizer's own state, not Adam's. At world 2, for SGD with and without
# momentum, f32 and bf16, in memory and offloaded, the ledger's model state per (place, category)
# equals zerone estimate's to the byte (momentum 0 in f32: no optimizer state at all). And the
# start-up check counts that state: a --device-mem-limit between SGD's need and what Adam's state
# would need is accepted (the cap is also enforced on every device allocation).
sgd_cases=("0 none 0.9 fp32" "1 none 0 fp32" "2 none 0.5 bf16" "3 none 0 bf16" "1 cpu 0.9 bf16" "2 nvme 0.9 fp32" "3 nvme 0 bf16")
for c in "${sgd_cases[@]}"; do
  read -r stage opt momentum precision <<< "$c"
  name="sgd_s${stage}_${opt}_${momentum}_${precision}"
  extra=(); [ "$opt" = nvme ] && extra=(--nvme-path "$d/swap" --sub-group-size 300000 --offload-buffer-count 3)
  "${MPI[@]:0:5}" -n 2 "$Z" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 --threads 1 \
    --precision $precision --zero-stage $stage --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 \
    --reduce-bucket-size 1000000 --offload-optimizer $opt --optimizer sgd --momentum $momentum "${extra[@]}" \
    --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 || { cat "$d/$name.log"; exit 1; }
  for o in sgd adamw; do
    momentum_flag=(); [ $o = sgd ] && momentum_flag=(--momentum $momentum)
    "$Z" estimate --model $model --world 2 --precision $precision --micro-batch 1 --seq 16 --zero-stage $stage \
      --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 \
      --offload-optimizer $opt "${extra[@]:2}" --optimizer $o "${momentum_flag[@]}" --json > "$d/$name.$o.json"
  done
done
python3 - "$d" "${sgd_cases[@]}" <<'PY'
import json, sys
d, cases = sys.argv[1], sys.argv[2:]
failed = False
for c in cases:
    stage, opt, momentum, precision = c.split()
    name = f"sgd_s{stage}_{opt}_{momentum}_{precision}"
    est = json.load(open(f"{d}/{name}.sgd.json"))["stages"][0]
    want = est["model_state_places"]
    mem = json.loads(open(f"{d}/{name}.jsonl").readlines()[-1])["mem"]
    got = {k: v for k, v in mem.items() if k.split(".")[-1] in ("param", "grad", "master", "optim", "swap")}
    no_state = float(momentum) == 0 and precision == "fp32"
    ok = got == want and (est["optim"] + est["master"] == 0) == no_state
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} SGD stage {stage} optimizer on {opt} momentum {momentum} {precision}: "
          f"ledger {got} estimate {want}")
    adam = json.load(open(f"{d}/{name}.adamw.json"))["stages"][0]
    if adam["device"] > est["device"]:
        print(f"{name} {(est['device'] + adam['device']) / 2 / 2**30!r}", file=open(f"{d}/limits.txt", "a"))
sys.exit(1 if failed else 0)
PY
# The largest saving: the cap halfway between SGD's device need and Adam's.
read -r name limit < <(sort -t' ' -k2 -g "$d/limits.txt" | tail -1)
read -r stage opt momentum precision <<< "$(echo "$name" | sed 's/^sgd_s//; s/_/ /g')"
extra=(); [ "$opt" = nvme ] && extra=(--nvme-path "$d/swap" --sub-group-size 300000 --offload-buffer-count 3)
"${MPI[@]:0:5}" -n 2 "$Z" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 --threads 1 \
  --precision $precision --zero-stage $stage --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 \
  --reduce-bucket-size 1000000 --offload-optimizer $opt --optimizer sgd --momentum $momentum "${extra[@]}" \
  --device-mem-limit "$limit" > "$d/limit.log" 2>&1 || { echo "FAIL: SGD refused under --device-mem-limit $limit GiB"; cat "$d/limit.log"; exit 1; }
echo "ok   SGD stage $stage ($opt, momentum $momentum, $precision) runs under --device-mem-limit $limit GiB, below Adam's need"

# ZeRO++ (issue 21), bf16 stage 3 at world 2 (one host) and world 4 (two fake hosts of 2 ranks:
# each rank in a UTS namespace of its own named zhost1/zhost2, so qgZ runs hierarchically, within
# then across "hosts"): the ledger's model state per (place, category) equals zerone estimate's to
# the byte, hpZ's secondary partition included (Note [Secondary partition] in zero/zeropp.h), and the
# quantized communication buffers of qwZ and qgZ are pooled within the working-set bound of
# Note [ZeRO++ working set] (idle in device.comm, or host.comm for qwZ's shard with --offload-param).
# Each case: world, hpZ group size, qwZ (0/1), qgZ bits, parameter offload.
zpp_cases=("2 2 0 0 none" "2 1 1 0 none" "2 1 0 8 none" "2 2 1 4 none" "4 2 1 8 none" "4 1 0 4 none" "4 2 1 8 cpu"
           "2 1 0 0 none" "4 1 0 0 none" "4 1 0 0 cpu")  # the last three: plain stage 3, the references
for c in "${zpp_cases[@]}"; do
  read -r world hpz qw qg par <<< "$c"
  name="zpp_w${world}_h${hpz}_q${qw}_g${qg}_${par}"
  flags=(--hpz-partition-size $hpz --quantized-gradients $qg --offload-param $par)
  [ "$qw" = 1 ] && flags+=(--quantized-weights)
  launch=("$Z"); [ "$world" = 4 ] && launch=(unshare --uts sh -c 'hostname zhost$((OMPI_COMM_WORLD_RANK / 2 + 1)) && exec "$@"' sh "$Z")
  "${MPI[@]:0:5}" -n $world "${launch[@]}" train --model $model --data "$d/c_train.bin" --micro-batch 1 --seq 16 --steps 2 \
    --threads 1 --precision bf16 --zero-stage 3 --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 \
    --reduce-bucket-size 1000000 "${flags[@]}" --metrics "$d/$name.jsonl" > "$d/$name.log" 2>&1 \
    || { cat "$d/$name.log"; exit 1; }
  "$Z" estimate --model $model --world $world --precision bf16 --micro-batch 1 --seq 16 --zero-stage 3 \
    --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 3000000 --reduce-bucket-size 1000000 \
    "${flags[@]}" --json > "$d/$name.estimate.json"
done
grep -q "topology: 2 hosts x 2 ranks" "$d/zpp_w4_h2_q1_g8_none.log" && grep -q "qgZ int8 (within then across hosts)" "$d/zpp_w4_h2_q1_g8_none.log" \
  || { echo "FAIL: the fake hosts did not give a 2 x 2 topology with hierarchical qgZ:"; grep -m3 "zerone:" "$d/zpp_w4_h2_q1_g8_none.log"; exit 1; }
python3 - "$d" "${zpp_cases[@]}" <<'PY'
import json, sys
d, cases = sys.argv[1], sys.argv[2:]
failed = False
def load(world, hpz, qw, qg, par):
    name = f"zpp_w{world}_h{hpz}_q{qw}_g{qg}_{par}"
    return (json.load(open(f"{d}/{name}.estimate.json"))["stages"][0],
            json.loads(open(f"{d}/{name}.jsonl").readlines()[-1])["mem"])
for c in cases:
    world, hpz, qw, qg, par = c.split()
    if (hpz, qw, qg) == ("1", "0", "0"): continue  # the plain references
    est, mem = load(world, hpz, qw, qg, par)
    want = est["model_state_places"]
    got = {k: v for k, v in mem.items() if k.split(".")[-1] in ("param", "grad", "master", "optim", "swap")}
    ws = est["working_set"]
    plain_est, plain_mem = load(world, "1", "0", "0", par)
    ok = got == want
    # hpZ: the secondary partition is device param beyond plain stage 3's (and only that differs).
    secondary = want.get("device.param", 0) - plain_est["model_state_places"].get("device.param", 0)
    ok = ok and (secondary > 0) == (hpz != "1")
    # qwZ/qgZ: the bound grew by their term, and their buffers went back to the pool (idle comm beyond plain's).
    grew = ws["comm"] + ws["host"] - plain_est["working_set"]["comm"] - plain_est["working_set"]["host"]
    pooled = mem.get("device.comm", 0) + mem.get("host.comm", 0) - plain_mem.get("device.comm", 0) - plain_mem.get("host.comm", 0)
    quantized = qw == "1" or qg != "0"
    ok = ok and (grew > 0) == quantized and (not quantized or pooled > 0)
    ok = ok and mem.get("device.comm", 0) <= ws["param"] + ws["grad"] + ws["comm"] and mem.get("host.comm", 0) <= ws["host"]
    failed |= not ok
    print(f"{'ok  ' if ok else 'FAIL'} ZeRO++ world {world} hpZ {hpz} qwZ {qw} qgZ {qg} offload-param {par}: ledger {got} "
          f"estimate {want} (secondary partition {secondary}); pooled device {mem.get('device.comm', 0)} <= "
          f"{ws['param'] + ws['grad'] + ws['comm']}, host {mem.get('host.comm', 0)} <= {ws['host']} (ZeRO++ term {grew})")
sys.exit(1 if failed else 0)
PY
