#!/usr/bin/env python3
"""Scale a real capture up to benchmark size.

Three subcommands::

    python bench/scale_capture.py nsys   SRC.sqlite[.gz] --kernels 10000000 --out BIG.sqlite
    python bench/scale_capture.py kineto SRC.json[.gz]   --events  1500000  --out BIG.json
    python bench/scale_capture.py gpu-metrics BIG.sqlite --from METRICS.sqlite[.gz] --hz 1000

``nsys``: the per-event tables (kernels, copies, sets, CUDA runtime calls, NVTX ranges) are
replicated inside SQLite. Copy ``k`` of every row is shifted in time by ``k × (span + gap)``
(``span`` = the time covered by those tables in the source) and has its ``correlationId``
offset by ``k × (max correlationId + 1)``, so kernel↔runtime joins still match one-to-one and
NVTX ranges (training steps, NCCL ranges) move with the work they enclose. Step names repeat
(``Batch 8`` appears once per copy); that is expected.

The copy is done by doubling: each statement re-inserts every row already present with the next
power-of-two shift, ``INSERT INTO t SELECT … FROM t WHERE start < cut`` (the last statement
takes only as many copies as are still missing, selected by time window). That is
⌈log2 N⌉ statements per table, all row work in SQLite, none in Python.

``kineto``: ``traceEvents`` are replicated the same way (ts shifted, correlation ids, flow ids
and External ids offset); metadata events (``ph: M``) are kept once and the profiler span is
stretched to cover all copies. This one is a plain Python loop: it is a data generator, not
the code being measured.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import os
import shutil
import sqlite3
import sys
import time
from pathlib import Path

#: Per-event tables that are replicated (only those present in the source).
EVENT_TABLES = (
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "NVTX_EVENTS",
)
KERNEL_TABLE = EVENT_TABLES[0]

#: NVTX rows that are registrations, not events in time (domain create/destroy, naming of
#: threads/devices/streams, categories): copied once only. Their timestamps can even lie before
#: the session (nsys records a domain created before the capture started at a negative time).
NVTX_NOT_EVENTS = (33, 39, 64, 72, 73, 74, 75, 76, 97, 98, 99)

#: Kineto arg keys that carry ids which must stay unique per copy.
KINETO_ID_ARGS = ("correlation", "External id")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _write_sidecar(out: Path, src: Path, **facts: object) -> None:
    """``OUT.scale.json``: where the scaled file came from (run_bench.py copies it into results)."""
    meta = {"source": str(src), "source_sha256": _sha256(src), "out": str(out), **facts}
    Path(f"{out}.scale.json").write_text(json.dumps(meta, indent=2) + "\n")


def _copy_source(src: Path, out: Path) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    if out.exists():
        out.unlink()
    with src.open("rb") as handle:
        gz = handle.read(2) == b"\x1f\x8b"
    if gz:
        with gzip.open(src, "rb") as fin, out.open("wb") as fout:
            shutil.copyfileobj(fin, fout, 1 << 20)
    else:
        shutil.copyfile(src, out)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{table}")')]


def _event_filter(table: str) -> str:
    """SQL condition selecting the rows of ``table`` that are events in time (to replicate)."""
    if table == "NVTX_EVENTS":
        return f"eventType NOT IN ({', '.join(map(str, NVTX_NOT_EVENTS))})"
    return "1"


def scale_nsys(src: Path, out: Path, kernels: int, gap_ns: int) -> dict[str, int]:
    t0 = time.perf_counter()
    _copy_source(src, out)
    # INSERT INTO t SELECT … FROM t materializes the selection in a temp file: keep it next to
    # the output rather than in /tmp.
    os.environ.setdefault("SQLITE_TMPDIR", str(out.parent.resolve()))
    conn = sqlite3.connect(out, isolation_level=None)
    conn.executescript(
        "PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;PRAGMA cache_size=-262144;"
    )
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    tables = [t for t in EVENT_TABLES if t in present]
    if KERNEL_TABLE not in tables:
        sys.exit(f"{src}: no {KERNEL_TABLE} table")
    base_kernels = conn.execute(f"SELECT count(*) FROM {KERNEL_TABLE}").fetchone()[0]
    if base_kernels == 0:
        sys.exit(f"{src}: {KERNEL_TABLE} is empty")
    copies = max(1, math.ceil(kernels / base_kernels))

    # One time unit and one correlation unit for all tables, so relations between tables hold.
    lo, hi, max_corr = None, None, 0
    for table in tables:
        cols = _columns(conn, table)
        end = "coalesce(end, start)" if "end" in cols else "start"
        row = conn.execute(f"SELECT min(start), max({end}) FROM {table} WHERE {_event_filter(table)}").fetchone()
        if row[0] is not None:
            lo = row[0] if lo is None else min(lo, row[0])
            hi = row[1] if hi is None else max(hi, row[1])
        if "correlationId" in cols:
            (top,) = conn.execute(f"SELECT max(correlationId) FROM {table}").fetchone()
            max_corr = max(max_corr, top or 0)
    assert lo is not None and hi is not None
    unit = (hi - lo) + max(gap_ns, 1)  # > span: copy windows must not touch
    corr_unit = max_corr + 1
    print(
        f"source: {base_kernels} kernels, span {(hi - lo) / 1e6:.1f} ms, unit {unit} ns, "
        f"corr unit {corr_unit}; making {copies} copies",
        flush=True,
    )

    # Doubling: after step i the table holds copies 0..have-1; copy ``j`` of a row has start in
    # [lo + j*unit, lo + (j+1)*unit) (every event starts inside the source span), so a time cut
    # selects whole copies.
    for table in tables:
        cols = _columns(conn, table)
        cond = _event_filter(table)
        t1 = time.perf_counter()
        have, statements = 1, 0
        while have < copies:
            take = min(have, copies - have)
            shift = have * unit
            exprs = []
            for c in cols:
                if c in ("start", "end"):
                    exprs.append(f'"{c}" + {shift}')
                elif c == "correlationId":
                    exprs.append(f'"{c}" + {have * corr_unit}')
                else:
                    exprs.append(f'"{c}"')
            col_list = ", ".join(f'"{c}"' for c in cols)
            cut = lo + take * unit
            conn.executescript(
                f"BEGIN; INSERT INTO {table} ({col_list}) SELECT {', '.join(exprs)} FROM {table} "
                f"WHERE {cond} AND start >= {lo} AND start < {cut}; COMMIT;"
            )
            have += take
            statements += 1
        n = conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
        print(f"  {table}: {n} rows ({statements} statements, {time.perf_counter() - t1:.1f} s)", flush=True)

    # Keep the session metadata consistent with the longer timeline.
    extra = (copies - 1) * unit
    if "ANALYSIS_DETAILS" in present:
        conn.execute(f"UPDATE ANALYSIS_DETAILS SET duration = duration + {extra}, stopTime = stopTime + {extra}")
    counts = {t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables}
    conn.close()
    size_mb = out.stat().st_size / 1e6
    took = time.perf_counter() - t0
    print(f"wrote {out} ({size_mb:.0f} MB) in {took:.1f} s")
    _write_sidecar(
        out,
        src,
        kind="nsys",
        copies=copies,
        source_kernels=base_kernels,
        time_unit_ns=unit,
        correlation_unit=corr_unit,
        rows=counts,
        size_mb=round(size_mb),
        build_s=round(took, 1),
    )
    print("rows per table:")
    for t, n in counts.items():
        print(f"  {t:32s} {n:>12,}")
    return counts


def _load_json(src: Path) -> dict:
    import orjson

    with src.open("rb") as handle:
        gz = handle.read(2) == b"\x1f\x8b"
    if not gz:
        return orjson.loads(src.read_bytes())
    with gzip.open(src, "rb") as fin:
        return orjson.loads(fin.read())


def scale_kineto(src: Path, out: Path, events: int, gap_us: float) -> dict[str, int]:
    import orjson

    t0 = time.perf_counter()
    trace = _load_json(src)
    base = trace["traceEvents"]
    meta = [e for e in base if e.get("ph") == "M"]
    spans = [e for e in base if e.get("cat") == "Trace" or e.get("ph") == "i"]
    timed = [e for e in base if e.get("ph") != "M" and not (e.get("cat") == "Trace" or e.get("ph") == "i")]
    if not timed:
        sys.exit(f"{src}: no timed events")
    copies = max(1, math.ceil((events - len(meta) - len(spans)) / len(timed)))
    lo = min(e["ts"] for e in timed)
    hi = max(e["ts"] + e.get("dur", 0) for e in timed)
    unit = (hi - lo) + gap_us
    max_id = 0
    for e in timed:
        args = e.get("args") or {}
        for key in KINETO_ID_ARGS:
            v = args.get(key)
            if isinstance(v, int):
                max_id = max(max_id, v)
        if e.get("ph") in ("s", "f") and isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    id_unit = max_id + 1
    print(
        f"source: {len(base)} events ({len(timed)} timed), span {(hi - lo) / 1e3:.1f} ms; making {copies} copies",
        flush=True,
    )

    # ts are µs with 3 decimals; at ~1e12 µs a float64 cannot hold every such value, so shift in
    # integer ns and write the text ourselves (orjson.Fragment) with exactly 3 decimals.
    ts_ns = [round(e["ts"] * 1000) for e in timed]
    unit_ns = round(unit * 1000)
    out_events: list[dict] = list(meta)
    for k in range(copies):
        shift_ns, off = k * unit_ns, k * id_unit
        for i, e in enumerate(timed):
            c = dict(e)
            ns = ts_ns[i] + shift_ns
            c["ts"] = orjson.Fragment(b"%d.%03d" % divmod(ns, 1000))
            if c.get("ph") in ("s", "f") and isinstance(c.get("id"), int):
                c["id"] = c["id"] + off
            args = e.get("args")
            if args:
                a = dict(args)
                for key in KINETO_ID_ARGS:
                    v = a.get(key)
                    if isinstance(v, int):
                        a[key] = v + off
                c["args"] = a
            out_events.append(c)
    for e in spans:  # the profiler span covers everything
        c = dict(e)
        if "dur" in c:
            c["dur"] = round(c["dur"] + (copies - 1) * unit, 3)
        out_events.append(c)
    trace["traceEvents"] = out_events
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(orjson.dumps(trace))
    size_mb = out.stat().st_size / 1e6
    cats: dict[str, int] = {}
    for e in out_events:
        key = str(e.get("cat", e.get("ph")))
        cats[key] = cats.get(key, 0) + 1
    took = time.perf_counter() - t0
    print(f"wrote {out} ({size_mb:.0f} MB, {len(out_events):,} events) in {took:.1f} s")
    print("events per category:")
    for key, n in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {key:24s} {n:>12,}")
    _write_sidecar(
        out,
        src,
        kind="kineto",
        copies=copies,
        source_events=len(base),
        time_unit_ns=unit_ns,
        id_unit=id_unit,
        rows={"traceEvents": len(out_events), **cats},
        size_mb=round(size_mb),
        build_s=round(took, 1),
    )
    return {"traceEvents": len(out_events), **cats}


def add_gpu_metrics(big: Path, src: Path, hz: int) -> dict[str, int]:
    """Give a scaled nsys export GPU metrics: the real samples of ``src`` (an export made with
    ``--gpu-metrics-devices``: every counter of each sample time), thinned to ``hz`` samples a
    second (every k-th sample time of the source's rate), tiled end to end over ``big``'s
    timeline, on the GPU of ``big``'s kernels. Same doubling as :func:`scale_nsys`."""
    t0 = time.perf_counter()
    work = big.parent / f"{big.name}.metrics-src.sqlite"
    _copy_source(src, work)
    conn = sqlite3.connect(big, isolation_level=None)
    conn.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; PRAGMA temp_store=FILE;")
    conn.execute("ATTACH DATABASE ? AS src", (str(work),))
    present = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    if "GPU_METRICS" in present:
        sys.exit(f"{big}: already has GPU_METRICS")
    for table in ("GPU_METRICS", "TARGET_INFO_GPU_METRICS"):
        (sql,) = conn.execute("SELECT sql FROM src.sqlite_master WHERE name = ?", (table,)).fetchone()
        conn.execute(sql)
    device = conn.execute(f"SELECT min(deviceId) FROM {KERNEL_TABLE}").fetchone()[0] or 0
    (src_type,) = conn.execute("SELECT min(typeId) FROM src.GPU_METRICS").fetchone()
    new_type = (src_type & ~0xFF) | device  # the samples' GPU is the kernels' (typeId & 0xFF)
    conn.execute(
        "INSERT INTO TARGET_INFO_GPU_METRICS SELECT ?, ?, typeName, metricId, metricName "
        "FROM src.TARGET_INFO_GPU_METRICS WHERE typeId = ?",
        (new_type, new_type, src_type),
    )
    query = "SELECT DISTINCT timestamp FROM src.GPU_METRICS WHERE timestamp >= 0 ORDER BY 1"
    times = [r[0] for r in conn.execute(query)]
    period = (times[-1] - times[0]) / (len(times) - 1)
    stride = max(1, round(1e9 / hz / period))
    kept = times[::stride]
    lo, hi = conn.execute(f"SELECT min(start), max(end) FROM {KERNEL_TABLE}").fetchone()
    block = kept[-1] - kept[0] + round(period * stride)  # one tile's length: its samples, one period apart
    conn.execute("CREATE TEMP TABLE kept(t INTEGER PRIMARY KEY)")
    conn.executemany("INSERT INTO kept VALUES (?)", [(t,) for t in kept])
    cols = _columns(conn, "GPU_METRICS")
    shift0 = lo - kept[0]
    exprs = [
        f'"{c}" + {shift0}' if c in ("timestamp", "rawTimestamp") else str(new_type) if c == "typeId" else f'"{c}"'
        for c in cols
    ]
    col_list = ", ".join(f'"{c}"' for c in cols)
    conn.executescript(
        f"BEGIN; INSERT INTO GPU_METRICS ({col_list}) SELECT {', '.join(exprs)} FROM src.GPU_METRICS "
        f"WHERE typeId = {src_type} AND timestamp IN (SELECT t FROM kept); COMMIT;"
    )
    tiles = max(1, math.ceil((hi - lo) / block))
    have = 1
    while have < tiles:
        take = min(have, tiles - have)
        shift = have * block
        shifted = [f'"{c}" + {shift}' if c in ("timestamp", "rawTimestamp") else f'"{c}"' for c in cols]
        conn.executescript(
            f"BEGIN; INSERT INTO GPU_METRICS ({col_list}) SELECT {', '.join(shifted)} FROM GPU_METRICS "
            f"WHERE timestamp < {lo + take * block}; COMMIT;"
        )
        have += take
    rows = conn.execute("SELECT count(*) FROM GPU_METRICS").fetchone()[0]
    conn.execute("DETACH DATABASE src")
    conn.close()
    work.unlink()
    took = time.perf_counter() - t0
    facts = {
        "gpu_metrics_source": str(src),
        "gpu_metrics_source_sha256": _sha256(src),
        "gpu_metrics_hz": round(1e9 / (period * stride)),
        "gpu_metrics_tiles": tiles,
        "gpu_metrics_rows": rows,
        "gpu_metrics_build_s": round(took, 1),
    }
    sidecar = Path(f"{big}.scale.json")
    meta = json.loads(sidecar.read_text()) if sidecar.exists() else {}
    meta.update(facts)
    meta.setdefault("rows", {})["GPU_METRICS"] = rows
    sidecar.write_text(json.dumps(meta, indent=2) + "\n")
    print(f"{big}: GPU_METRICS {rows:,} rows ({facts['gpu_metrics_hz']} Hz, {tiles} tiles) in {took:.1f} s")
    return {"GPU_METRICS": rows}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("nsys", help="scale an nsys SQLite export")
    p.add_argument("src", type=Path)
    p.add_argument("--kernels", type=int, default=10_000_000, help="target kernel rows (rounded up to whole copies)")
    p.add_argument("--gap-ns", type=int, default=1_000_000, help="idle gap between copies")
    p.add_argument("--out", type=Path, required=True)
    k = sub.add_parser("kineto", help="scale a Kineto (PyTorch profiler) JSON trace")
    k.add_argument("src", type=Path)
    k.add_argument("--events", type=int, default=1_500_000, help="target traceEvents (rounded up to whole copies)")
    k.add_argument("--gap-us", type=float, default=1000.0, help="idle gap between copies")
    k.add_argument("--out", type=Path, required=True)
    g = sub.add_parser("gpu-metrics", help="add real GPU metrics samples, tiled, to a scaled nsys export")
    g.add_argument("big", type=Path, help="the scaled export (from the nsys subcommand)")
    g.add_argument("--from", dest="src", type=Path, required=True, help="an export with GPU metrics")
    g.add_argument("--hz", type=int, default=1000, help="samples per second kept (≤ the source's rate)")
    args = parser.parse_args(argv)
    if args.cmd == "nsys":
        scale_nsys(args.src, args.out, args.kernels, args.gap_ns)
    elif args.cmd == "gpu-metrics":
        add_gpu_metrics(args.big, args.src, args.hz)
    else:
        scale_kineto(args.src, args.out, args.events, args.gap_us)


if __name__ == "__main__":
    main()
