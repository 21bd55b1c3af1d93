"""Real ``traceguard serve --no-workers`` and ``traceguard worker`` processes on loopback, for the
worker tests and the worker benchmark (bench/service_workers.py)."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.service.live import REPO, LiveServer, store_env


def _processes() -> list[tuple[int, int, int]]:
    """(pid, parent pid, process group) of every process, from ``/proc/PID/stat``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found.append((int(stat.parent.name), int(fields[1]), int(fields[2])))
    return found


def running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped by its new parent)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@dataclass
class ApiOnly(LiveServer):
    """``traceguard serve --no-workers``: uploads queue jobs, nothing in this process runs them."""

    args: list[str] = field(default_factory=lambda: ["--no-workers"])


@dataclass
class LiveWorker:
    """A ``traceguard worker`` process; its log says what it claimed and finished."""

    data_dir: Path
    database_url: str | None = None
    concurrency: int = 1
    env: dict[str, str] = field(default_factory=dict)
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self, timeout: float = 60) -> LiveWorker:
        return self.launch().ready(timeout)

    @staticmethod
    def start_all(workers: list[LiveWorker], timeout: float = 60) -> list[LiveWorker]:
        """Launch every worker, then wait for each: their start-ups overlap."""
        for worker in workers:
            worker.launch()
        return [worker.ready(timeout) for worker in workers]

    def launch(self) -> LiveWorker:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = self.data_dir.parent / f"worker-{time.monotonic_ns()}.log"
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "traceguard.cli", "worker", "--concurrency", str(self.concurrency)],
                cwd=REPO,
                env=store_env(self.data_dir, self.database_url, self.env),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return self

    def ready(self, timeout: float = 60) -> LiveWorker:
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while "thread(s), lease" not in self.output():  # started: store opened, threads claiming
            if self.process.poll() is not None:
                raise RuntimeError(f"traceguard worker exited: {self.output()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"traceguard worker did not start: {self.output()[-3000:]}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log and self.log.exists() else ""

    def claimed(self) -> list[tuple[int, int]]:
        """(job id, attempt) of every claim in the log."""
        return [
            (int(j), int(a))
            for j, a in re.findall(r"job (\d+): claimed by \S+ \(run \d+, attempt (\d+)\)", self.output())
        ]

    def finished(self) -> dict[int, str]:
        """Job id → how its execution here ended (succeeded, failed, queued, lost)."""
        return {int(j): s for j, s in re.findall(r"job (\d+): (\w+) by \S+ in ", self.output())}

    def children(self) -> list[int]:
        """Pids of the analysis processes this worker started and that still run."""
        return [pid for pid, parent, _ in _processes() if parent == self.pid]

    def analysis_tree(self) -> list[int]:
        """Pids of the analysis processes this worker started and of everything they started (each
        analysis leads its own process group: its map's pool processes are in it)."""
        leaders = set(self.children())
        return [pid for pid, _, group in _processes() if group in leaders]

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self, timeout: float = 30) -> int | None:
        """SIGTERM, as a deploy or ``docker stop`` sends it; the exit status."""
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        return self.process.returncode if self.process else None
