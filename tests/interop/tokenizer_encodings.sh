#!/usr/bin/env bash
# make interop: zerone's tokenizers (GPT-2 BPE, a LLaMA-3 style tokenizer.json, a LLaMA-2 style
# SentencePiece model) encode a few hundred varied strings exactly as the real `tokenizers`,
# `transformers` and `sentencepiece` (PyPI) do (tests/interop/tokenizer_encodings.py lists them).
# Usage: tokenizers.sh ZERONE PYTHON   (PYTHON: the peers' environment, bench/peers/setup.sh)
set -euo pipefail
Z="$(readlink -f "$1")"; py="$2"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
HF_HUB_OFFLINE=1 TRANSFORMERS_VERBOSITY=error "$py" "$(dirname "$0")/tokenizer_encodings.py" "$Z" "$d"
