"""The capturing tests' ``nsys profile`` runner (tests/nsys_profile.py), on real processes."""

from __future__ import annotations

from pathlib import Path

from tests import nsys_profile

#: Exits 134 (nsys's abort) on its first run in a folder, 0 after; counts its runs.
FLAKY = 'echo run >> runs; [ "$(wc -l < runs)" -gt 1 ] || { echo aborted >&2; exit 134; }'


def test_a_run_that_aborts_once_is_made_again_and_passes(tmp_path: Path) -> None:
    assert nsys_profile.profile(["sh", "-c", FLAKY], lambda: False, cwd=tmp_path) == []
    assert (tmp_path / "runs").read_text().count("run") == 2


def test_two_failures_are_both_said(tmp_path: Path) -> None:
    failed = nsys_profile.profile(["sh", "-c", "echo run >> runs; echo no >&2; exit 3"], lambda: False, cwd=tmp_path)
    assert failed == ["nsys exited 3: no", "nsys exited 3: no"]
    assert (tmp_path / "runs").read_text().count("run") == 2


def test_a_failed_run_that_wrote_its_output_is_not_made_again(tmp_path: Path) -> None:
    wrote = tmp_path / "cap.nsys-rep"
    command = ["sh", "-c", f"echo run >> runs; touch {wrote}; exit 1"]
    assert nsys_profile.profile(command, wrote.exists, cwd=tmp_path) == []
    assert (tmp_path / "runs").read_text().count("run") == 1


def test_a_command_function_gives_each_run_its_own_line(tmp_path: Path) -> None:
    lines = iter([["sh", "-c", "exit 134"], ["sh", "-c", "echo second > ran"]])
    assert nsys_profile.profile(lambda: next(lines), lambda: False, cwd=tmp_path) == []
    assert (tmp_path / "ran").read_text() == "second\n"
