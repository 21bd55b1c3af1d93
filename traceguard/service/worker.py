"""Workers: threads that claim queued jobs from the store and execute them.

A :class:`WorkerPool` runs inside ``traceguard serve`` (the default, and the only choice for the
embedded SQLite store of one machine) or as its own process, ``traceguard worker`` (:func:`main`),
any number of them on any number of machines sharing one PostgreSQL database and one blob
directory with ``traceguard serve --no-workers``. Each thread only waits on a child process (the
analysis itself runs in one), so the server's event loop is never blocked. Jobs left running by a
crashed or killed process are found by their expired lease and queued again by whichever worker
sweeps next; on a clean stop, running jobs go straight back to the queue.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

from traceguard.service.analysis import execute, sweep_scratch
from traceguard.service.context import Context
from traceguard.store import jobs
from traceguard.store.tables import Job

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
        self.completed = {"succeeded": 0, "failed": 0, "queued": 0, "lost": 0, "missing": 0}
        self._lock = threading.Lock()

    def start(self) -> None:
        with self.ctx.factory() as session:
            requeued, abandoned = jobs.requeue_expired(session, self.ctx.settings.job_max_attempts)
        if requeued or abandoned:
            log.warning("picked up %d interrupted job(s); %d abandoned after too many attempts", requeued, abandoned)
        self._sweep()
        for index in range(self.size):
            thread = threading.Thread(target=self._loop, name=f"traceguard-worker-{index}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def wake(self) -> None:
        """A job was queued: look now rather than at the next poll."""
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming; running analyses are ended and their jobs handed back to the queue."""
        self._stop.set()
        self._wake.set()
        for thread in self._threads:
            thread.join(timeout)

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

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
                        requeued, abandoned = jobs.requeue_expired(session, self.ctx.settings.job_max_attempts)
                    if requeued or abandoned:
                        log.warning("%d job(s) with an expired lease requeued, %d abandoned", requeued, abandoned)
                        self._sweep()
                with self.ctx.factory() as session:
                    job = jobs.claim(session, worker, self.ctx.settings.job_lease_s)
                if job is None:
                    self._wake.wait(self.ctx.settings.poll_interval_s)
                    self._wake.clear()
                    continue
                self._run(job, worker)
            except Exception:  # a store hiccup must not kill the worker; it retries
                log.exception("worker loop error; retrying")
                self._stop.wait(1.0)

    def _sweep(self) -> None:
        """Scratch folders left by killed workers go (they hold links and a partial result)."""
        removed = sweep_scratch(self.ctx)
        if removed:
            log.info("removed %d scratch folder(s) of interrupted attempts", removed)

    def _run(self, job: Job, worker: str) -> None:
        log.info("job %d: claimed by %s (run %d, attempt %d)", job.id, worker, job.run_id, job.attempts)
        started = time.monotonic()
        with self._lock:
            self.busy += 1
        try:
            status = execute(self.ctx, job.id, worker, stop=self._stop.is_set)
        finally:
            with self._lock:
                self.busy -= 1
        with self._lock:
            self.completed[status] = self.completed.get(status, 0) + 1
        log.info("job %d: %s by %s in %.1f s", job.id, status, worker, time.monotonic() - started)


def main(ctx: Context, concurrency: int) -> int:
    """``traceguard worker``: run a pool of ``concurrency`` threads until SIGTERM or SIGINT, then
    hand running jobs back to the queue and return 0; 1 when a worker thread died."""
    pool = WorkerPool(ctx, concurrency)
    stopped = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("%s: stopping; running jobs go back to the queue", signal.Signals(signum).name)
        stopped.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        pool.start()
        log.info(
            "worker %s:%d: %d thread(s), lease %.0f s, store %s",
            socket.gethostname(),
            os.getpid(),
            pool.size,
            ctx.settings.job_lease_s,
            ctx.engine.url.render_as_string(hide_password=True),
        )
        while not stopped.wait(1.0):
            if not pool.alive:  # never expected (the loop catches everything); let the supervisor restart us
                log.error("a worker thread died; exiting")
                pool.stop()
                return 1
        pool.stop()
        log.info("stopped: %s", ", ".join(f"{n} {k}" for k, n in pool.completed.items() if n))
        return 0
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
