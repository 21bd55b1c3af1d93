"""The CLI's link commands: `traceguard nccl`, side-input options, and `bench-collectives`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from tests.conftest import OWN, REPO
from traceguard.cli import app
from traceguard.ingest.side_inputs import parse_nccl_tests

RUNNER = CliRunner()
SHM_LOGS = sorted((OWN / "h200" / "shm_nsys").glob("nccl.*.log"))
P2P_LOGS = sorted((OWN / "h200" / "p2p_nsys").glob("nccl.*.log"))


def test_nccl_command_prints_the_transport_matrix_and_findings() -> None:
    result = RUNNER.invoke(app, ["nccl", *map(str, SHM_LOGS), "--topo", str(OWN / "h200" / "topo.txt")])
    assert result.exit_code == 0, result.output
    assert "| 0 | · | SHM/direct/direct |" in result.stdout
    assert "shm_within_node" in result.stdout and "NCCL_P2P_DISABLE=1" in result.stdout


def test_nccl_command_json_follows_the_contract() -> None:
    result = RUNNER.invoke(app, ["nccl", *map(str, P2P_LOGS), "--format", "json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["version"] == "2.28.9" and doc["versions"] == ["2.28.9"]
    assert doc["ranks"] == 2 and doc["nodes"] == 1
    assert doc["transports"] == ["P2P"]
    assert {c["detail"] for c in doc["connections"]} == {"CUMEM"}
    assert doc["findings"] == []


def test_nccl_command_refuses_text_without_nccl_lines(tmp_path) -> None:
    other = tmp_path / "train.log"
    other.write_text("epoch 1 loss 0.3\nepoch 2 loss 0.2\n")
    result = RUNNER.invoke(app, ["nccl", str(other)])
    assert result.exit_code == 2
    assert "NCCL_DEBUG=INFO" in result.output


def test_check_with_side_inputs_only_gates_on_the_transport(tmp_path) -> None:
    junit = tmp_path / "checks.xml"
    result = RUNNER.invoke(
        app, ["check", "--nccl-log", str(SHM_LOGS[0]), "--nccl-log", str(SHM_LOGS[1]), "--junit", str(junit)]
    )
    assert result.exit_code == 1, result.output
    assert 'name="transport_p2p"' in junit.read_text()


@pytest.mark.slow
def test_bench_collectives_command_prints_nccl_tests_format() -> None:
    """The real sweep through torchrun on CPU (gloo), parsed back by the nccl-tests parser."""
    pytest.importorskip("torch")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceguard.cli",
            "bench-collectives",
            "--nproc",
            "2",
            "--backend",
            "gloo",
            "--ops",
            "all_reduce",
            "--min-bytes",
            "8",
            "--max-bytes",
            "1K",
            "--iters",
            "3",
            "--warmup",
            "1",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    table = parse_nccl_tests(proc.stdout)
    assert table["size_bytes"].to_list() == [8 << i for i in range(8)]
    assert set(table["collective"]) == {"all_reduce"}
