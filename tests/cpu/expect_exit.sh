#!/bin/sh
# expect_exit.sh CODE REGEX COMMAND [ARGS...]
# Runs COMMAND; passes when it exits with CODE and its output (stdout and stderr) matches REGEX
# (grep -E). CTest alone can check either the exit code or the output, not both.
code="$1"
pattern="$2"
shift 2
out=$("$@" 2>&1)
rc=$?
if [ "$rc" -ne "$code" ]; then
  printf '%s\n' "$out"
  echo "expect_exit: exit code $rc, expected $code"
  exit 1
fi
if ! printf '%s\n' "$out" | grep -Eq -- "$pattern"; then
  printf '%s\n' "$out"
  echo "expect_exit: output does not match '$pattern'"
  exit 1
fi
exit 0
