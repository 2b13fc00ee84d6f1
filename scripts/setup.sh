#!/usr/bin/env bash
# Installs the Debian packages zerone needs to build and test, only those that are missing.
# Idempotent; safe to run on every `make`. Needs root (or sudo) only when something is missing.
set -euo pipefail

packages=(
  build-essential cmake pkg-config
  libdnnl-dev              # oneDNN 2.6: matmul (f32, bf16 on AVX512-BF16 / AMX)
  ocl-icd-opencl-dev       # libdnnl-dev only recommends it, but its CMake package (DNNLConfig) needs OpenCL
  libopenmpi-dev openmpi-bin
  libmpich-dev mpich       # tests also build and run zerone against MPICH (Open MPI stays the default)
  liburing-dev             # NVMe swap engine (io_uring, O_DIRECT)
  libxxhash-dev            # checksums of checkpoint files (zerone/io/sharded_checkpoint.cc)
  fio                      # bench: W4 compares the swap engine with fio sequential O_DIRECT on the same disk
  libpcre2-dev             # GPT-2 / LLaMA-3 BPE pre-tokenizer patterns (\p{L}, lookahead)
  libsentencepiece-dev     # SentencePiece tokenizers (LLaMA-2 tokenizer.model)
  sentencepiece            # tests: spm_train / spm_encode are the reference for our SentencePiece path
  nlohmann-json3-dev
  libcli11-dev
  libgtest-dev libgmock-dev
  libbenchmark-dev
  python3                  # test scripts compare runs and parse metrics
  strace                   # tests/cli/errors_are_errors.sh checks the fsync/rename order of atomic writes
  zlib1g-dev               # gzip-compressed IDX image files (zerone/io/idx)
  dataset-fashion-mnist    # the seed examples' data: IDX files under /usr/share/datasets/fashion-mnist
  chromium                 # tests/cli/report.sh loads zerone report's HTML in headless Chromium
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi

echo "setup: installing missing packages: ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
    echo "setup: need root to install: ${missing[*]}" >&2; exit 1
  fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
