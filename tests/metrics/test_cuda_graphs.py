"""Metrics and checks of CUDA graph replays, against plain SQL / json on our own H100 captures.

tests/fixtures/cuda_graphs/README.md says how they were made: one job (forward, backward, an NCCL
all-reduce (AVG) of the gradients and the SGD step captured in one CUDA graph, six replays inside
``Batch N``) recorded at nsys graph level, at node level, eagerly, and by torch.profiler. On a
one-rank communicator NCCL runs the all-reduce as its ``oneRankReduce`` kernel.
"""

from __future__ import annotations

import gzip
import json
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.conftest import OWN, REPO
from traceguard.metrics.graphs import HIDDEN_BY_GRAPHS
from traceguard.pipeline import analyze

GRAPHS = OWN / "cuda_graphs"
NODE_FIX = "--cuda-graph-trace=node"


def _is_nccl(name: str) -> bool:
    return name.startswith("nccl") or "oneRankReduce" in name


def _union(intervals: list[tuple[int, int]]) -> int:
    total, end = 0, None
    for s, e in sorted(intervals):
        if end is None or s > end:
            total, end = total + e - s, e
        elif e > end:
            total, end = total + e - end, e
    return total


def _sql_steps(path: Path) -> list[dict]:
    """Per ``Batch N`` range: the GPU rows (kernels, copies, sets, graph executions) whose launching
    API call (same process, same correlation id) started inside it, straight from the tables."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    ranges = [
        (name, start, end, (gtid >> 24) & 0xFFFFFF)
        for start, end, gtid, text, text_id in db.execute(
            "SELECT start, end, globalTid, text, textId FROM NVTX_EVENTS WHERE eventType = 59 AND end IS NOT NULL"
        )
        if (name := text if text is not None else strings.get(text_id, "")).startswith("Batch ")
    ]
    launches: dict[tuple[int, int], int] = {}
    for start, gtid, corr in db.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
        launches.setdefault(((gtid >> 24) & 0xFFFFFF, corr), start)
    rows: list[tuple[str, int, int, int, int, str]] = []
    queries = {
        "kernel": "SELECT start, end, globalPid, correlationId, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL",
        "memcpy": "SELECT start, end, globalPid, correlationId, NULL FROM CUPTI_ACTIVITY_KIND_MEMCPY",
        "memset": "SELECT start, end, globalPid, correlationId, NULL FROM CUPTI_ACTIVITY_KIND_MEMSET",
        "graph": "SELECT start, end, globalPid, correlationId, NULL FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE",
    }
    for kind, query in queries.items():
        if query.split()[-1] in tables:
            for start, end, gpid, corr, name_id in db.execute(query):
                rows.append((kind, start, end, (gpid >> 24) & 0xFFFFFF, corr, strings.get(name_id, "")))
    db.close()
    steps = []
    for name, r_start, r_end, pid in sorted(ranges, key=lambda r: r[1]):
        ops = [
            op
            for op in rows
            if op[3] == pid and (t := launches.get((pid, op[4]))) is not None and r_start <= t <= r_end
        ]
        if not ops:
            continue
        steps.append(
            {
                "name": name,
                "span": max(o[2] for o in ops) - min(o[1] for o in ops),
                "graph_ns": _union([(o[1], o[2]) for o in ops if o[0] == "graph"]),
                "nccl_ns": _union([(o[1], o[2]) for o in ops if o[0] == "kernel" and _is_nccl(o[5])]),
            }
        )
    return steps


def _check(report: dict, rule: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == rule)


@pytest.fixture(scope="module")
def graph_level(unpacked) -> Path:
    return unpacked(GRAPHS / "graph_level.sqlite.gz")


@pytest.fixture(scope="module")
def node_level(unpacked) -> Path:
    return unpacked(GRAPHS / "node_level.sqlite.gz")


@pytest.fixture(scope="module")
def graph_report(graph_level: Path) -> dict:
    return analyze([str(graph_level)]).report


def test_graph_level_step_spans_come_from_the_graph_trace(graph_level: Path, graph_report: dict) -> None:
    """Per-step GPU span and graph time equal plain SQL over the graph-trace table: ~0.75 ms
    replays, not the microseconds of the few kernels launched outside the graph."""
    expected = _sql_steps(graph_level)
    steps = graph_report["ranks"][0]["steps"]
    assert [s["name"] for s in steps] == [e["name"] for e in expected] and len(steps) == 6
    assert [s["gpu_span_ns"] for s in steps] == [e["span"] for e in expected]
    assert [s["graph_ns"] for s in steps] == [e["graph_ns"] for e in expected]
    assert all(s["graph_ns"] > 0.8 * s["gpu_span_ns"] > 500_000 for s in steps)
    assert all(s["nccl_share"] is None for s in steps)
    assert graph_report["run"]["metrics"]["gpu_span_ns"] == sum(e["span"] for e in expected)


def test_graph_level_allreduce_inside_the_graph_cannot_pass_nccl_step_share(graph_report: dict) -> None:
    """The all-reduce runs inside the graph: at graph level its time is unknown, so the NCCL
    share is null with a reason naming the fix and its check skips (it read 0 % and passed)."""
    check = _check(graph_report, "nccl_step_share")
    assert check["status"] == "skip" and check["value"] is None
    assert NODE_FIX in check["reason"] and "lower bound" in check["reason"]
    rank = graph_report["ranks"][0]
    for key in HIDDEN_BY_GRAPHS:
        assert rank["metrics"].get(key) is None, key
        assert key not in rank["metrics"] or NODE_FIX in rank["metrics"]["null_reasons"][key]
    assert rank["collectives_by_type"]["totals"] == []
    assert NODE_FIX in rank["collectives_by_type"]["null_reasons"]["totals"]
    assert rank["peers"]["rows"] == [] and NODE_FIX in rank["peers"]["null_reason"]
    for rule in ("gpu_to_cpu_copy_rate", "dtod_copy_volume", "small_collectives"):
        check = _check(graph_report, rule)
        assert check["status"] == "skip" and NODE_FIX in check["reason"], rule


def test_graph_level_capture_health_reports_graph_time(graph_level: Path, graph_report: dict) -> None:
    with sqlite3.connect(f"file:{graph_level}?mode=ro", uri=True) as db:
        count, total = db.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE").fetchone()
    check = _check(graph_report, "capture_health")
    assert check["status"] == "warn"
    (problem,) = [p for p in check["evidence"] if p.get("cuda_graph_trace")]
    assert problem["cuda_graph_trace"] == "graph"
    assert problem["graph_executions"] == count == 6
    assert problem["graph_ns"] == total  # replays never overlap: their union is their sum
    assert 0.9 < problem["graph_ns"] / problem["gpu_busy_ns"] <= 1
    assert NODE_FIX in check["remedy"]


def test_node_level_spans_and_nccl_share_equal_sql(node_level: Path) -> None:
    expected = _sql_steps(node_level)
    report = analyze([str(node_level)]).report
    steps = report["ranks"][0]["steps"]
    assert [s["gpu_span_ns"] for s in steps] == [e["span"] for e in expected] and len(steps) == 6
    assert [s["nccl_ns"] for s in steps] == [e["nccl_ns"] for e in expected]
    assert all(e["nccl_ns"] > 0 for e in expected)  # the all-reduce kernel inside each replay
    share = sum(e["nccl_ns"] for e in expected) / sum(e["span"] for e in expected)
    check = _check(report, "nccl_step_share")
    assert check["value"] == pytest.approx(share, rel=1e-12)
    assert check["status"] == "pass"
    rank = report["ranks"][0]
    assert rank["metrics"]["nccl_kernels"] == 6
    health = _check(report, "capture_health")
    assert health["status"] == "pass" and "node by node: 354 GPU ops" in health["message"]


def test_kineto_graph_replay_nccl_share_equals_json() -> None:
    """torch.profiler's trace of the replays: per step (``Batch N`` user annotations), the GPU
    events launched by calls inside it (cudaGraphLaunch included), from the JSON alone."""
    path = GRAPHS / "kineto_graph.trace.json.gz"
    events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
    ns = 1000  # Kineto times are µs; the share is a ratio, the comparison relative
    calls = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    batches = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("cat") == "user_annotation" and e["name"].startswith("Batch")
    )
    spans, nccl = [], []
    per_step: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            t = calls.get(e["args"].get("correlation"))
            for i, (s, end) in enumerate(batches):
                if t is not None and s <= t <= end:
                    per_step[i].append(e)
    for i in sorted(per_step):
        ops = per_step[i]
        spans.append((max(o["ts"] + o["dur"] for o in ops) - min(o["ts"] for o in ops)) * ns)
        nccl.append(sum(o["dur"] for o in ops if o["cat"] == "kernel" and _is_nccl(o["name"])) * ns)
    assert len(spans) == 6 and all(nccl)
    report = analyze([str(path)]).report
    assert _check(report, "nccl_step_share")["value"] == pytest.approx(sum(nccl) / sum(spans), rel=1e-3)
    assert report["ranks"][0]["metrics"]["nccl_kernels"] == 6


def test_eager_and_graph_replay_of_the_same_job(unpacked, node_level: Path) -> None:
    """The same step, eager and replayed: the same NCCL all-reduce kernel per step, and the replay
    takes less GPU span (no launch gaps between its kernels)."""
    eager = _sql_steps(unpacked(GRAPHS / "eager.sqlite.gz"))
    graph = _sql_steps(node_level)
    report = analyze([str(unpacked(GRAPHS / "eager.sqlite.gz"))]).report
    assert report["ranks"][0]["metrics"]["nccl_kernels"] == 6
    assert [s["gpu_span_ns"] for s in report["ranks"][0]["steps"]] == [e["span"] for e in eager]
    assert sum(e["span"] for e in graph) < sum(e["span"] for e in eager)


def test_a_graph_level_rank_makes_run_sums_unknown(graph_level: Path, node_level: Path) -> None:
    """Rank 0 traced node by node, rank 1 at graph level: the run's NCCL time is not rank 0's alone."""
    report = analyze([f"{node_level}:0", f"{graph_level}:1"]).report
    by_rank = {r["rank"]: r for r in report["ranks"]}
    assert by_rank[0]["metrics"]["nccl_time_ns"] > 0 and by_rank[1]["metrics"]["nccl_time_ns"] is None
    run = report["run"]["metrics"]
    assert run["nccl_time_ns"] is None
    reason = run["null_reasons"]["nccl_time_ns"]
    assert reason.startswith("rank 1:") and NODE_FIX in reason
    assert _check(report, "nccl_step_share")["status"] == "skip"


@pytest.mark.parametrize("name", ["graph_level.sqlite.gz", "node_level.sqlite.gz", "kineto_graph.trace.json.gz"])
def test_reports_of_graph_replays_are_schema_valid(unpacked, name: str) -> None:
    path = GRAPHS / name
    report = analyze([str(unpacked(path) if name.endswith(".sqlite.gz") else path)]).report
    schema = json.loads((REPO / "docs" / "report.schema.json").read_text())
    Draft202012Validator(schema).validate(json.loads(json.dumps(report)))
    graph_ns = [s["graph_ns"] for s in report["ranks"][0]["steps"]]
    assert all(g > 0 for g in graph_ns) if name.startswith("graph_level") else not any(graph_ns)


def test_timeline_has_a_lane_of_graph_executions(graph_level: Path, graph_report: dict) -> None:
    with sqlite3.connect(f"file:{graph_level}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT start, end FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE ORDER BY start").fetchall()
    timeline = graph_report["timeline"]["ranks"][0]
    (lane,) = [lane for lane in timeline["lanes"] if lane["kind"] == "graph"]
    origin = timeline["origin_ns"]
    assert list(zip(lane["start"], lane["end"], strict=True)) == [(s - origin, e - origin) for s, e in rows]
    assert sum(lane["busy"]) == sum(e - s for s, e in rows)


def test_compiled_model_two_graphs_a_step(unpacked) -> None:
    """torch.compile(mode="reduce-overhead") (bench/gpu/compile_graphs.py): CUDA graph trees replay
    a forward and a backward graph every step beside eager loss and optimizer kernels. At graph
    level each step's graph time is the union of its two executions, the span covers both."""
    path = unpacked(GRAPHS / "compile_graph_level.sqlite.gz")
    expected = _sql_steps(path)
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        graph_ids = {g for (g,) in db.execute("SELECT DISTINCT graphId FROM CUPTI_ACTIVITY_KIND_GRAPH_TRACE")}
    assert len(graph_ids) == 2
    result = analyze([str(path)]).result
    rank = result.ranks[0]
    assert [s["gpu_span_ns"] for s in rank.steps] == [e["span"] for e in expected] and len(expected) == 6
    assert [s["graph_ns"] for s in rank.steps] == [e["graph_ns"] for e in expected]
    assert all(0 < e["graph_ns"] < e["span"] for e in expected)  # eager loss/optimizer kernels too
    assert rank.health["graph_executions"] == 12 and rank.metrics["nccl_share_of_step"] is None


def test_compiled_model_node_level_reads_every_graph_kernel(unpacked) -> None:
    """Node level records the graphs' kernels though the graphs were recorded before the capture
    range opened; they join their cudaGraphLaunch, and spans equal plain SQL."""
    path = unpacked(GRAPHS / "compile_node_level.sqlite.gz")
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        tables = {t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        in_graphs = sum(
            db.execute(f"SELECT count(*) FROM {t} WHERE graphNodeId IS NOT NULL").fetchone()[0]
            for t in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
            if t in tables
        )
    result = analyze([str(path)]).result
    rank = result.ranks[0]
    assert rank.health["cuda_graph_trace"] == "node" and rank.health["graph_launched_ops"] == in_graphs > 0
    assert [s["gpu_span_ns"] for s in rank.steps] == [e["span"] for e in _sql_steps(path)]
    assert rank.metrics["nccl_share_of_step"] == 0.0  # no collective in this job: a true zero
