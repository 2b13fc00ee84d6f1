#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: CMD must exit non-zero without crashing (exit < 128, no signal)
# and print REGEX (grep -E) on stderr.
regex="$1"; shift
err=$(mktemp); trap 'rm -f "$err"' EXIT
"$@" >/dev/null 2>"$err" </dev/null
rc=$?
if [ $rc -eq 0 ]; then echo "FAIL: '$*' exited 0"; cat "$err"; exit 1; fi
if [ $rc -ge 128 ]; then echo "FAIL: '$*' crashed (exit $rc)"; cat "$err"; exit 1; fi
if ! grep -qE -- "$regex" "$err"; then echo "FAIL: stderr of '$*' lacks /$regex/:"; cat "$err"; exit 1; fi
echo "ok: exit $rc: $(head -c 300 "$err")"
