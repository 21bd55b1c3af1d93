"""The link counters in the HTML report, in real headless Chromium (the shared fixture of
test_html_chromium.py): under each rank's NCCL lanes the timeline has a PCIe % and an NVLink % row,
whose mean (area) and peak (line) have one point per bucket of ``timeline.ranks[].link_lane`` and
lie inside the row's band; per rank a table of the figures and a chart of each step's load; a
capture without GPU metrics shows the reason instead. The console stays clean.

Captures: 2×H200 with nsys GPU metrics (tests/fixtures/h200x2_links, SHM: PCIe busy during the
all-reduces, P2P: NVLink busy) and one without (tests/fixtures/h200/p2p_nsys). The lane's sample
count and peaks are checked against plain SQL on the exports (GPU_METRICS, the rank's own GPU,
inside the timeline's window), so the drawing rests on the capture, not only on the report.
"""

from __future__ import annotations

import itertools
import sqlite3
import statistics
import struct
from pathlib import Path

import pytest

from tests.conftest import OWN, REPO
from tests.report.test_html_chromium import browser  # noqa: F401 - the shared Chromium fixture
from traceguard.pipeline import analyze
from traceguard.report import html
from traceguard.report.fields import LINK_STEP_FIELDS
from traceguard.report.link_charts import BAND, LINK_KINDS

pytestmark = pytest.mark.slow

RUNS = {"shm": OWN / "h200x2_links" / "shm", "p2p": OWN / "h200x2_links" / "p2p", "plain": OWN / "h200" / "p2p_nsys"}
ROWS = {"pcie": "PCIe %", "nvlink": "NVLink %"}
_TRACES = (
    "() => document.getElementById('timeline').data.map(t => ({meta: t.meta, x: t.x, y: t.y,"
    " yaxis: t.yaxis || 'y', customdata: t.customdata || null}))"
)


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path]]:
    out = {}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        for name, run in RUNS.items():
            report = analyze([str(run)]).report
            path = tmp_path_factory.mktemp(f"links-{name}") / "report.html"
            path.write_text(html.render(report))
            out[name] = (report, path)
    return out


def _sql_lane(unpacked, report: dict, rank: int) -> tuple[int, float, float]:
    """From the rank's export: GPU metrics samples of its GPU inside the timeline's window, and their
    highest PCIe and NVLink load (per sample the busier direction; NVLink user data, requests +
    responses)."""
    path = REPO / next(r["input"] for r in report["ranks"] if r["rank"] == rank)
    timeline = next(t for t in report["timeline"]["ranks"] if t["rank"] == rank)
    lo, hi = timeline["origin_ns"], timeline["origin_ns"] + timeline["span_ns"]
    db = sqlite3.connect(f"file:{unpacked(path)}?mode=ro", uri=True)
    try:
        # One collector per GPU: each export holds its own GPU's samples only.
        assert len(db.execute("SELECT DISTINCT typeId FROM GPU_METRICS").fetchall()) == 1
        # A stamp starts the period its sample averages; the lane places each at the period's middle.
        stamps = [t for (t,) in db.execute("SELECT DISTINCT timestamp FROM GPU_METRICS ORDER BY timestamp")]
        period = statistics.median(b - a for a, b in itertools.pairwise(stamps))
        half = round(0.5e9 / round(1e9 / period, 1))
        return db.execute(
            """
            SELECT count(*), max(max(pcie_rx, pcie_tx)), max(max(nvlink_rx, nvlink_tx)) FROM (
              SELECT g.timestamp,
                sum(CASE WHEN m.metricName LIKE 'PCIe RX Throughput%' THEN g.value ELSE 0 END) AS pcie_rx,
                sum(CASE WHEN m.metricName LIKE 'PCIe TX Throughput%' THEN g.value ELSE 0 END) AS pcie_tx,
                sum(CASE WHEN m.metricName LIKE 'NVLink RX Re% User Data%' THEN g.value ELSE 0 END) AS nvlink_rx,
                sum(CASE WHEN m.metricName LIKE 'NVLink TX Re% User Data%' THEN g.value ELSE 0 END) AS nvlink_tx
              FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS m ON m.typeId = g.typeId AND m.metricId = g.metricId
              WHERE g.timestamp BETWEEN ? AND ? GROUP BY g.timestamp)
            """,
            (lo - half, hi - half),
        ).fetchone()
    finally:
        db.close()


def _watch(page) -> list[str]:
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return problems


@pytest.mark.parametrize("name", ["shm", "p2p"])
def test_link_lanes_and_charts_in_chromium(browser, pages, unpacked, name: str, tmp_path: Path) -> None:  # noqa: F811
    report, path = pages[name]
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    problems = _watch(page)
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_selector("#timeline svg.main-svg", timeout=15_000)
        traces = page.evaluate(_TRACES)
        ticks = page.locator("#timeline .yaxislayer-above .ytick").all_text_contents()
        rows = list(
            reversed(page.evaluate("() => document.getElementById('timeline')._fullLayout.yaxis.categoryarray"))
        )
        lanes = {t["rank"]: t for t in report["timeline"]["ranks"]}
        assert set(lanes) == {0, 1}
        for rank, timeline in lanes.items():
            lane = timeline["link_lane"]
            count, pcie_peak, nvlink_peak = _sql_lane(unpacked, report, rank)
            assert lane["samples"] == count and len(lane["start"]) == min(1500, count)
            assert max(lane["pcie_peak"]) == pytest.approx(pcie_peak)
            assert max(lane["nvlink_peak"]) == pytest.approx(nvlink_peak)
            # The rows sit right under the rank's last NCCL lane.
            last_nccl = max(i for i, lane_ in enumerate(timeline["lanes"]) if lane_["kind"] == "nccl")
            after = rows.index(f"rank {rank} · {timeline['lanes'][last_nccl]['name']}")
            assert rows[after + 1 : after + 3] == [f"rank {rank} · PCIe %", f"rank {rank} · NVLink %"]
            for key, label in ROWS.items():
                row = f"rank {rank} · {label}"
                assert row in ticks
                position = len(rows) - 1 - rows.index(row)
                mine = {
                    t["meta"]["kind"]: t for t in traces if t["meta"]["rank"] == rank and t["meta"]["lane"] == label
                }
                assert set(mine) == set(LINK_KINDS)
                for stat in ("avg", "peak"):
                    drawn = mine[f"link_{stat}"]
                    assert drawn["yaxis"] == "y2"
                    assert len(drawn["x"]) == len(drawn["y"]) == len(lane["start"])
                    assert drawn["customdata"] == lane[f"{key}_{stat}"]
                    ys = [y for y in drawn["y"] if y is not None]
                    assert all(position - BAND / 2 - 1e-9 <= y <= position + BAND / 2 + 1e-9 for y in ys)
                    assert max(ys) == pytest.approx(position - BAND / 2 + BAND * max(lane[f"{key}_{stat}"]) / 100)
                # The peak line is never below the mean.
                assert all(p >= a for a, p in zip(mine["link_avg"]["y"], mine["link_peak"]["y"], strict=True))
        # The numeric axis lies exactly over the categories.
        ranges = page.evaluate(
            "() => { const l = document.getElementById('timeline')._fullLayout;"
            " return [l.yaxis.range, l.yaxis2.range, l.yaxis2.overlaying]; }"
        )
        assert ranges[0] == ranges[1] == [-0.5, len(rows) - 0.5] and ranges[2] == "y"
        assert len(ticks) == len(rows)

        # Per rank: the figures' table, where NCCL's bytes went, and the per-step chart.
        note = page.locator("#link-lane-note").inner_text()
        assert "PCIe %" in note and "No rows" not in note
        for rank in report["ranks"]:
            r, links = rank["rank"], rank["links"]
            cells = page.locator(f"#links-stats-{r} tr").nth(2).locator("td").all_inner_texts()
            assert cells[:3] == ["PCIe", "NCCL kernels", str(links["samples"]["nccl"])]
            assert cells[5] == f"{links['over']['nccl']['pcie']['peak']:.1f} %"
            split = page.locator(f"#links-split-{r} tr").nth(2).locator("td").all_inner_texts()
            assert split == [
                "PCIe",
                f"{links['nccl_split']['pcie_share']:.1%}",
                f"{links['nccl_split']['pcie_ns'] / 1e6:.2f} ms",
            ]
            chart = page.evaluate(
                "(id) => document.getElementById(id).data.map(t => ({field: t.meta.field, x: t.x, y: t.y}))",
                f"links-rank-{r}",
            )
            assert {t["field"] for t in chart} == set(LINK_STEP_FIELDS)
            for t in chart:
                assert t["x"] == [s["name"] for s in rank["steps"]]
                assert t["y"] == [s[t["field"]] for s in rank["steps"]]
            assert page.locator(f"#links-rank-{r} .barlayer .trace .point path").count() == 4 * len(rank["steps"])
        # Where the bytes went, in the SHM and P2P captures' own terms.
        busy = "pcie_share" if name == "shm" else "nvlink_share"
        assert all(rank["links"]["nccl_split"][busy] > 0.5 for rank in report["ranks"])

        top = report["timeline"]["ranks"][0]["link_lane"]
        lo, hi = (top["start"][0] + 0) / 1e6, (top["end"][-1]) / 1e6
        page.evaluate(f"() => Plotly.relayout('timeline', {{'xaxis.range': [{lo}, {lo + (hi - lo) / 3}]}})")
        page.wait_for_timeout(300)
        shot = tmp_path / f"timeline-links-{name}.png"
        page.locator("#timeline").screenshot(path=str(shot))
        page.locator("#links").screenshot(path=str(tmp_path / f"links-{name}.png"))
        assert problems == []
    finally:
        context.close()
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24])[0] >= 800


def test_a_capture_without_gpu_metrics_shows_the_reason(browser, pages) -> None:  # noqa: F811
    report, path = pages["plain"]
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    problems = _watch(page)
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_selector("#timeline svg.main-svg", timeout=15_000)
        kinds = page.evaluate("() => document.getElementById('timeline').data.map(t => t.meta.kind)")
        assert not set(kinds) & set(LINK_KINDS)
        assert not any("PCIe %" in t for t in page.locator("#timeline .yaxislayer-above .ytick").all_text_contents())
        assert page.evaluate("() => document.getElementById('timeline')._fullLayout.yaxis2") is None
        note = page.locator("#link-lane-note").inner_text()
        for timeline in report["timeline"]["ranks"]:
            assert f"rank {timeline['rank']}: {timeline['link_lane']['null_reason']}" in note
        for rank in report["ranks"]:
            shown = page.locator(f"#links-null-{rank['rank']}").inner_text()
            assert shown == f"No link counters: {rank['links']['null_reason']}."
            assert page.locator(f"#links-rank-{rank['rank']}").count() == 0
        assert problems == []
    finally:
        context.close()
