"""The committed GPU sweep (tests/fixtures/sweep_h200, made by bench/gpu/sweep_h200.sh with the
harness on 2×H200): each setting reached the job, and its effect shows in the trace.

Expected values come from the captures through plain SQL (tests/reference.py), from NCCL's NVTX
payloads decoded by hand, and from the job's own records — never from traceguard's output.
"""

from __future__ import annotations

import json
import sqlite3
import struct
from collections import Counter
from pathlib import Path

import pytest

from tests import reference
from tests.conftest import OWN
from traceguard.pipeline import analyze

SWEEP = OWN / "sweep_h200"
SETTINGS = [s["name"] for s in json.loads((SWEEP / "sweep.json").read_text())["settings"]]


def _records(setting: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((SWEEP / setting).glob("rank*.json"))]


def _captures(setting: str, unpacked) -> list[Path]:
    return [unpacked(p) for p in sorted((SWEEP / setting).glob("cap_*.sqlite.gz"))]


def _report(setting: str, profile: str = "production") -> dict:
    return analyze([str(SWEEP / setting)], profile=profile).report


def _status(report: dict, rule: str) -> str:
    return next(c["status"] for c in report["checks"] if c["id"] == rule)


def test_every_setting_ran_on_two_h200s() -> None:
    assert len(SETTINGS) == 12
    for setting in SETTINGS:
        manifest = json.loads((SWEEP / setting / "manifest.json").read_text())
        assert manifest["exit_status"] == 0, setting
        assert manifest["gpus"] == ["NVIDIA H200"]
        assert manifest["throughput_steps_per_s"] > 0
        world = 1 if setting == "1gpu_no_ddp" else 2
        assert len(manifest["captures"]) == world and len(_records(setting)) == world


@pytest.mark.parametrize(
    ("setting", "field", "value"),
    [
        ("ddp", "gradient_as_bucket_view", True),
        ("no_bucket_view", "gradient_as_bucket_view", False),
        ("static_graph", "static_graph", True),
        ("bf16_hook", "registered_comm_hook", "bf16_compress_hook"),
        ("powersgd_hook", "registered_comm_hook", "powerSGD_hook"),
        ("bucket_100mb", "bucket_cap_bytes", 100 * 1024 * 1024),
        ("bucket_2000mb", "bucket_cap_bytes", 2000 * 1024 * 1024),
    ],
)
def test_ddp_settings_reached_ddp(setting: str, field: str, value: object) -> None:
    assert {r["ddp"][field] for r in _records(setting)} == {value}


@pytest.mark.parametrize("setting", ["shm_ddp", "shm_bf16_hook", "shm_powersgd_hook"])
def test_shm_settings_disabled_p2p_in_every_rank_and_are_flagged(setting: str) -> None:
    assert {r["env"]["NCCL_P2P_DISABLE"] for r in _records(setting)} == {"1"}
    report = _report(setting)
    assert report["nccl"]["transports"] == ["SHM"]
    assert _status(report, "transport_p2p") == "fail"


def test_default_job_passes_the_production_checklist() -> None:
    report = _report("ddp")
    assert report["verdict"] == "pass", [(c["id"], c["status"]) for c in report["checks"] if c["status"] != "pass"]


def _dtod_per_step(files: list[Path]) -> float:
    parts = [reference.expected(reference.read_nsys(f)) for f in files]
    return sum(p.dtod_bytes for p in parts) / sum(p.steps for p in parts)


def test_bucket_view_removes_one_gradient_of_dtod_copies_per_step(unpacked) -> None:
    gradient = _records("ddp")[0]["gradient_bytes"]
    extra = _dtod_per_step(_captures("no_bucket_view", unpacked)) - _dtod_per_step(_captures("ddp", unpacked))
    assert extra == pytest.approx(gradient, rel=0.01)
    assert _status(_report("no_bucket_view"), "dtod_copy_volume") == "fail"
    assert _status(_report("ddp"), "dtod_copy_volume") == "pass"


def _allreduce_payload_per_step(path: Path) -> float:
    """Σ NCCL all-reduce message sizes (NVTX payload, decoded by hand) ÷ profiled steps."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    total = 0
    for (blob,) in db.execute(
        "SELECT binaryData FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE COALESCE(e.text, s.value) = 'ncclAllReduce' AND binaryData IS NOT NULL"
    ):
        _count, _schema, _size, offset = struct.unpack_from("<4Q", blob, 0)
        size = struct.unpack_from("<Q", blob, offset + 8)[0]
        total += size if size > 4 else 0  # DDP's 4-byte start-up check is not gradient traffic
    steps = db.execute(
        "SELECT count(*) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE COALESCE(e.text, s.value) GLOB 'Batch *'"
    ).fetchone()[0]
    return total / steps


def test_bf16_hook_halves_the_allreduce_payload(unpacked) -> None:
    fp32 = _allreduce_payload_per_step(_captures("ddp", unpacked)[0])
    bf16 = _allreduce_payload_per_step(_captures("bf16_hook", unpacked)[0])
    assert fp32 == pytest.approx(_records("ddp")[0]["gradient_bytes"], rel=0.01)
    assert bf16 == pytest.approx(fp32 / 2, rel=0.01)


def test_cpu_staged_copies_gradients_to_the_host_every_step(unpacked) -> None:
    for path in _captures("cpu_staged", unpacked):
        raw = reference.read_nsys(path)
        steps = [r for r in raw.ranges if r.name.startswith("Batch ")]
        per_step: Counter[str] = Counter()
        for op in raw.ops:
            t = raw.launches.get((op.pid, op.correlation))
            if op.copy_kind == "DtoH" and t is not None:
                for step in steps:
                    if step.start <= t <= step.end:
                        per_step[step.name] += 1
        assert len(per_step) == len(steps) == 3
        assert min(per_step.values()) >= 100  # every parameter's gradient, every step
    report = _report("cpu_staged")
    assert _status(report, "gpu_to_cpu_copy_rate") == "fail"


def test_committed_results_table_matches_the_bundles() -> None:
    committed = {r["setting"]: r for r in json.loads((SWEEP / "results.json").read_text())["rows"]}
    assert list(committed) == SETTINGS
    for setting in ("ddp", "shm_ddp", "cpu_staged"):
        report = _report(setting)
        assert committed[setting]["verdict"] == report["verdict"]
        assert committed[setting]["nccl_share_of_step"] == report["run"]["metrics"]["nccl_share_of_step"]
