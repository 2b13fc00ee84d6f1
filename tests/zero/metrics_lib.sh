# Helpers for the scripts in tests/zero that compare runs by their --metrics files (sourced).
# losses FILE: each step's loss and gradient norm, one step a line.
losses() { python3 -c 'import json,sys; [print(json.loads(l)["loss"], json.loads(l)["grad_norm"]) for l in open(sys.argv[1])]' "$1"; }
# grad_peak FILE: the run's peak gradient bytes per place, "device.grad=N host.grad=N nvme.grad=N".
grad_peak() {
  python3 - "$1" <<'PY'
import json, sys
peak = {}
for line in open(sys.argv[1]):
    for k, v in json.loads(line).get("mem", {}).items():
        if k.endswith(".grad"): peak[k] = max(peak.get(k, 0), v)
print(" ".join(f"{k}={peak.get(k, 0)}" for k in ("device.grad", "host.grad", "nvme.grad")))
PY
}
