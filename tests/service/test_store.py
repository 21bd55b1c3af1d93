"""The store on both engines: migrations equal the models, the job queue hands each job to one
worker, expired leases come back, blobs are stored once."""

from __future__ import annotations

import threading
from datetime import timedelta
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from tests.service.conftest import P2P
from traceguard.service.context import Context
from traceguard.settings import Settings
from traceguard.store import jobs
from traceguard.store.access import authenticate, get_or_create_project
from traceguard.store.blobs import BlobStore
from traceguard.store.db import schema_is_current, transaction
from traceguard.store.runs import add_file, create_run
from traceguard.store.tables import Base, Job, utcnow


def _ctx(settings: Settings) -> Context:
    return Context.open(settings)


def test_migrations_build_exactly_the_models(settings: Settings) -> None:
    ctx = _ctx(settings)
    try:
        assert schema_is_current(ctx.engine)
        with ctx.engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection, opts={"compare_type": True}), Base.metadata)
        assert diff == []
        tables = set(inspect(ctx.engine).get_table_names())
        for table in (
            "projects",
            "runs",
            "run_labels",
            "files",
            "jobs",
            "rank_results",
            "steps",
            "phases",
            "collectives",
            "connections",
            "check_results",
            "blobs",
            "tokens",
            "reports",
        ):
            assert table in tables
        Context.open(settings).close()  # migrating again is a no-op
    finally:
        ctx.close()


def test_bootstrap_only_on_an_empty_store(settings: Settings) -> None:
    ctx = _ctx(settings)
    try:
        secret = ctx.bootstrap()
        assert secret and secret.startswith("tg_")
        assert ctx.bootstrap() is None
        with ctx.factory() as session:
            token = authenticate(session, secret)
            assert token is not None and token.scopes == "admin" and token.project.name == "default"
    finally:
        ctx.close()


def _queued_jobs(ctx: Context, count: int) -> list[int]:
    with transaction(ctx.factory) as session:
        project = get_or_create_project(session, "p")
        ids = []
        for i in range(count):
            run = create_run(session, project.id, name=f"r{i}", labels={}, profile="production")
            session.add(Job(run_id=run.id, profile="production", input_key=f"k{i}"))
            session.flush()
            ids.append(run.id)
        return ids


def test_each_job_is_claimed_by_one_worker(settings: Settings) -> None:
    ctx = _ctx(settings)
    try:
        _queued_jobs(ctx, 20)
        claimed: list[int] = []
        lock = threading.Lock()

        def worker(name: str) -> None:
            while True:
                with ctx.factory() as session:
                    job = jobs.claim(session, name, 30)
                if job is None:
                    return
                with lock:
                    claimed.append(job.id)

        threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 20
    finally:
        ctx.close()


def test_expired_leases_are_requeued_then_abandoned(settings: Settings) -> None:
    ctx = _ctx(settings)
    try:
        _queued_jobs(ctx, 1)
        for attempt in (1, 2, 3):
            with ctx.factory() as session:
                job = jobs.claim(session, "dead-worker", 30)
                assert job is not None and job.attempts == attempt
                job.lease_expires_at = utcnow() - timedelta(seconds=1)  # the worker died
                session.commit()
            with ctx.factory() as session:
                requeued, abandoned = jobs.requeue_expired(session, max_attempts=3)
            assert (requeued, abandoned) == ((1, 0) if attempt < 3 else (0, 1))
        with ctx.factory() as session:
            job = session.get(Job, job.id)
            assert job.status == "failed" and job.error_code == "abandoned"
    finally:
        ctx.close()


def test_blobs_are_content_addressed_and_shared(settings: Settings, tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "blobs")
    first = store.put_file(P2P / "cap_0.sqlite.gz")
    second = store.put_file(P2P / "cap_0.sqlite.gz")
    assert first == second
    assert store.path(first[0]).read_bytes() == (P2P / "cap_0.sqlite.gz").read_bytes()
    assert [p for p in store.scratch.iterdir()] == []
    ctx = _ctx(settings)
    try:
        with transaction(ctx.factory) as session:
            project = get_or_create_project(session, "p")
            runs = [create_run(session, project.id, name=n, labels={}, profile="production") for n in "ab"]
            rows = [
                add_file(
                    session,
                    run,
                    sha256=first[0],
                    size=first[1],
                    name="../../x.gz",
                    kind="nsys-sqlite",
                    compressed=True,
                    rank=None,
                    rank_source=None,
                )
                for run in runs
            ]
            assert [created for _, created in rows] == [True, True]
            assert rows[0][0].name == "x.gz"  # never a path
            again = add_file(
                session,
                runs[0],
                sha256=first[0],
                size=first[1],
                name="other.gz",
                kind="nsys-sqlite",
                compressed=True,
                rank=None,
                rank_source=None,
            )
            assert again == (rows[0][0], False)
    finally:
        ctx.close()
