#!/usr/bin/env bash
# Run a command as on a slower machine of this kind: one of the two cores is kept busy by another process for
# the whole run, so that everything the command starts (vLLM, Ray, the tests) shares what is left.
#   scripts/slow-machine.sh .venv/bin/python -m pytest -q -m vllm
set -uo pipefail
if [ $# -eq 0 ]; then
  echo "usage: scripts/slow-machine.sh COMMAND [ARG...]" >&2
  exit 2
fi
python3 -c 'while True: pass' &
hog=$!
trap 'kill "$hog" 2>/dev/null' EXIT
"$@"
