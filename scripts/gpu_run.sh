#!/usr/bin/env bash
# The GPU run of issues 18 and 19 (docs/GPU.md): build and pack here, run there in ONE device call.
#
#   scripts/gpu_run.sh pack     HERE (the dev machine: nvcc, oneDNN, MPI, no GPU). Builds build-gpu/ for
#                               sm_90 with ZERONE_PORTABLE=ON (no -march=native), then packs into
#                               gpu_pack/zerone-pack.tar.gz (ignored by git): zerone, every test program
#                               that links CUDA (found from the build's link lines: later tests come
#                               along without editing this script), Open MPI's launcher (orterun as
#                               mpiexec, orted, the MCA components, PMIx, help files), the non-CUDA
#                               shared libraries of all of them (from ldd), and lib/compat/ (glibc 2.36
#                               with its loader, GCC 12's libstdc++ and libgcc_s) used only where the
#                               target's are older (Note [Pack modes]). At most 64 MiB with the working
#                               tree (the device tool's carry limit). Ends with `check` on this machine.
#   scripts/gpu_run.sh check    ANYWHERE the pack is unpacked: the CPU side of the pack works there:
#                               `zerone info`, a short cpu training run, the op harness's cpu rows,
#                               `--device cuda` refused with one `zerone: error:` line when no GPU is
#                               present, and world 2 under the pack's mpiexec (stage 2; the losses are
#                               printed: selftest compares them with this machine's own run).
#   scripts/gpu_run.sh selftest [bookworm|bullseye]   HERE, as root: unpacks a minimal Debian root (no
#                               oneDNN, MPI, liburing, libgomp, python; the clean room's cached base or
#                               a cached debootstrap), binds PyTorch's nvidia/*/lib wheels of the peers'
#                               environment into it as the GPU machine has them, copies the working
#                               tree and gpu_pack/ in, and runs `check` and then `run` there in a chroot
#                               (run without a GPU: every step must report, none may fail for packaging).
#                               bookworm (glibc 2.36) proves the plain mode, bullseye (glibc 2.31,
#                               GCC 10's libstdc++) the compat mode. Reports in build-gpu/selftest-SUITE/.
#   scripts/gpu_run.sh run      THERE (the lent GPU machine: driver, PyTorch's CUDA 13 wheels, python3
#                               with torch, no apt/oneDNN/MPI). In at most ZERONE_GPU_BUDGET_S seconds
#                               (default 480; each step capped, later steps skipped when time runs out):
#                               info; every packed test program's CUDA/NCCL rows (gtest filter below);
#                               every tests/*/*cuda*.sh and *nccl*.sh (world 1 and the multi-rank ones
#                               under the pack's mpiexec); then W5 beside PyTorch (GPT-2 124M, the
#                               flash attention alone beside SDPA, Llama-3.2-1B: bench_w5.log). Each
#                               report is written to $OUT as the step runs; a failed or crashed step
#                               never stops the next. Files in $OUT (the device tool brings back 8):
#                               summary.txt (one line per step), info.txt, gtest_cuda.log,
#                               zero_cuda.log, bench_w5.log, extra.tar.gz (XML, metrics).
#                               ZERONE_W5_PEERS (default "eager compile") names the PyTorch modes timed;
#                               ZERONE_W5_PROFILE=0 leaves out the 5-step --profile run after each
#                               zerone W5 run (its per-category GPU time: bench_w5.log).
#   scripts/gpu_run.sh profile  THERE: Nsight Compute's per-kernel GPU time of a 2-step W5 run.
#   scripts/gpu_run.sh more     THERE, a second call: profile, sanitize and the torch.compile peer of W5.
#   scripts/gpu_run.sh again    THERE, a second call after `run` found a failing step: device_cuda.sh,
#                               W5 GPT-2 (largest micro-batch, eager peer), `offload`, then `profile`.
#   scripts/gpu_run.sh offload  THERE, a call of its own (issue 19 §4): ZeRO-Offload on the GPU beside
#                               FSDP2's CPUOffloadPolicy, then the Llama-2-7B shape (offload.log).
#   scripts/gpu_run.sh focus    THERE, the one call of a session with 15 minutes of device time: the
#                               op harness's cuda rows (kernels_test), the Llama-2-7B shape with the
#                               optimizer offloaded (ZERONE_7B_RUNS, default "dpu accum plain"), then
#                               W5 GPT-2 beside PyTorch eager (summary.txt, gtest_cuda.log, offload.log,
#                               bench_w5.log, extra.tar.gz).
#   scripts/gpu_run.sh sanitize THERE, a second call when the first passed: compute-sanitizer's memcheck
#                               and racecheck over the op harness's cuda rows (issue 18 §3).
#
# The device tool call (from the session's checkout, after `pack`; docs/GPU.md):
#   run(command="bash scripts/gpu_run.sh run", carry=["gpu_pack"], timeout_s=540)
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
carried="$root/gpu_pack"         # what travels: zerone-pack.tar.gz (gzip: in every image, xz is not)
pack="${ZERONE_PACK_DIR:-${TMPDIR:-/tmp}/zerone-gpu-pack}"  # where it is unpacked and run from
limit_bytes=$((64 * 1024 * 1024))
gtest_cuda_filter='*cuda*:*Cuda*:*CUDA*:*nccl*:*Nccl*:*NCCL*'
ompi_pkglibdir=/usr/lib/x86_64-linux-gnu/openmpi/lib/openmpi3
pmix_dir=/usr/lib/x86_64-linux-gnu/pmix2

# Note [Pack modes]
# The binaries are built on Debian 12 (glibc 2.36, GCC 12). The pack leaves the C and C++ runtimes
# to the target (its python and torch use them too), which works where the target's are as new:
# zerone itself needs GLIBC_2.35 and GLIBCXX_3.4.30, the packed libevent (Open MPI) GLIBC_2.36
# (`MANIFEST` lists what each needs). The GPU machine's image is not documented beyond "Python
# 3.12.3" (Ubuntu 24.04's: glibc 2.39, GCC 14; but Ubuntu 22.04 has glibc 2.35, one short). So the
# pack also carries lib/compat/: Debian 12's glibc (its loader, libc, libm, ...) and libstdc++ /
# libgcc_s. At unpack, `zerone info` is tried with the target's runtimes; only if the loader
# refuses (a missing GLIBC_/GLIBCXX_ version) does every packed program start through the packed
# loader (`ld-linux-x86-64.so.2 --library-path compat:lib:... program`): the "compat" mode. Either
# way the programs are started by small wrappers in bin/ that set the library path for that
# program alone, never for the environment: python3, torch and the test scripts keep the target's
# own runtimes (a packed libc in LD_LIBRARY_PATH would break every program of the target).

# Libraries left to the target: the C runtime and the compiler's C++ runtime (packed separately into
# lib/compat/), and CUDA's own (the driver, and PyTorch's nvidia-* wheels on the GPU machine).
glibc_lib() {
  case "$1" in
    ld-linux*|libc.so*|libm.so*|libmvec.so*|libpthread.so*|libdl.so*|librt.so*|libutil.so*|libresolv.so*|libanl.so*) return 0 ;;
  esac
  return 1
}
system_lib() {
  glibc_lib "$1" && return 0
  case "$1" in
    linux-vdso*|libstdc++.so*|libgcc_s.so*) return 0 ;;
    libcuda.so*|libcudart.so*|libcublas*|libcudnn*|libcufft*|libcurand*|libcusolver*|libcusparse*|libcufile*) return 0 ;;
    libnccl*|libnvrtc*|libnvJitLink*|libnvToolsExt*|libnvshmem*|libnvidia-*) return 0 ;;
  esac
  return 1
}
# Open MPI components left out: their transports (UCX, libfabric, verbs, PSM) need libraries and
# hardware that one machine's ranks do not use (the pack's mpiexec runs ob1 over shared memory).
skipped_component_dep() {
  case "$1" in
    libuc[pstm].so*|libfabric*|libibverbs*|librdmacm*|libefa*|libpsm*|libinfinipath*|libnuma*|libnl-*|libmca_common_ucx*|libmca_common_ofi*|libmca_common_verbs*|libjvm*|libmpi_java*|liboshmem*) return 0 ;;
  esac
  return 1
}
# The shared libraries that FILE... load, found by this machine's loader (absolute paths).
needed_libs() { ldd "$@" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u; }
# Highest symbol version PREFIX_ (GLIBC, GLIBCXX) that FILE... require.
required_version() {
  local prefix="$1"; shift
  objdump -p "$@" 2>/dev/null | awk '/Version References/ {f=1} f && /0x/ {print $NF}' |
    grep -E "^${prefix}_[0-9.]+$" | sort -uV | tail -1
}

# The executables of build-gpu/ that link CUDA (cudart, cuBLASLt, NCCL, the CUDA backend): read from
# the link lines CMake wrote, so that test programs added later are packed without editing this file.
cuda_programs() {
  local build="$1" lt dir out
  for lt in $(find "$build" -path '*/CMakeFiles/*.dir/link.txt' | sort); do
    grep -q -- ' -o ' "$lt" || continue                       # executables only (not ar, not -shared)
    grep -q -- '-shared' "$lt" && continue
    grep -qE 'zerone_kernels_cuda|libcudart|cublas|nccl' "$lt" || continue
    grep -q 'zerone_kernels_cuda_emulated' "$lt" && continue  # the emulated GPU's: run here, not there
    dir="$(dirname "$(dirname "$(dirname "$lt")")")"
    out="$(tr ' ' '\n' < "$lt" | grep -A1 -x -- '-o' | tail -1)"
    echo "$(basename "$(dirname "$lt")" .dir) $dir/$out"
  done
}

do_pack() {
  export CCACHE_BASEDIR="${CCACHE_BASEDIR:-/work}"
  local build="$root/build-gpu"
  mkdir -p "$build"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DZERONE_PORTABLE=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DZERONE_BUILD_BENCH=ON -DCMAKE_EXPORT_COMPILE_COMMANDS=ON -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
    -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache > "$build/configure.log"
  grep -q 'CUDA backend ON' "$build/configure.log" || { echo "gpu_run.sh: the CUDA backend is not configured (no nvcc?)" >&2; exit 1; }
  # Note [Portable builds]: not one host compile may target this machine's CPU.
  ! grep -q -- '-march=native' "$build/compile_commands.json" ||
    { echo "gpu_run.sh: -march=native in $build/compile_commands.json" >&2; exit 1; }
  local programs targets
  # zerone, the test programs, and of the benchmarks the one that needs a GPU (bench_attention_cuda).
  programs="$(cuda_programs "$build" | awk '$1 == "zerone" || $1 ~ /_test$/ || $1 == "bench_attention_cuda"')"
  targets="$(awk '{print $1}' <<<"$programs" | tr '\n' ' ')"
  grep -q '^zerone ' <<<"$programs" || { echo "gpu_run.sh: zerone does not link CUDA in $build?" >&2; exit 1; }
  echo "gpu_run.sh: building $targets"
  # shellcheck disable=SC2086 # one word per target
  nice cmake --build "$build" -j"${JOBS:-2}" --target $targets
  rm -rf "$pack" "$carried"
  mkdir -p "$pack/libexec" "$pack/lib/compat" "$pack/mpi/lib" "$pack/mpi/share" "$pack/mpi/etc" \
           "$pack/mpi/pmix/lib/pmix" "$pack/mpi/pmix/share" "$carried"
  local name path
  while read -r name path; do cp "$path" "$pack/libexec/$name"; done <<<"$programs"
  # Open MPI's launcher: orterun (mpiexec), orted (singleton MPI_Init starts one), their components
  # (but the transports of skipped_component_dep), PMIx's, and the help texts and defaults.
  cp "$(readlink -f "$(command -v orterun)")" "$pack/libexec/orterun"
  cp "$(readlink -f "$(command -v orted)")" "$pack/libexec/orted"
  mkdir -p "$pack/mpi/lib/openmpi3"
  local comp dep skip
  for comp in "$ompi_pkglibdir"/*.so; do
    skip=""
    for dep in $(ldd "$comp" | awk '{print $1}'); do skipped_component_dep "$dep" && skip="$dep"; done
    [ -n "$skip" ] || cp "$comp" "$pack/mpi/lib/openmpi3/"
  done
  cp "$pmix_dir"/lib/pmix/*.so "$pack/mpi/pmix/lib/pmix/"
  cp -r "$pmix_dir/share/pmix" "$pack/mpi/pmix/share/"
  cp -r /usr/share/openmpi "$pack/mpi/share/"
  rm -rf "$pack/mpi/share/openmpi/"{doc,java,mpif*}* 2>/dev/null || true
  cp /etc/openmpi/openmpi-mca-params.conf /etc/openmpi/openmpi-default-hostfile "$pack/mpi/etc/"
  strip "$pack/libexec/"*
  # Every non-system library the programs and components load; the glibc and C++ runtimes apart.
  local lib
  for lib in $(needed_libs "$pack/libexec/"* "$pack/mpi/lib/openmpi3/"*.so "$pack/mpi/pmix/lib/pmix/"*.so); do
    name="$(basename "$lib")"
    if glibc_lib "$name" || [[ "$name" == libstdc++.so* || "$name" == libgcc_s.so* ]]; then
      cp -L "$lib" "$pack/lib/compat/$name"
    elif ! system_lib "$name"; then
      cp -L "$lib" "$pack/lib/$name"
    fi
  done
  # The libraries' own needs (ldd lists them transitively, but the compat set must be complete).
  for lib in $(needed_libs "$pack/lib/"*.so*); do
    name="$(basename "$lib")"
    if glibc_lib "$name" || [[ "$name" == libstdc++.so* || "$name" == libgcc_s.so* ]]; then
      cp -L "$lib" "$pack/lib/compat/$name"
    elif ! system_lib "$name" && [ ! -e "$pack/lib/$name" ]; then
      cp -L "$lib" "$pack/lib/$name"
    fi
  done
  cp -L /lib64/ld-linux-x86-64.so.2 "$pack/lib/compat/ld-linux-x86-64.so.2"
  strip --strip-unneeded "$pack/lib/"*.so* "$pack/mpi/lib/openmpi3/"*.so "$pack/mpi/pmix/lib/pmix/"*.so 2>/dev/null || true
  # The pack alone must resolve everything but the CUDA libraries (and the runtimes of lib/compat).
  local missing
  missing="$(LD_LIBRARY_PATH="$pack/lib:$pack/lib/compat" ldd "$pack/libexec/"* "$pack/lib/"*.so* \
             "$pack/mpi/lib/openmpi3/"*.so "$pack/mpi/pmix/lib/pmix/"*.so 2>/dev/null |
             awk '/not found/ {print $1}' | sort -u | while read -r n; do system_lib "$n" || echo "$n"; done)"
  [ -z "$missing" ] || { echo "gpu_run.sh: unresolved in the pack: $missing" >&2; exit 1; }
  {
    echo "commit $(git -C "$root" rev-parse --short HEAD)$(git -C "$root" diff --quiet HEAD -- zerone tests tools CMakeLists.txt || echo ' (with uncommitted changes)')"
    echo "packed $(date -u +%Y-%m-%dT%H:%MZ) on $(. /etc/os-release; echo "$PRETTY_NAME"), $(ldd --version | head -1)"
    echo "built_in $root"
    echo "nvcc $(/usr/local/cuda/bin/nvcc --version | grep -o 'release [0-9.]*'), architectures 90"
    echo "programs $(ls "$pack/libexec" | tr '\n' ' ')"
    echo "tests $(awk '$1 ~ /_test$/ {print $1}' <<<"$programs" | tr '\n' ' ')"
    echo "needs $(required_version GLIBC "$pack/libexec/"* "$pack/lib/"*.so* "$pack/mpi/lib/openmpi3/"*.so) $(required_version GLIBCXX "$pack/libexec/"* "$pack/lib/"*.so*) (else lib/compat: Note [Pack modes])"
    for name in "$pack/libexec/"*; do
      echo "  $(basename "$name"): $(required_version GLIBC "$name") $(required_version GLIBCXX "$name")"
    done
  } > "$pack/MANIFEST"
  cat "$pack/MANIFEST"
  tar -C "$pack" -cf - MANIFEST libexec lib mpi | gzip -9n > "$carried/zerone-pack.tar.gz"
  local pack_bytes tree_bytes
  pack_bytes=$(du -sb "$carried" | cut -f1)
  tree_bytes=$(cd "$root" && git ls-files -co --exclude-standard -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
  echo "gpu_run.sh: pack $((pack_bytes / 1024)) KiB (unpacked $(du -sk "$pack" | cut -f1) KiB) + working tree $((tree_bytes / 1024)) KiB (limit $((limit_bytes / 1024)) KiB)"
  [ $((pack_bytes + tree_bytes)) -le $limit_bytes ] || { echo "gpu_run.sh: over the device tool's 64 MiB" >&2; exit 1; }
  # The pack from the archive alone, with none of the build tree's paths, on this machine.
  do_check
  echo
  echo "Prove it on a foreign root (minutes, as root): bash scripts/gpu_run.sh selftest [bookworm|bullseye]"
  echo "Then, from a session that is lent a GPU (docs/GPU.md):"
  echo '  run(command="bash scripts/gpu_run.sh run", carry=["gpu_pack"], timeout_s=540)'
}

# CUDA's libraries on this machine: ZERONE_NVIDIA_DIR (a folder of nvidia/*/lib), else the nvidia-*
# wheels of python3 (the GPU machine's PyTorch: nvidia/cu13/lib holds cudart and cuBLASLt,
# nvidia/nccl/lib NCCL), else the toolkit's lib/ (dev machines). Printed as a PATH-like list.
cuda_lib_dirs() {
  wheel_lib_dirs
  # The driver's libcuda.so.1 where the loader's cache may not list it (a container's mounted driver).
  local dir
  for dir in /usr/local/nvidia/lib64 /usr/local/nvidia/lib; do
    [ ! -e "$dir/libcuda.so.1" ] || echo "$dir"
  done
}
wheel_lib_dirs() {
  if [ -n "${ZERONE_NVIDIA_DIR:-}" ]; then
    find "$ZERONE_NVIDIA_DIR" -maxdepth 3 -name 'lib*.so*' -path '*/lib/*' -printf '%h\n' | sort -u | paste -sd:
  elif command -v python3 >/dev/null && python3 -c 'import nvidia' 2>/dev/null; then
    python3 -c 'import nvidia, os, glob; print(":".join(sorted({os.path.dirname(p) for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "*", "lib", "lib*.so*"))})))'
  elif [ -d /usr/local/cuda/lib ] || [ -d /usr/local/cuda/lib64 ]; then
    echo "/usr/local/cuda/lib:/usr/local/cuda/lib64"
  fi
}

# Unpacks the carried archive afresh into $pack, picks the mode (Note [Pack modes]) and writes the
# wrappers bin/NAME (mpiexec and mpirun start orterun). Sets PATH (bin/ first: mpiexec is the pack's)
# and the Open MPI / PMIx variables that point Open MPI at the pack's components and help files.
pack_env() {
  rm -rf "$pack" && mkdir -p "$pack/bin"
  gzip -dc "$carried/zerone-pack.tar.gz" | tar -C "$pack" -xf -
  local cuda libs mode=plain trial
  cuda="$(cuda_lib_dirs | paste -sd: || true)"
  [ -d /usr/local/nvidia/bin ] && export PATH="$PATH:/usr/local/nvidia/bin"
  libs="$pack/lib${cuda:+:$cuda}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ "${ZERONE_PACK_MODE:-}" = compat ]; then
    mode=compat
  elif [ "${ZERONE_PACK_MODE:-}" != plain ]; then
    trial="$(LD_LIBRARY_PATH="$libs" "$pack/libexec/zerone" info 2>&1 >/dev/null || true)"
    if grep -qE "version \`(GLIBC|GLIBCXX|CXXABI)_[0-9.]+' not found" <<<"$trial"; then mode=compat; fi
  fi
  local name target
  for name in $(ls "$pack/libexec") mpiexec mpirun; do
    target="$name"; case "$name" in mpiexec|mpirun) target=orterun ;; esac
    if [ "$mode" = compat ]; then
      printf '#!/bin/sh\n# Note [Pack modes] (scripts/gpu_run.sh): compat, the packed glibc and libstdc++.\nexec "%s/lib/compat/ld-linux-x86-64.so.2" --library-path "%s/lib/compat:%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" --argv0 "$0" "%s/libexec/%s" "$@"\n' \
        "$pack" "$pack" "$pack/lib${cuda:+:$cuda}" "$pack" "$target" > "$pack/bin/$name"
    else
      printf '#!/bin/sh\n# Note [Pack modes] (scripts/gpu_run.sh): plain, the target'"'"'s glibc and libstdc++.\nLD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s/libexec/%s" "$@"\n' \
        "$pack/lib${cuda:+:$cuda}" "$pack" "$target" > "$pack/bin/$name"
    fi
    chmod +x "$pack/bin/$name"
  done
  echo "$mode" > "$pack/MODE"
  # The test programs carry this machine's paths (ZERONE_SOURCE_DIR, ZERONE_TEST_DATA_DIR,
  # ZERONE_BINARY: tests/CMakeLists.txt): where they do not exist, point them at this checkout
  # and the pack's zerone (the GPU machine runs as root; a later gtest may read data or run zerone).
  local built
  built="$(sed -n 's/^built_in //p' "$pack/MANIFEST")"
  if [ -n "$built" ] && [ ! -e "$built" ] && mkdir -p "$(dirname "$built")" 2>/dev/null; then
    ln -s "$root" "$built" 2>/dev/null || true
  fi
  if [ ! -e "$root/build-gpu/zerone" ] && mkdir -p "$root/build-gpu" 2>/dev/null; then
    ln -s "$pack/bin/zerone" "$root/build-gpu/zerone" 2>/dev/null || true
  fi
  export PATH="$pack/bin:$PATH"
  # Open MPI's and PMIx's install directories, moved to the pack (opal/pmix installdirs "env").
  export OPAL_PREFIX="$pack/mpi" OPAL_EXEC_PREFIX="$pack/mpi" OPAL_BINDIR="$pack/bin" OPAL_LIBDIR="$pack/lib" \
         OPAL_PKGLIBDIR="$pack/mpi/lib/openmpi3" OPAL_DATADIR="$pack/mpi/share" OPAL_DATAROOTDIR="$pack/mpi/share" \
         OPAL_PKGDATADIR="$pack/mpi/share/openmpi" OPAL_SYSCONFDIR="$pack/mpi/etc"
  export PMIX_PREFIX="$pack/mpi/pmix" PMIX_EXEC_PREFIX="$pack/mpi/pmix" PMIX_LIBDIR="$pack/lib" \
         PMIX_PKGLIBDIR="$pack/mpi/pmix/lib/pmix" PMIX_DATADIR="$pack/mpi/pmix/share" \
         PMIX_PKGDATADIR="$pack/mpi/pmix/share/pmix" PMIX_SYSCONFDIR="$pack/mpi/etc"
  # One machine: shared memory (ob1: Note [Test environment] in tests/CMakeLists.txt), ranks that
  # wait yield their core (2-3 ranks share one GPU and the host's cores).
  # plm isolated: the launcher starts ranks on this machine only, and needs no ssh/rsh (the rsh
  # launcher refuses to start without one: seen in the bookworm selftest; the GPU machine has none).
  export OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,vader OMPI_MCA_mpi_yield_when_idle=1 OMPI_MCA_plm=isolated
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-8}"
}

pack_banner() {
  echo "pack: $(head -1 "$pack/MANIFEST"), mode $(cat "$pack/MODE") (Note [Pack modes]); target $(ldd --version 2>&1 | head -1)"
  echo "pack: CUDA libraries from: $(cuda_lib_dirs | paste -sd: || true); the loader's cache: $(/sbin/ldconfig -p 2>/dev/null | grep -oE '(libcuda|libcudart|libcublasLt|libnccl)\.so[^ ]* => [^ ]*' | tr '\n' ' ')"
}

# check: the CPU side of the unpacked pack on this machine (module docs above). Prints what it ran;
# exits 1 at the first failure.
do_check() {
  pack_env
  pack_banner
  local Z="$pack/bin/zerone" d
  d="$(mktemp -d)"
  echo "== zerone info"; "$Z" info
  echo "== cpu training (gpt2 tiny, 5 steps)"
  "$Z" train --model gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --micro-batch 2 --steps 5 \
    --device cpu --precision fp32 --threads 2 --no-shuffle --metrics "$d/w1.jsonl" > "$d/w1.log" 2>&1 ||
    { cat "$d/w1.log"; echo "check: FAIL cpu training"; exit 1; }
  grep -o '"loss":[^,]*' "$d/w1.jsonl" | tr '\n' ' '; echo
  echo "== kernels_test cpu rows"
  (cd "$root" && "$pack/bin/kernels_test" --gtest_filter='*_cpu' --gtest_brief=1) > "$d/kt.log" 2>&1 ||
    { tail -30 "$d/kt.log"; echo "check: FAIL kernels_test cpu rows"; exit 1; }
  tail -3 "$d/kt.log"
  if ! "$Z" info | grep -q '^devices .*cuda'; then
    echo "== --device cuda without a GPU: one clean error line"
    if "$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=8 --steps 1 --device cuda > "$d/nogpu.log" 2>&1; then
      echo "check: FAIL --device cuda ran without a GPU?"; exit 1
    fi
    cat "$d/nogpu.log"
    [ "$(wc -l < "$d/nogpu.log")" -eq 1 ] && grep -q '^zerone: error: ' "$d/nogpu.log" ||
      { echo "check: FAIL the refusal is not one 'zerone: error:' line"; exit 1; }
  fi
  echo "== mpiexec (the pack's) -n 2, ZeRO stage 2, cpu"
  mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 "$Z" train \
    --model gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --micro-batch 2 --steps 5 --zero-stage 2 \
    --device cpu --precision fp32 --threads 1 --no-shuffle --metrics "$d/w2.jsonl" > "$d/w2.log" 2>&1 ||
    { cat "$d/w2.log"; echo "check: FAIL mpiexec -n 2"; exit 1; }
  echo "world2 losses: $(grep -o '"loss":[^,]*' "$d/w2.jsonl" | tr '\n' ' ')"
  rm -rf "$d"
  echo "check: PASS"
}

# selftest SUITE: `check` and `run` from the pack in a minimal Debian root (module docs above).
do_selftest() {
  local suite="${1:-bookworm}"
  [ "$(id -u)" -eq 0 ] || { echo "gpu_run.sh selftest: needs root (chroot, mounts)" >&2; exit 1; }
  [ -f "$carried/zerone-pack.tar.gz" ] || { echo "gpu_run.sh selftest: no pack; run gpu_run.sh pack first" >&2; exit 1; }
  if [ -z "${ZERONE_SELFTEST_NS:-}" ]; then   # a private mount namespace: mounts vanish with it
    ZERONE_SELFTEST_NS=1 exec unshare --mount --propagation private -- bash "$0" selftest "$suite"
  fi
  local wheels="${ZERONE_NVIDIA_DIR:-}" cache=/var/cache/zerone-clean-room base work report
  if [ -z "$wheels" ]; then
    wheels="$(ls -d "$HOME"/.cache/zerone/peers-venv/lib/python3*/site-packages/nvidia 2>/dev/null | head -1)"
  fi
  [ -d "$wheels/cu13/lib" ] || { echo "gpu_run.sh selftest: no nvidia wheels (bash bench/peers/setup.sh, or ZERONE_NVIDIA_DIR)" >&2; exit 1; }
  # The base root: the clean room's cached bookworm, or a cached debootstrap of SUITE.
  base="$(ls -t "$cache/$suite"-minbase-*.tar.gz 2>/dev/null | head -1 || true)"
  if [ -z "$base" ]; then
    base="$cache/$suite-minbase-gpupack.tar.gz"
    mkdir -p "$cache"
    work="$(mktemp -d /var/tmp/zerone-debootstrap.XXXXXX)"
    echo "selftest: debootstrap --variant=minbase $suite (once; cached as $base)"
    debootstrap --variant=minbase "$suite" "$work" http://deb.debian.org/debian > "$work.log" 2>&1 ||
      { tail -20 "$work.log"; rm -rf --one-file-system "$work"; exit 1; }
    tar --numeric-owner -czf "$base" -C "$work" . && rm -rf --one-file-system "$work" "$work.log"
  fi
  work="$(mktemp -d /var/tmp/zerone-gpu-selftest.XXXXXX)"
  report="$root/build-gpu/selftest-$suite"
  rm -rf "$report"; mkdir -p "$report"
  # shellcheck disable=SC2064 # expand now
  trap "umount -R '$work/r' 2>/dev/null; rm -rf --one-file-system '$work'" EXIT
  mkdir "$work/r"
  tar --numeric-owner -xzf "$base" -C "$work/r"
  local r="$work/r" absent=""
  # What the GPU machine lacks must be absent here too (else the test proves nothing).
  for lib in libdnnl.so libmpi.so libopen-pal.so liburing.so libgomp.so libhwloc.so libevent_core; do
    ! ls "$r"/usr/lib/x86_64-linux-gnu/$lib* "$r"/lib/x86_64-linux-gnu/$lib* >/dev/null 2>&1 || absent+=" $lib"
  done
  [ -z "$absent" ] || { echo "selftest: the base root has$absent: not a foreign root" >&2; exit 1; }
  mkdir -p "$r/root/zerone" "$r/opt/nvidia-wheels"
  (cd "$root" && git ls-files -co --exclude-standard -z | tar --null -T - -cf - gpu_pack/zerone-pack.tar.gz) |
    tar -C "$r/root/zerone" -xf -
  mount --bind "$r" "$r"
  mount -t proc proc "$r/proc"
  mount -t sysfs -o ro sysfs "$r/sys"          # hwloc (Open MPI) reads it
  mount --bind /dev "$r/dev"; mount --make-private "$r/dev"
  mount -t devpts -o newinstance,ptmxmode=0666 devpts "$r/dev/pts"
  mount -t tmpfs tmpfs "$r/dev/shm"            # Open MPI's shared memory
  mount --bind -o ro "$wheels" "$r/opt/nvidia-wheels"
  mount -o remount,bind,ro "$r/opt/nvidia-wheels"
  local envs=(HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 ZERONE_NVIDIA_DIR=/opt/nvidia-wheels
              OUT=/root/out ZERONE_GPU_BUDGET_S="${ZERONE_GPU_BUDGET_S:-300}")
  echo "selftest: $suite root ($(chroot "$r" ldd --version 2>&1 | head -1)), python3: $(chroot "$r" sh -c 'command -v python3 || echo none')"
  local rc=0
  chroot "$r" /usr/bin/env -i "${envs[@]}" /bin/bash -c 'cd /root/zerone && bash scripts/gpu_run.sh check' \
    > "$report/check.log" 2>&1 || rc=1
  cat "$report/check.log"
  # The same world-2 run natively (this machine's own MPI and libraries, the same binary): the losses
  # must be the pack's, bit for bit.
  local native
  native="$(cd "$work" && mpiexec --allow-run-as-root --oversubscribe --bind-to none -n 2 "$root/build-gpu/zerone" train \
    --model gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --micro-batch 2 --steps 5 --zero-stage 2 \
    --device cpu --precision fp32 --threads 1 --no-shuffle --metrics "$work/native.jsonl" > "$work/native.log" 2>&1 &&
    grep -o '"loss":[^,]*' "$work/native.jsonl" | tr '\n' ' ')" || true
  echo "native world2 losses: $native" | tee -a "$report/check.log"
  if [ -n "$native" ] && grep -qxF "world2 losses: $native" "$report/check.log"; then
    echo "selftest: the pack's mpiexec -n 2 reproduces the native run's losses bitwise" | tee -a "$report/check.log"
  else
    echo "selftest: FAIL the pack's world-2 losses differ from the native run's" | tee -a "$report/check.log"; rc=1
  fi
  chroot "$r" /usr/bin/env -i "${envs[@]}" /bin/bash -c 'cd /root/zerone && bash scripts/gpu_run.sh run' \
    > "$report/run.log" 2>&1 && echo "run exit status 0" >> "$report/run.log" || echo "run exit status $?" >> "$report/run.log"
  cp -r "$r/root/out" "$report/out" 2>/dev/null || true
  tail -25 "$report/run.log"
  # Without a GPU every run step must have reported a skip (77) or a pass, never a packaging failure.
  if grep -vE ' rc=(0|77) ' "$report/out/summary.txt" | grep -E ' rc=' ; then
    echo "selftest: FAIL a run step failed without a GPU (above; $report/out)"; rc=1
  fi
  [ "$(ls "$report/out" | wc -l)" -le 8 ] || { echo "selftest: FAIL more than 8 files in \$OUT"; rc=1; }
  [ $rc -eq 0 ] && echo "selftest $suite: PASS (reports in $report)" || echo "selftest $suite: FAIL (reports in $report)"
  return $rc
}

# A CUDA tool: on PATH, else under the toolkit or Nsight Compute's install (the GPU machine's image).
cuda_tool() {
  command -v "$1" 2>/dev/null ||
    { ls /usr/local/cuda/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" /usr/local/cuda/nsight-compute*/"$1" 2>/dev/null || true; } | head -1
}

do_sanitize() {
  local out="${OUT:-$root/gpu_out}" rc=0 tool sanitizer
  mkdir -p "$out"
  pack_env
  sanitizer="$(cuda_tool compute-sanitizer)"
  [ -n "$sanitizer" ] || { echo "sanitize: no compute-sanitizer"; return 1; }
  for tool in memcheck racecheck; do
    (cd "$root" && timeout "${ZERONE_SANITIZE_CAP_S:-240}" "$sanitizer" --tool "$tool" --target-processes all --error-exitcode 3 "$pack/bin/kernels_test" \
       --gtest_filter='*_cuda') > "$out/sanitize_$tool.log" 2>&1 || rc=1
    tail -15 "$out/sanitize_$tool.log"
  done
  return $rc
}

# profile: where one W5 step's GPU time goes, kernel by kernel: Nsight Compute's kernel durations
# (gpu__time_duration, one pass per kernel, the clocks left alone) over a 2-step run, summed per
# kernel name (with the end-of-run validation's one forward batch: it cannot be turned off), beside
# the sum of all kernels and the step's own time in the same run. ncu runs the
# kernels one at a time: the sum says how busy the GPU could be, the step time what it is.
do_profile() {
  local out="${OUT:-$root/gpu_out}" ncu mb="${ZERONE_W5_MB:-8}" d
  mkdir -p "$out"
  pack_env
  ncu="$(cuda_tool ncu)"
  [ -n "$ncu" ] || { echo "profile: no ncu"; return 1; }
  d="$(mktemp -d)"
  timeout "${ZERONE_PROFILE_CAP_S:-150}" "$ncu" --clock-control none --target-processes all \
    --metrics gpu__time_duration.sum --csv --print-units base --print-kernel-base function \
    --log-file "$d/ncu.csv" "$pack/bin/zerone" train --model "${ZERONE_PROFILE_MODEL:-gpt2-124m}" --seq 1024 \
    --micro-batch "$mb" --steps 2 --val-batches 1 --precision bf16 --device cuda --metrics "$d/z.jsonl" > "$d/z.log" 2>&1 ||
    echo "profile: ncu run ended with $?"
  tail -3 "$d/z.log"
  cp "$d/ncu.csv" "$out/ncu_w5.csv" 2>/dev/null || true
  python3 - "$d/ncu.csv" <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1], errors="replace") as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") == "gpu__time_duration.sum":
        rows.append((r.get("Kernel Name") or r.get("Function Name", "?"), float(r["Metric Value"].replace(",", ""))))
total = sum(t for _, t in rows)
by = collections.defaultdict(lambda: [0, 0.0])
for k, t in rows:
    by[k][0] += 1; by[k][1] += t
print(f"profile: {len(rows)} kernels over 2 steps, GPU time {total / 1e6:.2f} ms (ns units summed)")
for k, (n, t) in sorted(by.items(), key=lambda kv: -kv[1][1])[:30]:
    print(f"  {t / 1e6:9.3f} ms  {100 * t / max(total, 1):5.1f}%  {n:6d} x {t / n / 1e3:9.1f} us  {k[:110]}")
PY
  rm -rf "$d"
}

# more: the GPU session's second call, when `run` passed: the W5 profile, compute-sanitizer over the
# op harness, and the torch.compile peer of W5 (each capped; ZERONE_GPU_BUDGET_S in all).
do_more() {
  begin_call 400 || return 1
  step profile 150 profile.log bash "$0" profile
  ZERONE_SANITIZE_CAP_S=80 step sanitize 170 sanitize.log bash "$0" sanitize
  ZERONE_W5_PEERS="${ZERONE_W5_PEERS-compile}" step w5 $((deadline - $(now))) bench_w5.log bench_w5
  cat "$out/summary.txt"
}

# --- run: the GPU session's one call --------------------------------------------------------------
out="${OUT:-$root/gpu_out}"
deadline="${ZERONE_DEADLINE:-0}"   # the run's end, in seconds since the epoch (exported to the steps)
now() { date +%s; }
# The start of a call THERE (run, more, offload): errors no longer end the script (each step
# reports its own), an empty summary.txt in $OUT, the deadline ZERONE_GPU_BUDGET_S (default $1)
# seconds from now, and the pack unpacked (pack_env). Returns 1 when the pack cannot be unpacked.
begin_call() {
  set +e
  mkdir -p "$out"
  : > "$out/summary.txt"
  deadline=$(($(now) + ${ZERONE_GPU_BUDGET_S:-$1}))
  export ZERONE_DEADLINE=$deadline OUT="$out" ZERONE_PACK_DIR="$pack"
  pack_env > "$out/pack_env.tmp" 2>&1 || { cat "$out/pack_env.tmp"; echo "pack rc=1: cannot unpack" >> "$out/summary.txt"; return 1; }
  rm -f "$out/pack_env.tmp"
}

# step NAME CAP_S LOG CMD...: runs CMD with its output appended to $out/LOG, stopped (its whole
# process group: timeout's default) after CAP_S seconds or when the run's budget is spent, whichever
# is first; one line "NAME rc=N Ss" in summary.txt. Never fails: the next step always runs.
step() {
  local name="$1" cap="$2" log="$3"; shift 3
  local left=$((deadline - $(now) - 5)) t0 rc=0
  t0=$(now)
  [ "$cap" -le "$left" ] || cap=$left
  if [ "$cap" -lt 10 ]; then
    echo "$name rc=skipped (no time left of ZERONE_GPU_BUDGET_S)" | tee -a "$out/summary.txt"; return 0
  fi
  echo "=== $name (cap ${cap}s): $*" >> "$out/$log"
  case "$1" in gtest_cuda|bench_w5|bench_attention|bench_offload) set -- bash "$0" "_$1" "${@:2}" ;; esac  # functions: through this script
  timeout -k 5 "$cap" "$@" >> "$out/$log" 2>&1 < /dev/null || rc=$?
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || echo "=== $name: TIMED OUT after ${cap}s" >> "$out/$log"
  echo "$name rc=$rc $(($(now) - t0))s" | tee -a "$out/summary.txt"
}

# The gtest rows on cuda of one packed test program; when the program crashes (a CUDA error
# aborts: Note [CUDA backend design]), each case runs alone so that one run says which pass.
gtest_cuda() {
  local prog="$1" xml="$2" status=0 t
  (cd "$root" && "$pack/bin/$prog" --gtest_filter="$gtest_cuda_filter" --gtest_output=xml:"$xml") || status=$?
  [ "$status" -gt 1 ] || return "$status"
  echo "=== $prog ended with status $status: each case alone"
  for t in $("$pack/bin/$prog" --gtest_list_tests --gtest_filter="$gtest_cuda_filter" |
             awk '/^[^ ]/ {suite=$1} /^  / {print suite $1}'); do
    if (cd "$root" && timeout 30 "$pack/bin/$prog" --gtest_filter="$t") > "$xml.one" 2>&1; then
      grep -q '^\[  SKIPPED' "$xml.one" && echo "ALONE SKIPPED $t" || echo "ALONE PASSED $t"
    else
      echo "ALONE FAILED($?) $t"; grep -E 'Failure|error|Expected|Which is|internal|CUDA' "$xml.one" | head -8 | sed 's/^/    /'
    fi
  done
  rm -f "$xml.one"
  return "$status"
}

# W5 (issue 18 §4) on cuda: zerone beside PyTorch (eager, then compile if time is left): step
# time, tokens/s and MFU against 989 TFLOP/s (H100/H200 SXM dense bf16). MODEL is gpt2 (GPT-2 124M,
# T=1024, micro-batch ZERONE_W5_MB, default 8) or llama (Llama-3.2-1B, T=2048, micro-batch
# ZERONE_W5L_MB, default 4); model FLOPs per token 6N + 6LTC (N the matmul parameters, the tied
# head once; 6LTC the causal attention products, forward and backward).
bench_w5() {
  local model="${1:-gpt2}" steps="${ZERONE_W5_STEPS:-8}" d mb T zmodel peer flops
  if [ "$model" = llama ]; then
    mb="${ZERONE_W5L_MB:-4}" T=2048 zmodel=llama-3.2-1b peer=w5_llama
    flops="$(python3 -c "
L, C, NH, NKV, hs, F, V, T = 16, 2048, 32, 8, 64, 8192, 128256, 2048
n = V * C + L * (C * (NH + 2 * NKV) * hs + NH * hs * C + 3 * C * F)
print(6 * n + 6 * L * T * NH * hs)")"
  else
    mb="${ZERONE_W5_MB:-8}" T=1024 zmodel=gpt2-124m peer=w5
    flops="$(python3 -c "
L, C, T, Vp = 12, 768, 1024, 50304
print(6 * (Vp * C + L * 12 * C * C) + 6 * L * T * C)")"
  fi
  d="$(mktemp -d)"
  echo "$model: model FLOPs per token $flops; micro-batch $mb, T $T"
  "$pack/bin/zerone" train --model "$zmodel" --seq "$T" --micro-batch "$mb" --steps "$steps" --precision bf16 \
    --device cuda --metrics "$d/z.jsonl" > "$d/z.log" 2>&1 || { tail -20 "$d/z.log"; echo "zerone $model: FAILED"; }
  tail -5 "$d/z.log"
  w5_line "$d/z.jsonl" "$mb" "$flops" "$T" "$model" ""
  cp "$d/z.jsonl" "$out/w5_${model}_zerone.jsonl" 2>/dev/null || true
  rm -rf "$d"
  # Where the step's time goes, operation by operation on the GPU (Note [Device compute itemized]:
  # --profile's two timed events an operation; its s/step is not the W5 figure, the run above is).
  if [ "${ZERONE_W5_PROFILE:-1}" = 1 ] && [ $((deadline - $(now))) -gt 90 ]; then
    d="$(mktemp -d)"
    "$pack/bin/zerone" train --model "$zmodel" --seq "$T" --micro-batch "$mb" --steps 5 --precision bf16 \
      --device cuda --profile > "$d/z.log" 2>&1 || { tail -5 "$d/z.log"; echo "zerone $model --profile: FAILED"; }
    grep -E '^time per step |^  time of steps ' "$d/z.log" | sed "s/^ */W5 $model --profile: /" || true
    rm -rf "$d"
  fi
  # Issue 18 §4 asks for the largest micro-batch that fits: the largest `zerone estimate` says fits
  # (stage 0, this GPU's free memory), then trained for a few steps (a failure there is a finding:
  # the estimate said it fits).
  if [ "$model" = gpt2 ] && [ "${ZERONE_W5_LARGEST:-1}" = 1 ] && [ $((deadline - $(now))) -gt 120 ]; then
    local largest
    largest="$(w5_largest_micro_batch "$zmodel" "$T")"
    echo "W5 $model: the largest micro-batch \`zerone estimate\` fits on this GPU: ${largest:-none}"
    if [ -n "$largest" ] && [ "$largest" -gt "$mb" ]; then
      d="$(mktemp -d)"
      "$pack/bin/zerone" train --model "$zmodel" --seq "$T" --micro-batch "$largest" --steps 5 --precision bf16 \
        --device cuda --metrics "$d/z.jsonl" > "$d/z.log" 2>&1 || { tail -5 "$d/z.log"; echo "zerone $model B=$largest: FAILED"; }
      w5_line "$d/z.jsonl" "$largest" "$flops" "$T" "$model" " (largest)"
      grep -E 'peak' "$d/z.log" | head -3 || true   # none after a failed run (set -e: never end bench_w5)
      rm -rf "$d"
    fi
  fi
  local mode
  for mode in ${ZERONE_W5_PEERS-eager compile}; do
    [ $((deadline - $(now))) -gt 90 ] || { echo "torch $model $mode: skipped (time)"; continue; }
    PYTHONUNBUFFERED=1 timeout $((deadline - $(now) - 20)) python3 "$root/bench/pytorch_peer.py" "$peer" "$mode" "$steps" "$mb" |
      while read -r s; do
        echo "W5 $model torch $mode raw: $s"
        python3 -c "s=float('$s'); tok=$mb*$T/s; print(f'W5 $model torch $mode bf16 B=$mb T=$T: {s:.4f} s/step, {tok:.0f} tokens/s, MFU {tok*$flops/989e12:.1%}')" 2>/dev/null || true
      done
  done
}

# The W5 line of a zerone run: the mean of its steps after the first two from METRICS (JSON lines),
# tokens/s and MFU at MB x T tokens a step and FLOPS per token. Nothing for a missing file.
w5_line() {
  [ -s "$1" ] || return 0
  python3 - "$@" <<'PY'
import json, sys
ms = [x["ms"] for x in map(json.loads, open(sys.argv[1])) if "ms" in x]
mb, flops, T, model, label = int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5], sys.argv[6]
if len(ms) > 2:
    s = sum(ms[2:]) / len(ms[2:]) / 1000
    tok = mb * T / s
    print(f"W5 {model} zerone bf16 B={mb}{label} T={T}: {s:.4f} s/step, {tok:.0f} tokens/s, MFU {tok * flops / 989e12:.1%} (steps 3..{len(ms)})")
PY
}

# The largest micro-batch (8, 16, 24, 32, 48, ... 256) whose stage-0 estimate fits this device
# (ZERONE_W5_DEVICE, default cuda: the GPU's free memory; elsewhere give ZERONE_W5_DEVICE_MEM GiB),
# on stdout; nothing when none does.
w5_largest_micro_batch() {
  local zmodel="$1" T="$2" b fits largest="" cap=()
  [ -z "${ZERONE_W5_DEVICE_MEM:-}" ] || cap=(--device-mem "$ZERONE_W5_DEVICE_MEM")
  for b in 8 16 24 32 48 64 96 128 192 256; do
    fits="$("$pack/bin/zerone" estimate --world 1 --model "$zmodel" --seq "$T" --micro-batch "$b" --precision bf16 \
      --zero-stage 0 --device "${ZERONE_W5_DEVICE:-cuda}" "${cap[@]}" --json 2>/dev/null |
      python3 -c 'import json, sys; print(json.load(sys.stdin)["stages"][0]["fits"])' 2>/dev/null)"
    [ "$fits" = True ] || break
    largest="$b"
  done
  echo "$largest"
}

# Issue 19 §4 (`gpu_run.sh offload`, a call of its own): ZeRO-Offload on the GPU. The parts run in
# the order ZERONE_OFFLOAD_PARTS names (default "7b none cpu fsdp2 nvme": the headline first, the
# slowest last, as call 7 of 2026-11-27 ran out of time before the 7B shape):
#   7b     the Llama-2-7B shape, B=1, T=2048, bf16, stage 2, optimizer in host memory: `zerone
#          estimate` and `zerone plan`, then 4 steps: s/step, MFU, peak host RSS beside the estimate;
#   none, cpu, nvme   Llama-3.2-1B (B=ZERONE_OFFLOAD_MB, default 4; T=2048; bf16; stage 2) with the
#          optimizer on the GPU, in host memory, on the disk (ZERONE_NVME_DIR, default
#          /tmp/zerone-nvme): s/step (ratio to none: read it off the lines);
#   fsdp2  FSDP2 with CPUOffloadPolicy on the same 1B model (pytorch_peer.py fsdp2_offload);
#   13b    the Llama-2-13B shape (not in the default list: some 5 minutes): `zerone plan` on this
#          machine (its host memory, its disk under ZERONE_NVME_DIR, the GPU's speeds), then 3 steps
#          of the plan it chooses (the optimizer state split between host memory and the disk, Note
#          [Optimizer state on NVMe and in host memory]): s/step, where the time went, peaks.
bench_offload() {
  local steps="${ZERONE_OFFLOAD_STEPS:-6}" mb="${ZERONE_OFFLOAD_MB:-4}" nvme="${ZERONE_NVME_DIR:-/tmp/zerone-nvme}" d part
  d="$(mktemp -d)"
  mkdir -p "$nvme"
  local mean='import json, sys
ms = [x["ms"] for x in map(json.loads, open(sys.argv[1])) if "ms" in x]
print(f"{sum(ms[2:]) / max(len(ms) - 2, 1) / 1000:.4f}" if len(ms) > 2 else "nan")'
  for part in ${ZERONE_OFFLOAD_PARTS:-7b none cpu fsdp2 nvme}; do
    case "$part" in
      7b) offload_7b "$d" ;;
      13b) offload_13b "$d" "$nvme" ;;
      fsdp2)
        if [ $((deadline - $(now))) -gt 120 ]; then
          echo "fsdp2 CPUOffloadPolicy llama-3.2-1b B=$mb T=2048: $(PYTHONUNBUFFERED=1 timeout $((deadline - $(now) - 30)) \
            python3 "$root/bench/pytorch_peer.py" fsdp2_offload "$steps" "$mb" 2>&1 | tail -1) s/step"
        else echo "fsdp2: skipped (time)"; fi ;;
      none|cpu|nvme)
        [ $((deadline - $(now))) -gt 60 ] || { echo "offload $part: skipped (time)"; continue; }
        local extra=()
        case "$part" in cpu) extra=(--offload-optimizer cpu) ;; nvme) extra=(--offload-optimizer nvme --nvme-path "$nvme") ;; esac
        timeout $((deadline - $(now) - 10)) "$pack/bin/zerone" train --model llama-3.2-1b --seq 2048 --micro-batch "$mb" \
          --steps "$steps" --precision bf16 --device cuda --zero-stage 2 "${extra[@]}" --profile --metrics "$d/$part.jsonl" \
          > "$d/$part.log" 2>&1 || { tail -5 "$d/$part.log"; echo "offload $part: FAILED"; continue; }
        # Where the step's time went (--profile): what of the transfers and the CPU optimizer is exposed.
        grep -E 'peak (memory|RSS)|time per step|time of steps' "$d/$part.log" || true
        echo "offload $part llama-3.2-1b B=$mb T=2048 stage 2: $(python3 -c "$mean" "$d/$part.jsonl") s/step (steps 3..$steps)" ;;
      *) echo "offload: no part '$part' (7b 13b none cpu fsdp2 nvme)" ;;
    esac
  done
  cp "$d"/*.jsonl "$out/" 2>/dev/null || true
  rm -rf "$d"
}

# The Llama-2-7B shape with the optimizer in host memory (bench_offload's part 7b), in directory D,
# three runs (ZERONE_7B_RUNS names which, in its order: default "plain dpu accum"), each while 150 s
# are left:
#   1. as issue 19 §4 names it: B=1, T=2048, one micro-step a step, 4 steps;
#   2. as ZeRO-Offload reaches its MFU, with its delayed parameter update (DPU: the CPU optimizer
#      beside the next step's micro-steps): B=ZERONE_7B_MB (default 2) x ZERONE_7B_DPU_ACCUM
#      (default 32) micro-steps, some 13 s of GPU compute to hide the CPU optimizer's ~5 s behind.
#      Its own gradient and parameter copies need 114.5 GiB of host memory with the micro-steps'
#      gradient sums on the GPU (Note [Gradient sums on the device]: 70.5 GiB of device memory at
#      B=2 by the estimate), 139.6 GiB with them on the host, over the machine's 126;
#   3. without DPU: B=2 x ZERONE_7B_ACCUM (default 64) micro-steps, some 27 s of GPU compute at
#      40% MFU beside the ~5 s of CPU optimizer that the early step hides only behind the last
#      micro-step's backward. With the sums in host memory each micro-step would take 54 GB over
#      PCIe.
offload_7b() {
  local d="$1"
  [ $((deadline - $(now))) -gt 120 ] || { echo "llama-2-7b: skipped (time)"; return 0; }
  "$pack/bin/zerone" estimate --model llama-2-7b --seq 2048 --micro-batch 1 --precision bf16 --device cuda \
    --zero-stage 2 --offload-optimizer cpu --world 1 2>&1 | tail -4
  # The planner on the GPU's measured speeds (Note [Device speeds]): its prediction for the run below.
  timeout 60 "$pack/bin/zerone" plan --model llama-2-7b --seq 2048 --micro-batch 1 --precision bf16 --device cuda \
    --zero-stage 2 --offload-optimizer cpu 2>&1 | grep -E "^  device:|^  host memory|^chosen" || echo "plan: failed"
  local run
  for run in ${ZERONE_7B_RUNS:-plain dpu accum}; do
    [ $((deadline - $(now))) -gt 150 ] || { echo "llama-2-7b $run: skipped (time)"; continue; }
    case "$run" in
      plain) offload_7b_run "$d/7b" 1 1 "${ZERONE_7B_STEPS:-4}" ;;
      dpu) offload_7b_run "$d/7b_dpu" "${ZERONE_7B_MB:-2}" "${ZERONE_7B_DPU_ACCUM:-32}" "${ZERONE_7B_STEPS:-3}" --delayed-update ;;
      accum) offload_7b_run "$d/7b_accum" "${ZERONE_7B_MB:-2}" "${ZERONE_7B_ACCUM:-64}" "${ZERONE_7B_STEPS:-3}" ;;
      *) echo "llama-2-7b: no run '$run' (plain dpu accum)" ;;
    esac
  done
}

# The Llama-2-13B shape on this machine (bench_offload's part 13b), in directory D, swapping under
# NVME: the planner's choice for one micro-step of B=1, T=2048 (its state fits neither the host
# memory nor the disk alone), then 3 steps of it with --profile, the planner's prediction beside.
offload_13b() {
  local d="$1" nvme="$2" t0 rc=0
  [ $((deadline - $(now))) -gt "${ZERONE_13B_MIN_S:-240}" ] || { echo "llama-2-13b: skipped (time)"; return 0; }
  df -h "$nvme" | tail -1
  timeout 120 "$pack/bin/zerone" plan --model llama-2-13b --seq 2048 --micro-batch 1 --precision bf16 --device cuda \
    --nvme-path "$nvme" ${ZERONE_13B_PLAN_FLAGS:-} --out "$d/13b_plan.json" > "$d/13b_plan.log" 2>&1 || { tail -5 "$d/13b_plan.log"; echo "llama-2-13b plan: FAILED"; return 0; }
  grep -E "^  (memory|device|host|NVMe)|^chosen|^  settings|^  needs" "$d/13b_plan.log" || true
  t0=$(now)
  # The plan's file names the swap directory where it chose NVMe (nvme_path); --nvme-path here would be
  # refused where it did not (an H200 plans the 13B shape without NVMe: the GPU holds half its
  # optimizer). ZERONE_13B_PLAN_FLAGS="--device-mem 78" plans as for an H100's memory.
  timeout $((deadline - $(now) - 10)) "$pack/bin/zerone" train --config "$d/13b_plan.json" --model llama-2-13b --seq 2048 \
    --precision bf16 --device cuda --steps "${ZERONE_13B_STEPS:-3}" --profile ${ZERONE_OFFLOAD_FLAGS:-} \
    --metrics "$d/13b.jsonl" > "$d/13b.log" 2>&1 || rc=$?
  echo "llama-2-13b (the plan's settings): ended with $rc after $(($(now) - t0)) s"
  grep -E '^step |time of steps|peak|optimizer|swap' "$d/13b.log" | tail -24 || true
}

# offload_7b_run PREFIX MB ACCUM STEPS [FLAGS...]: one Llama-2-7B run (stage 2, optimizer in host
# memory), its log's tail (start-up phases and peaks) and a line per step with its MFU.
offload_7b_run() {
  local prefix="$1" mb="$2" accum="$3" steps="$4" t0 rc=0; shift 4
  t0=$(now)
  timeout $((deadline - $(now) - 10)) "$pack/bin/zerone" train --model llama-2-7b --seq 2048 --micro-batch "$mb" \
    --grad-accum "$accum" --steps "$steps" --precision bf16 --device cuda --zero-stage 2 --offload-optimizer cpu "$@" \
    ${ZERONE_OFFLOAD_FLAGS:-} \
    --metrics "$prefix.jsonl" > "$prefix.log" 2>&1 || rc=$?
  echo "llama-2-7b B=$mb x accum $accum $*: ended with $rc after $(($(now) - t0)) s"
  grep -vE '^step ' "$prefix.log" | tail -8 || true
  [ ! -s "$prefix.jsonl" ] || python3 - "$prefix.jsonl" "$mb" "$accum" <<'PY'
import json, sys
rows = [x for x in map(json.loads, open(sys.argv[1])) if "ms" in x]
tokens = int(sys.argv[2]) * int(sys.argv[3]) * 2048
L, C, NH, NKV, hs, F, V, T = 32, 4096, 32, 32, 128, 11008, 32000, 2048
flops = 6 * (V * C + L * (C * (NH + 2 * NKV) * hs + NH * hs * C + 3 * C * F)) + 6 * L * T * NH * hs
for r in rows:
    s = r["ms"] / 1000
    print(f"llama-2-7b B={sys.argv[2]} x {sys.argv[3]} step {r['step']}: loss {r['loss']:.4f}, {s:.3f} s/step, MFU {tokens / s * flops / 989e12:.1%}")
PY
}

# focus: the one call of a session with little device time (15 minutes): the op harness's cuda
# rows (kernels_test), then issue 19 §4's headline, the Llama-2-7B shape with the optimizer in host
# memory (the delayed update, then accumulation, then one micro-step a step: ZERONE_7B_RUNS), then
# W5 GPT-2 beside PyTorch eager with what is left (ZERONE_W5_KEEP_S, default 100 s, kept for it).
# ZERONE_FOCUS_ATTENTION=1 adds the attention beside SDPA after the harness; ZERONE_FOCUS_OFFLOAD=0
# leaves out the offload step; ZERONE_FOCUS_LLAMA=1 adds Llama-3.2-1B's W5 after GPT-2's.
# ZERONE_FOCUS_SCRIPTS names tests/zero/ scripts to run after the op harness (zero_cuda.log);
# ZERONE_OFFLOAD_PARTS (default 7b) may add 13b and the 1B parts (none cpu fsdp2 nvme); ZERONE_OFFLOAD_FLAGS go to every 7B and 13B run
# (--lr, say), ZERONE_7B_STEPS and ZERONE_13B_STEPS set their steps, ZERONE_13B_MIN_S the time the
# 13B shape needs left to start (default 240 s).
# pack_extras DIR: the metrics $out holds and what DIR holds (gtest XML) into $out/extra.tar.gz
# (the device tool brings back 8 files); DIR is removed.
pack_extras() {
  cp "$out"/*.jsonl "$1/" 2>/dev/null; rm -f "$out"/*.jsonl
  tar -C "$1" -czf "$out/extra.tar.gz" . 2>/dev/null
  rm -rf "$1"
}

do_focus() {
  begin_call 540 || return 1
  local tmp; tmp="$(mktemp -d)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/info.txt" 2>&1
  step info 20 info.txt "$pack/bin/zerone" info
  # ZERONE_FOCUS_HARNESS=0: a second focus call of the session, after the first passed them.
  [ "${ZERONE_FOCUS_HARNESS:-1}" = 0 ] || step gtest:kernels_test 120 gtest_cuda.log gtest_cuda kernels_test "$tmp/kernels_test.xml"
  # ZERONE_FOCUS_SCRIPTS: test scripts of tests/zero/ to run after it ("device_cuda", say).
  local script
  for script in ${ZERONE_FOCUS_SCRIPTS:-}; do
    step "zero/$script.sh" 150 zero_cuda.log bash "$root/tests/zero/$script.sh" "$pack/bin/zerone"
  done
  # ZERONE_FOCUS_ATTENTION=1: the attention alone beside SDPA (issue 18 §4) before the rest.
  [ "${ZERONE_FOCUS_ATTENTION:-0}" = 0 ] || step attention 90 bench_w5.log bench_attention
  # ZERONE_FOCUS_OFFLOAD=0: no offload step (a call for issue 18's speed alone).
  if [ "${ZERONE_FOCUS_OFFLOAD:-1}" != 0 ]; then
    export ZERONE_OFFLOAD_PARTS="${ZERONE_OFFLOAD_PARTS:-7b}" ZERONE_7B_RUNS="${ZERONE_7B_RUNS:-dpu accum plain}"
    # The offload step's own guards read ZERONE_DEADLINE: it ends where W5's 100 s begin.
    local call_deadline=$deadline keep_s="${ZERONE_W5_KEEP_S:-100}"
    export ZERONE_DEADLINE=$((deadline - keep_s))
    step offload $((deadline - $(now) - keep_s)) offload.log bench_offload
    export ZERONE_DEADLINE=$call_deadline
  fi
  export ZERONE_W5_PEERS=eager ZERONE_W5_LARGEST=0
  # ZERONE_FOCUS_LLAMA=1: Llama-3.2-1B's W5 after GPT-2's, 150 s kept for it (issue 18 §4's second
  # target; eager PyTorch beside it when time is left).
  if [ "${ZERONE_FOCUS_LLAMA:-0}" = 1 ]; then
    local call_end=$deadline
    export ZERONE_DEADLINE=$((deadline - 150))  # GPT-2's peers see the time left before Llama's
    step w5 $((deadline - $(now) - 150)) bench_w5.log bench_w5 gpt2
    export ZERONE_DEADLINE=$call_end
    step w5_llama $((deadline - $(now))) bench_w5.log bench_w5 llama
  else
    step w5 $((deadline - $(now))) bench_w5.log bench_w5 gpt2
  fi
  pack_extras "$tmp"
  cat "$out/summary.txt"
}

do_offload() {
  begin_call 480 || return 1
  step offload $((deadline - $(now))) offload.log bench_offload
  cat "$out/summary.txt"
}

# Issue 18 §4: the flash attention alone beside PyTorch's scaled_dot_product_attention (flash), at
# W5's GPT-2 shape and at Llama-3.2-1B's (grouped-query), bf16 operands.
bench_attention() {
  local shape
  for shape in "8 1024 12 12 64" "4 2048 32 8 64"; do
    # shellcheck disable=SC2086 # one word per dimension
    "$pack/bin/bench_attention_cuda" $shape bf16 || echo "bench_attention_cuda $shape: FAILED"
    # shellcheck disable=SC2086
    PYTHONUNBUFFERED=1 python3 "$root/bench/pytorch_peer.py" attention $shape || echo "torch sdpa $shape: FAILED"
  done
}

do_run() {
  begin_call 480 || return 1
  local tmp; tmp="$(mktemp -d)"
  {
    date -u; pack_banner; sed 's/^/  /' "$pack/MANIFEST"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    (. /etc/os-release 2>/dev/null; echo "os: ${PRETTY_NAME:-?}"); uname -r; nproc
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1 | tail -1
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  } > "$out/info.txt" 2>&1
  step info 30 info.txt "$pack/bin/zerone" info
  step ldd 10 info.txt sh -c "cat '$pack/bin/zerone'; LD_LIBRARY_PATH='$pack/lib:$(cuda_lib_dirs | paste -sd:)' ldd '$pack/libexec/zerone' | grep -E 'cuda|cublas|nccl|not found'"
  # The op harness first, then the whole-step trajectories: when the budget runs out, it is the
  # less telling programs that are skipped.
  local prog
  for prog in $(sed -n 's/^tests //p' "$pack/MANIFEST" | tr ' ' '\n' | grep . |
                awk '{print (/^kernels_test$/ ? 0 : /^zero_test$/ ? 1 : /^train_test$/ ? 2 : /^nn_test$/ ? 3 : 4), $0}' |
                sort -k1,1n -k2 | awk '{print $2}'); do
    step "gtest:$prog" 150 gtest_cuda.log gtest_cuda "$prog" "$tmp/$prog.xml"
  done
  local script
  # shellcheck disable=SC2231 # the globs are the point: later *cuda*/*nccl* test scripts run too
  for script in $(ls "$root"/tests/*/*cuda*.sh "$root"/tests/*/*nccl*.sh 2>/dev/null | sort -u); do
    step "$(basename "$(dirname "$script")")/$(basename "$script")" 150 zero_cuda.log bash "$script" "$pack/bin/zerone"
  done
  if "$pack/bin/zerone" info 2>/dev/null | grep -q '^devices .*cuda'; then
    step w5 150 bench_w5.log bench_w5 gpt2
    step attention 90 bench_w5.log bench_attention
    step w5_llama $((deadline - $(now))) bench_w5.log bench_w5 llama
  else
    echo "w5 rc=77 (no GPU: skipped)" | tee -a "$out/summary.txt"
  fi
  pack_extras "$tmp"
  echo "=== summary (reports in $out: $(ls "$out" | tr '\n' ' '))"
  cat "$out/summary.txt"
  ! grep -vE ' rc=(0|77) ' "$out/summary.txt" | grep -q ' rc='
}

case "${1:-}" in
  pack) do_pack ;;
  check) do_check ;;
  selftest) do_selftest "${2:-bookworm}" ;;
  run) do_run ;;
  sanitize) do_sanitize ;;
  profile) do_profile ;;
  more) do_more ;;
  _gtest_cuda) gtest_cuda "${@:2}" ;;   # internal: a step of run (pack_env already done)
  _bench_w5) bench_w5 "${@:2}" ;;
  _bench_attention) bench_attention ;;
  _bench_offload) bench_offload ;;
  offload) do_offload ;;
  focus) do_focus ;;
  again) do_again ;;
  *) echo "usage: scripts/gpu_run.sh pack|check|selftest [bookworm|bullseye]|run|focus|more|again|offload|profile|sanitize (docs/GPU.md)" >&2; exit 2 ;;
esac
