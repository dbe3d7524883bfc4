#!/usr/bin/env bash
# Creates .venv at the repository root if it is missing and installs finetwin into it (with the test
# extras when asked). Idempotent: a second run only checks that the install is current.
#
# The install takes the versions in constraints.txt (`scripts/lock` writes it): a fresh clone installs what
# the suite last passed with, not whatever was released since. FINETWIN_UNLOCKED=1 installs without it, to
# try newer releases before locking them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
want_test=${1:-}
python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$python" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
fi
lock=()
if [ -f constraints.txt ] && [ -z "${FINETWIN_UNLOCKED:-}" ]; then
  lock=(-c constraints.txt)
fi
# An install is current when it is newer than what it was made from: pyproject.toml and the lock.
current() { [ -f "$1" ] && [ ! pyproject.toml -nt "$1" ] && { [ ! -f constraints.txt ] || [ ! constraints.txt -nt "$1" ]; }; }
stamp=.venv/.finetwin-installed${want_test:+-test}
# The install with test extras holds the plain one: `scripts/up` after `scripts/test` installs nothing.
if ! current "$stamp" && { [ -n "$want_test" ] || ! current .venv/.finetwin-installed-test; }; then
  # ${lock[@]+...}: an empty array under `set -u` is an error in bash before 4.4 (macOS's bash 3.2).
  if [ -n "$want_test" ]; then
    .venv/bin/pip install -q ${lock[@]+"${lock[@]}"} -e ".[test]"
  else
    .venv/bin/pip install -q ${lock[@]+"${lock[@]}"} -e .
  fi
  touch "$stamp"
fi
