"""A deliberately naive reference implementation of DESIGN.md's metric definitions.

It reads captures with plain ``sqlite3`` SQL or ``json`` and computes with Python loops, sharing
no code with traceguard's Polars pipeline, so tests can compare the two on real captures.
Slow by design; only for test-sized files.
"""

from __future__ import annotations

import gzip
import json
import re
import sqlite3
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path

STEP_PATTERNS = (
    re.compile(r"(?i)^(batch|step|train(ing)?[ _-]?step|iteration|iter)\s*[_:=#-]?\s*#?\d+$"),
    re.compile(r"^ProfilerStep#\d+$"),
)
DTOH = {"DtoH", "unified_DtoH"}
_NSYS_COPY = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP", 12: "unified_DtoH"}


@dataclass
class Op:
    pid: int | None
    device: int | None
    kind: str  # kernel | memcpy | memset
    start: int
    end: int
    name: str
    correlation: int | None
    copy_kind: str | None = None
    bytes: int = 0


@dataclass
class Range:
    pid: int | None
    tid: int | None
    start: int
    end: int
    name: str
    nccl_domain: bool = False


@dataclass
class Raw:
    ops: list[Op]
    launches: dict[tuple[int, int], int]  # (pid, correlation) → launch start
    ranges: list[Range]
    facts: dict = field(default_factory=dict)


def _process_of_ops(db: sqlite3.Connection, tables: set[str]) -> tuple[int | None, dict[int, int]]:
    """For GPU tables without ``globalPid`` (docs/steps.md): the capture's only process, or else
    correlation id → the process of the runtime calls with that id (one process only)."""
    pids: set[int] = set()
    by_correlation: dict[int, set[int]] = defaultdict(set)
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        for gtid, corr in db.execute("SELECT globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            if gtid is not None:
                pids.add((gtid >> 24) & 0xFFFFFF)
                if corr is not None:
                    by_correlation[corr].add((gtid >> 24) & 0xFFFFFF)
    if "NVTX_EVENTS" in tables:
        pids |= {(g >> 24) & 0xFFFFFF for (g,) in db.execute("SELECT globalTid FROM NVTX_EVENTS") if g is not None}
    if len(pids) <= 1:
        return (next(iter(pids)) if pids else 0), {}
    return None, {corr: next(iter(p)) for corr, p in by_correlation.items() if len(p) == 1}


def read_nsys(path: Path) -> Raw:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    strings = dict(db.execute("SELECT id, value FROM StringIds"))
    only, by_correlation = _process_of_ops(db, tables)
    ops: list[Op] = []

    def rows(table: str, columns: str) -> list[tuple]:
        has_pid = any(c[1] == "globalPid" for c in db.execute(f"PRAGMA table_info({table})"))
        found = db.execute(f"SELECT {'globalPid' if has_pid else 'NULL'}, {columns} FROM {table}").fetchall()
        out = []
        for gpid, *rest in found:
            corr = rest[3]
            pid = (gpid >> 24) & 0xFFFFFF if has_pid else (only if only is not None else by_correlation.get(corr))
            out.append((pid, *rest))
        return out

    if "CUPTI_ACTIVITY_KIND_KERNEL" in tables:
        for pid, start, end, dev, corr, short in rows(
            "CUPTI_ACTIVITY_KIND_KERNEL", "start, end, deviceId, correlationId, shortName"
        ):
            ops.append(Op(pid, dev, "kernel", start, end, strings.get(short, ""), corr))
    if "CUPTI_ACTIVITY_KIND_MEMCPY" in tables:
        for pid, start, end, dev, corr, kind, nbytes in rows(
            "CUPTI_ACTIVITY_KIND_MEMCPY", "start, end, deviceId, correlationId, copyKind, bytes"
        ):
            ops.append(Op(pid, dev, "memcpy", start, end, "memcpy", corr, _NSYS_COPY.get(kind, str(kind)), nbytes))
    if "CUPTI_ACTIVITY_KIND_MEMSET" in tables:
        for pid, start, end, dev, corr, nbytes in rows(
            "CUPTI_ACTIVITY_KIND_MEMSET", "start, end, deviceId, correlationId, bytes"
        ):
            ops.append(Op(pid, dev, "memset", start, end, "memset", corr, None, nbytes))
    launches: dict[tuple[int, int], int] = {}
    if "CUPTI_ACTIVITY_KIND_RUNTIME" in tables:
        for start, gtid, corr in db.execute("SELECT start, globalTid, correlationId FROM CUPTI_ACTIVITY_KIND_RUNTIME"):
            launches.setdefault(((gtid >> 24) & 0xFFFFFF, corr), start)
    ranges: list[Range] = []
    if "NVTX_EVENTS" in tables:
        domains = {d: t for d, t in db.execute("SELECT domainId, text FROM NVTX_EVENTS WHERE eventType = 75")}
        for start, end, gtid, text, text_id, domain in db.execute(
            "SELECT start, end, globalTid, text, textId, domainId FROM NVTX_EVENTS "
            "WHERE eventType IN (59, 60) AND end IS NOT NULL"
        ):
            name = text if text is not None else strings.get(text_id, "")
            ranges.append(
                Range((gtid >> 24) & 0xFFFFFF, gtid & 0xFFFFFF, start, end, name, domains.get(domain) == "NCCL")
            )
    return Raw(ops, launches, ranges)


def _ns(value: Decimal | int) -> int:
    """µs (as written in the JSON, parsed exactly) → int ns."""
    return int((Decimal(value) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def read_kineto(path: Path) -> Raw:
    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    with opener(path, "rt") as fh:
        doc = json.load(fh, parse_float=Decimal)
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    launches: dict[int, tuple[int, int]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cuda_runtime", "cuda_driver", "Runtime"):
            corr = (e.get("args") or {}).get("correlation")
            if corr is not None:
                launches.setdefault(corr, (int(e["pid"]), _ns(e["ts"])))
    host_pids = {
        int(e["pid"])
        for e in events
        if e.get("ph") == "X"
        and e.get("cat") in ("cuda_runtime", "cpu_op", "Operator", "Runtime")
        and str(e.get("pid")).isdigit()
    }
    ops: list[Op] = []
    kinds = {
        "kernel": "kernel",
        "Kernel": "kernel",
        "gpu_memcpy": "memcpy",
        "Memcpy": "memcpy",
        "gpu_memset": "memset",
        "Memset": "memset",
    }
    for e in events:
        kind = kinds.get(e.get("cat"))
        if e.get("ph") != "X" or kind is None:
            continue
        args = e.get("args") or {}
        corr = args.get("correlation")
        pid = launches[corr][0] if corr in launches else (next(iter(host_pids)) if len(host_pids) == 1 else None)
        copy_kind = None
        if kind == "memcpy":
            m = re.match(r"Memcpy (\w+)", e["name"])
            copy_kind = m.group(1) if m else None
        start = _ns(e["ts"])
        ops.append(
            Op(
                pid,
                args.get("device"),
                kind,
                start,
                start + _ns(e.get("dur", 0)),
                e["name"],
                corr,
                copy_kind,
                int(args.get("bytes", 0) or 0),
            )
        )
    ranges = []
    for e in events:
        if e.get("ph") != "X":
            continue
        name = e.get("name", "")
        if e.get("cat") == "user_annotation" or (
            name.startswith("ProfilerStep#") and e.get("cat") != "gpu_user_annotation"
        ):
            start = _ns(e["ts"])
            ranges.append(
                Range(
                    int(e["pid"]),
                    int(str(e["tid"]).split()[-1]) if str(e["tid"]).split()[-1].isdigit() else None,
                    start,
                    start + _ns(e.get("dur", 0)),
                    name,
                )
            )
    by_pid = {(pid, corr): start for corr, (pid, start) in launches.items()}
    return Raw(ops, by_pid, ranges, {"rank": (doc.get("distributedInfo") or {}).get("rank")})


def _union(intervals: list[tuple[int, int]]) -> int:
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


@dataclass
class Expected:
    steps: int
    gpu_ops: int
    dtoh: int
    dtoh_bytes: int
    dtod: int
    dtod_bytes: int
    peer: int
    nccl_kernels: int
    nccl_step_ns: int
    span_ns: int

    @property
    def nccl_share(self) -> float | None:
        return self.nccl_step_ns / self.span_ns if self.span_ns else None


def expected(raw: Raw, *, window_steps: bool = False) -> Expected:
    """The window metrics and NCCL share, straight from the definitions. With ``window_steps``,
    a capture without marker steps gets one step per process: its whole GPU window, every op of
    the process attributed by its own start (DESIGN.md, "Steps": ``window``)."""
    candidates = [r for r in raw.ranges if not r.nccl_domain and any(p.search(r.name) for p in STEP_PATTERNS)]
    steps = [
        c
        for c in candidates
        if not any(
            o is not c
            and o.pid == c.pid
            and c.start <= o.start
            and o.end <= c.end
            and (o.start, -o.end) > (c.start, -c.end)
            for o in candidates
        )
    ]
    attributed: dict[int, list[Op]] = defaultdict(list)
    if not steps and window_steps:
        pids = sorted({o.pid for o in raw.ops if o.pid is not None})
        steps = []
        for pid in pids:
            own = [o for o in raw.ops if o.pid == pid]
            steps.append(Range(pid, None, min(o.start for o in own), max(o.end for o in own), "window"))
        for i, pid in enumerate(pids):
            attributed[i] = [o for o in raw.ops if o.pid == pid]
    for op in raw.ops if not attributed else []:
        t = raw.launches.get((op.pid, op.correlation))
        if t is None:
            continue
        inside = [i for i, s in enumerate(steps) if s.pid == op.pid and s.start <= t <= s.end]
        if inside:
            attributed[max(inside, key=lambda i: steps[i].start)].append(op)
    spans = {i: (min(o.start for o in ops), max(o.end for o in ops)) for i, ops in attributed.items()}
    if steps:
        windows: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
        for i, span in spans.items():
            windows[steps[i].pid].append(span)
        merged: dict[int | None, list[list[int]]] = {}
        for pid, spans_of_pid in windows.items():
            out: list[list[int]] = []
            for s, e in sorted(spans_of_pid):
                if out and s <= out[-1][1]:
                    out[-1][1] = max(out[-1][1], e)
                else:
                    out.append([s, e])
            merged[pid] = out
        window = [o for o in raw.ops if any(s <= o.start <= e for s, e in merged.get(o.pid, []))]
    else:
        window = list(raw.ops)
    nccl_step = 0
    span_total = 0
    for i, ops in attributed.items():
        span_total += spans[i][1] - spans[i][0]
        per_device: dict[int | None, list[tuple[int, int]]] = defaultdict(list)
        for o in ops:
            if o.kind == "kernel" and o.name.startswith("nccl"):
                per_device[o.device].append((o.start, o.end))
        nccl_step += sum(_union(v) for v in per_device.values())
    return Expected(
        steps=len(steps),
        gpu_ops=len(window),
        dtoh=sum(o.copy_kind in DTOH for o in window),
        dtoh_bytes=sum(o.bytes for o in window if o.copy_kind in DTOH),
        dtod=sum(o.copy_kind == "DtoD" for o in window),
        dtod_bytes=sum(o.bytes for o in window if o.copy_kind == "DtoD"),
        peer=sum(o.copy_kind == "PtoP" for o in window),
        nccl_kernels=sum(o.kind == "kernel" and o.name.startswith("nccl") for o in window),
        nccl_step_ns=nccl_step,
        span_ns=span_total,
    )
