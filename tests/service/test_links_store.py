"""The link counters (nsys GPU metrics) in the store, the API and `traceguard steps`, on SQLite and
PostgreSQL: each step's PCIe and NVLink load in ``steps`` rows; each rank's load during its NCCL
kernels and where NCCL's bytes went in ``rank_results``; the same through ``GET /v1/runs/{id}/steps``
and ``/links``. Expected values come from the CLI's own analysis of the same files (the JSON
report; its link figures are checked against plain SQL on the exports in
tests/report/test_links_chromium.py and the metrics' tests), the rows from plain SQL. A capture
without GPU metrics stores nulls, and the API says why. Migration 0008 adds the columns to a store
that already holds results (old rows: null) and is undone cleanly.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from alembic import command
from sqlalchemy import inspect, text
from typer.testing import CliRunner

from tests.service.conftest import H200, Api
from traceguard.cli import app
from traceguard.cli.query import STEP_HEADERS
from traceguard.pipeline import analyze
from traceguard.settings import Settings
from traceguard.store.db import alembic_config, make_engine
from traceguard.store.results import LINK_RANK_COLUMNS, LINK_STEP_COLUMNS, rank_link_values

LINKS = H200.parent / "h200x2_links"
SHM = LINKS / "shm"
SHM_FILES = [
    "cap_0.sqlite.gz",
    "cap_1.sqlite.gz",
    "nccl.vm.1303.log",
    "nccl.vm.1324.log",
    "dmon.txt",
    "topo.txt",
    "nvidia-smi-q.txt",
]
PLAIN = H200 / "p2p_nsys"
runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return analyze([str(SHM / name) for name in SHM_FILES]).report


def _expected_steps(report: dict) -> list[tuple]:
    return [
        (r["rank"], i, *(s[c] for c in LINK_STEP_COLUMNS)) for r in report["ranks"] for i, s in enumerate(r["steps"])
    ]


def _expected_ranks(report: dict) -> list[tuple]:
    return [(r["rank"], *rank_link_values(r).values()) for r in report["ranks"]]


def _close(a: list[tuple], b: list[tuple]) -> bool:
    """Equal, floats to 1e-9 relative (PostgreSQL's double precision round-trips them anyway)."""
    return len(a) == len(b) and all(
        len(x) == len(y)
        and all(u == pytest.approx(v, rel=1e-9) if isinstance(v, float) else u == v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def test_rank_link_values_read_the_report(report: dict) -> None:
    """The rank columns are the report's rank metrics and its links' device and NCCL split."""
    rank = report["ranks"][0]
    values = rank_link_values(rank)
    assert list(values) == list(LINK_RANK_COLUMNS)
    assert values["pcie_nccl_peak"] == rank["metrics"]["pcie_nccl_peak"]
    assert values["link_device"] == rank["links"]["device"] == 0
    split = rank["links"]["nccl_split"]
    assert (values["link_nccl_ns"], values["nccl_pcie_ns"]) == (split["nccl_ns"], split["pcie_ns"])
    assert set(rank_link_values({"metrics": {}, "links": {"null_reason": "none"}}).values()) == {None}


def test_links_in_the_store_and_the_api(api: Api, report: dict) -> None:
    # The capture's story first: SHM moves the all-reduces' bytes over PCIe.
    assert all(r["metrics"]["nccl_pcie_share"] > 0.5 and r["links"]["device"] is not None for r in report["ranks"])
    run_id = api.analysed(SHM, SHM_FILES, name="shm links")

    with api.ctx.engine.connect() as db:
        steps = [
            tuple(row)
            for row in db.execute(
                text(
                    f"SELECT rank, step_index, {', '.join(LINK_STEP_COLUMNS)} FROM steps WHERE run_id = :r "
                    "ORDER BY rank, step_index"
                ),
                {"r": run_id},
            )
        ]
        ranks = [
            tuple(row)
            for row in db.execute(
                text(f"SELECT rank, {', '.join(LINK_RANK_COLUMNS)} FROM rank_results WHERE run_id = :r ORDER BY rank"),
                {"r": run_id},
            )
        ]
    expected = _expected_steps(report)
    assert expected and all(v is not None for row in expected for v in row)  # every field known here
    assert _close(steps, expected)
    expected_ranks = _expected_ranks(report)
    assert all(v is not None for row in expected_ranks for v in row)
    assert _close(ranks, expected_ranks)

    # GET /steps: the same fields, row for row; a window of one rank and step.
    body = api.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert _close([(s["rank"], s["step_index"], *(s[c] for c in LINK_STEP_COLUMNS)) for s in body], expected)
    only = api.get(f"/v1/runs/{run_id}/steps", params={"rank": 1, "from_step": 1, "to_step": 1}).json()["steps"]
    step = report["ranks"][1]["steps"][1]
    assert [(s["rank"], s["step_index"], s["nccl_pcie_avg_pct"]) for s in only] == [(1, 1, step["nccl_pcie_avg_pct"])]

    # GET /links: per rank the NCCL-time figures and split, per step the fields.
    links = api.get(f"/v1/runs/{run_id}/links").json()
    got = [(r["rank"], *(r[c] for c in LINK_RANK_COLUMNS)) for r in links["link_counters"]]
    assert _close(got, expected_ranks)
    assert all(r["null_reason"] is None for r in links["link_counters"])
    assert _close(
        [(s["rank"], s["step_index"], *(s[c] for c in LINK_STEP_COLUMNS)) for s in links["link_steps"]], expected
    )
    assert [s["name"] for s in links["link_steps"]] == [s["name"] for r in report["ranks"] for s in r["steps"]]
    one = api.get(f"/v1/runs/{run_id}/links", params={"rank": 1}).json()
    assert [r["rank"] for r in one["link_counters"]] == [1] and {s["rank"] for s in one["link_steps"]} == {1}


def test_a_capture_without_gpu_metrics_stores_nulls_with_the_reason(api: Api) -> None:
    run_id = api.analysed(PLAIN, ["cap_0.sqlite.gz"], name="no metrics")
    steps = api.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert steps and all(s[c] is None for s in steps for c in LINK_STEP_COLUMNS)
    links = api.get(f"/v1/runs/{run_id}/links").json()
    [row] = links["link_counters"]
    assert all(row[c] is None for c in LINK_RANK_COLUMNS)
    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert row["null_reason"] == report["ranks"][0]["metrics"]["null_reasons"]["pcie_nccl_avg"]
    assert row["null_reason"] and "GPU metrics" in row["null_reason"]


def _cli(*args: str | Path, env: dict[str, str]) -> tuple[int, str]:
    result = runner.invoke(app, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    return result.exit_code, result.stdout


def test_steps_command_shows_the_link_columns_only_where_known(
    tmp_path: Path, database_url: str | None, report: dict
) -> None:
    data = tmp_path / "store"
    env = {"TRACEGUARD_DATABASE_URL": database_url or "", "COLUMNS": "250"}
    for folder in (SHM, PLAIN):
        code, _ = _cli("record", folder, "--data-dir", data, env=env)
        assert code in (0, 1)
    code, stdout = _cli("runs", "--data-dir", data, "-f", "json", env=env)
    ids = sorted(r["id"] for r in json.loads(stdout))
    links, plain = ids  # recorded in that order
    code, stdout = _cli("steps", f"run:{links}", "--data-dir", data, "-f", "json", env=env)
    assert code == 0
    assert _close(
        [(s["rank"], s["step_index"], *(s[c] for c in LINK_STEP_COLUMNS)) for s in json.loads(stdout)],
        _expected_steps(report),
    )
    code, stdout = _cli("steps", f"run:{links}", "--data-dir", data, "-f", "csv", env=env)
    rows = list(csv.DictReader(io.StringIO(stdout)))
    assert _close(
        [(int(r["rank"]), int(r["step_index"]), *(float(r[c]) for c in LINK_STEP_COLUMNS)) for r in rows],
        _expected_steps(report),
    )
    code, stdout = _cli("steps", f"run:{links}", "--rank", "0", "--data-dir", data, env=env)
    assert code == 0
    # Two-line headers (name, then unit): each line is there, and the values as whole percents.
    for header in (STEP_HEADERS[c] for c in LINK_STEP_COLUMNS):
        assert all(part in stdout for part in header.split("\n")), header
    for step in report["ranks"][0]["steps"]:
        assert f"{step['nccl_pcie_avg_pct']:.0f}" in stdout and f"{step['pcie_peak_pct']:.0f}" in stdout
    code, stdout = _cli("steps", f"run:{plain}", "--rank", "0", "--data-dir", data, env=env)
    assert code == 0
    assert "lateness" in stdout and "avg %" not in stdout and "nccl %" not in stdout


def test_migration_0008_on_a_store_with_results(settings: Settings) -> None:
    """At 0007 with a step and a rank row, upgrade to head: the new columns exist and are null in
    old rows; downgrading to 0007 removes them and keeps the rows."""
    engine = make_engine(settings.url)
    try:
        config = alembic_config(engine)
        command.upgrade(config, "0007")
        with engine.begin() as db:
            db.execute(text("INSERT INTO projects (id, name, created_at) VALUES (1, 'p', CURRENT_TIMESTAMP)"))
            db.execute(
                text(
                    "INSERT INTO runs (id, project_id, name, profile, step_patterns, status, created_at, updated_at) "
                    "VALUES (1, 1, 'old', 'production', '[]', 'analysed', CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)"
                )
            )
            db.execute(
                text("INSERT INTO steps (run_id, rank, step_index, name, nccl_ns) VALUES (1, 0, 0, 'Batch 1', 5)")
            )
            db.execute(text("INSERT INTO rank_results (run_id, rank, nccl_time_ns, metrics) VALUES (1, 0, 7, '{}')"))
        command.upgrade(config, "head")
        assert set(LINK_STEP_COLUMNS) <= {c["name"] for c in inspect(engine).get_columns("steps")}
        assert set(LINK_RANK_COLUMNS) <= {c["name"] for c in inspect(engine).get_columns("rank_results")}
        with engine.connect() as db:
            step = db.execute(text(f"SELECT nccl_ns, {', '.join(LINK_STEP_COLUMNS)} FROM steps")).one()
            rank = db.execute(text(f"SELECT nccl_time_ns, {', '.join(LINK_RANK_COLUMNS)} FROM rank_results")).one()
        assert tuple(step) == (5, *([None] * len(LINK_STEP_COLUMNS)))
        assert tuple(rank) == (7, *([None] * len(LINK_RANK_COLUMNS)))
        command.downgrade(config, "0007")
        assert not set(LINK_STEP_COLUMNS) & {c["name"] for c in inspect(engine).get_columns("steps")}
        assert not set(LINK_RANK_COLUMNS) & {c["name"] for c in inspect(engine).get_columns("rank_results")}
        with engine.connect() as db:
            assert db.execute(text("SELECT name, nccl_ns FROM steps")).one() == ("Batch 1", 5)
            assert db.execute(text("SELECT rank, nccl_time_ns FROM rank_results")).one() == (0, 7)
    finally:
        engine.dispose()
