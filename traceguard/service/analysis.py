"""Analysis jobs: the run's stored files → :func:`traceguard.pipeline.analyze` in a child process
→ the report and its rows in the store.

The analysis runs in a separate process (``python -m traceguard.service.child``) so that it
never blocks the server, can be stopped at the time limit, and cannot take the server down. Its inputs are laid out as
``jobs/<job>/<file id>/<original name>`` links to the blobs, so reports name the files as they
were uploaded and rank inference by file name works as on the command line. Ranks given at
upload (or by a bundle's manifest) are passed as ``FILE:RANK`` arguments would be.

Progress: the child appends ``DONE TOTAL`` lines to ``<work dir>/progress`` as each capture's
per-rank map finishes (``analyze(on_ranks=...)``); the parent reads them while it waits and
stores the latest on the job (``ranks_done`` / ``ranks_total``), so the API shows how far a long
analysis has come.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from traceguard.errors import TraceguardError
from traceguard.ingest.uploads import CAPTURE_KINDS
from traceguard.service.context import Context
from traceguard.store import jobs, results
from traceguard.store.db import transaction
from traceguard.store.runs import input_key, run_files
from traceguard.store.tables import File, Job, Run

log = logging.getLogger("traceguard.analysis")


class AnalysisFailed(TraceguardError):
    """The analysis ended without a report; ``code`` says why (the child's own error code,
    ``analysis_timeout``, or ``analysis_crashed``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Spec:
    inputs: list[tuple[str, int | None]]
    side: dict[str, list[str]]
    profile: str
    cache_dir: str
    max_rows: int
    step_patterns: list[str]
    scheduler: str | None
    jobs: int | None
    progress: str
    #: Where a report by summary writes its side output (traceguard.report.detail), read back into
    #: the store's tables before the job's folder is removed.
    detail_dir: str


def _layout(
    job_dir: Path, ctx: Context, files: list[File], profile: str, step_patterns: list[str], progress: Path
) -> _Spec:
    """Link each blob as ``<job_dir>/<file id>/<name>``; the spec of what to analyse."""
    inputs: list[tuple[str, int | None]] = []
    side: dict[str, list[str]] = {}
    for f in files:
        folder = job_dir / str(f.id)
        folder.mkdir(parents=True, exist_ok=True)
        link = folder / f.name
        if not link.exists():
            os.symlink(ctx.blobs.path(f.sha256), link)
        if f.kind in CAPTURE_KINDS:
            inputs.append((str(link), f.rank))
        else:
            side.setdefault(f.kind, []).append(str(link))
    settings = ctx.settings
    return _Spec(
        inputs,
        side,
        profile,
        str(ctx.cache_dir),
        settings.max_rows,
        step_patterns,
        settings.dask_scheduler,
        settings.analysis_jobs,
        str(progress),
        str(job_dir.parent / "detail"),
    )


def captures(files: list[File]) -> int:
    """How many of the files are captures: the inputs whose per-rank map the progress counts."""
    return sum(f.kind in CAPTURE_KINDS for f in files)


class _ProgressReader:
    """Reads the ``DONE TOTAL`` lines the child appends, from where it left off; only whole lines
    count (the child may be mid-write)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.latest: tuple[int, int] | None = None

    def poll(self) -> tuple[int, int] | None:
        """The newest progress, when it changed since the last poll; else None."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self.offset)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        complete = chunk[: chunk.rfind(b"\n") + 1]
        self.offset += len(complete)
        newest = None
        for line in complete.splitlines():
            done, _, total = line.decode(errors="replace").partition(" ")
            if done.isdigit() and total.isdigit():
                newest = (int(done), int(total))
        if newest is None or newest == self.latest:
            return None
        self.latest = newest
        return newest


def _resolved_ranks(doc: dict[str, Any], inputs_dir: Path) -> dict[int, int | None]:
    """File id → the rank the analysis resolved (None: several ranks in one file)."""
    resolved: dict[int, int | None] = {}
    for record in doc.get("inputs", []):
        path = Path(record["path"])
        if path.parent.parent == inputs_dir and path.parent.name.isdigit() and record.get("ranks"):
            resolved[int(path.parent.name)] = record["ranks"][0] if len(record["ranks"]) == 1 else None
    return resolved


def _public_names(doc: dict[str, Any], inputs_dir: Path, files: list[File]) -> dict[str, Any]:
    """The report with the job's scratch paths replaced by the names files were uploaded under
    (``<id>/<name>`` where two files of the run share a name): no server paths leak."""
    counts: dict[str, int] = {}
    for f in files:
        counts[f.name] = counts.get(f.name, 0) + 1
    text = orjson.dumps(doc).decode()
    for f in files:
        shown = f.name if counts[f.name] == 1 else f"{f.id}/{f.name}"
        text = text.replace(
            orjson.dumps(str(inputs_dir / str(f.id) / f.name)).decode()[1:-1], orjson.dumps(shown).decode()[1:-1]
        )
    return orjson.loads(text)


def _last_line(text: str) -> str:
    """The last line of a child's stderr (the exception of a traceback), at most 300 characters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def _log_stderr(work_dir: Path, what: str, text: str) -> None:
    """The analysis process's stderr (a traceback) in the server's log: the job's error holds one
    line for the run's owner, the log the rest for the operator."""
    log.error("analysis %s %s%s", work_dir.name, what, f"; its stderr:\n{text}" if text else " (no stderr)")


def run_analysis(
    ctx: Context,
    files: list[File],
    profile: str,
    work_dir: Path,
    *,
    step_patterns: list[str] | None = None,
    heartbeat: Callable[[], bool] | None = None,
    stop: Callable[[], bool] | None = None,
    on_progress: Callable[[int, int], bool] | None = None,
) -> tuple[dict[str, Any], dict[int, int | None]]:
    """Analyse ``files`` under ``profile`` (and the run's ``step_patterns``) in a child process;
    the report document (inputs named as uploaded) and the rank resolved for each file id.

    ``heartbeat`` is called every few seconds while it runs (False: give up, the job is no longer
    ours); ``stop`` says the server is shutting down; ``on_progress(done, total)`` is called when
    the child reports more captures analysed (False, like heartbeat: give up). Raises
    AnalysisFailed."""
    if work_dir.exists():
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True)
    progress = work_dir / "progress"
    spec = _layout(work_dir / "inputs", ctx, files, profile, list(step_patterns or []), progress)
    reader = _ProgressReader(progress)
    out = work_dir / "result.json"
    spec_path = work_dir / "spec.json"
    spec_path.write_bytes(orjson.dumps(spec.__dict__))
    with (work_dir / "stderr.txt").open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "traceguard.service.child", str(spec_path), str(out)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
            start_new_session=True,  # a signal to the server's process group is not the child's
        )
    deadline = time.monotonic() + ctx.settings.job_timeout_s
    beat_every = max(1.0, ctx.settings.job_lease_s / 3)
    next_beat = time.monotonic() + beat_every
    try:
        while process.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                # A short wait: progress reaches the job within a fraction of a second.
                process.wait(timeout=0.25)
            now = time.monotonic()
            if now > deadline:
                raise AnalysisFailed(
                    "analysis_timeout", f"the analysis took longer than the limit of {ctx.settings.job_timeout_s:.0f} s"
                )
            if stop is not None and stop():
                raise AnalysisFailed("interrupted", "the server stopped during the analysis")
            if heartbeat is not None and now >= next_beat:
                next_beat = now + beat_every
                if not heartbeat():
                    raise AnalysisFailed("lease_lost", "the job was taken over after its lease ran out")
            if on_progress is not None and (latest := reader.poll()) is not None and not on_progress(*latest):
                raise AnalysisFailed("lease_lost", "the job was taken over after its lease ran out")
    finally:
        if process.poll() is None:
            # The child leads its own process group: its map's pool processes (scheduler "local")
            # end with it.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)
    stderr_text = (work_dir / "stderr.txt").read_text(errors="replace").strip()
    if not out.is_file():
        _log_stderr(work_dir, f"ended (exit code {process.returncode}) without a result", stderr_text)
        last = _last_line(stderr_text)
        raise AnalysisFailed(
            "analysis_crashed",
            f"the analysis process ended (exit code {process.returncode}) without a result"
            + (f": {last}" if last else "")
            + " (its output is in the server log)",
        )
    payload = orjson.loads(out.read_bytes())
    if "error" in payload:
        error = payload["error"]
        if error.get("code") == "analysis_error":  # a bug: the job says so in one line, the log has the traceback
            _log_stderr(work_dir, "stopped on an internal error", stderr_text)
        message = error.get("message", "")
        if error.get("hint"):
            message += f" ({error['hint']})"
        raise AnalysisFailed(error.get("code", "analysis_error"), message.replace(f"{work_dir / 'inputs'}/", ""))
    doc = payload["report"]
    inputs_dir = work_dir / "inputs"
    if (doc.get("detail") or {}).get("folder"):
        doc["detail"]["folder"] = None  # a scratch path: the rows go to the store's tables
    return _public_names(doc, inputs_dir, files), _resolved_ranks(doc, inputs_dir)


def detail_folder(work_dir: Path) -> Path | None:
    """The side output a report by summary left in ``work_dir`` (None for a full report)."""
    folder = work_dir / "detail"
    return folder if folder.is_dir() else None


def input_names(work_dir: Path, files: list[File]) -> dict[str, str]:
    """Scratch path of each input → the name the report gives it (:func:`_public_names`)."""
    counts: dict[str, int] = {}
    for f in files:
        counts[f.name] = counts.get(f.name, 0) + 1
    return {
        str(work_dir / "inputs" / str(f.id) / f.name): (f.name if counts[f.name] == 1 else f"{f.id}/{f.name}")
        for f in files
    }


def execute(ctx: Context, job_id: int, worker: str, *, stop: Callable[[], bool] | None = None) -> str:
    """Run one claimed job to its end and record the outcome; returns the job's final status:
    succeeded, failed, queued (handed back: the worker is stopping), lost (the lease ran out and
    the job is no longer ours: nothing recorded) or missing.

    On failure the error is stored on the job, and the run's earlier results stay as they were."""
    with ctx.factory() as session:
        job = session.get(Job, job_id)
        if job is None:
            return "missing"
        files = run_files(session, job.run_id)
        profile, run_id, attempt = job.profile, job.run_id, job.attempts
        run = session.get(Run, run_id)
        step_patterns = list(run.step_patterns or []) if run is not None else []
    # One folder per attempt (and per claimer: workers on several machines share the data
    # directory): an analysis orphaned by a killed worker cannot write into the next one's.
    work_dir = ctx.jobs_dir / f"{job_id}-{attempt}-{uuid.uuid4().hex[:12]}"

    def heartbeat() -> bool:
        with ctx.factory() as session:
            return jobs.renew(session, job_id, worker, ctx.settings.job_lease_s)

    def on_progress(done: int, total: int) -> bool:
        with ctx.factory() as session:
            return jobs.progress(session, job_id, worker, done, total)

    try:
        return _execute(
            ctx, job_id, worker, work_dir, files, profile, run_id, step_patterns, heartbeat, on_progress, stop
        )
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def _execute(
    ctx: Context,
    job_id: int,
    worker: str,
    work_dir: Path,
    files: list[File],
    profile: str,
    run_id: int,
    step_patterns: list[str],
    heartbeat: Callable[[], bool],
    on_progress: Callable[[int, int], bool],
    stop: Callable[[], bool] | None,
) -> str:
    try:
        if not files:
            raise AnalysisFailed("no_files", "the run has no files to analyse")
        if not on_progress(0, captures(files)):
            raise AnalysisFailed("lease_lost", "the job was taken over after its lease ran out")
        doc, resolved = run_analysis(
            ctx,
            files,
            profile,
            work_dir,
            step_patterns=step_patterns,
            heartbeat=heartbeat,
            stop=stop,
            on_progress=on_progress,
        )
    except AnalysisFailed as exc:
        if exc.code == "lease_lost":
            return "lost"
        if exc.code == "interrupted":
            with ctx.factory() as session:  # leave it for the next worker
                return "queued" if jobs.release(session, job_id, worker) else "lost"
        with transaction(ctx.factory) as session:
            job = jobs.hold(session, job_id, worker)
            if job is None:
                return "lost"
            jobs.fail(session, job, code=exc.code, message=exc.message)
        return "failed"
    with transaction(ctx.factory) as session:
        job = jobs.hold(session, job_id, worker)
        if job is None:  # another worker took it over; its outcome is the one recorded
            return "lost"
        run = session.get(Run, run_id)
        if run is None:
            return "missing"
        files = run_files(session, run_id)
        results.save_report(session, run_id=run_id, job_id=job_id, input_key=job.input_key, doc=doc)
        if job.profile == run.profile and job.input_key == input_key(files):
            results.save_results(
                session,
                run,
                job,
                doc,
                files,
                resolved,
                detail_folder=detail_folder(work_dir),
                input_names=input_names(work_dir, files),
            )
        if job.ranks_total is not None:
            job.ranks_done = job.ranks_total  # every capture analysed, reported or not
        jobs.finish(session, job, verdict=doc["verdict"])
    return "succeeded"


_ATTEMPT_DIR = re.compile(r"(\d+)-(\d+)-[0-9a-f]{12}")


def sweep_scratch(ctx: Context) -> int:
    """Remove the scratch folders of attempts that are over (their worker was killed before it
    could clean up); those of running attempts, on any machine sharing the data directory, stay.
    Returns how many were removed."""
    removed = 0
    for folder in ctx.jobs_dir.iterdir():
        found = _ATTEMPT_DIR.fullmatch(folder.name)
        if found is None:
            continue
        job_id, attempt = int(found.group(1)), int(found.group(2))
        with ctx.factory() as session:
            job = session.get(Job, job_id)
            live = job is not None and job.status == "running" and job.attempts == attempt
        if not live:
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def report_for(ctx: Context, run: Run, profile: str) -> dict[str, Any]:
    """The run's report under ``profile``: stored, or computed now (in a child process) and kept."""
    with ctx.factory() as session:
        files = run_files(session, run.id)
        key = input_key(files)
        stored = results.get_report(session, run.id, profile, key)
        if stored is not None:
            return stored.document
    if not files:
        raise AnalysisFailed("no_files", "the run has no files to analyse")
    work_dir = ctx.jobs_dir / f"report-{run.id}-{uuid.uuid4().hex[:12]}"
    try:
        doc, _ = run_analysis(ctx, files, profile, work_dir, step_patterns=list(run.step_patterns or []))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    with transaction(ctx.factory) as session:
        results.save_report(session, run_id=run.id, job_id=None, input_key=key, doc=doc)
    return doc
