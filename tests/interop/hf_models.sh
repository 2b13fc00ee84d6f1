#!/usr/bin/env bash
# make interop: zerone's Hugging Face model directories against the real `transformers` (PyPI):
# transformers loads what zerone saves and converts, zerone trains from what transformers saves,
# and both compute the same loss on the same tokens (tests/interop/hf_models.py says how exactly).
# Usage: hf_models.sh ZERONE PYTHON   (PYTHON: the peers' environment, bench/peers/setup.sh)
set -euo pipefail
Z="$(readlink -f "$1")"; py="$2"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "$py" "$(dirname "$0")/hf_models.py" "$Z" "$d"
