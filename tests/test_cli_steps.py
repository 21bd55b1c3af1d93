"""`--step-source` on the command line: the steps a capture's own structure gives, on demand."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import OWN, public_nsys


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", "analyze", *args], capture_output=True, text=True, timeout=300
    )


def test_step_source_inferred_ignores_the_markers() -> None:
    run = OWN / "h200" / "p2p_nsys"
    marked = json.loads(_analyze(str(run), "-f", "json").stdout)
    inferred = json.loads(_analyze(str(run), "--step-source", "inferred", "-f", "json").stdout)
    assert [r["step_source"] for r in marked["ranks"]] == ["convention", "convention"]
    assert [r["step_source"] for r in inferred["ranks"]] == ["inferred", "inferred"]
    assert [len(r["steps"]) for r in inferred["ranks"]] == [len(r["steps"]) for r in marked["ranks"]]


def test_step_source_order_and_bad_source(unpacked) -> None:
    db = unpacked(public_nsys("mfu_2gpu_before"))
    window = json.loads(_analyze(str(db), "--step-source", "window", "-f", "json").stdout)
    assert [len(r["steps"]) for r in window["ranks"]] == [1, 1]
    bad = _analyze(str(db), "--step-source", "periodic")
    assert bad.returncode == 2
    said = " ".join(bad.stderr.split())  # rich wraps at the terminal width
    assert "--step-source 'periodic': choose from pattern, convention, inferred, window" in said
