"""The HTML report in a real headless Chromium (Debian's ``chromium``, driven by Playwright).

What a reader sees: the page loads offline without script errors, Plotly draws both charts, the
step breakdown has one x category per (rank, step), and the checks table has one row per check.
Expected counts come from the report document and from the captures' NVTX step ranges (plain
``sqlite3``), not from the page.

Needs: ``pip install playwright`` (the Python package only; the browser is the system
``chromium``, never ``playwright install``). Without them the test skips, or fails when ``CI`` or
``TRACEGUARD_REQUIRE_BROWSER`` is set.
"""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import struct
from pathlib import Path

import pytest

from tests.conftest import OWN
from traceguard.checks.rules import format_value
from traceguard.pipeline import analyze
from traceguard.report import html

RUN = OWN / "h200" / "p2p_nsys"
CHROMIUM = os.environ.get("TRACEGUARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
STEP = re.compile(r"(?i)^(batch|step|iteration)[ _#]?\d+$")

pytestmark = pytest.mark.slow


def _need(what: str) -> None:
    message = f"the HTML browser test needs {what}"
    if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_BROWSER"):
        pytest.fail(message + " (CI / TRACEGUARD_REQUIRE_BROWSER is set, so this is an error)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def browser():
    if not (Path(CHROMIUM).is_file() and os.access(CHROMIUM, os.X_OK)) and not shutil.which(CHROMIUM):
        _need(f"Chromium at {CHROMIUM} (Debian: apt-get install chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("the Playwright Python package (pip install playwright; no `playwright install` needed)")
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield chromium
        finally:
            chromium.close()


def _steps_per_rank(unpacked) -> int:
    """Step ranges (DESIGN.md's default pattern) of all ranks, from the NVTX table by plain SQL."""
    total = 0
    for gz in sorted(RUN.glob("cap_*.sqlite.gz")):
        con = sqlite3.connect(f"file:{unpacked(gz)}?mode=ro", uri=True)
        names = [
            n
            for (n,) in con.execute(
                "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON e.textId = s.id "
                "WHERE e.end IS NOT NULL"
            )
        ]
        con.close()
        total += sum(1 for n in names if n and STEP.match(n))
    return total


@pytest.fixture(scope="module")
def report_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("html")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        report = analyze([str(RUN)], profile="h200-nvlink").report
    page = folder / "report.html"
    page.write_text(html.render(report))
    return report, page


def test_html_report_renders_in_chromium(browser, report_page, unpacked, tmp_path: Path) -> None:
    report, path = report_page
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    console_errors: list[str] = []
    page_errors: list[str] = []
    requests: list[str] = []
    page.on("console", lambda msg: console_errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: page_errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    try:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_selector("#step-breakdown svg.main-svg", timeout=15_000)
        page.wait_for_selector("#nccl-share svg.main-svg", timeout=15_000)

        assert console_errors == [] and page_errors == [], (console_errors, page_errors)
        # Self-contained: nothing but the file itself is fetched (plotly.js is embedded).
        assert [u for u in requests if not u.startswith("file:")] == []

        # One x category per (rank, step): the data Plotly holds and the ticks it drew.
        expected_steps = sum(len(r["steps"]) for r in report["ranks"])
        assert expected_steps == _steps_per_rank(unpacked) == 6
        categories = page.evaluate(
            "() => { const s = new Set(); for (const t of document.getElementById('step-breakdown').data)"
            " for (const x of t.x) s.add(x); return [...s]; }"
        )
        assert len(categories) == expected_steps
        assert sorted(categories) == sorted(f"r{r['rank']} · {s['name']}" for r in report["ranks"] for s in r["steps"])
        ticks = page.locator("#step-breakdown .xaxislayer-above .xtick").count()
        assert ticks == expected_steps
        bars = page.locator("#step-breakdown .barlayer .trace .point path").count()
        phases = {name for r in report["ranks"] for s in r["steps"] for name in s["phases"]}
        assert bars >= expected_steps if phases else bars == 0
        nccl_bars = page.locator("#nccl-share .barlayer .trace .point path").count()
        assert nccl_bars == sum(1 for r in report["ranks"] for s in r["steps"] if s["nccl_share"] is not None)

        # The checks table: one row per check, showing its status.
        rows = page.locator("#checks tr[data-check]")
        assert rows.count() == len(report["checks"])
        for i, check in enumerate(report["checks"]):
            row = rows.nth(i)
            assert row.get_attribute("data-check") == check["id"]
            assert row.locator("td").nth(0).inner_text().strip() == check["id"]
            assert row.locator(".status").inner_text().strip() == check["status"]
            # What the check judged, in words (capture_health read a bare "0": issue 25).
            assert row.locator("td").nth(2).inner_text().strip() == format_value(check["value"], check["unit"])
        health = page.locator("#checks tr[data-check='capture_health'] td").nth(2).inner_text().strip()
        assert health == "0 problems found"
        assert page.locator("h1 .verdict").inner_text().strip() == report["verdict"].upper()

        shot = tmp_path / "report.png"
        page.screenshot(path=str(shot), full_page=True)
    finally:
        context.close()
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])
    assert width >= 1000 and height >= 1000
    assert len(data) > 50_000  # charts and tables, not a blank page


def _p2p_kernels_by_device(db: Path) -> dict[int, tuple[int, int]]:
    """deviceId → (SendRecv kernels, Σ their durations in ns), by plain SQL."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT k.deviceId, COUNT(*), SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY k.deviceId"
    ).fetchall()
    con.close()
    return {device: (count, total) for device, count, total in rows}


@pytest.fixture(scope="module")
def mfu_page(tmp_path_factory: pytest.TempPathFactory, unpacked) -> tuple[dict, Path, Path]:
    """nsys-ai's 2-GPU capture (ncclSend/ncclRecv, SendRecv kernels) in window mode."""
    from tests.conftest import public_nsys

    db = unpacked(public_nsys("mfu_2gpu_before"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
        report = analyze([str(db)], step_sources=["window"]).report
    page = tmp_path_factory.mktemp("html-mfu") / "report.html"
    page.write_text(html.render(report))
    return report, page, db


def _open(browser, path: Path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000}, offline=True)
    page = context.new_page()
    errors: list[str] = []
    page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(path.as_uri(), wait_until="load")
    return context, page, errors


def test_collective_type_chart_and_peer_heatmap_render(browser, mfu_page) -> None:
    """The by-type chart holds each rank's SendRecv time and the heatmap each (rank, peer) cell,
    both equal to what plain SQL sums from the kernel table."""
    report, path, db = mfu_page
    expected = _p2p_kernels_by_device(db)
    assert sorted(expected) == [0, 1]  # ranks 0 and 1 are devices 0 and 1 (lowest device first)
    assert [r["peers"]["rows"][0]["kernels"] for r in report["ranks"]] == [expected[0][0], expected[1][0]]
    context, page, errors = _open(browser, path)
    try:
        page.wait_for_selector("#collectives-by-type svg.main-svg", timeout=15_000)
        page.wait_for_selector("#peer-matrix svg.main-svg", timeout=15_000)
        assert errors == []
        traces = page.evaluate(
            "() => document.getElementById('collectives-by-type').data.map(t => ({name: t.name, x: t.x, y: t.y}))"
        )
        sendrecv = next(t for t in traces if t["name"] == "SendRecv")
        assert sendrecv["x"] == ["rank 0", "rank 1"]
        assert sendrecv["y"] == pytest.approx([expected[0][1] / 1e6, expected[1][1] / 1e6])
        assert page.locator("#collectives-by-type .barlayer .trace .point path").count() == 2
        heat = page.evaluate(
            "() => { const t = document.getElementById('peer-matrix').data[0]; return [t.x, t.y, t.z] }"
        )
        assert heat[0] == ["peer 0", "peer 1"] and heat[1] == ["rank 0", "rank 1"]
        assert heat[2][0][0] is None and heat[2][1][1] is None
        assert heat[2][0][1] == pytest.approx(expected[0][1] / 1e6)
        assert heat[2][1][0] == pytest.approx(expected[1][1] / 1e6)
        rows = page.locator("#collectives-table tr[data-collective='SendRecv']")
        assert rows.count() == 2
        assert [rows.nth(i).locator("td").nth(2).inner_text() for i in range(2)] == [
            str(expected[0][0]),
            str(expected[1][0]),
        ]
        for rank in (0, 1):
            cells = page.locator(f"#peer-table tr[data-rank='{rank}'][data-peer='{1 - rank}'] td")
            assert cells.nth(2).inner_text() == str(expected[rank][0])
    finally:
        context.close()


def test_allreduce_run_draws_types_and_says_why_no_peers(browser, report_page) -> None:
    report, path = report_page
    context, page, errors = _open(browser, path)
    try:
        page.wait_for_selector("#collectives-by-type svg.main-svg", timeout=15_000)
        assert errors == []
        names = page.evaluate("() => document.getElementById('collectives-by-type').data.map(t => t.name)")
        assert "AllReduce" in names
        assert page.locator("#peer-matrix").count() == 0
        reason = page.locator("#peer-null-reason").inner_text()
        assert reason.endswith(report["run"]["peer_matrix"]["null_reason"])
    finally:
        context.close()


def test_payload_size_histogram_renders(browser, report_page) -> None:
    """The P2P run's one 2000 MB bucket a step: every call in the '≥ 256 MiB' band, as the report's
    size rows say, and the page explains the latency- and bandwidth-bound regimes."""
    report, path = report_page
    sized = sum(r["metrics"]["collective_calls_sized"] for r in report["ranks"])
    context, page, errors = _open(browser, path)
    try:
        page.wait_for_selector("#collective-sizes svg.main-svg", timeout=15_000)
        assert errors == []
        traces = page.evaluate(
            "() => document.getElementById('collective-sizes').data.map(t => ({name: t.name, x: t.x, y: t.y}))"
        )
        allreduce = next(t for t in traces if t["name"] == "AllReduce")
        assert sum(allreduce["y"]) == sized > 0
        assert allreduce["y"][allreduce["x"].index("≥ 256 MiB")] == sized
        assert "latency-bound" in page.locator("#size-regimes").inner_text()
    finally:
        context.close()
