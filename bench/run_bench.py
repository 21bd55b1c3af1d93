#!/usr/bin/env python3
"""Time ``traceguard analyze`` against the reference tools on scaled captures, in one run.

    python bench/run_bench.py --nsys bench/work/big.sqlite --kineto bench/work/kineto/rank0.trace.json \
        --shape copy-heavy=bench/work/shape_copies.sqlite ...

Measured (each command ``--repeat`` times, interleaved, in a fresh child process):

* nsys: ``nsys stats`` kernel + memory-size summaries (the reference),
  ``traceguard analyze BIG.sqlite --format json``, the same with ``--step-source inferred``
  (the markers ignored: what step inference costs end to end), and the stage costs inside one
  analysis (``STAGE_CODE``: step inference and the per-collective breakdown against the whole).
* shapes (``--shape NAME=PATH``, repeatable): other real captures scaled the same way, each a
  different mix (copies, NVTX ranges, CUDA graph nodes, ranks per file): ``nsys stats`` and the
  default ``traceguard analyze`` on each, with the same targets.
* Kineto: Holistic Trace Analysis (load + temporal breakdown + comm/comp overlap + kernel
  breakdown; the reference), plain ``json.load`` of the file, ``traceguard analyze BIG.json``.

Wall time is ``time.perf_counter`` around the child; peak RSS is the child's (and its waited-for
descendants') ``ru_maxrss``, taken by a small wrapper process so every measurement starts from
zero. Writes ``bench/RESULTS.md`` and ``bench/results.json``. Stdlib only.
"""

from __future__ import annotations

import argparse
import datetime as dt
import fcntl
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work"
VENV_PY = ROOT / ".venv" / "bin" / "python"
HTA_PY = WORK / "hta-venv" / "bin" / "python"

#: Targets from the issue.
NSYS_TIME_RATIO = 0.3  # traceguard wall ≤ 0.3 × nsys stats wall (issue 29; issue 13 asked 0.4)
NSYS_RSS_MB = 1024  # traceguard peak RSS < 1 GB (issue 13: the 10 M-kernel peak falls below 1 GB)
KINETO_TIME_RATIO = 0.2  # traceguard wall ≤ 0.2 × HTA wall
STAGE_SHARE = 0.10  # step inference, and the per-collective breakdown, each ≤ 10 % of the analysis

TG_MISSING = "traceguard CLI not available (no .venv/bin/traceguard, traceguard.cli not importable)"

#: Report names: nsys ≤ 2023.x spells them one way, 2024.x+ the other.
NSYS_REPORTS = (("gpukernsum", "gpumemsizesum"), ("cuda_gpu_kern_sum", "cuda_gpu_mem_size_sum"))

#: Run by the HTA venv's python: the comparable work (load + per-rank breakdowns).
HTA_CODE = """
import sys
from hta.trace_analysis import TraceAnalysis
a = TraceAnalysis(trace_dir=sys.argv[1])
tb = a.get_temporal_breakdown(visualize=False)
ov = a.get_comm_comp_overlap(visualize=False)
kb = a.get_gpu_kernel_breakdown(visualize=False)
print(tb.to_string()); print(ov.to_string()); print(len(kb[0]), "kernel types")
"""

#: Plain json.load of the trace (what any pure-Python reader pays at least).
JSON_LOAD_CODE = """
import json, sys
with open(sys.argv[1], "rb") as f:
    d = json.load(f)
print(len(d["traceEvents"]), "events")
"""

#: One analysis in-process with two stages timed: step inference (forced with ``--step-source``-like
#: sources) and the per-collective breakdown. Prints JSON seconds per stage and for the whole.
STAGE_CODE = """
import json, sys, time
from pathlib import Path
from traceguard.ingest import InputSpec, load_run
from traceguard.metrics import collectives, steps
from traceguard.metrics.run import analyse_run

spent = {"inferred_steps": 0.0, "collectives_breakdown": 0.0}

def timed(module, name, key):
    original = getattr(module, name)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            spent[key] += time.perf_counter() - t
    setattr(module, name, wrapper)

timed(steps, "inferred_steps", "inferred_steps")
timed(collectives, "breakdown", "collectives_breakdown")
sources = sys.argv[2].split(",") if len(sys.argv) > 2 and sys.argv[2] else None
t0 = time.perf_counter()
run = load_run([InputSpec(Path(sys.argv[1]))])
t1 = time.perf_counter()
result = analyse_run([(r.rank, r.capture) for r in run.ranks], step_sources=sources)
t2 = time.perf_counter()
print(json.dumps({
    "read_s": t1 - t0, "analyse_s": t2 - t1, "total_s": t2 - t0, **{k + "_s": v for k, v in spent.items()},
    "step_sources": sorted({str(r.step_source) for r in result.ranks}),
    "steps": sum(len(r.steps) for r in result.ranks),
}))
"""

#: Which reader traceguard's nsys integer columns go through.
READER_CODE = "from traceguard.ingest import nsys_sqlite as n; print('C' if n._int_scan else 'ADBC')"

#: Measures one command in a fresh process: prints {"wall": s, "maxrss_kb": kb, "rc": rc}.
MEASURE_CODE = """
import json, resource, subprocess, sys, time
out, err = open(sys.argv[1], "wb"), open(sys.argv[2], "wb")
t = time.perf_counter()
rc = subprocess.call(sys.argv[3:], stdout=out, stderr=err)
wall = time.perf_counter() - t
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
print(json.dumps({"wall": wall, "maxrss_kb": rss, "rc": rc}))
"""


def rel(path: Path) -> str:
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def sh(cmd: list[str], **kw) -> str:
    """Output of a quick fact-finding command ('' when it fails)."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kw).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def measure(cmd: list[str], log_stem: Path) -> dict:
    """Run ``cmd`` once in a fresh wrapper; stdout/stderr go to ``log_stem``.out/.err."""
    out, err = Path(f"{log_stem}.out"), Path(f"{log_stem}.err")
    load = os.getloadavg()[0]
    res = subprocess.run(
        [sys.executable, "-c", MEASURE_CODE, str(out), str(err), *cmd],
        capture_output=True,
        text=True,
        check=True,
    )
    m = json.loads(res.stdout.strip().splitlines()[-1])
    return {
        "wall_s": round(m["wall"], 3),
        "peak_rss_mb": round(m["maxrss_kb"] / 1024, 1),
        "rc": m["rc"],
        "loadavg_1m_before": round(load, 2),
        "stdout": rel(out),
        "stderr": rel(err),
    }


def scale_facts(path: Path) -> dict | None:
    """What ``scale_capture.py`` wrote next to the scaled file (source, its sha256, copies)."""
    side = Path(f"{path}.scale.json")
    return json.loads(side.read_text()) if side.exists() else None


def fingerprint(db: Path) -> tuple:
    st = db.stat()
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        schema = conn.execute("SELECT count(*), group_concat(name) FROM sqlite_master").fetchone()
    return (st.st_size, st.st_mtime_ns, *schema)


def nsys_report_names() -> tuple[str, str] | None:
    """The kernel/mem-size summary names this nsys knows (``nsys stats`` exits 0 on unknown names)."""
    text = sh(["nsys", "stats", "--help-reports"])
    for names in NSYS_REPORTS:
        if all(re.search(rf"^\s*{n}\b", text, re.M) for n in names):
            return names
    return None


def nsys_output_ok(stem: Path, names: tuple[str, str]) -> str | None:
    """Why an ``nsys stats`` run failed despite exit status 0, or None when both reports printed."""
    text = Path(f"{stem}.out").read_text(errors="replace") + Path(f"{stem}.err").read_text(errors="replace")
    if re.search(r"ERROR|could not be found|Traceback", text):
        line = next(ln for ln in text.splitlines() if re.search(r"ERROR|could not|Traceback", ln))
        return line.strip()
    if "Total Time (ns)" not in text or "Operation" not in text:
        return f"expected CSV of {names[0]} and {names[1]} not found in the output"
    return None


def traceguard_cmd() -> list[str] | None:
    """How to run the CLI: the installed entry point, else the module through the venv's python."""
    probe = subprocess.run([str(VENV_PY), "-c", "import traceguard.cli"], capture_output=True, cwd=ROOT)
    if probe.returncode != 0:
        return None
    exe = ROOT / ".venv" / "bin" / "traceguard"
    if exe.exists():
        return [str(exe)]
    # Not installed (`pip install -e .` not run yet): typer reads sys.argv[1:], as it would.
    code = f"import sys; sys.path.insert(0, {str(ROOT)!r}); from traceguard.cli import app; "
    return [str(VENV_PY), "-c", code + "sys.argv[0] = 'traceguard'; app()"]


def traceguard_output_ok(stem: Path, report: Path, run: dict) -> str | None:
    """Why a traceguard run does not count (None when it wrote a JSON report); notes its shape."""
    if not report.exists() or report.stat().st_size == 0:
        tail = Path(f"{stem}.err").read_text(errors="replace").strip().splitlines()[-3:]
        return "no report written" + (f": {' | '.join(tail)}" if tail else "")
    try:
        doc = json.loads(report.read_bytes())
    except ValueError as exc:
        return f"report is not JSON: {exc}"
    run["report_bytes"] = report.stat().st_size
    if isinstance(doc, dict):
        run["report_keys"] = sorted(doc)[:30]
    return None


def measure_traceguard(command: list[str], stem: Path) -> dict:
    """One ``traceguard analyze`` run writing its JSON report beside ``stem`` (:func:`measure`),
    its error when it did not count."""
    report = Path(f"{stem}.report.json")
    report.unlink(missing_ok=True)
    cmd = [*command, "--format", "json", "--out", str(report)]
    r = measure(cmd, stem)
    r["cmd"] = shlex.join(cmd)
    r["error"] = (f"exit status {r['rc']}" if r["rc"] else None) or traceguard_output_ok(stem, report, r)
    return r


def same_reports(logs: Path) -> str:
    """Whether the first default (sliced) run's JSON report equals the first whole-file run's,
    apart from ``generated_at``."""
    try:
        default, whole = (
            json.loads((logs / f"traceguard_nsys{kind}.0.report.json").read_bytes()) for kind in ("", "_whole")
        )
    except (OSError, ValueError) as exc:
        return f"not compared ({exc})"
    for doc in (default, whole):
        doc.pop("generated_at", None)
    return "identical" if default == whole else "DIFFERENT"


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("error") is None]
    walls = [r["wall_s"] for r in ok]
    rss = [r["peak_rss_mb"] for r in ok]
    if not ok:
        return {"ok": False, "error": runs[0].get("error") if runs else "not run", "runs": runs}
    return {
        "ok": True,
        "wall_min_s": min(walls),
        "wall_median_s": round(statistics.median(walls), 3),
        "rss_max_mb": max(rss),
        "rss_median_mb": round(statistics.median(rss), 1),
        "runs": runs,
    }


def source_digest() -> str:
    """Short hash of traceguard's sources: tells whether the code changed during a run."""
    h = hashlib.sha256()
    files = [*(ROOT / "traceguard").rglob("*.py"), *(ROOT / "traceguard").rglob("*.c")]
    for f in sorted(files):
        h.update(str(f.relative_to(ROOT)).encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:12]


def machine_facts(names: tuple[str, str] | None) -> dict:
    cpu = ""
    with open("/proc/cpuinfo") as fh:
        for line in fh:
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    mem_kb = 0
    with open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    hta_version = (
        sh([str(HTA_PY), "-c", "import importlib.metadata as m; print(m.version('HolisticTraceAnalysis'))"])
        if HTA_PY.exists()
        else ""
    )
    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "ram_gb": round(mem_kb / 1024**2, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "nsys": sh(["nsys", "--version"]),
        "nsys_reports": list(names) if names else None,
        "polars": sh([str(VENV_PY), "-c", "import polars; print(polars.__version__)"]),
        "traceguard": sh(
            [str(VENV_PY), "-c", "import importlib.metadata as m; print(m.version('traceguard'))"], cwd=ROOT
        ),
        "traceguard_git": sh(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]),
        "traceguard_git_dirty": bool(sh(["git", "-C", str(ROOT), "status", "--porcelain", "--", "traceguard"])),
        "traceguard_src_sha256": source_digest(),
        # Which reader the nsys integer columns went through (the C loop is optional at install).
        "traceguard_nsys_reader": sh([str(VENV_PY), "-c", READER_CODE], cwd=ROOT),
        "hta": hta_version,
        "hta_python": sh([str(HTA_PY), "--version"]) if HTA_PY.exists() else "",
    }


def count_nsys(db: Path) -> dict[str, int]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        return {
            t: conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
            for t in (
                "CUPTI_ACTIVITY_KIND_KERNEL",
                "CUPTI_ACTIVITY_KIND_MEMCPY",
                "CUPTI_ACTIVITY_KIND_MEMSET",
                "CUPTI_ACTIVITY_KIND_RUNTIME",
                "NVTX_EVENTS",
                "GPU_METRICS",
            )
            if t in tables
        }


def count_kineto(path: Path) -> int:
    """Number of trace events (counted as ``"ph":`` keys; no parse)."""
    n, tail = 0, b""
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 24):
            n += (tail + chunk).count(b'"ph":')
            tail = chunk[-4:]  # shorter than the pattern: nothing is counted twice
    return n


def warm_cache(path: Path) -> None:
    """Read the whole file (untimed) so the next command starts from a warm page cache.

    Done before every measured command, not once: these VMs run DAMON, which pages out file
    cache left idle for 30 s. ``nsys stats`` reads only the kernel and copy tables, so during its
    ~25 s run the API table's pages went cold and the next command read ~125 MB from disk
    (+1.5-3 s, measured with ``/usr/bin/time %I``)."""
    with path.open("rb") as fh:
        while fh.read(1 << 24):
            pass


def hta_dir_for(trace: Path) -> Path:
    """HTA reads every trace in a directory: give it one holding only this file."""
    d = WORK / "hta_trace"
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / trace.name).symlink_to(trace.resolve())
    return d


def baseline_cmd(tree: Path) -> list[str]:
    """The CLI of another checkout of traceguard (``git worktree add DIR REV``), run with this
    venv: the same machine and run measure the code before a change beside the code after it."""
    code = f"import sys; sys.path.insert(0, {str(tree)!r}); from traceguard.cli import app; "
    return [str(VENV_PY), "-c", code + "sys.argv[0] = 'traceguard'; app()"]


def compile_bytecode(tree: Path) -> bool:
    """Compile ``tree``'s traceguard package to bytecode, as ``pip install`` does for an installed
    package: an editable checkout is otherwise compiled from source on every start wherever
    ``PYTHONDONTWRITEBYTECODE`` is set (it is on these VMs: 114 modules, 0.25-0.3 s of every
    measured run). Python reads the files whatever that variable says. Whether it worked."""
    done = subprocess.run([str(VENV_PY), "-m", "compileall", "-q", str(tree / "traceguard")], capture_output=True)
    return done.returncode == 0


def tree_revision(tree: Path) -> str:
    try:
        return sh(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"]).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def bench_nsys(
    db: Path,
    repeat: int,
    logs: Path,
    tg: list[str] | None,
    baseline: Path | None = None,
    *,
    full: bool = True,
    prefix: str | None = None,
) -> dict:
    """nsys stats and traceguard on ``db``; ``full=False`` (the GPU metrics block, the shapes): the
    default analysis only, no whole-file / inferred / stage runs. ``prefix``: of the log files."""
    names = nsys_report_names()
    tools: dict[str, list[dict]] = {"nsys stats": [], "traceguard analyze": []}
    if full:
        tools |= {WHOLE: [], INFERRED: []}
    if prefix is None:
        prefix = "" if full else "metrics_"
    if baseline is not None:
        tools[BASELINE] = []
    stages: list[dict] = []
    notes: list[str] = []
    if names is None:
        notes.append("nsys stats: no kernel/mem-size summary report names known to this nsys")
    before = fingerprint(db)
    for i in range(repeat):
        if names:
            warm_cache(db)
            stem = logs / f"{prefix}nsys_stats.{i}"
            cmd = ["nsys", "stats", "--report", ",".join(names), "--format", "csv", "--output", "-"]
            cmd += ["--force-export=false", str(db)]
            r = measure(cmd, stem)
            r["cmd"] = shlex.join(cmd)
            r["error"] = nsys_output_ok(stem, names) or (f"exit status {r['rc']}" if r["rc"] else None)
            tools["nsys stats"].append(r)
            print(f"  nsys stats #{i}: {r['wall_s']:.1f} s, {r['peak_rss_mb']:.0f} MB {r['error'] or ''}")
            if fingerprint(db) != before:
                notes.append("nsys stats modified the input file (see fingerprints)")
        if tg:
            runs = [("traceguard analyze", f"{prefix}traceguard_nsys", [], tg)]
            if full:
                runs += [
                    (WHOLE, "traceguard_nsys_whole", ["--sliced-above", "1T"], tg),
                    (INFERRED, "traceguard_nsys_inferred", ["--step-source", "inferred"], tg),
                ]
            if baseline is not None:
                runs.insert(1, (BASELINE, "traceguard_nsys_baseline", [], baseline_cmd(baseline)))
            for tool, stem_name, extra, command in runs:
                warm_cache(db)
                r = measure_traceguard([*command, "analyze", str(db), *extra], logs / f"{stem_name}.{i}")
                tools[tool].append(r)
                print(f"  {tool} #{i}: {r['wall_s']:.1f} s, {r['peak_rss_mb']:.0f} MB {r['error'] or ''}")
            for sources in ("", "inferred") if full else ():
                warm_cache(db)
                stem = logs / f"stages_{sources or 'default'}.{i}"
                r = measure([str(VENV_PY), "-c", STAGE_CODE, str(db), sources], stem)
                try:
                    stage = json.loads(Path(f"{stem}.out").read_text())
                except (OSError, ValueError):
                    stage = {"error": f"exit status {r['rc']}; see {rel(Path(f'{stem}.err'))}"}
                stages.append({"sources": sources or "default", **stage})
                print(f"  stages ({sources or 'default'}) #{i}: {stage}")
    if tg and repeat and full:
        notes.append(f"the default's report and the whole-file one, apart from generated_at: {same_reports(logs)}")
    if not tg:
        tools["traceguard analyze"].append({"error": TG_MISSING})
        tools.pop(INFERRED, None)
        tools.pop(WHOLE, None)
    after = fingerprint(db)
    if baseline is not None:
        notes.append(f"baseline: {BASELINE} is the checkout {baseline} at {tree_revision(baseline)}")
    return {
        "input": rel(db),
        "size_mb": round(db.stat().st_size / 1e6),
        "rows": count_nsys(db),
        "input_unmodified": before == after,
        "scaled_from": scale_facts(db),
        "tools": {k: summarize(v) for k, v in tools.items()},
        "stages": summarize_stages(stages),
        "notes": notes,
    }


#: The default analysis by another checkout (``--baseline``): the cost of a change, in the same run.
BASELINE = "traceguard analyze (baseline checkout)"
#: How much slower than the baseline the default analysis may be.
BASELINE_GROWTH = 0.10

#: The second traceguard command of the nsys block: the same analysis with the markers ignored.
INFERRED = "traceguard analyze --step-source inferred"
#: The same analysis with the whole export in memory (the default slices exports from 1 GiB on):
#: what the default's time is set beside (issue 13: it must not get slower).
WHOLE = "traceguard analyze --sliced-above 1T (whole file)"


def summarize_stages(stages: list[dict]) -> dict:
    """Median seconds per stage, per step-source setting, and each stage's share of the analysis
    (read + analyse) it ran in; the verdict against ``STAGE_SHARE``."""
    out: dict = {"runs": stages}
    for sources in ("default", "inferred"):
        ok = [s for s in stages if s["sources"] == sources and "error" not in s]
        if not ok:
            continue
        median = {k: round(statistics.median(s[k] for s in ok), 3) for k in ok[0] if k.endswith("_s")}
        median["step_sources"] = ok[0]["step_sources"]
        median["steps"] = ok[0]["steps"]
        out[sources] = median
    if "inferred" in out:
        share = out["inferred"]["inferred_steps_s"] / out["inferred"]["total_s"]
        out["inference_share"] = round(share, 4)
        out["inference_pass"] = share <= STAGE_SHARE
    if "default" in out:
        share = out["default"]["collectives_breakdown_s"] / out["default"]["total_s"]
        out["breakdown_share"] = round(share, 4)
        out["breakdown_pass"] = share <= STAGE_SHARE
    return out


def bench_kineto(trace: Path, repeat: int, logs: Path, tg: list[str] | None) -> dict:
    tools: dict[str, list[dict]] = {"HTA": [], "json.load": [], "traceguard analyze": []}
    notes: list[str] = []
    hta_dir = hta_dir_for(trace) if HTA_PY.exists() else None
    if hta_dir is None:
        notes.append(f"HTA venv missing ({HTA_PY}); see bench/README.md")
    for i in range(repeat):
        if hta_dir:
            warm_cache(trace)
            stem = logs / f"hta.{i}"
            cmd = [str(HTA_PY), "-c", HTA_CODE, str(hta_dir)]
            r = measure(cmd, stem)
            r["cmd"] = f"{HTA_PY} -c <HTA_CODE> {hta_dir}"
            r["error"] = f"exit status {r['rc']}" if r["rc"] else None
            tools["HTA"].append(r)
            print(f"  HTA #{i}: {r['wall_s']:.1f} s, {r['peak_rss_mb']:.0f} MB {r['error'] or ''}")
        warm_cache(trace)
        stem = logs / f"json_load.{i}"
        cmd = [str(VENV_PY), "-c", JSON_LOAD_CODE, str(trace)]
        r = measure(cmd, stem)
        r["cmd"] = f"{VENV_PY} -c <json.load> {trace}"
        r["error"] = f"exit status {r['rc']}" if r["rc"] else None
        tools["json.load"].append(r)
        print(f"  json.load #{i}: {r['wall_s']:.1f} s, {r['peak_rss_mb']:.0f} MB {r['error'] or ''}")
        if tg:
            warm_cache(trace)
            r = measure_traceguard([*tg, "analyze", str(trace)], logs / f"traceguard_kineto.{i}")
            tools["traceguard analyze"].append(r)
            print(f"  traceguard #{i}: {r['wall_s']:.1f} s, {r['peak_rss_mb']:.0f} MB {r['error'] or ''}")
    if not tg:
        tools["traceguard analyze"].append({"error": TG_MISSING})
    return {
        "input": rel(trace),
        "size_mb": round(trace.stat().st_size / 1e6),
        "rows": {"traceEvents": count_kineto(trace)},
        "scaled_from": scale_facts(trace),
        "tools": {k: summarize(v) for k, v in tools.items()},
        "notes": notes,
    }


def verdicts(res: dict) -> list[dict]:
    """One table row per tool: ratio vs the reference (median walls) and pass/fail of the targets."""
    rows = []
    kinds = [
        ("nsys", "nsys stats", NSYS_TIME_RATIO, NSYS_RSS_MB),
        ("nsys_metrics", "nsys stats", NSYS_TIME_RATIO, NSYS_RSS_MB),
        *((f"shape:{name}", "nsys stats", NSYS_TIME_RATIO, NSYS_RSS_MB) for name in res.get("shapes", {})),
        ("kineto", "HTA", KINETO_TIME_RATIO, None),
    ]
    for kind, ref_name, ratio_target, rss_target in kinds:
        block = block_of(res, kind)
        if not block:
            continue
        ref = block["tools"].get(ref_name, {})
        for tool, s in block["tools"].items():
            row = {"kind": kind, "tool": tool, **{k: v for k, v in s.items() if k != "runs"}}
            if s.get("ok") and ref.get("ok") and tool != ref_name:
                row["ratio"] = round(s["wall_median_s"] / ref["wall_median_s"], 3)
            if tool == WHOLE and block["tools"]["traceguard analyze"].get("ok") and s.get("ok"):
                base = s["wall_median_s"]
                change = block["tools"]["traceguard analyze"]["wall_median_s"] / base - 1
                row["target"] = f"the default (sliced) against it: {change:+.1%} wall"
            if tool == BASELINE and block["tools"]["traceguard analyze"].get("ok") and s.get("ok"):
                growth = block["tools"]["traceguard analyze"]["wall_median_s"] / s["wall_median_s"] - 1
                row["target"] = f"the default against it: ≤ +{BASELINE_GROWTH:.0%} wall (measured {growth:+.1%})"
                row["pass"] = growth <= BASELINE_GROWTH
            if tool == INFERRED and block["tools"]["traceguard analyze"].get("ok") and s.get("ok"):
                base = block["tools"]["traceguard analyze"]["wall_median_s"]
                extra = s["wall_median_s"] / base - 1
                row["target"] = f"≤ +{STAGE_SHARE:.0%} over traceguard analyze (measured {extra:+.1%})"
                row["pass"] = extra <= STAGE_SHARE
            if tool == "traceguard analyze":
                target = f"wall ≤ {ratio_target}× {ref_name}"
                time_ok = bool(s.get("ok") and "ratio" in row and row["ratio"] <= ratio_target)
                ok = time_ok
                if rss_target:
                    target += f", peak RSS < {rss_target} MB"
                    rss_ok = s["rss_max_mb"] < rss_target
                    ok = ok and rss_ok
                    row["part"] = f"time {'PASS' if time_ok else 'FAIL'}, RSS {'PASS' if rss_ok else 'FAIL'}"
                plain = (res.get("nsys") or {}).get("tools", {}).get("traceguard analyze", {})
                if kind == "nsys_metrics" and plain.get("ok") and s.get("ok"):
                    cost = s["wall_median_s"] - plain["wall_median_s"]
                    target += f" (the GPU metrics cost {cost:+.2f} s over the same capture without them)"
                row["target"] = target
                row["pass"] = bool(ok) if s.get("ok") and ref.get("ok") else None
            rows.append(row)
    return rows


def block_of(res: dict, kind: str) -> dict | None:
    """The measured block of a verdict's kind (``shape:NAME`` for a shape)."""
    if kind.startswith("shape:"):
        return res.get("shapes", {}).get(kind.removeprefix("shape:"))
    return res.get(kind)


def fmt_rows(block: dict) -> str:
    rows = block["rows"]
    if "CUPTI_ACTIVITY_KIND_KERNEL" in rows:
        return f"{rows['CUPTI_ACTIVITY_KIND_KERNEL'] / 1e6:.2f} M kernels ({block['size_mb']} MB)"
    return f"{rows['traceEvents'] / 1e6:.2f} M events ({block['size_mb']} MB)"


#: The streaming benchmark of NCCL Inspector logs (bench/inspector_stream.py), run apart by hand.
INSPECTOR_STREAM = HERE / "inspector_stream.json"


def inspector_stream_section(source: Path = INSPECTOR_STREAM) -> list[str]:
    """RESULTS.md's section on streaming NCCL Inspector logs: the numbers of
    ``bench/inspector_stream.json`` as they are (not measured by this script); none if it is absent."""
    try:
        doc = json.loads(source.read_text())
    except (OSError, ValueError):
        return []
    ours, plain = doc["traceguard"], doc["json_loads"]
    git = doc.get("traceguard_git") or "n/a"
    if doc.get("traceguard_git_dirty"):
        git += " + uncommitted changes"
    return [
        "",
        "## Streaming NCCL Inspector logs",
        "",
        f"Copied from `bench/{source.name}` (`bench/inspector_stream.py`, run apart; details in "
        f"`bench/INSPECTOR_STREAM.md`): measured {doc.get('date_utc') or 'n/a'} UTC, traceguard git {git}, "
        f"{doc.get('cpus') or '?'} CPUs. Input: {doc['lines']:,} Inspector JSON lines "
        f"({doc['bytes'] / 1e9:.2f} GB, two ranks, a scaled copy of real dumps). Each reader in a fresh process; "
        "peak RSS is the process's own.",
        "",
        "| reader | lines | wall s | lines/s | peak RSS MB |",
        "|---|---|---|---|---|",
        f"| traceguard `read_inspector` (compact rows kept) | {ours['lines']:,} | {ours['read_s']:.1f} | "
        f"**{ours['lines_per_s']:,.0f}** | {ours['peak_rss_after_read_mb']:,.0f} |",
        f"| plain `json.loads` per line (nothing kept) | {plain['lines']:,} | {plain['read_s']:.1f} | "
        f"{plain['lines_per_s']:,.0f} | {plain['peak_rss_mb']:,.0f} |",
        f"| traceguard `analyse_inspector` on those rows | {ours['lines']:,} | {ours['analyse_s']:.1f} | "
        f"{ours['lines'] / ours['analyse_s']:,.0f} | {ours['peak_rss_mb']:,.0f} (whole process) |",
        "",
        f"traceguard's reader: {ours['lines_per_s'] / plain['lines_per_s']:.2f}× the lines a second of `json.loads`.",
    ]


def _bytecode_note(machine: dict) -> str:
    compiled = machine.get("bytecode_compiled")
    if compiled is None:  # results from before the script compiled it
        return ""
    if compiled:
        return " traceguard's modules compiled to bytecode first, as `pip install` leaves them."
    return " traceguard's modules could NOT be compiled to bytecode first: each run compiled them (+0.3 s)."


def write_markdown(res: dict, path: Path, *, inspector_stream: Path = INSPECTOR_STREAM) -> None:
    m = res["machine"]
    lines = [
        "# traceguard benchmark results",
        "",
        "Generated by `bench/run_bench.py` (see `bench/README.md`); do not edit by hand.",
        "",
        f"- Date (UTC): {m['date_utc']}; {m['nproc']} CPUs ({m['cpu_model']}), {m['ram_gb']} GB RAM, "
        f"Linux {m['kernel']}",
        f"- nsys: {m['nsys']} (reports: {', '.join(m['nsys_reports'] or ['none'])}); "
        f"HTA {m['hta'] or 'n/a'} ({m['hta_python']}); traceguard {m['traceguard'] or 'n/a'} "
        f"(git {m['traceguard_git'] or 'n/a'}{' + uncommitted changes' if m['traceguard_git_dirty'] else ''}, "
        f"sources sha256 {m['traceguard_src_sha256']}; nsys integer reader: "
        f"{m.get('traceguard_nsys_reader') or 'n/a'}); polars {m['polars']}; Python {m['python']}; "
        f"SQLite {m['sqlite']}",
        f"- Each command run {res['repeat']}× (interleaved), fresh process each time, "
        "right after an untimed read of its input (warm page cache). "
        "Wall: min / median. Peak RSS: max over runs. Ratio: median wall / reference median wall." + _bytecode_note(m),
        "",
        "| tool | input | wall s (min / median) | peak RSS MB | ratio vs ref | target | pass |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in res["verdicts"]:
        block = block_of(res, row["kind"])
        assert block is not None
        ref = " (reference)" if row["tool"] in ("nsys stats", "HTA") else ""
        if row.get("ok"):
            wall = f"{row['wall_min_s']:.2f} / {row['wall_median_s']:.2f}"
            rss = f"{row['rss_max_mb']:.0f}"
        else:
            wall, rss = "—", "—"
        ratio = f"{row['ratio']:.3f}×" if "ratio" in row else "—"
        passed = {True: "**PASS**", False: "**FAIL**", None: "n/a"}[row.get("pass")] if "target" in row else ""
        if row.get("part") and row.get("pass") is False:
            passed += f" ({row['part']})"
        err = " (error, see below)" if not row.get("ok") else ""
        label = f"{row['tool']} · with GPU metrics" if row["kind"] == "nsys_metrics" else row["tool"]
        if row["kind"].startswith("shape:"):
            label = f"{row['tool']} · shape {row['kind'].removeprefix('shape:')}"
        lines.append(
            f"| {label}{ref}{err} | {fmt_rows(block)} | {wall} | {rss} | {ratio} | {row.get('target', '')} | {passed} |"
        )
    stages = res.get("nsys", {}).get("stages", {})
    if "default" in stages or "inferred" in stages:
        lines += [
            "",
            "Stage costs inside one whole-file analysis of the nsys file (in-process, the file read into "
            "memory at once; median seconds; share = stage ÷ "
            f"read + analyse; target ≤ {STAGE_SHARE:.0%} each):",
            "",
            "| steps from | read s | analyse s | step inference s | per-collective breakdown s | steps |",
            "|---|---|---|---|---|---|",
        ]
        for sources in ("default", "inferred"):
            if sources in stages:
                s = stages[sources]
                lines.append(
                    f"| {', '.join(s['step_sources'])} | {s['read_s']:.2f} | {s['analyse_s']:.2f} | "
                    f"{s['inferred_steps_s']:.3f} | {s['collectives_breakdown_s']:.3f} | {s['steps']:,} |"
                )
        for key, label in (("inference", "step inference"), ("breakdown", "per-collective breakdown")):
            if f"{key}_share" in stages:
                verdict = "**PASS**" if stages[f"{key}_pass"] else "**FAIL**"
                lines.append(f"- {label}: {stages[f'{key}_share']:.1%} of the analysis — {verdict}")
    lines += ["", "Rows per table:", ""]
    for kind in ("nsys", "nsys_metrics", *(f"shape:{n}" for n in res.get("shapes", {})), "kineto"):
        if (b := block_of(res, kind)) is not None:
            if kind.startswith("shape:"):
                lines.append(f"- shape **{kind.removeprefix('shape:')}**:")
            counts = ", ".join(f"{k} {v:,}" for k, v in b["rows"].items())
            lines.append(f"- `{Path(b['input']).name}` ({b['size_mb']} MB): {counts}")
            if b.get("scaled_from"):
                sf = b["scaled_from"]
                lines.append(
                    f"  - scaled from `{sf['source']}` (sha256 {sf['source_sha256'][:12]}…), "
                    f"{sf['copies']} copies, built in {sf['build_s']} s"
                )
                if sf.get("gpu_metrics_rows"):
                    lines.append(
                        f"  - GPU metrics: the real samples of `{sf['gpu_metrics_source']}` (sha256 "
                        f"{sf['gpu_metrics_source_sha256'][:12]}…) at {sf['gpu_metrics_hz']} Hz, tiled "
                        f"{sf['gpu_metrics_tiles']} times over the timeline: {sf['gpu_metrics_rows']:,} rows, "
                        f"added in {sf['gpu_metrics_build_s']} s"
                    )
            if "input_unmodified" in b:
                lines.append(f"  - `nsys stats` left the file unmodified: {b['input_unmodified']}")
            lines += [f"  - note: {n}" for n in b["notes"]]
            for tool, s in b["tools"].items():
                if not s.get("ok"):
                    lines.append(f"  - {tool}: {s.get('error')}")
    lines += [f"- **note: {n}**" for n in res["notes"]]
    lines += [
        "",
        "Other processes running on the machine during the run raise the 1-minute load average "
        "recorded per run in `results.json` (`loadavg_1m_before`); on 2 CPUs anything above ~0.5 "
        "before a run means the timing is pessimistic.",
    ]
    lines += [*inspector_stream_section(inspector_stream), ""]
    path.write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nsys", type=Path, help="scaled nsys SQLite export (bench/scale_capture.py nsys)")
    ap.add_argument(
        "--nsys-metrics",
        type=Path,
        help="the same scaled export with GPU metrics added (bench/scale_capture.py gpu-metrics)",
    )
    ap.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="another scaled nsys export, a different mix of events (repeatable)",
    )
    ap.add_argument("--kineto", type=Path, help="scaled Kineto JSON (bench/scale_capture.py kineto)")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--results", type=Path, default=HERE / "results.json")
    ap.add_argument("--markdown", type=Path, default=HERE / "RESULTS.md")
    ap.add_argument("--logs", type=Path, default=WORK / "logs")
    ap.add_argument(
        "--baseline",
        type=Path,
        help="another checkout of traceguard (git worktree add DIR REV) whose default analysis is measured beside",
    )
    args = ap.parse_args(argv)
    if not args.nsys and not args.kineto and not args.shape:
        ap.error("give --nsys, --shape and/or --kineto")
    shapes = {}
    for item in args.shape:
        name, sep, path = item.partition("=")
        if not sep or not name or not Path(path).is_file():
            ap.error(f"--shape {item!r}: give NAME=PATH of a scaled nsys export")
        shapes[name] = Path(path)
    args.logs.mkdir(parents=True, exist_ok=True)
    # Two runs at once on 2 cores would time each other (and share logs/ and hta_trace/).
    lock = (WORK / ".run_bench.lock").open("w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        sys.exit("another run_bench.py is running (bench/work/.run_bench.lock); wait for it to finish")
    tg = traceguard_cmd()
    names = nsys_report_names()
    res: dict = {"repeat": args.repeat, "machine": machine_facts(names), "traceguard_cmd": tg}
    res["machine"]["bytecode_compiled"] = all(
        compile_bytecode(tree) for tree in (ROOT, *([args.baseline.resolve()] if args.baseline else []))
    )
    t0 = time.perf_counter()
    if args.nsys:
        print(f"nsys: {args.nsys}")
        baseline = args.baseline.resolve() if args.baseline else None
        res["nsys"] = bench_nsys(args.nsys.resolve(), args.repeat, args.logs, tg, baseline)
    if args.nsys_metrics:
        print(f"nsys with GPU metrics: {args.nsys_metrics}")
        res["nsys_metrics"] = bench_nsys(args.nsys_metrics.resolve(), args.repeat, args.logs, tg, full=False)
    for name, path in shapes.items():
        print(f"shape {name}: {path}")
        res.setdefault("shapes", {})[name] = bench_nsys(
            path.resolve(), args.repeat, args.logs, tg, full=False, prefix=f"shape_{name}_"
        )
    if args.kineto:
        print(f"kineto: {args.kineto}")
        res["kineto"] = bench_kineto(args.kineto.resolve(), args.repeat, args.logs, tg)
    res["verdicts"] = verdicts(res)
    res["notes"] = []
    if source_digest() != res["machine"]["traceguard_src_sha256"]:
        res["notes"].append("traceguard's source changed during the run: the numbers mix versions; rerun")
    res["bench_wall_s"] = round(time.perf_counter() - t0, 1)
    args.results.write_text(json.dumps(res, indent=2) + "\n")
    write_markdown(res, args.markdown)
    print(args.markdown.read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
