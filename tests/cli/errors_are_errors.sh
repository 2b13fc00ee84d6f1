#!/usr/bin/env bash
# "Errors are errors" (issue 7 §4), through the real program: every failure is one
# "zerone: error:" line and exit 1 — parse errors, non-Error exceptions, named pipes as inputs — and
# the messages say what rule was broken. Atomic writes fsync the directory after the rename.
set -u
Z="$(readlink -f "$1")"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
model="gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=32"
printf 'errors are errors, and they say so. %.0s' $(seq 1 100) > "$d/t.txt"
"$Z" prepare --text "$d/t.txt" --out "$d/c" >/dev/null || { echo "prepare failed"; exit 1; }
base=(train --model "$model" --data "$d/c_train.bin" --seq 16 --micro-batch 2 --threads 1)

# error NAME REGEX CMD...: exit exactly 1 within 20 s, stderr is one line "zerone: error: ...REGEX...".
error() {
  local name="$1" regex="$2"; shift 2
  timeout 20 "$@" > "$d/$name.stdout" 2> "$d/$name.err" < /dev/null
  local rc=$?
  if [ $rc -ne 1 ]; then echo "FAIL $name: exit $rc, expected 1"; cat "$d/$name.err" | head -5; fail=1; return; fi
  if [ "$(wc -l < "$d/$name.err")" -ne 1 ] || ! grep -qE -- "^zerone: error: .*$regex" "$d/$name.err"; then
    echo "FAIL $name: stderr is not one 'zerone: error:' line matching /$regex/:"; head -5 "$d/$name.err"; fail=1; return
  fi
  echo "ok   $name: $(cut -c1-200 "$d/$name.err")"
}

# Parse errors: exit 1 with the prefix (CLI11 used to exit 104/109/114 without it).
error unknown_flag "not expected: .*--frobnicate" "$Z" train --frobnicate 3
error bad_number "Could not convert: --lr = abc" "$Z" train --lr abc
error missing_subcommand "A subcommand is required" "$Z"
error missing_required "--init is required" "$Z" sample
error extra_positional "not expected" "$Z" estimate --model gpt2-124m --world 1 stray
"$Z" train --help > "$d/help.out" 2>&1 && grep -q -- "--micro-batch" "$d/help.out" \
  && echo "ok   help: exit 0" || { echo "FAIL help"; fail=1; }

# A directory or a named pipe as an input: refused before opening (a FIFO used to block forever).
error config_is_dir "--config: '$d' is a directory, expected a regular file" "$Z" train --config "$d"
mkfifo "$d/pipe.json" "$d/pipe.bin"
error config_is_fifo "--config: '.*pipe.json' is a named pipe" "$Z" train --config "$d/pipe.json"
error data_is_fifo "--data: '.*pipe.bin' is a named pipe" "$Z" train --model "$model" --seq 16 --data "$d/pipe.bin"
error val_is_fifo "--val-data: '.*pipe.bin' is a named pipe" "$Z" "${base[@]}" --val-data "$d/pipe.bin"
error init_is_fifo "'.*pipe.bin' is a named pipe" "$Z" train --init "$d/pipe.bin" --data "$d/c_train.bin"
error init_is_dir "'$d' is a directory" "$Z" train --init "$d" --data "$d/c_train.bin"
error text_is_fifo "--text: '.*pipe.bin' is a named pipe" "$Z" prepare --text "$d/pipe.bin" --out "$d/x"
error sample_init_fifo "'.*pipe.bin' is a named pipe" "$Z" sample --init "$d/pipe.bin"

# Numbers are plain decimals (Note [Strict numbers]): no octal, hex, empty, wrapped or clamped values.
error octal_steps "--steps: '0010' has a leading zero" "$Z" "${base[@]}" --steps 0010
error hex_accum "--grad-accum: '0x10' is not a decimal number" "$Z" "${base[@]}" --grad-accum 0x10
error negative_seed "--seed: '-1' is negative" "$Z" "${base[@]}" --seed -1
error huge_seed "--seed: '18446744073709551616' is out of range for a 64-bit integer" "$Z" "${base[@]}" --seed 18446744073709551616
error empty_data "--data: an empty value is not allowed" "$Z" train --data ""
error empty_save "--save: an empty value is not allowed" "$Z" "${base[@]}" --save ""
error octal_prompt_token "--prompt-tokens: '02' has a leading zero" "$Z" sample --init x --prompt-tokens 1,02
# Model specs: no duplicate keys, empty items, leading zeros, or sizes whose arithmetic overflows.
error spec_duplicate "key 'layers' is given twice" "$Z" train --model gpt2:layers=1,layers=2 --data "$d/c_train.bin"
error spec_trailing_comma "an empty item" "$Z" train --model gpt2:layers=1,dim=32,heads=2, --data "$d/c_train.bin"
error spec_empty "no keys after 'gpt2:'" "$Z" train --model gpt2: --data "$d/c_train.bin"
error spec_huge "layers=16777216 is not a positive decimal integer of at most 4096" "$Z" estimate --model gpt2:layers=16777216 --world 1
error estimate_seq "--seq 99999 exceeds the model's context length 1024" "$Z" estimate --model gpt2-124m --world 1 --seq 99999

# Messages that say the real rule.
error grad_accum_range "--grad-accum 1000000000 is out of range: expected an integer in 1..1048576" "$Z" "${base[@]}" --grad-accum 1000000000
error device_mem_nan "--device-mem-limit nan is out of range: expected a number in" "$Z" estimate --model gpt2-124m --world 1 --device-mem nan
error estimate_optimizer "--optimizer 'lamb': expected adamw or sgd" "$Z" estimate --model mnist-cnn --world 1 --optimizer lamb
error estimate_momentum_adamw "--momentum applies to --optimizer sgd" "$Z" estimate --model mnist-cnn --world 1 --momentum 0.9
error estimate_momentum_negative "--momentum -0.5 is out of range" "$Z" estimate --model mnist-cnn --world 1 --optimizer sgd --momentum -0.5
"$Z" "${base[@]}" --steps 1 --save "$d/m.bin" > /dev/null 2>&1 || { echo "FAIL: could not train a model"; fail=1; }
python3 - "$d/m.bin" "$d/bad_heads.bin" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read())
b[5 * 4:6 * 4] = (3).to_bytes(4, "little")  # NH = 3 does not divide C = 32
open(sys.argv[2], "wb").write(b)
PY
error header_rule "header field C \(header\[6\]\) = 32 breaks the rule C divisible by NH \(header\[5\]\)" \
  "$Z" train --init "$d/bad_heads.bin" --data "$d/c_train.bin"

# A checkpoint with a NaN is corrupt: refused at load, naming the tensor (it used to train into
# "training diverged at step 1 ... try a lower --lr").
python3 - "$d/m.bin" "$d/nan.bin" <<'PY'
import struct, sys
b = bytearray(open(sys.argv[1], "rb").read())
version = struct.unpack_from("<i", b, 4)[0]
if version == 3: struct.pack_into("<f", b, 1024 + 4 * 100, float("nan"))
else: struct.pack_into("<H", b, 1024 + 2 * 100, 0x7fc0)
open(sys.argv[2], "wb").write(b)
PY
error nan_checkpoint "checkpoint '.*nan.bin': embedding.wte holds a non-finite value \(nan\) at element 100" \
  "$Z" train --init "$d/nan.bin" --data "$d/c_train.bin" --seq 16
error nan_checkpoint_sample "holds a non-finite value" "$Z" sample --init "$d/nan.bin" --tokens 2

# prepare: its prefix must name files, its outputs are never its inputs, and it writes both shards
# or neither (a val shard from one corpus beside a train shard from another would mislead).
error prepare_dir_prefix "--out '$d/adir/' ends with '/'" "$Z" prepare --text "$d/t.txt" --out "$d/adir/"
cp "$d/t.txt" "$d/notes_train.bin"
error prepare_over_input "--out: '.*notes_train.bin' is the --text file" "$Z" prepare --text "$d/notes_train.bin" --out "$d/notes"
echo OLD > "$d/q_val.bin"; mkdir "$d/q_train.bin"
error prepare_pair "--out: '.*q_train.bin' is a directory" "$Z" prepare --text "$d/t.txt" --out "$d/q"
[ "$(cat "$d/q_val.bin")" = OLD ] && echo "ok   prepare_pair_kept" || { echo "FAIL prepare_pair_kept: q_val.bin was replaced"; fail=1; }
# Files whose size the kernel reports as 0 (/proc) are read to their end.
"$Z" prepare --text /proc/self/status --out "$d/proc" > "$d/proc.out" 2>&1 && grep -q "wrote" "$d/proc.out" \
  && echo "ok   prepare_proc_file" || { echo "FAIL prepare_proc_file"; cat "$d/proc.out"; fail=1; }

# Exceptions that are not zerone::Error (here std::bad_alloc: a 2 GiB text file to tokenize under a
# 1 GiB address-space limit) still end in one error line and exit 1, not "terminate called".
truncate -s 2G "$d/huge.txt"
error bad_alloc "out of memory" sh -c 'ulimit -v 1000000; exec "$0" "$@"' "$Z" prepare --text "$d/huge.txt" --out "$d/huge"

# Progress written to a file has no terminal control sequences, also under mpiexec (whose ranks get
# a pty for stdout even when mpiexec's output goes to a file).
"$Z" "${base[@]}" --steps 3 > "$d/plain.log" 2>&1
mpiexec --allow-run-as-root --oversubscribe -n 1 "$Z" "${base[@]}" --steps 3 > "$d/mpi.log" 2>&1
for f in plain mpi; do
  if grep -q $'\r\|\e\[K' "$d/$f.log"; then echo "FAIL log_$f: control sequences in a log file"; fail=1;
  elif ! grep -q "^step 3/3" "$d/$f.log"; then echo "FAIL log_$f: no step lines"; cat "$d/$f.log"; fail=1;
  else echo "ok   log_$f: plain log lines"; fi
done
# On a terminal the live status line is ended before an error, so the error starts a line.
cp "$d/c_train.bin" "$d/tty_train.bin"
script -qfec "$Z train --model $model --data $d/tty_train.bin --seq 16 --micro-batch 2 --threads 1 --steps 1000000" "$d/tty.log" \
  > /dev/null 2>&1 &
job=$!
for _ in $(seq 1 100); do grep -q "step" "$d/tty.log" 2>/dev/null && break; sleep 0.1; done
sleep 0.3; truncate -s 1100 "$d/tty_train.bin"; wait $job
if python3 - "$d/tty.log" <<'PY'
import sys
log = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
assert "\r\x1b[Kstep" in log, "no live status line"
i = log.index("zerone: error: ")
assert log[i - 1] == "\n", repr(log[i - 80:i + 20])
PY
then
  echo "ok   tty_error_on_own_line"
else
  echo "FAIL tty_error_on_own_line:"; tail -c 400 "$d/tty.log" | cat -A | tail -n 3; fail=1
fi

# Atomic writes: the temporary is fsync'd, renamed, then the directory is fsync'd (order matters).
if command -v strace >/dev/null; then
  strace -f -e trace=openat,fsync,rename -o "$d/trace" "$Z" "${base[@]}" --steps 1 --save "$d/s.bin" > /dev/null 2>&1
  python3 - "$d/trace" "$d" <<'PY' && echo "ok   atomic_write_fsyncs_directory" || { echo "FAIL atomic_write_fsyncs_directory"; fail=1; }
import re, sys
lines = open(sys.argv[1]).read().splitlines()
fds, events = {}, []
for l in lines:
    m = re.search(r'openat\(AT_FDCWD, "([^"]+)".* = (\d+)$', l)
    if m: fds[m.group(2)] = m.group(1)
    m = re.search(r'fsync\((\d+)\)\s+= 0', l)
    if m: events.append(("fsync", fds.get(m.group(1), "?")))
    m = re.search(r'rename\("([^"]+)", "([^"]+)"\)\s+= 0', l)
    if m: events.append(("rename", m.group(2)))
d = sys.argv[2]
want = [("rename", f"{d}/s.bin"), ("fsync", d)]
i = next(k for k, e in enumerate(events) if e == want[0])
assert events[i - 1][0] == "fsync" and events[i - 1][1].startswith(f"{d}/s.bin.tmp."), events
assert events[i + 1] == want[1], events
PY
else
  echo "FAIL atomic_write_fsyncs_directory: strace is missing (scripts/setup.sh installs it)"; fail=1
fi
exit $fail
