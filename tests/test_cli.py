"""The real command line: typer's CliRunner on ``traceguard.cli.app``, plus a few end-to-end runs of
the installed ``traceguard`` script (the only place a traceback would reach a user's terminal).

Expected values come from the inputs themselves (file layout, Kineto ``distributedInfo``, the
profile TOML read with ``tomllib``), the JSON schema, or the documented exit codes — never from a
report the tool made earlier.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tomllib
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from tests.conftest import OWN, REPO, public_kineto
from traceguard import __version__
from traceguard.cli import app

H200 = OWN / "h200"
P2P_NSYS = H200 / "p2p_nsys"
SHM_NSYS = H200 / "shm_nsys"
P2P_TORCH = H200 / "p2p_torch"
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
CLI = Path(sys.executable).with_name("traceguard")

runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never write to the user's ~/.cache from tests."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _invoke(*args: str):
    result = runner.invoke(app, [str(a) for a in args])
    # typer.Exit / sys.exit surface as SystemExit; anything else is an unhandled crash.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.output}"
    )
    return result


def _valid(report: dict) -> dict:
    errors = sorted(VALIDATOR.iter_errors(report), key=lambda e: list(e.absolute_path))
    assert not errors, [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors[:5]]
    return report


def _says(output: str, *phrases: str) -> bool:
    """Every phrase appears in ``output``, ignoring whitespace (rich may break lines mid-word)."""
    squashed = "".join(output.split())
    return all("".join(p.split()) in squashed for p in phrases)


def _dist_rank(trace: Path) -> int:
    with gzip.open(trace, "rt") as fh:
        return json.load(fh)["distributedInfo"]["rank"]


def _torch_traces() -> list[Path]:
    return sorted(P2P_TORCH.glob("rank*.trace.json.gz"))


#: A small real Kineto trace (rank 0 of 2, NCCL 2.17): enough for format and destination tests.
SMALL = public_kineto("nccl_data")


# ---------------------------------------------------------------- analyze: formats and destinations


@pytest.fixture(scope="module")
def p2p_json_stdout(tmp_path_factory: pytest.TempPathFactory) -> dict:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        result = runner.invoke(app, ["analyze", str(P2P_NSYS), "--format", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_analyze_json_to_stdout_is_schema_valid_and_covers_both_ranks(p2p_json_stdout: dict) -> None:
    report = _valid(p2p_json_stdout)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    captures = sorted(p.name for p in P2P_NSYS.glob("cap_*.sqlite.gz"))
    assert sorted(Path(i["path"]).name for i in report["inputs"]) == captures
    assert all(i["error"] is None and i["format"] == "nsys-sqlite" for i in report["inputs"])
    assert report["traceguard_version"] == __version__
    assert report["profile"]["name"] == "production"


def test_analyze_exits_zero_even_when_a_check_fails(tmp_path: Path) -> None:
    # SHM under the H200 profile fails nccl_step_share: analyze still made its report, so 0.
    out = tmp_path / "shm.json"
    result = _invoke("analyze", SHM_NSYS, "--profile", "h200-nvlink", "--out", out)
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(out.read_text()))
    assert report["verdict"] == "fail"


@pytest.mark.parametrize(
    ("suffix", "looks_like"),
    [
        (".json", "json"),
        (".html", "html"),
        (".htm", "html"),
        (".md", "md"),
        (".txt", "md"),  # unknown suffix: Markdown, the default
    ],
)
def test_analyze_infers_the_format_from_the_out_suffix(tmp_path: Path, suffix: str, looks_like: str) -> None:
    target = tmp_path / "nested" / f"report{suffix}"  # the parent folder is created
    result = _invoke("analyze", SMALL, "--out", target)
    assert result.exit_code == 0, result.output
    assert result.stdout == ""  # the report went to the file, not stdout
    text = target.read_text()
    if looks_like == "json":
        _valid(json.loads(text))
    elif looks_like == "html":
        assert text.lstrip().lower().startswith("<!doctype html>") and text.rstrip().endswith("</html>")
    else:
        assert text.startswith("# traceguard report — ")
        assert "| check | status | detail |" in text


def test_explicit_format_wins_over_the_out_suffix(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    result = _invoke("analyze", SMALL, "--format", "json", "--out", target)
    assert result.exit_code == 0, result.output
    _valid(json.loads(target.read_text()))


@pytest.mark.parametrize("fmt", ["md", "html"])
def test_analyze_renders_md_and_html_to_stdout(fmt: str) -> None:
    result = _invoke("analyze", SMALL, "--format", fmt)
    assert result.exit_code == 0, result.output
    if fmt == "md":
        assert result.stdout.startswith("# traceguard report — ")
    else:
        assert result.stdout.lstrip().lower().startswith("<!doctype html>")
        assert "id='checks'" in result.stdout


def test_analyze_defaults_to_markdown_on_stdout() -> None:
    result = _invoke("analyze", SMALL)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("# traceguard report — ")


# ---------------------------------------------------------------- check: the gate


def test_check_passes_p2p_over_nvlink_and_writes_junit_and_json(tmp_path: Path) -> None:
    junit_path, json_path = tmp_path / "checks.xml", tmp_path / "report.json"
    result = _invoke("check", P2P_NSYS, "--profile", "h200-nvlink", "--junit", junit_path, "--json", json_path)
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(json_path.read_text()))
    assert report["verdict"] != "fail"
    assert report["profile"]["chain"] == ["h200-nvlink", "production"]
    suite = ET.parse(junit_path).getroot().find("testsuite")
    assert suite is not None
    assert suite.get("failures") == "0"
    assert {c.get("name") for c in suite.iter("testcase")} == {c["id"] for c in report["checks"]}


def test_check_fails_shm_with_a_junit_failure_for_nccl_step_share(tmp_path: Path) -> None:
    junit_path, json_path = tmp_path / "checks.xml", tmp_path / "report.json"
    result = _invoke("check", SHM_NSYS, "--profile", "h200-nvlink", "--junit", junit_path, "--json", json_path)
    assert result.exit_code == 1, result.output
    report = _valid(json.loads(json_path.read_text()))
    assert report["verdict"] == "fail"

    root = ET.parse(junit_path).getroot()
    assert root.tag == "testsuites"
    (suite,) = root.findall("testsuite")
    cases = {c.get("name"): c for c in suite.findall("testcase")}
    assert list(cases) == [c["id"] for c in report["checks"]]
    failure = cases["nccl_step_share"].find("failure")
    assert failure is not None and failure.get("message")
    assert "Remedy:" in (failure.text or "")
    for check in report["checks"]:
        case = cases[check["id"]]
        assert (case.find("failure") is not None) == (check["status"] == "fail")
        skipped = case.find("skipped")
        assert (skipped is not None) == (check["status"] == "skip")
        if skipped is not None:
            assert skipped.get("message"), check["id"]
    # The remedy of the failing check is shown on the terminal too.
    assert "nccl_step_share" in result.stdout


def test_check_junit_skipped_carries_the_null_reason(tmp_path: Path) -> None:
    # One Kineto rank: the straggler spread needs two ranks, so that check skips with a reason.
    junit_path, json_path = tmp_path / "checks.xml", tmp_path / "report.json"
    result = _invoke("check", _torch_traces()[0], "--junit", junit_path, "--json", json_path)
    assert result.exit_code in (0, 1), result.output
    report = _valid(json.loads(json_path.read_text()))
    skipped = {c["id"]: c["reason"] for c in report["checks"] if c["status"] == "skip"}
    assert "straggler" in skipped
    suite = ET.parse(junit_path).getroot().find("testsuite")
    assert suite is not None
    skips = {c.get("name"): c.find("skipped") for c in suite.iter("testcase")}
    messages = {name: element.get("message") for name, element in skips.items() if element is not None}
    assert messages == skipped
    assert suite.get("skipped") == str(len(skipped))


# ---------------------------------------------------------------- unusable inputs: exit 2, no traceback


def _truncated_sqlite(tmp: Path) -> Path:
    target = tmp / "cap_0.sqlite"
    with gzip.open(P2P_NSYS / "cap_0.sqlite.gz", "rb") as src:
        target.write_bytes(src.read(4096))
    return target


def _foreign_sqlite(tmp: Path) -> Path:
    target = tmp / "notes.sqlite"
    db = sqlite3.connect(target)
    db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
    db.execute("INSERT INTO notes (body) VALUES ('not a profile')")
    db.commit()
    db.close()
    return target


def _not_a_trace(tmp: Path) -> Path:
    target = tmp / "config.json"
    target.write_text('{"a": 1}')
    return target


def _gzip_garbage(tmp: Path) -> Path:
    target = tmp / "trace.json.gz"
    target.write_bytes(b"\x1f\x8b\x08\x00" + b"garbage that is no deflate stream" * 4)
    return target


def _gzip_truncated(tmp: Path) -> Path:
    target = tmp / "rank0.trace.json.gz"
    target.write_bytes((P2P_TORCH / "rank0.trace.json.gz").read_bytes()[:100_000])
    return target


def _gzip_bad_crc(tmp: Path) -> Path:
    target = tmp / "rank0.trace.json.gz"
    data = gzip.compress(b'{"traceEvents": []}')
    target.write_bytes(data[:-8] + b"\0" * 8)
    return target


def _empty(tmp: Path) -> Path:
    target = tmp / "cap_0.sqlite"
    target.write_bytes(b"")
    return target


BAD_INPUTS = {
    "nonexistent": (lambda tmp: tmp / "missing.sqlite", "no such file"),
    "empty": (_empty, "empty"),
    "truncated-sqlite": (_truncated_sqlite, "truncated"),
    "sqlite-not-nsys": (_foreign_sqlite, "not an nsys export"),
    "json-not-a-trace": (_not_a_trace, "not a capture"),
    "gzip-truncated": (_gzip_truncated, "truncated"),
    "gzip-bad-crc": (_gzip_bad_crc, "corrupt"),
    "gzip-not-deflate": (_gzip_garbage, "gzip"),
}


@pytest.mark.parametrize(
    "case",
    list(BAD_INPUTS),
)
@pytest.mark.parametrize("command", ["analyze", "check"])
def test_unusable_input_exits_2_with_a_message(tmp_path: Path, case: str, command: str) -> None:
    make, words = BAD_INPUTS[case]
    path = make(tmp_path)
    result = _invoke(command, path)
    assert result.exit_code == 2, result.output
    assert _says(result.output, "error", "no usable input", str(path), words), result.output
    assert "Traceback" not in result.output
    assert result.stdout == ""  # no half report


def test_unknown_profile_exits_2_naming_the_choices() -> None:
    result = _invoke("check", P2P_TORCH, "--profile", "no-such-profile")
    assert result.exit_code == 2
    names = sorted(p.stem for p in (REPO / "profiles").glob("*.toml"))
    assert _says(result.output, "unknown profile 'no-such-profile'", *names), result.output
    assert "Traceback" not in result.output


def test_directory_without_captures_exits_2(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("nothing here")
    result = _invoke("analyze", tmp_path)
    assert result.exit_code == 2
    assert _says(result.output, str(tmp_path), "holds no capture"), result.output


def _run_cli(*args: str | Path, env_extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", **(env_extra or {})}
    return subprocess.run([str(CLI), *map(str, args)], capture_output=True, text=True, timeout=60, env=env, check=False)


@pytest.mark.parametrize(
    "case",
    [
        "nonexistent",
        "sqlite-not-nsys",
        "json-not-a-trace",
        "gzip-not-deflate",
    ],
)
def test_installed_script_reports_unusable_input_without_traceback(tmp_path: Path, case: str) -> None:
    """End to end through the console script: what a user's terminal shows."""
    make, words = BAD_INPUTS[case]
    path = make(tmp_path)
    proc = _run_cli("analyze", path, env_extra={"TRACEGUARD_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert _says(proc.stderr, "no usable input", str(path), words), proc.stderr
    assert proc.stdout == ""


def test_installed_script_unknown_profile_without_traceback() -> None:
    proc = _run_cli("analyze", P2P_TORCH, "--profile", "nope")
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert _says(proc.stderr, "unknown profile 'nope'"), proc.stderr


# ---------------------------------------------------------------- mixed inputs


def test_one_unreadable_file_beside_good_captures_is_reported_and_the_rest_analysed(tmp_path: Path) -> None:
    bad = _empty(tmp_path)
    good = _torch_traces()
    out = tmp_path / "report.json"
    result = _invoke("check", good[0], bad, good[1], "--json", out)
    report = _valid(json.loads(out.read_text()))
    # The exit code follows the verdict, not the unreadable input.
    assert result.exit_code == (1 if report["verdict"] == "fail" else 0), result.output
    errors = {Path(i["path"]).name: i["error"] for i in report["inputs"]}
    assert errors[bad.name] and "empty" in errors[bad.name]
    assert errors[good[0].name] is None and errors[good[1].name] is None
    assert [r["rank"] for r in report["ranks"]] == sorted(_dist_rank(p) for p in good)
    assert _says(result.stderr, f"skipped {bad}"), result.stderr


def test_analyze_with_one_bad_input_still_exits_0(tmp_path: Path) -> None:
    bad = _not_a_trace(tmp_path)
    good = _torch_traces()[1]
    result = _invoke("analyze", bad, good, "--format", "json")
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(result.stdout))
    (bad_input,) = [i for i in report["inputs"] if i["error"]]
    assert bad_input["path"] == str(bad) and bad_input["error_code"] == "unsupported_format"
    assert bad_input["rank"] is None and bad_input["format"] is None
    assert [r["rank"] for r in report["ranks"]] == [_dist_rank(good)]


# ---------------------------------------------------------------- ranks


def test_file_colon_rank_sets_the_rank() -> None:
    first, second = _torch_traces()
    result = _invoke("analyze", f"{first}:5", f"{second}:7", "--format", "json")
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(result.stdout))
    assert [r["rank"] for r in report["ranks"]] == [5, 7]
    by_path = {i["path"]: i for i in report["inputs"]}
    assert by_path[str(first)]["rank"] == 5 and by_path[str(second)]["rank"] == 7
    assert {i["rank_source"] for i in report["inputs"]} == {"argument"}
    assert {r["rank"]: r["input"] for r in report["ranks"]} == {5: str(first), 7: str(second)}


def test_two_files_claiming_one_rank_second_gets_an_error() -> None:
    first, second = _torch_traces()
    result = _invoke("analyze", f"{first}:4", f"{second}:4", "--format", "json")
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(result.stdout))
    assert [r["rank"] for r in report["ranks"]] == [4]
    ok, clash = report["inputs"]
    assert ok["error"] is None and ok["rank"] == 4
    assert clash["error"] and "FILE:RANK" in clash["error"] and "rank 4" in clash["error"]
    assert clash["error_code"] == "duplicate_rank"


def test_run_bundle_directory_loads_both_ranks() -> None:
    result = _invoke("analyze", P2P_TORCH, "--format", "json")
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(result.stdout))
    traces = _torch_traces()
    # The job's own rank<N>.json records beside the traces are not inputs.
    assert sorted(i["path"] for i in report["inputs"]) == sorted(str(p) for p in traces)
    assert [r["rank"] for r in report["ranks"]] == sorted(_dist_rank(p) for p in traces)


def test_bundle_manifest_rank_is_used(tmp_path: Path) -> None:
    trace = _torch_traces()[0]
    assert _dist_rank(trace) != 3
    shutil.copy(trace, tmp_path / "capture.json.gz")
    (tmp_path / "manifest.json").write_text(json.dumps({"captures": [{"path": "capture.json.gz", "rank": 3}]}))
    result = _invoke("analyze", tmp_path, "--format", "json")
    assert result.exit_code == 0, result.output
    report = _valid(json.loads(result.stdout))
    assert [r["rank"] for r in report["ranks"]] == [3]
    (item,) = report["inputs"]
    assert item["rank"] == 3 and item["rank_source"] == "manifest"


# ---------------------------------------------------------------- profiles, version


def test_profiles_lists_every_profile_with_its_description() -> None:
    result = _invoke("profiles")
    assert result.exit_code == 0, result.output
    files = sorted((REPO / "profiles").glob("*.toml"))
    assert files
    for path in files:
        doc = tomllib.loads(path.read_text())
        assert _says(result.stdout, f"{path.stem} — {doc['description']}", *doc.get("rules", {})), path.name


def test_version_prints_the_package_version() -> None:
    result = _invoke("--version")
    assert result.exit_code == 0
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert result.stdout.strip() == f"traceguard {pyproject['project']['version']}"


def test_installed_script_version() -> None:
    proc = _run_cli("--version")
    assert proc.returncode == 0
    assert proc.stdout.strip() == f"traceguard {__version__}"


def test_check_table_shows_no_bare_number_for_capture_health() -> None:
    """Issue 25: the capture_health row read `0` beside its message. The CLI table has check,
    status and detail; capture_health's row holds no cell that is a bare number."""
    result = _invoke("check", P2P_NSYS, "--profile", "h200-nvlink")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.output.splitlines() if "capture_health" in line)
    cells = [cell.strip() for cell in row.strip().strip("│").split("│")]
    assert cells[:2] == ["capture_health", "pass"] and cells[2].startswith("2 rank(s): ")
    assert not any(re.fullmatch(r"\d+(\.\d+)?", cell) for cell in cells), cells
