"""The link counters in the report document and its Markdown: docs/report.schema.json describes
every key they add (the rank metrics, the step fields, ``ranks[].links``, ``timeline.ranks[].link_lane``,
the run's ``pcie_saturation_source`` and ``transport_observations``) — a key a report carries and the
schema does not name fails here, as does a value outside its type or range; each rank's Markdown
"Links (nsys GPU metrics)" section says what the document says, or why there are no figures.

Reports of real captures: 2×H200 with nsys GPU metrics at 10 kHz, one collector per GPU, NCCL over
SHM (PCIe busy during the all-reduces) and over P2P (NVLink busy), tests/fixtures/h200x2_links; and
a capture without GPU metrics (tests/fixtures/h200/p2p_nsys), whose fields are null with reasons.
"""

from __future__ import annotations

import pytest

from tests.conftest import OWN
from tests.report.test_waits_report import VALIDATOR, _described, _table, undescribed
from traceguard.metrics.link_counters import LINK_RANK_METRICS
from traceguard.pipeline import analyze
from traceguard.report import markdown
from traceguard.report.compare import compare
from traceguard.report.fields import LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.report.links import TITLE

LINKS = OWN / "h200x2_links"
PLAIN = OWN / "h200" / "p2p_nsys"


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        return {
            "shm": analyze([str(LINKS / "shm")]).report,
            "p2p": analyze([str(LINKS / "p2p")]).report,
            "plain": analyze([str(PLAIN)]).report,
        }


@pytest.mark.parametrize("name", ["shm", "p2p", "plain"])
def test_every_key_is_described_and_valid(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    errors = [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in VALIDATOR.iter_errors(report)]
    assert errors == []
    assert undescribed(report) == set()


def test_link_fields_are_described_with_meaning_and_null() -> None:
    for key in LINK_STEP_FIELDS:
        node = _described("ranks", "[]", "steps", "[]", key)
        assert "null" in node["type"] and "%" in node["description"], key
    for key in LINK_RANK_METRICS:
        node = _described("ranks", "[]", "metrics", key)
        assert "null" in node["type"] and "null_reasons" in node["description"], key
    for key in ("pcie_saturation_source", "transport_observations"):
        assert len(_described("run", "metrics", key)["description"]) > 50, key
    links = _described("ranks", "[]", "links")
    assert links["required"] == ["null_reason"] and links["additionalProperties"] is False
    lane = _described("timeline", "ranks", "[]", "link_lane")
    assert {"start", "end", "pcie_avg", "pcie_peak", "nvlink_avg", "nvlink_peak", "null_reason"} <= set(
        lane["properties"]
    )


def test_the_reports_carry_the_fields_or_say_why_not(reports: dict[str, dict]) -> None:
    for name, report in reports.items():
        for rank in report["ranks"]:
            metrics = rank["metrics"]
            assert set(LINK_RANK_METRICS) <= set(metrics), name
            for key in LINK_RANK_METRICS:
                if metrics[key] is None:
                    assert key in metrics["null_reasons"], (name, key)
            assert all(set(LINK_STEP_FIELDS) <= set(s) for s in rank["steps"]), name
        for timeline in report["timeline"]["ranks"]:
            assert "link_lane" in timeline, name
    plain = reports["plain"]
    assert all(r["links"]["null_reason"] and r["metrics"]["link_samples"] is None for r in plain["ranks"])
    assert all(s[k] is None for r in plain["ranks"] for s in r["steps"] for k in LINK_STEP_FIELDS)
    assert all(t["link_lane"]["null_reason"] for t in plain["timeline"]["ranks"])
    # The two captures' story: SHM's collectives on PCIe, P2P's on NVLink.
    assert all(r["metrics"]["nccl_pcie_share"] > 0.5 for r in reports["shm"]["ranks"])
    assert all(r["metrics"]["nccl_nvlink_share"] > 0.5 for r in reports["p2p"]["ranks"])
    assert reports["shm"]["run"]["metrics"]["pcie_saturation_source"] == "nsys GPU metrics"


def _section(text: str, rank: int) -> str:
    start = text.index(f"## Rank {rank}\n")
    start = text.index(f"### {TITLE}", start)
    end = text.find("\n## ", start)
    return text[start : end if end >= 0 else len(text)]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f} %"


@pytest.mark.parametrize("name", ["shm", "p2p"])
def test_markdown_links_section_says_what_the_report_says(reports: dict[str, dict], name: str) -> None:
    report = reports[name]
    text = markdown.render(report)
    assert text.count(f"### {TITLE}") == len(report["ranks"])
    for rank in report["ranks"]:
        section = _section(text, rank["rank"])
        links = rank["links"]
        assert f"GPU {links['device']} (GPU_METRICS at 10.0 kHz): {links['samples']['window']} samples" in section
        stats = _table(section, "| link | over |")
        expected = [
            (
                link,
                label,
                str(links["samples"][where]),
                *(_pct(links["over"][where][key][s]) for s in ("avg", "p95", "peak")),
            )
            for key, link in (("pcie", "PCIe"), ("nvlink", "NVLink"))
            for where, label in (("window", "steps"), ("nccl", "NCCL kernels"), ("copies", "copies"))
        ]
        assert [tuple(r) for r in stats] == expected
        # The NCCL-time figures are the rank metrics (fractions) × 100.
        nccl = next(r for r in stats if r[:2] == ["PCIe", "NCCL kernels"])
        assert nccl[5] == _pct(100 * rank["metrics"]["pcie_nccl_peak"])
        split = _table(section, "| NCCL bytes on |")
        metrics = rank["metrics"]
        assert [(r[0], r[1]) for r in split] == [
            ("NVLink", f"{metrics['nccl_nvlink_share']:.1%}"),
            ("PCIe", f"{metrics['nccl_pcie_share']:.1%}"),
            ("idle (neither link busy)", f"{metrics['nccl_link_idle_share']:.1%}"),
        ]
        assert [r[2] for r in split] == [
            f"{links['nccl_split'][k] / 1e6:.2f} ms" for k in ("nvlink_ns", "pcie_ns", "idle_ns")
        ]
        steps = _table(section, "| step | PCIe avg |")
        assert [tuple(r) for r in steps] == [
            (s["name"], *(_pct(s[k]) for k in LINK_STEP_FIELDS)) for s in rank["steps"]
        ]
        for names in links["names"].values():
            assert "; ".join(names) in section


def test_markdown_without_gpu_metrics_gives_the_reason_in_one_line(reports: dict[str, dict]) -> None:
    report = reports["plain"]
    text = markdown.render(report)
    for rank in report["ranks"]:
        section = _section(text, rank["rank"]).strip().splitlines()
        assert section == [f"### {TITLE}", "", f"No link counters: {rank['links']['null_reason']}."]


def test_compare_pairs_the_wait_and_link_step_fields(reports: dict[str, dict]) -> None:
    """P2P → SHM per step: the link and wait fields as base / head / delta, from the two reports."""
    base, head = reports["p2p"], reports["shm"]
    rows = compare(base, head)["steps"]
    steps = {
        (name, r["rank"], s["index"]): s for name in ("p2p", "shm") for r in reports[name]["ranks"] for s in r["steps"]
    }
    assert len(rows) == 4
    for row in rows:
        b, h = steps[("p2p", row["rank"], row["index"])], steps[("shm", row["rank"], row["index"])]
        for key in (*WAIT_STEP_FIELDS, *LINK_STEP_FIELDS):
            assert (row[f"{key}_base"], row[f"{key}_head"]) == (b[key], h[key]), key
            expected = None if b[key] is None or h[key] is None else h[key] - b[key]
            assert row[f"{key}_delta"] == pytest.approx(expected), key
        # SHM moved the all-reduces onto PCIe: more PCIe load in the NCCL kernels, less NVLink.
        assert row["nccl_pcie_avg_pct_delta"] > 50 and row["nccl_nvlink_avg_pct_delta"] < -50


def test_the_step_field_names_the_store_reads_are_the_analysis_own() -> None:
    """report/fields.py repeats the step field names so that the service loads it without the
    analysis; they must be the names the analysis writes."""
    from traceguard.metrics import link_counters, run
    from traceguard.report import fields

    assert fields.LINK_STEP_FIELDS == link_counters.LINK_STEP_FIELDS
    assert set(run.WAIT_STEP_FIELDS) <= set(fields.WAIT_STEP_FIELDS)
