"""A rank that dies is reported by its own exception, first, for every failed rank (issue 28).

Both cases run for real: the harness launching a job whose ranks raise (NCCL asked for on a machine
without GPUs), and torchrun reporting a rank killed by a signal, which leaves no Python exception.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import OWN
from traceguard.capture import harness


@pytest.mark.slow
def test_a_failed_rank_s_own_exception_comes_first(tmp_path: Path) -> None:
    if harness.cuda_available():
        pytest.skip("a GPU is here: NCCL initialises")
    out = tmp_path / "b"
    argv = ["run", "--world-size", "2", "--backend", "nccl", "--capture", "torch", "--warmup", "1", "--timed", "1"]
    assert harness.main([*argv, "--steps", "1", "--out", str(out)]) == 1
    manifest = json.loads((out / "manifest.json").read_text())
    failed = manifest["diagnostics"][:2]
    assert {d.split(" ", 2)[1] for d in failed} == {"0", "1"}, failed
    for line in failed:
        assert "RuntimeError: Distributed package doesn't have NCCL built in" in line
        assert "in init_process_group" in line and ".error.json]" in line
    assert " failed: " in failed[0] and " then failed: " in failed[1]
    for rank in manifest["ranks"]:
        error = rank["error"]
        assert rank["exit_status"] != 0 and error["type"] == "RuntimeError" and error["source"].startswith("rank")
        assert any(f["code"] == "dist.init_process_group(backend=backend)" for f in error["frames"])


@pytest.mark.slow
def test_a_rank_killed_by_a_signal_is_named_from_torchrun_s_summary(tmp_path: Path) -> None:
    """No Python exception, no error file: torchrun's root cause names rank 1 and its signal."""
    script = tmp_path / "rank.sh"
    script.write_text('if [ "$RANK" = 1 ]; then kill -9 $$; fi; sleep 5\n')
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--no-python"]
    proc = subprocess.run([*launcher, "bash", str(script)], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    failures = harness.rank_failures(tmp_path, 2, proc.stdout + proc.stderr)
    assert [f["rank"] for f in failures] == [1, 0]  # the killed rank first, the one torchrun then stopped after
    assert failures[0]["type"] == "exit code -9 (signal 9)" and "SIGKILL" in failures[0]["message"]
    assert failures[1]["type"] == "exit code -15 (signal 15)"
    line = harness.failure_diagnostic(failures[0], True)
    assert line.startswith("rank 1 failed: exit code -9 (signal 9): Signal 9 (SIGKILL)") and "[launcher.log]" in line


def test_a_long_message_is_one_bounded_line_and_the_file_keeps_it_whole() -> None:
    """NCCL's errors run to kilobytes over many lines: the diagnostic is one line of at most
    DIAGNOSTIC_MESSAGE_CHARS of it; ``ranks[].error`` and the error file keep every character."""
    message = "NCCL error in: ProcessGroupNCCL.cpp:3387, unhandled system error\n" + "Last error:\n" * 500
    failure = {"rank": 3, "type": "torch.distributed.DistBackendError", "message": message, "source": "x"}
    line = harness.failure_diagnostic(failure, True)
    assert "\n" not in line and line.count("…") == 1
    assert len(line) < harness.DIAGNOSTIC_MESSAGE_CHARS + 100
    assert line.startswith("rank 3 failed: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp")
    assert failure["message"] == message


def test_damaged_error_files_are_named_not_raised(tmp_path: Path) -> None:
    """An error file cut short by the dying rank, or not the job's shape: the rank is still listed
    as failed, with what could be read, and nothing raises."""
    (tmp_path / "rank0.error.json").write_bytes(b'{"rank": 0, "type": "Runtime\xff')
    (tmp_path / "rank1.error.json").write_text("[1, 2]")
    (tmp_path / "rank2.error.json").write_text(json.dumps({"time": "soon", "frames": [3, {"line": 7}], "type": "E"}))
    failures = harness.rank_failures(tmp_path, 3, "")
    assert sorted(f["rank"] for f in failures) == [0, 1, 2]
    lines = [harness.failure_diagnostic(f, i == 0) for i, f in enumerate(failures)]
    assert any("unreadable error file" in line for line in lines)
    assert any(line.startswith("rank 2") and "?:7 in ?" in line for line in lines)


def test_nsys_that_did_not_start_the_job_is_told_apart(tmp_path: Path) -> None:
    """The real CI log of nsys 2022.4 exiting before the job ran ("End of file"): the harness
    names it and starts the run again once; a job that ran (a record or its own error file), a
    timeout, or a run without nsys is never started again."""
    log = (OWN / "harness_failures" / "nsys_did_not_start" / "launcher.log").read_text()
    cfg = harness.run_parser().parse_args(["--world-size", "2", "--capture", "nsys", "--out", str(tmp_path)])
    why = harness.nsys_did_not_start(cfg, tmp_path, 1, log)
    assert why is not None and "nsys exited 1 before the job ran" in why and "'End of file'" in why
    assert harness.nsys_did_not_start(cfg, tmp_path, 124, log) is None
    assert harness.nsys_did_not_start(cfg, tmp_path, 0, "") is None
    torch_cfg = harness.run_parser().parse_args(["--world-size", "2", "--capture", "torch", "--out", str(tmp_path)])
    assert harness.nsys_did_not_start(torch_cfg, tmp_path, 1, log) is None
    for name in ("rank1.error.json", "rank0.json"):
        (tmp_path / name).write_text("{}")
        assert harness.nsys_did_not_start(cfg, tmp_path, 1, log) is None
        (tmp_path / name).unlink()
