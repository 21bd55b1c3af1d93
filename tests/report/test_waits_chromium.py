"""Who waits for whom in the HTML report, in real headless Chromium (the shared Playwright fixture
of test_html_chromium.py): the step GPU-time chart, the rank × step lateness heatmap naming the late
rank, the clock alignment and wait / transfer tables, and the timeline's wait / transfer lane.

Expected values come from the report document the page renders (whose numbers tests/metrics and
tests/report/test_waits_report.py check), read back from what Plotly holds and from the DOM it drew;
the page loads offline and logs no error. Captures: 2×H200 DDP with 25 MB buckets under nsys (rank 0
late at 110 of 111 all-reduces), the same job under torch.profiler (rank 1 late), and HTA's sampled
pair of ranks whose clocks cannot be trusted. Screenshots land in the test's output directory.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from tests.conftest import OWN, PUBLIC
from tests.report.test_html_chromium import browser  # noqa: F401 - the shared Chromium fixture
from traceguard.pipeline import analyze
from traceguard.report import html
from traceguard.report.waits import PART_COLOUR, TRANSFER_COLOUR, WAIT_COLOUR, WAIT_LANE

pytestmark = pytest.mark.slow

H200 = OWN / "h200"
HTA = PUBLIC / "kineto" / "facebookresearch__HolisticTraceAnalysis__tests__data__trace_filter__sampled_rank-{}.json.gz"
PARTS = ("compute_ns", "comm_wait_ns", "comm_transfer_ns", "copy_ns", "idle_host_ns", "idle_other_ns")


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    folder = tmp_path_factory.mktemp("waits-html")
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        for name, paths in (
            ("nsys", [H200 / "p2p_nsys_bucket25"]),
            ("kineto", [H200 / "p2p_torch"]),
            ("untrusted", [Path(str(HTA).format(0)), Path(str(HTA).format(1))]),
        ):
            report = analyze([str(p) for p in paths]).report
            page = folder / f"{name}.html"
            page.write_text(html.render(report))
            out[name] = (report, page)
    return out


def _open(browser, path: Path):  # noqa: F811
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    page.goto(path.as_uri(), wait_until="load")
    return context, page, problems


def _png(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_late_rank_charts_and_tables(browser, pages, tmp_path: Path) -> None:  # noqa: F811
    report, path = pages["nsys"]
    late = report["run"]["late_rank"]
    assert (late["rank"], late["last_arrivals"], late["of"]) == (0, 110, 111)
    context, page, problems = _open(browser, path)
    try:
        for chart in ("step-time", "lateness", "timeline"):
            page.wait_for_selector(f"#{chart} svg.main-svg", timeout=20_000)

        # The late rank, named in words and on the heatmap.
        sentence = page.locator("#late-rank")
        assert sentence.get_attribute("data-rank") == "0"
        assert sentence.inner_text().startswith("Rank 0 is the late rank: it arrived last at 110 of 111")
        title = page.locator("#lateness .gtitle").text_content()
        assert "late rank: 0, last at 110 of 111" in title
        heat = page.evaluate(
            "() => { const t = document.getElementById('lateness').data[0]; return {z: t.z, x: t.x, y: t.y}; }"
        )
        assert heat["y"] == ["rank 0 (late)", "rank 1"]
        assert heat["x"] == [f"step {s['index']}" for s in report["ranks"][0]["steps"]]
        assert heat["z"] == [[s["lateness_ns"] / 1e6 for s in r["steps"]] for r in report["ranks"]]
        ticks = [page.locator("#lateness .yaxislayer-above .ytick").nth(i).text_content() for i in range(2)]
        assert sorted(ticks) == ["rank 0 (late)", "rank 1"]
        assert page.locator("#lateness .hm").count() == 1  # the heatmap layer was drawn

        # Wait vs transfer per rank, and the clock alignment: one row per rank, as the report says.
        rows = page.locator("#wait-transfer tr[data-rank]")
        assert rows.count() == 2
        for i, rank in enumerate(report["ranks"]):
            cells = [c.strip() for c in rows.nth(i).locator("td").all_inner_texts()]
            last = rank["metrics"]["last_arrivals"]
            assert cells[0] == str(rank["rank"]) and cells[4] == f"{last['count']} of {last['of']}"
            assert cells[1] == f"{rank['metrics']['nccl_wait_ns'] / 1e6:.2f} ms"
        clock = page.locator("#clock-alignment")
        assert clock.get_attribute("data-trusted") == "true"
        for i, row in enumerate(report["run"]["clock_alignment"]["ranks"]):
            cells = [c.strip() for c in clock.locator("tr[data-rank]").nth(i).locator("td").all_inner_texts()]
            assert cells[1] == row["base_source"] and cells[2] == str(row["base_ns"])
            assert cells[4] == f"{row['residual_ns'] / 1e3:.1f} µs"
        assert "trusted: every rank's residual is within 0.10 ms" in page.locator("#clock-method").inner_text()

        # Each step's GPU time: one stacked bar per (rank, step); the parts are the report's and add
        # up to the step's period (one GPU a rank).
        traces = page.evaluate(
            "() => document.getElementById('step-time').data.map(t => ({part: t.meta.part, x: t.x, y: t.y,"
            " colour: t.marker.color}))"
        )
        steps = [(r["rank"], s) for r in report["ranks"] for s in r["steps"]]
        labels = [f"r{rank} · {s['name']}" for rank, s in steps]
        assert [t["part"] for t in traces] == list(PARTS)  # every step split: no "comm (not split)" bar
        for trace in traces:
            assert trace["x"] == labels and trace["colour"] == PART_COLOUR[trace["part"]]
            assert trace["y"] == pytest.approx([s[trace["part"]] / 1e6 for _, s in steps])
        for k, (_, s) in enumerate(steps):
            assert sum(t["y"][k] for t in traces) == pytest.approx(s["period_ns"] / 1e6)
        assert page.locator("#step-time .barlayer .trace .point path").count() >= len(labels) * 4

        # The timeline lane: per rank, its matched kernels' waiting and transfer add up to the report's.
        split = page.evaluate(
            "(lane) => document.getElementById('timeline').data.filter(t => t.meta.lane === lane)"
            ".map(t => ({rank: t.meta.rank, kind: t.meta.kind, colour: t.line.color, x: t.x, y: t.y}))",
            WAIT_LANE,
        )
        assert {(t["rank"], t["kind"]) for t in split} == {(0, "wait"), (0, "transfer"), (1, "wait"), (1, "transfer")}
        for trace in split:
            assert trace["colour"] == (WAIT_COLOUR if trace["kind"] == "wait" else TRANSFER_COLOUR)
            assert {y for y in trace["y"] if y is not None} == {f"rank {trace['rank']} · {WAIT_LANE}"}
            xs = trace["x"]
            drawn = sum(xs[i + 1] - xs[i] for i in range(0, len(xs), 3)) * 1e6
            metrics = report["ranks"][trace["rank"]]["metrics"]
            expected = metrics["nccl_wait_ns"] if trace["kind"] == "wait" else metrics["nccl_transfer_ns"]
            assert drawn == pytest.approx(expected, rel=1e-6, abs=100)
        ticks = page.locator("#timeline .yaxislayer-above .ytick").all_text_contents()
        assert f"rank 0 · {WAIT_LANE}" in ticks and f"rank 1 · {WAIT_LANE}" in ticks
        assert "the ranks on one clock" in page.locator("#timeline .gtitle").text_content()
        assert "orange" in page.locator("#wait-lane-note").inner_text()

        # Zoom into step 1's last all-reduce: rank 1 waited (orange) for rank 0, both then transfer.
        wait = next(t for t in split if t["rank"] == 1 and t["kind"] == "wait")
        lo, hi = wait["x"][-3] - 0.2, wait["x"][-2] + 0.4
        page.evaluate(f"() => Plotly.relayout('timeline', {{'xaxis.range': [{lo}, {hi}]}})")
        page.wait_for_timeout(300)
        shot = tmp_path / "timeline-wait-transfer.png"
        page.locator("#timeline").screenshot(path=str(shot))
        page.locator("#who-waits").screenshot(path=str(tmp_path / "who-waits.png"))
        page.locator("#step-time").screenshot(path=str(tmp_path / "step-time.png"))
        assert problems == []
    finally:
        context.close()
    width, height = _png(shot)
    assert width >= 800 and height >= 300


def test_the_kineto_run_names_its_late_rank(browser, pages) -> None:  # noqa: F811
    report, path = pages["kineto"]
    assert report["run"]["late_rank"]["rank"] == 1
    context, page, problems = _open(browser, path)
    try:
        page.wait_for_selector("#lateness svg.main-svg", timeout=20_000)
        assert page.locator("#late-rank").get_attribute("data-rank") == "1"
        assert "late rank: 1" in page.locator("#lateness .gtitle").text_content()
        y = page.evaluate("() => document.getElementById('lateness').data[0].y")
        assert y == ["rank 0", "rank 1 (late)"]
        share = report["run"]["metrics"]["nccl_wait_share"]
        assert f"{share:.1%}" in page.locator("#wait-share").inner_text()
        assert problems == []
    finally:
        context.close()


def test_untrusted_clocks_say_so_and_draw_no_split(browser, pages) -> None:  # noqa: F811
    report, path = pages["untrusted"]
    clock = report["run"]["clock_alignment"]
    assert clock["trusted"] is False and clock["reason"]
    context, page, problems = _open(browser, path)
    try:
        page.wait_for_selector("#step-time svg.main-svg", timeout=20_000)
        page.wait_for_selector("#timeline svg.main-svg", timeout=20_000)
        assert page.locator("#clock-alignment").get_attribute("data-trusted") == "false"
        assert clock["reason"] in page.locator("#clock-method").inner_text()
        assert "no late rank" in page.locator("#late-rank").inner_text()
        assert page.locator("#lateness").count() == 0 and page.locator("#wait-transfer").count() == 0
        assert "not trusted" in page.locator("#wait-lane-note").inner_text()
        kinds = page.evaluate("() => document.getElementById('timeline').data.map(t => t.meta.kind)")
        assert "wait" not in kinds and "transfer" not in kinds
        assert "each rank on its capture's clock" in page.locator("#timeline .gtitle").text_content()
        # Each rank's own GPU time needs no other rank: the exposed comm is drawn whole, not split.
        parts = page.evaluate("() => document.getElementById('step-time').data.map(t => t.meta.part)")
        assert "comm_ns" in parts and "comm_wait_ns" not in parts
        assert problems == []
    finally:
        context.close()
