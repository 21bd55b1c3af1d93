"""Exit codes of the command line (``traceguard.cli`` docstring): 2 for unusable input, 3 for a bug,
one line each and no traceback unless ``--debug`` / ``TRACEGUARD_DEBUG=1`` asks for it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import public_kineto
from tests.fuzz.targets import REGRESSIONS
from traceguard import cli
from traceguard.cli import common


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """``--debug`` sets TRACEGUARD_DEBUG in this process; put it back after each test."""
    monkeypatch.setenv("TRACEGUARD_DEBUG", "0")


def _broken_analysis(*_args: Any, **_kwargs: Any) -> Any:
    raise ZeroDivisionError("float division by zero")


@pytest.fixture
def buggy(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the analysis, stood in for by an exception no input can cause."""
    monkeypatch.setattr(common, "analyze", _broken_analysis)


def test_a_bug_is_exit_3_with_one_line(buggy: None, capsys: pytest.CaptureFixture[str]) -> None:
    trace = public_kineto("mi250")
    code = cli.run(["check", str(trace)])
    captured = capsys.readouterr()
    assert code == cli.EXIT_BUG == 3
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert lines[-1] == (
        "error: this is a bug in traceguard: ZeroDivisionError: float division by zero — "
        "rerun with --debug for the traceback"
    )


@pytest.mark.parametrize("how", ["--debug", "TRACEGUARD_DEBUG"])
def test_debug_shows_the_traceback_of_a_bug(
    buggy: None, how: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = str(public_kineto("mi250"))
    if how == "--debug":
        code = cli.run(["--debug", "check", trace])
    else:
        monkeypatch.setenv("TRACEGUARD_DEBUG", "1")
        code = cli.run(["check", trace])
    err = capsys.readouterr().err
    assert code == 3
    assert "Traceback (most recent call last)" in err and "_broken_analysis" in err
    assert "this is a bug in traceguard: ZeroDivisionError" in err


def test_unusable_input_is_exit_2_naming_the_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "rank0.json"
    empty.write_bytes(b"")
    broken = REGRESSIONS / "kineto" / "device_out_of_range.json.gz"
    code = cli.run(["check", str(empty), str(broken)])
    err = capsys.readouterr().err
    assert code == cli.EXIT_INPUT == 2
    assert "Traceback" not in err
    assert "rank0.json" in err and broken.name in err and "out of range" in err


def test_a_failed_check_is_still_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """1 stays the one code a CI gate reads as a regression: exactly when the report's verdict is fail."""
    report = tmp_path / "report.json"
    code = cli.run(["check", "--json", str(report), str(public_kineto("nccl_data"))])
    capsys.readouterr()
    verdict = json.loads(report.read_text())["verdict"]
    assert code == (cli.EXIT_CHECK_FAILED if verdict == "fail" else 0), verdict


def test_an_output_that_cannot_be_written_is_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Where the user asked to write is the invocation's problem, not a bug."""
    target = tmp_path / "taken"
    target.mkdir()
    code = cli.run(["analyze", "-o", str(target), str(public_kineto("mi250"))])
    err = capsys.readouterr().err
    assert code == 2
    assert f"cannot write {target}" in " ".join(err.split()) and "Traceback" not in err


def test_an_os_error_naming_a_file_is_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The machine's answer about a named file (permissions, a full disk) is said as such, exit 2."""

    def denied(*_args: Any, **_kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied", "/data/cache/x.sqlite")

    monkeypatch.setattr(common, "analyze", denied)
    code = cli.run(["analyze", str(public_kineto("mi250"))])
    err = capsys.readouterr().err
    assert code == 2
    assert "error: /data/cache/x.sqlite: Permission denied" in err and "bug" not in err


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # PyO3 prints the cause
def test_a_native_panic_is_exit_3_with_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 25: a Polars panic (a ``BaseException``) went past the bug handler: a traceback and
    exit 1, the code of a failed check. It is a bug like any other: exit 3, one line."""
    from tests.fuzz.panic import native_panic
    from traceguard.metrics import rank

    monkeypatch.setattr(rank, "_offenders", native_panic)
    code = cli.run(["check", "--scheduler", "serial", str(public_kineto("nccl_data"))])
    captured = capsys.readouterr()
    assert code == cli.EXIT_BUG == 3
    assert "Traceback" not in captured.err
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert lines[-1].startswith("error: this is a bug in traceguard: NativePanic: a native library panicked ")
    assert "pyo3_runtime.PanicException" in lines[-1] and lines[-1].endswith("rerun with --debug for the traceback")


def test_a_native_panic_in_the_map_crosses_a_process_pool_as_a_bug(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The map step turns a panic into :class:`NativePanic`, an exception a process pool pickles
    back (the panic's own class lives in ``pyo3_runtime``, which cannot be imported to unpickle
    it). Here a real pool worker (spawned, ``--scheduler local``) panics in the offenders table."""
    from tests.conftest import REPO
    from tests.fuzz.panic import SITECUSTOMIZE
    from traceguard.errors import NativePanic
    from traceguard.pipeline import analyze

    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{REPO}")
    with pytest.raises(NativePanic, match=r"a native library panicked \(pyo3_runtime.PanicException: "):
        analyze([str(public_kineto(f"sampled_rank-{r}")) for r in (0, 1)], scheduler="local", jobs=2)
