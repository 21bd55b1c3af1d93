"""Who waits for whom in the report document and its Markdown: docs/report.schema.json describes
every key of real reports, the cross-rank fields (clock alignment, late rank, wait / transfer, the
step breakdown) included — a key that a report carries and the schema does not name fails here, as
does a value outside its type or range; the Markdown's "Who waits for whom" section says what the
document says (the HTML charts are tested in real Chromium: test_waits_chromium.py).

Reports of real captures: 2×H200 DDP with 25 MB buckets under nsys (rank 0 late at 110 of 111
all-reduces), the same job under torch.profiler (rank 1 late), one rank alone (nothing to match),
HTA's sampled pair of ranks, whose clocks cannot be trusted (every split field null), and a gloo
pair on CPU whose rank 1 sleeps 40 ms a step (arrivals and the late rank, no split).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.conftest import OWN, PUBLIC, REPO
from traceguard.pipeline import analyze
from traceguard.report import markdown

SCHEMA = json.loads((REPO / "docs" / "report.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA, format_checker=Draft202012Validator.FORMAT_CHECKER)
H200 = OWN / "h200"
HTA = PUBLIC / "kineto" / "facebookresearch__HolisticTraceAnalysis__tests__data__trace_filter__sampled_rank-{}.json.gz"
#: Free-form by design: each rule writes its own evidence rows.
FREE_FORM = (".checks[].evidence[]",)

STEP_FIELDS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "period_ns",
    "compute_ns",
    "comm_ns",
    "comm_wait_ns",
    "comm_transfer_ns",
    "copy_ns",
    "idle_host_ns",
    "idle_other_ns",
    "lateness_ns",
)
RUN_METRICS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "late_rank",
    "collective_instances_matched",
    "collective_instances_unmatched",
    "matched_steps",
    "arrival_spread",
    "arrival_steps_compared",
    "straggler_worst",
    "straggler_evidence_steps",
)
RANK_METRICS = ("nccl_wait_ns", "nccl_transfer_ns", "nccl_wait_share", "collective_instances_matched", "last_arrivals")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return {
            "nsys": analyze([str(H200 / "p2p_nsys_bucket25")]).report,
            "kineto": analyze([str(H200 / "p2p_torch")]).report,
            "one_rank": analyze([str(H200 / "p2p_nsys" / "cap_0.sqlite.gz")]).report,
            "untrusted": analyze([str(HTA).format(0), str(HTA).format(1)]).report,
            "cpu": analyze([str(OWN / "slow_rank_cpu" / "torch")]).report,
        }


def _resolve(node: Any) -> Any:
    while isinstance(node, dict) and "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[-1]]
    return node


def _branches(node: Any) -> list[dict]:
    node = _resolve(node)
    if not isinstance(node, dict):
        return []
    found = [node]
    for key in ("anyOf", "oneOf", "allOf"):
        for sub in node.get(key, []):
            found += _branches(sub)
    return found


def undescribed(doc: Any, node: Any = SCHEMA, path: str = "") -> set[str]:
    """Paths of keys in ``doc`` that no schema branch at that place names (nor allows by
    ``additionalProperties``)."""
    if path.startswith(FREE_FORM):
        return set()
    missing: set[str] = set()
    branches = _branches(node)
    if isinstance(doc, dict):
        for key, value in doc.items():
            subs = []
            for branch in branches:
                if key in branch.get("properties", {}):
                    subs.append(branch["properties"][key])
                elif isinstance(branch.get("additionalProperties"), dict):
                    subs.append(branch["additionalProperties"])
            if not subs:
                missing.add(f"{path}.{key}")
            for sub in subs:
                missing |= undescribed(value, sub, f"{path}.{key}")
    elif isinstance(doc, list):
        for branch in branches:
            if "items" in branch:
                for value in doc:
                    missing |= undescribed(value, branch["items"], f"{path}[]")
    return missing


@pytest.mark.parametrize("name", ["nsys", "kineto", "one_rank", "untrusted", "cpu"])
def test_every_key_is_described_and_valid(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(report)]
    assert errors == []
    assert undescribed(report) == set()


def _described(*path: str) -> dict:
    node: Any = SCHEMA
    for key in path:
        node = _resolve(node)
        node = node["items"] if key == "[]" else node["properties"][key]
    return _resolve(node)


def test_wait_fields_are_described_with_meaning_unit_and_null() -> None:
    """Each new field has a description that gives its unit (ns, a share, a count) and allows null."""
    for key in STEP_FIELDS:
        node = _described("ranks", "[]", "steps", "[]", key)
        assert "null" in node["type"] and "ns" in node["description"], key
    for key in RUN_METRICS:
        node = _described("run", "metrics", key)
        assert "null" in node["type"] and len(node["description"]) > 30, key
    for key in RANK_METRICS:
        node = _described("ranks", "[]", "metrics", key)
        assert "null" in node["type"] and len(node["description"]) > 30, key
    for key in ("clock_alignment", "late_rank"):
        assert "null" in _described("run", key)["type"]
    assert "residual_ns" in _described("run", "clock_alignment")["properties"]["ranks"]["items"]["required"]


def test_the_reports_carry_the_fields(reports: dict[str, dict]) -> None:
    """Every report has every field (null where it cannot be known), and nulls say why."""
    for name, report in reports.items():
        metrics = report["run"]["metrics"]
        assert set(RUN_METRICS) <= set(metrics), name
        for key in RUN_METRICS:
            if metrics[key] is None:
                assert key in metrics["null_reasons"], (name, key)
        assert {"clock_alignment", "late_rank", "arrival_steps"} <= set(report["run"]), name
        for rank in report["ranks"]:
            assert set(RANK_METRICS) <= set(rank["metrics"]), name
            for step in rank["steps"]:
                assert set(STEP_FIELDS) <= set(step), name
    nsys = reports["nsys"]
    assert nsys["run"]["late_rank"]["rank"] == 0 and nsys["run"]["clock_alignment"]["trusted"] is True
    assert reports["kineto"]["run"]["late_rank"]["rank"] == 1
    assert reports["one_rank"]["run"]["late_rank"] is None
    untrusted = reports["untrusted"]
    assert untrusted["run"]["clock_alignment"]["trusted"] is False and untrusted["run"]["clock_alignment"]["reason"]
    assert all(s["nccl_wait_ns"] is None and s["lateness_ns"] is None for r in untrusted["ranks"] for s in r["steps"])


# ---------------------------------------------------------------- Markdown


def _table(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_markdown_says_who_waits_for_whom(reports: dict[str, dict]) -> None:
    report = reports["nsys"]
    text = markdown.render(report)
    section = text[text.index("## Who waits for whom") : text.index("## Collectives by type")]
    late = report["run"]["late_rank"]
    assert f"**Rank {late['rank']} is the late rank**: it arrived last at 110 of 111 matched collectives" in section
    assert "launched in `backward` (110)" in section
    assert "trusted (every residual ≤ 0.10 ms)" in section
    clock = _table(section, "| rank | clock base |")
    assert [(int(r[0]), r[1], r[3]) for r in clock] == [
        (c["rank"], c["base_source"], f"{c['residual_ns'] / 1e3:.1f} µs")
        for c in report["run"]["clock_alignment"]["ranks"]
    ]
    share = report["run"]["metrics"]["nccl_wait_share"]
    assert f"{share:.1%} was waiting for the last rank" in section
    split = _table(section, "| rank | NCCL wait |")
    assert [(int(r[0]), r[1], r[2], r[4]) for r in split] == [
        (
            r["rank"],
            f"{r['metrics']['nccl_wait_ns'] / 1e6:.2f} ms",
            f"{r['metrics']['nccl_transfer_ns'] / 1e6:.2f} ms",
            f"{r['metrics']['last_arrivals']['count']} of {r['metrics']['last_arrivals']['of']}",
        )
        for r in report["ranks"]
    ]
    steps = _table(section, "| rank | step | period |")
    assert [(int(r[0]), r[1], r[7], r[9]) for r in steps] == [
        (r["rank"], s["name"], f"{s['idle_host_ns'] / 1e6:.2f} ms", f"{s['lateness_ns'] / 1e6:.2f} ms")
        for r in report["ranks"]
        for s in r["steps"]
    ]


def test_markdown_without_trusted_clocks_or_a_second_rank(reports: dict[str, dict]) -> None:
    text = markdown.render(reports["untrusted"])
    section = text[text.index("## Who waits for whom") : text.index("## Collectives by type")]
    assert "**not trusted**: " + reports["untrusted"]["run"]["clock_alignment"]["reason"] in section
    assert "no late rank and no wait / transfer split" in section and "is the late rank" not in section
    # Each rank's own GPU time needs no other rank: still there, its exposed comm not split.
    assert len(_table(section, "| rank | step | period |")) == sum(
        len(r["steps"]) for r in reports["untrusted"]["ranks"]
    )
    assert "(not split)" in section
    assert "## Who waits for whom" not in markdown.render(reports["one_rank"])


def test_markdown_of_a_cpu_run_names_the_late_rank_without_a_split(reports: dict[str, dict]) -> None:
    report = reports["cpu"]
    assert report["run"]["late_rank"]["rank"] == 1 and report["run"]["metrics"]["nccl_wait_share"] is None
    text = markdown.render(report)
    section = text[text.index("## Who waits for whom") : text.index("## Collectives by type")]
    assert "trusted (the ranks share one host's clock)" in section
    assert "**Rank 1 is the late rank**" in section
    assert "Wait and transfer not split: " + report["run"]["metrics"]["null_reasons"]["nccl_wait_share"] in section
