#!/usr/bin/env bash
# Runs the zerone program named by $ZERONE_UNDER_SIM with the arguments given, adding `--device sim` to a
# `train` or `estimate` command: the ZeRO test scripts take it as their program, so that each of
# them also runs on the simulated device (Note [Simulated device memory] in
# zerone/kernels/sim/sim_backend.h), and estimates for it (Note [Staged collective bytes]).
#   ZERONE_UNDER_SIM=build/zerone tests/zero/on_sim.sh train ...   (tests/zero/CMakeLists.txt)
set -euo pipefail
z="$ZERONE_UNDER_SIM"
if [ "${1:-}" = train ] || [ "${1:-}" = estimate ]; then exec "$z" "$@" --device sim; fi
exec "$z" "$@"
