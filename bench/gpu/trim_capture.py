"""Trim a real nsys SQLite export to its first N steps, for a committed fixture.

As if the program had stopped when step N+1 began: every CPU-side event (API calls, NVTX, OS
runtime, ...) that starts after step N+1's range starts is deleted, every GPU op launched by such
a call with it (kernels, copies, sets of step N still running on the GPU stay), and every GPU
metrics sample after the last remaining GPU op's end plus a margin (with ``--before-first-op``,
those before the first one's start minus the margin too); then the file is vacuumed.
What remains is exactly what was recorded of those events; no value is changed. The steps come
from traceguard's own analysis of the untrimmed file, so run it with traceguard importable.

    python bench/gpu/trim_capture.py IN.sqlite OUT.sqlite --steps 2 [--margin-us 200]
"""

from __future__ import annotations

import argparse
import shutil
import sqlite3
from pathlib import Path

from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.metrics.run import analyse_run


def cut_time(path: Path, steps: int) -> int:
    """When step ``steps`` (0-based: the first step not kept) began on the CPU (capture clock, ns)."""
    result = analyse_run([(0, read_nsys_sqlite(path, launches_only=True))])
    rows = sorted(result.ranks[0].steps, key=lambda r: r["start_ns"])
    if len(rows) <= steps:
        raise SystemExit(f"{path}: {len(rows)} steps, no step after the first {steps} to cut at")
    return int(rows[steps]["start_ns"])


def trim(source: Path, target: Path, cut: int, margin_ns: int, *, before_first_op: bool = False) -> dict[str, int]:
    """Copy ``source`` to ``target`` and cut it at CPU time ``cut`` (module docstring); rows deleted per table.
    ``before_first_op``: also delete the GPU metrics samples stamped before the first kept GPU op's
    start minus the margin (the samples of the job's start, before the capture range)."""
    shutil.copyfile(source, target)
    conn = sqlite3.connect(target)
    deleted: dict[str, int] = {}
    try:
        tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        columns = {t: {r[1] for r in conn.execute(f'PRAGMA table_info("{t}")')} for t in tables}
        api = [t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_") and t in ("CUPTI_ACTIVITY_KIND_RUNTIME",)]
        gpu = [
            t
            for t in tables
            if t.startswith("CUPTI_ACTIVITY_KIND_") and t not in api and {"correlationId", "start"} <= columns[t]
        ]
        for table in gpu:  # launched after the cut: gone with its launch
            cursor = conn.execute(
                f'DELETE FROM "{table}" WHERE correlationId IN '
                "(SELECT correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME WHERE start >= ?)",
                (cut,),
            )
            deleted[table] = cursor.rowcount
        for table in tables:
            if table in gpu or table == "GPU_METRICS":
                continue
            time_column = next((c for c in ("start", "timestamp") if c in columns[table]), None)
            if time_column is None:
                continue
            cursor = conn.execute(f'DELETE FROM "{table}" WHERE "{time_column}" >= ?', (cut,))
            if cursor.rowcount:
                deleted[table] = cursor.rowcount
        if "GPU_METRICS" in tables:
            work = [t for t in gpu if t.rsplit("_", 1)[-1] in ("KERNEL", "MEMCPY", "MEMSET")]
            ends = [conn.execute(f'SELECT MAX("end") FROM "{t}"').fetchone()[0] for t in work]
            gpu_end = max([e for e in ends if e is not None] or [cut])
            cursor = conn.execute("DELETE FROM GPU_METRICS WHERE timestamp > ?", (gpu_end + margin_ns,))
            deleted["GPU_METRICS"] = cursor.rowcount
            if before_first_op:
                # The collector samples from nsys's start, long before a cudaProfilerApi range opens
                # (warm-up and timed steps: 98 % of a kept step's rows); none of them lies over kept work.
                starts = [conn.execute(f'SELECT MIN("start") FROM "{t}"').fetchone()[0] for t in work]
                gpu_start = min([s for s in starts if s is not None] or [0])
                cursor = conn.execute("DELETE FROM GPU_METRICS WHERE timestamp < ?", (gpu_start - margin_ns,))
                deleted["GPU_METRICS"] += cursor.rowcount
        conn.commit()
        conn.execute("VACUUM")
    finally:
        conn.close()
    return {k: v for k, v in deleted.items() if v}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", type=Path)
    parser.add_argument("target", type=Path)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--margin-us", type=int, default=200)
    parser.add_argument("--before-first-op", action="store_true", help="also drop GPU metrics before the first GPU op")
    args = parser.parse_args()
    cut = cut_time(args.source, args.steps)
    deleted = trim(args.source, args.target, cut, args.margin_us * 1000, before_first_op=args.before_first_op)
    print(f"{args.target}: cut at {cut} ns; deleted {deleted}")


if __name__ == "__main__":
    main()
