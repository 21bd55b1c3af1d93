"""CUDA graph replays as the readers see them, on our own H100 captures (tests/fixtures/cuda_graphs).

One job (MLP, gradient all-reduce and SGD step captured in one CUDA graph, six replays inside
``Batch N`` ranges) recorded by nsys at graph level (``--cuda-graph-trace=graph``, nsys's default),
at node level (``=node``), eagerly (no graph), and by torch.profiler. Every expected value is read
from the file itself with plain sqlite3 / json.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN
from traceguard import model
from traceguard.ingest.kineto import read_kineto
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite

GRAPHS = OWN / "cuda_graphs"


def _sql(path: Path, query: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return db.execute(query).fetchall()


def _launch_names(capture: model.Capture, ops: pl.DataFrame) -> list[str | None]:
    names = capture.name_of()
    return [names.get(i) if i is not None else None for i in ops["launch_name_id"].to_list()]


@pytest.fixture(scope="module")
def graph_level(unpacked) -> Path:
    return unpacked(GRAPHS / "graph_level.sqlite.gz")


@pytest.fixture(scope="module")
def node_level(unpacked) -> Path:
    return unpacked(GRAPHS / "node_level.sqlite.gz")


@pytest.mark.parametrize("launches_only", [False, True])
def test_graph_executions_are_gpu_ops_of_kind_graph(graph_level: Path, launches_only: bool) -> None:
    capture = read_nsys_sqlite(graph_level, launches_only=launches_only)
    graphs = capture.gpu_ops.filter(pl.col("kind") == "graph").sort("start")
    rows = _sql(
        graph_level,
        "SELECT start, end, correlationId, graphId, deviceId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE ORDER BY start",
    )
    assert len(rows) == 6  # six replays
    assert graphs.select("start", "end", "correlation_id").rows() == [(s, e, c) for s, e, c, _, _ in rows]
    assert graphs["device"].to_list() == [d for *_, d in rows]
    names = capture.name_of()
    assert {names[i] for i in graphs["name_id"].to_list()} == {f"CUDA graph {g}" for _, _, _, g, _ in rows}
    # Each execution is one graph launch's work: it carries that call's correlation id.
    launch = dict(
        _sql(
            graph_level,
            "SELECT r.correlationId, s.value FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "WHERE r.correlationId IN (SELECT correlationId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE)",
        )
    )
    assert all(name.startswith("cudaGraphLaunch") for name in launch.values()) and len(launch) == 6
    joined = graphs if launches_only else model.join_launches(graphs, capture.api_calls)
    assert all(n is not None and n.startswith("cudaGraphLaunch") for n in _launch_names(capture, joined))
    # The kernel table holds only the few kernels launched outside the graph.
    kernels = _sql(graph_level, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL")[0][0]
    assert capture.gpu_ops.filter(pl.col("kind") == "kernel").height == kernels < 10


def test_launches_only_read_matches_join_launches(graph_level: Path) -> None:
    """The analysis's launches-only read attaches the same launch to every op (graphs included)
    as joining the full API tables."""
    fast = read_nsys_sqlite(graph_level, launches_only=True).gpu_ops
    full = read_nsys_sqlite(graph_level)
    joined = model.join_launches(full.gpu_ops, full.api_calls)
    columns = ["kind", "start", "end", "correlation_id", *model.LAUNCH_SCHEMA]
    assert fast.select(columns).sort("start", "kind").equals(joined.select(columns).sort("start", "kind"))


def test_node_level_kernels_share_their_graph_launch_correlation(node_level: Path) -> None:
    """At node level every kernel/copy/set of a graph (non-null graphNodeId) carries its
    cudaGraphLaunch's correlation id, and the reader joins it to that launch."""
    in_graphs = 0
    for table in ("KERNEL", "MEMCPY", "MEMSET"):
        rows = _sql(
            node_level,
            f"SELECT s.value FROM CUPTI_ACTIVITY_KIND_{table} k JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = k.correlationId JOIN StringIds s ON s.id = r.nameId WHERE k.graphNodeId IS NOT NULL",
        )
        assert rows and all(name.startswith("cudaGraphLaunch") for (name,) in rows)
        in_graphs += len(rows)
    assert not _sql(node_level, "SELECT 1 FROM sqlite_master WHERE name = 'CUPTI_ACTIVITY_KIND_GRAPH_TRACE'")
    capture = read_nsys_sqlite(node_level, launches_only=True)
    assert capture.gpu_ops.filter(pl.col("kind") == "graph").height == 0
    launched = [n for n in _launch_names(capture, capture.gpu_ops) if n and n.startswith("cudaGraphLaunch")]
    assert len(launched) == in_graphs == 354  # 264 kernels, 60 copies, 30 sets: 6 replays of 59 nodes


def test_eager_capture_has_no_graph_ops(unpacked) -> None:
    path = unpacked(GRAPHS / "eager.sqlite.gz")
    capture = read_nsys_sqlite(path, launches_only=True)
    assert capture.gpu_ops.filter(pl.col("kind") == "graph").height == 0
    assert not [n for n in _launch_names(capture, capture.gpu_ops) if n and "GraphLaunch" in n]


def test_kineto_graph_replay_kernels_join_cudagraphlaunch() -> None:
    """torch.profiler records each replay as a ``cudaGraphLaunch`` runtime event and the kernels,
    copies and sets it ran with that event's correlation id: they attribute like any launch."""
    path = GRAPHS / "kineto_graph.trace.json.gz"
    doc = json.loads(gzip.decompress(path.read_bytes()))
    events = doc["traceEvents"]
    launches = {e["args"]["correlation"] for e in events if e.get("name") == "cudaGraphLaunch"}
    gpu_cats = {"kernel", "gpu_memcpy", "gpu_memset"}
    in_graphs = [e for e in events if e.get("cat") in gpu_cats and e["args"].get("correlation") in launches]
    assert len(launches) == 6 and len(in_graphs) == 354
    capture = read_kineto(path)
    joined = model.join_launches(capture.gpu_ops, capture.api_calls)
    launched = [n for n in _launch_names(capture, joined) if n == "cudaGraphLaunch"]
    assert len(launched) == len(in_graphs)
