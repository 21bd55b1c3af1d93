"""The report headers say where the steps came from (Markdown, and the HTML page's line)."""

from __future__ import annotations

from tests.conftest import OWN, public_nsys
from traceguard.pipeline import analyze
from traceguard.report import html, markdown
from traceguard.report.steps import step_sources_line


def test_header_names_inferred_steps(unpacked) -> None:
    report = analyze([str(unpacked(public_nsys("mfu_2gpu_before")))]).report
    line = step_sources_line(report)
    assert line == "Steps: inferred from the periodic GPU work, no step marker (119 kernels per iteration)"
    assert line in markdown.render(report)
    assert "id='step-sources'>Steps: inferred" in html.render(report, plotly_src="plotly.js")


def test_header_groups_ranks_by_source(unpacked) -> None:
    cap = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    report = analyze([str(cap)]).report
    assert step_sources_line(report) == "Steps: the training loop's own marker (traceguard harness)"
    report["ranks"] = [dict(report["ranks"][0], rank=r) for r in range(4)]
    report["ranks"][3].update(step_source="window", step_detail=None)
    assert step_sources_line(report) == (
        "Steps: ranks 0–2: the training loop's own marker (traceguard harness); "
        "rank 3: each rank's whole GPU window as one step, no step marker and no periodic structure"
    )
