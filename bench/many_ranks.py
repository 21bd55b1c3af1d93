#!/usr/bin/env python3
"""A run of many ranks on one machine's memory (issue 30): 64, 256 and 1,024 ranks in one run.

::

    python bench/make_run.py --ranks 64 --kernels-per-rank 5308 --out bench/work/small64      # 1 s, 0.08 GB
    python bench/make_run.py --ranks 256 --kernels-per-rank 5308 --out bench/work/small256    # 3 s, 0.34 GB
    python bench/make_run.py --ranks 1024 --kernels-per-rank 5308 --out bench/work/small1024  # 12 s, 1.34 GB
    python bench/make_run.py --ranks 64 --out bench/work/run64                                # 15 s, 1.7 GB
    python bench/many_ranks.py --run bench/work/small64 --run bench/work/small256 --run bench/work/small1024 \\
        --run bench/work/run64

Every rank file is one of the four real ranks of ``tests/fixtures/h200x4/p2p_nsys`` (a 4×H200 ViT-L/32
DDP job) made into a rank of a larger job by ``make_run.py`` (its environment, host and clock
rewritten per node); ``small*`` are the captures as they are (5,308 kernels per rank, small so that
1,024 of them fit the disk), ``run64`` each scaled to 159 k kernels (the scale-out shape of
``SCALE_OUT.md``). For each run, each case in a fresh process, the command
``traceguard analyze RUN --format json -o report.json``:

``summary, local``
    ``--detail summary``, the default above 32 files (a report by summary, its Parquet side output
    beside it), the map on the local process pool (all cores).
``summary, dask``
    the same on a ``dask.distributed`` cluster of ``--dask-workers`` single-thread workers on this
    machine (``scale_out.DaskCluster``, workers restarted before the case).
``full, local``
    ``--detail full``: every rank and step in the JSON report, the reduce holding every rank's rows
    (what a run of any size got before issue 30), for comparison.

Measured: wall and wall per rank; the **client**'s peak RSS (the ``traceguard analyze`` process
alone: the reduce, the checks and the report; the kernel's high-water mark of its own memory,
``VmHWM``, read as it exits, so not its pool's workers); the whole process tree's peak RSS
(sampled every 50 ms, ``scale_out.TreeSampler``); the JSON report's size, the side output's size
and rows; then, from the JSON report, the HTML report's size and time to render, and the time
for headless Chromium (Playwright, when installed) to load it and draw its charts (given up after
:data:`BROWSER_S`). Bounds of issue 30 at 1,024 ranks: client < 2 GB, JSON < 50 MB.

Writes ``bench/MANY_RANKS.md`` and ``bench/many_ranks.json``; reports under ``bench/work/many_ranks/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import orjson

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale_out  # noqa: E402  (a sibling script, not a package)

ROOT = HERE.parent
WORK = HERE / "work" / "many_ranks"
PYTHON = ROOT / ".venv" / "bin" / "python"
#: Issue 30's bounds for the 1,024-rank case: the client's peak RSS and the JSON report's size.
CLIENT_MB_MAX = 2000
JSON_MB_MAX = 50
#: Seconds Chromium is given to load a report page and draw its charts.
BROWSER_S = 120
#: A full report's HTML is rendered and loaded in Chromium only up to this many ranks (the 1,024-rank
#: full JSON is 177 MB: its page took minutes to render and would take a browser longer).
HTML_FULL_MAX_RANKS = 256
#: ``traceguard analyze`` that prints its own peak RSS (children excluded) on stderr as it exits: the
#: kernel's high-water mark of its memory (``VmHWM``), not ``getrusage``'s ``ru_maxrss``, which Linux
#: carries over ``exec`` from the forking process (this script, holding the last report it read).
CLIENT = (
    "import atexit, sys\n"
    "def hwm():\n"
    "    line = next(x for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n"
    "    sys.stderr.write(f'\\nclient_maxrss_kb {line.split()[1]}\\n')\n"
    "atexit.register(hwm)\n"
    "from traceguard.cli import run\n"
    "sys.argv[0] = 'traceguard'\n"
    "raise SystemExit(run(sys.argv[1:]))\n"
)
CASES = {
    "summary_local": ("summary, local", ["--scheduler", "local", "--detail", "summary"]),
    "summary_dask": ("summary, dask", ["--detail", "summary"]),
    "full_local": ("full, local", ["--scheduler", "local", "--detail", "full"]),
}
#: Renders the JSON report as HTML and loads it in headless Chromium: sizes and times as JSON.
HTML_CODE = """
import json, sys, time
from pathlib import Path
import orjson
from traceguard.report import html
report = orjson.loads(Path(sys.argv[1]).read_bytes())
t0 = time.perf_counter()
page = html.render(report)
render_s = time.perf_counter() - t0
out = Path(sys.argv[2]); out.write_text(page)
result = {"html_bytes": out.stat().st_size, "render_s": round(render_s, 3)}
try:
    from playwright.sync_api import sync_playwright
except ImportError:
    result["chromium"] = "playwright is not installed"
else:
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", headless=True,
                                     args=["--headless", "--no-sandbox", "--disable-gpu"])
        page_ = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors = []
        page_.on("pageerror", lambda exc: errors.append(str(exc)))
        t0 = time.perf_counter()
        limit_ms = float(sys.argv[3]) * 1000
        try:
            page_.goto(out.as_uri(), wait_until="load", timeout=limit_ms)
            drawn = "[...document.querySelectorAll('.js-plotly-plot')].every(d => d.querySelector('svg.main-svg'))"
            page_.wait_for_function("() => " + drawn, timeout=limit_ms)
        except Exception as exc:
            result["chromium"] = f"not drawn in {sys.argv[3]} s ({type(exc).__name__})"
        else:
            result["chromium_load_s"] = round(time.perf_counter() - t0, 3)
            result["charts"] = page_.evaluate("() => document.querySelectorAll('.js-plotly-plot').length")
            result["heatmaps"] = page_.evaluate("() => document.querySelectorAll('[id^=heatmap-]').length")
        result["page_errors"] = errors
        browser.close()
print(json.dumps(result))
"""


def _folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_case(run: Path, case: str, rep: int, cluster: scale_out.DaskCluster | None, interval: float) -> dict:
    work = WORK / run.name / case / f"rep{rep}"
    work.mkdir(parents=True, exist_ok=True)
    report = work / "report.json"
    for stale in (report, work / "report.json.detail"):
        if stale.is_dir():
            import shutil

            shutil.rmtree(stale)
        elif stale.exists():
            stale.unlink()
    scale_out.warm([p for p, _ in scale_out._rank_files(run)])
    extra = CASES[case][1]
    roots: list[int] = []
    if case == "summary_dask":
        assert cluster is not None
        cluster.restart()
        extra = ["--scheduler", cluster.address, *extra]
        roots = cluster.pids
    cmd = [str(PYTHON), "-c", CLIENT, "analyze", str(run), *extra, "--format", "json", "-o", str(report)]
    res = scale_out.run_measured(cmd, work / "analyze", extra_roots=roots, interval=interval)
    err = (work / "analyze.err").read_text(errors="replace")
    kb = [int(line.split()[1]) for line in err.splitlines() if line.startswith("client_maxrss_kb ")]
    res["client_peak_mb"] = round(kb[-1] * 1024 / 1e6, 1) if kb else None
    if res["rc"] != 0:
        return res
    res["json_bytes"] = report.stat().st_size
    doc = orjson.loads(report.read_bytes())
    detail = doc.get("detail") or {}
    res["detail_mode"] = detail.get("mode")
    res["ranks_in_report"] = len(doc["ranks"])
    res["ranks"] = (doc.get("rank_summary") or {}).get("ranks", len(doc["ranks"]))
    if detail.get("folder"):
        res["parquet_bytes"] = _folder_bytes(Path(detail["folder"]))
        res["parquet_rows"] = {name: info["rows"] for name, info in detail["tables"].items()}
    del doc  # a full report of 1,024 ranks is 177 MB of JSON: not kept in this process while the next case runs
    if res["ranks"] > HTML_FULL_MAX_RANKS and res["detail_mode"] == "full":
        res["html"] = {"error": f"not drawn: a full report of {res['ranks']} ranks"}
        return res
    page = subprocess.run(
        [str(PYTHON), "-c", HTML_CODE, str(report), str(work / "report.html"), str(BROWSER_S)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    res["html"] = (
        json.loads(page.stdout.strip().splitlines()[-1]) if page.returncode == 0 else {"error": page.stderr[-500:]}
    )
    return res


def service_case(run: Path, interval: float) -> dict:
    """The run through a real ``traceguard serve`` on embedded SQLite (``tests/service/live.py``):
    the rank files and manifest as one tar uploaded as a raw body, analysed by the server's worker,
    every rank's rows stored from the side output; then the stored report (JSON and the run page's
    HTML), every page of ``/steps`` (1,000 rows a page) and of ``/links`` (256 ranks a page), timed,
    and the server's process tree's peak RSS over it all."""
    import tarfile

    import httpx

    sys.path.insert(0, str(ROOT))
    from tests.service.live import LiveServer

    work = WORK / run.name / "service"
    if work.exists():
        import shutil

        shutil.rmtree(work)
    work.mkdir(parents=True)
    archive = work / f"{run.name}.tar"
    manifest = json.loads((run / "manifest.json").read_text())
    with tarfile.open(archive, "w") as tar:
        for capture in manifest["captures"]:
            tar.add(run / capture["path"], arcname=f"{run.name}/{capture['path']}")
        tar.add(run / "manifest.json", arcname=f"{run.name}/manifest.json")
    server = LiveServer(work / "data").start()
    assert server.process is not None
    sampler = scale_out.TreeSampler([server.process.pid], interval).start()
    out: dict = {"archive_bytes": archive.stat().st_size}
    try:
        headers = {"Authorization": f"Bearer {server.admin_token}"}
        with httpx.Client(base_url=server.url, headers=headers, timeout=600) as client:
            run_id = client.post("/v1/runs", json={"name": run.name, "labels": {}, "profile": "production"}).json()[
                "id"
            ]
            t0 = time.perf_counter()
            with archive.open("rb") as body:
                response = client.post(f"/v1/runs/{run_id}/files", params={"name": archive.name}, content=body)
            out["upload_s"] = round(time.perf_counter() - t0, 2)
            if response.status_code != 202:
                out["error"] = f"upload {response.status_code}: {response.text[:300]}"
                return out
            job_url = response.json()["job"]["url"]
            t0 = time.perf_counter()
            while (job := client.get(job_url).json())["status"] not in ("succeeded", "failed"):
                time.sleep(0.5)
            out["analysis_s"] = round(time.perf_counter() - t0, 1)
            out["job"] = {k: job.get(k) for k in ("status", "error_code", "error_message", "ranks_done", "ranks_total")}
            t0 = time.perf_counter()
            report = client.get(f"/v1/runs/{run_id}/report")
            out["report_json_s"], out["report_json_bytes"] = round(time.perf_counter() - t0, 3), len(report.content)
            t0 = time.perf_counter()
            page = client.get(f"/v1/runs/{run_id}/report", params={"format": "html"})
            out["run_page_s"], out["run_page_bytes"] = round(time.perf_counter() - t0, 3), len(page.content)
            rows = pages = 0
            t0 = time.perf_counter()
            while True:
                got = client.get(f"/v1/runs/{run_id}/steps", params={"limit": 1000, "offset": rows}).json()["steps"]
                rows, pages = rows + len(got), pages + 1
                if len(got) < 1000:
                    break
            out["steps"] = {"rows": rows, "pages": pages, "s": round(time.perf_counter() - t0, 3)}
            ranks, start, link_pages, t0 = 0, 0, 0, time.perf_counter()
            while start is not None:
                got = client.get(f"/v1/runs/{run_id}/links", params={"from_rank": start, "ranks": 256}).json()
                ranks, link_pages, start = ranks + len(got["waits"]), link_pages + 1, got["next_from_rank"]
            out["links"] = {"ranks": ranks, "pages": link_pages, "s": round(time.perf_counter() - t0, 3)}
        db = work / "data" / "traceguard.db"
        out["database_bytes"] = db.stat().st_size if db.exists() else None
    finally:
        sampler.stop()
        server.stop()
        archive.unlink(missing_ok=True)
    out["server_tree_peak_mb"] = round(sampler.tree_peak / 1e6, 1)
    out["server_process_peak_mb"] = round(sampler.process_peak / 1e6, 1)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, action="append", default=[], help="run directory from make_run.py")
    parser.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--md", type=Path, default=HERE / "MANY_RANKS.md")
    parser.add_argument("--json", type=Path, default=HERE / "many_ranks.json")
    parser.add_argument(
        "--service", type=Path, action="append", default=[], help="run directory sent through the service"
    )
    parser.add_argument(
        "--rewrite", action="store_true", help="only recompute the arithmetic and rewrite --md from --json"
    )
    args = parser.parse_args(argv)
    if args.rewrite:
        doc = json.loads(args.json.read_text())
        doc["growth"], doc["paper"] = growth(doc), {}
        doc["paper"] = paper(doc)
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
        write_markdown(doc, args.md)
        return
    if not args.run:
        parser.error("give at least one --run (or --rewrite)")
    runs = [r.resolve() for r in args.run]
    cluster = scale_out.DaskCluster(args.dask_workers, WORK / "dask").start() if "summary_dask" in args.cases else None
    results: dict[str, dict[str, list[dict]]] = {}
    try:
        for rep in range(args.repeat):
            for run in runs:
                for case in args.cases:
                    res = run_case(run, case, rep, cluster, args.poll_ms / 1000)
                    results.setdefault(run.name, {}).setdefault(case, []).append(res)
                    print(
                        f"rep {rep} {run.name} {case}: rc {res['rc']}, wall {res['wall_s']:.1f} s, client "
                        f"{res.get('client_peak_mb')} MB, tree {res['tree_peak_mb']:.0f} MB, "
                        f"json {res.get('json_bytes', 0) / 1e6:.2f} MB, load {res['loadavg_1m_before']:.2f}",
                        flush=True,
                    )
    finally:
        if cluster:
            cluster.stop()
    service = {}
    for run in (r.resolve() for r in args.service):
        service[run.name] = {"dir": scale_out._shown(run), **service_case(run, args.poll_ms / 1000)}
        print(f"service {run.name}: {service[run.name]}", flush=True)
    doc = {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "machine": scale_out.machine_facts(True),
        "dask_workers": args.dask_workers,
        "bounds": {"client_mb_max": CLIENT_MB_MAX, "json_mb_max": JSON_MB_MAX, "at_ranks": 1024},
        "runs": [
            {"dir": scale_out._shown(run), "manifest": scale_out._manifest_summary(run), "cases": results[run.name]}
            for run in runs
        ],
        "service": service,
    }
    doc["growth"] = growth(doc)
    doc["paper"] = paper(doc)
    args.json.write_text(json.dumps(doc, indent=2) + "\n")
    write_markdown(doc, args.md)
    print(f"wrote {args.md} and {args.json}")


def _best(reps: list[dict], key: str, pick=min) -> float | None:
    values = [r[key] for r in reps if r.get("rc") == 0 and r.get(key) is not None]
    return pick(values) if values else None


def growth(doc: dict) -> dict:
    """Per case, what one more rank costs the client and the JSON report: the slope between the
    smallest and the largest rank count of the runs with the same kernels per rank."""
    by_shape: dict[int, list[tuple[int, dict]]] = {}
    for run in doc["runs"]:
        per_rank = run["manifest"]["kernels_total"] // run["manifest"]["ranks"]
        by_shape.setdefault(per_rank, []).append((run["manifest"]["ranks"], run))
    out: dict[str, dict] = {}
    for per_rank, runs in by_shape.items():
        runs.sort(key=lambda x: x[0])
        if len(runs) < 2:
            continue
        (n0, low), (n1, high) = runs[0], runs[-1]
        for case in CASES:
            lo, hi = low["cases"].get(case), high["cases"].get(case)
            if not lo or not hi:
                continue
            c0, c1 = _best(lo, "client_peak_mb", max), _best(hi, "client_peak_mb", max)
            j0, j1 = _best(lo, "json_bytes", max), _best(hi, "json_bytes", max)
            if None in (c0, c1, j0, j1):
                continue
            out[f"{per_rank}:{case}"] = {
                "kernels_per_rank": per_rank,
                "case": case,
                "ranks": [n0, n1],
                "client_mb_per_rank": round((c1 - c0) / (n1 - n0), 4),
                "json_kb_per_rank": round((j1 - j0) / (n1 - n0) / 1e3, 3),
            }
    return out


#: The on-paper run of docs/scale-out.md: this many ranks of these rank file sizes, at the bytes per
#: kernel of these exports (``scale_out.py``'s arithmetic, redone with the report by summary).
PAPER_RANKS = 1024
PAPER_RANK_BYTES = (0.2e9, 1e9, 5e9)
BYTES_PER_KERNEL = 176
#: These captures' steps: 3 per 5,308 kernels. A summary's bytes per rank grow with its steps only
#: through the heat maps' columns, binned to MATRIX_COLUMNS (400) step indices: past the kernels that
#: hold 400 steps, a rank adds no more to the report.
STEPS_PER_KERNEL = 3 / 5308
MATRIX_COLUMNS = 400
HEATMAP_CAP_KERNELS = MATRIX_COLUMNS / STEPS_PER_KERNEL


def _line(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted by x); beyond the ends, the end segment's slope."""
    if len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x <= x1 or (x1, y1) == points[-1]:
            return y0 + (x - x0) * (y1 - y0) / (x1 - x0)
    return points[-1][1]


def paper(doc: dict) -> dict:
    """The client's memory and the JSON report of 1,024 ranks of 0.2–5 GB by summary: the fixed
    client (the intercept of the smallest shape's line) plus 1,024 × the per-rank cost, linear in the
    kernels per rank through the measured shapes (``growth``, case ``summary, local``). Beside them,
    what ``scale_out.json``'s arithmetic gave before (every rank's rows in the client and the report)."""
    shapes = sorted((g["kernels_per_rank"], g) for g in doc["growth"].values() if g["case"] == "summary_local")
    if not shapes:
        return {}
    smallest = shapes[0][1]
    run = next(
        r
        for r in doc["runs"]
        if r["manifest"]["ranks"] == smallest["ranks"][0]
        and r["manifest"]["kernels_total"] // r["manifest"]["ranks"] == smallest["kernels_per_rank"]
    )
    client0 = _best(run["cases"]["summary_local"], "client_peak_mb", max)
    json0 = _best(run["cases"]["summary_local"], "json_bytes", max)
    fixed_mb = client0 - smallest["ranks"][0] * smallest["client_mb_per_rank"]
    fixed_json_kb = json0 / 1e3 - smallest["ranks"][0] * smallest["json_kb_per_rank"]
    client_points = [(k, g["client_mb_per_rank"]) for k, g in shapes]
    json_points = [(k, g["json_kb_per_rank"]) for k, g in shapes]
    before: dict[float, dict] = {}
    old = HERE / "scale_out.json"
    if old.is_file():
        for row in json.loads(old.read_text()).get("paper", {}).get("rows", []):
            before[row["rank_bytes"]] = row
    rows = []
    for size in PAPER_RANK_BYTES:
        kernels = size / BYTES_PER_KERNEL
        rows.append(
            {
                "rank_bytes": size,
                "kernels_per_rank": round(kernels),
                "client_mb": round(fixed_mb + PAPER_RANKS * max(0.0, _line(client_points, kernels))),
                "json_mb": round(
                    (fixed_json_kb + PAPER_RANKS * max(0.0, _line(json_points, min(kernels, HEATMAP_CAP_KERNELS))))
                    / 1e3,
                    1,
                ),
                "before_client_mb": (before.get(size) or {}).get("client_mb"),
                "before_json_mb": (before.get(size) or {}).get("report_mb"),
            }
        )
    return {
        "ranks": PAPER_RANKS,
        "bytes_per_kernel": BYTES_PER_KERNEL,
        "fixed_client_mb": round(fixed_mb, 1),
        "fixed_json_kb": round(fixed_json_kb, 1),
        "client_points": client_points,
        "json_points": json_points,
        "rows": rows,
    }


def _mb(value: float | None, digits: int = 1) -> str:
    return "—" if value is None else f"{value / 1e6:,.{digits}f}"


def write_markdown(doc: dict, path: Path) -> None:
    facts = doc["machine"]
    lines = [
        "# Many ranks: the reduce, the report and the store bounded in the rank count (issue 30)",
        "",
        "Generated by `bench/many_ranks.py` (see its docstring and `docs/scale-out.md`); do not edit by hand.",
        "",
        f"- Date (UTC): {doc['date']}; {facts['nproc']} CPUs ({facts['cpu_model']}), {facts['ram_gb']} GB RAM",
        f"- traceguard {facts['traceguard']} (git {facts['git_commit']}"
        + (", traceguard/ modified" if facts["traceguard_sources_dirty"] else "")
        + f"); Python {facts['python']}, polars {facts['polars']}, dask {facts['dask']}, "
        f"distributed {facts['distributed']}",
        f"- Bounds at 1,024 ranks: client peak RSS < {CLIENT_MB_MAX:,} MB, JSON report < {JSON_MB_MAX} MB.",
        "- Client: the `traceguard analyze` process alone (the reduce, checks and report; its own peak RSS, "
        "the kernel's `VmHWM` read as it exits, its pool's workers not included). Tree: every process of the case "
        "at once (sampled every 50 ms), Dask's scheduler and workers included.",
        "",
        "| run | ranks × kernels | case | wall s | wall per rank ms | client MB | tree MB | JSON MB | "
        "ranks kept whole | side output MB | HTML MB | render s | Chromium load s | bounds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in doc["runs"]:
        m = run["manifest"]
        shape = f"{m['ranks']:,} × {m['kernels_total'] // m['ranks']:,}"
        for case, reps in run["cases"].items():
            ok = [r for r in reps if r.get("rc") == 0]
            if not ok:
                lines.append(f"| `{run['dir']}` | {shape} | {CASES[case][0]} | failed | | | | | | | | | | |")
                continue
            wall = min(r["wall_s"] for r in ok)
            client = max(r["client_peak_mb"] or 0 for r in ok)
            tree = max(r["tree_peak_mb"] for r in ok)
            json_bytes = max(r["json_bytes"] for r in ok)
            last = ok[-1]
            html = last.get("html") or {}
            bound = ""
            if m["ranks"] >= 1024 and case.startswith("summary"):
                good = client < CLIENT_MB_MAX and json_bytes / 1e6 < JSON_MB_MAX
                bound = "**PASS**" if good else "**FAIL**"
            kept = f"{last['ranks_in_report']} of {last['ranks']:,}"
            browser = html.get("chromium_load_s", html.get("chromium", html.get("error", "—")))
            lines.append(
                f"| `{run['dir']}` | {shape} | {CASES[case][0]} | {wall:.1f} | {wall / m['ranks'] * 1e3:.0f} | "
                f"{client:,.0f} | {tree:,.0f} | {_mb(json_bytes, 2)} | {kept} | {_mb(last.get('parquet_bytes'), 2)} | "
                f"{_mb(html.get('html_bytes'), 1)} | {html.get('render_s', '—')} | {browser} | {bound} |"
            )
    if doc["growth"]:
        lines += [
            "",
            "What one more rank costs (slope between the fewest and the most ranks of one rank shape):",
            "",
            "| kernels per rank | case | ranks | client MB per rank | JSON kB per rank |",
            "|---|---|---|---|---|",
        ]
        for g in doc["growth"].values():
            lines.append(
                f"| {g['kernels_per_rank']:,} | {CASES[g['case']][0]} | {g['ranks'][0]:,} → {g['ranks'][1]:,} | "
                f"{g['client_mb_per_rank']:.3f} | {g['json_kb_per_rank']:.2f} |"
            )
    for svc in (doc.get("service") or {}).values():
        if "error" in svc:
            lines += ["", f"Through the service, `{svc['dir']}`: {svc['error']}"]
            continue
        lines += [
            "",
            f"Through the service (`traceguard serve`, embedded SQLite, its own worker), `{svc['dir']}` as one "
            f"{svc['archive_bytes'] / 1e9:.2f} GB tar: upload {svc['upload_s']} s; analysed and stored in "
            f"{svc['analysis_s']} s (job {svc['job']['status']}, {svc['job']['ranks_done']} of "
            f"{svc['job']['ranks_total']} captures); the stored report {svc['report_json_bytes'] / 1e6:.2f} MB "
            f"of JSON in {svc['report_json_s']} s, the run page {svc['run_page_bytes'] / 1e6:.1f} MB of HTML in "
            f"{svc['run_page_s']} s; every step ({svc['steps']['rows']:,} rows) in {svc['steps']['pages']} pages "
            f"in {svc['steps']['s']} s; every rank's links ({svc['links']['ranks']:,} ranks) in "
            f"{svc['links']['pages']} pages in {svc['links']['s']} s; the server's process tree peaked at "
            f"{svc['server_tree_peak_mb']:,.0f} MB (its largest process {svc['server_process_peak_mb']:,.0f} MB); "
            f"database {_mb(svc['database_bytes'])} MB.",
        ]
    pp = doc.get("paper") or {}
    if pp.get("rows"):
        shapes = ", ".join(f"{k:,.0f} kernels → {v:.3f} MB" for k, v in pp["client_points"])
        reports = ", ".join(f"{k:,.0f} kernels → {v:.2f} kB" for k, v in pp["json_points"])
        lines += [
            "",
            f'On paper, {pp["ranks"]:,} ranks by summary (`docs/scale-out.md`, "On paper"): the client\'s fixed '
            f"{pp['fixed_client_mb']:,.0f} MB + {pp['ranks']:,} × its cost per rank, linear in the kernels per rank "
            f"through the measured shapes ({shapes}); the JSON report's fixed {pp['fixed_json_kb']:,.0f} kB + "
            f"{pp['ranks']:,} × its bytes per rank ({reports}; no more past {HEATMAP_CAP_KERNELS / 1e6:.2f} M kernels, "
            f"where a rank holds the heat maps' {MATRIX_COLUMNS} step columns). Kernels per rank = rank file ÷ "
            f"{pp['bytes_per_kernel']} bytes. Before: `scale_out.json`'s arithmetic, every rank's rows in the "
            "client and the report.",
            "",
            "| rank file | kernels per rank | client MB | before | JSON report MB | before |",
            "|---|---|---|---|---|---|",
        ]
        for row in pp["rows"]:
            lines.append(
                f"| {row['rank_bytes'] / 1e9:g} GB | {row['kernels_per_rank'] / 1e6:.2f} M | {row['client_mb']:,} | "
                f"{'—' if row['before_client_mb'] is None else format(row['before_client_mb'], ',')} | "
                f"{row['json_mb']:,} | {'—' if row['before_json_mb'] is None else format(row['before_json_mb'], ',')} |"
            )
    lines += [
        "",
        "Load: on 2 shared CPUs a 1-minute load average above ~0.5 before a command means other processes "
        "competed with it (`many_ranks.json` has every command's figures, load included).",
        "",
    ]
    path.write_text("\n".join(lines))


if __name__ == "__main__":
    os.environ.pop("TRACEGUARD_DASK_SCHEDULER", None)
    main()
