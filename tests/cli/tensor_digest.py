# tensor_digest.py DIR: one "name dtype shape sha256" line per tensor of DIR/model.safetensors,
# sorted by name, so that two saves can be compared byte for byte (tests/cli/convert.sh,
# tests/cli/consolidated_save.sh).
import hashlib, json, struct, sys

raw = open(sys.argv[1] + "/model.safetensors", "rb").read()
n = struct.unpack("<Q", raw[:8])[0]
header = json.loads(raw[8:8 + n])
for name in sorted(k for k in header if k != "__metadata__"):
    e = header[name]
    b, c = e["data_offsets"]
    print(name, e["dtype"], e["shape"], hashlib.sha256(raw[8 + n + b:8 + n + c]).hexdigest()[:16])
