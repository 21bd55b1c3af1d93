"""Streaming NCCL Inspector logs: traceguard's reader against plain ``json.loads`` per line.

Not a timed test: run by hand (nothing else running), results committed in
``bench/INSPECTOR_STREAM.md``. The input is a scaled copy of the real 2×H100 FSDP2 dumps
(``../shared/fixtures/nccl-inspector/fsdp2_p2p_rank{0,1}.log.gz``, 540 lines each): copy k of a
rank's lines has its ``coll_sn`` shifted by k × that type's count in the original and its
``dump_timestamp_us`` by k × the original's span, so every line stays unique and the instances
still match across the two ranks. Two plain (uncompressed) files, one per rank, ``--lines`` in all.

Each reader runs in a fresh process, one after the other, measured there: wall time, lines/s and
peak RSS (``ru_maxrss``).

- ``traceguard``: ``read_inspector`` (16 MiB blocks, Polars NDJSON against a fixed schema, one
  compact row per line kept), then ``analyse_inspector`` (the cross-rank match and split) timed
  apart.
- ``json.loads``: the first ``--json-lines`` lines (4 M by default, to keep the run under 2 min),
  each parsed by the standard library and dropped (a running count and sum
  only: the cheapest a per-line Python reader can be; keeping the dicts would cost ~2 KB a line).

    python bench/inspector_stream.py --lines 10000000
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
FIXTURES = ROOT.parent / "shared" / "fixtures" / "nccl-inspector"
_SPLIT = re.compile(rb'^(.*"dump_timestamp_us":)(\d+)(.*"coll_sn":)(\d+)(.*)$')

#: VmHWM, the process's own peak (ru_maxrss would carry the parent's peak over fork + exec).
PEAK = """
def peak_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
"""

TRACEGUARD = (
    PEAK
    + """
import sys, time
from pathlib import Path
from traceguard.ingest.nccl_inspector import read_inspector
from traceguard.metrics.inspector import analyse_inspector
paths = [Path(p) for p in sys.argv[1:]]
t0 = time.perf_counter()
data = read_inspector(paths)
t1 = time.perf_counter()
read_peak = peak_mb()
result = analyse_inspector(data)
t2 = time.perf_counter()
import json
print(json.dumps({"lines": data.ops.height, "read_s": t1 - t0, "analyse_s": t2 - t1,
                  "rows_bytes": data.ops.estimated_size(),
                  "matched": result.metrics["collective_instances_matched"],
                  "late_rank": result.metrics["late_rank"], "wait_share": result.metrics["nccl_wait_share"],
                  "peak_rss_after_read_mb": read_peak, "peak_rss_mb": peak_mb()}))
"""
)

JSON_LOADS = (
    PEAK
    + """
import json, sys, time
t0 = time.perf_counter()
lines = 0
total = 0
for path in sys.argv[1:]:
    with open(path, "rb") as fh:
        for line in fh:
            doc = json.loads(line)
            total += doc["coll_perf"]["coll_exec_time_us"]
            lines += 1
t1 = time.perf_counter()
print(json.dumps({"lines": lines, "read_s": t1 - t0, "exec_us": total,
                  "peak_rss_mb": peak_mb()}))
"""
)


def scaled_copy(template: Path, out: Path, lines: int, batch: int = 400) -> None:
    """Write ``lines`` lines: the real file's lines repeated with shifted coll_sn and timestamps."""
    raw = gzip.decompress(template.read_bytes()).splitlines()
    parts = [_SPLIT.match(line).groups() for line in raw]  # type: ignore[union-attr]
    per_type: dict[bytes, int] = {}
    for line in raw:
        coll = json.loads(line)["coll_perf"]["coll"].encode()
        per_type[coll] = per_type.get(coll, 0) + 1
    colls = [json.loads(line)["coll_perf"]["coll"].encode() for line in raw]
    stamps = [int(p[1]) for p in parts]
    span = max(stamps) - min(stamps) + 1_000
    frame = pl.DataFrame(
        {
            "a": [p[0].decode() for p in parts],
            "ts": stamps,
            "b": [p[2].decode() for p in parts],
            "sn": [int(p[3]) for p in parts],
            "c": [p[4].decode() for p in parts],
            "step": [per_type[c] for c in colls],
        }
    )
    copies = -(-lines // len(raw))
    written = 0
    with out.open("w") as fh:
        for first in range(0, copies, batch):
            k = pl.DataFrame({"k": list(range(first, min(first + batch, copies)))})
            block = frame.join(k, how="cross").select(
                pl.concat_str(
                    "a",
                    (pl.col("ts") + pl.col("k") * span).cast(pl.String),
                    "b",
                    (pl.col("sn") + pl.col("k") * pl.col("step")).cast(pl.String),
                    "c",
                )
            )
            text = block.to_series().head(lines - written)
            written += text.len()
            fh.write("\n".join(text.to_list()))
            fh.write("\n")
            if written >= lines:
                break


def _child(code: str, paths: list[Path]) -> dict:
    run = subprocess.run(
        [sys.executable, "-c", code, *map(str, paths)],
        check=True,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    return json.loads(run.stdout.strip().splitlines()[-1])


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=10_000_000, help="lines in all (two ranks)")
    parser.add_argument(
        "--json-lines", type=int, default=4_000_000, help="lines json.loads reads (its rate is per line; 0: all)"
    )
    parser.add_argument("--out", type=Path, default=HERE / "inspector_stream.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tg-inspector-") as tmp:
        t0 = time.perf_counter()
        paths = []
        for rank in (0, 1):
            path = Path(tmp) / f"vm-pid{932 + rank}.log"
            scaled_copy(FIXTURES / f"fsdp2_p2p_rank{rank}.log.gz", path, args.lines // 2)
            paths.append(path)
        made = time.perf_counter() - t0
        os.sync()  # the copy's write-back must not run during the measurements
        size = sum(p.stat().st_size for p in paths)
        print(f"scaled copy: {args.lines:,} lines, {size / 1e9:.2f} GB in {made:.1f} s", flush=True)
        ours = _child(TRACEGUARD, paths)
        print("traceguard:", ours, flush=True)
        json_paths = paths
        if args.json_lines and args.json_lines < args.lines:
            json_paths = []
            for path in paths:
                head = path.with_suffix(".head.log")
                with path.open("rb") as src, head.open("wb") as dst:
                    for i, line in enumerate(src):
                        if i >= args.json_lines // 2:
                            break
                        dst.write(line)
                json_paths.append(head)
        plain = _child(JSON_LOADS, json_paths)
        print("json.loads:", plain, flush=True)
    doc = {
        # Provenance, copied into bench/RESULTS.md by run_bench.py (inspector_stream_section).
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "traceguard_git": _git("rev-parse", "--short", "HEAD"),
        "traceguard_git_dirty": bool(_git("status", "--porcelain", "--", "traceguard")),
        "cpus": os.cpu_count(),
        "lines": args.lines,
        "bytes": size,
        "make_s": made,
        "traceguard": {**ours, "lines_per_s": ours["lines"] / ours["read_s"]},
        "json_loads": {**plain, "lines_per_s": plain["lines"] / plain["read_s"]},
    }
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))


if __name__ == "__main__":
    main()
