"""A run of many ranks through the service (issue 30): a tar of 40 rank files uploaded, analysed by
the worker, reported by summary, every rank's rows stored from the side output in batches, and the
steps and links queries paged, on SQLite and on PostgreSQL. Expected counts come from the rank
files themselves (plain ``sqlite3``) and from the run's manifest, not from the service."""

from __future__ import annotations

import json
import sqlite3
import tarfile
from pathlib import Path

from tests.conftest import MANY_RANKS
from tests.service.conftest import Api
from traceguard.store.results import rank_results

STEP_NAME = "Batch %"  # the ViT job's step ranges (DESIGN.md's default pattern matches them)


def _steps_in(rank_file: Path) -> int:
    with sqlite3.connect(f"file:{rank_file}?mode=ro", uri=True) as conn:
        return conn.execute(
            "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id "
            "WHERE COALESCE(e.text, s.value) LIKE ? AND e.end IS NOT NULL",
            (STEP_NAME,),
        ).fetchone()[0]


def test_a_tar_of_40_ranks_is_stored_whole_and_queried_in_pages(api: Api, many_ranks: Path, tmp_path: Path) -> None:
    manifest = json.loads((many_ranks / "manifest.json").read_text())
    archive = tmp_path / "run40.tar.gz"
    with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
        for capture in manifest["captures"]:
            tar.add(many_ranks / capture["path"], arcname=f"run40/{capture['path']}")
        tar.add(many_ranks / "manifest.json", arcname="run40/manifest.json")
    run_id = api.new_run()
    response = api.post(f"/v1/runs/{run_id}/files", files=[("file", ("run40.tar.gz", archive.read_bytes()))])
    assert response.status_code == 202, response.text
    assert api.wait(response.json()["job"]["url"], timeout=300)["status"] == "succeeded"

    report = api.get(f"/v1/runs/{run_id}/report").json()
    assert report["detail"]["mode"] == "summary" and report["detail"]["folder"] is None
    assert report["rank_summary"]["ranks"] == MANY_RANKS
    assert len(report["ranks"]) < MANY_RANKS

    expected = {c["rank"]: _steps_in(many_ranks / c["path"]) for c in manifest["captures"]}
    assert sum(expected.values()) > 0
    rows: list[dict] = []
    offset = 0
    while True:
        page = api.get(f"/v1/runs/{run_id}/steps", params={"limit": 50, "offset": offset}).json()
        rows += page["steps"]
        if len(page["steps"]) < 50:
            break
        offset += 50
    per_rank: dict[int, int] = {}
    for row in rows:
        per_rank[row["rank"]] = per_rank.get(row["rank"], 0) + 1
    assert per_rank == expected
    assert len({(r["rank"], r["step_index"]) for r in rows}) == len(rows)

    seen: list[int] = []
    start: int | None = 0
    pages = 0
    while start is not None:
        links = api.get(f"/v1/runs/{run_id}/links", params={"from_rank": start, "ranks": 16}).json()
        ranks = [w["rank"] for w in links["waits"]]
        assert ranks == sorted(ranks) and all(start <= r < start + 16 for r in ranks)
        assert {c["rank"] for c in links["collectives"]} <= set(ranks)
        assert links["late_rank"] == report["run"]["late_rank"]["rank"]
        seen += ranks
        start = links["next_from_rank"]
        pages += 1
    assert seen == sorted(expected) and pages == 3
    one = api.get(f"/v1/runs/{run_id}/links", params={"rank": 37}).json()
    assert [w["rank"] for w in one["waits"]] == [37] and one["next_from_rank"] is None
    # Every rank's row names its input as uploaded, not by the job's scratch path.
    with api.ctx.factory() as session:
        stored = {r.rank: r.input for r in rank_results(session, run_id)}
    assert stored == {c["rank"]: c["path"] for c in manifest["captures"]}
