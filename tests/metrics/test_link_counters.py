"""The link counters (nsys GPU metrics) on real 2-GPU captures, against plain SQL on the exports.

tests/fixtures/h200x2_links: DDP on 2×H200 (NVLink NV18) with each rank's nsys sampling its own
GPU at 10 kHz, P2P and NCCL_P2P_DISABLE=1 (SHM). The references read the exports with sqlite3
alone and follow docs/links.md: a sample belongs to the GPU ``typeId & 0xFF``; PCIe / NVLink of a
sample = max(RX, TX) with NVLink user data = requests + responses; a sample is over an NCCL kernel
when start <= timestamp <= end; the NCCL kernels are those launched inside a `Batch N` range.
"""

from __future__ import annotations

import gzip
import itertools
import shutil
import sqlite3
import statistics
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import OWN
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.metrics.link_counters import LINK_BUSY_PCT, IntervalMarks
from traceguard.pipeline import analyze

LINKS = OWN / "h200x2_links"

#: Per sample time of the file's own GPU: PCIe RX/TX, NVLink RX/TX user data (requests + responses).
SAMPLES = """
SELECT g.timestamp,
  SUM(CASE WHEN i.metricName = 'PCIe RX Throughput [Throughput %]' THEN g.value END) AS pcie_rx,
  SUM(CASE WHEN i.metricName = 'PCIe TX Throughput [Throughput %]' THEN g.value END) AS pcie_tx,
  SUM(CASE WHEN i.metricName LIKE 'NVLink RX Re% User Data [Throughput %]' THEN g.value END) AS nvlink_rx,
  SUM(CASE WHEN i.metricName LIKE 'NVLink TX Re% User Data [Throughput %]' THEN g.value END) AS nvlink_tx,
  SUM(CASE WHEN i.metricName = 'SMs Active [Throughput %]' THEN g.value END) AS sm_active,
  g.typeId & 255 AS gpu
FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS i ON i.typeId = g.typeId AND i.metricId = g.metricId
WHERE g.timestamp >= 0
GROUP BY g.timestamp, g.typeId ORDER BY g.timestamp"""

#: The NCCL kernels launched inside a `Batch N` range (DESIGN.md's attribution).
NCCL_IN_STEPS = """
SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k
JOIN StringIds s ON s.id = k.shortName
JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
WHERE s.value LIKE 'nccl%' AND EXISTS (
  SELECT 1 FROM NVTX_EVENTS e LEFT JOIN StringIds t ON t.id = e.textId
  WHERE coalesce(e.text, t.value) GLOB 'Batch [0-9]*' AND e.start <= r.start AND r.start < e.end)
ORDER BY k.start"""


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, int], Path]:
    out = {}
    for run in ("p2p", "shm"):
        for rank in (0, 1):
            target = tmp_path_factory.mktemp(f"{run}{rank}") / "cap.sqlite"
            with gzip.open(LINKS / run / f"cap_{rank}.sqlite.gz") as src, target.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            out[(run, rank)] = target
    return out


@pytest.fixture(scope="module")
def analyses() -> dict[str, object]:
    return {run: analyze([str(LINKS / run)]) for run in ("p2p", "shm")}


def _reference(path: Path) -> tuple[list[tuple], list[tuple[int, int]]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(SAMPLES).fetchall(), conn.execute(NCCL_IN_STEPS).fetchall()


def _midpoints(samples: list[tuple]) -> list[tuple]:
    """The samples at the middle of the period each averages: a stamp starts its period (docs/links.md)."""
    period = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(samples))
    half = round(0.5e9 / round(1e9 / period, 1))
    return [(s[0] + half, *s[1:]) for s in samples]


def _over(samples: list[tuple], kernels: list[tuple[int, int]]) -> list[tuple]:
    return [s for s in samples if any(start <= s[0] <= end for start, end in kernels)]


@pytest.mark.parametrize("run", ["p2p", "shm"])
@pytest.mark.parametrize("rank", [0, 1])
def test_reader_gives_each_sample_of_the_ranks_gpu(exports: dict, run: str, rank: int) -> None:
    samples, _ = _reference(exports[(run, rank)])
    capture = read_nsys_sqlite(exports[(run, rank)], launches_only=True)
    frame = capture.link_samples
    # One collector per GPU: the rank's file holds its own GPU's samples only, and it is the
    # device its kernels ran on (cuDevice of TARGET_INFO_GPU id typeId & 0xFF).
    assert {s[6] for s in samples} == {rank}
    assert frame["device"].unique().to_list() == [rank] == capture.gpu_ops["device"].unique().to_list()
    assert frame["time"].to_list() == [s[0] for s in samples]
    for column, at in (("pcie_rx_pct", 1), ("pcie_tx_pct", 2), ("nvlink_rx_pct", 3), ("nvlink_tx_pct", 4)):
        assert frame[column].to_list() == [float(s[at]) for s in samples], column
    assert frame["sm_active_pct"].to_list() == [float(s[5]) for s in samples]
    info = capture.info.gpu_metrics
    assert info is not None and info["source"] == "GPU_METRICS"
    assert info["names"]["nvlink_tx_pct"] == [
        "NVLink TX Requests User Data [Throughput %]",
        "NVLink TX Responses User Data [Throughput %]",
    ]
    assert "NVLink TX Requests Protocol Data [Throughput %]" in info["other_names"]
    assert info["frequency_hz"] == pytest.approx(10_000, rel=0.01)


@pytest.mark.parametrize("run", ["p2p", "shm"])
def test_nccl_time_figures_equal_sql(exports: dict, analyses: dict, run: str) -> None:
    for result in analyses[run].result.ranks:
        samples, kernels = _reference(exports[(run, result.rank)])
        samples = _midpoints(samples)
        over = _over(samples, kernels)
        pcie = [max(s[1], s[2]) for s in over]
        nvlink = [max(s[3], s[4]) for s in over]
        m = result.metrics
        assert m["link_nccl_samples"] == len(over) > 50
        assert m["pcie_nccl_peak"] == pytest.approx(max(pcie) / 100)
        assert m["pcie_nccl_avg"] == pytest.approx(statistics.fmean(pcie) / 100, abs=1e-5)
        assert m["nvlink_nccl_avg"] == pytest.approx(statistics.fmean(nvlink) / 100, abs=1e-5)
        assert m["pcie_nccl_p95"] == pytest.approx(np.percentile(pcie, 95) / 100, abs=1e-5)
        on_nvlink = sum(1 for v in nvlink if v >= LINK_BUSY_PCT)
        on_pcie = sum(1 for v, p in zip(nvlink, pcie, strict=True) if v < LINK_BUSY_PCT and p >= LINK_BUSY_PCT)
        assert m["nccl_nvlink_share"] == pytest.approx(on_nvlink / len(over))
        assert m["nccl_pcie_share"] == pytest.approx(on_pcie / len(over))


def test_where_the_bytes_went(analyses: dict) -> None:
    """P2P: the NCCL kernels' samples show NVLink busy, PCIe idle; SHM: the reverse."""
    for result in analyses["p2p"].result.ranks:
        m = result.metrics
        assert m["nccl_nvlink_share"] > 0.9 and m["nccl_pcie_share"] == 0
        assert m["nvlink_nccl_avg"] > 0.5 and m["pcie_nccl_peak"] < 0.05
    for result in analyses["shm"].result.ranks:
        m = result.metrics
        assert m["nccl_pcie_share"] > 0.95 and m["nccl_nvlink_share"] == 0
        assert m["nvlink_nccl_peak"] == 0 and m["pcie_nccl_peak"] > 0.9


@pytest.mark.parametrize("run", ["p2p", "shm"])
def test_step_fields_equal_sql(exports: dict, analyses: dict, run: str) -> None:
    for result in analyses[run].result.ranks:
        samples, kernels = _reference(exports[(run, result.rank)])
        samples = _midpoints(samples)
        assert len(result.steps) == 2
        for step in result.steps:
            lo, hi = step["gpu_start_ns"], step["gpu_start_ns"] + step["gpu_span_ns"]
            inside = [s for s in samples if lo <= s[0] <= hi]
            pcie = [max(s[1], s[2]) for s in inside]
            assert step["pcie_avg_pct"] == pytest.approx(statistics.fmean(pcie), abs=1e-3)
            assert step["pcie_peak_pct"] == max(pcie)
            nvlink = [max(s[3], s[4]) for s in _over(inside, kernels)]
            assert step["nccl_nvlink_avg_pct"] == pytest.approx(statistics.fmean(nvlink), abs=1e-3)


def test_checks_from_the_capture_alone(tmp_path: Path) -> None:
    """No dmon, no NCCL log: SHM fails pcie_saturation with the peak and average during NCCL;
    with `nvidia-smi topo -m` (which GPUs are NVLink peers) transport_p2p fails too; P2P passes."""
    shm = [str(LINKS / "shm" / f"cap_{r}.sqlite.gz") for r in (0, 1)]
    alone = {c.id: c for c in analyze(shm).checks}
    pcie = alone["pcie_saturation"]
    assert pcie.status == "fail" and pcie.value == pytest.approx(0.94)
    assert "nsys GPU metrics during NCCL kernels" in pcie.message and "peak 94%" in pcie.message
    assert "average 7" in pcie.message
    assert [row["source"] for row in pcie.evidence] == ["nsys GPU metrics", "nsys GPU metrics"]
    # Without topo the peers are unknown: skip, and the reason carries what the capture shows.
    assert alone["transport_p2p"].status == "skip"
    assert "NVLink idle" in alone["transport_p2p"].reason and "topo -m" in alone["transport_p2p"].reason
    with_topo = {c.id: c for c in analyze([*shm, str(LINKS / "shm" / "topo.txt")]).checks}
    transport = with_topo["transport_p2p"]
    assert transport.status == "fail" and transport.value == 1
    assert [e["finding"] for e in transport.evidence] == ["pcie_while_nvlink_idle"]
    assert "rank 0 (GPU 0)" in transport.evidence[0]["lines"][0]
    p2p = [str(LINKS / "p2p" / f"cap_{r}.sqlite.gz") for r in (0, 1)] + [str(LINKS / "p2p" / "topo.txt")]
    checks = {c.id: c for c in analyze(p2p).checks}
    assert checks["pcie_saturation"].status == "pass" and checks["pcie_saturation"].value == pytest.approx(0.01)
    assert checks["transport_p2p"].status == "pass" and checks["transport_p2p"].value == 0


def test_both_sources_shown(analyses: dict) -> None:
    """The bundle holds dmon too: both sources are evidence, the worse decides and is named."""
    result = analyses["shm"].result
    assert result.metrics["pcie_saturation_source"] == "nsys GPU metrics"
    pcie = next(c for c in analyses["shm"].checks if c.id == "pcie_saturation")
    assert {row["source"] for row in pcie.evidence} == {"nvidia-smi dmon", "nsys GPU metrics"}
    assert "the verdict is the worse: nsys GPU metrics" in pcie.message
    # The bundle's NCCL log and the link counters agree: one pair, found by both.
    transport = next(c for c in analyses["shm"].checks if c.id == "transport_p2p")
    assert {e["finding"] for e in transport.evidence} >= {"shm_within_node", "pcie_while_nvlink_idle"}
    assert transport.value == 1


def test_no_metrics_is_null_with_the_reason() -> None:
    result = analyze([str(OWN / "h100x2_waits" / "clean_nsys")]).result
    for rank in result.ranks:
        assert rank.metrics["pcie_nccl_peak"] is None
        assert "no GPU metrics" in rank.null_reasons["pcie_nccl_peak"]
        assert "--gpu-metrics-devices" in rank.null_reasons["pcie_nccl_peak"]
        assert all(step["pcie_avg_pct"] is None for step in rank.steps)
        assert rank.timeline["link_lane"]["null_reason"]


def test_sliced_analysis_gives_the_same_link_figures() -> None:
    whole = analyze([str(LINKS / "shm")], sliced_above=10**12).result
    sliced = analyze([str(LINKS / "shm")], sliced_above=1).result
    for a, b in zip(whole.ranks, sliced.ranks, strict=True):
        assert a.link_counters == b.link_counters
        assert [s["pcie_avg_pct"] for s in a.steps] == [s["pcie_avg_pct"] for s in b.steps]
        assert a.link_counters["over"]["copies"]["pcie"]["peak"] is not None


def test_link_lane_buckets_keep_the_peaks(analyses: dict) -> None:
    for result in analyses["shm"].result.ranks:
        lane = result.timeline["link_lane"]
        assert len(lane["start"]) == len(lane["pcie_peak"]) <= 1500
        assert max(v for v in lane["pcie_peak"] if v is not None) == pytest.approx(
            result.metrics["pcie_nccl_peak"] * 100
        )


def test_interval_marks_fed_in_parts_equal_one_feed() -> None:
    rng = np.random.default_rng(7)
    times = np.sort(rng.integers(0, 10_000, 500))
    starts = rng.integers(0, 10_000, 80)
    ends = starts + rng.integers(0, 300, 80)
    whole = IntervalMarks(times)
    whole.mark(starts, ends)
    parts = IntervalMarks(times)
    for chunk in np.array_split(np.arange(80), 5):
        parts.mark(starts[chunk], ends[chunk])
    expected = np.array([any(s <= t <= e for s, e in zip(starts, ends, strict=True)) for t in times])
    assert (whole.mask() == expected).all() and (parts.mask() == expected).all()


def test_gpu_metrics_of_another_gpu_are_not_the_ranks(exports: dict, tmp_path: Path) -> None:
    """A file whose samples are of a GPU the rank did not use: null, saying to give each rank's nsys its own GPU."""
    target = tmp_path / "other_gpu.sqlite"
    shutil.copyfile(exports[("shm", 0)], target)
    with sqlite3.connect(target) as conn:  # the samples relabelled as GPU 1's: rank 0 ran on GPU 0
        conn.execute("UPDATE GPU_METRICS SET typeId = typeId + 1")
        conn.execute("UPDATE TARGET_INFO_GPU_METRICS SET typeId = typeId + 1")
    result = analyze([str(target)]).result
    reason = result.ranks[0].null_reasons["pcie_nccl_peak"]
    assert "not on this rank's GPU 0" in reason and "$LOCAL_RANK" in reason
    assert isinstance(read_nsys_sqlite(target).link_samples, pl.DataFrame)


def test_damaged_counters_are_unknown_not_saturated(exports: dict, tmp_path: Path) -> None:
    """A catalog id that is not an integer names no counter; a throughput outside 0..100 % is
    unknown, never clipped into a full link; neither stops the analysis."""
    target = tmp_path / "damaged.sqlite"
    shutil.copyfile(exports[("shm", 0)], target)
    with sqlite3.connect(target) as conn:
        conn.execute(
            "UPDATE TARGET_INFO_GPU_METRICS SET metricId = 'abc' WHERE metricName = 'SMs Active [Throughput %]'"
        )
        (pcie_rx,) = conn.execute(
            "SELECT metricId FROM TARGET_INFO_GPU_METRICS WHERE metricName = 'PCIe RX Throughput [Throughput %]'"
        ).fetchone()
        damaged = conn.execute(
            "UPDATE GPU_METRICS SET value = 100000 WHERE metricId = ? AND rowid % 7 = 0", (pcie_rx,)
        ).rowcount
    samples, _ = _reference(exports[("shm", 0)])
    result = analyze([str(target)]).result.ranks[0]
    links = result.link_counters
    assert links["invalid_values"] == damaged > 0
    assert "sm_active_pct" not in links["names"]
    # The damaged samples' RX is unknown: the peak stays the real one (TX and the other RX samples).
    assert result.metrics["pcie_nccl_peak"] <= max(max(s[1], s[2]) for s in samples) / 100 < 1
