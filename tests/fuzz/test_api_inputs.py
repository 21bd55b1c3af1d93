"""The issue-15 crash classes and the API fuzz findings through the service (TestClient, both store
engines): bad input is 422 at intake, a failed job carries a message a person can act on, and nothing
an uploader sends is answered 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fuzz.targets import REGRESSIONS
from tests.service.conftest import Api
from traceguard.ingest import uploads
from traceguard.service import child

KINETO_NOT_UTF8 = REGRESSIONS / "kineto" / "string_not_utf8.json"
SCHEMA_NOT_UTF8 = REGRESSIONS / "nsys_sqlite" / "schema_text_not_utf8.sqlite.gz"
SCHEMA_UNPARSABLE = REGRESSIONS / "nsys_sqlite" / "schema_text_not_utf8_unparsable.sqlite.gz"
ZIP_UNSUPPORTED = REGRESSIONS / "archive" / "zip_version_unsupported.zip"


def _upload(api: Api, path: Path, **params: str) -> tuple[int, dict]:
    run_id = api.new_run()
    response = api.post(f"/v1/runs/{run_id}/files", files=[("file", (path.name, path.read_bytes()))], params=params)
    return response.status_code, response.json()


def test_sqlite_whose_schema_is_not_utf8_is_refused_with_422(api: Api) -> None:
    status, body = _upload(api, SCHEMA_UNPARSABLE)
    assert status == 422, body
    assert body["error"]["code"] == "invalid_input"
    assert body["error"]["message"].startswith(f"{SCHEMA_UNPARSABLE.name}: ")
    assert "not UTF-8" in body["error"]["message"]


def test_sqlite_with_a_non_utf8_comment_in_its_schema_is_kept_and_analysed(api: Api) -> None:
    status, body = _upload(api, SCHEMA_NOT_UTF8)
    assert status == 202, body
    job = api.wait(body["job"]["url"])
    assert job["status"] == "succeeded", job


def test_kineto_not_utf8_is_analysed_with_a_note_naming_the_file(api: Api) -> None:
    """Issue 15 refused this trace (0xFF 0xFE in a device name) as a failed job; issue 25 reads its
    text defensively: the job succeeds, and the report's input says what was replaced."""
    status, body = _upload(api, KINETO_NOT_UTF8)
    assert status == 202, body  # recognised as a Kineto trace by its first bytes
    job = api.wait(body["job"]["url"])
    assert job["status"] == "succeeded", job
    report = api.get(f"/v1/runs/{job['run_id']}/report", who="admin").json()
    (record,) = report["inputs"]
    assert record["error"] is None
    assert any("not UTF-8" in w and "U+FFFD" in w for w in record["warnings"]), record["warnings"]


def test_damaged_archive_is_422_not_500(api: Api) -> None:
    status, body = _upload(api, ZIP_UNSUPPORTED)
    assert status == 422, body
    assert body["error"]["message"].startswith(f"{ZIP_UNSUPPORTED.name}: ")


def test_a_bug_while_checking_an_upload_refuses_the_file_not_500(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure of the intake's own checks on some content is logged and answered 422, naming the file."""

    def broken(*_args: object, **_kwargs: object) -> None:
        raise KeyError("stands in for a bug the content triggers")

    monkeypatch.setattr("traceguard.service.intake.validate", broken)
    status, body = _upload(api, KINETO_NOT_UTF8)
    assert status == 422, body
    expected = f"{KINETO_NOT_UTF8.name}: the file could not be checked (KeyError) and was not stored"
    assert body["error"]["message"] == expected
    assert uploads.validate is not broken


@pytest.mark.parametrize(
    "url",
    ["/v1/jobs/99999999999999999999", "/v1/runs/9223372036854775808", "/v1/runs/9223372036854775808/steps",
     "/v1/compare?base=9223372036854775808&head=1", "/v1/phases?run_id=9223372036854775808"],
)
def test_ids_wider_than_the_database_are_not_500(api: Api, url: str) -> None:
    """Found by the schemathesis run: ids beyond the store's integer type were a 500 (OverflowError on
    SQLite, NumericValueOutOfRange on PostgreSQL)."""
    response = api.get(url, who="admin")
    assert response.status_code in (404, 422), response.text
    assert response.json()["error"]["code"] in ("not_found", "invalid_request")


def test_an_internal_error_in_the_analysis_is_said_in_words(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The analysis child with a bug in the pipeline (stood in for by a function that divides by zero)."""

    def broken(*_args: object, **_kwargs: object) -> None:
        raise ZeroDivisionError("float division by zero")

    monkeypatch.setattr("traceguard.pipeline.analyze", broken)
    # child.run sets these for its own process; here they are put back after the test.
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TRACEGUARD_MAX_ROWS", "1000")
    spec = {"inputs": [[str(KINETO_NOT_UTF8), None]], "side": {}, "profile": "production",
            "cache_dir": str(tmp_path), "max_rows": 1000, "step_patterns": []}
    error = child.run(spec)["error"]
    assert error["code"] == "analysis_error"
    assert error["message"] == (
        "the analysis stopped on an internal error, a bug in traceguard (ZeroDivisionError: float division by zero)"
    )
    assert error["hint"].startswith("the uploaded files were kept")


def test_a_native_panic_fails_the_job_in_words_and_logs_the_traceback(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 25: a Polars panic in the analysis child escaped its bug handler (a ``BaseException``),
    so the job failed as ``analysis_crashed`` with the raw traceback as its message. The child's real
    panic (a sitecustomize makes the offenders table panic in the child process) is now an internal
    error in one line; the traceback is in the server's log."""
    import logging

    from tests.conftest import REPO
    from tests.fuzz.panic import SITECUSTOMIZE

    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    caplog.set_level(logging.ERROR, logger="traceguard.analysis")
    status, body = _upload(api, KINETO_NOT_UTF8)
    assert status == 202, body
    job = api.wait(body["job"]["url"])
    assert job["status"] == "failed", job
    error = job["error"]
    assert error["code"] == "analysis_error", error
    assert error["message"].startswith(
        "the analysis stopped on an internal error, a bug in traceguard (NativePanic: a native library panicked "
        "(pyo3_runtime.PanicException: "
    ), error
    assert "Traceback" not in error["message"] and "\n" not in error["message"]
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "traceguard.analysis")
    assert "Traceback (most recent call last)" in logged and "PanicException" in logged, logged[-2000:]


_DIES = '''
import os, traceback
import traceguard.metrics.rank as _rank

def _die(*args, **kwargs):
    try:
        1 / 0
    except ZeroDivisionError:
        traceback.print_exc()
    os._exit(1)

_rank._offenders = _die
'''


def test_a_child_that_dies_fails_the_job_with_its_last_line_and_logs_the_rest(
    api: Api, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """An analysis process that ends without a result (here: it prints a traceback and exits 1)
    is ``analysis_crashed``; the job's message holds the stderr's last line, not the traceback,
    which goes to the server's log."""
    import logging

    from tests.conftest import REPO

    (tmp_path / "sitecustomize.py").write_text(_DIES)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    caplog.set_level(logging.ERROR, logger="traceguard.analysis")
    status, body = _upload(api, KINETO_NOT_UTF8)
    assert status == 202, body
    job = api.wait(body["job"]["url"])
    error = job["error"]
    assert (job["status"], error["code"]) == ("failed", "analysis_crashed"), job
    assert error["message"] == (
        "the analysis process ended (exit code 1) without a result: ZeroDivisionError: division by zero "
        "(its output is in the server log)"
    )
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "traceguard.analysis")
    assert "Traceback (most recent call last)" in logged and "_die" in logged, logged[-2000:]
