"""The HTTP API fuzzed from its own OpenAPI document (schemathesis) against a live ``traceguard serve``
on loopback, on embedded SQLite and on the machine's PostgreSQL.

Every generated request (valid ones, and invalid ones for the negative phase) must get an answer
that is no 5xx, whose status the document declares and whose body matches the declared schema;
every route but :data:`api.errors.PUBLIC_PATHS` refuses a request without a valid token (401/403).

CI budget: ``TRACEGUARD_API_FUZZ_EXAMPLES`` cases per operation and phase (default 12, about a
minute for both engines); the long manual run sets it to 500.
"""

from __future__ import annotations

import os
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from api.errors import PUBLIC_PATHS
from tests.service.conftest import postgres_database
from tests.service.live import LiveServer

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is in the dev extra")
from schemathesis import GenerationMode  # noqa: E402
from schemathesis.checks import (  # noqa: E402
    content_type_conformance,
    not_a_server_error,
    response_schema_conformance,
    status_code_conformance,
)

EXAMPLES = int(os.environ.get("TRACEGUARD_API_FUZZ_EXAMPLES", "12"))
POSITIVE_CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
#: Invalid requests: never a 5xx, and only declared statuses.
NEGATIVE_CHECKS = [not_a_server_error, status_code_conformance]


@pytest.fixture(scope="module", params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def server(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    databases = postgres_database() if request.param == "postgresql" else iter([None])
    url = next(databases)
    live = LiveServer(tmp_path_factory.mktemp(f"api-fuzz-{request.param}") / "data", database_url=url)
    live.env["TRACEGUARD_WORKERS"] = "1"
    live.start()
    try:
        yield live
    finally:
        live.stop()
        for _ in databases:  # drops the PostgreSQL database
            pass


def _auth(server: LiveServer) -> dict[str, str]:
    assert server.admin_token, server.output()[-2000:]
    return {"Authorization": f"Bearer {server.admin_token}"}


def _seed_run(server: LiveServer) -> int:
    """One run with a real capture, so that generated run ids sometimes name something."""
    response = httpx.post(f"{server.url}/v1/runs", json={"name": "fuzz"}, headers=_auth(server), timeout=30)
    assert response.status_code == 201, response.text
    return response.json()["id"]


@pytest.mark.slow
def test_api_answers_match_its_openapi_document(server: LiveServer) -> None:
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json")
    auth = _auth(server)
    run_id = _seed_run(server)
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 15, [op.label for op in operations]
    for operation in operations:
        for mode, checks in ((GenerationMode.POSITIVE, POSITIVE_CHECKS), (GenerationMode.NEGATIVE, NEGATIVE_CHECKS)):
            has_input = operation.get_request_payload_content_types() or list(operation.iter_parameters())
            if mode is GenerationMode.NEGATIVE and not has_input:
                continue  # nothing to make invalid
            ids: dict[str, Any] = {}
            if "{run_id}" in operation.path:
                ids["run_id"] = st.sampled_from([run_id, 0, 2**31])
            if "{token_id}" in operation.path:  # never the tokens this suite authenticates with
                ids["token_id"] = st.integers(min_value=10**6, max_value=2**31)
            if ids and mode is GenerationMode.POSITIVE:
                strategy = operation.as_strategy(generation_mode=mode, path_parameters=ids)
            else:
                strategy = operation.as_strategy(generation_mode=mode)
            try:
                _fuzz(server.url, auth, strategy, checks, mode.value, statuses)
            except BaseExceptionGroup as exc:  # collect every operation's failure, not just the first
                failures.append(f"{operation.label} [{mode.value}]: {str(exc.exceptions)[:1500]}")
            except Exception as exc:
                failures.append(f"{operation.label} [{mode.value}]: {str(exc)[:1500]}")
    log = server.output()
    assert "Traceback" not in log, log[-4000:]
    print(f"\nAPI fuzz on {server.database_url or 'sqlite'}: {sum(statuses.values())} requests, {dict(statuses)}")
    assert not failures, "\n\n".join(failures)


def _fuzz(
    url: str, auth: dict[str, str], strategy: Any, checks: list[Any], mode: str, statuses: Counter[str]
) -> None:
    @settings(
        max_examples=EXAMPLES, derandomize=True, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=strategy)
    def exercise(case: Any) -> None:
        response = case.call(base_url=url, headers=auth, timeout=60)
        statuses[f"{mode} {response.status_code}"] += 1
        case.validate_response(response, checks=checks)

    exercise()


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def test_every_route_but_the_public_ones_needs_a_token(server: LiveServer) -> None:
    spec = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    checked = 0
    for path, operations in spec["paths"].items():
        for method in operations:
            for headers in ({}, {"Authorization": "Bearer tg_not-a-real-token"}, {"Authorization": "Basic eDp5"}):
                response = httpx.request(method.upper(), f"{server.url}{_concrete(path)}", headers=headers, timeout=30)
                if path in PUBLIC_PATHS:
                    assert response.status_code < 400, (method, path, response.status_code)
                else:
                    assert response.status_code in (401, 403), (method, path, headers, response.status_code)
                    assert response.json()["error"]["code"] in ("unauthorized", "forbidden"), response.text
                checked += 1
    assert checked >= 3 * 17


def test_uploads_never_answer_500(server: LiveServer, tmp_path: Path) -> None:
    """Bodies no schema describes: raw bytes of every kind, broken multipart, lying headers."""
    auth = _auth(server)
    run_id = _seed_run(server)
    url = f"{server.url}/v1/runs/{run_id}/files"
    bodies: list[dict[str, Any]] = [
        {"content": b"", "params": {"name": "empty.bin"}},
        {"content": b"\x1f\x8b\x08\x00garbage", "params": {"name": "x.gz"}},
        {"content": b"SQLite format 3\x00" + bytes(200), "params": {"name": "x.sqlite"}},
        {"content": b"PK\x03\x04" + bytes(40), "params": {"name": "x.zip"}},
        {"content": b'{"traceEvents": [\xff]}', "params": {"name": "x.json"}},
        {
            "content": b"--b\r\nContent-Disposition: form-data\r\n\r\nx\r\n--b--",
            "headers": {"Content-Type": "multipart/form-data; boundary=b"},
        },
        {"content": b"garbage", "headers": {"Content-Type": "multipart/form-data; boundary=zz"}},
        {"content": b"x", "headers": {"Content-Type": "multipart/form-data"}},
        {"content": b"x", "headers": {"Content-Type": "text/plain"}},
        {"content": b"abc", "params": {"name": "x", "rank": "-1"}},
        {"content": b"abc", "params": {"name": "x", "rank": "\u0661"}},
        {"content": b"abc", "params": {"name": "\x00/../../etc/passwd"}},
    ]
    for body in bodies:
        headers = {**auth, **body.get("headers", {})}
        response = httpx.post(url, content=body["content"], params=body.get("params"), headers=headers, timeout=60)
        assert response.status_code < 500, (body, response.status_code, response.text)
        if response.status_code >= 400:
            assert set(response.json()["error"]) >= {"code", "message"}, response.text


def test_an_upload_cut_short_is_not_an_internal_error(server: LiveServer) -> None:
    """The client hangs up mid-body: the partial file is dropped, the log holds no traceback."""
    run_id = _seed_run(server)
    head = (
        f"POST /v1/runs/{run_id}/files?name=cut.json HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {server.admin_token}\r\nContent-Type: application/octet-stream\r\n"
        "Content-Length: 1000000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head.encode() + b'{"traceEvents": [' + b" " * 5000)
        time.sleep(0.5)
    time.sleep(2)  # the server notices the closed connection at its next read
    run = httpx.get(f"{server.url}/v1/runs/{run_id}", headers=_auth(server), timeout=30).json()
    assert run["files"] == [], run
    assert "Traceback" not in server.output() and "internal error" not in server.output(), server.output()[-3000:]
