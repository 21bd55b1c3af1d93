"""Analysis jobs."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import Reader, SessionDep
from api.errors import not_found
from api.schemas import JobPublic
from api.views import job_public
from traceguard.store.jobs import get_job

router = APIRouter(prefix="/v1", tags=["jobs"])


@router.get("/jobs/{job_id}", responses={404: {"description": "no such job in this project"}})
def get_one_job(job_id: int, who: Reader, session: SessionDep) -> JobPublic:
    """A job's status (queued, running, succeeded, failed) and, when it failed, its error."""
    job = get_job(session, who.project_id, job_id)
    if job is None:
        raise not_found(f"job {job_id}")
    return job_public(job)
