"""Service fixtures: the app on a fresh store, once on embedded SQLite and once on the machine's
real PostgreSQL (a new database per test, dropped after). PostgreSQL tests skip when no server
answers, unless TRACEGUARD_REQUIRE_POSTGRES=1 (CI) makes that a failure."""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from traceguard.service.context import Context
from traceguard.settings import Settings
from traceguard.store.access import create_token, get_or_create_project
from traceguard.store.db import transaction

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "h200"
P2P = H200 / "p2p_nsys"
SHM = H200 / "shm_nsys"
P2P_FILES = ["cap_0.sqlite.gz", "cap_1.sqlite.gz", "nccl.vm.1734.log", "nccl.vm.1737.log", "dmon.txt"]
SHM_FILES = ["cap_0.sqlite.gz", "cap_1.sqlite.gz", "nccl.vm.1979.log", "nccl.vm.1982.log", "dmon.txt"]
PG_SERVER = os.environ.get("TRACEGUARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def _pg_admin() -> Any:
    import psycopg

    return psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True, connect_timeout=3)


def postgres_database() -> Iterator[str]:
    """A new, empty PostgreSQL database; yields its URL and drops it afterwards."""
    try:
        admin = _pg_admin()
    except Exception as exc:
        if os.environ.get("TRACEGUARD_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"PostgreSQL is required here and does not answer at {PG_SERVER}: {exc}")
        pytest.skip(f"no PostgreSQL at {PG_SERVER}: {exc}")
    name = f"tg_test_{uuid.uuid4().hex[:12]}"
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"{PG_SERVER}/{name}"
    finally:
        with _pg_admin() as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> Iterator[str | None]:
    if request.param == "sqlite":
        yield None
    else:
        yield from postgres_database()


@pytest.fixture
def settings(tmp_path: Path, database_url: str | None) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        database_url=database_url,
        workers=1,
        job_lease_s=10,
        poll_interval_s=0.1,
    )


@dataclass
class Api:
    client: TestClient
    ctx: Context
    tokens: dict[str, str] = field(default_factory=dict)

    def headers(self, who: str = "uploader") -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def get(self, url: str, who: str = "reader", **kwargs: Any) -> Any:
        return self.client.get(url, headers={**self.headers(who), **kwargs.pop("headers", {})}, **kwargs)

    def post(self, url: str, who: str = "uploader", **kwargs: Any) -> Any:
        return self.client.post(url, headers={**self.headers(who), **kwargs.pop("headers", {})}, **kwargs)

    def new_run(self, labels: dict[str, str] | None = None, profile: str = "production", name: str = "") -> int:
        response = self.post("/v1/runs", json={"name": name, "labels": labels or {}, "profile": profile})
        assert response.status_code == 201, response.text
        return response.json()["id"]

    def upload(self, run_id: int, folder: Path, names: list[str], **params: Any) -> Any:
        files = [("file", (n, (folder / n).read_bytes())) for n in names]
        return self.post(f"/v1/runs/{run_id}/files", files=files, params=params)

    def upload_bytes(self, run_id: int, name: str, data: bytes) -> Any:
        return self.post(f"/v1/runs/{run_id}/files", files=[("file", (name, data))])

    def wait(self, job_url: str, timeout: float = 120) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            job = self.get(job_url).json()
            if job["status"] in ("succeeded", "failed"):
                return job
            time.sleep(0.1)
        raise AssertionError(f"{job_url} did not finish in {timeout} s: {job}")

    def analysed(self, folder: Path, names: list[str], **run: Any) -> int:
        run_id = self.new_run(**run)
        response = self.upload(run_id, folder, names)
        assert response.status_code == 202, response.text
        job = self.wait(response.json()["job"]["url"])
        assert job["status"] == "succeeded", job
        return run_id


def make_tokens(ctx: Context) -> dict[str, str]:
    with transaction(ctx.factory) as session:
        default = get_or_create_project(session, "default")
        other = get_or_create_project(session, "other")
        return {
            "reader": create_token(session, default, ["read"])[1],
            "uploader": create_token(session, default, ["read", "upload"])[1],
            "admin": create_token(session, default, ["admin"])[1],
            "other": create_token(session, other, ["read", "upload"])[1],
        }


@pytest.fixture
def api(settings: Settings) -> Iterator[Api]:
    app = create_app(settings)
    with TestClient(app) as client:
        ctx = app.state.ctx
        yield Api(client, ctx, make_tokens(ctx))
