"""scripts/: the set-up that scripts/test.sh and scripts/demo.sh run on a fresh machine.

A fresh Debian machine may still run its image's own apt at boot: apt-get then failed at once
with ``E: Could not get lock /var/lib/dpkg/lock-frontend`` (exit 100) and took the suite with it.
Every apt-get call goes through ``apt_get`` (scripts/apt.sh), which waits for the lock and says
what it waits for. Here with the real apt-get, pointed at a temporary dpkg state and lists
directory whose locks a real process holds (fcntl, as apt and dpkg take them)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"

#: Holds an fcntl lock on argv[1] for argv[2] seconds; prints its pid once it holds it.
_HOLD = """
import fcntl, os, sys, time
handle = open(sys.argv[1], "a+")
fcntl.lockf(handle, fcntl.LOCK_EX)
print(os.getpid(), flush=True)
time.sleep(float(sys.argv[2]))
"""


def test_every_apt_get_call_in_scripts_waits_for_the_lock() -> None:
    """No script calls apt-get itself: only ``apt_get`` (scripts/apt.sh), which passes
    ``-o DPkg::Lock::Timeout`` and waits for the locks apt-get does not wait for."""
    offenders = []
    for script in sorted(SCRIPTS.glob("*.sh")):
        for number, line in enumerate(script.read_text().splitlines(), 1):
            code = re.sub(r'"[^"]*"', '""', line.split("#", 1)[0])  # messages mention apt-get
            calls = re.findall(r"(?<![\w-])apt-get(?![\w-])", code)
            allowed = code.count("command -v apt-get") + (
                code.count("apt-get -o DPkg::Lock::Timeout") if script.name == "apt.sh" else 0
            )
            if len(calls) > allowed:
                offenders.append(f"{script.name}:{number}: {line.strip()}")
    assert offenders == []
    setup = (SCRIPTS / "setup.sh").read_text()
    assert "source scripts/apt.sh" in setup and "apt_get install" in setup


def _apt_env(tmp_path: Path) -> tuple[dict[str, str], list[str], Path, Path]:
    """A private apt state (dpkg status, lists, no sources) and the locks apt_get watches there."""
    dpkg = tmp_path / "dpkg"
    lists = tmp_path / "lists"
    parts = tmp_path / "sources.list.d"
    for folder in (dpkg, lists / "partial", parts):
        folder.mkdir(parents=True)
    status = dpkg / "status"
    status.write_text("")
    (tmp_path / "sources.list").write_text("")
    options = [
        f"-o=Dir::State::status={status}",
        f"-o=Dir::State::Lists={lists}",
        f"-o=Dir::Etc::sourcelist={tmp_path / 'sources.list'}",
        f"-o=Dir::Etc::sourceparts={parts}",
        f"-o=Dir::Cache={tmp_path / 'cache'}",
    ]
    env = {
        **os.environ,
        "TRACEGUARD_APT_LOCKS": f"{dpkg / 'lock-frontend'} {lists / 'lock'}",
        "TRACEGUARD_APT_POLL_S": "0.2",
    }
    return env, options, dpkg / "lock-frontend", lists / "lock"


def _run_apt_get(env: dict[str, str], args: list[str]) -> subprocess.CompletedProcess[str]:
    quoted = " ".join(f"'{a}'" for a in args)
    return subprocess.run(
        ["bash", "-c", f"set -euo pipefail; source {SCRIPTS / 'apt.sh'}; apt_get {quoted}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def apt_get_available() -> None:
    if shutil.which("apt-get") is None:
        pytest.skip("apt-get is not on this machine (scripts/setup.sh installs with it on Debian only)")
    if os.geteuid() != 0:
        pytest.skip("apt-get takes its locks as root (scripts/setup.sh runs apt only as root)")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("command", "lock"),
    [(["check"], "lock-frontend"), (["update", "-qq"], "lock")],
    ids=["dpkg-frontend-lock", "lists-lock-update"],
)
def test_apt_get_waits_for_a_held_lock_and_says_what_it_waits_for(
    command: list[str], lock: str, tmp_path: Path, apt_get_available: None
) -> None:
    """Another process holds the lock for 2 s: plain apt-get fails at once with exit 100 (the
    issue); apt_get waits, names the lock and its holder, and then succeeds. `update` is the case
    apt-get's own DPkg::Lock::Timeout does not cover."""
    env, options, frontend, lists_lock = _apt_env(tmp_path)
    held = frontend if lock == "lock-frontend" else lists_lock
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(held), "2"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        pid = int(holder.stdout.readline())
        plain = subprocess.run(["apt-get", *options, *command], capture_output=True, text=True, timeout=30)
        assert plain.returncode == 100 and "Could not get lock" in plain.stderr  # what the issue saw
        began = time.monotonic()
        result = _run_apt_get(env, [*options, *command])
        waited = time.monotonic() - began
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 0, result.stderr
    assert waited >= 1.0
    assert f"waiting for {held}, held by process {pid} (python" in result.stderr
    assert result.stderr.count("waiting for") == 1  # said once, not every poll


@pytest.mark.slow
def test_apt_get_gives_up_after_the_timeout_with_the_reason(tmp_path: Path, apt_get_available: None) -> None:
    env, options, frontend, _ = _apt_env(tmp_path)
    env["TRACEGUARD_APT_LOCK_TIMEOUT"] = "1"
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(frontend), "10"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        holder.stdout.readline()
        result = _run_apt_get(env, [*options, "check"])
    finally:
        holder.kill()
        holder.wait()
    assert result.returncode == 100
    assert f"gave up after 1s waiting for {frontend}" in result.stderr


@pytest.mark.slow
def test_apt_get_passes_a_free_lock_straight_through(tmp_path: Path, apt_get_available: None) -> None:
    env, options, _, _ = _apt_env(tmp_path)
    result = _run_apt_get(env, [*options, "check"])
    assert result.returncode == 0, result.stderr
    assert "waiting" not in result.stderr
