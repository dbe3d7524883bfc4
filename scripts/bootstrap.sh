#!/usr/bin/env bash
# Creates .venv at the repository root if it is missing and installs finetwin into it (with the test
# extras when asked). Idempotent: a second run only checks that the install is current.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
want_test=${1:-}
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
current() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ]; }
stamp=.venv/.finetwin-installed${want_test:+-test}
# The install with test extras holds the plain one: `scripts/up` after `scripts/test` installs nothing.
if ! current "$stamp" && { [ -n "$want_test" ] || ! current .venv/.finetwin-installed-test; }; then
  if [ -n "$want_test" ]; then
    .venv/bin/pip install -q -e ".[test]"
  else
    .venv/bin/pip install -q -e .
  fi
  touch "$stamp"
fi
