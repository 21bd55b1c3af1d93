"""The harness on CPU (gloo): every option reaches the job, and the real nsys capture in CI.

Runs the real launcher (torch.distributed.run) and the real job; the evidence is what each rank
itself recorded (DDP's own logging data, the environment it saw) and the bundle's manifest.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")

from tests.conftest import diagnostics_besides_relaunches
from traceguard.capture import harness
from traceguard.pipeline import analyze

FAST = ["--world-size", "2", "--warmup", "1", "--timed", "1", "--steps", "1", "--mlp-width", "64", "--mlp-depth", "2"]


def _run(tmp_path: Path, *options: str) -> tuple[dict, list[dict]]:
    out = tmp_path / "bundle"
    assert harness.main(["run", *FAST, *options, "--out", str(out)]) == 0, (out / "launcher.log").read_text()[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return manifest, ranks


def test_default_run_is_ddp_with_bucket_view_and_a_manifest(tmp_path: Path) -> None:
    manifest, ranks = _run(tmp_path)
    assert manifest["exit_status"] == 0 and [r["exit_status"] for r in manifest["ranks"]] == [0, 0]
    assert manifest["throughput_steps_per_s"] > 0
    assert manifest["versions"]["torch"] and manifest["config"]["world_size"] == 2
    for rank, record in enumerate(ranks):
        assert record["rank"] == rank and record["world_size"] == 2 and record["backend"] == "gloo"
        assert record["ddp"]["enabled"] and record["ddp"]["backend"] == "gloo"
        assert record["ddp"]["gradient_as_bucket_view"] is True  # where it belongs: on by default
        assert record["ddp"]["registered_comm_hook"] is None
        assert record["env"]["NCCL_DEBUG"] == "INFO"


def test_ddp_options_reach_ddp_itself(tmp_path: Path) -> None:
    _, ranks = _run(tmp_path, "--static-graph", "--no-bucket-view", "--bucket-cap-mb", "10")
    for record in ranks:
        assert record["ddp"]["static_graph"] is True
        assert record["ddp"]["gradient_as_bucket_view"] is False
        assert record["ddp"]["bucket_cap_bytes"] == 10 * 1024 * 1024


@pytest.mark.parametrize(("hook", "registered"), [("fp16", "fp16_compress_hook"), ("powersgd", "powerSGD_hook")])
def test_comm_hook_is_registered_with_ddp(tmp_path: Path, hook: str, registered: str) -> None:
    extra = ["--steps", "3"] if hook == "powersgd" else []  # PowerSGD starts after two iterations
    _, ranks = _run(tmp_path, "--comm-hook", hook, *extra)
    assert {r["ddp"]["registered_comm_hook"] for r in ranks} == {registered}


def test_nccl_environment_each_rank_saw(tmp_path: Path) -> None:
    _, ranks = _run(tmp_path, "--no-p2p", "--no-shm", "--env", "NCCL_ALGO=Ring")
    for record in ranks:
        assert record["env"]["NCCL_P2P_DISABLE"] == "1"
        assert record["env"]["NCCL_SHM_DISABLE"] == "1"
        assert record["env"]["NCCL_ALGO"] == "Ring"
        assert record["env"]["NCCL_DEBUG_FILE"].endswith("nccl.%h.%p.log")


@pytest.mark.parametrize("comm", ["cpu-staged", "none"])
def test_comm_modes_replace_ddp(tmp_path: Path, comm: str) -> None:
    _, ranks = _run(tmp_path, "--comm", comm)
    assert {r["comm"] for r in ranks} == {comm}
    assert not any(r["ddp"]["enabled"] for r in ranks)


def test_torch_capture_has_the_steps_and_phases(tmp_path: Path) -> None:
    manifest, _ = _run(tmp_path, "--capture", "torch", "--steps", "2")
    assert [c["rank"] for c in manifest["captures"]] == [0, 1]
    report = analyze([str(tmp_path / "bundle")], profile="ci-cpu").report
    assert [i["rank_source"] for i in report["inputs"]] == ["manifest", "manifest"]
    for rank in report["ranks"]:
        assert len(rank["steps"]) == 2
        assert all(list(s["phases"]) == ["get batch", "forward", "backward", "optimizer step"] for s in rank["steps"])


def test_nsys_capture_falls_back_to_torch_profiler_without_nsys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(harness, "find_nsys", lambda: None)
    manifest, _ = _run(tmp_path, "--capture", "nsys")
    assert manifest["config"]["capture"] == "torch"
    assert any("torch.profiler instead" in d for d in manifest["diagnostics"])
    assert [c["tool"] for c in manifest["captures"]] == ["torch.profiler", "torch.profiler"]


def test_nvtx_newer_than_nsys_can_read_is_diagnosed() -> None:
    assert harness.nvtx_visibility_problem("2022.4.2.1", "0.2.13") is not None
    assert "nvtx==0.2.11" in harness.nvtx_visibility_problem("2022.4.2.1", "0.2.14")
    assert harness.nvtx_visibility_problem("2022.4.2.1", "0.2.11") is None
    assert harness.nvtx_visibility_problem("2025.3.1", "0.2.14") is None


def test_nsys_capture_refuses_an_invisible_nvtx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if harness.find_nsys() is None:
        if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_NSYS"):
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("needs nsys")
    monkeypatch.setattr(harness, "nsys_version", lambda _nsys: "2022.4.2.1")
    monkeypatch.setattr(harness, "package_version", lambda name: "0.2.14" if name == "nvtx" else None)
    with pytest.raises(SystemExit, match=r"nvtx==0\.2\.11"):
        harness.main(["run", *FAST, "--capture", "nsys", "--out", str(tmp_path / "b")])


@pytest.mark.slow
def test_real_nsys_capture_of_a_two_rank_gloo_job(tmp_path: Path) -> None:
    """CI installs Debian's Nsight Systems: a real capture, exported to SQLite and analysed."""
    if harness.find_nsys() is None:
        if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_NSYS"):
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("nsys is not installed")
    out = tmp_path / "bundle"
    assert harness.main(["run", *FAST, "--steps", "2", "--capture", "nsys", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert diagnostics_besides_relaunches(manifest, out) == []
    assert [c["path"] for c in manifest["captures"]] == ["cap_0.sqlite", "cap_1.sqlite"]
    assert manifest["versions"]["nsys"]
    assert not list(out.glob("*.qdstrm")) and not list(out.glob("*.nsys-rep"))
    report = analyze([str(out)], profile="ci-cpu").report
    assert report["verdict"] == "pass"
    assert [i["format"] for i in report["inputs"]] == ["nsys-sqlite", "nsys-sqlite"]
    for rank in report["ranks"]:
        # warmup 1 + timed 1 + profiled 2: the whole CPU job is captured (no capture range on CPU)
        assert [s["name"] for s in rank["steps"]] == ["Batch 0", "Batch 1", "Batch 2", "Batch 3"]
        assert all(list(s["phases"]) == ["get batch", "forward", "backward", "optimizer step"] for s in rank["steps"])
    health = next(c for c in report["checks"] if c["id"] == "capture_health")
    assert health["status"] == "pass"
    shutil.rmtree(out)


@pytest.mark.slow
def test_cpu_sweep_writes_a_results_table(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from traceguard.cli import app

    result = CliRunner().invoke(
        app,
        [
            "harness",
            "sweep",
            "--matrix",
            "cpu",
            "--out",
            str(tmp_path),
            "--profile",
            "ci-cpu",
            *FAST[2:],
            "--steps",
            "3",
            "--capture",
            "torch",
        ],
    )
    assert result.exit_code == 0, result.output
    rows = json.loads((tmp_path / "results.json").read_text())["rows"]
    assert [r["setting"] for r in rows] == [name for name, _ in harness.MATRICES["cpu"]]
    assert all(r["exit_status"] == 0 for r in rows)
    # Nothing is wrong with these jobs. Only `straggler` may warn: two gloo ranks sharing this
    # machine's two cores reach their collectives tens of ms apart when the machine is busy (its
    # arrival spread; ci-cpu warns from 50 % and never fails), which is the machine, not the job.
    for row in rows:
        if row["setting"] != "cpu_staged":
            assert {k for k, v in row["checks"].items() if v == "fail"} == set(), row
            assert {k for k, v in row["checks"].items() if v == "warn"} <= {"straggler"}, row
    # cpu_staged all-reduces every gradient on its own: small collectives, and nothing else wrong
    staged = next(r for r in rows if r["setting"] == "cpu_staged")
    assert {k for k, v in staged["checks"].items() if v in ("fail", "warn")} <= {"small_collectives", "straggler"}
    assert "| ddp |" in (tmp_path / "results.md").read_text()
