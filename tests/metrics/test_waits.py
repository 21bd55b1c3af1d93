"""Who waits for whom (metrics.waits, metrics.breakdown) on real captures, against plain SQL / JSON.

The references here read the files with sqlite3 and json alone and follow docs/collectives.md:
wall clock = session start (or Kineto base) + event time; rank 1's offset = the median of
(rank 0's end − rank 1's end) over the matched calls; wait = last arrival − arrival (at most the
kernel), transfer = the rest.
"""

from __future__ import annotations

import gzip
import itertools
import json
import sqlite3
import statistics
from decimal import Decimal
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import OWN, PUBLIC, needs_native
from traceguard.metrics.breakdown import FIELDS
from traceguard.metrics.waits import RESIDUAL_LIMIT_NS, RankClock, reduce_waits
from traceguard.pipeline import analyze

BUCKET25 = OWN / "h200" / "p2p_nsys_bucket25"
HTA = PUBLIC / "kineto" / "facebookresearch__HolisticTraceAnalysis__tests__data__trace_filter__sampled_rank-{}.json.gz"
MFU = PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"

#: NCCL kernels whose launching runtime call starts inside a `Batch N` range of the same process
#: (DESIGN.md's attribution), on the wall clock.
IN_STEPS = """
SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds s ON s.id = k.shortName
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
WHERE s.value LIKE 'nccl%' AND EXISTS (
  SELECT 1 FROM NVTX_EVENTS e LEFT JOIN StringIds t ON t.id = e.textId
  WHERE coalesce(e.text, t.value) GLOB 'Batch [0-9]*' AND e.start <= r.start AND r.start < e.end
    AND (e.globalTid >> 24) = (r.globalTid >> 24))
ORDER BY k.start"""


def _split(kernels: list[list[tuple[int, int]]]) -> tuple[list[int], list[int], int]:
    """Per rank Σ wait and Σ transfer of calls matched k-th to k-th, and rank 1's clock offset."""
    offset = round(statistics.median(a[1] - b[1] for a, b in zip(kernels[0], kernels[1], strict=True)))
    aligned = [kernels[0], [(s + offset, e + offset) for s, e in kernels[1]]]
    wait, transfer = [0, 0], [0, 0]
    for calls in zip(*aligned, strict=True):
        last = max(start for start, _ in calls)
        for rank, (start, end) in enumerate(calls):
            waited = min(max(last - start, 0), end - start)
            wait[rank] += waited
            transfer[rank] += end - start - waited
    return wait, transfer, offset


def _nsys_kernels(path: Path) -> list[tuple[int, int]]:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    (base,) = db.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
    return [(start + base, end + base) for start, end in db.execute(IN_STEPS)]


def test_nsys_split_equals_plain_sql(unpacked) -> None:
    """2×H200 DDP with 25 MB buckets: rank 1 launches each bucket's all-reduce as soon as its
    backward produced it and waits for rank 0 (bench/gpu/README.md saw it in kernel time alone)."""
    paths = [unpacked(BUCKET25 / f"cap_{r}.sqlite.gz") for r in (0, 1)]
    kernels = [_nsys_kernels(p) for p in paths]
    assert [len(k) for k in kernels] == [111, 111]
    wait, transfer, offset = _split(kernels)
    report = analyze([str(p) for p in paths]).report
    ranks = report["ranks"]
    assert [r["metrics"]["nccl_wait_ns"] for r in ranks] == wait
    assert [r["metrics"]["nccl_transfer_ns"] for r in ranks] == transfer
    run = report["run"]
    clock = run["clock_alignment"]
    assert clock["trusted"] and clock["ranks"][1]["offset_ns"] == offset
    assert all(r["residual_ns"] < 5_000 for r in clock["ranks"])  # ends agree to microseconds
    assert run["metrics"]["collective_instances_matched"] == 111
    assert run["metrics"]["nccl_wait_share"] == pytest.approx(sum(wait) / (sum(wait) + sum(transfer)))
    # Rank 0 arrives last at 110 of the 111 all-reduces: rank 1 spends 91 % of its NCCL time waiting.
    assert run["metrics"]["late_rank"] == 0
    assert run["late_rank"]["last_arrivals"] == 110
    assert ranks[1]["metrics"]["nccl_wait_share"] > 0.9
    # Kernel time = wait + transfer, per rank and per step.
    for r in ranks:
        for step in r["steps"]:
            assert step["nccl_wait_ns"] + step["nccl_transfer_ns"] == step["nccl_ns"]
    # The verdict follows the cause. Rank 1 launches each bucket as backward produces it and spins
    # until rank 0 arrives, beside its own backward: 6 ms of the 160 ms waiting is exposed (0.97 %
    # of the steps), so collective_wait has no finding; nccl_step_share (kernel time) still warns,
    # says the time is waiting, and its remedy is rank 0's host, with what the waiting costs.
    checks = {c["id"]: c for c in report["checks"]}
    exposed = sum(s["comm_wait_ns"] for r in ranks for s in r["steps"]) / sum(
        s["period_ns"] for r in ranks for s in r["steps"]
    )
    assert run["metrics"]["exposed_wait_share"] == pytest.approx(exposed)
    assert checks["collective_wait"]["status"] == "skip"
    assert "min_exposed_wait_share" in checks["collective_wait"]["reason"]
    assert checks["nccl_step_share"]["status"] in ("warn", "fail")
    assert "83% of the NCCL kernel time waits for the last rank" in checks["nccl_step_share"]["message"]
    assert "rank 0 arrived last at 110 of 111" in checks["nccl_step_share"]["message"]
    assert "make rank 0 arrive on time" in checks["nccl_step_share"]["remedy"]
    assert f"Of the waiting, {exposed:.1%} of the steps' GPU time has no compute" in checks["nccl_step_share"]["remedy"]


def test_kineto_late_rank_fails_collective_wait() -> None:
    """One 1.23 GB bucket: rank 0 waits at the end of backward for rank 1, all of it exposed."""
    report = analyze([str(OWN / "h200" / "p2p_torch")]).report
    check = next(c for c in report["checks"] if c["id"] == "collective_wait")
    assert check["status"] == "fail"
    assert check["message"].split(";")[1].strip().startswith("rank 1 arrived last at 3 of 3 matched collectives")
    assert "make rank 1 arrive on time" in check["remedy"]


def _kineto_kernels(path: Path) -> tuple[int, list[tuple[int, int]]]:
    trace = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    base = int(trace["baseTimeNanoseconds"])
    kernels = [
        (int(e["ts"] * 1000) + base, int((e["ts"] + e["dur"]) * 1000) + base)
        for e in trace["traceEvents"]
        if e.get("cat") == "kernel" and e["name"].startswith("nccl")
    ]
    return base, sorted(kernels)


def test_kineto_split_equals_plain_json() -> None:
    """2×H200 DDP under torch.profiler, one 1.23 GB bucket: ranks on Kineto's base + ts."""
    run_dir = OWN / "h200" / "p2p_torch"
    kernels = [_kineto_kernels(run_dir / f"rank{r}.trace.json.gz")[1] for r in (0, 1)]
    wait, transfer, _ = _split(kernels)
    report = analyze([str(run_dir)]).report
    ranks = report["ranks"]
    assert [r["metrics"]["nccl_wait_ns"] for r in ranks] == pytest.approx(wait, abs=3)  # ts are µs with 3 decimals
    assert [r["metrics"]["nccl_transfer_ns"] for r in ranks] == pytest.approx(transfer, abs=3)
    assert report["run"]["clock_alignment"]["ranks"][0]["base_source"] == "Kineto baseTimeNanoseconds"
    assert report["run"]["metrics"]["late_rank"] == 1


def test_public_nsys_pair_of_processes_is_matched_point_to_point(unpacked) -> None:
    """nsys-ai's mfu_2gpu_before: two GPU processes in one export (two ranks), SendRecv kernels
    only, one session clock; every SendRecv of the window is matched and the ends agree."""
    report = analyze([str(unpacked(MFU))]).report
    run = report["run"]
    assert run["clock_alignment"]["trusted"]
    assert all(r["residual_ns"] < RESIDUAL_LIMIT_NS for r in run["clock_alignment"]["ranks"])
    matched = run["metrics"]["collective_instances_matched"]
    assert matched == min(r["metrics"]["nccl_kernels"] for r in report["ranks"]) > 10
    for r in report["ranks"]:
        assert r["metrics"]["nccl_wait_ns"] + r["metrics"]["nccl_transfer_ns"] <= r["metrics"]["nccl_time_ns"]
        assert r["metrics"]["last_arrivals"]["of"] == matched


def test_clocks_that_disagree_leave_the_split_null_with_the_reason() -> None:
    """HTA's sampled pair of a 128-rank job: no clock base, and the ten SendRecv kernels of each
    rank are not one another's peers' (the ends lie milliseconds apart): no split, no late rank."""
    report = analyze([str(HTA).format(0), str(HTA).format(1)]).report
    run = report["run"]
    assert run["clock_alignment"]["trusted"] is False
    reason = run["clock_alignment"]["reason"]
    assert "disagree" in reason
    for key in ("nccl_wait_share", "late_rank"):
        assert run["metrics"][key] is None and run["metrics"]["null_reasons"][key] == reason
    assert all(r["metrics"]["last_arrivals"] is None for r in report["ranks"])
    check = next(c for c in report["checks"] if c["id"] == "collective_wait")
    assert check["status"] == "skip" and check["reason"] == reason


def test_one_rank_has_no_split(unpacked) -> None:
    report = analyze([str(unpacked(BUCKET25 / "cap_0.sqlite.gz"))]).report
    assert report["run"]["metrics"]["null_reasons"]["nccl_wait_share"] == "needs at least two ranks"
    assert next(c for c in report["checks"] if c["id"] == "collective_wait")["status"] == "skip"


def test_windows_cut_differently_are_matched_by_shifting_the_order(unpacked) -> None:
    """Without step markers calls match by order; a window that lost its first calls on one rank
    is lined up by the shift whose ends agree."""
    analysis = analyze([str(unpacked(BUCKET25 / f"cap_{r}.sqlite.gz")) for r in (0, 1)])
    results = analysis.result.ranks

    def clock(r, source: str) -> RankClock:
        return RankClock(r.rank, r.clock["base_ns"], r.clock["source"], r.clock["host"], source)

    whole = reduce_waits([(clock(r, "inferred"), r.instances) for r in results])
    cut = results[1].instances.sort("start").slice(3)
    shifted = reduce_waits(
        [(clock(results[0], "inferred"), results[0].instances), (clock(results[1], "inferred"), cut)]
    )
    assert whole.metrics["collective_instances_matched"] == 111
    assert shifted.metrics["collective_instances_matched"] == 108
    assert shifted.metrics["collective_instances_unmatched"] == 3
    assert shifted.clock_alignment["trusted"]
    assert shifted.clock_alignment["ranks"][1]["offset_ns"] == pytest.approx(
        whole.clock_alignment["ranks"][1]["offset_ns"], abs=2_000
    )
    assert shifted.metrics["late_rank"] == whole.metrics["late_rank"] == 0


# ---------------------------------------------------------------- the step breakdown


def _reference_breakdown(path: Path, bounds: list[int]) -> list[dict[str, int]]:
    """The five parts of each period by brute force: every elementary interval between op
    boundaries is classified (compute > NCCL > copy > idle; idle by the launch of the next op)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    ops = []
    for table, kind in (
        ("CUPTI_ACTIVITY_KIND_KERNEL", "k"),
        ("CUPTI_ACTIVITY_KIND_MEMCPY", "c"),
        ("CUPTI_ACTIVITY_KIND_MEMSET", "c"),
    ):
        name = "s.value" if kind == "k" else "''"
        join = "JOIN StringIds s ON s.id = o.shortName" if kind == "k" else ""
        sql = (
            f"SELECT o.start, o.end, {name}, r.start FROM {table} o {join} LEFT JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = o.correlationId AND (r.globalTid >> 24) = (o.globalPid >> 24)"
        )
        for start, end, text, launch in db.execute(sql):
            category = 2 if kind == "c" else (1 if text.startswith("nccl") else 0)
            ops.append((start, max(end, start), category, -1 if launch is None else launch))
    ops.sort()
    # A sweep over every op boundary: between two consecutive boundaries the running ops per
    # category are known, so each elementary interval is classified on its own.
    events: dict[int, list[int]] = {}
    for start, end, category, _ in ops:
        if end > start:
            events.setdefault(start, [0, 0, 0])[category] += 1
            events.setdefault(end, [0, 0, 0])[category] -= 1
    points = sorted(set(events) | set(bounds))
    starts = np.array([o[0] for o in ops])
    running = [0, 0, 0]
    idle_since = bounds[0]
    out = [dict.fromkeys(FIELDS[1:], 0) for _ in bounds[:-1]]
    for a, b in itertools.pairwise(points):
        was_busy = any(running)
        for c, change in enumerate(events.get(a, (0, 0, 0))):
            running[c] += change
        if was_busy and not any(running):
            idle_since = a
        if b <= bounds[0] or a >= bounds[-1]:
            continue
        k = int(np.searchsorted(bounds, a, side="right")) - 1
        if running[0]:
            field = "compute_ns"
        elif running[1]:
            field = "comm_ns"
        elif running[2]:
            field = "copy_ns"
        else:
            nxt = int(np.searchsorted(starts, b, side="left"))
            host = nxt < len(ops) and ops[nxt][3] >= max(idle_since, bounds[0])
            field = "idle_host_ns" if host else "idle_other_ns"
        out[k][field] += b - a
    return out


def test_step_breakdown_equals_brute_force_and_adds_up(unpacked) -> None:
    path = unpacked(OWN / "h200" / "p2p_nsys" / "cap_1.sqlite.gz")
    report = analyze([str(path)]).report
    steps = report["ranks"][0]["steps"]
    for step in steps:
        parts = sum(step[f] for f in FIELDS[1:])
        assert parts == step["period_ns"]
    # The periods: from the first step's range start on the host (before its first kernel) to
    # each step's GPU end, so the periods are contiguous.
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    begin = db.execute(
        "SELECT min(e.start) FROM NVTX_EVENTS e LEFT JOIN StringIds t ON t.id = e.textId "
        "WHERE coalesce(e.text, t.value) GLOB 'Batch [0-9]*'"
    ).fetchone()[0]
    expected = _reference_breakdown(path, _bounds(report, begin))
    got = [{f: s[f] for f in FIELDS[1:]} for s in steps]
    assert got == expected
    # This rank's host is slow to launch: its GPU idles waiting for it every step.
    assert all(s["idle_host_ns"] > 5_000_000 for s in steps)


def _bounds(report: dict, begin: int) -> list[int]:
    """Period bounds from the report's steps: the first step's start, then each GPU end."""
    steps = report["ranks"][0]["steps"]
    total = begin
    bounds = [begin]
    for s in steps:
        total += s["period_ns"]
        bounds.append(total)
    return bounds


def test_step_breakdown_frame_matches_report(unpacked) -> None:
    """The breakdown's fields are in the step rows of the report for every rank with GPU steps."""
    report = analyze([str(unpacked(BUCKET25 / f"cap_{r}.sqlite.gz")) for r in (0, 1)]).report
    frame = pl.DataFrame(
        [{**{f: s[f] for f in FIELDS}, "rank": r["rank"]} for r in report["ranks"] for s in r["steps"]]
    )
    assert frame.height == 6 and frame.null_count().sum_horizontal().item() == 0


def test_the_c_loop_equals_the_numpy_one(unpacked) -> None:
    """The compiled loop (metrics/_breakdown.c) and the NumPy unions give the same breakdown,
    fed in many chunks, on a real capture of every kind of op (kernels, NCCL, copies, sets)."""
    from traceguard.ingest import read_capture
    from traceguard.metrics import breakdown, nccl
    from traceguard.metrics.steps import attribute, find_phases, resolve_steps, step_spans

    needs_native(breakdown._native is not None, "traceguard.metrics._breakdown")
    capture = read_capture(unpacked(BUCKET25 / "cap_0.sqlite.gz"))
    resolved = resolve_steps(capture.ranges, capture.gpu_ops, capture.strings, (), ("convention",))
    ops = attribute(capture.gpu_ops, capture.api_calls, resolved.steps, find_phases(capture.ranges, resolved.steps))
    ops = nccl.mark_nccl(ops, capture.strings)
    bounds, indices = breakdown.periods(resolved.steps, step_spans(ops), gpu_timed=False)
    arrays = breakdown.op_arrays(ops)
    assert arrays.runs.size > 2  # kernels, copies and sets: sorted runs the C loop merges
    order = arrays.order()
    results = []
    for native in (True, False):
        account = breakdown.StepBreakdown(bounds, indices, native=native)
        for lo in range(0, arrays.start.size, 977):  # odd chunks in start order: carries cross every boundary
            take = order[lo : lo + 977]
            device = np.full(take.size, arrays.sole_device, dtype=np.int64)
            account.feed(
                device,
                arrays.start[take],
                np.maximum(arrays.end[take], arrays.start[take]),
                arrays.launch[take],
                arrays.category[take],
            )
        results.append(account.rows())
    merged = breakdown.StepBreakdown(bounds, indices)
    breakdown.feed_arrays(merged, arrays)  # the runs as they are, merged in C
    results.append(merged.rows())
    assert results[0] == results[2]
    assert results[0] == results[1]
    assert results[0] == breakdown.whole_breakdown(ops, bounds, indices)
    assert len(results[0]) == 3 and all(r["compute_ns"] > 0 and r["comm_ns"] > 0 for r in results[0].values())


# ---------------------------------------------------------------- known late ranks (--slow-rank)

H100 = OWN / "h100x2_waits"


def test_the_slowed_rank_is_the_late_rank_on_2xh100_nsys(unpacked) -> None:
    """2×H100, rank 1's host sleeps 30 ms in every `get batch` (harness --slow-rank 1:30): rank 1
    is last at every all-reduce, rank 0's NCCL time is mostly waiting, and the sums are SQL's."""
    paths = [unpacked(H100 / "slow_nsys" / f"cap_{r}.sqlite.gz") for r in (0, 1)]
    kernels = [_nsys_kernels(p) for p in paths]
    wait, transfer, _ = _split(kernels)
    lateness = statistics.median(b[0] - a[0] for a, b in zip(*kernels, strict=True))
    report = analyze([str(H100 / "slow_nsys")]).report
    ranks, run = report["ranks"], report["run"]
    assert [r["metrics"]["nccl_wait_ns"] for r in ranks] == wait
    assert [r["metrics"]["nccl_transfer_ns"] for r in ranks] == transfer
    assert run["metrics"]["late_rank"] == 1
    assert run["late_rank"]["last_arrivals"] == run["late_rank"]["of"] == 6
    assert run["late_rank"]["median_late_ns"] == pytest.approx(lateness, abs=20_000)  # the clock refinement
    assert 30e6 < run["late_rank"]["median_late_ns"] < 45e6
    assert ranks[0]["metrics"]["nccl_wait_share"] > 0.85 and ranks[1]["metrics"]["nccl_wait_share"] < 0.05
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["collective_wait"]["status"] == "fail"
    assert "make rank 1 arrive on time" in checks["collective_wait"]["remedy"]
    # The straggler is rank 1 (the late one), not rank 0 whose GPU span holds the wait.
    assert checks["straggler"]["status"] == "fail"
    assert checks["straggler"]["evidence"][0]["latest_rank"] == 1
    assert "make rank 1 arrive on time" in checks["straggler"]["remedy"]
    # Without the step markers (steps inferred from the kernels), calls match by order: the same answer.
    inferred = analyze([str(H100 / "slow_nsys")], step_sources=["inferred"]).report
    assert {r["step_source"] for r in inferred["ranks"]} == {"inferred"}
    assert inferred["run"]["clock_alignment"]["matching"] == "order in the window (shift-aligned)"
    assert [r["metrics"]["nccl_wait_ns"] for r in inferred["ranks"]] == wait
    assert inferred["run"]["metrics"]["late_rank"] == 1


def test_the_shm_run_is_transfer_not_waiting(unpacked) -> None:
    """The same job with NCCL_P2P_DISABLE=1: the all-reduce crawls over shared memory, the ranks
    arrive within milliseconds: the NCCL time is transfer and the remedy stays the link's."""
    report = analyze([str(H100 / "shm_nsys")]).report
    assert report["run"]["metrics"]["nccl_wait_share"] < 0.1
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["collective_wait"]["status"] == "pass"
    assert checks["nccl_step_share"]["status"] in ("warn", "fail")
    assert "97% is transfer" in checks["nccl_step_share"]["message"]
    assert "arrive on time" not in checks["nccl_step_share"]["remedy"]
    assert "NCCL_P2P_DISABLE" in checks["nccl_step_share"]["remedy"]


def test_the_slowed_rank_is_the_late_rank_on_2xh100_torch_profiler() -> None:
    run_dir = H100 / "slow_torch"
    kernels = [_kineto_kernels(run_dir / f"rank{r}.trace.json.gz")[1] for r in (0, 1)]
    wait, transfer, _ = _split(kernels)
    report = analyze([str(run_dir)]).report
    assert [r["metrics"]["nccl_wait_ns"] for r in report["ranks"]] == pytest.approx(wait, abs=3)
    assert [r["metrics"]["nccl_transfer_ns"] for r in report["ranks"]] == pytest.approx(transfer, abs=3)
    assert report["run"]["metrics"]["late_rank"] == 1
    assert report["run"]["late_rank"]["last_arrivals"] == 3


def test_a_gloo_late_rank_is_named_from_its_c10d_calls() -> None:
    """CPU (gloo) with --slow-rank 1:40 under torch.profiler: the calls are c10d's `gloo:*`
    ranges; rank 1 reaches every one about 40 ms after rank 0. Wait and transfer are not split
    (a gloo call returns before the collective completes), and say why."""
    report = analyze([str(OWN / "slow_rank_cpu" / "torch")], profile="ci-cpu").report
    run = report["run"]
    assert run["metrics"]["late_rank"] == 1
    assert run["late_rank"]["last_arrivals"] == run["late_rank"]["of"] == run["metrics"]["collective_instances_matched"]
    assert 40e6 <= run["late_rank"]["median_late_ns"] < 50e6
    assert run["clock_alignment"]["method"].startswith("capture clock base only")
    assert "gloo" in run["metrics"]["null_reasons"]["nccl_wait_share"]
    straggler = next(c for c in report["checks"] if c["id"] == "straggler")
    assert straggler["status"] == "warn" and straggler["evidence"][0]["latest_rank"] == 1


def test_an_nsys_cpu_capture_without_c10d_ranges_says_so() -> None:
    report = analyze([str(OWN / "slow_rank_cpu" / "nsys")], profile="ci-cpu").report
    reason = report["run"]["metrics"]["null_reasons"]["late_rank"]
    assert reason.startswith("no rank has a collective call") and "nsys" in reason


# ---------------------------------------------------------------- every committed multi-rank run

MULTI_RANK = sorted(
    {p.parent for p in OWN.glob("h200*/*/cap_1.sqlite.gz")}
    | {p.parent for p in OWN.glob("h200*/*/rank1.trace.json.gz")}
    | {p.parent for p in OWN.glob("sweep_h200/*/cap_1.sqlite.gz")}
)


@pytest.mark.slow
@pytest.mark.parametrize("run_dir", MULTI_RANK, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_committed_run_reports_the_split_or_says_why(run_dir: Path) -> None:
    """On every committed multi-rank capture the split, the late rank and the clock residual are
    reported, or null with a reason; a collective_wait or straggler finding names its late rank."""
    report = analyze([str(run_dir)]).report
    run = report["run"]
    clock = run["clock_alignment"]
    assert clock["ranks"] and (clock["method"] or clock["reason"])
    if clock["trusted"]:
        assert all(r["residual_ns"] is not None and r["residual_ns"] < RESIDUAL_LIMIT_NS for r in clock["ranks"])
    else:
        assert clock["reason"]
    for key in ("nccl_wait_share", "late_rank", "exposed_wait_share"):
        assert run["metrics"][key] is not None or run["metrics"]["null_reasons"][key], key
    for check in report["checks"]:
        if check["id"] in ("collective_wait", "straggler") and check["status"] in ("warn", "fail"):
            assert "arrived last" in check["message"] or check["id"] == "straggler"


def test_cpu_calls_on_two_hosts_are_not_trusted() -> None:
    """The gloo pair again, told its ranks ran on two hosts: CPU calls cannot refine the clocks,
    so neither the lateness nor the late rank is reported."""
    results = analyze([str(OWN / "slow_rank_cpu" / "torch")], profile="ci-cpu").result.ranks
    clocks = [RankClock(r.rank, r.clock["base_ns"], r.clock["source"], f"host{r.rank}", r.step_source) for r in results]
    waits = reduce_waits([(clock, r.instances) for clock, r in zip(clocks, results, strict=True)])
    assert waits.clock_alignment["trusted"] is False
    assert "different (or unnamed) hosts" in waits.clock_alignment["reason"]
    assert waits.metrics["late_rank"] is None and waits.late is None
    assert all(row["last_arrivals"] is None for row in waits.per_rank.values())


def test_utilization_evidence_carries_the_traces_transfer_bandwidth() -> None:
    """Next to nccl-tests' numbers, p2p_utilization shows each rank's largest all-reduce from the
    trace: rank 0's kernel time read 112 GB/s (it waited for rank 1), its transfer time 336."""
    run_dir = OWN / "h200" / "p2p_nsys"
    bench = OWN / "collectives" / "h200x2" / "p2p_graph"
    report = analyze([str(bench), str(run_dir)]).report
    check = next(c for c in report["checks"] if c["id"] == "p2p_utilization")
    trace = [row for row in check["evidence"] if row.get("source") == "trace"]
    assert [row["rank"] for row in trace] == [0, 1]
    assert {row["bandwidth_time"] for row in trace} == {"transfer"}
    assert all(330 < row["busbw_gbps"] < 340 for row in trace)
    kernel = next(c for c in report["run"]["collectives"] if c["rank"] == 0)
    assert kernel["msg_bytes"] / kernel["median_ns"] < 120  # what kernel time alone said
