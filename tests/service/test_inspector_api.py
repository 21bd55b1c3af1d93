"""NCCL Inspector logs through the API, on SQLite and PostgreSQL: ``POST /v1/runs/{id}/inspector``
(a long job's logs sent as they grow: windows added, a stored one replaced only by more of its
lines, nothing duplicated, nothing lost on bad input) and ``GET /v1/runs/{id}/inspector``.

The job is the real ``--slow-rank 1:30`` run on 2×H200 (tests/fixtures/h200x2_inspector/slow_default,
rank 1 late); its 2-s logs fill one 60-s window, so the job "grows" as the plugin would have kept
writing: the same lines again, 120 s later (dump timestamps + 120 s, sequence numbers continued),
appended to each rank's file. Expected values come from plain ``json.loads`` of those lines
(instances matched on both ranks, their lines and wait / transfer per window, docs/inspector.md)
and from the CLI's analysis of the same files (the JSON report), never from the route's output."""

from __future__ import annotations

import gzip
import io
import json
import tarfile
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import OWN
from tests.service.conftest import Api
from traceguard.pipeline import analyze
from traceguard.store.db import transaction
from traceguard.store.results import inspector_windows, merge_inspector_windows

SLOW = OWN / "h200x2_inspector" / "slow_default"
SHIFT_S = 120
SN_OFFSET = 1_000_000
WINDOW_S = 60
WINDOW_COLUMNS = ("window_start_s", "instances", "lines", "wait_ns", "transfer_ns", "late_rank", "last_arrivals")


def _lines(path: Path) -> list[bytes]:
    return gzip.decompress(path.read_bytes()).splitlines(keepends=True)


def _later(line: bytes) -> bytes:
    """The same collective as the plugin would log it 120 s later, further on in the job."""
    doc = json.loads(line)
    doc["metadata"]["dump_timestamp_us"] += SHIFT_S * 1_000_000
    doc["coll_perf"]["coll_sn"] += SN_OFFSET
    return json.dumps(doc).encode() + b"\n"


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    """Per stage, file name → bytes: ``early`` (rank 0's log cut at 300 of its 561 lines, rank 1's
    whole: two files growing at their own pace), ``first`` (both whole: the real run), ``grown``
    (each file with the 120-s-later lines appended: ``first`` is a byte prefix of it)."""
    stages: dict[str, dict[str, bytes]] = {"early": {}, "first": {}, "grown": {}}
    for path in sorted((SLOW / "inspector").glob("*.log.gz")):
        name = path.name.removesuffix(".gz")
        lines = _lines(path)
        stages["first"][name] = b"".join(lines)
        stages["grown"][name] = b"".join(lines) + b"".join(_later(line) for line in lines)
        stages["early"][name] = b"".join(lines[:300]) if name.endswith("2741.log") else b"".join(lines)
    return stages


def _plain_windows(files: dict[str, bytes]) -> dict[int, dict[str, int]]:
    """docs/inspector.md by hand: instances (comm id, coll, coll_sn) written by all their n_ranks,
    placed by their earliest dump timestamp; per window instances, lines, wait and transfer."""
    instances: dict[tuple, list[dict]] = defaultdict(list)
    for data in files.values():
        for line in data.splitlines():
            doc = json.loads(line)
            perf = doc["coll_perf"]
            instances[(doc["header"]["id"], perf["coll"], perf["coll_sn"])].append(doc)
    windows: dict[int, dict[str, int]] = defaultdict(
        lambda: {"instances": 0, "lines": 0, "wait_ns": 0, "transfer_ns": 0}
    )
    for members in instances.values():
        n_ranks = members[0]["header"]["n_ranks"]
        if len(members) != n_ranks or len({m["header"]["rank"] for m in members}) != n_ranks:
            continue
        execs = [m["coll_perf"]["coll_exec_time_us"] * 1000 for m in members]
        start = min(m["metadata"]["dump_timestamp_us"] for m in members) // (WINDOW_S * 1_000_000) * WINDOW_S
        window = windows[start]
        window["instances"] += 1
        window["lines"] += n_ranks
        window["wait_ns"] += sum(execs) - n_ranks * min(execs)
        window["transfer_ns"] += n_ranks * min(execs)
    return dict(windows)


def _report(files: dict[str, bytes], folder: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(folder.parent / "tg-cache"))
    return analyze([str(folder)]).report


def _tar(files: dict[str, bytes], folder: str = "inspector") -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(f"{folder}/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _send(api: Api, run_id: int, parts: list[tuple[str, bytes]]) -> dict:
    response = api.post(f"/v1/runs/{run_id}/inspector", files=[("file", part) for part in parts])
    assert response.status_code == 202, response.text
    body = response.json()
    job = api.wait(body["job"]["url"])
    assert job["status"] == "succeeded", job
    return body


def _windows(api: Api, run_id: int) -> list[tuple]:
    body = api.get(f"/v1/runs/{run_id}/inspector").json()
    return [tuple(w[c] for c in WINDOW_COLUMNS) for w in body["windows"]]


def _expected(report: dict) -> list[tuple]:
    return [tuple(w[c] for c in WINDOW_COLUMNS) for w in report["inspector"]["windows"]]


def test_logs_sent_as_they_grow(api: Api, logs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    grown_report = _report(logs["grown"], tmp_path / "grown", monkeypatch)
    early_report = _report(logs["early"], tmp_path / "early", monkeypatch)
    plain_early, plain_grown = _plain_windows(logs["early"]), _plain_windows(logs["grown"])
    assert len(plain_early) == 1 and len(plain_grown) == 2  # the job's first minute, then 2 minutes later
    first_start = min(plain_grown)
    assert plain_early[first_start]["lines"] < plain_grown[first_start]["lines"]  # rank 0's file was behind

    run_id = api.new_run(name="long job")
    empty = api.get(f"/v1/runs/{run_id}/inspector").json()
    assert empty == {"run_id": run_id, "window_s": None, "windows": [], "summary": None}

    # 1. The logs so far, one file per part.
    _send(api, run_id, [(name, data) for name, data in logs["early"].items()])
    body = api.get(f"/v1/runs/{run_id}/inspector").json()
    assert _windows(api, run_id) == _expected(early_report)
    [window] = body["windows"]
    assert body["window_s"] == window["window_s"] == WINDOW_S
    assert {k: window[k] for k in ("instances", "lines", "wait_ns", "transfer_ns")} == plain_early[first_start]

    # 2. The grown logs, as the dump directory tarred: the first window is replaced (more of its
    # lines), the new one added.
    sent = _send(api, run_id, [("inspector.tar.gz", _tar(logs["grown"]))])
    assert sent["skipped"] == []
    body = api.get(f"/v1/runs/{run_id}/inspector").json()
    assert _windows(api, run_id) == _expected(grown_report)
    assert [w["window_start_s"] for w in body["windows"]] == sorted(plain_grown)
    for w in body["windows"]:
        assert {k: w[k] for k in ("instances", "lines", "wait_ns", "transfer_ns")} == plain_grown[w["window_start_s"]]
        assert w["late_rank"] == 1  # the slowed rank, in every window
    summary = body["summary"]
    metrics = grown_report["inspector"]["metrics"]
    assert summary["late_rank"] == metrics["late_rank"] == 1
    assert summary["nccl_wait_ns"] == metrics["nccl_wait_ns"]
    assert summary["nccl_transfer_ns"] == metrics["nccl_transfer_ns"]
    assert summary["collective_instances_matched"] == sum(w["instances"] for w in plain_grown.values())
    assert [r["rank"] for r in summary["ranks"]] == [0, 1]
    only = api.get(f"/v1/runs/{run_id}/inspector", params={"rank": 1}).json()["summary"]["ranks"]
    assert [r["rank"] for r in only] == [1]
    assert only[0]["nccl_wait_ns"] == grown_report["inspector"]["ranks"][1]["nccl_wait_ns"]

    # 3. The same logs again, and the older copies again: nothing changes, nothing is duplicated.
    before = api.get(f"/v1/runs/{run_id}/inspector").json()
    files_before = api.get(f"/v1/runs/{run_id}").json()["files"]
    again = _send(api, run_id, [("inspector.tar.gz", _tar(logs["grown"]))])
    assert sorted(again["duplicates"]) == sorted(sent_file["id"] for sent_file in sent["files"])
    assert again["job"]["id"] == sent["job"]["id"]  # the same input set: the same job
    _send(api, run_id, [(name, data) for name, data in logs["early"].items()])
    assert api.get(f"/v1/runs/{run_id}/inspector").json() == before
    assert api.get(f"/v1/runs/{run_id}").json()["files"] == files_before


def test_a_window_is_replaced_only_by_more_of_its_lines(
    api: Api, logs, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store's rule on its own, with the reports of the grown logs and of the early ones: the
    early report (fewer lines in the first window, no second) changes nothing once the grown one
    is stored; the other way round, it is replaced and completed."""
    grown = _report(logs["grown"], tmp_path / "grown", monkeypatch)["inspector"]
    early = _report(logs["early"], tmp_path / "early", monkeypatch)["inspector"]
    first, second = api.new_run(), api.new_run()
    with transaction(api.ctx.factory) as session:
        assert merge_inspector_windows(session, first, grown) == {"added": 2, "replaced": 0, "kept": 0}
        assert merge_inspector_windows(session, first, early) == {"added": 0, "replaced": 0, "kept": 1}
        assert merge_inspector_windows(session, second, early) == {"added": 1, "replaced": 0, "kept": 0}
        assert merge_inspector_windows(session, second, grown) == {"added": 1, "replaced": 1, "kept": 0}
        assert merge_inspector_windows(session, second, grown) == {"added": 0, "replaced": 0, "kept": 2}
    with api.ctx.factory() as session:
        for run_id in (first, second):
            rows = [tuple(getattr(w, c) for c in WINDOW_COLUMNS) for w in inspector_windows(session, run_id)]
            assert rows == [tuple(w[c] for c in WINDOW_COLUMNS) for w in grown["windows"]]


def test_bad_input_is_refused_and_loses_nothing(api: Api, logs) -> None:
    run_id = api.new_run()
    _send(api, run_id, [(name, data) for name, data in logs["first"].items()])
    before = api.get(f"/v1/runs/{run_id}/inspector").json()
    files_before = api.get(f"/v1/runs/{run_id}").json()["files"]
    assert len(before["windows"]) == 1
    name, data = next(iter(logs["first"].items()))
    refused = {
        # not an Inspector log: an NCCL_DEBUG log of the same run
        "nccl.vm.2741.log.gz": (415, (SLOW / "nccl.vm.2741.log.gz").read_bytes(), "not NCCL Inspector logs"),
        # an output format this reader does not know
        "newer.log": (415, data.replace(b'"v4.0"', b'"v9.1"'), "v9.1"),
        # the first line of an Inspector log, cut short: no line can be read
        "cut.log": (422, data.split(b"\n", 1)[0][:200], "no complete NCCL Inspector line"),
        # an archive with no Inspector log in it
        "bundle.tar.gz": (422, _tar({"topo.txt": (SLOW / "topo.txt").read_bytes()}), "holds no NCCL Inspector logs"),
        # one good file and one bad: the request is refused whole
        "mixed": (415, None, "v9.1"),
    }
    for label, (status, body, words) in refused.items():
        parts = (
            [("file", (name, data)), ("file", ("newer.log", data.replace(b'"v4.0"', b'"v9.1"')))]
            if body is None
            else [("file", (label, body))]
        )
        response = api.post(f"/v1/runs/{run_id}/inspector", files=parts)
        assert response.status_code == status, (label, response.text)
        assert words in response.json()["error"]["message"], (label, response.json())
    assert api.get(f"/v1/runs/{run_id}/inspector").json() == before
    assert api.get(f"/v1/runs/{run_id}").json()["files"] == files_before


def test_inspector_routes_are_the_project_s(api: Api, logs) -> None:
    run_id = api.new_run()
    assert api.get(f"/v1/runs/{run_id}/inspector", who="other").status_code == 404
    assert api.get("/v1/runs/999999/inspector").status_code == 404
    name, data = next(iter(logs["first"].items()))
    assert api.post(f"/v1/runs/{run_id}/inspector", who="other", files=[("file", (name, data))]).status_code == 404
    assert api.post(f"/v1/runs/{run_id}/inspector", who="reader", files=[("file", (name, data))]).status_code == 403
    assert api.client.get(f"/v1/runs/{run_id}/inspector").status_code == 401
    spec = api.client.get("/openapi.json").json()["paths"]["/v1/runs/{run_id}/inspector"]
    assert set(spec) == {"get", "post"}
    assert spec["get"]["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("InspectorTables")
