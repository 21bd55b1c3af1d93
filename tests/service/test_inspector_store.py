"""NCCL Inspector logs through the service: uploaded as files of a run (recognised by content),
analysed, and kept as one ``inspector_windows`` row per time window, on SQLite and PostgreSQL.
Expected values come from the CLI's own analysis of the same files (the report); the rows from
plain SQL."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from sqlalchemy import text

from tests.conftest import SHARED
from tests.service.conftest import Api
from traceguard.pipeline import analyze
from traceguard.store.results import inspector_windows

FIXTURES = SHARED / "fixtures" / "nccl-inspector"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/nccl-inspector not present")
COLUMNS = ("window_start_s", "instances", "lines", "wait_ns", "transfer_ns", "late_rank", "last_arrivals", "bytes")


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The P2P run's two logs as the plugin names them (plain)."""
    out = tmp_path_factory.mktemp("inspector")
    for path in sorted(FIXTURES.glob("fsdp2_p2p_rank*.log.gz")):
        raw = gzip.decompress(path.read_bytes())
        meta = json.loads(raw.split(b"\n", 1)[0])["metadata"]
        (out / f"{meta['hostname']}-pid{meta['pid']}.log").write_bytes(raw)
    return out


def test_inspector_windows_in_the_store(api: Api, folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = sorted(p.name for p in folder.iterdir())
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(folder.parent / "tg-cache"))
    report = analyze([str(folder)]).report
    expected = [tuple(w[c] for c in COLUMNS) for w in report["inspector"]["windows"]]
    assert expected and sum(row[1] for row in expected) == 540
    run_id = api.analysed(folder, names, name="inspector")
    with api.ctx.engine.connect() as db:
        rows = [
            tuple(row)
            for row in db.execute(
                text(f"SELECT {', '.join(COLUMNS)} FROM inspector_windows WHERE run_id = :r ORDER BY window_start_s"),
                {"r": run_id},
            )
        ]
    assert rows == expected
    with api.ctx.factory() as session:
        stored = inspector_windows(session, run_id)
    assert [w.window_s for w in stored] == [60] * len(expected)
    assert stored[0].nccl_wait_share == pytest.approx(report["inspector"]["windows"][0]["nccl_wait_share"])
