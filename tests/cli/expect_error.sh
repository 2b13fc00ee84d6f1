#!/usr/bin/env bash
# expect_error.sh REGEX CMD...: CMD must exit with status 1 (README: every bad input), not crash,
# and print REGEX (grep -E) on stderr after the "zerone: error:" prefix.
regex="$1"; shift
err=$(mktemp); trap 'rm -f "$err"' EXIT
"$@" >/dev/null 2>"$err" </dev/null
rc=$?
if [ $rc -eq 0 ]; then echo "FAIL: '$*' exited 0"; cat "$err"; exit 1; fi
if [ $rc -ge 128 ]; then echo "FAIL: '$*' crashed (exit $rc)"; cat "$err"; exit 1; fi
if [ $rc -ne 1 ]; then echo "FAIL: '$*' exited $rc, expected 1"; cat "$err"; exit 1; fi
if ! grep -qE -- "^zerone: error( \(rank [0-9]+ of [0-9]+\))?: .*$regex" "$err"; then echo "FAIL: stderr of '$*' lacks /$regex/:"; cat "$err"; exit 1; fi
echo "ok: exit $rc: $(head -c 300 "$err")"
