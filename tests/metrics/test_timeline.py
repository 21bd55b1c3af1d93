"""The timeline lanes (metrics/timeline.py): interval arithmetic against a brute-force reference,
and the lanes of real captures against plain SQL over the raw file."""

from __future__ import annotations

import json
import random
import sqlite3

import numpy as np
import pytest

import traceguard
from tests.conftest import OWN, public_kineto
from traceguard.metrics.timeline import reduce_segments, subtract_intervals, union_intervals

P2P = OWN / "h200" / "p2p_nsys"


def _covered(intervals: list[tuple[int, int]]) -> set[int]:
    return {t for s, e in intervals for t in range(s, e)}


def _pieces(times: set[int]) -> list[tuple[int, int]]:
    """Maximal runs of consecutive integers as [start, end) pieces."""
    out: list[tuple[int, int]] = []
    for t in sorted(times):
        if out and out[-1][1] == t:
            out[-1] = (out[-1][0], t + 1)
        else:
            out.append((t, t + 1))
    return out


@pytest.mark.parametrize("seed", range(20))
def test_union_and_subtract_match_brute_force(seed: int) -> None:
    rng = random.Random(seed)

    def intervals(n: int) -> list[tuple[int, int]]:
        out = []
        for _ in range(n):
            start = rng.randrange(0, 200)
            out.append((start, start + rng.randrange(0, 25)))
        return out

    a, b = intervals(rng.randrange(0, 30)), intervals(rng.randrange(0, 30))
    a_s, a_e = union_intervals(np.array([s for s, _ in a], dtype=np.int64), np.array([e for _, e in a], dtype=np.int64))
    b_s, b_e = union_intervals(np.array([s for s, _ in b], dtype=np.int64), np.array([e for _, e in b], dtype=np.int64))
    # Zero-length intervals cover nothing, but a union keeps one only where nothing else is: compare coverage.
    assert _pieces(_covered(list(zip(a_s.tolist(), a_e.tolist(), strict=True)))) == _pieces(_covered(a))
    assert all(a_s[1:] > a_e[:-1])  # disjoint, sorted, not touching
    x_s, x_e = subtract_intervals(a_s, a_e, b_s, b_e)
    assert _pieces(_covered(list(zip(x_s.tolist(), x_e.tolist(), strict=True)))) == _pieces(
        _covered(a) - _covered(b)
    )


def test_reduce_segments_closes_the_shortest_gaps_and_keeps_busy_time() -> None:
    start = np.array([0, 10, 12, 30, 31, 100], dtype=np.int64)
    end = np.array([5, 11, 20, 30, 40, 101], dtype=np.int64)
    s, e, busy, labels = reduce_segments(start, end, 4, labels=list("abcdef"))
    # Gaps: 5, 1, 10, 1, 60 → the two 1-ns gaps close.
    assert s.tolist() == [0, 10, 30, 100] and labels == ["a", "b … c (2)", "d … e (2)", "f"]
    s, e, busy, labels = reduce_segments(start, end, 2, labels=list("abcdef"))
    assert len(s) == 2 and s.tolist() == [0, 100] and e.tolist() == [40, 101]
    assert busy.tolist() == [int((end - start)[:5].sum()), 1]
    assert labels == ["a … e (5)", "f"]


def _report_lanes(report: dict, rank: int) -> dict[str, dict]:
    timeline = next(r for r in report["timeline"]["ranks"] if r["rank"] == rank)
    return {lane["name"]: lane | {"origin": timeline["origin_ns"]} for lane in timeline["lanes"]}


def _union_length(intervals: list[tuple[int, int]]) -> int:
    total, reach = 0, None
    for s, e in sorted(intervals):
        if reach is None or s > reach:
            total += e - s
            reach = e
        elif e > reach:
            total += e - reach
            reach = e
    return total


@pytest.mark.slow
def test_lanes_of_an_nsys_capture_match_sql(unpacked) -> None:
    """Per rank: the compute, NCCL and memcpy lanes cover what plain SQL over the kernels and
    copies in the steps' GPU spans covers; exposed time adds up to ``nccl_exposed_ns``."""
    run = traceguard.analyze(P2P)
    for rank in (0, 1):
        lanes = _report_lanes(run.report, rank)
        origin = lanes["steps"]["origin"]
        spans = [(origin + s, origin + e) for s, e in zip(lanes["steps"]["start"], lanes["steps"]["end"], strict=True)]
        db = sqlite3.connect(unpacked(P2P / f"cap_{rank}.sqlite.gz"))
        names = dict(db.execute("SELECT id, value FROM StringIds"))
        kernels = [
            (s, e, names[n].startswith("nccl"))
            for s, e, n in db.execute("SELECT start, end, shortName FROM CUPTI_ACTIVITY_KIND_KERNEL")
            if any(a <= s <= b for a, b in spans)
        ]
        copies = [
            (s, e)
            for table in ("CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")
            for s, e in db.execute(f"SELECT start, end FROM {table}")
            if any(a <= s <= b for a, b in spans)
        ]
        assert sum(lanes["compute"]["busy"]) == _union_length([(s, e) for s, e, nccl in kernels if not nccl])
        assert sum(lanes["nccl:AllReduce"]["busy"]) == _union_length([(s, e) for s, e, nccl in kernels if nccl])
        assert sum(lanes["memcpy"]["busy"]) == _union_length(copies)
        assert lanes["compute"]["merged_from"] > len(lanes["compute"]["start"])  # aggregated to the cap
        assert sum(lanes["exposed"]["busy"]) == run.report["ranks"][rank]["metrics"]["nccl_exposed_ns"]
        assert [s["name"] for s in run.report["ranks"][rank]["steps"]] == lanes["steps"]["labels"]


def test_kineto_capture_has_collective_lanes(unpacked) -> None:
    """A public Kineto trace with NCCL kernels: one lane per collective type the JSON names."""
    path = public_kineto("trace_filter__sampled_rank-0")
    run = traceguard.analyze(path)
    timeline = run.report["timeline"]["ranks"]
    assert timeline, "a timeline per analysed rank"
    lanes = {lane["name"] for rank in timeline for lane in rank["lanes"]}
    with open(unpacked(path)) as fh:
        trace = json.load(fh)
    kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel" and e.get("ph") == "X"]
    assert "compute" in lanes
    if any(e["name"].startswith("nccl") for e in kernels):
        assert any(name.startswith("nccl:") for name in lanes) and "exposed" in lanes
    for rank in timeline:
        for lane in rank["lanes"]:
            assert len(lane["start"]) == len(lane["end"]) == len(lane["busy"]) <= 1500
            assert all(0 <= b <= e - s for s, e, b in zip(lane["start"], lane["end"], lane["busy"], strict=True))
