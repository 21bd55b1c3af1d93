"""Runs, their labels and files. Every lookup takes the caller's project: another project's run is
simply not found (the API answers 404, never 403, so its existence does not leak)."""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Select, and_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from traceguard.errors import InputError
from traceguard.metrics.steps import validate_patterns
from traceguard.store.tables import Blob, File, Job, Run, RunLabel

RUN_STATUSES = ("created", "queued", "running", "analysed", "failed")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9_.\-/]{1,100}$")
MAX_PAGE = 200


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if not _LABEL_KEY.match(key):
            raise InputError(f"label key {key!r} must be 1-100 characters of letters, digits, _ . - /")
        if not isinstance(value, str) or len(value) > 500:
            raise InputError(f"label {key!r} must have a string value of at most 500 characters")
    return labels


def parse_label_filter(text: str) -> tuple[str, str]:
    key, sep, value = text.partition(":")
    if not sep or not _LABEL_KEY.match(key):
        raise InputError(f"label filter {text!r} is not key:value")
    return key, value


def with_labels(query: Select[Any], labels: Iterable[tuple[str, str]]) -> Select[Any]:
    """``query`` (over ``runs``) restricted to runs carrying every (key, value) label."""
    for key, value in labels:
        query = query.where(
            select(RunLabel.run_id)
            .where(and_(RunLabel.run_id == Run.id, RunLabel.key == key, RunLabel.value == value))
            .exists()
        )
    return query


def create_run(
    session: Session,
    project_id: int,
    *,
    name: str,
    labels: dict[str, str],
    profile: str,
    step_patterns: list[str] | None = None,
) -> Run:
    """A new run; ``step_patterns`` (the user's step regexes) are checked and kept with it."""
    patterns = list(step_patterns or [])
    try:
        validate_patterns(patterns)
    except ValueError as exc:
        hint = "no look-around or back-references (Rust regex syntax), e.g. '^train_step_\\d+$'"
        raise InputError(f"step pattern {exc}", hint=hint) from None
    run = Run(project_id=project_id, name=name, profile=profile, step_patterns=patterns)
    run.labels = [RunLabel(key=k, value=v) for k, v in sorted(check_labels(labels).items())]
    session.add(run)
    session.flush()
    return run


def get_run(session: Session, project_id: int, run_id: int) -> Run | None:
    run = session.get(Run, run_id)
    return run if run is not None and run.project_id == project_id else None


def _encode_cursor(run_id: int) -> str:
    return base64.urlsafe_b64encode(f"r{run_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not text.startswith("r"):
            raise ValueError(text)
        return int(text[1:])
    except ValueError as exc:
        raise InputError(f"cursor {cursor!r} is not one this service issued") from exc


@dataclass
class RunPage:
    runs: list[Run]
    next_cursor: str | None


def list_runs(
    session: Session,
    project_id: int,
    *,
    labels: list[tuple[str, str]] = (),  # type: ignore[assignment]
    status: str | None = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    limit: int = 50,
    cursor: str | None = None,
) -> RunPage:
    """Newest first; every label filter must match (AND); pages continue from ``cursor``."""
    if not 1 <= limit <= MAX_PAGE:
        raise InputError(f"limit must be between 1 and {MAX_PAGE}")
    if status is not None and status not in RUN_STATUSES:
        raise InputError(f"status must be one of {', '.join(RUN_STATUSES)}")
    query = select(Run).where(Run.project_id == project_id)
    query = with_labels(query, labels)
    if status:
        query = query.where(Run.status == status)
    if created_after:
        query = query.where(Run.created_at >= created_after)
    if created_before:
        query = query.where(Run.created_at < created_before)
    if cursor:
        query = query.where(Run.id < _decode_cursor(cursor))
    runs = list(session.scalars(query.order_by(Run.id.desc()).limit(limit + 1)))
    more = len(runs) > limit
    runs = runs[:limit]
    return RunPage(runs, _encode_cursor(runs[-1].id) if more and runs else None)


def run_files(session: Session, run_id: int) -> list[File]:
    return list(session.scalars(select(File).where(File.run_id == run_id).order_by(File.id)))


def run_jobs(session: Session, run_id: int) -> list[Job]:
    return list(session.scalars(select(Job).where(Job.run_id == run_id).order_by(Job.id)))


def ensure_blob(session: Session, sha256: str, size: int) -> None:
    if session.get(Blob, sha256) is None:
        try:
            with session.begin_nested():
                session.add(Blob(sha256=sha256, size=size))
        except IntegrityError:
            pass  # stored concurrently by another upload of the same bytes


def add_file(
    session: Session,
    run: Run,
    *,
    sha256: str,
    size: int,
    name: str,
    kind: str,
    compressed: bool,
    rank: int | None,
    rank_source: str | None,
    archive: str | None = None,
) -> tuple[File, bool]:
    """Attach a stored blob to the run; the same bytes twice give the same file (created=False)."""
    ensure_blob(session, sha256, size)
    existing = session.scalar(select(File).where(File.run_id == run.id, File.sha256 == sha256))
    if existing is not None:
        if rank is not None and existing.rank != rank:
            existing.rank, existing.rank_source = rank, rank_source
        return existing, False
    row = File(
        run_id=run.id,
        sha256=sha256,
        size=size,
        name=safe_name(name),
        kind=kind,
        compressed=compressed,
        rank=rank,
        rank_source=rank_source,
        archive=archive,
    )
    try:
        with session.begin_nested():
            session.add(row)
    except IntegrityError:
        existing = session.scalar(select(File).where(File.run_id == run.id, File.sha256 == sha256))
        if existing is None:
            raise
        return existing, False
    return row, True


def safe_name(name: str) -> str:
    """A display/file name with no directory part and no control characters."""
    base = name.replace("\\", "/").rsplit("/", 1)[-1]
    base = re.sub(r"[\x00-\x1f\x7f]", "", base).strip() or "upload"
    return base[:255]


def input_key(files: list[File]) -> str:
    """Identity of the analysed input set: which bytes, with which ranks given."""
    digest = hashlib.sha256()
    for sha, rank in sorted((f.sha256, -1 if f.rank is None else f.rank) for f in files):
        digest.update(f"{sha}:{rank};".encode())
    return digest.hexdigest()
