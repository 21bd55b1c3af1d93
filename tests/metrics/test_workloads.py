"""metrics.workloads on real GPU captures: the pipeline bubble of nsys-ai's 2-GPU pipeline-parallel
capture (public fixture), recomputed from the raw kernels with plain sqlite3; and a DDP capture,
which is no pipeline and no broadcast-reduce.

(The harness's own workloads on CPU are tested in tests/capture/test_workloads.py.)
"""

from __future__ import annotations

import sqlite3

import pytest

from tests.conftest import OWN, PUBLIC
from traceguard.pipeline import analyze

PIPELINE = PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"


def _union(intervals: list[tuple[int, int]]) -> int:
    total, current = 0, None
    for a, b in sorted(intervals):
        if current and a <= current[1]:
            current[1] = max(current[1], b)
        else:
            total += current[1] - current[0] if current else 0
            current = [a, b]
    return total + (current[1] - current[0] if current else 0)


def test_pipeline_bubble_from_the_raw_kernels(unpacked) -> None:
    path = unpacked(PIPELINE)
    report = analyze([str(path)]).report
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kernels = db.execute(
        "SELECT k.start, k.end, k.deviceId, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = COALESCE(k.shortName, k.demangledName)"
    ).fetchall()
    devices = sorted({device for _, _, device, _ in kernels})  # the file's ranks in order of their devices
    idle_all = span_all = 0
    for rank in report["ranks"]:
        workload = rank["workload"]
        assert workload["kind"] == "pipeline"  # SendRecv kernels inside its steps
        assert len(workload["bubble_per_step"]) == len(rank["steps"]) > 0
        idle_rank = span_rank = 0
        for step in workload["bubble_per_step"]:
            s0, s1 = step["gpu_start_ns"], step["gpu_start_ns"] + step["span_ns"]
            compute = [
                (max(a, s0), min(b, s1))
                for a, b, device, name in kernels
                if device == devices[rank["rank"]] and s0 <= a <= s1 and not name.startswith("nccl")
            ]
            idle = (s1 - s0) - _union(compute)
            assert step["idle_ns"] == idle
            idle_rank, span_rank = idle_rank + idle, span_rank + (s1 - s0)
        assert workload["bubble"] == pytest.approx(idle_rank / span_rank)
        assert 0 < workload["bubble"] < 1
        idle_all, span_all = idle_all + idle_rank, span_all + span_rank
    assert report["run"]["workload"]["kind"] == "pipeline"
    assert report["run"]["workload"]["bubble"] == pytest.approx(idle_all / span_all)


def test_ddp_capture_is_no_pipeline_and_no_broadcast_reduce(unpacked) -> None:
    files = [str(unpacked(p)) for p in sorted((OWN / "h200" / "p2p_nsys").glob("cap_*.sqlite.gz"))]
    report = analyze(files).report
    workload = report["run"]["workload"]
    assert workload["kind"] is None and workload["bubble"] is None and workload["peer_matrix"] == []
    for rank in report["ranks"]:
        assert rank["workload"]["null_reasons"]["bubble"].startswith("not a pipeline")
