"""One input surface: captures, run directories and side files, positionally (recognised by content)
or as options, on analyze / check / record / upload; --step-pattern; every command's --help.

Through the real command line (typer's CliRunner on ``traceguard.cli.app``, a real ``traceguard
serve`` for upload); expected numbers come from the raw files with plain sqlite3.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from tests.conftest import OWN, REPO
from traceguard.capture import harness
from traceguard.capture.bench_options import build_parser
from traceguard.cli import app
from traceguard.ingest.side_inputs import parse_topo

P2P = OWN / "h200" / "p2p_nsys"
CAPTURE = P2P / "cap_0.sqlite.gz"
NCCL_LOGS = sorted(P2P.glob("nccl.vm.*.log"))
SIDE = OWN / "side"
#: What `nvidia-smi topo -m` wrote into the harness's topo.txt on a one-GPU H100 machine: the header
#: underlined with terminal escapes (a leading tab, as nvidia-smi prints it).
TOPO_1GPU_ESC = SIDE / "topo_h100_1gpu_ansi.txt"
#: A real paste with the escapes in caret notation (provenance on its first line).
TOPO_1GPU_CARET = SIDE / "topo_lmdeploy4953_1gpu_h200_caret_escapes.txt"
NO_TOPO_ROWS = "no GPU rows found in nvidia-smi topo output"

runner = CliRunner()


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _invoke(*args: object, env: dict[str, str] | None = None):
    result = runner.invoke(app, [str(a) for a in args], env=env)
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"crashed: {result.exception!r}\n{result.output}"
    )
    return result


def _json_report(*args: object) -> tuple[dict, str]:
    result = _invoke("analyze", *args, "--format", "json")
    assert result.exit_code == 0, result.output
    text = result.stdout
    return json.loads(text[text.index("{") :]), result.stderr


def _check(report: dict, check_id: str) -> dict:
    return next(c for c in report["checks"] if c["id"] == check_id)


def _nvtx_ranges(capture: Path, name_regex: str) -> int:
    """Closed NVTX push/pop or start/end ranges of ``capture`` whose name matches, counted with sqlite3."""
    with gzip.open(capture, "rb") as src:
        data = src.read()
    db = sqlite3.connect(":memory:")
    db.deserialize(data)
    rows = db.execute(
        "SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
        "WHERE e.end IS NOT NULL"
    ).fetchall()
    return sum(1 for (name,) in rows if name and re.search(name_regex, name))


# --------------------------------------------------------------------------------------------
# side files, positionally and as options


def test_positional_nccl_log_reaches_the_report() -> None:
    """`analyze cap.sqlite nccl.log`: the logs are side inputs (not skipped captures), so the JSON
    report carries NCCL's account and the transport check is judged."""
    report, stderr = _json_report(CAPTURE, *NCCL_LOGS)
    assert "not a capture traceguard reads" not in stderr
    assert [i["path"] for i in report["inputs"]] == [str(CAPTURE)]  # the logs are not capture inputs
    assert report["side_inputs"]["sources"]["nccl_log"] == [str(p) for p in NCCL_LOGS]
    assert report["nccl"] is not None and report["nccl"]["connections"]
    # Every P2P connection line of the logs is in the report.
    via_p2p = sum(
        1 for log in NCCL_LOGS for line in log.read_text(errors="replace").splitlines() if re.search(r"via P2P", line)
    )
    assert via_p2p > 0
    assert _check(report, "transport_p2p")["status"] != "skip"


def test_nccl_log_option_gives_the_same_report() -> None:
    positional, _ = _json_report(CAPTURE, *NCCL_LOGS)
    options = [a for log in NCCL_LOGS for a in ("--nccl-log", log)]
    optional, _ = _json_report(CAPTURE, *options)
    assert optional["nccl"] == positional["nccl"]
    assert _check(optional, "transport_p2p") == _check(positional, "transport_p2p")
    assert _check(optional, "transport_p2p")["status"] != "skip"


def test_a_side_file_given_twice_counts_once() -> None:
    """The same log as an option, positionally and inside its run directory is read once."""
    once, _ = _json_report(CAPTURE, *NCCL_LOGS)
    thrice, _ = _json_report(P2P, *NCCL_LOGS, *[a for log in NCCL_LOGS for a in ("--nccl-log", log)])
    assert sorted(thrice["side_inputs"]["sources"]["nccl_log"]) == sorted(str(p) for p in NCCL_LOGS)
    assert thrice["nccl"]["connections"] == once["nccl"]["connections"]


def test_check_takes_side_files_positionally() -> None:
    result = _invoke("check", CAPTURE, *NCCL_LOGS, "--json", "-", env={"COLUMNS": "200"})
    assert result.exit_code in (0, 1), result.output
    text = result.stdout
    report = json.loads(text[text.index("{\n") :])
    assert _check(report, "transport_p2p")["status"] != "skip"


def test_positional_text_that_is_no_input_is_still_reported(tmp_path: Path) -> None:
    stray = tmp_path / "notes.txt"
    stray.write_text("nothing traceguard reads\n")
    report, stderr = _json_report(CAPTURE, stray)
    record = next(i for i in report["inputs"] if i["path"] == str(stray))
    assert record["error_code"] == "unsupported_format"
    assert "not a capture traceguard reads" in record["error"]
    assert "skipped" in stderr and stray.name in "".join(stderr.split())


# --------------------------------------------------------------------------------------------
# nvidia-smi topo -m with terminal escapes


@pytest.mark.parametrize(
    "text",
    [
        TOPO_1GPU_ESC.read_text(),
        # the same without the leading tab
        TOPO_1GPU_ESC.read_text().lstrip("\t"),
    ],
    ids=["harness-topo.txt", "no-leading-tab"],
)
def test_one_gpu_topo_with_escapes_parses(text: str) -> None:
    assert text.lstrip("\t").startswith("\x1b[4mGPU0\tCPU Affinity")
    topo = parse_topo(text)
    assert topo["gpus"] == [0]
    row = next(line for line in text.splitlines() if line.startswith("GPU0\t X"))
    cpus, numa = row.split("\t")[2:4]
    assert topo["cpu_affinity"] == {0: cpus} and topo["numa_affinity"] == {0: numa}
    assert topo["links"] == {} and topo["nvlink_pairs"] == set()


def test_pasted_topo_with_caret_escapes_parses() -> None:
    text = TOPO_1GPU_CARET.read_text()
    assert "^[[4mGPU0" in text
    topo = parse_topo(text)
    header = next(line for line in text.splitlines() if "GPU0" in line and "Affinity" in line)
    nics = re.findall(r"NIC\d+", header)
    assert topo["gpus"] == [0] and topo["nics"] == nics
    row = next(line for line in text.splitlines() if line.startswith("GPU0\t"))
    links = row.split("\t")[2 : 2 + len(nics)]
    assert topo["gpu_nic_links"] == {(0, nic): kind for nic, kind in zip(nics, links, strict=True)}
    assert topo["cpu_affinity"] == {0: row.split("\t")[2 + len(nics)]}
    assert topo["nic_names"] == dict(re.findall(r"^\s*(NIC\d+): (\S+)$", text, re.M))


def test_one_gpu_topo_with_empty_affinity_cells() -> None:
    """WSL2 prints no CPU/NUMA affinity: the empty cells must not shift "N/A" into CPU Affinity."""
    text = (SIDE / "topo_sglang24364_1gpu_wsl2_no_affinity.txt").read_text()
    row = next(line for line in text.splitlines() if line.startswith("GPU0\t"))
    assert row.split("\t")[2:] == ["", "", "", "N/A"]
    topo = parse_topo(text)
    assert topo["gpus"] == [0]
    assert topo["cpu_affinity"] == {} and topo["numa_affinity"] == {} and topo["gpu_numa_id"] == {0: "N/A"}


@pytest.mark.parametrize("how", ["option", "positional"])
def test_topo_with_escapes_gives_no_warning(how: str) -> None:
    args = ["--topo", TOPO_1GPU_ESC] if how == "option" else [TOPO_1GPU_ESC]
    report, stderr = _json_report(CAPTURE, *args)
    assert NO_TOPO_ROWS not in "".join(stderr.split()) and NO_TOPO_ROWS.replace(" ", "") not in "".join(stderr.split())
    assert report["side_inputs"]["errors"] == []
    assert report["side_inputs"]["sources"]["topo"] == [str(TOPO_1GPU_ESC)]


# --------------------------------------------------------------------------------------------
# --step-pattern


def test_step_pattern_reaches_the_analysis() -> None:
    matching = "^forward$"
    expected = _nvtx_ranges(CAPTURE, matching)
    assert expected > 0
    report, _ = _json_report(CAPTURE, "--step-pattern", matching)
    rank = report["ranks"][0]
    assert rank["step_source"] == "pattern"
    assert [s["name"] for s in rank["steps"]] == ["forward"] * expected

    # A pattern that matches nothing falls through to the harness's own `Batch N` convention.
    nothing = "^no range is called this$"
    assert _nvtx_ranges(CAPTURE, nothing) == 0
    report, _ = _json_report(CAPTURE, "--step-pattern", nothing)
    rank = report["ranks"][0]
    assert rank["step_source"] == "convention"
    assert len(rank["steps"]) == _nvtx_ranges(CAPTURE, r"^Batch \d+$")


def test_step_pattern_on_check() -> None:
    result = _invoke("check", CAPTURE, "--step-pattern", "^forward$", "--json", "-", env={"COLUMNS": "200"})
    assert result.exit_code in (0, 1), result.output
    report = json.loads(result.stdout[result.stdout.index("{\n") :])
    assert report["ranks"][0]["step_source"] == "pattern"


@pytest.mark.parametrize(
    "command",
    [
        ["analyze", CAPTURE],
        ["check", CAPTURE],
        ["record", CAPTURE, "--data-dir", "{tmp}"],
        ["upload", CAPTURE, "--server", "http://127.0.0.1:9", "--token", "tg_unused"],
    ],
    ids=["analyze", "check", "record", "upload"],
)
def test_bad_step_pattern_exits_2_naming_it(command: list[object], tmp_path: Path) -> None:
    args = [str(a).replace("{tmp}", str(tmp_path)) for a in command]
    result = _invoke(*args, "--step-pattern", "Batch (\\d+", env={"COLUMNS": "300"})
    assert result.exit_code == 2, result.output
    said = " ".join(result.stderr.split())
    assert "--step-pattern 'Batch (\\\\d+' is not a valid regular expression: unclosed group" in said, said
    assert not (tmp_path / "traceguard.db").exists()  # refused before anything was stored


# --------------------------------------------------------------------------------------------
# record and upload: side files reach the service's analysis


def _stored(db_path: Path) -> tuple[list[tuple[str, str]], dict[str, str]]:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as db:
        files = db.execute("SELECT name, kind FROM files ORDER BY name").fetchall()
        statuses = dict(db.execute("SELECT rule_id, status FROM check_results").fetchall())
    return files, statuses


def _cli(*args: object, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("TRACEGUARD_")} | {"COLUMNS": "300"}
    return subprocess.run(
        [sys.executable, "-m", "traceguard.cli", *map(str, args)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_record_takes_side_files_positionally_and_as_options(tmp_path: Path) -> None:
    data = tmp_path / "store"
    given = [CAPTURE, NCCL_LOGS[0], "--nccl-log", NCCL_LOGS[1], "--topo", TOPO_1GPU_ESC]
    done = _cli("record", *given, "--data-dir", data)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    files, statuses = _stored(data / "traceguard.db")
    kinds = {CAPTURE: "nsys-sqlite", NCCL_LOGS[0]: "nccl_log", NCCL_LOGS[1]: "nccl_log", TOPO_1GPU_ESC: "topo"}
    assert files == sorted((path.name, kind) for path, kind in kinds.items())
    assert statuses["transport_p2p"] != "skip"
    assert NO_TOPO_ROWS not in done.stderr


def test_record_keeps_step_patterns_for_the_stored_analysis(tmp_path: Path) -> None:
    data = tmp_path / "store"
    done = _cli("record", CAPTURE, "--step-pattern", "^forward$", "--data-dir", data)
    assert done.returncode in (0, 1), done.stdout + done.stderr
    with sqlite3.connect(f"file:{data / 'traceguard.db'}?mode=ro", uri=True) as db:
        names = [name for (name,) in db.execute("SELECT name FROM steps ORDER BY step_index")]
    assert names == ["forward"] * _nvtx_ranges(CAPTURE, "^forward$")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    from tests.service.live import LiveServer

    server = LiveServer(tmp_path / "data").start()
    try:
        made = _cli("token", "create", "--project", "default", "--scope", "read,upload", "--data-dir", server.data_dir)
        assert made.returncode == 0, made.stderr
        yield server.url, made.stdout.strip(), server.data_dir
    finally:
        server.stop()


@pytest.mark.slow
def test_upload_sends_side_files_given_positionally_and_as_options(live: tuple[str, str, Path]) -> None:
    url, token, data = live
    done = _cli(
        "upload", CAPTURE, NCCL_LOGS[0], "--nccl-log", NCCL_LOGS[1], "--topo", TOPO_1GPU_ESC,
        "--step-pattern", "^forward$", "--server", url, "--token", token,
    )  # fmt: skip
    assert done.returncode in (0, 1), done.stdout + done.stderr
    files, statuses = _stored(data / "traceguard.db")
    assert sorted(kind for _, kind in files) == ["nccl_log", "nccl_log", "nsys-sqlite", "topo"]
    assert statuses["transport_p2p"] != "skip"
    with sqlite3.connect(f"file:{data / 'traceguard.db'}?mode=ro", uri=True) as db:
        names = [name for (name,) in db.execute("SELECT name FROM steps ORDER BY step_index")]
    assert names == ["forward"] * _nvtx_ranges(CAPTURE, "^forward$")


# --------------------------------------------------------------------------------------------
# --help of every command


def _walk(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command and group under typer's click object (typer vendors its own click)."""
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _walk(sub, (*path, name))


#: The commands whose options go on to an argparse parser: their help must list that parser's options.
PASS_THROUGH = {
    ("harness", "run"): harness.run_parser,
    ("harness", "sweep"): lambda: harness.sweep_parser(with_job_options=True),
    ("bench-collectives",): build_parser,
}


def _parser_options(parser) -> list[str]:
    return [opt for action in parser._actions for opt in action.option_strings if opt.startswith("--")]


def test_every_command_help_lists_its_real_options() -> None:
    commands = list(_walk(typer.main.get_command(app)))
    assert {path for path, _ in commands} >= {("analyze",), ("harness", "run"), ("bench-collectives",), ("token",)}
    for path, command in commands:
        result = _invoke(*path, "--help", env={"COLUMNS": "250"})
        assert result.exit_code == 0, (path, result.output)
        text = result.stdout
        expected = [opt for param in command.params for opt in param.opts if opt.startswith("-")]
        if path in PASS_THROUGH:
            expected += _parser_options(PASS_THROUGH[path]())
        missing = [opt for opt in expected if not re.search(rf"(?<![\w-]){re.escape(opt)}(?![\w-])", text)]
        assert not missing, (path, missing)
        # Console markup must not eat "[harness]" (it did: "needs traceguard" and nothing after).
        for at in (m.end() for m in re.finditer(r"needs traceguard", text)):
            assert text[at : at + 9] == "[harness]", (path, text[at - 20 : at + 20])


def test_pass_through_help_covers_every_argparse_option() -> None:
    """The lists above are not empty by accident: the job options are there, from the one definition."""
    run_options = _parser_options(harness.run_parser())
    assert {"--world-size", "--capture", "--comm-hook", "--out"} <= set(run_options)
    sweep_options = _parser_options(harness.sweep_parser(with_job_options=True))
    assert {"--matrix", "--only", "--world-size"} <= set(sweep_options)
    assert {"--ops", "--min-bytes", "--cuda-graph"} <= set(_parser_options(build_parser()))


def test_upload_to_an_existing_run_refuses_new_step_patterns() -> None:
    result = _invoke(
        "upload", CAPTURE, "--run", "7", "--step-pattern", "^forward$",
        "--server", "http://127.0.0.1:9", "--token", "tg_unused", env={"COLUMNS": "300"},
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "run 7 keeps the patterns it has" in " ".join(result.stderr.split())
