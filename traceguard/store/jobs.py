"""The analysis job queue, kept in the database so that it survives crashes and restarts.

A worker claims a queued job with a conditional UPDATE (safe with several workers and several
server processes on one PostgreSQL), renews its lease while the analysis runs, and records the
outcome. A job whose lease ran out (its process died) is put back in the queue, up to
``max_attempts`` claims; after that it fails with ``error_code = "abandoned"``.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update
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


def claim(session: Session, worker: str, lease_s: float, *, job_id: int | None = None) -> Job | None:
    """Take the oldest queued job (or job ``job_id``, if it is queued), or None. Commits."""
    for _ in range(5):
        query = select(Job.id).where(Job.status == "queued")
        if job_id is not None:
            query = query.where(Job.id == job_id)
        candidate = session.scalar(query.order_by(Job.id).limit(1))
        if candidate is None:
            session.rollback()
            return None
        now = utcnow()
        claimed = session.execute(
            update(Job)
            .where(Job.id == candidate, Job.status == "queued")
            .values(
                status="running",
                worker=worker,
                attempts=Job.attempts + 1,
                started_at=now,
                lease_expires_at=now + timedelta(seconds=lease_s),
            )
        ).rowcount
        if claimed == 1:
            job = session.get(Job, candidate)
            assert job is not None  # we hold it now
            session.refresh(job)
            run = session.get(Run, job.run_id)
            if run is not None:
                run.status = "running"
            session.commit()
            return job
        session.rollback()  # another worker took it first; try the next one
    return None


def renew(session: Session, job_id: int, worker: str, lease_s: float) -> bool:
    """Extend the lease; False when the job is no longer ours (requeued after a stall)."""
    renewed = session.execute(
        update(Job)
        .where(Job.id == job_id, Job.worker == worker, Job.status == "running")
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_s))
    ).rowcount
    session.commit()
    return renewed == 1


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
    Returns (requeued, abandoned). Commits."""
    now = utcnow()
    stale = list(session.scalars(select(Job).where(Job.status == "running", Job.lease_expires_at < now)))
    requeued = abandoned = 0
    for job in stale:
        if job.attempts >= max_attempts:
            fail(
                session,
                job,
                code="abandoned",
                message=f"the analysis stopped without finishing {job.attempts} times (worker crash or restart)",
            )
            abandoned += 1
        else:
            job.status = "queued"
            job.worker = None
            job.lease_expires_at = None
            run = session.get(Run, job.run_id)
            if run is not None and _is_latest(session, job):
                run.status = "queued"
            requeued += 1
    session.commit()
    return requeued, abandoned


def counts_by_status(session: Session) -> dict[str, int]:
    from sqlalchemy import func

    rows = session.execute(select(Job.status, func.count()).group_by(Job.status)).all()
    return {status: count for status, count in rows}
