"""The analysis job queue, kept in the database so that it survives crashes and restarts.

Workers (threads of ``traceguard serve``, or ``traceguard worker`` processes on any number of
machines) claim queued jobs: on PostgreSQL with ``SELECT ... FOR UPDATE SKIP LOCKED`` (concurrent
claimers never wait on, nor take, each other's row), on SQLite with a conditional UPDATE (the
database file has one writer at a time). The claimer holds a lease it renews while the analysis
runs; every later write of a running job (renewal, progress, outcome, hand-back) is conditional on
the job still being running under that worker, so a worker that lost its lease changes nothing. A
job whose lease ran out (its process died) is put back in the queue, up to ``max_attempts``
claims; after that it fails with ``error_code = "abandoned"``.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session

from traceguard.store.runs import input_key, run_files
from traceguard.store.tables import Job, Run, utcnow

ACTIVE = ("queued", "running")


def enqueue(session: Session, run: Run, profile: str | None = None) -> tuple[Job, bool]:
    """A job analysing the run's current files under ``profile`` (default: the run's).

    Idempotent: when a job for the same input set and profile is queued, running or has
    succeeded, that job is returned (created=False)."""
    profile = profile or run.profile
    key = input_key(run_files(session, run.id))
    existing = session.scalar(
        select(Job)
        .where(
            Job.run_id == run.id,
            Job.input_key == key,
            Job.profile == profile,
            Job.status.in_((*ACTIVE, "succeeded")),
        )
        .order_by(Job.id.desc())
    )
    if existing is not None:
        return existing, False
    job = Job(run_id=run.id, profile=profile, input_key=key, status="queued")
    session.add(job)
    run.status = "queued"
    session.flush()
    return job, True


def get_job(session: Session, project_id: int, job_id: int) -> Job | None:
    job = session.get(Job, job_id)
    if job is None:
        return None
    run = session.get(Run, job.run_id)
    return job if run is not None and run.project_id == project_id else None


def clock(session: Session) -> datetime:
    """The time leases are set and compared by. On PostgreSQL the database server's clock, so that
    workers on several machines agree on when a lease ran out however their own clocks drift; on
    SQLite (one machine) this machine's."""
    if session.get_bind().dialect.name == "postgresql":
        now = session.scalar(select(func.clock_timestamp()))
        assert now is not None
        return now
    return utcnow()


def claim(session: Session, worker: str, lease_s: float, *, job_id: int | None = None) -> Job | None:
    """Take the oldest queued job (or job ``job_id``, if it is queued), or None. Commits."""
    if session.get_bind().dialect.name == "postgresql":
        return _claim_skip_locked(session, worker, lease_s, job_id)
    for _ in range(5):
        query = select(Job.id).where(Job.status == "queued")
        if job_id is not None:
            query = query.where(Job.id == job_id)
        candidate = session.scalar(query.order_by(Job.id).limit(1))
        if candidate is None:
            session.rollback()
            return None
        now = clock(session)
        claimed = session.execute(
            update(Job).where(Job.id == candidate, Job.status == "queued").values(**_claimed(worker, lease_s, now))
        ).rowcount
        if claimed == 1:
            job = session.get(Job, candidate)
            assert job is not None  # we hold it now
            session.refresh(job)
            return _claimed_run(session, job)
        session.rollback()  # another worker took it first; try the next one
    return None


def _claimed(worker: str, lease_s: float, now: datetime) -> dict[str, Any]:
    """The columns a claim sets (progress restarts with the attempt)."""
    return {
        "status": "running",
        "worker": worker[:100],
        "attempts": Job.attempts + 1,
        "started_at": now,
        "lease_expires_at": now + timedelta(seconds=lease_s),
        "ranks_done": None,
        "ranks_total": None,
    }


def _claim_skip_locked(session: Session, worker: str, lease_s: float, job_id: int | None) -> Job | None:
    """PostgreSQL: lock the oldest queued row no other transaction has locked, and take it.

    Rows locked by concurrent claimers are skipped, not waited for, so N workers polling at once
    take N different jobs in one round trip each; the status condition is re-checked under the lock
    (a row requeued or claimed meanwhile is not taken twice)."""
    query = select(Job.id).where(Job.status == "queued")
    if job_id is not None:
        query = query.where(Job.id == job_id)
    candidate = session.scalar(query.order_by(Job.id).limit(1).with_for_update(skip_locked=True))
    if candidate is None:
        session.rollback()
        return None
    session.execute(
        update(Job)
        .where(Job.id == candidate, Job.status == "queued")
        .values(**_claimed(worker, lease_s, clock(session)))
    )
    job = session.get(Job, candidate)
    assert job is not None  # locked by us since the SELECT
    session.refresh(job)
    return _claimed_run(session, job)


def _claimed_run(session: Session, job: Job) -> Job:
    run = session.get(Run, job.run_id)
    if run is not None:
        run.status = "running"
    session.commit()
    return job


def _held(job_id: int, worker: str) -> Any:
    """The condition of every write a worker makes to its job: still running, still its own."""
    return (Job.id == job_id, Job.status == "running", Job.worker == worker[:100])


def renew(session: Session, job_id: int, worker: str, lease_s: float) -> bool:
    """Extend the lease; False when the job is no longer ours (requeued after a stall)."""
    renewed = session.execute(
        update(Job).where(*_held(job_id, worker)).values(lease_expires_at=clock(session) + timedelta(seconds=lease_s))
    ).rowcount
    session.commit()
    return renewed == 1


def progress(session: Session, job_id: int, worker: str, done: int, total: int) -> bool:
    """Record that ``done`` of ``total`` captures are analysed; False when the job is no longer ours."""
    changed = session.execute(
        update(Job).where(*_held(job_id, worker)).values(ranks_done=done, ranks_total=total)
    ).rowcount
    session.commit()
    return changed == 1


def release(session: Session, job_id: int, worker: str) -> bool:
    """Hand a running job back to the queue at once (its worker is stopping); False when it was no
    longer ours. The attempt counts, as the analysis began. Commits."""
    released = session.execute(
        update(Job).where(*_held(job_id, worker)).values(status="queued", worker=None, lease_expires_at=None)
    ).rowcount
    if released == 1:
        job = session.get(Job, job_id)
        run = session.get(Run, job.run_id) if job is not None else None
        if job is not None and run is not None and _is_latest(session, job):
            run.status = "queued"
    session.commit()
    return released == 1


def hold(session: Session, job_id: int, worker: str) -> Job | None:
    """The job, locked for the rest of the transaction, if it is still running under ``worker``;
    else None. The outcome of an analysis is recorded only under this lock, so a worker that lost
    its lease (and whose job another worker took) records nothing: each job finishes once.

    The lock is taken by a conditional UPDATE rather than ``SELECT ... FOR UPDATE``: on PostgreSQL
    both lock the row, and on SQLite (whose driver begins the transaction only at the first write)
    the UPDATE is what takes the database's write lock, so nobody changes the job before we commit."""
    held = session.execute(update(Job).where(*_held(job_id, worker)).values(lease_expires_at=Job.lease_expires_at))
    if held.rowcount != 1:
        return None
    job = session.get(Job, job_id)
    if job is not None:
        session.refresh(job)
    return job


def finish(session: Session, job: Job, *, verdict: str | None) -> None:
    """Record success. The run's verdict follows only jobs under the run's own profile (a job
    under another profile adds that profile's report and leaves the verdict alone)."""
    job.status = "succeeded"
    job.finished_at = utcnow()
    job.lease_expires_at = None
    job.error_code = job.error_message = None
    run = session.get(Run, job.run_id)
    if run is not None and _is_latest(session, job):
        run.status = "analysed"
        if job.profile == run.profile:
            run.verdict = verdict


def fail(session: Session, job: Job, *, code: str, message: str) -> None:
    job.status = "failed"
    job.finished_at = utcnow()
    job.lease_expires_at = None
    job.error_code = code
    job.error_message = message[:10_000]
    run = session.get(Run, job.run_id)
    if run is not None and _is_latest(session, job):
        run.status = "failed"  # the verdict of the last good analysis stays


def _is_latest(session: Session, job: Job) -> bool:
    newest = session.scalar(select(Job.id).where(Job.run_id == job.run_id).order_by(Job.id.desc()).limit(1))
    return newest == job.id


def requeue_expired(session: Session, max_attempts: int) -> tuple[int, int]:
    """Running jobs whose lease ran out go back to the queue (or fail after ``max_attempts``).
    Returns (requeued, abandoned). Commits.

    Every worker sweeps now and then, so several may find the same stale job at once: each change
    is a conditional UPDATE (still running, lease still expired), so only one of them makes it, and
    a job claimed again meanwhile is left alone."""
    now = clock(session)
    stale = session.execute(
        select(Job.id, Job.attempts).where(Job.status == "running", Job.lease_expires_at < now)
    ).all()
    requeued = abandoned = 0
    for job_id, attempts in stale:
        if attempts >= max_attempts:
            values: dict[str, Any] = {
                "status": "failed",
                "finished_at": now,
                "lease_expires_at": None,
                "error_code": "abandoned",
                "error_message": f"the analysis stopped without finishing {attempts} times (worker crash or restart)",
            }
        else:
            values = {"status": "queued", "worker": None, "lease_expires_at": None}
        changed = session.execute(
            update(Job).where(Job.id == job_id, Job.status == "running", Job.lease_expires_at < now).values(**values)
        ).rowcount
        if changed != 1:
            continue
        job = session.get(Job, job_id)
        assert job is not None
        session.refresh(job)
        run = session.get(Run, job.run_id)
        if run is not None and _is_latest(session, job):
            run.status = "failed" if values["status"] == "failed" else "queued"  # a failure keeps the verdict
        if values["status"] == "failed":
            abandoned += 1
        else:
            requeued += 1
    session.commit()
    return requeued, abandoned


def counts_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {status: count for status, count in rows}
