"""The measured figures README.md and docs/ quote, generated from the committed results files.

A figure in the prose sits between markers, ``<!-- figure:NAME -->...<!-- /figure -->``; this
script rewrites what is between them from ``bench/results.json`` (``run_bench.py``),
``bench/larger_than_memory.json``, ``bench/scale_out.json`` and ``bench/many_ranks.json``, each
figure with the date and the commit its run measured, so a reader can tell a current figure from
an old one. A figure measured by hand (no results file) says its date and commit in the text
instead. ::

    python bench/figures.py           # rewrite the figures in README.md and docs/*.md
    python bench/figures.py --check   # exit 1 (listing them) where a figure is not what the files say

``tests/bench/test_figures.py`` runs the check, so a results file committed without its figures
(or a figure edited by hand) fails the suite. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
#: The prose that quotes figures.
DOCUMENTS = ("README.md", "docs/*.md")
MARKER = re.compile(r"<!-- figure:([a-z0-9_]+) -->(.*?)<!-- /figure -->", re.DOTALL)


def _load(name: str) -> dict[str, Any]:
    return json.loads((HERE / name).read_text())


def _provenance(report: str, machine: dict[str, Any]) -> str:
    """``bench/X.md, <date> UTC, git <commit>`` (``+ uncommitted changes`` where the run said so)."""
    commit = machine.get("traceguard_git") or machine.get("git_commit") or "unknown"
    dirty = machine.get("traceguard_git_dirty") or machine.get("traceguard_sources_dirty")
    return f"`bench/{report}`, {machine['date_utc']} UTC, git {commit}{' + uncommitted changes' if dirty else ''}"


def _verdict(results: dict[str, Any], kind: str, tool: str) -> dict[str, Any]:
    return next(v for v in results["verdicts"] if v["kind"] == kind and v["tool"] == tool)


def bench_10m() -> str:
    """The default analysis of the 10 M-kernel export against ``nsys stats`` (run_bench.py)."""
    results = _load("results.json")
    ours = _verdict(results, "nsys", "traceguard analyze")
    kineto = _verdict(results, "kineto", "traceguard analyze")
    kernels = results["nsys"]["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"] / 1e6
    return (
        f"{kernels:.0f} M kernels in {ours['wall_median_s']:.2f} s, {ours['ratio']:.3f}× `nsys stats`, "
        f"{ours['rss_max_mb']:.0f} MB peak; a 1.5 M-event Kineto trace in {kineto['ratio']:.3f}× HTA's time "
        f"({_provenance('RESULTS.md', results['machine'])})"
    )


def bench_100m() -> str:
    """The 100 M-kernel export, sliced, against ``nsys stats`` (larger_than_memory.py)."""
    doc = _load("larger_than_memory.json")
    ours, theirs = doc["runs"]["huge traceguard"], doc["runs"]["huge nsys stats"]
    return (
        f"{doc['huge']['gpu_ops_in_window'] / 1e6:.0f} M GPU ops ({doc['huge']['bytes'] / 2**30:.1f} GiB) in "
        f"{ours['wall_s']:.1f} s, {ours['wall_s'] / theirs['wall_s']:.2f}× `nsys stats`, "
        f"{ours['peak_rss_mb']:.0f} MB peak ({_provenance('LARGER_THAN_MEMORY.md', doc['machine'])})"
    )


def sliced_peak() -> str:
    """The sliced analysis' peak RSS at 10 M and at 100 M kernels."""
    doc = _load("larger_than_memory.json")
    low, high = doc["runs"]["fits sliced"]["peak_rss_mb"], doc["runs"]["huge traceguard"]["peak_rss_mb"]
    return f"{low / 1000:.2f}–{high / 1000:.2f} GB from 10 M to 100 M kernels, {doc['machine']['date_utc'][:10]}"


def scale_out() -> str:
    """Ranks analysed together (local pool, 2 jobs) against one process per rank (scale_out.py)."""
    doc = _load("scale_out.json")
    parts = []
    for run in doc["runs"]:
        cases = run["cases"]
        manifest = run["manifest"]
        ratio = cases["local"]["summary"]["wall_s_median"] / cases["one_by_one"]["summary"]["wall_s_median"]
        parts.append(f"{manifest['ranks']} ranks × {manifest['kernels_per_rank'] / 1e6:.2f} M kernels in {ratio:.3f}×")
    return (
        f"{' and '.join(parts)} the time of one process per rank, on a pool of 2 "
        f"({_provenance('SCALE_OUT.md', doc['machine'])})"
    )


def result_size() -> str:
    """What one rank's map sends back, pickled, for the 0.16 M-kernel ranks of the 64-rank run."""
    doc = _load("scale_out.json")
    run = doc["runs"][0]
    size, kernels = run["travel"]["outcome_pickled_bytes"] / 1e6, run["manifest"]["kernels_per_rank"] / 1e6
    return f"{size:.2f} MB a rank at {kernels:.2f} M kernels"


def many_ranks() -> str:
    """The largest run of many_ranks.py by summary on the local pool, beside its full report."""
    doc = _load("many_ranks.json")
    run = max(doc["runs"], key=lambda r: r["manifest"]["ranks"])
    ok = [c for c in run["cases"].get("summary_local", []) if c.get("rc") == 0]
    full = [c for c in run["cases"].get("full_local", []) if c.get("rc") == 0]
    if not ok:
        return f"no successful summary case ({_provenance('MANY_RANKS.md', doc['machine'])})"
    best = min(ok, key=lambda c: c["wall_s"])
    manifest = run["manifest"]
    text = (
        f"{manifest['ranks']:,} ranks × {manifest['kernels_per_rank']:,} kernels by summary in {best['wall_s']:.0f} s, "
        f"the client's peak {max(c['client_peak_mb'] for c in ok):,.0f} MB, a {best['json_bytes'] / 1e6:.1f} MB JSON "
        f"report and {best['parquet_bytes'] / 1e6:.1f} MB of Parquet"
    )
    if full:
        text += (
            f" (the full report of the same run: {max(c['client_peak_mb'] for c in full):,.0f} MB, "
            f"{max(c['json_bytes'] for c in full) / 1e6:.0f} MB of JSON)"
        )
    return f"{text} ({_provenance('MANY_RANKS.md', doc['machine'])})"


def many_ranks_paper() -> str:
    """many_ranks.py's arithmetic: 1,024 ranks of 0.2 / 1 / 5 GB by summary, beside scale_out.json's."""
    doc = _load("many_ranks.json")
    rows = (doc.get("paper") or {}).get("rows") or []
    if not rows:
        return f"not computed ({_provenance('MANY_RANKS.md', doc['machine'])})"

    def sizes(key: str, scale: float, unit: str) -> str:
        values = [row[key] for row in rows]
        if any(v is None for v in values):
            return "—"
        return " / ".join(f"{v / scale:,.1f}" for v in values) + f" {unit}"

    files = " / ".join(f"{row['rank_bytes'] / 1e9:g}" for row in rows)
    return (
        f"1,024 ranks of {files} GB by summary: the client {sizes('client_mb', 1e3, 'GB')}, the JSON report "
        f"{sizes('json_mb', 1, 'MB')} (every rank's rows in both, before: {sizes('before_client_mb', 1e3, 'GB')} "
        f"and {sizes('before_json_mb', 1e3, 'GB')}; {_provenance('MANY_RANKS.md', doc['machine'])})"
    )


def larger_than_memory_provenance() -> str:
    return _provenance("LARGER_THAN_MEMORY.md", _load("larger_than_memory.json")["machine"])


def scale_out_provenance() -> str:
    return _provenance("SCALE_OUT.md", _load("scale_out.json")["machine"])


def results_provenance() -> str:
    return _provenance("RESULTS.md", _load("results.json")["machine"])


FIGURES: dict[str, Callable[[], str]] = {
    "bench_10m": bench_10m,
    "bench_100m": bench_100m,
    "sliced_peak": sliced_peak,
    "scale_out": scale_out,
    "many_ranks": many_ranks,
    "many_ranks_paper": many_ranks_paper,
    "result_size": result_size,
    "larger_than_memory_provenance": larger_than_memory_provenance,
    "scale_out_provenance": scale_out_provenance,
    "results_provenance": results_provenance,
}


def documents(root: Path = REPO) -> list[Path]:
    return sorted({p for pattern in DOCUMENTS for p in root.glob(pattern)})


def rendered(text: str) -> tuple[str, list[str]]:
    """``text`` with every figure regenerated, and the problems (unknown figure names)."""
    problems: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in FIGURES:
            problems.append(f"unknown figure {name!r}")
            return match.group(0)
        return f"<!-- figure:{name} -->{FIGURES[name]()}<!-- /figure -->"

    return MARKER.sub(replace, text), problems


def stale(root: Path = REPO) -> list[str]:
    """Where a document's figures are not what the results files say (or name no figure known)."""
    found = []
    for path in documents(root):
        text = path.read_text()
        new, problems = rendered(text)
        found += [f"{path.relative_to(root)}: {p}" for p in problems]
        if new != text:
            for old, now in zip(MARKER.finditer(text), MARKER.finditer(new), strict=True):
                if old.group(0) != now.group(0):
                    found.append(f"{path.relative_to(root)}: {old.group(1)}: {old.group(2)!r} -> {now.group(2)!r}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check; exit 1 where a figure is stale")
    args = parser.parse_args(argv)
    if args.check:
        problems = stale()
        for problem in problems:
            print(problem, file=sys.stderr)
        return 1 if problems else 0
    for path in documents():
        text = path.read_text()
        new, problems = rendered(text)
        for problem in problems:
            print(f"{path.relative_to(REPO)}: {problem}", file=sys.stderr)
        if new != text:
            path.write_text(new)
            print(f"rewrote the figures of {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
