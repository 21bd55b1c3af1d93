"""``read_nsys_sqlite(..., launches_only=True, keep_correlation=False)``: the ops' correlation ids
are dropped (null) once their launches are joined, everything else is the same, and so is the
analysis (no metric reads the id after the join)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN, PUBLIC_NSYS, public_nsys
from traceguard import model
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.metrics.run import analyse_run

CAPTURES = [OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz", OWN / "cuda_graphs" / "graph_level.sqlite.gz"]
CAPTURES += [public_nsys("h100_2gpu_1s")] if any("h100_2gpu_1s" in p.name for p in PUBLIC_NSYS) else []


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


@pytest.mark.parametrize("gz", CAPTURES, ids=[p.name for p in CAPTURES])
def test_correlation_dropped_after_the_join(gz: Path, unpacked) -> None:
    db = unpacked(gz)
    kept = read_nsys_sqlite(db, launches_only=True)
    dropped = read_nsys_sqlite(db, launches_only=True, keep_correlation=False)
    assert kept.gpu_ops["correlation_id"].null_count() < kept.gpu_ops.height  # there was something to drop
    assert dropped.gpu_ops.schema == kept.gpu_ops.schema
    assert dropped.gpu_ops["correlation_id"].null_count() == dropped.gpu_ops.height
    assert dropped.gpu_ops.drop("correlation_id").equals(kept.gpu_ops.drop("correlation_id"))
    assert dropped.gpu_ops["launch_start"].null_count() == kept.gpu_ops["launch_start"].null_count()
    for name in ("api_calls", "ranges", "devices", "processes", "strings"):
        assert getattr(dropped, name).equals(getattr(kept, name)), name
    # The whole analysis is unchanged.
    a, b = analyse_run([(0, kept)]), analyse_run([(0, dropped)])
    assert a.metrics == b.metrics and a.null_reasons == b.null_reasons
    for x, y in zip(a.ranks, b.ranks, strict=True):
        assert (x.metrics, x.null_reasons, x.steps, x.health, x.timeline) == (
            y.metrics,
            y.null_reasons,
            y.steps,
            y.health,
            y.timeline,
        )
        assert x.collectives.equals(y.collectives)
        assert x.collectives_by_type == y.collectives_by_type and x.peers == y.peers


def test_full_read_keeps_them(unpacked) -> None:
    """Without ``launches_only`` there is no join in the reader: the ids stay, whatever is asked."""
    db = unpacked(CAPTURES[0])
    capture = read_nsys_sqlite(db, keep_correlation=False)
    assert capture.gpu_ops["correlation_id"].null_count() == 0
    assert capture.api_calls.height and set(model.GPU_OPS_SCHEMA) <= set(capture.gpu_ops.columns)
    assert pl.Series(capture.gpu_ops["correlation_id"]).n_unique() > 1
