"""Our own real captures: ViT-L/32 DDP on 2×H200 (NCCL 2.28.9, NVLink NV18), nsys 2025.3 with
``--include-blobs=true`` and torch.profiler. See bench/gpu/capture_h200.sh for how they were made.

Expected values come from the files themselves through tests/reference.py (plain SQL / json)
and from the job's own record (rank*.json: gradient bytes, DDP settings), never from traceguard.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from pathlib import Path

import pytest

from tests import reference
from tests.conftest import OWN
from traceguard.pipeline import analyze

H200 = OWN / "h200"


def _job(run: str) -> dict:
    return json.loads((H200 / run / "rank0.json").read_text())


def _run_share(files: list[Path], read) -> float:
    """Σ NCCL time in steps ÷ Σ step GPU spans over every rank, from plain SQL / json."""
    parts = [reference.expected(read(f)) for f in files]
    return sum(p.nccl_step_ns for p in parts) / sum(p.span_ns for p in parts)


def _check(report: dict, rule: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == rule)


@pytest.mark.parametrize(
    ("run", "profile", "status"),
    [
        ("p2p_nsys", "h200-nvlink", "pass"),
        ("shm_nsys", "h200-nvlink", "fail"),
        ("p2p_nsys", "production", "pass"),
        ("shm_nsys", "production", "warn"),
        ("p2p_torch", "h200-nvlink", "warn"),
        ("shm_torch", "h200-nvlink", "fail"),
    ],
)
def test_nccl_step_share_p2p_vs_shm(run: str, profile: str, status: str, unpacked) -> None:
    if run.endswith("_nsys"):
        files = [unpacked(p) for p in sorted((H200 / run).glob("cap_*.sqlite.gz"))]
        expected = _run_share(files, reference.read_nsys)
    else:
        files = sorted((H200 / run).glob("rank*.trace.json.gz"))
        expected = _run_share(files, reference.read_kineto)
    report = analyze([str(f) for f in files], profile=profile).report
    check = _check(report, "nccl_step_share")
    assert check["value"] == pytest.approx(expected, rel=0.01)
    assert check["status"] == status, check
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    if status != "pass":
        assert check["remedy"] and any("nccl_share" in row for row in check["evidence"])


def test_shm_is_an_order_of_magnitude_slower_than_p2p() -> None:
    """The same 1.23 GB fp32 all-reduce: best bus bandwidth over P2P/CUMEM vs SHM/direct."""

    def best_busbw(run: str) -> float:
        files = [str(p) for p in sorted((H200 / run).glob("rank*.trace.json.gz"))]
        rows = analyze(files).report["run"]["collectives"]
        assert {r["collective"] for r in rows} == {"AllReduce"}
        assert {r["msg_bytes"] for r in rows} == {_job(run)["gradient_bytes"]}
        return max(r["busbw_gbps"] for r in rows)

    p2p, shm = best_busbw("p2p_torch"), best_busbw("shm_torch")
    assert p2p > 200 > 48 > shm  # NCCL's own GRAPH line said maxBw 48.0 for SHM on this machine
    assert p2p / shm > 8


def test_allreduce_payload_from_nsys_blobs_equals_gradient_bytes(unpacked) -> None:
    """NCCL's NVTX payload (binaryData) decoded by hand equals the job's gradient bytes."""
    path = unpacked(H200 / "p2p_nsys" / "cap_0.sqlite.gz")
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sizes = []
    for (blob,) in db.execute(
        "SELECT binaryData FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE s.value = 'ncclAllReduce' AND binaryData IS NOT NULL ORDER BY start"
    ):
        count, _schema, _size, offset = struct.unpack_from("<4Q", blob, 0)
        assert count == 1
        sizes.append(struct.unpack_from("<Q", blob, offset + 8)[0])  # "Message size [bytes]" at +8
    gradient = _job("p2p_nsys")["gradient_bytes"]
    # One bucket (bucket_cap_mb=2000) per profiled step; the 4-byte all-reduce before them is
    # DDP's own start-up check.
    assert sizes.count(gradient) == 3
    assert all(size in (gradient, 4) for size in sizes)
    report = analyze([str(path)]).report
    assert report["run"]["metrics"]["allreduce_bytes_per_step"] == gradient


@pytest.mark.parametrize("run", ["nobucketview_torch", "nobucketview_nsys_bucket25"])
def test_ddp_without_bucket_view_fails_dtod_copy_volume(run: str, unpacked) -> None:
    assert _job(run)["ddp"]["gradient_as_bucket_view"] is False
    files = sorted((H200 / run).glob("rank*.trace.json.gz")) or [
        unpacked(p) for p in sorted((H200 / run).glob("cap_*.sqlite.gz"))
    ]
    report = analyze([str(f) for f in files]).report
    check = _check(report, "dtod_copy_volume")
    assert check["status"] == "fail"
    assert "gradient_as_bucket_view=True" in check["remedy"]
    m = report["run"]["metrics"]
    # Without the bucket view DDP copies every gradient into its bucket: at least one full
    # gradient's worth of DtoD bytes per step more than with it.
    with_view = analyze([str(p) for p in sorted((H200 / "p2p_torch").glob("rank*.trace.json.gz"))]).report
    extra = m["dtod_bytes_per_step"] - with_view["run"]["metrics"]["dtod_bytes_per_step"]
    assert extra == pytest.approx(_job(run)["gradient_bytes"], rel=0.01)
    assert _check(with_view, "dtod_copy_volume")["status"] == "pass"


def test_bf16_hook_halves_the_allreduce_payload() -> None:
    job = _job("bf16_torch")
    assert job["ddp"]["comm_hook"] == "bf16"
    files = [str(p) for p in sorted((H200 / "bf16_torch").glob("rank*.trace.json.gz"))]
    m = analyze(files).report["run"]["metrics"]
    assert m["allreduce_bytes_per_step"] == pytest.approx(job["gradient_bytes"] / 2, rel=0.01)


def test_steps_and_phases_per_rank(unpacked) -> None:
    files = [str(unpacked(p)) for p in sorted((H200 / "p2p_nsys").glob("cap_*.sqlite.gz"))]
    report = analyze(files).report
    for rank in report["ranks"]:
        assert [s["name"] for s in rank["steps"]] == ["Batch 8", "Batch 9", "Batch 10"]
        for step in rank["steps"]:
            assert list(step["phases"]) == ["get batch", "forward", "backward", "optimizer step"]
            # DDP launches the all-reduce from autograd's thread while the main thread is in
            # `backward`: attribution on any thread puts all NCCL time there.
            assert step["phases"]["backward"]["nccl_ns"] == step["nccl_ns"] > 0
            assert sum(p["cpu_ns"] for p in step["phases"].values()) <= step["cpu_ns"]
