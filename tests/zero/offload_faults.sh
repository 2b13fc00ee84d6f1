#!/usr/bin/env bash
# Offload faults (issue 8): bad offload settings are refused at start-up with one clear line; swap
# I/O failures injected through the fault-injecting SwapIo (ZERONE_SWAP_FAULT=OP:KIND:N, the N-th
# transfer of kind OP counting from 0) end the job with an error naming the swap file and the
# operation, on one rank or all, in bounded time, never with wrong numbers; swap directories are
# gone afterwards, also after SIGINT/SIGTERM; a plan over --device-mem-limit is refused with the
# estimate and the offload settings that would fit.
set -u
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
mkdir "$d/swap"
MPI=(mpiexec --allow-run-as-root --oversubscribe --bind-to none)
export OMPI_MCA_mpi_yield_when_idle=1
printf 'Swap files are scratch, not state. %.0s' $(seq 1 300) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" --val-fraction 0 >/dev/null
base=(train --model gpt2:layers=2,dim=64,heads=2,vocab=257,ctx=32 --data "$d/c_train.bin" --seq 32 --micro-batch 2
      --threads 1 --precision bf16)
run=(--zero-stage 2 --steps 4)
nvme=(--offload-optimizer nvme --nvme-path "$d/swap" --sub-group-size 5000)
fail=0

expect() {  # expect NAME REGEX CMD...
  local name="$1" regex="$2"; shift 2
  local start=$(date +%s)
  timeout 90 "$@" > "$d/$name.out" 2>&1
  local rc=$? elapsed=$(( $(date +%s) - start ))
  if [ $rc -eq 124 ]; then echo "FAIL $name: hung (killed after 90 s)"; fail=1; return; fi
  if [ $rc -eq 0 ]; then echo "FAIL $name: exited 0"; fail=1; return; fi
  if ! grep -qE -- "$regex" "$d/$name.out"; then echo "FAIL $name: output lacks /$regex/:"; tail -n 20 "$d/$name.out"; fail=1; return; fi
  if [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL $name: swap left behind: $(ls "$d/swap")"; rm -rf "$d/swap"/*; fail=1; return; fi
  echo "ok   $name: exit $rc in ${elapsed}s: $(grep -E -m1 -- "$regex" "$d/$name.out" | cut -c1-220)"
}

# Start-up refusals.
expect missing_path "--nvme-path '$d/nope': No such file or directory" "$Z" "${base[@]}" "${run[@]}" --offload-optimizer nvme --nvme-path "$d/nope"
touch "$d/afile"
expect path_is_file "--nvme-path '$d/afile' is not a directory" "$Z" "${base[@]}" "${run[@]}" --offload-optimizer nvme --nvme-path "$d/afile"
expect tmpfs "is on tmpfs/ramfs, which is memory" "$Z" "${base[@]}" "${run[@]}" --offload-optimizer nvme --nvme-path /dev/shm
expect no_path "--offload-optimizer nvme needs --nvme-path DIR" "$Z" "${base[@]}" "${run[@]}" --offload-optimizer nvme
expect path_unused "--nvme-path is given but nothing is offloaded" "$Z" "${base[@]}" "${run[@]}" --nvme-path "$d/swap"
expect buffer_count "--offload-buffer-count 1000 is out of range: expected an integer in 1..64" "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --offload-buffer-count 1000
expect stage0 "--offload-optimizer cpu needs --zero-stage 1, 2 or 3" "$Z" "${base[@]}" --steps 4 --zero-stage 0 --offload-optimizer cpu
expect param_stage "--offload-param cpu needs --zero-stage 3" "$Z" "${base[@]}" "${run[@]}" --offload-param cpu
expect bad_device "--offload-optimizer 'gpu': expected none, cpu or nvme" "$Z" "${base[@]}" "${run[@]}" --offload-optimizer gpu
expect aio_block "--aio-block-size 1000 is out of range" "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --aio-block-size 1000
# A model whose optimizer state is larger than the disk's free space: refused before anything is written.
expect disk_too_small "of swap space under --nvme-path .* but only .* are free" \
  "$Z" train --model gpt2:layers=200,dim=8192,heads=64,vocab=257,ctx=32 --steps 1 --seq 32 --precision bf16 \
  --zero-stage 1 "${nvme[@]}"
# Over the device cap: the estimate by place and what would fit.
expect device_cap "over --device-mem-limit 0.2 GiB .*device param.*Largest over budget: device optim .*Each of these fits by itself \(checked by the estimate\): --offload-optimizer cpu .*zerone plan --model" \
  "$Z" train --model gpt2:layers=4,dim=512,heads=8,vocab=257,ctx=32 --steps 1 --seq 32 --micro-batch 1 --precision bf16 \
  --zero-stage 3 --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 0 --device-mem-limit 0.2
# The setting the message proposes trains under the cap (the arena refuses any device allocation
# past it, so finishing proves the device never held more).
if "$Z" train --model gpt2:layers=4,dim=512,heads=8,vocab=257,ctx=32 --steps 2 --seq 32 --micro-batch 1 --precision bf16 \
  --zero-stage 3 --stage3-param-persistence-threshold 0 --stage3-prefetch-bucket-size 0 --device-mem-limit 0.2 \
  --offload-optimizer cpu --threads 1 > "$d/cap_fits.out" 2>&1; then
  echo "ok   device_cap_fits: trains under --device-mem-limit 0.2 with the offload the refusal proposed"
else echo "FAIL device_cap_fits:"; tail -3 "$d/cap_fits.out"; fail=1; fi
expect device_cap_none "No settings fit this model and batch here; the smallest budget that would fit, per place .*: device [0-9.]+ MiB per rank" \
  "$Z" train --model gpt2:layers=4,dim=512,heads=8,vocab=257,ctx=32 --steps 1 --seq 32 --micro-batch 1 --precision bf16 \
  --zero-stage 1 --device-mem-limit 0.001

# Injected swap faults: the initial writes are 4 per rank (4 units, sub-groups of 5000 elements and
# more), so write:...:6 hits a write-back during step 1 or 2 and read:...:3 a read of step 1.
for fault in write:enospc:6 read:eio:3 read:short:5 write:short:7 write:eio:0 write:delete:6; do
  op=${fault%%:*}
  # Every rank faults:
  ZERONE_SWAP_FAULT=$fault expect "all_${fault//:/_}" "$op of swap file '$d/swap/zerone-swap-[0-9]+-rank[01]/optimizer.swp'" \
    "${MPI[@]}" -n 2 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}"
  # Only rank 1 faults: rank 0 must not wait for it forever.
  expect "rank1_${fault//:/_}" "$op of swap file '$d/swap/zerone-swap-[0-9]+-rank1/optimizer.swp'" \
    "${MPI[@]}" -n 1 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" : -n 1 env ZERONE_SWAP_FAULT=$fault "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}"
done
# Parameter shards on NVMe (stage 3): read-ahead and write-back failures name params.swp.
p3=(--zero-stage 3 --steps 4 --stage3-param-persistence-threshold 0 --offload-param nvme --nvme-path "$d/swap")
for fault in read:eio:2 write:enospc:5 read:short:9; do
  op=${fault%%:*}
  ZERONE_SWAP_FAULT=$fault expect "params_${fault//:/_}" "$op of swap file '$d/swap/zerone-swap-[0-9]+-rank[01]/params.swp'" \
    "${MPI[@]}" -n 2 "$Z" "${base[@]}" "${p3[@]}"
done
# Gradient shards on NVMe (stage 2, Note [Gradient swap]): write-backs and, with two micro-steps,
# the accumulation's read-backs fail naming grads.swp (a plan of its own: ZERONE_GRAD_SWAP_FAULT).
# At one micro-step the shards are transient (Note [Transient gradients]) unless told otherwise;
# at two on the simulated device the sums would be on the device (Note [Gradient sums on the
# device]) unless told otherwise.
for fault in write:eio:2 read:eio:1 read:short:3 write:enospc:9; do
  op=${fault%%:*}
  ZERONE_GRAD_SWAP_FAULT=$fault expect "grads_${fault//:/_}" "$op of swap file '$d/swap/zerone-swap-[0-9]+-rank[01]/grads.swp'" \
    "${MPI[@]}" -n 2 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --grad-accum 2 --grad-accumulators host
done
expect "grads_rank1_write_eio_2" "write of swap file '$d/swap/zerone-swap-[0-9]+-rank1/grads.swp'" \
  "${MPI[@]}" -n 1 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --transient-gradients false : \
  -n 1 env ZERONE_GRAD_SWAP_FAULT=write:eio:2 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --transient-gradients false
# A fault plan that hits nothing changes nothing (the wrapper passes transfers through).
ZERONE_SWAP_FAULT=read:eio:100000 timeout 90 "$Z" "${base[@]}" "${run[@]}" "${nvme[@]}" --metrics "$d/wrapped.jsonl" > "$d/wrapped.out" 2>&1 || { echo "FAIL wrapped"; fail=1; }
timeout 90 "$Z" "${base[@]}" "${run[@]}" --metrics "$d/plain.jsonl" > "$d/plain.out" 2>&1 || { echo "FAIL plain"; fail=1; }
if [ "$(python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$d/wrapped.jsonl")" = \
     "$(python3 -c 'import json,sys; print([json.loads(l)["loss"] for l in open(sys.argv[1])])' "$d/plain.jsonl")" ]; then
  echo "ok   fault wrapper without a fault: same losses as no offload"
else echo "FAIL fault wrapper without a fault changed the losses"; fail=1; fi

# Signals: SIGINT once stops at a step boundary; twice stops at once. Either way no swap file stays.
for signals in 1 2; do
  "$Z" "${base[@]}" --zero-stage 2 "${nvme[@]}" --steps 100000 > "$d/sig$signals.out" 2>&1 &
  pid=$!
  for i in $(seq 1 100); do grep -q "step" "$d/sig$signals.out" 2>/dev/null && [ -n "$(ls -A "$d/swap")" ] && break; sleep 0.1; done
  kill -INT $pid; [ $signals = 2 ] && kill -INT $pid
  timeout 60 tail --pid=$pid -f /dev/null; wait $pid; rc=$?
  if [ $rc -ne 130 ]; then echo "FAIL sigint x$signals: exit $rc"; tail -5 "$d/sig$signals.out"; fail=1
  elif [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL sigint x$signals: swap left behind: $(ls -R "$d/swap")"; fail=1; rm -rf "$d/swap"/*
  else echo "ok   sigint x$signals: exit 130, swap directory removed"; fi
done
# SIGTERM to one rank of two: both stop, neither leaves its swap directory.
"${MPI[@]}" -n 2 "$Z" "${base[@]}" --zero-stage 2 "${nvme[@]}" --steps 100000 > "$d/term.out" 2>&1 &
mpipid=$!
for i in $(seq 1 150); do [ "$(ls "$d/swap" 2>/dev/null | wc -l)" = 2 ] && grep -q "step" "$d/term.out" && break; sleep 0.1; done
rank1=$(ls "$d/swap" | sed -n 's/zerone-swap-\([0-9]*\)-rank1/\1/p')
kill -TERM "$rank1"
timeout 60 tail --pid=$mpipid -f /dev/null; wait $mpipid; rc=$?
if [ $rc -eq 0 ] || [ -n "$(ls -A "$d/swap")" ]; then echo "FAIL sigterm rank 1: exit $rc, left: $(ls "$d/swap")"; fail=1
else echo "ok   sigterm to rank 1: job ended (exit $rc), no swap directory left"; fi
exit $fail
