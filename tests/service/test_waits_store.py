"""Who waits for whom in the store and the API, on SQLite and PostgreSQL: each step's wait /
transfer split, GPU time breakdown and lateness in ``steps`` rows; each rank's split, last arrivals
and clock in ``rank_results``; bandwidth from transfer time in ``collectives``; the same through
``GET /v1/runs/{id}/steps`` and ``/links``. Expected values come from the CLI's own analysis of the
same files (the report), and the rows from plain SQL. Migration 0006 adds the columns to a store
that already holds results (old rows: null) and is undone cleanly.
"""

from __future__ import annotations

import pytest
from alembic import command
from sqlalchemy import inspect, text

from tests.service.conftest import H200, Api
from traceguard.pipeline import analyze
from traceguard.settings import Settings
from traceguard.store.db import alembic_config, make_engine
from traceguard.store.results import WAIT_STEP_COLUMNS

RUN = H200 / "p2p_nsys_bucket25"
FILES = ["cap_0.sqlite.gz", "cap_1.sqlite.gz", "nccl.vm.694.log", "nccl.vm.697.log", "dmon.txt"]
RANK_COLUMNS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "last_arrivals",
    "last_arrivals_of",
    "median_late_ns",
    "is_late_rank",
    "clock_offset_ns",
    "clock_residual_ns",
)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return analyze([str(RUN)]).report


def _expected_steps(report: dict) -> list[tuple]:
    return [
        (r["rank"], i, *(s[c] for c in WAIT_STEP_COLUMNS)) for r in report["ranks"] for i, s in enumerate(r["steps"])
    ]


def _close(a: list[tuple], b: list[tuple]) -> bool:
    """Equal, floats to 1e-9 relative (PostgreSQL's double precision round-trips them anyway)."""
    return len(a) == len(b) and all(
        len(x) == len(y)
        and all(u == pytest.approx(v, rel=1e-9) if isinstance(v, float) else u == v for u, v in zip(x, y, strict=True))
        for x, y in zip(a, b, strict=True)
    )


def test_waits_in_the_store_and_the_api(api: Api, report: dict) -> None:
    assert report["run"]["late_rank"]["rank"] == 0  # the capture's story: rank 0 late at 110 of 111
    run_id = api.analysed(RUN, FILES, name="bucket25")

    # Plain SQL: the steps rows, the ranks' rows, the collectives' rows.
    with api.ctx.engine.connect() as db:
        steps = [
            tuple(row)
            for row in db.execute(
                text(
                    f"SELECT rank, step_index, {', '.join(WAIT_STEP_COLUMNS)} FROM steps WHERE run_id = :r "
                    "ORDER BY rank, step_index"
                ),
                {"r": run_id},
            )
        ]
        ranks = [
            tuple(row)
            for row in db.execute(
                text(f"SELECT rank, {', '.join(RANK_COLUMNS)} FROM rank_results WHERE run_id = :r ORDER BY rank"),
                {"r": run_id},
            )
        ]
        collectives = [
            tuple(row)
            for row in db.execute(
                text(
                    "SELECT rank, collective, msg_bytes, transfer_median_ns, matched, bandwidth_time FROM collectives "
                    "WHERE run_id = :r ORDER BY rank, id"
                ),
                {"r": run_id},
            )
        ]
        late = db.execute(text("SELECT rank FROM rank_results WHERE run_id = :r AND is_late_rank"), {"r": run_id}).all()
    expected = _expected_steps(report)
    assert expected and all(v is not None for row in expected for v in row)  # every field known here
    assert _close(steps, expected)
    clocks = {c["rank"]: c for c in report["run"]["clock_alignment"]["ranks"]}
    expected_ranks = [
        (
            r["rank"],
            r["metrics"]["nccl_wait_ns"],
            r["metrics"]["nccl_transfer_ns"],
            r["metrics"]["nccl_wait_share"],
            r["metrics"]["last_arrivals"]["count"],
            r["metrics"]["last_arrivals"]["of"],
            r["metrics"]["last_arrivals"]["median_late_ns"],
            r["rank"] == 0,
            clocks[r["rank"]]["offset_ns"],
            clocks[r["rank"]]["residual_ns"],
        )
        for r in report["ranks"]
    ]
    assert _close(ranks, expected_ranks)
    assert [tuple(x) for x in late] == [(0,)]
    assert _close(
        collectives,
        [
            (c["rank"], c["collective"], c["msg_bytes"], c["transfer_median_ns"], c["matched"], c["bandwidth_time"])
            for r in report["ranks"]
            for c in r["collectives"]
        ],
    )
    assert {c[5] for c in collectives} == {"transfer"}

    # GET /steps: the same fields, row for row.
    body = api.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert _close([(s["rank"], s["step_index"], *(s[c] for c in WAIT_STEP_COLUMNS)) for s in body], expected)
    only = api.get(f"/v1/runs/{run_id}/steps", params={"rank": 1, "from_step": 1, "to_step": 1}).json()["steps"]
    assert [(s["rank"], s["step_index"], s["lateness_ns"], s["idle_host_ns"]) for s in only] == [
        (1, 1, report["ranks"][1]["steps"][1]["lateness_ns"], report["ranks"][1]["steps"][1]["idle_host_ns"])
    ]

    # GET /links: per rank wait / transfer, last arrivals and clock; the late rank; transfer bandwidth.
    links = api.get(f"/v1/runs/{run_id}/links").json()
    assert links["late_rank"] == 0
    assert _close([(w["rank"], *(w[c] for c in RANK_COLUMNS)) for w in links["waits"]], expected_ranks)
    assert all(w["null_reason"] is None for w in links["waits"])
    assert [(c["transfer_median_ns"], c["matched"], c["bandwidth_time"]) for c in links["collectives"]] == [
        (c["transfer_median_ns"], c["matched"], c["bandwidth_time"]) for r in report["ranks"] for c in r["collectives"]
    ]
    one = api.get(f"/v1/runs/{run_id}/links", params={"rank": 1}).json()
    assert [w["rank"] for w in one["waits"]] == [1] and one["late_rank"] == 0  # the run's late rank, still


def test_a_single_rank_run_stores_nulls_with_the_reason(api: Api) -> None:
    run_id = api.analysed(H200 / "p2p_nsys", ["cap_0.sqlite.gz"], name="one rank")
    steps = api.get(f"/v1/runs/{run_id}/steps").json()["steps"]
    assert steps and all(s["nccl_wait_ns"] is None and s["lateness_ns"] is None for s in steps)
    assert all(s["period_ns"] is not None and s["compute_ns"] is not None for s in steps)  # one rank still has these
    links = api.get(f"/v1/runs/{run_id}/links").json()
    assert links["late_rank"] is None
    assert [(w["rank"], w["nccl_wait_ns"], w["is_late_rank"]) for w in links["waits"]] == [(0, None, None)]
    assert links["waits"][0]["null_reason"] == "needs at least two ranks"


def test_migration_0006_on_a_store_with_results(settings: Settings) -> None:
    """At 0005 with a step row, upgrade to head: the new columns exist and are null in old rows;
    downgrading to 0005 removes them and keeps the row."""
    engine = make_engine(settings.url)
    try:
        config = alembic_config(engine)
        command.upgrade(config, "0005")
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
        command.upgrade(config, "head")
        columns = {c["name"] for c in inspect(engine).get_columns("steps")}
        assert set(WAIT_STEP_COLUMNS) <= columns
        assert set(RANK_COLUMNS) <= {c["name"] for c in inspect(engine).get_columns("rank_results")}
        with engine.connect() as db:
            row = db.execute(text(f"SELECT nccl_ns, {', '.join(WAIT_STEP_COLUMNS)} FROM steps")).one()
        assert tuple(row) == (5, *([None] * len(WAIT_STEP_COLUMNS)))
        command.downgrade(config, "0005")
        assert not set(WAIT_STEP_COLUMNS) & {c["name"] for c in inspect(engine).get_columns("steps")}
        with engine.connect() as db:
            assert db.execute(text("SELECT name, nccl_ns FROM steps")).one() == ("Batch 1", 5)
    finally:
        engine.dispose()
