"""Through real processes: ``traceguard serve`` (uvicorn on loopback), ``traceguard token create``,
``traceguard upload`` as a CI gate, and a SIGKILL in the middle of analyses."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from sqlalchemy import create_engine, text

from tests.service.conftest import H200, P2P, P2P_FILES, SHM, SHM_FILES
from tests.service.live import REPO, LiveServer
from traceguard.settings import Settings

pytestmark = pytest.mark.slow
SWEEP = H200.parent / "sweep_h200" / "bucket_100mb"


def _cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", *args],
        cwd=REPO,
        env={**os.environ, "COLUMNS": "300", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture
def server(tmp_path: Path, database_url: str | None) -> Iterator[LiveServer]:
    live = LiveServer(tmp_path / "data", database_url).start()
    yield live
    live.stop()


def test_serve_bootstraps_once_and_upload_gates(server: LiveServer, tmp_path: Path) -> None:
    assert server.admin_token, server.output()
    assert "shown only now" in server.output()
    env = {"TRACEGUARD_DATA_DIR": str(server.data_dir)}
    if server.database_url:
        env["TRACEGUARD_DATABASE_URL"] = server.database_url
    made = _cli("token", "create", "--project", "default", "--scope", "read,upload", "--name", "ci", env=env)
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("tg_") and token != server.admin_token

    common = ["--server", server.url, "--token", token, "--profile", "h200-nvlink"]
    junit = tmp_path / "junit.xml"
    shm = _cli("upload", *[str(SHM / f) for f in SHM_FILES], *common, "--label", "cluster=B", "--junit", str(junit))
    assert shm.returncode == 1, shm.stdout + shm.stderr  # a check fails: the gate closes
    assert "verdict FAIL" in shm.stdout and "transport_p2p" in shm.stdout
    assert "<testsuite" in junit.read_text()
    p2p = _cli("upload", str(P2P), *common, "--label", "cluster=B", "--baseline", "cluster=B")  # a bundle directory
    assert p2p.returncode == 0, p2p.stdout + p2p.stderr
    assert "compared with run 1 (fail → warn, profile h200-nvlink)" in p2p.stdout  # the SHM run is the baseline
    assert "check transport_p2p: fail → pass" in p2p.stdout and "nccl_share_of_step:" in p2p.stdout
    assert "verdict WARN" in p2p.stdout and "skipped p2p_nsys.tar/stdout.txt" in p2p.stderr
    bundle = _cli("upload", str(SWEEP), *common)  # a harness bundle: its manifest names the ranks
    assert bundle.returncode == 0, bundle.stdout + bundle.stderr
    run_url = bundle.stderr.strip().splitlines()[-1].split("report: ", 1)[1].replace("/runs/", "/v1/runs/")
    files = httpx.get(run_url, headers={"Authorization": f"Bearer {token}"}).json()["files"]
    captures = {f["name"]: (f["rank"], f["rank_source"], f["archive"]) for f in files if f["kind"] == "nsys-sqlite"}
    assert captures == {
        "cap_0.sqlite.gz": (0, "manifest", "bucket_100mb.tar"),
        "cap_1.sqlite.gz": (1, "manifest", "bucket_100mb.tar"),
    }
    assert {f["kind"] for f in files} >= {"nccl_log", "dmon", "topo", "smi_q"}
    listed = httpx.get(
        f"{server.url}/v1/runs", params={"label": "cluster:B"}, headers={"Authorization": f"Bearer {token}"}
    ).json()
    assert [r["verdict"] for r in listed["runs"]] == ["warn", "fail"]  # the labelled ones (P2P: rank 1 is late)
    bad = _cli("upload", str(P2P / "cap_0.sqlite.gz"), "--server", server.url, "--token", "tg_nope")
    assert bad.returncode == 2 and "valid API token" in bad.stderr

    server.stop()
    again = LiveServer(server.data_dir, server.database_url).start()
    try:
        assert again.admin_token is None and "shown only now" not in again.output()
    finally:
        again.stop()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_sigkill_during_analysis_loses_no_job_or_file(tmp_path: Path, database_url: str | None) -> None:
    env = {"TRACEGUARD_JOB_LEASE_S": "3", "TRACEGUARD_WORKERS": "1"}
    first = LiveServer(tmp_path / "data", database_url, env=env).start()
    headers = {"Authorization": f"Bearer {first.admin_token}"}
    client = httpx.Client(base_url=first.url, headers=headers, timeout=60)
    uploaded: dict[int, list[str]] = {}
    for i in range(4):
        folder, names = (SHM, SHM_FILES) if i % 2 else (P2P, P2P_FILES)
        run_id = client.post("/v1/runs", json={"name": f"run{i}"}).json()["id"]
        files = [("file", (n, (folder / n).read_bytes())) for n in names]
        assert client.post(f"/v1/runs/{run_id}/files", files=files).status_code == 202
        uploaded[run_id] = sorted(_sha256(folder / n) for n in names)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # kill while an analysis is under way
        statuses = [client.get(f"/v1/runs/{r}").json()["status"] for r in uploaded]
        if "running" in statuses:
            break
        time.sleep(0.05)
    first.kill()
    client.close()

    second = LiveServer(first.data_dir, database_url, env=env).start()
    try:
        client = httpx.Client(base_url=second.url, headers=headers, timeout=60)
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            runs = [client.get(f"/v1/runs/{r}").json() for r in uploaded]
            if all(r["status"] in ("analysed", "failed") for r in runs):
                break
            time.sleep(0.5)
        for run in runs:
            assert run["status"] == "analysed", run
            assert sorted(f["sha256"] for f in run["files"]) == uploaded[run["id"]]
            for f in run["files"]:
                blob = second.data_dir / "blobs" / f["sha256"][:2] / f["sha256"]
                assert _sha256(blob) == f["sha256"]
        attempts = [j["attempts"] for r in runs for j in r["jobs"]]
        assert max(attempts) >= 2, attempts  # the interrupted one ran again
        assert [r["verdict"] for r in runs] == ["warn", "fail", "warn", "fail"]
    finally:
        second.stop()
    url = Settings(data_dir=first.data_dir, database_url=database_url).url
    engine = create_engine(url)
    with engine.connect() as connection:
        counts = dict(connection.execute(text("SELECT status, count(*) FROM jobs GROUP BY status")).all())
    engine.dispose()
    assert counts == {"succeeded": 4}


def test_sigterm_hands_running_jobs_back(tmp_path: Path, database_url: str | None) -> None:
    """A clean stop (SIGTERM: a deploy) puts a running analysis back in the queue at once, and the
    next server finishes it."""
    env = {"TRACEGUARD_WORKERS": "1"}
    first = LiveServer(tmp_path / "data", database_url, env=env).start()
    client = httpx.Client(base_url=first.url, headers={"Authorization": f"Bearer {first.admin_token}"}, timeout=60)
    run_id = client.post("/v1/runs", json={}).json()["id"]
    files = [("file", (n, (SHM / n).read_bytes())) for n in SHM_FILES]
    job_url = client.post(f"/v1/runs/{run_id}/files", files=files).json()["job"]["url"]
    deadline = time.monotonic() + 60
    while client.get(job_url).json()["status"] != "running" and time.monotonic() < deadline:
        time.sleep(0.02)
    headers = dict(client.headers)
    client.close()  # no open keep-alive connection for uvicorn's shutdown to wait on
    first.stop()
    # uvicorn finishes its shutdown, then re-raises the signal (exit status -15 is the clean path)
    assert first.process is not None and first.process.returncode in (0, -15), first.output()[-2000:]
    assert "Application shutdown complete" in first.output()
    url = Settings(data_dir=first.data_dir, database_url=database_url).url
    engine = create_engine(url)
    with engine.connect() as connection:
        status, attempts = connection.execute(text("SELECT status, attempts FROM jobs")).one()
    engine.dispose()
    assert (status, attempts) == ("queued", 1)  # back in the queue, not failed, not waiting for a lease
    second = LiveServer(first.data_dir, database_url, env=env).start()
    try:
        client = httpx.Client(base_url=second.url, headers=headers, timeout=60)
        deadline = time.monotonic() + 120
        while (job := client.get(job_url).json())["status"] not in ("succeeded", "failed"):
            assert time.monotonic() < deadline
            time.sleep(0.2)
        assert job["status"] == "succeeded" and job["attempts"] == 2
    finally:
        second.stop()
