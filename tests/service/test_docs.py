"""The SQL in docs/service.md runs as written on SQLite and PostgreSQL and answers correctly."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.service.conftest import P2P, P2P_FILES, SHM, SHM_FILES, Api

DOC = Path(__file__).resolve().parents[2] / "docs" / "service.md"


def _queries() -> list[str]:
    return re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)


def test_documented_queries(api: Api) -> None:
    shm = api.analysed(SHM, SHM_FILES, labels={"cluster": "B"}, name="shm")
    p2p = api.analysed(P2P, P2P_FILES, labels={"cluster": "B"}, name="p2p")
    queries = _queries()
    assert len(queries) == 7
    with api.ctx.engine.connect() as db:
        results = [db.execute(text(q)).all() for q in queries]
        phase_sums = db.execute(
            text(
                "SELECT rank, sum(nccl_ns), sum(gpu_ns) FROM phases "
                "WHERE run_id = :r AND phase = 'backward' GROUP BY rank"
            ),
            {"r": shm},
        ).all()
    backward, fallbacks, slowest, late, idle, failing, failed_jobs = results
    assert [(row[0], row[2]) for row in backward] == [(shm, 0), (shm, 1)]  # P2P's backward stays under 40 %
    for (_, _, rank, share), (rank2, nccl, gpu) in zip(backward, sorted(phase_sums), strict=True):
        assert rank == rank2 and float(share) == pytest.approx(float(nccl) / float(gpu), abs=5e-4)
    assert {(row[0], row[2]) for row in fallbacks} == {(shm, "SHM")}
    assert p2p not in {row[0] for row in fallbacks}
    assert len(slowest) == 6 and [float(r[3]) for r in slowest] == sorted((float(r[3]) for r in slowest), reverse=True)
    # Who waited for whom: one late rank per run, as the stored reports say, with its wait share.
    reports = {run: api.get(f"/v1/runs/{run}/report").json() for run in (shm, p2p)}
    assert [(row[0], row[2], row[3], row[4]) for row in late] == [
        (run, doc["run"]["late_rank"]["rank"], doc["run"]["late_rank"]["last_arrivals"], doc["run"]["late_rank"]["of"])
        for run, doc in sorted(reports.items())
    ]
    for row in late:
        assert float(row[6]) == pytest.approx(reports[row[0]]["run"]["metrics"]["nccl_wait_share"], abs=5e-4)
    steps = {(r["rank"], i): s for r in reports[shm]["ranks"] for i, s in enumerate(r["steps"])}
    assert len(idle) == 6 and [float(r[7]) for r in idle] == sorted((float(r[7]) for r in idle), reverse=True)
    for rank, index, _, period_ms, compute_ms, *_ in idle:
        step = steps[(rank, index)]
        assert float(period_ms) == pytest.approx(step["period_ns"] / 1e6)
        assert float(compute_ms) == pytest.approx(step["compute_ns"] / 1e6)
    assert {row[0] for row in failing} >= {"transport_p2p", "pcie_saturation"}
    assert failed_jobs == []
