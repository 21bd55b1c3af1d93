"""Ground truth of the 2×H100 captures with a known late rank (``tests/fixtures/h100x2_waits``,
made by ``bench/gpu/waits_h100.sh``), read with plain SQL and JSON, no traceguard analysis.

``slow_*`` ran with ``--slow-rank 1:30``: rank 1's host sleeps 30 ms in every step's ``get batch``.
Its gradient AllReduce kernel then starts about that much later than rank 0's, and rank 0's kernel
spins until rank 1 arrives; both end together (one host, one clock). ``clean_*`` has no sleep (rank 0
is a few ms late by itself), ``shm_*`` runs with NCCL_P2P_DISABLE=1.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import statistics
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "fixtures" / "h100x2_waits"
RUNS = ("clean", "slow", "shm")
SLEEP_MS = 30.0


def _records(run: str) -> list[dict]:
    return [json.loads((ROOT / run / f"rank{r}.json").read_text()) for r in (0, 1)]


def _nsys(tmp_path: Path, run: str, rank: int) -> sqlite3.Connection:
    target = tmp_path / f"{run}_{rank}.sqlite"
    with gzip.open(ROOT / f"{run}_nsys" / f"cap_{rank}.sqlite.gz") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return sqlite3.connect(target)


def _nsys_step_allreduces(db: sqlite3.Connection) -> list[tuple[int, int]]:
    """(start, end) on the host's wall clock (ns) of the NCCL kernels launched inside a ``Batch N`` range:
    the gradient all-reduces, not the barriers before and after the captured steps."""
    (t0,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    batches = db.execute(
        "SELECT e.start, e.end FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.eventType = 59 AND COALESCE(e.text, s.value) LIKE 'Batch %'"
    ).fetchall()
    rows = db.execute(
        "SELECT k.start, k.end, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_AllReduce%' ORDER BY k.start"
    ).fetchall()
    return [(t0 + start, t0 + end) for start, end, launch in rows if any(b <= launch <= e for b, e in batches)]


def _nsys_get_batch_ms(db: sqlite3.Connection) -> list[float]:
    rows = db.execute(
        "SELECT e.end - e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.eventType = 59 AND COALESCE(e.text, s.value) = 'get batch'"
    ).fetchall()
    return [ns / 1e6 for (ns,) in rows]


def _torch(run: str, rank: int) -> dict:
    with gzip.open(ROOT / f"{run}_torch" / f"rank{rank}.trace.json.gz", "rt") as f:
        return json.load(f)


def _torch_allreduces(trace: dict) -> list[tuple[float, float]]:
    """(start, end) in ns on the trace's own clock (``baseTimeNanoseconds`` + ``ts``) of the NCCL kernels."""
    base = trace["baseTimeNanoseconds"]
    return [
        (base + e["ts"] * 1000, base + (e["ts"] + e["dur"]) * 1000)
        for e in trace["traceEvents"]
        if e.get("cat") == "kernel" and e["name"].startswith("ncclDevKernel_AllReduce")
    ]


def _torch_get_batch_ms(trace: dict) -> list[float]:
    return [
        e["dur"] / 1000
        for e in trace["traceEvents"]
        if e.get("name") == "get batch" and e.get("cat") == "user_annotation"
    ]


def _lateness_ms(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> tuple[list[float], list[float]]:
    """Per collective, rank 1's start minus rank 0's, and rank 1's end minus rank 0's (ms)."""
    assert len(a) == len(b)
    return [(y[0] - x[0]) / 1e6 for x, y in zip(a, b, strict=True)], [
        (y[1] - x[1]) / 1e6 for x, y in zip(a, b, strict=True)
    ]


@pytest.mark.parametrize("run", [f"{r}_{tool}" for r in RUNS for tool in ("nsys", "torch")])
def test_each_rank_recorded_what_it_ran(run: str) -> None:
    records = _records(run)
    slow = run.startswith("slow")
    for rank, record in enumerate(records):
        assert record["rank"] == rank and record["world_size"] == 2 and record["backend"] == "nccl"
        assert record["gpu_name"] == "NVIDIA H100 80GB HBM3" and record["nccl"] == "2.28.9"
        assert record["config"]["model"] == "vit_l_32" and record["config"]["bucket_cap_mb"] == 2000
        assert record["config"]["slow_rank"] == ({"1": SLEEP_MS} if slow else {})
        assert record["env"].get("NCCL_P2P_DISABLE") == ("1" if run.startswith("shm") else None)
        assert record["env"]["NCCL_NVLS_ENABLE"] == "0"
    assert [r["slow_rank_sleep_ms"] for r in records] == ([0.0, SLEEP_MS] if slow else [0.0, 0.0])
    transport = "via SHM" if run.startswith("shm") else "via P2P"
    logs = [p.read_text() for p in (ROOT / run).glob("nccl.*.log")]
    assert len(logs) == 2 and all(transport in log for log in logs)


def test_nsys_slow_rank_1_starts_its_allreduce_later_by_the_sleep(tmp_path: Path) -> None:
    r0, r1 = (_nsys(tmp_path, "slow", r) for r in (0, 1))
    a, b = _nsys_step_allreduces(r0), _nsys_step_allreduces(r1)
    assert len(a) == len(b) == 6  # one bucket: one AllReduce per captured step
    starts, ends = _lateness_ms(a, b)
    # Measured: 31.9-41.0 ms, median 36.7 (the sleep plus the few ms rank 0 is late by itself in clean_nsys).
    assert all(s >= 0.9 * SLEEP_MS for s in starts)
    assert SLEEP_MS <= statistics.median(starts) <= SLEEP_MS + 15
    assert max(abs(e) for e in ends) < 0.05  # both ranks leave the ring together (measured: within 6 µs)
    waiting = [(x[1] - x[0]) / 1e6 for x in a]
    moving = [(y[1] - y[0]) / 1e6 for y in b]
    assert statistics.median(moving) < 5  # 1.23 GB over NVLink: ~3.6 ms
    assert min(w - m for w, m in zip(waiting, moving, strict=True)) >= 0.9 * SLEEP_MS  # rank 0 spins
    get_batch = [_nsys_get_batch_ms(db) for db in (r0, r1)]
    assert min(get_batch[1]) >= SLEEP_MS and max(get_batch[0]) < SLEEP_MS / 2


@pytest.mark.parametrize("run", ["clean", "shm"])
def test_nsys_without_a_sleep_no_rank_is_late_by_as_much(tmp_path: Path, run: str) -> None:
    a, b = (_nsys_step_allreduces(_nsys(tmp_path, run, r)) for r in (0, 1))
    assert len(a) == len(b) == 6
    starts, ends = _lateness_ms(a, b)
    # Measured: clean, rank 0 late by 0.7-12.3 ms (median 5.2); shm, rank 1 late by 0.7-6.8 ms (median 3.1).
    assert abs(statistics.median(starts)) < SLEEP_MS / 3 and max(abs(s) for s in starts) < SLEEP_MS / 2
    assert max(abs(e) for e in ends) < 0.05


def test_torch_slow_rank_1_starts_its_allreduce_later_by_the_sleep() -> None:
    traces = [_torch("slow", r) for r in (0, 1)]
    a, b = (_torch_allreduces(t) for t in traces)
    assert len(a) == len(b) == 3  # the 3 recorded steps
    starts, ends = _lateness_ms(a, b)
    # Measured: 52.0, 63.8, 75.6 ms — more than the sleep, and growing under the profiler's host overhead.
    assert all(s >= SLEEP_MS for s in starts)
    assert max(abs(e) for e in ends) < 0.1  # the two traces share a clock here (measured: within 5 µs)
    get_batch = [_torch_get_batch_ms(t) for t in traces]
    assert min(get_batch[1]) >= SLEEP_MS and max(get_batch[0]) < SLEEP_MS


def test_torch_clean_run_has_rank_0_late_by_itself() -> None:
    a, b = (_torch_allreduces(_torch("clean", r)) for r in (0, 1))
    starts, ends = _lateness_ms(a, b)
    # Measured: rank 1 starts 14-27 ms EARLIER (rank 0 is the late one without any sleep), ends within 5 µs.
    assert all(s < 0 for s in starts) and max(abs(e) for e in ends) < 0.1
