"""`traceguard nccl` through the installed console script: a partial log (NCCL lines, no connection
lines) is a valid document (exit 0, transport unknown with the reason); a file without any NCCL line
is an error (exit 2, "no NCCL log lines"). Expected values are read from the raw logs here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CORPUS = REPO / "tests" / "fixtures" / "nccl_logs"
SCRIPT = Path(sys.executable).parent / "traceguard"


def traceguard(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "traceguard.cli"]
    return subprocess.run([*cmd, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


@pytest.mark.parametrize(
    "name", ["v2.29.2_prefixed_banner_p2p_shm_disabled_partial.log", "v2.18.3_ompi_date_prefix_topology_partial.log"]
)
def test_partial_log_is_a_document(name: str) -> None:
    path = CORPUS / name
    text = path.read_text()
    done = traceguard("nccl", str(path), "--format", "json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    versions = set(re.findall(r"NCCL version (\d+\.\d+\.\d+)\+cuda", text))
    assert doc["version"] == (versions.pop() if versions else None)
    sizes = [int(n) for n in re.findall(r"NCCL INFO .*\bn[Rr]anks (\d+)", text)]
    assert doc["ranks"] == (max(sizes) if sizes else None)
    env = dict(re.findall(r"NCCL INFO (NCCL_\w+) set by environment to (\S+?)\.?$", text, re.MULTILINE))
    assert doc["env"] == env
    assert doc["transport_status"] == "unknown" and doc["transports"] == [] and doc["connections"] == []
    assert doc["transport_reason"].startswith("the log has no connection lines")
    assert doc["nccl_lines"] == len(re.findall(r"NCCL (?:INFO|WARN)|^NCCL version", text, re.MULTILINE))

    markdown = traceguard("nccl", str(path))
    assert markdown.returncode == 0, markdown.stderr
    assert "Partial log — transport unknown" in markdown.stdout


@pytest.mark.parametrize("content", ["", "epoch 1 step 20 loss=2.31\nTraceback (most recent call last):\n"])
def test_no_nccl_lines_is_an_error(tmp_path: Path, content: str) -> None:
    path = tmp_path / "train.log"
    path.write_text(content)
    done = traceguard("nccl", str(path), "--format", "json")
    assert done.returncode == 2
    assert "no NCCL log lines" in done.stderr and done.stdout == ""
