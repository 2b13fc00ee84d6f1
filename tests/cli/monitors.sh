#!/usr/bin/env bash
# Issue 23: DeepSpeed's tensorboard and csv_monitor blocks through the real binary. The event file
# is decoded here by an independent reader (its own CRC-32C and protobuf parsing, in Python) and
# every scalar compared with the metrics JSONL; the CSVs likewise. Flags, --report, --peak-tflops;
# wandb and bad monitor settings are one-line errors.
set -uo pipefail
Z="$1"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cd "$d" || exit 1
fail=0
tiny=(--model gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --threads 1)
cat > ds.json <<'JSON'
{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,
 "fp16": {"enabled": true, "initial_scale_power": 24, "hysteresis": 1},
 "tensorboard": {"enabled": true, "output_path": "out/tb", "job_name": "job1"},
 "csv_monitor": {"enabled": true, "output_path": "out/csv/", "job_name": "job1"},
 "wandb": {"enabled": false, "project": "p"}, "comet": {"enabled": false}}
JSON
if ! "$Z" train --config ds.json "${tiny[@]}" --steps 12 --val-every 4 --metrics m.jsonl --report r.html --peak-tflops 2.5 > run.out 2>&1; then
  echo "FAIL run: $(tail -n 5 run.out)"; exit 1
fi
grep -q "^  wrote: metrics 'm.jsonl' (12 lines); tensorboard 'out/tb/job1/events.out.tfevents.[^']*' (" run.out &&
  grep -q "csv_monitor 'out/csv/job1' (5 files); report 'r.html'" run.out ||
  { echo "FAIL the summary does not list what was written: $(grep wrote: run.out)"; fail=1; }
[ -s r.html ] || { echo "FAIL --report wrote nothing"; fail=1; }
python3 - <<'PY' || fail=1
import glob, json, struct, sys

def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF

def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF

def varint(buf, i):
    v = shift = 0
    while True:
        b = buf[i]; i += 1
        v |= (b & 0x7F) << shift; shift += 7
        if not b & 0x80: return v, i

def fields(buf):
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        f, t = key >> 3, key & 7
        if t == 0: v, i = varint(buf, i)
        elif t == 1: v = buf[i:i + 8]; i += 8
        elif t == 5: v = buf[i:i + 4]; i += 4
        elif t == 2: n, i = varint(buf, i); v = buf[i:i + n]; i += n
        else: raise ValueError(f"wire type {t}")
        yield f, v

files = glob.glob("out/tb/job1/events.out.tfevents.*")
assert len(files) == 1, files
raw = open(files[0], "rb").read()
pos, records, scalars, version = 0, 0, {}, None
while pos < len(raw):
    (n,) = struct.unpack_from("<Q", raw, pos)
    assert struct.unpack_from("<I", raw, pos + 8)[0] == masked(raw[pos:pos + 8]), f"length CRC of record {records}"
    data = raw[pos + 12:pos + 12 + n]
    assert struct.unpack_from("<I", raw, pos + 12 + n)[0] == masked(data), f"data CRC of record {records}"
    pos += 16 + n; records += 1
    step = None
    for f, v in fields(data):
        if f == 2: step = v
        if f == 3: version = version or v.decode()
        if f == 5:
            for sf, sv in fields(v):
                tag = val = None
                for vf, vv in fields(sv):
                    if vf == 1: tag = vv.decode()
                    if vf == 2: val = struct.unpack("<f", vv)[0]
                scalars.setdefault(tag, []).append((step, val))
f32 = lambda x: struct.unpack("<f", struct.pack("<f", x))[0]
lines = [json.loads(l) for l in open("m.jsonl")]
B = 4 * 2  # samples per step: micro-batch x accumulation x world 1
want = {"Train/Samples/train_loss": [(l["step"] * B, f32(l["loss"])) for l in lines],
        "Train/Samples/lr": [(l["step"] * B, f32(l["lr"])) for l in lines],
        "Train/Samples/loss_scale": [(l["step"] * B, f32(l["loss_scale"])) for l in lines],
        "Train/Samples/grad_norm": [(l["step"] * B, f32(l["grad_norm"])) for l in lines if l["grad_norm"] is not None],
        "Train/Samples/val_loss": [(l["step"] * B, f32(l["val_loss"])) for l in lines if "val_loss" in l]}
ok = version == "brain.Event:2"
if not ok: print(f"FAIL file_version {version!r}")
for tag, rows in want.items():
    if scalars.get(tag) != rows:
        print(f"FAIL {tag}: event file {scalars.get(tag)}, JSONL {rows}"); ok = False
# CSV: DeepSpeed's file names and header, "samples,value" rows equal to the JSONL's to float precision.
for tag, rows in want.items():
    path = "out/csv/job1/" + tag.replace("/", "_") + ".csv"
    got = open(path).read().splitlines()
    if got[0] != "step," + tag.split("/")[-1]: print(f"FAIL {path} header {got[0]}"); ok = False
    vals = [(int(a), float(b)) for a, b in (r.split(",") for r in got[1:])]
    if [x for x, _ in vals] != [x for x, _ in rows] or any(abs(a - b) > 1e-6 * max(1, abs(b)) for (_, a), (_, b) in zip(vals, rows)):
        print(f"FAIL {path}: {vals} vs {rows}"); ok = False
if not any(l.get("skipped") for l in lines): print("FAIL no skipped step: the loss-scale check is weak"); ok = False
# --peak-tflops: MFU against the given peak.
if any(abs(l["mfu"] - l["tflop_per_s"] / 2.5) > 1e-12 for l in lines) or lines[0]["run"]["peak_source"] != "--peak-tflops":
    print("FAIL mfu is not tflop_per_s / --peak-tflops"); ok = False
print(f"ok   event file: {records} records, CRCs verified, {sum(map(len, scalars.values()))} scalars equal the JSONL; 5 CSVs equal" if ok else "")
sys.exit(0 if ok else 1)
PY

# The flags do the same without a config file.
if "$Z" train "${tiny[@]}" --micro-batch 2 --steps 3 --tensorboard flags/tb --csv-monitor flags/csv > flags.out 2>&1 &&
   ls flags/tb/events.out.tfevents.* > /dev/null 2>&1 && [ "$(wc -l < flags/csv/Train_Samples_train_loss.csv)" -eq 4 ] &&
   grep -q "^2,\|^4,\|^6," flags/csv/Train_Samples_lr.csv; then
  echo "ok   --tensorboard, --csv-monitor"
else echo "FAIL flags: $(tail -n 3 flags.out; ls -R flags)"; fail=1; fi

bad() {  # name regex config-json [flags...]
  local name="$1" regex="$2" json="$3"; shift 3
  local args=("$@")
  if [ -n "$json" ]; then echo "$json" > "$name.json"; args+=(--config "$name.json"); fi
  "$Z" train "${tiny[@]}" --micro-batch 2 --steps 2 "${args[@]}" > "$name.out" 2> "$name.err"; local rc=$?
  if [ $rc -ne 1 ] || [ "$(wc -l < "$name.err")" -ne 1 ] || ! grep -qE -- "^zerone: error: .*$regex" "$name.err"; then
    echo "FAIL $name: exit $rc, stderr: $(cat "$name.err")"; fail=1
  else echo "ok   $name: $(cat "$name.err")"; fi
}
touch afile
bad wandb "key 'wandb.enabled' is true: zerone cannot log to Weights & Biases" '{"wandb": {"enabled": true, "project": "p"}}'
bad comet "key 'comet.enabled' is true: zerone cannot log to Comet" '{"comet": {"enabled": true}}'
bad tb_unknown_key "key 'tensorboard.dir' is unknown" '{"tensorboard": {"enabled": true, "dir": "x"}}'
bad tb_under_file "key 'tensorboard': 'afile' is not a directory" '{"tensorboard": {"enabled": true, "output_path": "afile", "job_name": "j"}}'
bad csv_under_file "--csv-monitor: 'afile' is not a directory" "" --csv-monitor afile/x
bad report_without_metrics "--report 'r2.html' is drawn from the run's metrics: give --metrics" "" --report r2.html
bad report_bad_dir "--report: directory 'no/dir' of 'no/dir/r.html' does not exist" "" --metrics m2.jsonl --report no/dir/r.html
bad report_is_metrics "--report and --metrics name the same file" "" --metrics m2.jsonl --report m2.jsonl
bad peak_negative "--peak-tflops -1 is out of range" "" --peak-tflops -1
[ -e afile/x ] || [ -e r2.html ] || [ -e m2.jsonl ] && { echo "FAIL a refused run wrote something"; fail=1; }
# A disabled block does nothing and says nothing.
echo '{"tensorboard": {"enabled": false, "output_path": "off"}, "csv_monitor": {"enabled": false}}' > off.json
if "$Z" train "${tiny[@]}" --micro-batch 2 --steps 2 --config off.json > off.out 2>&1 && [ ! -e off ] && [ ! -e DeepSpeedJobName ] &&
   ! grep -q "notice" off.out; then echo "ok   disabled monitors write nothing"; else echo "FAIL disabled monitors: $(cat off.out | head -3)"; fail=1; fi
exit $fail
