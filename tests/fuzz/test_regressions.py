"""Every committed fuzz finding (``tests/fixtures/fuzz/<reader>/``) read again by its reader, and the
issue-15 crash classes through the command line (exit code, message) and the upload API (status)."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fuzz.targets import READERS, REGRESSIONS, check_one

REPO = Path(__file__).resolve().parents[2]
CASES = sorted(
    (reader.name, path)
    for reader in REGRESSIONS.iterdir()
    if reader.is_dir()
    for path in reader.iterdir()
    if not path.name.startswith(".")
)
KINETO_NOT_UTF8 = REGRESSIONS / "kineto" / "string_not_utf8.json"
SCHEMA_NOT_UTF8 = REGRESSIONS / "nsys_sqlite" / "schema_text_not_utf8.sqlite.gz"
SCHEMA_UNPARSABLE = REGRESSIONS / "nsys_sqlite" / "schema_text_not_utf8_unparsable.sqlite.gz"


def test_every_reader_has_a_folder_name_the_suite_knows() -> None:
    assert CASES, "no regression inputs"
    assert {reader for reader, _ in CASES} <= set(READERS)


@pytest.mark.parametrize(("reader", "path"), CASES, ids=[f"{r}/{p.name}" for r, p in CASES])
def test_committed_finding_is_read_or_refused(reader: str, path: Path) -> None:
    outcome, error, trace = check_one(READERS[reader], path)
    assert outcome in ("ok", "input_error"), f"{error}\n{trace}"


def test_the_issue_inputs_are_what_the_issue_describes(tmp_path: Path) -> None:
    """The committed inputs still hold the damage: plain sqlite3 and msgspec fail on them as reported."""
    import sqlite3

    import msgspec

    # msgspec before 0.23 raised UnicodeDecodeError, 0.23 a DecodeError naming UTF-8.
    with pytest.raises((UnicodeDecodeError, msgspec.DecodeError), match=r"(?i)utf-8"):
        msgspec.json.decode(KINETO_NOT_UTF8.read_bytes())
    plain = tmp_path / "schema.sqlite"
    plain.write_bytes(gzip.decompress(SCHEMA_NOT_UTF8.read_bytes()))
    conn = sqlite3.connect(plain)
    with pytest.raises(sqlite3.OperationalError, match="Could not decode to UTF-8 column 'sql'"):
        conn.execute("SELECT name, sql FROM sqlite_master").fetchall()
    conn.close()


# -- the command line ----------------------------------------------------------------------------------


def traceguard(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    """The installed console entry point (``python -m traceguard.cli`` is the same function)."""
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=cwd,
        env={**os.environ, **(env or {}), "COLUMNS": "200"},
    )


def test_cli_kineto_not_utf8_is_read_with_a_note(tmp_path: Path) -> None:
    """Issue 15 refused it (exit 2); issue 25 reads text defensively: the trace is analysed, its bad
    bytes read as U+FFFD, and a note naming the file says so."""
    done = traceguard("analyze", "-f", "json", str(KINETO_NOT_UTF8), env={"TRACEGUARD_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    notes = " ".join(done.stderr.split())
    assert KINETO_NOT_UTF8.name in notes and "not UTF-8" in notes and "U+FFFD" in notes, done.stderr


def test_cli_sqlite_schema_not_utf8_is_read(tmp_path: Path) -> None:
    """Text that is not UTF-8 in a comment of the schema: the capture is still read (its tables are intact)."""
    done = traceguard("analyze", "-f", "json", str(SCHEMA_NOT_UTF8), env={"TRACEGUARD_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr


def test_cli_sqlite_schema_unparsable_exits_2_naming_the_file(tmp_path: Path) -> None:
    done = traceguard("check", str(SCHEMA_UNPARSABLE), env={"TRACEGUARD_CACHE_DIR": str(tmp_path)})
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert SCHEMA_UNPARSABLE.name in done.stderr and "not UTF-8" in done.stderr, done.stderr


def test_cli_broken_profile_exits_2_without_traceback(tmp_path: Path) -> None:
    profile = REGRESSIONS / "profile" / "not_utf8.toml"
    done = traceguard("check", "--profile", str(profile), str(KINETO_NOT_UTF8))
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert profile.name in done.stderr and "not valid TOML" in done.stderr


def test_cli_debug_prints_the_traceback_of_an_input_error(tmp_path: Path) -> None:
    profile = REGRESSIONS / "profile" / "not_utf8.toml"
    for args, env in (
        (["--debug", "check", "--profile", str(profile), str(KINETO_NOT_UTF8)], {}),
        (["check", "--profile", str(profile), str(KINETO_NOT_UTF8)], {"TRACEGUARD_DEBUG": "1"}),
    ):
        done = traceguard(*args, env=env)
        assert done.returncode == 2
        assert "Traceback" in done.stderr and "UnicodeDecodeError" in done.stderr, done.stderr
