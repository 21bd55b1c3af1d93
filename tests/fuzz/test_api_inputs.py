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


def test_kineto_not_utf8_fails_its_job_with_a_message_naming_the_file(api: Api) -> None:
    status, body = _upload(api, KINETO_NOT_UTF8)
    assert status == 202, body  # recognised as a Kineto trace by its first bytes
    job = api.wait(body["job"]["url"])
    assert job["status"] == "failed"
    assert job["error"]["code"] == "no_usable_input"
    message = job["error"]["message"]
    assert KINETO_NOT_UTF8.name in message and "not UTF-8 JSON" in message, message
    assert "UnicodeDecodeError" not in message and "/jobs/" not in message, message


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
