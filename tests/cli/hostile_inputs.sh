#!/usr/bin/env bash
# Hostile inputs (issue 24, items 9-17): Hugging Face directories with two layouts, GPT-2 config keys
# that change the attention, weights beyond the f16 range, a tied head stored anyway, a gzip bomb as
# IDX data, ambiguous inputs, DeepSpeed's old offload names, and clear messages for sample, convert
# and a `latest` symlink. Each case is one clear "zerone: error:" line (or a notice) through the real
# program.
set -u
Z="$(readlink -f "$1")"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
cd "$d" || exit 1
fail=0
check() { bash "$here/expect_error.sh" "$@" || fail=1; }
ok() { echo "ok: $*"; }
bad() { echo "FAIL: $*"; fail=1; }
# st.py: a safetensors file as {name: (dtype, shape, bytes)}, and back.
cat > st.py <<'PY'
import json, struct
def load(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, c = e["data_offsets"]
        out[name] = (e["dtype"], e["shape"], raw[8 + n + b:8 + n + c])
    return out
def save(path, tensors):
    header, blob = {}, b""
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(blob), len(blob) + len(data)]}
        blob += data
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + blob)
PY
digest() { python3 -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"; }
model="gpt2:layers=2,dim=32,heads=2,vocab=257,ctx=16"
printf 'A checkpoint is a promise that no work is lost. %.0s' $(seq 1 200) > t.txt
"$Z" prepare --text t.txt --out c --val-fraction 0 >/dev/null || { echo "prepare failed"; exit 1; }
train=(train --data c_train.bin --micro-batch 2 --seq 16 --threads 1 --precision fp32 --no-shuffle)
"$Z" "${train[@]}" --model "$model" --steps 1 --save hfA/ > /dev/null 2>&1 || bad "save hfA"
"$Z" "${train[@]}" --model "$model" --steps 1 --seed 7 --lr 1e-2 --save hfB/ > /dev/null 2>&1 || bad "save hfB"

# 9. A sharded model in the destination: the new model.safetensors replaces it (index and shards
# go); a directory holding both layouts is refused, never read as the stale one.
mkdir -p sharded && cp hfA/config.json sharded/
python3 - hfA/model.safetensors sharded <<'PY'
import json, sys
sys.path.insert(0, ".")
import st
t = st.load(sys.argv[1])
names = sorted(t)
halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2], "model-00002-of-00002.safetensors": names[len(names) // 2:]}
wm = {}
for f, ns in halves.items():
    st.save(sys.argv[2] + "/" + f, {n: t[n] for n in ns})
    wm.update({n: f for n in ns})
json.dump({"metadata": {}, "weight_map": wm}, open(sys.argv[2] + "/model.safetensors.index.json", "w"))
PY
"$Z" "${train[@]}" --steps 1 --init sharded > /dev/null 2>&1 || bad "the sharded fixture does not load"
"$Z" convert hfB sharded --to hf > c9.log 2>&1 || { bad "convert into a sharded directory"; cat c9.log; }
if [ ! -e sharded/model.safetensors.index.json ] && ! ls sharded | grep -q 'model-0000' &&
   [ "$(digest sharded/model.safetensors)" = "$(digest hfB/model.safetensors)" ]; then
  ok "HF output replaces a sharded model (index and shards removed)"
else
  bad "HF output into a sharded directory left: $(ls sharded)"
fi
mkdir -p both && cp hfA/* both/ && python3 - hfB/model.safetensors both <<'PY'
import json, sys
sys.path.insert(0, ".")
import st
t = st.load(sys.argv[1])
st.save(sys.argv[2] + "/model-00001-of-00001.safetensors", t)
json.dump({"weight_map": {n: "model-00001-of-00001.safetensors" for n in t}}, open(sys.argv[2] + "/model.safetensors.index.json", "w"))
PY
check "'both' holds both model.safetensors and a sharded model \(model.safetensors.index.json\): one of them is stale" \
  "$Z" "${train[@]}" --steps 1 --init both

# 10. GPT-2 config keys that change the attention are refused, naming the key.
edit_config() {  # edit_config NAME PYTHON: a copy of hfA whose config dict c was changed
  rm -rf "$1"; cp -r hfA "$1"
  python3 - "$1/config.json" "$2" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); exec(sys.argv[2]); json.dump(c, open(sys.argv[1], "w"))
PY
}
edit_config inv 'c["scale_attn_by_inverse_layer_idx"] = True'
check "\"scale_attn_by_inverse_layer_idx\": true .* is not supported" "$Z" "${train[@]}" --steps 1 --init inv
edit_config noscale 'c["scale_attn_weights"] = False'
check "\"scale_attn_weights\": false .* is not supported" "$Z" convert noscale noscale.bin

# 11. Weights beyond the f16 range: an error naming the tensor and its largest magnitude.
rm -rf huge && cp -r hfA huge && python3 - huge/model.safetensors <<'PY'
import struct, sys
sys.path.insert(0, ".")
import st
t = st.load(sys.argv[1])
dtype, shape, data = t["transformer.h.1.mlp.c_fc.weight"]
t["transformer.h.1.mlp.c_fc.weight"] = (dtype, shape, struct.pack("<f", -123456.0) + data[4:])
st.save(sys.argv[1], t)
PY
check "tensor fcw of unit .*1.* holds values up to 123456 in magnitude, beyond the f16 range \(largest 65504\)" \
  "$Z" convert huge huge16 --to hf --dtype f16
[ ! -e huge16 ] && ok "nothing written" || bad "convert --dtype f16 wrote huge16"
check "--init 'huge' at --precision fp16: tensor fcw .* holds values up to 123456" \
  "$Z" train --data c_train.bin --micro-batch 2 --seq 16 --threads 1 --precision fp16 --steps 1 --init huge

# 12. A tied head stored anyway: taken when it equals the embedding, refused naming it when not.
rm -rf tied && cp -r hfA tied && python3 - tied/model.safetensors <<'PY'
import sys
sys.path.insert(0, ".")
import st
t = st.load(sys.argv[1])
t["lm_head.weight"] = t["transformer.wte.weight"]
st.save(sys.argv[1], t)
PY
"$Z" "${train[@]}" --steps 1 --init tied > i12.log 2>&1 && ok "a stored tied head equal to the embedding loads" \
  || { bad "a stored tied head equal to the embedding"; cat i12.log; }
python3 - tied/model.safetensors <<'PY'
import struct, sys
sys.path.insert(0, ".")
import st
t = st.load(sys.argv[1])
dtype, shape, data = t["lm_head.weight"]
t["lm_head.weight"] = (dtype, shape, data[:40] + struct.pack("<f", 9.5) + data[44:])
st.save(sys.argv[1], t)
PY
check "tensor 'lm_head.weight' differs from 'transformer.wte.weight' \(element 10: 9.5 vs" "$Z" "${train[@]}" --steps 1 --init tied

# 13. A gzip bomb as IDX data: refused after inflating one byte past what the header declares.
mkdir -p bomb && python3 - bomb <<'PY'
import gzip, struct, sys
with gzip.open(sys.argv[1] + "/train-images-idx3-ubyte.gz", "wb", compresslevel=9) as f:
    f.write(struct.pack(">IIII", 0x803, 60000, 28, 28))
    zeros = bytes(1 << 20)
    for _ in range(400):  # 400 MiB, the header declares 45 MiB
        f.write(zeros)
with gzip.open(sys.argv[1] + "/train-labels-idx1-ubyte.gz", "wb") as f:
    f.write(struct.pack(">II", 0x801, 60000) + bytes(60000))
PY
python3 - "$Z" <<'PY' > bomb.out 2>&1
import resource, subprocess, sys
r = subprocess.run([sys.argv[1], "train", "--model", "mnist-mlp", "--data", "bomb", "--steps", "1", "--threads", "1"],
                   capture_output=True, text=True)
print("rc", r.returncode)
print("rss_kib", resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(r.stderr)
PY
if grep -q "^rc 1$" bomb.out && grep -q "inflates to more data than the 47040000 bytes its header describes" bomb.out &&
   [ "$(sed -n 's/^rss_kib //p' bomb.out)" -lt 250000 ]; then
  ok "gzip bomb refused at $(sed -n 's/^rss_kib //p' bomb.out) KiB peak"
else
  bad "gzip bomb:"; cat bomb.out
fi

# 14. Ambiguous inputs: half a validation split, raw and .gz of one file, a repeated layer option,
# a mistral config (a notice: read as LLaMA), --epochs 0.
python3 "$here/make_idx.py" half 64 16 8 8 4 > /dev/null || bad "make_idx"
rm half/t10k-images-idx3-ubyte
check "'half' holds t10k-labels-idx1-ubyte but no t10k-images-idx3-ubyte\[.gz\] \(or -idx4-ubyte\): the validation split needs both" \
  "$Z" train --model seq:in=1x8x8,flatten,linear=4 --data half --steps 1
python3 "$here/make_idx.py" dup 64 16 8 8 4 > /dev/null && gzip -k dup/train-labels-idx1-ubyte
check "'dup' holds both 'train-labels-idx1-ubyte' and 'train-labels-idx1-ubyte.gz'" \
  "$Z" train --model seq:in=1x8x8,flatten,linear=4 --data dup --steps 1
python3 "$here/make_idx.py" clean 64 16 8 8 4 > /dev/null
check "'conv=4:k3:k5': option 'k' is given twice" "$Z" train --model "seq:in=1x8x8,conv=4:k3:k5,relu,flatten,linear=4" --data clean --steps 1
rm -rf mistral && cp -r "$here/../data/hf_llama_tied" mistral && python3 - mistral/config.json <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["model_type"] = "mistral"; json.dump(c, open(sys.argv[1], "w"))
PY
"$Z" convert mistral mistral.zck --to zerone > c14.log 2>&1 && grep -q "notice: .*model_type 'mistral' without a sliding window is read as LLaMA" c14.log \
  && ok "mistral is read as LLaMA with a notice" || { bad "mistral without a notice"; cat c14.log; }
check "--epochs 0 is out of range: expected 1..1000000" "$Z" train --model seq:in=1x8x8,flatten,linear=4 --data clean --epochs 0

# 15. DeepSpeed's old offload names are honoured; disabled or tuning-only blocks are a notice;
# load_from_fp32_weights false is an error.
echo '{"zero_optimization": {"stage": 3, "cpu_offload": true, "cpu_offload_params": true},
       "hybrid_engine": {"enabled": false}, "graph_harvesting": false, "use_data_before_expert_parallelism": false}' > ds.json
"$Z" "${train[@]}" --model "$model" --steps 1 --config ds.json > ds.out 2> ds.err
if grep -q "optimizer on cpu, params on cpu" ds.out && grep -q "notice: config keys with no effect here: .*graph_harvesting.*hybrid_engine" ds.err; then
  ok "cpu_offload / cpu_offload_params honoured; disabled blocks a notice"
else
  bad "DeepSpeed old names:"; cat ds.out ds.err
fi
echo '{"zero_optimization": {"stage": 2, "load_from_fp32_weights": false}}' > fp32w.json
check "key 'zero_optimization.load_from_fp32_weights' is false" "$Z" "${train[@]}" --model "$model" --steps 1 --config fp32w.json

# 16. sample from a vocabulary-256 model with --prompt-tokens needs no --tokenizer.
python3 - tok256.bin <<'PY'
import random, struct, sys
random.seed(3)
n = 4096
open(sys.argv[1], "wb").write(struct.pack("<256i", 20240520, 1, n, *[0] * 253) +
                              struct.pack("<%dH" % n, *[random.randrange(256) for _ in range(n)]))
PY
"$Z" train --model gpt2:layers=1,dim=32,heads=2,vocab=256,ctx=16 --data tok256.bin --micro-batch 2 --seq 16 --steps 1 \
  --precision fp32 --save m256.bin > /dev/null 2>&1 || bad "train the vocabulary-256 model"
"$Z" sample --init m256.bin --prompt-tokens 1,2,3 --tokens 4 --precision fp32 > s16.out 2> s16.err \
  && ok "sample from a vocabulary-256 model" || { bad "sample from a vocabulary-256 model"; cat s16.err; }

# 17. convert stopped by a signal says so in convert's words; a `latest` symlink to a directory
# is named as such.
"$Z" "${train[@]}" --model "$model" --steps 2 --checkpoint-dir ck > /dev/null 2>&1 || bad "the reference save"
ZERONE_CHECKPOINT_CRASH_AT=file:TERM "$Z" convert ck z17 --to zerone > c17.out 2> c17.err; rc=$?
if [ $rc = 143 ] && grep -q "SIGTERM: stopping the conversion before it reads its next unit" c17.err &&
   ! grep -q "step boundary" c17.err && grep -q "convert stopped by SIGTERM: 'z17' was not written" c17.err && [ ! -e z17 ]; then
  ok "convert stopped by SIGTERM: $(grep -o 'SIGTERM: stopping.*' c17.err)"
else
  bad "convert stopped by a signal: rc $rc"; cat c17.err
fi
rm ck/latest && ln -s step-00000002 ck/latest
check "'ck/latest' is a directory \(a symlink to one\), but zerone's checkpoint pointer is a text file" \
  "$Z" "${train[@]}" --model "$model" --steps 3 --checkpoint-dir ck --resume

exit $fail
