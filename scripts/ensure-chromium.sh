#!/usr/bin/env bash
# Debian's Chromium for the browser tests (Playwright drives /usr/bin/chromium; it never downloads one).
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
command -v apt-get >/dev/null || { echo "no apt-get: install Chromium at /usr/bin/chromium" >&2; exit 1; }
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 \
  || { $sudo apt-get update -q >/dev/null && $sudo apt-get install -y -q chromium chromium-driver >/dev/null; }
