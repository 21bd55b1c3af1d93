"""The checklist's small-collectives failure (metrics/small_collectives.py, rule `small_collectives`).

DDP's 25 MB buckets and a single 2000 MB bucket must pass on our H200 captures; a CPU job that
all-reduces every gradient on its own must fail. Expected counts come from the traces themselves
(plain json / SQL), not from traceguard."""

from __future__ import annotations

import gzip
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN
from traceguard.metrics import small_collectives as small
from traceguard.pipeline import analyze

DTYPE_SIZES = {"Float": 4, "BFloat16": 2, "Half": 2, "Double": 8, "float": 4}


def _events(path: Path) -> list[dict]:
    raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    return json.loads(raw)["traceEvents"]


def _inside(ts: float, pid: object, steps: list[tuple[object, float, float]]) -> bool:
    return any(p == pid and start <= ts <= end for p, start, end in steps)


def _kineto_nccl_calls(path: Path) -> list[int]:
    """Payloads (bytes) of the NCCL kernels launched inside a `Batch N` range — plain json."""
    events = _events(path)
    steps = [
        (e["pid"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Batch ")
    ]
    launches = {
        e["args"]["correlation"]: (e["pid"], float(e["ts"]))
        for e in events
        # NCCL launches its kernels through the driver (cuLaunchKernelEx), others through the runtime.
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    payloads = []
    for e in events:
        if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl"):
            if e["args"]["correlation"] not in launches:
                continue  # launched before the profiler recorded calls: in no step by the launch rule
            pid, ts = launches[e["args"]["correlation"]]
            if _inside(ts, pid, steps):
                args = e["args"]
                elements = max(int(args["In msg nelems"]), int(args["Out msg nelems"]))
                payloads.append(elements * DTYPE_SIZES[args["dtype"]])
    return payloads


@pytest.mark.parametrize(
    ("run", "bucket_mb"), [("h200/nobucketview_torch", 25), ("h200/bf16_torch", 25), ("h200/p2p_torch", 2000)]
)
def test_ddp_buckets_pass_on_h200_kineto(run: str, bucket_mb: int) -> None:
    folder = OWN / run
    assert json.loads((folder / "rank0.json").read_text())["ddp"]["bucket_cap_mb"] == bucket_mb
    report = analyze([str(folder)]).report
    check = {c["id"]: c for c in report["checks"]}["small_collectives"]
    assert check["status"] == "pass", check
    for rank in report["ranks"]:
        payloads = _kineto_nccl_calls(folder / f"rank{rank['rank']}.trace.json.gz")
        metrics = rank["metrics"]
        assert metrics["collective_calls_sized"] == len(payloads)
        assert metrics["small_collective_calls"] == sum(p < small.DEFAULT_SMALL_BYTES for p in payloads) == 0
        bands = {row["band"]: row["calls"] for row in rank["small_collectives"]["sizes"]}
        assert sum(bands.values()) == len(payloads)
        assert bands.get("≥ 256 MiB", 0) == sum(p >= 256 << 20 for p in payloads)


def _nsys_nccl_calls_in_steps(db: Path) -> int:
    """NCCL kernels launched inside a `Batch N` range of their process — plain SQL."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    (count,) = con.execute(
        """
        WITH steps AS (
            SELECT (n.globalTid >> 24) & 16777215 AS pid, n.start, n.end
            FROM NVTX_EVENTS n LEFT JOIN StringIds s ON s.id = n.textId
            WHERE n.eventType = 59 AND COALESCE(n.text, s.value) LIKE 'Batch %')
        SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k
        JOIN StringIds kn ON kn.id = k.shortName
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r
          ON r.correlationId = k.correlationId AND (r.globalTid >> 24) = (k.globalPid >> 24)
        WHERE kn.value LIKE 'nccl%'
          AND EXISTS (SELECT 1 FROM steps WHERE steps.pid = (r.globalTid >> 24) & 16777215
                      AND r.start BETWEEN steps.start AND steps.end)
        """
    ).fetchone()
    con.close()
    return count


@pytest.mark.parametrize("run", ["sweep_h200/ddp", "sweep_h200/bucket_2000mb"])
def test_ddp_buckets_pass_on_h200_nsys(run: str, unpacked) -> None:
    folder = OWN / run
    report = analyze([str(folder)]).report
    assert {c["id"]: c for c in report["checks"]}["small_collectives"]["status"] == "pass"
    for rank in report["ranks"]:
        db = unpacked(folder / f"cap_{rank['rank']}.sqlite.gz")
        # Exported with --include-blobs=true: every kernel in the steps has its NCCL payload.
        assert rank["metrics"]["collective_calls_sized"] == _nsys_nccl_calls_in_steps(db)
        assert rank["metrics"]["small_collective_calls"] == 0


def _gloo_calls(path: Path) -> list[tuple[int, float]]:
    """(payload bytes, duration µs) of the gloo all-reduces called inside a `Batch N` — plain json."""
    events = _events(path)
    steps = [
        (e["pid"], float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("cat") == "user_annotation" and str(e.get("name", "")).startswith("Batch ")
    ]
    calls = []
    for e in events:
        if e.get("name") == "gloo:all_reduce" and _inside(float(e["ts"]), e["pid"], steps):
            dims = e["args"]["Input Dims"][0]
            elements = 1
            for d in dims:
                elements *= d
            calls.append((elements * DTYPE_SIZES[e["args"]["Input type"][0]], float(e["dur"])))
    return calls


def _harness(out: Path, *extra: str) -> None:
    cmd = [sys.executable, "-m", "traceguard.cli", "harness", "run", "--world-size", "2", "--backend", "gloo"]
    cmd += ["--capture", "torch", "--warmup", "1", "--steps", "2", "--mlp-width", "128", "--mlp-depth", "8"]
    result = subprocess.run([*cmd, "--out", str(out), *extra], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.slow
def test_per_parameter_allreduce_on_cpu_fails(tmp_path: Path) -> None:
    """The anti-pattern on purpose: every gradient of a 9-layer MLP all-reduced on its own (gloo)."""
    out = tmp_path / "per-param"
    _harness(out, "--comm", "per-param")
    report = analyze([str(out)], profile="ci-cpu").report
    check = {c["id"]: c for c in report["checks"]}["small_collectives"]
    assert check["status"] == "fail", check
    for rank in report["ranks"]:
        calls = _gloo_calls(out / f"rank{rank['rank']}.trace.json")
        assert len(calls) == 2 * 18  # 2 steps × (9 weights + 9 biases)
        small_calls = [c for c in calls if c[0] < small.DEFAULT_SMALL_BYTES]
        metrics = rank["metrics"]
        assert metrics["collective_calls_sized"] == len(calls)
        assert metrics["small_collective_calls"] == len(small_calls)
        assert metrics["small_collectives_per_step"] == len(small_calls) / 2
        expected_share = sum(d for _, d in small_calls) / sum(d for _, d in calls)
        assert metrics["small_collective_time_share"] == pytest.approx(expected_share, rel=1e-3)
        offenders = rank["small_collectives"]["offenders"]
        assert offenders[0]["issuer"] == "backward" and offenders[0]["collective"] == "AllReduce"
    assert any(row.get("issuer") == "backward" for row in check["evidence"])
    assert "bucket_cap_mb" in check["remedy"]


@pytest.mark.slow
def test_the_same_model_under_ddp_is_no_finding(tmp_path: Path) -> None:
    """DDP puts the same 9 layers in one bucket: one (small) call a step is not 'many'."""
    out = tmp_path / "ddp"
    _harness(out)
    report = analyze([str(out)], profile="ci-cpu").report
    check = {c["id"]: c for c in report["checks"]}["small_collectives"]
    assert check["status"] in ("pass", "skip"), check
    if check["status"] == "skip":
        assert "min_calls_per_step" in check["reason"]


# ---- the definitions on frames built to the edge cases -----------------------------------------


def _calls(*rows: tuple[str, int, int | None, int]) -> pl.DataFrame:
    return pl.DataFrame(
        [{"collective": c, "duration_ns": d, "payload_bytes": b, "step_id": s, "issuer": "x"} for c, d, b, s in rows],
        schema=small.CALL_SCHEMA,
    )


def test_the_bound_is_exclusive_and_unknown_sizes_are_left_out() -> None:
    bound = small.DEFAULT_SMALL_BYTES
    calls = _calls(("AllReduce", 10, bound - 1, 1), ("AllReduce", 30, bound, 1), ("AllGather", 60, None, 2))
    m, null, details = small.small_collectives(calls, step_count=2)
    assert (m["collective_calls_sized"], m["small_collective_calls"]) == (2, 1)
    assert m["small_collective_share"] == 0.5
    assert m["small_collective_time_share"] == pytest.approx(10 / 40)
    assert m["small_collectives_per_step"] == 0.5
    assert not null
    assert details["sizes"] == [
        {"collective": "AllReduce", "band": "64 KiB–1 MiB", "calls": 1},
        {"collective": "AllReduce", "band": "1–16 MiB", "calls": 1},
    ]


def test_no_sizes_is_null_with_the_way_to_get_them() -> None:
    m, null, _ = small.small_collectives(_calls(("AllReduce", 10, None, 1)), step_count=1)
    assert m["collective_calls_sized"] == 0 and m["small_collective_time_share"] is None
    assert "--include-blobs=true" in null["small_collective_time_share"]
    assert "record_shapes=True" in null["small_collective_time_share"]


def test_run_shares_come_from_the_sums() -> None:
    a, _, _ = small.small_collectives(_calls(("AllReduce", 10, 1, 1), ("AllReduce", 90, 1 << 30, 1)), 1)
    b, _, _ = small.small_collectives(_calls(("AllReduce", 50, 1, 1)), 1)
    run = small.run_totals([a, b], step_count=2)
    assert run["small_collective_time_share"] == pytest.approx(60 / 150)
    assert run["small_collective_share"] == pytest.approx(2 / 3)
    assert run["small_collectives_per_step"] == 1.0


@pytest.mark.parametrize("payload", [0, 4095, 4096, (1 << 20) - 1, 1 << 20, 300 << 20])
def test_band_expression_agrees_with_band(payload: int) -> None:
    frame = pl.DataFrame({"p": [payload]})
    assert frame.select(small.band_expr(pl.col("p"))).item() == small.band(payload)
