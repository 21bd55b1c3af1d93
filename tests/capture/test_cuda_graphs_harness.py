"""The harness's --cuda-graphs: refused clearly without CUDA, wired to ddp_job and nsys, and what
the GPU runs that made tests/fixtures/cuda_graphs recorded about themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OWN, REPO
from traceguard.capture import harness

torch = pytest.importorskip("torch")
no_cuda = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")


def _run(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


@no_cuda
def test_harness_refuses_cuda_graphs_without_cuda(tmp_path: Path) -> None:
    done = _run("-m", "traceguard.capture.harness", "run", "--out", str(tmp_path / "run"), "--cuda-graphs")
    assert done.returncode != 0
    assert "--cuda-graphs needs a CUDA GPU" in done.stderr + done.stdout
    assert not (tmp_path / "run" / "manifest.json").exists()


@no_cuda
def test_job_refuses_cuda_graphs_without_cuda(tmp_path: Path) -> None:
    done = _run("-m", "traceguard.capture.ddp_job", "--out", str(tmp_path), "--cuda-graphs")
    assert done.returncode == 2
    assert "--cuda-graphs needs a CUDA GPU" in done.stderr


def test_cuda_graphs_reach_the_job_and_nsys(tmp_path: Path) -> None:
    cfg = harness.run_parser().parse_args(["--out", str(tmp_path), "--cuda-graphs", "--capture", "nsys"])
    command = harness._launch_command(cfg, tmp_path, "/opt/nsys", cuda=True)
    assert "--cuda-graphs" in command and "--cuda-graph-trace=node" in command
    cfg = harness.run_parser().parse_args(["--out", str(tmp_path), "--capture", "nsys"])
    command = harness._launch_command(cfg, tmp_path, "/opt/nsys", cuda=True)
    assert "--cuda-graphs" not in command and not any(a.startswith("--cuda-graph-trace") for a in command)


@pytest.mark.parametrize("name", ["graph_level", "node_level", "kineto_graph"])
def test_fixture_jobs_replayed_the_step_with_the_allreduce_inside(name: str) -> None:
    """The H100 runs behind the fixtures: ddp_job --cuda-graphs on a one-rank NCCL group."""
    record = json.loads((OWN / "cuda_graphs" / f"{name}.job.json").read_text())
    assert record["cuda_graphs"] == {"warmup_eager_steps": 3, "allreduce_in_graph": True, "captured": True}
    assert record["backend"] == "nccl" and record["world_size"] == 1 and record["comm"] == "allreduce"
    assert record["profiled_steps"] == 6 and record["throughput_steps_per_s"] > 0
    eager = json.loads((OWN / "cuda_graphs" / "eager.job.json").read_text())
    assert eager["cuda_graphs"] is None and eager["config"]["mlp_width"] == record["config"]["mlp_width"]


@pytest.mark.slow
def test_explicit_allreduce_job_runs_on_gloo(tmp_path: Path) -> None:
    """--comm allreduce (what the graph holds) runs eagerly on CPU ranks too: one all-reduce a step."""
    done = _run(
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "traceguard.capture.ddp_job",
        "--out",
        str(tmp_path),
        "--comm",
        "allreduce",
        "--mlp-width",
        "64",
        "--warmup",
        "1",
        "--timed",
        "1",
        "--steps",
        "1",
    )
    assert done.returncode == 0, done.stderr[-2000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["comm"] for r in records] == ["allreduce", "allreduce"]
    assert all(r["ddp"] == {"enabled": False} and r["cuda_graphs"] is None for r in records)
