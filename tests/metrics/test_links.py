"""Link rules on our real 2×/4×H200 collective benchmarks (traceguard bench-collectives, nccl-tests
format) with their NCCL_DEBUG logs, nvidia-smi dmon / topo -m / -q files, and on the DDP captures'
own NCCL logs. Expected values are parsed here from the raw text, independently of traceguard."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import OWN, REPO
from traceguard.ingest.sides import side_files
from traceguard.pipeline import analyze

VALIDATOR = jsonschema.Draft202012Validator(json.loads((REPO / "docs" / "report.schema.json").read_text()))

COLL = OWN / "collectives"
RUNS = [
    ("h200x2", "p2p_graph", "P2P"),
    ("h200x2", "p2p_eager", "P2P"),
    ("h200x2", "shm_graph", "SHM"),
    ("h200x2", "net_graph", "NET"),
    ("h200x4", "p2p_graph", "P2P"),
    ("h200x4", "shm_graph", "SHM"),
]


def _all_reduce_rows(text: str) -> list[list[str]]:
    """Data rows of the all_reduce table, straight from the nccl-tests text."""
    block = text.split("all_reduce_perf", 1)[1].split("Collective test concluded", 1)[0]
    return [line.split() for line in block.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\w+", line)]


def _max_bw(run_dir: Path) -> float:
    values = [float(m) for log in run_dir.glob("nccl.*.log") for m in re.findall(r"maxBw ([\d.]+)", log.read_text())]
    return min(values)


def _check(report: dict, rule: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == rule)


def _analyse(machine: str, run: str, profile: str = "production") -> dict:
    # The run directory is a bundle: its NCCL logs, dmon and benchmark output are found by content.
    report = analyze(
        [str(COLL / machine / run)],
        profile=profile,
        side_files=side_files(topo=[COLL / machine / "topo.txt"], smi_q=[COLL / machine / "nvidia-smi-q.txt"]),
    ).report
    VALIDATOR.validate(report)
    return report


@pytest.mark.parametrize(("machine", "run", "transport"), RUNS)
def test_links_from_real_collective_benchmarks(machine: str, run: str, transport: str) -> None:
    run_dir = COLL / machine / run
    report = _analyse(machine, run)
    m = report["run"]["metrics"]
    assert m["nccl_transports"] == [transport]
    transport_check = _check(report, "transport_p2p")
    assert transport_check["status"] == ("pass" if transport == "P2P" else "fail")
    if transport != "P2P":
        quoted = [line for row in transport_check["evidence"] for line in row.get("lines", [])]
        assert any(f"via {transport}" in line for line in quoted), quoted

    rows = _all_reduce_rows((run_dir / "nccl-tests.txt").read_text())
    largest = max(rows, key=lambda r: int(r[0]))
    busbw = float(largest[7])  # out-of-place busbw column
    assert m["allreduce_peak_busbw_gbps"] == pytest.approx(busbw)
    assert m["p2p_utilization"] == pytest.approx(busbw / _max_bw(run_dir))
    small = [float(r[5]) for r in rows if int(r[0]) <= 8192]
    assert m["allreduce_small_latency_us"] == pytest.approx(statistics.median(small))
    assert [r for r in report["side_inputs"]["collective_benchmark"] if r["collective"] == "all_reduce"]


def _pcie_peak(run_dir: Path) -> float:
    """Highest max(rx, tx) sample ÷ PCIe Gen5 x16 (nvidia-smi -q of these machines), by hand."""
    header, peak = None, 0.0
    for line in (run_dir / "dmon.txt").read_text().splitlines():
        if line.startswith("# gpu"):
            header = line[1:].split()
        elif header and line.strip() and not line.startswith("#"):
            row = dict(zip(header, line.split(), strict=False))
            values = [float(row[k]) for k in ("rxpci", "txpci") if row.get(k, "-") != "-"]
            peak = max([peak, *values])
    return peak / (16 * 3938)  # MB/s per direction, Gen5 x16


@pytest.mark.parametrize(("machine", "run", "transport"), RUNS)
def test_pcie_saturation_shows_shm_going_through_the_host(machine: str, run: str, transport: str) -> None:
    report = _analyse(machine, run)
    value = report["run"]["metrics"]["pcie_saturation"]
    assert value == pytest.approx(_pcie_peak(COLL / machine / run), rel=1e-6)
    if transport == "P2P":
        assert _check(report, "pcie_saturation")["status"] == "pass"  # NVLink traffic never touches PCIe
    if transport == "SHM":
        assert _check(report, "pcie_saturation")["status"] == "fail"  # shared memory lives on the host


def test_h200_profile_passes_p2p_and_fails_shm_on_bandwidth() -> None:
    assert _check(_analyse("h200x2", "p2p_graph", "h200-nvlink"), "p2p_utilization")["status"] == "pass"
    assert _check(_analyse("h200x4", "p2p_graph", "h200-nvlink"), "p2p_utilization")["status"] == "pass"
    assert _check(_analyse("h200x2", "shm_graph", "h200-nvlink"), "p2p_utilization")["status"] == "fail"
    assert _check(_analyse("h200x2", "p2p_graph", "h200-nvlink"), "allreduce_latency")["status"] == "pass"
    # Eager launches from Python pose as latency: the CUDA-graph run is what the rule is for.
    assert _check(_analyse("h200x2", "p2p_eager", "h200-nvlink"), "allreduce_latency")["status"] == "fail"


@pytest.mark.parametrize(("run", "status"), [("p2p_nsys", "pass"), ("shm_nsys", "fail")])
def test_training_bundle_nccl_logs_feed_transport_rule(run: str, status: str) -> None:
    """A DDP run directory: captures plus the per-rank NCCL logs found beside them."""
    report = analyze([str(OWN / "h200" / run)], profile="h200-nvlink").report
    VALIDATOR.validate(report)
    assert _check(report, "transport_p2p")["status"] == status
    assert report["nccl"]["version"] == "2.28.9"
    assert report["nccl"]["transports"] == (["P2P"] if status == "pass" else ["SHM"])
    assert len(report["side_inputs"]["sources"]["nccl_log"]) == 2


def test_side_inputs_alone_are_enough_for_the_link_rules() -> None:
    run_dir = COLL / "h200x4" / "shm_graph"
    report = analyze(
        [], side_files=side_files(nccl_logs=sorted(run_dir.glob("nccl.*.log")), nccl_tests=[run_dir / "nccl-tests.txt"])
    ).report
    assert report["ranks"] == []
    assert _check(report, "capture_health")["status"] == "skip"
    assert _check(report, "nccl_step_share")["status"] == "skip"
    assert _check(report, "transport_p2p")["status"] == "fail"
    assert _check(report, "pcie_saturation")["reason"].startswith("no `nvidia-smi dmon")
