"""The harness's `--gpu-metrics` and `--nccl-inspector`: one GPU metrics collector per rank, and
what the bundle's manifest records (the real GPU bundles of tests/fixtures/h200x2_links, and a
real CPU run here, where nsys has no GPU to sample)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import OWN
from traceguard.capture import harness

pytest.importorskip("torch")


def test_each_rank_passes_its_own_gpu_to_its_nsys(tmp_path: Path) -> None:
    cfg = harness.run_parser().parse_args(
        ["--out", str(tmp_path), "--capture", "nsys", "--gpu-metrics", "--gpu-metrics-frequency", "20000"]
    )
    command = harness._launch_command(cfg, tmp_path, "/opt/nsys", cuda=True)
    wrapper = command[command.index("--no-python") + 1 :]
    assert wrapper[:2] == ["bash", "-c"] and "--gpu-metrics-frequency=20000" in wrapper
    # The wrapper run for real by bash, with `echo` as nsys: what each rank's nsys would get.
    shown = [wrapper[0], wrapper[1], wrapper[2], "echo", *wrapper[4:]]
    for local_rank in ("0", "1"):
        out = subprocess.run(shown, env={**os.environ, "LOCAL_RANK": local_rank}, capture_output=True, text=True)
        words = out.stdout.split()
        assert words[:2] == ["profile", f"--gpu-metrics-devices={local_rank}"]
        assert words[2:] == wrapper[4:][1:], "every other argument passes through unchanged"
    plain = harness._launch_command(
        harness.run_parser().parse_args(["--out", str(tmp_path), "--capture", "nsys"]), tmp_path, "/opt/nsys", cuda=True
    )
    assert not any("gpu-metrics" in word for word in plain)


@pytest.mark.parametrize("run", ["p2p", "shm"])
def test_gpu_bundles_record_the_collectors(run: str) -> None:
    manifest = json.loads((OWN / "h200x2_links" / run / "manifest.json").read_text())
    assert manifest["gpu_metrics"] == {"devices": "LOCAL_RANK", "frequency_hz": 10000, "set": None}
    assert '--gpu-metrics-devices="$LOCAL_RANK"' in " ".join(manifest["command"])
    assert manifest["environment"]["NCCL_INSPECTOR_ENABLE"] == "1"
    assert manifest["environment"]["NCCL_INSPECTOR_DUMP_VERBOSE"] == "1"
    assert len(manifest["inspector_logs"]) == 2 and manifest["diagnostics"] == []


def test_cpu_run_says_no_gpu_metrics_were_collected(tmp_path: Path) -> None:
    out = tmp_path / "bundle"
    fast = [
        "--world-size",
        "2",
        "--warmup",
        "1",
        "--timed",
        "1",
        "--steps",
        "1",
        "--mlp-width",
        "64",
        "--mlp-depth",
        "2",
    ]
    assert harness.main(["run", *fast, "--gpu-metrics", "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["gpu_metrics"] is None
    assert any("--gpu-metrics" in d and "no CUDA GPU" in d for d in manifest["diagnostics"])


def test_inspector_plugin_must_exist(tmp_path: Path) -> None:
    cfg = harness.run_parser().parse_args(["--out", str(tmp_path), "--nccl-inspector", str(tmp_path / "missing.so")])
    with pytest.raises(SystemExit, match="is not a file"):
        harness.job_environment(cfg, tmp_path)


def test_a_rank_without_gpu_metrics_is_diagnosed(tmp_path: Path) -> None:
    """An export without GPU_METRICS (here a real one made without --gpu-metrics) is named, with
    what nsys printed about metrics; exports that have them are not."""
    import gzip
    import shutil

    for run, rank in (("h100x2_waits/clean_nsys", 0), ("h200x2_links/p2p", 1)):
        with gzip.open(OWN / run / f"cap_{rank}.sqlite.gz") as src, (tmp_path / f"cap_{rank}.sqlite").open("wb") as dst:
            shutil.copyfileobj(src, dst)
    captures = [{"path": "cap_0.sqlite", "rank": 0}, {"path": "cap_1.sqlite", "rank": 1}]
    log = (OWN / "h100x2_waits" / "clean_nsys" / "stdout.txt").read_text()
    said = harness._missing_gpu_metrics(tmp_path, captures, log)
    assert len(said) == 1 and said[0].startswith("rank 0: --gpu-metrics was given but the export has no GPU metrics")
    nsys_line = "ERR_NVGPUCTRPERM - The user does not have permission to access NVIDIA GPU Performance Counters"
    assert nsys_line in harness._missing_gpu_metrics(tmp_path, captures, f"{log}\n{nsys_line}\n")[0]
