"""Service workers as processes of their own: ``traceguard serve --no-workers`` queues, real
``traceguard worker`` processes claim and run, on the machine's PostgreSQL (SKIP LOCKED claims)
and on embedded SQLite (conditional UPDATE claims). Every job finishes exactly once, a SIGKILLed
worker's job is finished by the other after its lease runs out, a SIGTERM hands it back at once."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
from sqlalchemy import create_engine, text, update

from tests.service.conftest import P2P, P2P_FILES, Api, postgres_database
from tests.service.live_workers import ApiOnly, LiveWorker, running
from traceguard.service.context import Context
from traceguard.settings import Settings
from traceguard.store import jobs
from traceguard.store.access import get_or_create_project
from traceguard.store.db import transaction
from traceguard.store.tables import Job, Run, utcnow

#: Workers of these tests: one analysis at a time, each on one core (the machine has two, shared).
WORKER_ENV = {"TRACEGUARD_DASK_SCHEDULER": "serial", "TRACEGUARD_POLL_INTERVAL_S": "0.1"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from postgres_database()


def _queue(server: ApiOnly, runs: int) -> tuple[httpx.Client, dict[int, str]]:
    """Upload the 2-rank H200 P2P capture into ``runs`` new runs; run id → its job's URL."""
    client = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=60)
    payload = [("file", (n, (P2P / n).read_bytes())) for n in P2P_FILES]
    queued = {}
    for i in range(runs):
        run_id = client.post("/v1/runs", json={"name": f"w{i}"}).json()["id"]
        response = client.post(f"/v1/runs/{run_id}/files", files=payload)
        assert response.status_code == 202, response.text
        queued[run_id] = response.json()["job"]["url"]
    return client, queued


def _wait_all(client: httpx.Client, urls: list[str], timeout: float = 120) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [client.get(u).json() for u in urls]
        if all(j["status"] in ("succeeded", "failed") for j in found):
            return found
        time.sleep(0.2)
    raise AssertionError(f"jobs did not finish in {timeout} s: {found}")


def _rows(url: str, query: str) -> list[Any]:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return list(connection.execute(text(query)).all())
    finally:
        engine.dispose()


@pytest.mark.slow
@pytest.mark.postgres
def test_two_workers_run_every_job_exactly_once(tmp_path: Path, pg_url: str) -> None:
    data = tmp_path / "data"
    server = ApiOnly(data, pg_url).start()
    workers = LiveWorker.start_all([LiveWorker(data, pg_url, env=WORKER_ENV) for _ in range(2)])
    try:
        client, queued = _queue(server, 4)
        done = _wait_all(client, list(queued.values()))
        for worker in workers:
            assert worker.stop() == 0, worker.output()[-2000:]  # SIGTERM with nothing running: a clean exit
    finally:
        for worker in workers:
            worker.kill()
        server.stop()
    assert [j["status"] for j in done] == ["succeeded"] * 4, done
    assert all(j["attempts"] == 1 for j in done)
    assert all((j["ranks_done"], j["ranks_total"]) == (2, 2) for j in done)  # both captures of each run
    # The worker logs: each job claimed once across both processes, each finished by its claimer,
    # and both processes took some (a claimer is busy ~1 s per job; the other polls every 0.1 s).
    claims = [c for w in workers for c in w.claimed()]
    assert sorted(claims) == sorted((j["id"], 1) for j in done), claims
    for worker in workers:
        assert worker.claimed(), worker.output()[-2000:]
        assert worker.finished() == {job: "succeeded" for job, _ in worker.claimed()}
        assert "stopped: " in worker.output()
    # The store: one report per run, written by that run's one job.
    reports = _rows(Settings(data_dir=data, database_url=pg_url).url, "SELECT run_id, job_id FROM reports")
    assert sorted(reports) == sorted((r, int(u.rsplit("/", 1)[1])) for r, u in queued.items())
    statuses = _rows(Settings(data_dir=data, database_url=pg_url).url, "SELECT status FROM runs")
    assert [s for (s,) in statuses] == ["analysed"] * 4


@pytest.mark.slow
@pytest.mark.postgres
def test_a_sigkilled_worker_loses_nothing(tmp_path: Path, pg_url: str) -> None:
    """SIGKILL one worker mid-analysis: its analysis process and the map's pool processes end with
    it, the job's lease (3 s) runs out, the other worker requeues and finishes it; every job still
    finishes exactly once."""
    data = tmp_path / "data"
    # A pool of 2 processes per analysis (the "local" scheduler), so that there is a pool to end.
    env = {**WORKER_ENV, "TRACEGUARD_DASK_SCHEDULER": "local", "TRACEGUARD_ANALYSIS_JOBS": "2"}
    env["TRACEGUARD_JOB_LEASE_S"] = "3"
    server = ApiOnly(data, pg_url, env=env).start()
    workers = LiveWorker.start_all([LiveWorker(data, pg_url, env=env) for _ in range(2)])
    url = Settings(data_dir=data, database_url=pg_url).url
    try:
        client, queued = _queue(server, 2)
        deadline = time.monotonic() + 60
        while True:  # the first job a worker is analysing
            held = _rows(url, "SELECT id, worker FROM jobs WHERE status = 'running' ORDER BY id")
            if held:
                break
            assert time.monotonic() < deadline, "no job started"
            time.sleep(0.02)
        job_id, holder = held[0]
        victim = next(w for w in workers if f":{w.pid}:" in holder)
        survivor = next(w for w in workers if w is not victim)
        deadline = time.monotonic() + 10
        while len(orphans := victim.analysis_tree()) < 2:  # the analysis and its pool, once started
            assert time.monotonic() < deadline, victim.output()
            time.sleep(0.01)
        victim.kill()
        done = _wait_all(client, list(queued.values()))
        orphans_left = [pid for pid in orphans if running(pid)]
        assert survivor.stop() == 0
    finally:
        for worker in workers:
            worker.kill()
        server.stop()
    assert [j["status"] for j in done] == ["succeeded"] * 2, done
    killed = next(j for j in done if j["id"] == job_id)
    assert killed["attempts"] == 2  # the killed attempt, then the survivor's
    assert (job_id, 2) in survivor.claimed() and survivor.finished()[job_id] == "succeeded"
    assert job_id not in victim.finished()  # it never recorded an outcome
    assert "requeued" in survivor.output()
    assert not orphans_left  # the killed worker's analysis ended itself and its pool (parent gone)
    assert "removed 1 scratch folder(s)" in survivor.output()  # the killed attempt's, left behind
    assert not list((data / "jobs").iterdir())
    claims = Counter(job for w in workers for job, _ in w.claimed())
    assert claims == Counter({j["id"]: j["attempts"] for j in done})
    reports = _rows(url, "SELECT run_id, count(*) FROM reports GROUP BY run_id")
    assert sorted(reports) == [(r, 1) for r in sorted(queued)]


@pytest.mark.slow
def test_worker_on_embedded_sqlite_and_sigterm_hands_the_job_back(tmp_path: Path) -> None:
    """The SQLite store of one machine: API and a worker process share the database file. A
    SIGTERM mid-analysis puts the job straight back in the queue (no lease wait); the next worker
    finishes it. The signal lands on whichever job the worker is on by then: a job it finished
    first (an analysis quicker than the signal) stays done."""
    data = tmp_path / "data"
    server = ApiOnly(data).start()
    first = LiveWorker(data, env=WORKER_ENV).start()
    url = Settings(data_dir=data).url
    try:
        client, queued = _queue(server, 2)
        deadline = time.monotonic() + 60
        while not _rows(url, "SELECT id FROM jobs WHERE status = 'running'"):
            assert time.monotonic() < deadline, first.output()
            time.sleep(0.02)
        assert first.stop() == 0, first.output()[-2000:]
        states = _rows(url, "SELECT status, attempts, worker FROM jobs ORDER BY id")
        handed_back = [i for i, state in enumerate(states) if state == ("queued", 1, None)]
        assert len(handed_back) == 1, states  # handed back, the attempt counted
        (back,) = handed_back
        assert all(state[:2] == ("succeeded", 1) for state in states[:back]), states  # done before it
        assert all(state == ("queued", 0, None) for state in states[back + 1 :]), states  # never begun
        assert list(first.finished().values()) == ["succeeded"] * back + ["queued"]
        second = LiveWorker(data, env=WORKER_ENV).start()
        try:
            done = _wait_all(client, list(queued.values()))
        finally:
            assert second.stop() == 0
    finally:
        first.kill()
        server.stop()
    attempts = [1] * back + [2] + [1] * (len(states) - back - 1)
    assert [(j["status"], j["attempts"]) for j in done] == [("succeeded", a) for a in attempts]
    assert sorted(second.finished().values()) == ["succeeded"] * (len(states) - back)


def _store(settings: Settings, runs: int) -> Context:
    """A migrated store with ``runs`` runs, each with one queued job."""
    ctx = Context.open(settings)
    with transaction(ctx.factory) as session:
        project = get_or_create_project(session, "p")
        for i in range(runs):
            run = Run(project_id=project.id, name=f"r{i}")
            session.add(run)
            session.flush()
            session.add(Job(run_id=run.id, profile="production", input_key="k", status="queued"))
    return ctx


def test_concurrent_claims_never_share_a_job(settings: Settings) -> None:
    """12 threads, each its own connection, claim from 40 queued jobs at once until none is left:
    each job is claimed by exactly one of them (SKIP LOCKED on PostgreSQL, conditional UPDATE on
    SQLite)."""
    ctx = _store(settings, 40)
    taken: list[tuple[str, int]] = []
    start = threading.Barrier(12)

    def claimer(name: str) -> None:
        start.wait()
        while True:
            with ctx.factory() as session:
                job = jobs.claim(session, name, 60)
            if job is None:
                return
            taken.append((name, job.id))

    threads = [threading.Thread(target=claimer, args=(f"w{i}",)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    ids = [job for _, job in taken]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 40
    with ctx.factory() as session:
        rows = session.execute(text("SELECT id, worker, attempts, status FROM jobs")).all()
    assert {(i, w) for i, w, _, _ in rows} == {(j, w) for w, j in taken}
    assert {(a, s) for _, _, a, s in rows} == {(1, "running")}
    ctx.close()


@pytest.mark.postgres
def test_postgres_claim_skips_a_locked_row(tmp_path: Path, pg_url: str) -> None:
    """A job whose row another transaction holds locked is skipped, not waited for: the claim takes
    the next one at once."""
    ctx = _store(Settings(data_dir=tmp_path / "data", database_url=pg_url), 2)
    with ctx.factory() as holder:
        first = holder.scalar(text("SELECT id FROM jobs ORDER BY id LIMIT 1 FOR UPDATE"))
        started = time.monotonic()
        with ctx.factory() as session:
            job = jobs.claim(session, "other", 60)
        assert job is not None and job.id == first + 1
        assert time.monotonic() - started < 2
        holder.rollback()
    ctx.close()


def test_a_worker_that_lost_its_lease_records_nothing(settings: Settings) -> None:
    """Worker A stalls past its lease; the job is requeued and claimed by B. A's renewal, progress,
    hand-back and outcome are all refused; B's are taken."""
    ctx = _store(settings, 1)
    with ctx.factory() as session:
        job = jobs.claim(session, "A", 60)
        assert job is not None
        session.execute(update(Job).values(lease_expires_at=utcnow() - timedelta(seconds=1)))
        session.commit()
        assert jobs.requeue_expired(session, 3) == (1, 0)
        assert jobs.requeue_expired(session, 3) == (0, 0)  # a second sweeper finds nothing to do
        again = jobs.claim(session, "B", 60)
        assert again is not None and (again.id, again.attempts) == (job.id, 2)
        assert not jobs.renew(session, job.id, "A", 60)
        assert not jobs.progress(session, job.id, "A", 1, 2)
        assert not jobs.release(session, job.id, "A")
        assert jobs.hold(session, job.id, "A") is None
        session.rollback()
        assert jobs.progress(session, job.id, "B", 1, 2)
        held = jobs.hold(session, job.id, "B")
        assert held is not None
        jobs.finish(session, held, verdict="pass")
        session.commit()
        row = session.execute(text("SELECT status, worker, attempts, ranks_done, ranks_total FROM jobs")).one()
    assert tuple(row) == ("succeeded", "B", 2, 1, 2)
    ctx.close()


def test_the_analysis_child_reports_each_capture(tmp_path: Path, unpacked: Any) -> None:
    """``python -m traceguard.service.child`` appends one ``DONE TOTAL`` line per capture analysed
    (serial: in input order), and the scheduler of the spec is the one used."""
    import subprocess
    import sys

    progress = tmp_path / "progress"
    spec = {
        "inputs": [[str(unpacked(P2P / "cap_0.sqlite.gz")), None], [str(unpacked(P2P / "cap_1.sqlite.gz")), None]],
        "side": {},
        "profile": "production",
        "cache_dir": str(tmp_path / "cache"),
        "max_rows": 200_000_000,
        "step_patterns": [],
        "scheduler": "serial",
        "jobs": None,
        "progress": str(progress),
    }
    (tmp_path / "spec.json").write_bytes(orjson.dumps(spec))
    out = tmp_path / "out.json"
    subprocess.run(
        [sys.executable, "-m", "traceguard.service.child", str(tmp_path / "spec.json"), str(out)], check=True
    )
    assert "report" in orjson.loads(out.read_bytes())
    assert progress.read_text().splitlines() == ["1 2", "2 2"]


def test_serve_with_its_own_workers_reports_progress(api: Api) -> None:
    """The default ``serve`` (threads in the API process) records the same progress on the job."""
    run_id = api.new_run()
    response = api.upload(run_id, P2P, P2P_FILES)
    assert response.status_code == 202, response.text
    queued = response.json()["job"]
    assert (queued["ranks_done"], queued["ranks_total"]) == (None, None)  # not started yet
    job = api.wait(queued["url"])
    assert job["status"] == "succeeded", job
    assert (job["ranks_done"], job["ranks_total"]) == (2, 2)
