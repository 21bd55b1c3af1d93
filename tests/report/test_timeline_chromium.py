"""The timeline in real headless Chromium: in the HTML report file and on the service's run page.

Plotly draws one trace per (rank, lane) with the report's segments, exposed communication in its
own red lane, and a drag across the time axis zooms in; the console stays clean. A screenshot of
the timeline is kept in the test's output directory. Expected lanes come from the report document,
whose lanes tests/metrics/test_timeline.py checks against plain SQL.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.conftest import OWN
from tests.report.test_html_chromium import browser  # noqa: F401 - the shared Chromium fixture
from tests.service.test_web_chromium import site  # noqa: F401 - a live service with two runs
from traceguard.pipeline import analyze
from traceguard.report import html
from traceguard.report.link_charts import LINK_KINDS
from traceguard.report.timeline import KIND_COLOUR
from traceguard.report.waits import WAIT_LANE

RUN = OWN / "h200" / "p2p_nsys"

pytestmark = pytest.mark.slow

_TRACES = (
    "() => document.getElementById('timeline').data.map(t => ({meta: t.meta, colour: t.line.color,"
    " segments: t.x.filter(v => v !== null).length / 2}))"
)


def _watch(page) -> list[str]:
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return problems


def _check_lanes(page, report: dict) -> None:
    traces = page.evaluate(_TRACES)
    expected = {
        (r["rank"], lane["name"]): (lane["kind"], len(lane["start"]))
        for r in report["timeline"]["ranks"]
        for lane in r["lanes"]
    }
    drawn = [t for t in traces if t["meta"]["lane"] != WAIT_LANE and t["meta"]["kind"] not in LINK_KINDS]
    assert {(t["meta"]["rank"], t["meta"]["lane"]): (t["meta"]["kind"], t["segments"]) for t in drawn} == expected
    assert {t["colour"] for t in traces if t["meta"]["kind"] == "exposed"} == {KIND_COLOUR["exposed"]}
    # Besides: each rank's NCCL kernels split into waiting and transfer (tests/report/test_waits_chromium.py),
    # one segment of each a matched kernel at most.
    split = {t["meta"]["rank"] for t in traces if t["meta"]["lane"] == WAIT_LANE}
    for t in traces:
        if t["meta"]["lane"] == WAIT_LANE:
            own = [n for (rank, _), (kind, n) in expected.items() if rank == t["meta"]["rank"] and kind == "nccl"]
            assert t["segments"] <= sum(own)
    # One y category per (rank, lane) was drawn, one per rank for the split, one per link row
    # (captures with nsys GPU metrics: tests/report/test_links_chromium.py).
    links = {(t["meta"]["rank"], t["meta"]["lane"]) for t in traces if t["meta"]["kind"] in LINK_KINDS}
    assert page.locator("#timeline .yaxislayer-above .ytick").count() == len(expected) + len(split) + len(links)


@pytest.fixture(scope="module")
def report_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        report = analyze([str(RUN)]).report
    page = tmp_path_factory.mktemp("timeline") / "report.html"
    page.write_text(html.render(report))
    return report, page


def test_timeline_in_the_html_report(browser, report_file, tmp_path: Path) -> None:  # noqa: F811
    report, path = report_file
    assert {lane["kind"] for r in report["timeline"]["ranks"] for lane in r["lanes"]} == set(KIND_COLOUR) | {"nccl"}
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    problems = _watch(page)
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_selector("#timeline svg.main-svg", timeout=15_000)
        _check_lanes(page, report)

        # Drag across the plot area: the x range narrows (zoom), the y axis does not move.
        before = page.evaluate("() => document.getElementById('timeline')._fullLayout.xaxis.range.slice()")
        page.locator("#timeline").scroll_into_view_if_needed()
        box = page.locator("#timeline .nsewdrag").first.bounding_box()
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + box["width"] * 0.3, y)
        page.mouse.down()
        page.mouse.move(box["x"] + box["width"] * 0.45, y, steps=8)
        page.mouse.up()
        page.wait_for_function(
            "(w) => { const r = document.getElementById('timeline')._fullLayout.xaxis.range; return r[1] - r[0] < w; }",
            arg=(before[1] - before[0]) / 2,
            timeout=10_000,
        )
        shot = tmp_path / "timeline.png"
        page.locator("#timeline").screenshot(path=str(shot))
        assert problems == []
    finally:
        context.close()
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 800 and height >= 300


def test_timeline_on_the_run_page_and_collectives_on_the_compare_page(browser, site) -> None:  # noqa: F811
    server, reader, reports = site
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    problems = _watch(page)
    try:
        page.goto(f"{server.url}/login")
        page.fill("#token", reader)
        page.click("#login button[type=submit]")
        page.wait_for_url(f"{server.url}/runs")
        run_id, doc = next(iter(reports.items()))
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_selector("#timeline .main-svg", timeout=15_000)
        _check_lanes(page, doc)

        base, head = sorted(reports)
        page.goto(f"{server.url}/compare?base={base}&head={head}")
        rows = page.locator("#collective-deltas tr[data-collective]")
        types = [t["collective"] for t in reports[base]["run"]["collectives_by_type"]]
        assert [rows.nth(i).get_attribute("data-collective") for i in range(rows.count())] == types
        assert problems == []
    finally:
        context.close()
