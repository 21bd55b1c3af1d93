"""The service's web pages in real headless Chromium, against a real ``traceguard serve``.

A reader logs in with a token (the page answers with an HttpOnly session cookie), sees the runs
list, opens a run: the report loads without console errors, and Plotly draws the per-rank step
breakdown, the NCCL share and the transport matrix. Expected values come from the API's own JSON.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.report.test_html_chromium import browser  # noqa: F401 - the shared Chromium fixture
from tests.service.conftest import P2P, P2P_FILES, SHM, SHM_FILES
from tests.service.live import LiveServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, str, dict[int, dict]]]:
    server = LiveServer(tmp_path_factory.mktemp("web") / "data").start()
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=60)
    reports = {}
    for folder, names, labels in ((P2P, P2P_FILES, {"transport": "p2p"}), (SHM, SHM_FILES, {"transport": "shm"})):
        run_id = admin.post("/v1/runs", json={"labels": labels, "profile": "h200-nvlink"}).json()["id"]
        job = admin.post(
            f"/v1/runs/{run_id}/files", files=[("file", (n, (folder / n).read_bytes())) for n in names]
        ).json()["job"]
        for _ in range(600):
            if admin.get(job["url"]).json()["status"] in ("succeeded", "failed"):
                break
            import time

            time.sleep(0.2)
        reports[run_id] = admin.get(f"/v1/runs/{run_id}/report").json()
    reader = admin.post("/v1/tokens", json={"scopes": ["read"], "name": "browser"}).json()["token"]
    admin.close()
    yield server, reader, reports
    server.stop()


def _watch(page) -> list[str]:
    problems: list[str] = []
    page.on("console", lambda msg: problems.append(msg.text) if msg.type == "error" else None)
    page.on("pageerror", lambda exc: problems.append(str(exc)))
    return problems


def test_login_runs_list_and_run_report(browser, site) -> None:  # noqa: F811
    server, reader, reports = site
    context = browser.new_context()
    page = context.new_page()
    problems = _watch(page)

    page.goto(f"{server.url}/runs")
    assert page.url.startswith(f"{server.url}/login")  # not logged in: to the form
    page.fill("#token", "tg_not_a_token")
    page.click("#login button[type=submit]")
    assert "not valid" in page.inner_text("#login-error")
    problems.clear()  # the refused login answered 401, as it should; from here on, a clean console
    page.fill("#token", reader)
    page.click("#login button[type=submit]")
    page.wait_for_url(f"{server.url}/runs")

    cookie = next(c for c in context.cookies() if c["name"] == "tg_session")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
    assert "tg_session" not in page.evaluate("document.cookie")  # scripts cannot read it

    rows = page.locator("#runs tr[data-run]")
    assert rows.count() == len(reports)
    verdicts = {
        int(rows.nth(i).get_attribute("data-run")): rows.nth(i).locator(".status").inner_text()
        for i in range(rows.count())
    }
    assert verdicts == {run_id: doc["verdict"] for run_id, doc in reports.items()}

    shm_run = next(r for r, doc in reports.items() if doc["nccl"]["transports"] == ["SHM"])
    page.click(f"#runs tr[data-run='{shm_run}'] a")
    page.wait_for_selector("#transport-matrix .main-svg")
    doc = reports[shm_run]
    assert page.locator("#checks tr[data-check]").count() == len(doc["checks"])
    assert page.locator("#checks tr[data-check='transport_p2p'] .status").inner_text() == "fail"
    for chart in ("step-breakdown", "nccl-share", "transport-matrix"):
        assert page.locator(f"#{chart} .main-svg").count() >= 1, chart
    steps = sum(len(r["steps"]) for r in doc["ranks"])
    ticks = page.locator("#step-breakdown .xtick").count()
    assert ticks == steps
    matrix = page.locator("#transport-matrix").inner_text()
    assert "SHM" in matrix and "P2P" not in matrix
    assert page.locator("#run-header").inner_text().count("nsys-sqlite") == 2

    # Collectives by type: the chart, one table row per (rank, type) with the report's counts,
    # and the header's filter keeping one type (here the only one, AllReduce).
    page.wait_for_selector("#collectives-by-type .main-svg")
    totals = [(r["rank"], t) for r in doc["ranks"] for t in r["collectives_by_type"]["totals"]]
    rows = page.locator("#collectives-table tr[data-collective]")
    assert rows.count() == len(totals) == 2
    for i, (rank, row) in enumerate(totals):
        cells = rows.nth(i).locator("td")
        assert [cells.nth(k).inner_text() for k in range(3)] == [str(rank), row["collective"], str(row["count"])]
    page.click("#collective-filter a:text-is('AllReduce')")
    page.wait_for_selector("#collective-filter strong:text-is('AllReduce')")
    assert "AllReduce only" in page.locator("h2:has-text('Collectives by type')").inner_text()
    assert page.locator("#collectives-table tr[data-collective='AllReduce']").count() == 2

    p2p_run = next(r for r in reports if r != shm_run)
    page.fill("#compare-form input[name=base]", str(p2p_run))
    page.click("#compare-form button[type=submit]")
    page.wait_for_selector("#changed-checks")
    changed = page.locator("#changed-checks tr[data-check='transport_p2p'] .status")
    assert [changed.nth(i).inner_text() for i in range(changed.count())] == ["pass", "fail"]
    share = page.locator("#metric-deltas tr[data-metric='nccl_share_of_step'] td")
    metrics = {run_id: doc["run"]["metrics"] for run_id, doc in reports.items()}
    points = 100 * (metrics[shm_run]["nccl_share_of_step"] - metrics[p2p_run]["nccl_share_of_step"])
    assert share.nth(3).inner_text() == f"{points:+.1f} pp"  # a share: percentage points
    span = page.locator("#metric-deltas tr[data-metric='gpu_span_ns'] td").nth(3).inner_text()
    assert span == f"{100 * (metrics[shm_run]['gpu_span_ns'] / metrics[p2p_run]['gpu_span_ns'] - 1):+.1f} %"

    page.click("#nav button[type=submit]")  # log out
    page.wait_for_url(f"{server.url}/login")
    page.goto(f"{server.url}/runs/{shm_run}")
    assert page.url.startswith(f"{server.url}/login")
    assert problems == []
    context.close()


def test_other_project_sees_no_runs(browser, site, tmp_path: Path) -> None:  # noqa: F811
    server, _, reports = site
    admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"})
    # A token of another project, made the way an operator would: the CLI on the same store.
    import subprocess
    import sys

    from tests.service.live import REPO

    made = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceguard.cli",
            "token",
            "create",
            "--project",
            "elsewhere",
            "--data-dir",
            str(server.data_dir),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    admin.close()
    context = browser.new_context()
    page = context.new_page()
    page.goto(f"{server.url}/login")
    page.fill("#token", made.stdout.strip())
    page.click("#login button[type=submit]")
    page.wait_for_url(f"{server.url}/runs")
    assert page.locator("#runs tr[data-run]").count() == 0
    response = page.goto(f"{server.url}/runs/{next(iter(reports))}")
    assert response is not None and response.status == 404
    context.close()


def test_a_running_job_shows_its_progress(browser, tmp_path: Path) -> None:  # noqa: F811
    """A run whose analysis is under way shows how many of its files are analysed (the job's
    ``ranks_done`` of ``ranks_total``, as a worker records them), and the finished page once done."""
    server = LiveServer(tmp_path / "data", args=["--no-workers"]).start()  # the job waits: no worker runs it
    try:
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"})
        run_id = admin.post("/v1/runs", json={"labels": {}}).json()["id"]
        files = [("file", (n, (P2P / n).read_bytes())) for n in P2P_FILES[:2]]
        job = admin.post(f"/v1/runs/{run_id}/files", files=files).json()["job"]
        assert admin.get(job["url"]).json()["status"] == "queued"
        # What a worker writes while the map runs: the job is running, one of two files done.
        db = sqlite3.connect(tmp_path / "data" / "traceguard.db")
        with db:
            db.execute("UPDATE jobs SET status = 'running', ranks_done = 1, ranks_total = 2 WHERE id = ?", (job["id"],))
        db.close()
        state = admin.get(job["url"]).json()
        assert (state["ranks_done"], state["ranks_total"]) == (1, 2)
        reader = admin.post("/v1/tokens", json={"scopes": ["read"], "name": "browser"}).json()["token"]
        context = browser.new_context()
        page = context.new_page()
        problems = _watch(page)
        page.goto(f"{server.url}/login")
        page.fill("#token", reader)
        page.click("#login button[type=submit]")
        page.wait_for_url(f"{server.url}/runs")
        page.goto(f"{server.url}/runs/{run_id}")
        assert page.locator("#progress").inner_text() == "1 of 2 files analysed"
        assert page.locator("#job progress").get_attribute("value") == "1"
        assert page.locator("#job progress").get_attribute("max") == "2"
        assert problems == []
        context.close()
        admin.close()
    finally:
        server.stop()


def test_the_inspector_trend_of_a_run(browser, tmp_path: Path) -> None:  # noqa: F811
    """A run whose NCCL Inspector logs (the real ``--slow-rank 1:30`` run, its dump directory
    tarred) were sent to ``POST /v1/runs/{id}/inspector``: the page charts the stored windows, one
    point per window, with the late rank of each (rank 1, the slowed one) on the chart and in the
    table. Expected values from the report's JSON and the harness's ground truth."""
    import io
    import tarfile
    import time

    from tests.conftest import OWN

    slow = OWN / "h200x2_inspector" / "slow_default"
    tarred = io.BytesIO()
    with tarfile.open(fileobj=tarred, mode="w") as tar:
        for path in sorted((slow / "inspector").glob("*.log.gz")):
            tar.add(path, arcname=f"inspector/{path.name}")
    server = LiveServer(tmp_path / "data").start()
    try:
        admin = httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {server.admin_token}"}, timeout=60)
        run_id = admin.post("/v1/runs", json={"labels": {"job": "slow"}}).json()["id"]
        sent = admin.post(f"/v1/runs/{run_id}/inspector", files=[("file", ("inspector.tar", tarred.getvalue()))])
        assert sent.status_code == 202, sent.text
        for _ in range(600):
            if admin.get(sent.json()["job"]["url"]).json()["status"] in ("succeeded", "failed"):
                break
            time.sleep(0.2)
        report = admin.get(f"/v1/runs/{run_id}/report").json()
        windows = report["inspector"]["windows"]
        assert windows and all(w["late_rank"] == 1 for w in windows)  # the slowed rank
        reader = admin.post("/v1/tokens", json={"scopes": ["read"], "name": "browser"}).json()["token"]
        admin.close()

        context = browser.new_context()
        page = context.new_page()
        problems = _watch(page)
        page.goto(f"{server.url}/login")
        page.fill("#token", reader)
        page.click("#login button[type=submit]")
        page.wait_for_url(f"{server.url}/runs")
        page.goto(f"{server.url}/runs/{run_id}")
        page.wait_for_selector("#inspector-trend .main-svg")
        # One point per stored window: in the chart's data and drawn as markers.
        assert page.evaluate("document.getElementById('inspector-trend').data[0].x.length") == len(windows)
        drawn = page.locator("#inspector-trend .scatterlayer .trace").first.locator(".points path")
        assert drawn.count() == len(windows)
        shares = page.evaluate("document.getElementById('inspector-trend').data[0].y")
        assert shares == pytest.approx([100 * w["nccl_wait_share"] for w in windows])
        # The late rank per window: its trace's points and labels, and the table.
        assert page.evaluate("document.getElementById('inspector-trend').data[1].y") == [1] * len(windows)
        assert page.locator("#inspector-trend .textpoint").all_text_contents() == ["rank 1"] * len(windows)
        rows = page.locator("#inspector-trend-table tr[data-window]")
        assert rows.count() == len(windows)
        assert [int(rows.nth(i).get_attribute("data-window")) for i in range(rows.count())] == [
            w["window_start_s"] for w in windows
        ]
        assert page.locator("#inspector-trend-table td.late-rank").all_inner_texts() == ["1"] * len(windows)
        assert problems == []
        context.close()
    finally:
        server.stop()
