"""The in-process worker pool: threads that claim queued jobs from the store and execute them.

Each thread only waits on a child process (the analysis itself runs in one), so the server's
event loop is never blocked. Jobs left running by a crashed or killed server are found by their
expired lease and queued again; on a clean stop, running jobs go straight back to the queue.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time

from traceguard.service.analysis import execute
from traceguard.service.context import Context
from traceguard.store import jobs

log = logging.getLogger("traceguard.worker")


class WorkerPool:
    def __init__(self, ctx: Context, size: int | None = None) -> None:
        self.ctx = ctx
        self.size = size or ctx.settings.workers
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._threads: list[threading.Thread] = []
        self._name = f"{socket.gethostname()}:{os.getpid()}"
        self.busy = 0
        self.completed = {"succeeded": 0, "failed": 0, "queued": 0, "missing": 0}
        self._lock = threading.Lock()

    def start(self) -> None:
        with self.ctx.factory() as session:
            requeued, abandoned = jobs.requeue_expired(session, self.ctx.settings.job_max_attempts)
        if requeued or abandoned:
            log.warning("picked up %d interrupted job(s); %d abandoned after too many attempts", requeued, abandoned)
        for index in range(self.size):
            thread = threading.Thread(target=self._loop, name=f"traceguard-worker-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout)

    @property
    def alive(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)

    def _loop(self) -> None:
        worker = f"{self._name}:{threading.current_thread().name}"
        next_sweep = 0.0
        while not self._stop.is_set():
            try:
                now = time.monotonic()
                if now >= next_sweep:
                    next_sweep = now + max(1.0, self.ctx.settings.job_lease_s / 2)
                    with self.ctx.factory() as session:
                        jobs.requeue_expired(session, self.ctx.settings.job_max_attempts)
                with self.ctx.factory() as session:
                    job = jobs.claim(session, worker, self.ctx.settings.job_lease_s)
                if job is None:
                    self._wake.wait(self.ctx.settings.poll_interval_s)
                    self._wake.clear()
                    continue
                with self._lock:
                    self.busy += 1
                try:
                    status = execute(self.ctx, job.id, worker, stop=self._stop.is_set)
                finally:
                    with self._lock:
                        self.busy -= 1
                with self._lock:
                    self.completed[status] = self.completed.get(status, 0) + 1
                log.info("job %d: %s", job.id, status)
            except Exception:  # a store hiccup must not kill the worker; it retries
                log.exception("worker loop error; retrying")
                self._stop.wait(1.0)
