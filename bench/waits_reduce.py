"""The cross-rank reduce (traceguard.metrics.waits) at 1,024 ranks × ~10 k collectives each.

Not a timed test: run by hand, results committed in ``bench/WAITS_REDUCE.md``. The instances are
the real ones of the 2×H200 25 MB-bucket DDP capture (``tests/fixtures/h200/p2p_nsys_bucket25``:
111 all-reduces per rank in 3 steps), replicated in time (copy k shifted by k × the capture's
span) to ~10 k per rank, and given to 1,024 ranks (rank r takes the real rank r % 2's calls, its
clock shifted by a few µs × r): what the map of such a run would send to the reduce. Measured in a
fresh process: wall time and peak RSS of ``reduce_waits`` with step-keyed matching (steps from
markers) and with order matching (inferred steps: the shift search runs), the bytes the instances
take, and the run's answer (matched calls, late rank, trusted clocks).
"""

from __future__ import annotations

import argparse
import json
import pickle
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

CHILD = """
import json, pickle, resource, sys, time
import polars as pl
from traceguard.metrics.waits import RankClock, reduce_waits
ranks, copies, source = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
real = pickle.loads(open(sys.argv[4], "rb").read())
span = max(int(f["end"].max()) for f, _ in real) - min(int(f["start"].min()) for f, _ in real) + 1_000_000
steps = max(int(f["step"].max()) for f, _ in real) + 1
parts = []
for rank in range(ranks):
    frame, clock = real[rank % len(real)]
    big = pl.concat(
        [frame.with_columns(pl.col("start") + k * span, pl.col("end") + k * span, pl.col("covered_until") + k * span,
                            pl.col("step") + k * steps) for k in range(copies)]
    ).with_columns(pl.col("start") + 3_000 * rank, pl.col("end") + 3_000 * rank, pl.col("covered_until") + 3_000 * rank)
    parts.append((RankClock(rank, clock["base_ns"], clock["source"], clock["host"], source), big))
rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
result = reduce_waits(parts)
wall = time.perf_counter() - t
print(json.dumps({
    "ranks": ranks, "calls_per_rank": parts[0][1].height, "step_source": source, "reduce_s": round(wall, 2),
    "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    "rss_before_reduce_mb": round(rss_before / 1024),
    "instance_bytes_in_memory": sum(f.estimated_size() for _, f in parts),
    "matched": result.metrics["collective_instances_matched"], "late_rank": result.metrics["late_rank"],
    "trusted": result.clock_alignment["trusted"], "wait_share": result.metrics["nccl_wait_share"],
}))
"""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 1024])
    ap.add_argument("--copies", type=int, default=90, help="time copies of the 111 real calls (90: 9,990 a rank)")
    ap.add_argument("--out", type=Path, default=HERE / "WAITS_REDUCE.md")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from traceguard.pipeline import analyze

    analysis = analyze([str(ROOT / "tests" / "fixtures" / "h200" / "p2p_nsys_bucket25")])
    real = [(r.instances, r.clock) for r in analysis.result.ranks]
    blob = pickle.dumps(real)
    per_call = len(pickle.dumps(real[0][0])) / real[0][0].height
    work = ROOT / "bench" / "work"
    work.mkdir(parents=True, exist_ok=True)
    (work / "instances.pickle").write_bytes(blob)
    rows = []
    for ranks in args.ranks:
        for source in ("convention", "inferred"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(ranks), str(args.copies), source, str(work / "instances.pickle")],
                capture_output=True,
                text=True,
                cwd=ROOT,
                check=True,
            )
            rows.append(json.loads(out.stdout))
            print(rows[-1])
    lines = [
        "# The cross-rank reduce at scale (`bench/waits_reduce.py`)",
        "",
        f"Made {time.strftime('%Y-%m-%d')} on this project's 2-core machine; real instances of "
        "`tests/fixtures/h200/p2p_nsys_bucket25` replicated (see the script's docstring). "
        f"One instance pickles to {per_call:.0f} bytes here (a 111-row frame, with its overhead).",
        "",
        "| ranks | calls a rank | matching | reduce wall | peak RSS | instances in memory | matched | late rank "
        "| clocks trusted |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        matching = "step, order in step" if r["step_source"] == "convention" else "order, shift search"
        lines.append(
            f"| {r['ranks']} | {r['calls_per_rank']:,} | {matching} | {r['reduce_s']} s | {r['peak_rss_mb']:,} MB "
            f"| {r['instance_bytes_in_memory'] / 1e6:,.0f} MB | {r['matched']:,} | {r['late_rank']} | {r['trusted']} |"
        )
    args.out.write_text("\n".join(lines) + "\n")
    print(args.out.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
