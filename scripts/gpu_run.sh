#!/usr/bin/env bash
# The GPU run of issue 18, in two halves (docs/GPU.md):
#
#   scripts/gpu_run.sh pack     HERE (the dev machine: nvcc, oneDNN, MPI, no GPU). Builds build-gpu/
#                               for sm_90 with ZERONE_PORTABLE=ON (no -march=native: the binaries run
#                               on another CPU), then packs into gpu_pack/ (ignored by git):
#                               zerone, kernels_test and the non-CUDA shared libraries they load
#                               (oneDNN, Open MPI and its dependencies, liburing, libgomp; from ldd),
#                               at most 64 MiB with the working tree (the device tool's carry limit).
#                               Checks the packed binary starts from the pack alone (it says "no CUDA
#                               GPU" here) and prints the device tool call to make.
#   scripts/gpu_run.sh run      THERE (the lent GPU machine: driver, PyTorch's CUDA 13 wheels, no
#                               apt/oneDNN/MPI). Puts the pack's libraries and the wheels' nvidia/*/lib
#                               (cudart, cuBLASLt) on LD_LIBRARY_PATH, then runs `zerone info`, the op
#                               harness's cuda rows, and tests/zero/device_cuda.sh, writing each
#                               report to $OUT (the device tool brings $OUT back).
#   scripts/gpu_run.sh sanitize THERE, a second call when the first passed: compute-sanitizer's
#                               memcheck and racecheck over the op harness's cuda rows (issue 18 §3).
#
# The device tool call (from the session's checkout, after `pack`):
#   run(command="bash scripts/gpu_run.sh run", carry=["gpu_pack"], timeout_s=420)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
carried="$root/gpu_pack"         # what travels: zerone-pack.tar.xz (xz: oneDNN alone is 40 MB unpacked)
pack="${TMPDIR:-/tmp}/zerone-gpu-pack"  # where it is unpacked and run from (bin/, lib/)
limit_bytes=$((64 * 1024 * 1024))

# Libraries the pack leaves to the target: the C runtime and the compiler's C++ runtime (the target's
# are as new or newer), and CUDA's own (the target's driver and PyTorch's wheels provide them).
system_lib() {
  case "$1" in
    linux-vdso*|ld-linux*|libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas.so*|libcublasLt.so*|libnvrtc*|libnvJitLink*) return 0 ;;
  esac
  return 1
}

do_pack() {
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-/work}"
  local build="$root/build-gpu"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZERONE_PORTABLE=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DZERONE_BUILD_BENCH=OFF -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache > "$build.cmake.log"
  grep -q 'CUDA backend ON' "$build.cmake.log" || { echo "gpu_run.sh: the CUDA backend is not configured (no nvcc?)" >&2; exit 1; }
  # Note [Portable builds]: not one host compile may target this machine's CPU.
  ! grep -q -- '-march=native' "$build/compile_commands.json" ||
    { echo "gpu_run.sh: -march=native in $build/compile_commands.json" >&2; exit 1; }
  nice cmake --build "$build" -j"${JOBS:-2}" --target zerone kernels_test
  rm -rf "$pack" "$carried"
  mkdir -p "$pack/bin" "$pack/lib" "$carried"
  cp "$build/zerone" "$build/tests/kernels_test" "$pack/bin/" 2>/dev/null || cp "$build/zerone" "$(find "$build" -name kernels_test -type f | head -1)" "$pack/bin/"
  strip "$pack/bin/"*
  local lib name
  for lib in $(ldd "$pack/bin/"* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
    name="$(basename "$lib")"
    system_lib "$name" || cp -L "$lib" "$pack/lib/$name"
  done
  strip --strip-unneeded "$pack/lib/"* 2>/dev/null || true
  # The pack alone must resolve everything but the system and CUDA libraries.
  local missing
  missing="$(LD_LIBRARY_PATH="$pack/lib" ldd "$pack/bin/"* "$pack/lib/"* 2>/dev/null | awk '/not found/ {print $1}' | sort -u)"
  [ -z "$missing" ] || { echo "gpu_run.sh: unresolved in the pack: $missing" >&2; exit 1; }
  tar -C "$pack" -cf - bin lib | xz -T"${JOBS:-2}" -6 > "$carried/zerone-pack.tar.xz"
  unpack
  local pack_bytes tree_bytes
  pack_bytes=$(du -sb "$carried" | cut -f1)
  tree_bytes=$(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  echo "gpu_run.sh: pack $((pack_bytes / 1024)) KiB + working tree $((tree_bytes / 1024)) KiB (limit $((limit_bytes / 1024)) KiB)"
  [ $((pack_bytes + tree_bytes)) -le $limit_bytes ] || { echo "gpu_run.sh: over the device tool's 64 MiB" >&2; exit 1; }
  # Starts from the pack, with none of the build tree's paths.
  LD_LIBRARY_PATH="$pack/lib" "$pack/bin/zerone" info | tee "$carried/info.here.txt"
  LD_LIBRARY_PATH="$pack/lib" "$pack/bin/zerone" train --model gpt2:layers=1,dim=32,heads=2,vocab=64,ctx=8 --steps 1 \
    --device cuda > "$carried/no_gpu.here.txt" 2>&1 && { echo "gpu_run.sh: --device cuda ran without a GPU?" >&2; exit 1; }
  cat "$carried/no_gpu.here.txt"
  echo
  echo "Next, from a session that is lent a GPU (docs/GPU.md):"
  echo '  run(command="bash scripts/gpu_run.sh run", carry=["gpu_pack"], timeout_s=420)'
}

# The carried archive, unpacked afresh into $pack.
unpack() {
  rm -rf "$pack" && mkdir -p "$pack"
  xz -dc "$carried/zerone-pack.tar.xz" | tar -C "$pack" -xf -
}

# The GPU machine's environment: the pack's libraries, then PyTorch's CUDA wheels (nvidia/<lib>/lib
# and nvidia/cu13/lib hold libcudart and libcublasLt).
gpu_env() {
  unpack
  local wheels
  wheels="$(python3 -c 'import nvidia, os, glob; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "lib*.so*"))})))' 2>/dev/null || true)"
  export LD_LIBRARY_PATH="$pack/lib${wheels:+:$wheels}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
}

do_sanitize() {
  local out="${OUT:-$root/gpu_out}" rc=0 tool
  mkdir -p "$out"
  gpu_env
  for tool in memcheck racecheck; do
    (cd "$root" && timeout 240 compute-sanitizer --tool "$tool" --error-exitcode 3 "$pack/bin/kernels_test" \
       --gtest_filter='*_cuda') > "$out/sanitize_$tool.log" 2>&1 || rc=1
    tail -15 "$out/sanitize_$tool.log"
  done
  return $rc
}

do_run() {
  local out="${OUT:-$root/gpu_out}"
  mkdir -p "$out"
  gpu_env
  {
    date -u; ldd --version | head -1  # the pack needs glibc >= 2.36 and libstdc++ of GCC >= 12
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1 || true
    echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
    ldd "$pack/bin/zerone" | grep -E 'cuda|cublas|not found' || true
    "$pack/bin/zerone" info
  } > "$out/info.txt" 2>&1 || true
  cat "$out/info.txt"
  local rc=0
  # The op harness: every case on cuda (against the reference and the cpu backend), plus the cpu
  # rows as a control. Each row's result lands in the XML report.
  local status=0
  (cd "$root" && timeout 300 "$pack/bin/kernels_test" --gtest_filter='*cuda*:*Cuda*:*_cpu' \
     --gtest_output=xml:"$out/kernels_test.xml") > "$out/kernels_test.log" 2>&1 || status=$?
  grep -E '^\[  (FAILED|PASSED|SKIPPED) ' "$out/kernels_test.log" | tail -60
  if [ "$status" -gt 1 ]; then
    # A crash (an abort inside the backend, a fault) ends the binary: then each cuda case runs on
    # its own, so one run still says which cases pass, fail or crash.
    rc=1
    echo "kernels_test ended with status $status: running each cuda case alone"
    local t
    for t in $("$pack/bin/kernels_test" --gtest_list_tests --gtest_filter='*cuda*:*Cuda*' |
               awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}'); do
      if (cd "$root" && timeout 30 "$pack/bin/kernels_test" --gtest_filter="$t") > "$out/one.log" 2>&1; then
        grep -q '^\[  SKIPPED' "$out/one.log" && echo "SKIPPED $t" || echo "PASSED $t"
      else
        echo "FAILED($?) $t"; grep -E 'Failure|error|Expected|Which is|internal' "$out/one.log" | head -8 | sed 's/^/    /'
      fi
    done > "$out/kernels_cuda_each.log" 2>&1
    rm -f "$out/one.log"
    grep -c '^PASSED' "$out/kernels_cuda_each.log" | sed 's/$/ cuda cases pass alone/'
    grep '^FAILED' "$out/kernels_cuda_each.log" | head -40
  elif [ "$status" -ne 0 ]; then
    rc=1
  fi
  (cd "$root" && timeout 300 bash tests/zero/device_cuda.sh "$pack/bin/zerone") > "$out/device_cuda.log" 2>&1 || rc=1
  tail -40 "$out/device_cuda.log"
  echo "gpu_run.sh: reports in $out (rc $rc)"
  return $rc
}

case "${1:-}" in
  pack) do_pack ;;
  run) do_run ;;
  sanitize) do_sanitize ;;
  *) echo "usage: scripts/gpu_run.sh pack|run|sanitize (docs/GPU.md)" >&2; exit 2 ;;
esac
