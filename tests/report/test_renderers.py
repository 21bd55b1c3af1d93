"""Markdown, JUnit and HTML renderings of the report document, and the JSON contract on every
public fixture.

The renderings are checked against the report document they render (each check id, status and
count) and against the formats' own parsers (xml.etree, html.parser, jsonschema), never against
a stored copy of earlier output.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from tests.conftest import OWN, PUBLIC_KINETO, PUBLIC_NSYS, REPO, public_nsys
from traceguard.pipeline import analyze
from traceguard.report import html, junit, markdown

H200 = OWN / "h200"
SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never write to the user's ~/.cache from tests."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """Reports of a run with steps that fails (SHM under h200-nvlink), one that passes (P2P), and
    a capture without NVTX (cloverleaf) read with marker sources only, so it has no steps (its
    inferred steps are tested in tests/metrics/test_step_sources.py)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return {
            "shm": analyze([str(H200 / "shm_nsys")], profile="h200-nvlink").report,
            "p2p": analyze([str(H200 / "p2p_nsys")], profile="h200-nvlink").report,
            "nosteps": analyze([str(public_nsys("cloverleaf"))], step_sources=["pattern", "convention"]).report,
        }


def _errors(report: dict) -> list[str]:
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(report)]


# ---------------------------------------------------------------- Markdown


@pytest.mark.parametrize("name", ["shm", "p2p", "nosteps"])
def test_markdown_names_every_check_its_status_and_the_verdict(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    text = markdown.render(report)
    assert text.splitlines()[0] == f"# traceguard report — {report['verdict'].upper()}"
    rows = {line.split("|")[1].strip(): line for line in text.splitlines() if line.startswith("| `")}
    for check in report["checks"]:
        row = rows.get(f"`{check['id']}`")
        assert row is not None, check["id"]
        assert check["status"] in row
    for check in report["checks"]:
        if check["status"] in ("warn", "fail"):
            assert f"### `{check['id']}` — {check['status']}" in text
            assert f"**Remedy:** {check['remedy']}" in text
    for rank in report["ranks"]:
        assert f"## Rank {rank['rank']}" in text


def test_markdown_collectives_by_type_and_peer_matrix() -> None:
    """mfu_2gpu_before (two ranks, SendRecv kernels from all_to_all): one row per (rank, type)
    with the report's numbers, and the rank × peer matrix; an all-reduce run says why no peers."""
    report = analyze([str(public_nsys("mfu_2gpu_before"))], step_sources=["window"]).report
    lines = markdown.render(report).splitlines()
    section = lines[lines.index("## Collectives by type") :]
    for rank in report["ranks"]:
        for row in rank["collectives_by_type"]["totals"]:
            issued = ", ".join(f"{op} {n}" for op, n in row["issued_as"].items())
            cells = f"| {rank['rank']} | {row['collective']} ({issued}) | {row['count']} |"
            assert any(line.startswith(cells) for line in section), cells
    peers = section[section.index("### Point-to-point peers") :]
    for cell in report["run"]["peer_matrix"]["rows"]:
        start = f"| {cell['rank']} | {cell['peer']} | {cell['kernels']} |"
        (line,) = [line for line in peers if line.startswith(start)]
        assert line.rstrip(" |").endswith(cell["source"])


def test_markdown_says_why_peers_are_not_named(reports: dict[str, dict]) -> None:
    text = markdown.render(reports["p2p"])
    assert f"Peers not named: {reports['p2p']['run']['peer_matrix']['null_reason']}" in text
    for rank in reports["p2p"]["ranks"]:
        (row,) = rank["collectives_by_type"]["totals"]
        assert row["collective"] == "AllReduce" and f"| {rank['rank']} | AllReduce" in text


def test_markdown_says_no_steps_when_there_are_none(reports: dict[str, dict]) -> None:
    assert "No steps found." in markdown.render(reports["nosteps"])


def test_markdown_table_cells_escape_pipes() -> None:
    report = {
        "verdict": "warn",
        "profile": {"name": "p", "chain": ["p"]},
        "traceguard_version": "0",
        "generated_at": "2025-01-01T00:00:00+00:00",
        "checks": [{"id": "x", "status": "warn", "message": "a | b", "reason": None, "remedy": None, "evidence": []}],
        "run": {"metrics": {"null_reasons": {}}},
        "ranks": [],
        "inputs": [],
    }
    row = next(line for line in markdown.render(report).splitlines() if line.startswith("| `x`"))
    assert "a \\| b" in row
    assert len(re.split(r"(?<!\\)\|", row)) == 5  # three cells: the escaped pipe splits nothing


# ---------------------------------------------------------------- JUnit


@pytest.mark.parametrize("name", ["shm", "p2p", "nosteps"])
def test_junit_counts_match_the_checks(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    root = ET.fromstring(junit.render(report))
    (suite,) = root.findall("testsuite")
    statuses = [c["status"] for c in report["checks"]]
    assert suite.get("tests") == str(len(statuses))
    assert suite.get("failures") == str(statuses.count("fail"))
    assert suite.get("skipped") == str(statuses.count("skip"))
    assert suite.get("errors") == "0"
    assert suite.get("name") == f"traceguard.{report['profile']['name']}"
    cases = suite.findall("testcase")
    assert [c.get("name") for c in cases] == [c["id"] for c in report["checks"]]
    assert len(root.findall(".//failure")) == statuses.count("fail")
    assert len(root.findall(".//skipped")) == statuses.count("skip")
    for case, check in zip(cases, report["checks"], strict=True):
        if check["status"] == "skip":
            assert case.find("skipped").get("message") == check["reason"]
        if check["status"] == "warn":
            assert "WARN" in case.find("system-out").text


def test_junit_failure_for_shm_nccl_share(reports: dict[str, dict]) -> None:
    root = ET.fromstring(junit.render(reports["shm"]))
    case = next(c for c in root.iter("testcase") if c.get("name") == "nccl_step_share")
    failure = case.find("failure")
    assert failure is not None and "Remedy:" in failure.text


# ---------------------------------------------------------------- HTML


class _Structure(HTMLParser):
    """Tracks element nesting: every non-void element is closed, in order; collects ids."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[str] = []
        self.problems: list[str] = []
        self.ids: set[str] = set()
        self.check_rows: list[str] = []
        self.text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if attributes.get("id"):
            self.ids.add(attributes["id"])
        if tag == "tr" and attributes.get("data-check"):
            self.check_rows.append(attributes["data-check"])
        if tag not in VOID:
            self.stack.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if tag in VOID:
            return
        if not self.stack or self.stack[-1] != tag:
            self.problems.append(f"</{tag}> closes {self.stack[-1:]} at {self.getpos()}")
            return
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        if self.stack and self.stack[-1] not in ("script", "style"):
            self.text.append(data)


def _parse(text: str) -> _Structure:
    parser = _Structure()
    parser.feed(text)
    parser.close()
    assert not parser.problems, parser.problems[:5]
    assert parser.stack == [], parser.stack
    return parser


def test_html_with_steps_is_well_formed_and_has_both_charts(reports: dict[str, dict]) -> None:
    report = reports["shm"]
    assert any(r["steps"] for r in report["ranks"])
    page = _parse(html.render(report))
    assert {"checks", "metrics", "step-breakdown", "nccl-share"} <= page.ids
    assert page.check_rows == [c["id"] for c in report["checks"]]
    text = " ".join(page.text)
    assert report["verdict"].upper() in text
    assert "No steps were found" not in text


def test_html_without_steps_says_so_and_draws_no_chart(reports: dict[str, dict]) -> None:
    report = reports["nosteps"]
    assert report["ranks"] and not any(r["steps"] for r in report["ranks"])
    page = _parse(html.render(report))
    assert "step-breakdown" not in page.ids and "nccl-share" not in page.ids
    assert "No steps were found" in " ".join(page.text)
    assert page.check_rows == [c["id"] for c in report["checks"]]


def test_html_escapes_text_from_the_captures(reports: dict[str, dict]) -> None:
    report = json.loads(json.dumps(reports["p2p"]))
    report["inputs"][0]["warnings"] = ["<script>alert(1)</script>"]
    report["checks"][0]["message"] = "<img src=x onerror=alert(1)>"
    text = html.render(report)
    assert "<script>alert(1)</script>" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    _parse(text)


# ---------------------------------------------------------------- capture_health's value (issue 25)


def _check_cells_markdown(text: str, check: str) -> list[str]:
    row = next(line for line in text.splitlines() if line.startswith(f"| `{check}` |"))
    return [cell.strip() for cell in row.strip("|").split("|")]


def _check_cells_html(text: str, check: str) -> list[str]:
    class Cells(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.inside = False
            self.cells: list[str] = []
            self.depth = 0

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            if tag == "tr" and dict(attrs).get("data-check") == check:
                self.inside = True
            elif self.inside and tag == "td":
                self.depth += 1
                if self.depth == 1:
                    self.cells.append("")

        def handle_endtag(self, tag: str) -> None:
            if self.inside and tag == "td":
                self.depth -= 1
            elif tag == "tr":
                self.inside = False

        def handle_data(self, data: str) -> None:
            if self.inside and self.depth and self.cells:
                self.cells[-1] += data

    parser = Cells()
    parser.feed(text)
    return [c.strip() for c in parser.cells]


@pytest.mark.parametrize("name", ["p2p", "nosteps"])
def test_capture_health_value_says_what_it_counts(reports: dict[str, dict], name: str) -> None:
    """It showed a bare `0` beside "2 rank(s): 12086 GPU ops, 40 ranges, 6 steps". The value is the
    number of problems the check found, and the page says so; Markdown shows no value cell."""
    report = reports[name]
    check = next(c for c in report["checks"] if c["id"] == "capture_health")
    problems = len(check["evidence"])
    assert check["value"] == problems and check["unit"] == "problems"
    expected = {0: "0 problems found", 1: "1 problem found"}.get(problems, f"{problems} problems found")
    cells = _check_cells_html(html.render(report), "capture_health")
    assert cells[0] == "capture_health" and cells[1] == check["status"]
    assert cells[2] == expected
    markdown_cells = _check_cells_markdown(markdown.render(report), "capture_health")
    assert markdown_cells[0] == "`capture_health`" and len(markdown_cells) == 3
    assert not any(re.fullmatch(r"\d+(\.\d+)?", cell) for cell in markdown_cells), markdown_cells
    if name == "p2p":
        assert problems == 0 and check["message"].startswith("2 rank(s): ")


# ---------------------------------------------------------------- the JSON contract everywhere

PUBLIC = PUBLIC_NSYS + PUBLIC_KINETO


@pytest.mark.parametrize("path", PUBLIC, ids=[p.name.split("__")[-1].removesuffix(".gz") for p in PUBLIC])
def test_report_of_every_public_fixture_is_schema_valid(path: Path) -> None:
    report = analyze([str(path)]).report
    assert _errors(report) == []
    assert report["ranks"], "a public fixture with GPU work yields at least one rank"
    assert all(i["error"] is None for i in report["inputs"])
    # The renderings of the same document do not fail either.
    assert markdown.render(report).startswith("# traceguard report")
    ET.fromstring(junit.render(report))


@pytest.mark.parametrize("name", ["shm", "p2p"])
def test_report_of_h200_runs_is_schema_valid(reports: dict[str, dict], name: str) -> None:
    assert _errors(reports[name]) == []


def test_schema_rejects_a_report_missing_a_contract_metric(reports: dict[str, dict]) -> None:
    """The validator is really checking: drop a required metric and it objects."""
    broken = json.loads(json.dumps(reports["p2p"]))
    del broken["run"]["metrics"]["nccl_share_of_step"]
    broken["generated_at"] = "yesterday"
    errors = _errors(broken)
    assert any("nccl_share_of_step" in e for e in errors)
    assert any("date-time" in e for e in errors)
