"""Benchmark: a capture analysed in time slices (issue 13, part 2), beside ``nsys stats``.

    python bench/larger_than_memory.py --huge bench/work/huge.sqlite --fits bench/work/big.sqlite

1. ``--fits`` (an export that fits in memory, e.g. the 10 M-kernel one of RESULTS.md): the
   whole-file analysis (``--sliced-above 1T``) and the sliced one (``--sliced-above 0``), each
   timed, their JSON reports compared byte for byte apart from ``generated_at``.
2. ``--huge`` (about 100 M kernels, 18 GB): ``nsys stats`` (the kernel and memory-size
   summaries, as ``run_bench.py``) and ``traceguard analyze`` with its default threshold (1 GiB,
   or a quarter of this machine's memory if less, so this export is sliced), in the same run.

Writes ``bench/LARGER_THAN_MEMORY.md`` and ``bench/larger_than_memory.json``; standard library only
(the measuring wrapper and the machine facts are ``run_bench.py``'s).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import run_bench as rb  # noqa: E402

#: Targets of issue 13 for the large export.
RSS_LIMIT_MB = 3 * 1024
TIME_RATIO = 0.4


def traceguard(args: list[str]) -> list[str]:
    return [str(rb.ROOT / ".venv" / "bin" / "traceguard"), "analyze", *args, "--scheduler", "serial"]


def same_report(a: Path, b: Path) -> bool:
    left, right = (json.loads(p.read_text()) for p in (a, b))
    for report in (left, right):
        report.pop("generated_at", None)
    return left == right


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--huge", type=Path)
    ap.add_argument("--fits", type=Path)
    ap.add_argument("--render", action="store_true", help="only rewrite the Markdown from the JSON results")
    ap.add_argument("--results", type=Path, default=HERE / "larger_than_memory.json")
    ap.add_argument("--markdown", type=Path, default=HERE / "LARGER_THAN_MEMORY.md")
    ap.add_argument("--logs", type=Path, default=rb.WORK / "logs")
    args = ap.parse_args()
    if args.render:
        args.markdown.write_text(render(json.loads(args.results.read_text())))
        return
    if not args.huge or not args.fits:
        ap.error("--huge and --fits are required")
    args.logs.mkdir(parents=True, exist_ok=True)
    names = rb.nsys_report_names()
    facts = rb.machine_facts(names)
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    runs: dict[str, dict] = {}

    # 1. The export that fits: whole and sliced, the same report.
    reports = {}
    for label, threshold in (("whole", "1T"), ("sliced", "0")):
        out = rb.WORK / f"fits_{label}.json"
        cmd = traceguard([str(args.fits), "--format", "json", "-o", str(out), "--sliced-above", threshold])
        rb.warm_cache(args.fits)
        runs[f"fits {label}"] = {**rb.measure(cmd, args.logs / f"fits_{label}"), "cmd": shlex.join(cmd)}
        reports[label] = out
        print(f"  fits {label}: {runs[f'fits {label}']['wall_s']:.1f} s, {runs[f'fits {label}']['peak_rss_mb']:.0f} MB")
    identical = same_report(reports["whole"], reports["sliced"])

    # 2. The huge export: nsys stats, then traceguard with its default threshold.
    before = rb.fingerprint(args.huge)
    if names:
        cmd = ["nsys", "stats", "--report", ",".join(names), "--format", "csv", "--output", "-"]
        cmd += ["--force-export=false", str(args.huge)]
        rb.warm_cache(args.huge)
        runs["huge nsys stats"] = {**rb.measure(cmd, args.logs / "huge_nsys_stats"), "cmd": shlex.join(cmd)}
        print(f"  nsys stats: {runs['huge nsys stats']['wall_s']:.1f} s")
    out = rb.WORK / "huge_sliced.json"
    cmd = traceguard([str(args.huge), "--format", "json", "-o", str(out)])
    rb.warm_cache(args.huge)
    runs["huge traceguard"] = {**rb.measure(cmd, args.logs / "huge_traceguard"), "cmd": shlex.join(cmd)}
    print(f"  traceguard: {runs['huge traceguard']['wall_s']:.1f} s, {runs['huge traceguard']['peak_rss_mb']:.0f} MB")
    report = json.loads(out.read_text())
    results = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": facts,
        "memory_bytes": memory,
        "default_sliced_above_bytes": min(1 << 30, memory // 4),
        "fits": {"path": rb.rel(args.fits), "bytes": args.fits.stat().st_size, "rows": rb.count_nsys(args.fits)},
        "huge": {
            "path": rb.rel(args.huge),
            "bytes": args.huge.stat().st_size,
            "rows": rb.count_nsys(args.huge),
            "scale": rb.scale_facts(args.huge),
            "unmodified_by_nsys_stats": rb.fingerprint(args.huge) == before,
            "steps": sum(len(r["steps"]) for r in report["ranks"]),
            "gpu_ops_in_window": sum(r["metrics"]["gpu_ops"] or 0 for r in report["ranks"]),
        },
        "fits_reports_identical": identical,
        "runs": runs,
    }
    args.results.write_text(json.dumps(results, indent=2) + "\n")
    args.markdown.write_text(render(results))
    print(f"wrote {rb.rel(args.markdown)}, {rb.rel(args.results)}")


def render(r: dict) -> str:
    runs = r["runs"]
    huge, fits = r["huge"], r["fits"]
    kernels = huge["rows"].get("CUPTI_ACTIVITY_KIND_KERNEL", 0)
    tg, ref = runs["huge traceguard"], runs.get("huge nsys stats")
    ratio = tg["wall_s"] / ref["wall_s"] if ref else None
    time_ok = ratio is not None and ratio <= TIME_RATIO
    rss_ok = tg["peak_rss_mb"] < RSS_LIMIT_MB
    gb = 1 << 30
    lines = [
        "# A capture analysed in time slices, beside `nsys stats`",
        "",
        "Generated by `bench/larger_than_memory.py` (see its docstring); do not edit by hand.",
        "",
        f"- Date (UTC): {r['date_utc']}; {r['machine'].get('nproc')} CPUs, {r['memory_bytes'] / gb:.1f} GiB RAM; "
        f"sliced above {r['default_sliced_above_bytes'] / gb:.1f} GiB (the default: 1 GiB, or RAM / 4 if less)",
        f"- nsys: {r['machine'].get('nsys')}; traceguard {r['machine'].get('traceguard')}",
        "- Each command once, in a fresh process, right after an untimed read of its input (warm page cache).",
        "",
        "| tool | input | wall s | peak RSS MB | ratio vs nsys stats | target | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    if ref:
        lines.append(
            f"| nsys stats (reference) | {kernels / 1e6:.1f} M kernels ({huge['bytes'] / gb:.1f} GiB) | "
            f"{ref['wall_s']:.1f} | {ref['peak_rss_mb']:.0f} | — |  |  |"
        )
    verdict = (
        "PASS"
        if time_ok and rss_ok
        else f"FAIL (time {'PASS' if time_ok else 'FAIL'}, RSS {'PASS' if rss_ok else 'FAIL'})"
    )
    lines.append(
        f"| traceguard analyze (sliced) | {kernels / 1e6:.1f} M kernels ({huge['bytes'] / gb:.1f} GiB) | "
        f"{tg['wall_s']:.1f} | {tg['peak_rss_mb']:.0f} | {f'{ratio:.3f}×' if ratio else '—'} | "
        f"wall ≤ {TIME_RATIO}× nsys stats, peak RSS < {RSS_LIMIT_MB} MB | **{verdict}** |"
    )
    fk = fits["rows"].get("CUPTI_ACTIVITY_KIND_KERNEL", 0)
    for label in ("whole", "sliced"):
        run = runs[f"fits {label}"]
        lines.append(
            f"| traceguard analyze ({label}) | {fk / 1e6:.1f} M kernels ({fits['bytes'] / gb:.2f} GiB) | "
            f"{run['wall_s']:.1f} | {run['peak_rss_mb']:.0f} | | | |"
        )
    lines += [
        "",
        f"- The two reports of the {fk / 1e6:.1f} M-kernel export (whole file, sliced) are "
        f"{'identical' if r['fits_reports_identical'] else '**different**'} apart from `generated_at`.",
        f"- The large export: {huge['gpu_ops_in_window']:,} GPU ops in the analysis window, "
        f"{huge['steps']:,} steps; "
        f"`nsys stats` left it unmodified: {huge['unmodified_by_nsys_stats']}.",
        "",
        "Rows per table of the large export:",
        "",
        *[f"- `{table}` {count:,}" for table, count in huge["rows"].items()],
    ]
    if huge.get("scale"):
        s = huge["scale"]
        lines.append(f"- scaled from `{s.get('source')}` ({s.get('copies')} copies)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
