"""A real ``traceguard serve`` process on loopback, for tests and the service benchmark."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def store_env(data_dir: Path, database_url: str | None, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that points a traceguard process at one store (as compose does)."""
    env = {**os.environ, **(extra or {}), "TRACEGUARD_DATA_DIR": str(data_dir)}
    env.pop("TRACEGUARD_DATABASE_URL", None)
    if database_url:
        env["TRACEGUARD_DATABASE_URL"] = database_url
    return env


@dataclass
class LiveServer:
    data_dir: Path
    database_url: str | None = None
    port: int = field(default_factory=free_port)
    env: dict[str, str] = field(default_factory=dict)
    #: More ``serve`` options (e.g. ``--no-workers``).
    args: list[str] = field(default_factory=list)
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    admin_token: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60) -> LiveServer:
        env = store_env(self.data_dir, self.database_url, self.env)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir.parent / f"serve-{self.port}-{time.monotonic_ns()}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "traceguard.cli", "serve", "--port", str(self.port), *self.args],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"traceguard serve exited: {self.output()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        else:
            raise RuntimeError(f"traceguard serve did not become ready: {self.output()[-3000:]}")
        found = re.search(r"\b(tg_[A-Za-z0-9_-]{40,})\b", self.output())
        if found:
            self.admin_token = found.group(1)
        return self

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs (a crash, an OOM kill, a node reboot)."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()
