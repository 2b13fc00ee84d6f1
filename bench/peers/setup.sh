#!/usr/bin/env bash
# The peers' Python environment: current PyTorch 2, DeepSpeed, transformers, tokenizers, sentencepiece,
# safetensors and tensorboard from the Python package index, in a virtual environment outside the source
# tree, and Debian's libaio-dev for DeepSpeed's async I/O (its CPU Adam and aio ops build on first use with
# g++ and ninja). The benchmarks in bench/ and `make interop` call it; `make test` never does.
#
# Usage: bash bench/peers/setup.sh            -> prints the environment's python on its last line
#   ZERONE_PEERS_VENV=DIR  where the environment lives
#                          (default: ${XDG_CACHE_HOME:-$HOME/.cache}/zerone/peers-venv)
# Idempotent: a stamp file records the requirement list; a second run with the same list and a working
# environment does nothing but print the python. Versions installed are written to $VENV/versions.txt.
set -euo pipefail
venv=${ZERONE_PEERS_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/zerone/peers-venv}
here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
case "$(realpath -m "$venv")/" in
  "$source_dir"/*) echo "peers-setup: error: ZERONE_PEERS_VENV=$venv is inside the source tree; expected a cache or build directory" >&2; exit 1 ;;
esac

requirements="torch deepspeed transformers tokenizers sentencepiece safetensors tensorboard ninja numpy psutil"
debian_packages="python3-venv python3-dev libaio-dev g++ make"

missing=()
for p in $debian_packages; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "peers-setup: error: Debian packages missing: ${missing[*]}; expected them installed (run as root, or apt-get install them)" >&2
    exit 1
  fi
  echo "peers-setup: installing Debian packages: ${missing[*]}" >&2
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2 \
    || { apt-get update >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" >&2; }
fi

stamp="$venv/zerone-peers.stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$requirements" ] \
   && DS_ACCELERATOR=cpu "$venv/bin/python" -c "import torch, deepspeed, transformers, tokenizers, sentencepiece, safetensors" >/dev/null 2>&1; then
  echo "$venv/bin/python"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
# Debian's python, not whatever python3 is first on PATH: the DeepSpeed ops compile against its headers.
/usr/bin/python3 -m venv "$venv" >&2
"$venv/bin/python" -m pip install --quiet --upgrade pip >&2
# torch first: DeepSpeed's setup imports it.
"$venv/bin/python" -m pip install --quiet torch >&2
"$venv/bin/python" -m pip install --quiet $requirements >&2
# The versions go straight to the file: importing deepspeed logs its accelerator choice on stdout.
DS_ACCELERATOR=cpu "$venv/bin/python" - "$venv/versions.txt" >&2 <<'PY'
import importlib, platform, sys
lines = ["python " + platform.python_version()]
for m in ["torch", "deepspeed", "transformers", "tokenizers", "sentencepiece", "safetensors", "tensorboard", "numpy"]:
    lines.append(m + " " + importlib.import_module(m).__version__)
open(sys.argv[1], "w").write("\n".join(lines) + "\n")
PY
cat "$venv/versions.txt" >&2
echo "$requirements" >"$stamp"
echo "$venv/bin/python"
