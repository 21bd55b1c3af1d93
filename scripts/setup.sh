#!/usr/bin/env bash
# Set up everything traceguard needs on a fresh Debian machine: a virtual environment with the
# package and its test tools, and (for the real-capture tests) Nsight Systems from Debian non-free.
# Idempotent: a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${VENV:-.venv}
# apt_get: waits while another package manager run holds the dpkg/apt locks, and says so.
source scripts/apt.sh

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install -q --upgrade pip
# The harness and bench-collectives tests run real torch.distributed (gloo) jobs on the CPU.
# torch==2.13.0 is the CPU build this machine kind keeps on disk; the analyzer itself needs no torch.
if [ "${TRACEGUARD_SKIP_TORCH:-0}" != 1 ] && ! "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  "$VENV/bin/python" -m pip install -q "torch==${TRACEGUARD_TORCH_VERSION:-2.13.0}"
fi
# The nsys reader's C loop (traceguard/ingest/_int_scan.c) builds against SQLite's header; without
# it the package still installs and reads through ADBC, only slower.
if [ ! -f /usr/include/sqlite3.h ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  apt_get update -qq && apt_get install -y -qq gcc libsqlite3-dev >/dev/null
fi
"$VENV/bin/python" -m pip install -q -e ".[dev]"
if "$VENV/bin/python" -c "import torch" 2>/dev/null; then
  # nvtx 0.2.11: the last Python nvtx whose ranges nsys 2022.4 (Debian's) can read (NSYS.md).
  "$VENV/bin/python" -m pip install -q -e ".[harness]"
fi

# Chromium for the browser tests of the HTML report (Playwright drives the system browser).
if [ "${TRACEGUARD_SKIP_BROWSER:-0}" != 1 ] && [ ! -x /usr/bin/chromium ] && [ "$(id -u)" = 0 ] \
   && command -v apt-get >/dev/null 2>&1; then
  apt_get update -qq && apt_get install -y -qq chromium >/dev/null
fi

# Nsight Systems (NSYS.md): Debian ships 2022.4 in non-free; the real-capture tests run it.
if [ "${TRACEGUARD_SKIP_NSYS:-0}" != 1 ] && ! command -v nsys >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    src=/etc/apt/sources.list.d/debian.sources
    if [ -f "$src" ]; then
      sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' "$src"
    fi
    apt_get update -qq
    apt_get install -y -qq nsight-systems >/dev/null
  else
    echo "note: nsys is not installed and this user cannot apt-get it; the real-capture tests need it" >&2
  fi
fi
