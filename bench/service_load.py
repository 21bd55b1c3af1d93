"""Bounded load test of the service on loopback, then a SIGKILL-and-restart check.

For each store (embedded SQLite, and PostgreSQL when reachable) a real ``traceguard serve``:

1. ``--runs`` runs are created and their real H200 captures (2 nsys exports + 2 NCCL logs + dmon,
   ~0.9 MB) uploaded by ``--concurrency`` clients at once, while as many clients query step
   breakdowns of already analysed runs; every analysis must succeed.
2. The server is killed with SIGKILL while analyses are running, restarted, and every job must
   finish and every file must still hash to its sha256.

Writes bench/SERVICE.md and bench/service_results.json. Usage::

    .venv/bin/python bench/service_load.py [--runs 24] [--concurrency 8]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.service.live import LiveServer  # noqa: E402

P2P = REPO / "tests" / "fixtures" / "h200" / "p2p_nsys"
FILES = ["cap_0.sqlite.gz", "cap_1.sqlite.gz", "nccl.vm.1734.log", "nccl.vm.1737.log", "dmon.txt"]
PG = os.environ.get("TRACEGUARD_TEST_PG", "postgresql://postgres@127.0.0.1:5432")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def _load(server: LiveServer, runs: int, concurrency: int) -> dict[str, Any]:
    payload = {name: (P2P / name).read_bytes() for name in FILES}
    size = sum(len(v) for v in payload.values())
    headers = {"Authorization": f"Bearer {server.admin_token}"}
    upload_s: list[float] = []
    query_s: list[float] = []
    errors: list[str] = []
    analysed: list[int] = []
    jobs: dict[int, str] = {}
    async with httpx.AsyncClient(base_url=server.url, headers=headers, timeout=120) as client:
        queue: asyncio.Queue[int] = asyncio.Queue()
        for i in range(runs):
            queue.put_nowait(i)
        uploading = True

        async def uploader() -> None:
            while not queue.empty():
                i = queue.get_nowait()
                started = time.perf_counter()
                run = (await client.post("/v1/runs", json={"name": f"load{i}", "labels": {"bench": "load"}})).json()
                files = [("file", (n, data)) for n, data in payload.items()]
                response = await client.post(f"/v1/runs/{run['id']}/files", files=files)
                upload_s.append(time.perf_counter() - started)
                if response.status_code != 202:
                    errors.append(f"upload {response.status_code}: {response.text[:200]}")
                    continue
                jobs[run["id"]] = response.json()["job"]["url"]

        finished = asyncio.Event()

        async def querier() -> None:
            while not finished.is_set():
                if not analysed:
                    await asyncio.sleep(0.05)
                    continue
                run_id = analysed[len(query_s) % len(analysed)]
                started = time.perf_counter()
                response = await client.get(f"/v1/runs/{run_id}/steps", params={"phase": "backward"})
                query_s.append(time.perf_counter() - started)
                if response.status_code != 200 or not response.json()["steps"]:
                    errors.append(f"steps {response.status_code}: {response.text[:200]}")

        async def watcher() -> None:
            while uploading or len(analysed) < len(jobs):
                for run_id, url in list(jobs.items()):
                    if run_id in analysed:
                        continue
                    job = (await client.get(url)).json()
                    if job["status"] == "succeeded":
                        analysed.append(run_id)
                    elif job["status"] == "failed":
                        errors.append(f"job {url}: {job['error']}")
                        analysed.append(run_id)
                await asyncio.sleep(0.2)

        wall = time.perf_counter()
        queriers = [asyncio.create_task(querier()) for _ in range(concurrency)]
        watch = asyncio.create_task(watcher())
        await asyncio.gather(*(uploader() for _ in range(concurrency)))
        uploads_done = time.perf_counter() - wall
        uploading = False
        await watch
        all_done = time.perf_counter() - wall
        finished.set()
        await asyncio.gather(*queriers)
        busy_queries = list(query_s)
        # The same queries with the analyses finished: the steady state of a results service.
        query_s.clear()
        idle_started = time.perf_counter()

        async def idle_querier(count: int) -> None:
            for k in range(count):
                run_id = analysed[k % len(analysed)]
                started = time.perf_counter()
                response = await client.get(f"/v1/runs/{run_id}/steps", params={"phase": "backward"})
                query_s.append(time.perf_counter() - started)
                if response.status_code != 200:
                    errors.append(f"steps {response.status_code}")

        await asyncio.gather(*(idle_querier(50) for _ in range(concurrency)))
        idle_s = time.perf_counter() - idle_started
    return {
        "runs": runs,
        "concurrency": concurrency,
        "bytes_per_run": size,
        "upload_p50_s": statistics.median(upload_s),
        "upload_p95_s": pct(upload_s, 0.95),
        "upload_max_s": max(upload_s),
        "upload_mb_per_s": runs * size / uploads_done / 1e6,
        "analyses_per_min": len(analysed) / all_done * 60,
        "all_analysed_s": all_done,
        "step_queries_during_analysis": len(busy_queries),
        "step_query_busy_p50_ms": statistics.median(busy_queries) * 1e3,
        "step_query_busy_p95_ms": pct(busy_queries, 0.95) * 1e3,
        "step_queries_idle": len(query_s),
        "step_query_idle_p50_ms": statistics.median(query_s) * 1e3,
        "step_query_idle_p95_ms": pct(query_s, 0.95) * 1e3,
        "step_queries_idle_per_s": len(query_s) / idle_s,
        "errors": errors,
    }


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _kill_restart(data: Path, url: str | None) -> dict[str, Any]:
    env = {"TRACEGUARD_JOB_LEASE_S": "3"}
    first = LiveServer(data, url, env=env).start()
    headers = {"Authorization": f"Bearer {first.admin_token}"}
    runs = []
    with httpx.Client(base_url=first.url, headers=headers, timeout=60) as client:
        for i in range(6):
            run_id = client.post("/v1/runs", json={"name": f"crash{i}"}).json()["id"]
            files = [("file", (n, (P2P / n).read_bytes())) for n in FILES]
            client.post(f"/v1/runs/{run_id}/files", files=files).raise_for_status()
            runs.append(run_id)
        while not any(client.get(f"/v1/runs/{r}").json()["status"] == "running" for r in runs):
            time.sleep(0.05)
        states = [client.get(f"/v1/runs/{r}").json()["status"] for r in runs]
    first.kill()
    killed_at = time.perf_counter()
    second = LiveServer(data, url, env=env).start()
    try:
        with httpx.Client(base_url=second.url, headers=headers, timeout=60) as client:
            while True:
                details = [client.get(f"/v1/runs/{r}").json() for r in runs]
                if all(d["status"] in ("analysed", "failed") for d in details):
                    break
                time.sleep(0.2)
        recovered_s = time.perf_counter() - killed_at
    finally:
        second.stop()
    files_ok = all(
        _sha(data / "blobs" / f["sha256"][:2] / f["sha256"]) == f["sha256"] for d in details for f in d["files"]
    )
    return {
        "runs": len(runs),
        "states_at_kill": states,
        "final_states": [d["status"] for d in details],
        "attempts": [j["attempts"] for d in details for j in d["jobs"]],
        "files": sum(len(d["files"]) for d in details),
        "files_intact": files_ok,
        "jobs_lost": sum(d["status"] != "analysed" for d in details),
        "recovered_s": recovered_s,
    }


def _pg_database() -> tuple[str | None, Any]:
    try:
        import psycopg

        admin = psycopg.connect(f"{PG}/postgres", autocommit=True, connect_timeout=3)
    except Exception as exc:
        print(f"PostgreSQL not reachable ({exc}); SQLite only", file=sys.stderr)
        return None, None
    name = f"tg_bench_{uuid.uuid4().hex[:8]}"
    admin.execute(f'CREATE DATABASE "{name}"')

    def drop() -> None:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

    return f"{PG}/{name}", drop


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args()
    results: dict[str, Any] = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d"),
        "stores": {},
    }
    stores: list[tuple[str, str | None, Any]] = [("sqlite", None, None)]
    pg_url, drop = _pg_database()
    if pg_url:
        stores.append(("postgresql", pg_url, drop))
    for label, url, cleanup in stores:
        with tempfile.TemporaryDirectory(prefix="tg-load-") as tmp:
            server = LiveServer(Path(tmp) / "data", url).start()
            try:
                load = asyncio.run(_load(server, args.runs, args.concurrency))
            finally:
                server.stop()
        if cleanup:
            cleanup()
        pg_url2, drop2 = _pg_database() if url else (None, None)
        with tempfile.TemporaryDirectory(prefix="tg-kill-") as tmp:
            crash = _kill_restart(Path(tmp) / "data", pg_url2)
        if drop2:
            drop2()
        results["stores"][label] = {"load": load, "kill_restart": crash}
        print(json.dumps({label: results["stores"][label]}, indent=2))
    (REPO / "bench" / "service_results.json").write_text(json.dumps(results, indent=2) + "\n")
    (REPO / "bench" / "SERVICE.md").write_text(render(results))
    failed = any(
        s["load"]["errors"] or s["kill_restart"]["jobs_lost"] or not s["kill_restart"]["files_intact"]
        for s in results["stores"].values()
    )
    return 1 if failed else 0


def render(results: dict[str, Any]) -> str:
    lines = [
        "# Service load and crash test",
        "",
        f"`bench/service_load.py` on {results['machine']}, {results['date']}: a real `traceguard serve` "
        "(uvicorn, 2 analysis workers) on loopback. Each run uploads the real 2×H200 P2P capture "
        "(2 nsys exports, 2 NCCL logs, dmon) as one multipart request; as many clients query step "
        "breakdowns while the uploads go on. Then SIGKILL during analyses and a restart.",
        "",
        "| store | runs × clients | upload p50 / p95 (s) | upload MB/s | analyses/min | errors |",
        "|---|---|---|---|---|---|",
    ]
    for label, s in results["stores"].items():
        load = s["load"]
        lines.append(
            f"| {label} | {load['runs']} × {load['concurrency']} "
            f"| {load['upload_p50_s']:.2f} / {load['upload_p95_s']:.2f} | {load['upload_mb_per_s']:.1f} "
            f"| {load['analyses_per_min']:.0f} | {len(load['errors'])} |"
        )
    lines += [
        "",
        "Step-breakdown queries (`GET /v1/runs/{id}/steps?phase=backward`), while analyses saturate both "
        "cores and after they finished:",
        "",
        "| store | during analyses: n, p50 / p95 (ms) | idle: n, p50 / p95 (ms) | idle queries/s |",
        "|---|---|---|---|",
    ]
    for label, s in results["stores"].items():
        load = s["load"]
        lines.append(
            f"| {label} | {load['step_queries_during_analysis']}, {load['step_query_busy_p50_ms']:.1f} / "
            f"{load['step_query_busy_p95_ms']:.1f} | {load['step_queries_idle']}, "
            f"{load['step_query_idle_p50_ms']:.1f} / {load['step_query_idle_p95_ms']:.1f} "
            f"| {load['step_queries_idle_per_s']:.0f} |"
        )
    lines += [
        "",
        "| store | runs | states at SIGKILL | jobs lost | files intact | job attempts | analysed after restart (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for label, s in results["stores"].items():
        crash = s["kill_restart"]
        states = ", ".join(
            f"{n}×{st}"
            for st, n in sorted({st: crash["states_at_kill"].count(st) for st in crash["states_at_kill"]}.items())
        )
        lines.append(
            f"| {label} | {crash['runs']} | {states} | {crash['jobs_lost']} | {crash['files_intact']} "
            f"| {crash['attempts']} | {crash['recovered_s']:.1f} |"
        )
    lines += [
        "",
        "Analyses run in child processes (2 at a time here, one per core), so uploads and queries are "
        "answered while they run. A job interrupted by the kill holds a lease (3 s in this test, "
        "60 s by default); when it runs out the restarted server queues the job again (attempts 2).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
