"""What the service refuses, and that refusing loses nothing already stored."""

from __future__ import annotations

import gzip
import io
import sqlite3
import tarfile
import zipfile
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.service.conftest import P2P, Api, make_tokens
from traceguard.settings import Settings


def _error(response: object, status: int) -> dict:
    assert response.status_code == status, response.text  # type: ignore[attr-defined]
    body = response.json()  # type: ignore[attr-defined]
    assert set(body) == {"error"} and body["error"]["code"] and body["error"]["message"]
    return body["error"]


def test_tokens_are_required_and_checked(api: Api) -> None:
    assert _error(api.client.get("/v1/runs"), 401)["code"] == "unauthorized"
    assert api.client.get("/v1/runs").headers["www-authenticate"] == "Bearer"
    assert _error(api.client.get("/v1/runs", headers={"Authorization": "Bearer tg_wrong"}), 401)
    assert _error(api.client.get("/v1/runs", headers={"Authorization": "Basic dXNlcjpwdw=="}), 401)
    refused = api.post("/v1/runs", who="reader", json={})
    assert _error(refused, 403)["message"] == "this token lacks the 'upload' scope"


def test_other_projects_runs_are_invisible(api: Api) -> None:
    mine = api.analysed(P2P, ["cap_0.sqlite.gz"])
    response = api.client.post("/v1/runs", headers=api.headers("other"), json={"labels": {"team": "other"}})
    theirs = response.json()["id"]
    job_id = api.get(f"/v1/runs/{mine}").json()["jobs"][0]["id"]
    for url in (
        f"/v1/runs/{mine}",
        f"/v1/runs/{mine}/report",
        f"/v1/runs/{mine}/steps",
        f"/v1/jobs/{job_id}",
        f"/v1/compare?base={mine}&head={theirs}",
    ):
        assert _error(api.get(url, who="other"), 404)["code"] == "not_found", url
    upload = api.client.post(
        f"/v1/runs/{mine}/files", headers=api.headers("other"), files=[("file", ("x.log", b"NCCL INFO x"))]
    )
    assert _error(upload, 404)
    assert [r["id"] for r in api.get("/v1/runs", who="other").json()["runs"]] == [theirs]
    assert theirs not in [r["id"] for r in api.get("/v1/runs").json()["runs"]]
    assert api.get("/v1/phases", who="other").json()["phases"] == []


def test_oversized_upload_is_413_with_the_limit(tmp_path: Path, database_url: str | None) -> None:
    settings = Settings(data_dir=tmp_path / "d", database_url=database_url, max_file_bytes=200_000, workers=1)
    with TestClient(create_app(settings)) as client:
        tokens = make_tokens(client.app.state.ctx)  # type: ignore[attr-defined]
        headers = {"Authorization": f"Bearer {tokens['uploader']}"}
        run_id = client.post("/v1/runs", headers=headers, json={}).json()["id"]
        big = (P2P / "cap_0.sqlite.gz").read_bytes()  # 343 kB
        error = _error(client.post(f"/v1/runs/{run_id}/files", headers=headers, files=[("file", ("c.gz", big))]), 413)
        assert "200000 bytes" in error["message"] and error["code"] == "too_large"
        raw = client.post(
            f"/v1/runs/{run_id}/files",
            headers={**headers, "Content-Type": "application/octet-stream"},
            params={"name": "c.gz"},
            content=big,
        )
        assert _error(raw, 413)
        assert client.get(f"/v1/runs/{run_id}", headers=headers).json()["files"] == []
        leftovers = [p for p in (settings.data_dir / "blobs").rglob("*") if p.is_file()]
        assert leftovers == []  # nothing half-written kept


def test_request_limit_answers_before_reading(tmp_path: Path, database_url: str | None) -> None:
    settings = Settings(data_dir=tmp_path / "d", database_url=database_url, max_request_bytes=1000, workers=1)
    with TestClient(create_app(settings)) as client:
        tokens = make_tokens(client.app.state.ctx)  # type: ignore[attr-defined]
        headers = {"Authorization": f"Bearer {tokens['uploader']}"}
        run_id = client.post("/v1/runs", headers=headers, json={}).json()["id"]
        response = client.post(f"/v1/runs/{run_id}/files", headers=headers, files=[("file", ("a.log", b"x" * 5000))])
        assert "limit of 1000 bytes" in _error(response, 413)["message"]


def test_wrong_content_is_415(api: Api) -> None:
    run_id = api.new_run()
    error = _error(api.upload_bytes(run_id, "notes.txt", b"just some text\nnothing to see\n"), 415)
    assert error["code"] == "unsupported_format" and error["message"].startswith("notes.txt:")
    form = api.post(f"/v1/runs/{run_id}/files", data={"a": "b"})
    assert _error(form, 415)


def test_corrupt_sqlite_is_422(api: Api, unpacked: object) -> None:
    good = unpacked(P2P / "cap_0.sqlite.gz").read_bytes()  # type: ignore[operator]
    damaged = bytearray(good)
    damaged[len(damaged) // 2 : len(damaged) // 2 + 4096] = b"\xa5" * 4096
    run_id = api.new_run()
    error = _error(api.upload_bytes(run_id, "damaged.sqlite", bytes(damaged)), 422)
    assert error["code"] == "invalid_input" and "damaged.sqlite" in error["message"]
    truncated = gzip.compress(good)[:-5000]
    assert "gzip" in _error(api.upload_bytes(run_id, "cut.sqlite.gz", truncated), 422)["message"]


def test_sqlite_with_views_for_nsys_tables_is_422(api: Api, tmp_path: Path) -> None:
    path = tmp_path / "disguised.sqlite"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE real_strings (id INTEGER, value TEXT)")
        conn.execute("CREATE VIEW StringIds AS SELECT id, value FROM real_strings")
        conn.execute("CREATE TABLE other (start INT, end INT)")
        conn.execute("CREATE VIEW CUPTI_ACTIVITY_KIND_KERNEL AS SELECT start, end FROM other")
    error = _error(api.upload_bytes(api.new_run(), "disguised.sqlite", path.read_bytes()), 422)
    assert "CUPTI_ACTIVITY_KIND_KERNEL, StringIds" in error["message"] and "views" in error["message"]


def test_archive_escaping_its_root_is_422(api: Api) -> None:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        data = (P2P / "nccl.vm.1734.log").read_bytes()
        for name in ("ok/nccl.log", "../../etc/cron.d/evil"):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    run_id = api.new_run()
    error = _error(api.upload_bytes(run_id, "evil.tar", buffer.getvalue()), 422)
    assert "'../../etc/cron.d/evil' points outside the archive" in error["message"]
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("/abs/nccl.log", data)
    assert "outside the archive" in _error(api.upload_bytes(run_id, "evil.zip", zipped.getvalue()), 422)["message"]
    linked = io.BytesIO()
    with tarfile.open(fileobj=linked, mode="w") as tar:
        info = tarfile.TarInfo("passwd")
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(info)
    assert "link" in _error(api.upload_bytes(run_id, "link.tar", linked.getvalue()), 422)["message"]
    assert api.get(f"/v1/runs/{run_id}").json()["files"] == []
    assert not any(Path("/etc/cron.d/evil").parent.glob("evil"))


def test_failed_analysis_keeps_what_was_stored(api: Api, tmp_path: Path) -> None:
    """A job that fails (here: the row limit for untrusted SQLite) records its error; the run's
    earlier verdict, steps and files stay."""
    captures = ["cap_0.sqlite.gz", "cap_1.sqlite.gz"]
    run_id = api.analysed(P2P, captures)
    before = api.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert before and api.get(f"/v1/runs/{run_id}").json()["verdict"] == "warn"
    api.ctx.settings.max_rows = 1000  # the next analysis reads files with ~17k event rows each
    job = api.post(f"/v1/runs/{run_id}/analyze", params={"profile": "h200-nvlink"}).json()["job"]
    failed = api.wait(job["url"])
    assert failed["status"] == "failed" and failed["error"]["code"] == "no_usable_input"
    assert "more than the limit of 1,000" in failed["error"]["message"]
    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "failed" and run["verdict"] == "warn"
    assert api.get(f"/v1/runs/{run_id}/steps").json()["steps"] == before
    assert len(run["files"]) == len(captures)
    assert api.get(f"/v1/runs/{run_id}/report").json()["verdict"] == "warn"


def test_bad_parameters_are_422_with_a_message(api: Api) -> None:
    run_id = api.new_run()
    assert "label" in _error(api.post("/v1/runs", json={"labels": {"bad key!": "x"}}), 422)["message"]
    assert _error(api.post("/v1/runs", json={"surprise": 1}), 422)["code"] == "invalid_request"
    assert (
        "rank"
        in _error(api.post(f"/v1/runs/{run_id}/files", params={"rank": "x"}, files=[("file", ("a", b"a"))]), 422)[
            "message"
        ]
    )
    assert _error(api.get("/v1/runs", params={"limit": 0}), 422)
    assert _error(api.get(f"/v1/runs/{run_id}/report"), 409)["code"] == "not_ready"
    assert _error(api.post(f"/v1/runs/{run_id}/analyze"), 422)["message"].startswith(f"run {run_id} has no files")


@pytest.mark.parametrize("body", [b"", b"\x1f\x8b\x08\x00garbage"])
def test_empty_or_broken_gzip(api: Api, body: bytes) -> None:
    assert _error(api.upload_bytes(api.new_run(), "x.gz", body), 422)


def test_report_of_a_run_whose_only_analysis_failed(api: Api) -> None:
    run_id = api.new_run()
    broken = b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1'
    response = api.upload_bytes(run_id, "rank0.trace.json", broken)
    assert response.status_code == 202, response.text
    job = api.wait(response.json()["job"]["url"])
    assert job["status"] == "failed" and job["error"]["code"] == "no_usable_input"
    error = _error(api.get(f"/v1/runs/{run_id}/report"), 409)
    assert error["code"] == "analysis_failed" and f"/v1/jobs/{job['id']}" in error["hint"]
