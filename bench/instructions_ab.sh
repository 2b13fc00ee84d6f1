#!/usr/bin/env bash
# Instructions per training step of two zerone builds, counted by callgrind: a measure of "did this
# change make the step cost more" that the machine's load cannot move (docs/BENCHMARKS.md, "The
# device seam costs nothing"; step times on this VM vary by up to 1.7x between neighbouring runs).
#
#   bash bench/instructions_ab.sh BEFORE_BIN AFTER_BIN [WORLDS] [STAGES]     (defaults "1 2", "0 1 2 3")
#
# Both builds must avoid AVX-512, which valgrind cannot run: configure them with
#   -DZERONE_NATIVE=OFF -DCMAKE_CXX_FLAGS="-march=x86-64-v3"
# and oneDNN is held to AVX2 (ONEDNN_MAX_CPU_ISA), where it has no bf16 GEMM: the runs are fp32.
# The model is small (W3's shape family at 2 layers, dim 128, micro-batch 2 x seq 64) so that a run
# takes minutes under valgrind; a small model makes the per-op cost of dispatch a larger share of the
# step than at W1 or W3, so a ratio here bounds theirs from above.
#
# Per step = (instructions of a 4-step run - those of a 2-step run) / 2, all ranks summed: start-up
# cancels. Instructions spent waiting are reported apart and left out of the ratio: the MPI runtime
# (its progress loop spins as long as the other rank is busy, so its count depends on timing) and
# the host's wait loops (zerone's MpiWorker::wait polling, mutexes, clocks, sleeps).
# Needs valgrind and python3; world > 1 needs mpiexec. Output in $INSTR_DIR (default a temp dir).
set -euo pipefail
before=$1; after=$2; worlds=${3:-1 2}; stages=${4:-0 1 2 3}
dir=${INSTR_DIR:-$(mktemp -d)}
mkdir -p "$dir"
"$after" prepare --text /usr/share/common-licenses/GPL-3 --out "$dir/c" --val-fraction 0 >/dev/null
export OMP_WAIT_POLICY=passive ONEDNN_MAX_CPU_ISA=AVX2

run() {  # run TAG BIN WORLD STAGE STEPS
  local out="$dir/$1.w$3.s$4.n$5"
  local cmd=(valgrind --tool=callgrind "--callgrind-out-file=$out.%p.cg" "$2" train
             --model gpt2:layers=2,dim=128,heads=4,vocab=257,ctx=64 --data "$dir/c_train.bin" --micro-batch 2
             --seq 64 --threads 1 --precision fp32 --steps "$5" --no-shuffle --zero-stage "$4"
             --reduce-bucket-size 500000000)
  [ "$4" = 3 ] && cmd+=(--stage3-prefetch-bucket-size 2000000)
  if [ "$3" = 1 ]; then "${cmd[@]}" > "$out.log" 2>&1 || true
  else mpiexec --allow-run-as-root --oversubscribe --bind-to none -n "$3" "${cmd[@]}" > "$out.log" 2>&1 || true; fi
}

for w in $worlds; do for s in $stages; do for n in 2 4; do
  run before "$before" "$w" "$s" "$n"; run after "$after" "$w" "$s" "$n"
done; done; done

python3 - "$dir" "$worlds" "$stages" <<'EOF'
import glob, re, subprocess, sys
d, worlds, stages = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
waiting = re.compile(r'libmpi|libopen-pal|libopen-rte|mca_|libpmix|libevent|libhwloc|libucs|libucp|libuct|libfabric'
                     r'|MpiWorker::wait|pthread_mutex_|clock_gettime|steady_clock::now|nanosleep|sched_yield|asynccancel')
def count(pattern):  # (work, waiting) instructions of every rank's profile
    files = glob.glob(pattern)
    if not files: return None
    work = wait = 0
    for f in files:
        result = subprocess.run(['callgrind_annotate', '--threshold=100', '--inclusive=no', '--auto=no', f],
                                capture_output=True, text=True)
        if result.returncode != 0: return None  # a profile the run did not finish writing
        table = result.stdout
        for line in table.splitlines():
            m = re.match(r'\s*([\d,]+) \([ \d.]+%\)\s+(.*)', line)
            if not m or 'PROGRAM TOTALS' in line: continue
            n = int(m.group(1).replace(',', ''))
            if waiting.search(m.group(2)): wait += n
            else: work += n
    return work, wait
print('| world | stage | before, M instructions/step | after | after / before | waiting in the 4-step run, before / after, M (timing-dependent) |')
print('|---|---|---|---|---|---|')
for w in worlds:
    for s in stages:
        per = {}
        for tag in ('before', 'after'):
            n2, n4 = count(f'{d}/{tag}.w{w}.s{s}.n2.*.cg'), count(f'{d}/{tag}.w{w}.s{s}.n4.*.cg')
            ok = n2 and n4 and any('final loss' in open(p).read() for p in glob.glob(f'{d}/{tag}.w{w}.s{s}.n4.log'))
            per[tag] = ((n4[0] - n2[0]) / 2, n4[1]) if ok else None
        if None in per.values():
            print(f'| {w} | {s} | a run failed: see {d}/*.w{w}.s{s}.*.log | | | |'); continue
        (b, bw), (a, aw) = per['before'], per['after']
        print(f'| {w} | {s} | {b/1e6:.2f} | {a/1e6:.2f} | **{a/b:.4f}** | {bw/1e6:.1f} / {aw/1e6:.1f} |')
EOF
