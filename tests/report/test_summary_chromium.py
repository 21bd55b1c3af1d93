"""A report by summary in real headless Chromium (issue 30; the shared Playwright fixture of
test_html_chromium.py): the 40-rank run's page loads offline without errors, draws one rank × step
heat map per field with every rank as a row and every step index as a column, holding the values of
the full report's step rows, and lists the kept ranks and each per-rank metric's distribution.
Expected values come from the full report of the same run, not from the page's own document."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.report.test_html_chromium import browser  # noqa: F401 - the shared Chromium fixture
from traceguard.pipeline import analyze
from traceguard.report import html
from traceguard.report.overview import HEATMAP_TITLES

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def page_and_full(many_ranks: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict, Path]:
    folder = tmp_path_factory.mktemp("summary-html")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(folder / "cache"))
        summary = analyze([str(many_ranks)], scheduler="serial", detail_dir=folder / "detail").report
        full = analyze([str(many_ranks)], scheduler="serial", detail="full").report
    page = folder / "summary.html"
    page.write_text(html.render(summary))
    return summary, full, page


def test_summary_page_draws_the_heat_maps_of_every_rank(browser, page_and_full, tmp_path: Path) -> None:  # noqa: F811
    summary, full, path = page_and_full
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    try:
        page.goto(path.as_uri(), wait_until="load")
        indices = sorted({s["index"] for r in full["ranks"] for s in r["steps"]})
        ranks = [str(r["rank"]) for r in full["ranks"]]
        drawn = 0
        for field in HEATMAP_TITLES:
            values = [[{s["index"]: s[field] for s in r["steps"]}.get(i) for i in indices] for r in full["ranks"]]
            if not any(v is not None for row in values for v in row):
                continue
            div = f"heatmap-{field.replace('_', '-')}"
            page.wait_for_selector(f"#{div} svg.main-svg", timeout=15_000)
            trace = page.evaluate(
                f"() => {{ const t = document.getElementById('{div}').data[0]; return [t.y, t.x, t.z]; }}"
            )
            assert trace[0] == ranks and trace[1] == [str(i) for i in indices]
            scale = 1e-6 if field.endswith("_ns") else 1.0
            expected = [[None if v is None else v * scale for v in row] for row in values]
            assert [[None if v is None else pytest.approx(v) for v in row] for row in expected] == trace[2]
            drawn += 1
        assert drawn >= 2  # NCCL share and the wait at least: every rank has matched collectives
        kept = page.locator("#kept-ranks tr").count() - 1
        assert kept == len(summary["rank_summary"]["in_report"]) == len(summary["ranks"])
        rows = page.locator("#distributions tr").count() - 1
        assert rows == sum(1 for d in summary["rank_summary"]["distributions"].values() if d.get("ranks"))
        # Each row's histogram: one bar per bin, as many ranks in its titles as the metric is known on.
        wait_values = [r["metrics"]["nccl_wait_ns"] for r in full["ranks"] if r["metrics"]["nccl_wait_ns"] is not None]
        bars = "#distributions tr[data-metric='nccl_wait_ns'] svg.histogram title"
        titles = page.evaluate(f"() => [...document.querySelectorAll({bars!r})].map(t => t.textContent)")
        assert len(titles) == 10 and sum(int(t.split()[0]) for t in titles) == len(wait_values)
        assert page.locator("#rank-summary").inner_text().startswith(f"Ranks: a summary of {len(full['ranks'])}")
        assert errors == []
        page.screenshot(path=str(tmp_path / "summary.png"), full_page=False)
    finally:
        context.close()
