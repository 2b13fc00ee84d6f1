#!/usr/bin/env bash
# Issue 23: `zerone report` through the real binary. Three short runs (two overlaid token runs with
# validation, one fp16 run with skipped steps) -> one self-contained HTML file whose SVG paths read
# back to the JSONL values (check_report.py); the same page in headless Chromium: no console
# message, the same paths in the live DOM, and the hover readout works; bad input: one
# "zerone: error:" line, exit 1, nothing written.
set -uo pipefail
Z="$1"
here="$(cd "$(dirname "$0")" && pwd)"
d=$(mktemp -d); trap 'rm -rf "$d"' EXIT
fail=0
tiny=(--model gpt2:layers=1,dim=32,heads=2,vocab=257,ctx=16 --seq 16 --micro-batch 4 --threads 1)
"$Z" train "${tiny[@]}" --steps 30 --val-every 5 --metrics "$d/base.jsonl" > "$d/base.out" 2>&1 || { echo "FAIL base run"; cat "$d/base.out"; exit 1; }
"$Z" train "${tiny[@]}" --steps 24 --val-every 6 --lr 0.003 --grad-accum 2 --metrics "$d/lr3e-3.jsonl" > /dev/null 2>&1 || { echo "FAIL second run"; exit 1; }
"$Z" train "${tiny[@]}" --steps 30 --precision fp16 --initial-scale-power 24 --hysteresis 1 --metrics "$d/fp16.jsonl" > /dev/null 2>&1 || { echo "FAIL fp16 run"; exit 1; }
grep -q '"skipped":true' "$d/fp16.jsonl" || { echo "FAIL the fp16 run skipped no step (the loss-scale check needs some)"; fail=1; }

# The metrics fields of issue 23, on every line; the run's settings on the first.
python3 - "$d/base.jsonl" <<'PY' || fail=1
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
ok = True
for i, l in enumerate(lines):
    for k in ("timestamp", "elapsed_s", "tokens", "tflop_per_s", "mfu"):
        if k not in l: print(f"FAIL line {i+1} lacks {k}"); ok = False
    if l["tokens"] != (i + 1) * 4 * 16: print(f"FAIL line {i+1}: tokens {l['tokens']}, expected {(i+1)*64}"); ok = False
if any(b["elapsed_s"] < a["elapsed_s"] or b["timestamp"] < a["timestamp"] for a, b in zip(lines, lines[1:])):
    print("FAIL elapsed_s/timestamp go backwards"); ok = False
run = lines[0].get("run", {})
for k in ("model", "parameters", "precision", "micro_batch", "host", "cpu", "peak_tflop_per_s", "peak_source", "flops_per_token"):
    if k not in run: print(f"FAIL the first line's run lacks {k}"); ok = False
if any("run" in l for l in lines[1:]): print("FAIL run on a later line"); ok = False
# MFU = TFLOP/s / peak; TFLOP/s = flops_per_token x tokens per step / step time.
for l in lines:
    want = run["flops_per_token"] * 64 / (l["ms"] / 1000) / 1e12
    if abs(l["tflop_per_s"] - want) > 1e-9 * max(1, want) or abs(l["mfu"] - want / run["peak_tflop_per_s"]) > 1e-9:
        print(f"FAIL step {l['step']}: tflop_per_s {l['tflop_per_s']} mfu {l['mfu']}, expected {want}"); ok = False; break
print("ok   metrics fields: timestamp, elapsed_s, tokens, tflop_per_s, mfu on every line; run on the first" if ok else "")
sys.exit(0 if ok else 1)
PY
# The summary names the time, the throughput and MFU, losses, memory beside the estimate and the outputs.
for want in "^summary: 30 steps in .* s of .* s .*tokens/s on average, .* TFLOP/s \(MFU .*% of .* TFLOP/s, measured" \
            "^  loss: final training .*, best validation .* \(step 30\)" "^  time of steps 2..30: compute .*%, communication \(exposed\) .*%, optimizer .*%, transfers \(exposed\) .*%, I/O .*, other .*%" \
            "^  peak memory, device: .* \(zerone estimate .*\): param" "^  wrote: metrics '.*base.jsonl' \(30 lines\)"; do
  grep -Eq -- "$want" "$d/base.out" || { echo "FAIL the summary lacks /$want/"; fail=1; }
done
[ "$(tail -n 1 "$d/base.out" | cut -c1-10)" = "final loss" ] || { echo "FAIL the last line is not 'final loss'"; fail=1; }
grep -q "^zerone: building gpt2:layers=1" "$d/base.out" || { echo "FAIL no 'building' line before the model is built"; fail=1; }

"$Z" report "$d/base.jsonl" "$d/lr3e-3.jsonl" "$d/fp16.jsonl" -o "$d/r.html" > "$d/report.out" 2>&1 || { echo "FAIL report exited $?"; cat "$d/report.out"; exit 1; }
grep -q "wrote '$d/r.html' (3 runs)" "$d/report.out" || { echo "FAIL report output: $(cat "$d/report.out")"; fail=1; }
python3 "$here/check_report.py" "$d/r.html" "$d/base.jsonl" "$d/lr3e-3.jsonl" "$d/fp16.jsonl" || fail=1
for want in "gpt2:layers=1,dim=32" "micro-batch 4 x seq 16 x accum 2 x world 1" "steps 1..30, training" "MFU" "best validation"; do
  grep -q -- "$want" "$d/r.html" || { echo "FAIL the report's header lacks '$want'"; fail=1; }
done
ls -a "$d" | grep -q '\.tmp' && { echo "FAIL a temporary was left: $(ls -a "$d")"; fail=1; }

# In a real browser: headless Chromium loads the page with no console message at all (errors and
# uncaught exceptions are console messages), the live DOM holds the same paths, and a mousemove
# over the loss chart fills its readout with each run's value.
chrome=$(command -v chromium || command -v chromium-browser || true)
if [ -z "$chrome" ]; then
  echo "FAIL chromium is not installed (scripts/setup.sh installs the Debian package)"; fail=1
else
  { sed 's|</body></html>||' "$d/r.html"
    cat <<'JS'
<script>
var svg = document.getElementById('loss-step'), box = svg.getBoundingClientRect();
svg.dispatchEvent(new MouseEvent('mousemove', {clientX: box.left + box.width * 0.5, clientY: box.top + 50}));
document.body.setAttribute('data-readout', svg.querySelector('text.readout').textContent);
</script></body></html>
JS
  } > "$d/browser.html"
  HOME="$d" timeout 120 "$chrome" --headless --no-sandbox --disable-gpu --no-first-run --user-data-dir="$d/chrome" \
    --enable-logging=stderr --v=0 --virtual-time-budget=3000 --dump-dom "file://$d/browser.html" > "$d/dom.html" 2> "$d/chrome.err"
  rc=$?
  if [ $rc -ne 0 ] || [ ! -s "$d/dom.html" ]; then
    echo "FAIL chromium exited $rc"; tail -n 5 "$d/chrome.err"; fail=1
  elif grep -q "CONSOLE" "$d/chrome.err"; then
    echo "FAIL console messages in chromium:"; grep "CONSOLE" "$d/chrome.err" | head -5; fail=1
  else
    readout=$(grep -o 'data-readout="[^"]*"' "$d/dom.html")
    if echo "$readout" | grep -q "base loss [0-9]" && echo "$readout" | grep -q "lr3e-3 loss [0-9]"; then
      echo "ok   chromium: no console message; hover readout: $readout"
    else
      echo "FAIL hover readout: '$readout'"; fail=1
    fi
    python3 "$here/check_report.py" "$d/dom.html" "$d/base.jsonl" "$d/lr3e-3.jsonl" "$d/fp16.jsonl" | sed 's/^ok  /ok   (live DOM)/' || fail=1
  fi
fi

# Bad input: one error line naming what is wrong, exit 1, the existing report untouched.
cp "$d/r.html" "$d/keep.html"
bad() {  # name regex args...
  local name="$1" regex="$2"; shift 2
  "$Z" report "$@" > "$d/$name.out" 2> "$d/$name.err"; local rc=$?
  if [ $rc -ne 1 ] || [ "$(wc -l < "$d/$name.err")" -ne 1 ] || ! grep -qE -- "^zerone: error: .*$regex" "$d/$name.err"; then
    echo "FAIL $name: exit $rc, stderr: $(cat "$d/$name.err")"; fail=1
  else echo "ok   $name: $(cat "$d/$name.err")"; fi
}
printf '{"step":1,"loss":2.0}\nnot json\n' > "$d/garbage.jsonl"
printf '{"step":1,"lr":2.0}\n' > "$d/noloss.jsonl"
: > "$d/empty.jsonl"
bad no_input "RUN.jsonl is required" -o "$d/x.html"
bad no_output "--output is required" "$d/base.jsonl"
bad missing_input "cannot open metrics file '$d/nope.jsonl': No such file" "$d/nope.jsonl" -o "$d/x.html"
bad garbage "'$d/garbage.jsonl' line 2 is not JSON" "$d/garbage.jsonl" -o "$d/keep.html"
bad not_metrics "'$d/noloss.jsonl' line 1 is not a metrics line" "$d/noloss.jsonl" -o "$d/x.html"
bad empty "'$d/empty.jsonl' holds no steps" "$d/empty.jsonl" -o "$d/x.html"
bad output_dir_missing "-o.*$d/no/such/dir" "$d/base.jsonl" -o "$d/no/such/dir/r.html"
bad output_is_dir "-o.*$d" "$d/base.jsonl" -o "$d"
bad output_is_input "-o '$d/base.jsonl' is the metrics file" "$d/base.jsonl" -o "$d/base.jsonl"
bad input_is_dir "metrics file '$d' is a directory" "$d" -o "$d/x.html"
cmp -s "$d/r.html" "$d/keep.html" || { echo "FAIL a failed report changed the existing file"; fail=1; }
[ -e "$d/x.html" ] && { echo "FAIL a failed report wrote x.html"; fail=1; }
ls -a "$d" | grep -q '\.tmp' && { echo "FAIL a temporary was left: $(ls -a "$d")"; fail=1; }

# A run still being written (its last line without a newline) is reported without that line.
head -c -20 "$d/base.jsonl" > "$d/live.jsonl"
if "$Z" report "$d/live.jsonl" -o "$d/live.html" > /dev/null 2>&1 && grep -q "last line is incomplete" "$d/live.html"; then
  echo "ok   live run: the incomplete last line is left out and noted"
else echo "FAIL live run"; fail=1; fi
exit $fail
