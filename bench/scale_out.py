#!/usr/bin/env python3
"""Ranks one by one vs a whole run analysed together, serially, on a local pool, on Dask, in one run.

::

    python bench/make_run.py --ranks 64 --out bench/work/run64                       # ~15 s, 1.7 GB
    python bench/make_run.py --ranks 4 --kernels-per-rank 3100000 --out bench/work/run4x3m
    python bench/scale_out.py --run bench/work/run64 --run bench/work/run4x3m --repeat 2

For every run directory (made by ``make_run.py``; its ``manifest.json`` names each rank file and
its rank) these cases are measured, each command in a fresh process:

``one by one``
    ``traceguard analyze FILE:RANK --scheduler serial --format json`` for each rank file in turn.
    Wall = the sum of the per-rank walls; peak RSS = the largest per-rank peak ("the largest
    single rank", the denominator of the memory ratios).
``together, serial``
    ``traceguard analyze RUN_DIR --scheduler serial``: every rank in one process, one after the
    other (the behaviour before the map/reduce; for reference).
``together, local``
    ``--scheduler local``: the map on a process pool of ``--jobs`` processes (default: all cores).
``together, dask``
    ``--scheduler tcp://…`` on a dask.distributed cluster of ``--dask-workers`` workers (one
    ``dask scheduler`` process and ``dask worker --nworkers 1 --nthreads 1`` processes, each a nanny
    and its worker process, started before and kept up across the repeats, as a cluster is in
    use). The workers are restarted before each dask case (a worker process keeps the memory of the
    largest task it ran, which would be charged to the next case), so every dask case includes the
    workers' import of traceguard, as every local pool's does.

Wall is ``time.perf_counter`` around the command. Memory is sampled every ``--poll-ms`` (50 ms)
from ``/proc`` through psutil over the whole process tree: the command and all its descendants,
and for ``dask`` also the scheduler, nannies and workers. Two peaks are kept:
``tree`` = the largest sum of RSS over all those processes at one sample, and ``process`` = the
largest RSS any single process reached. Sampling can miss a peak shorter than the interval;
the ``process`` figure is checked against the kernel's own high-water mark (``VmHWM``) of each
process read at its last sample.

Before every command the inputs it reads are read once, untimed, so each command starts from a
warm page cache (the VM pages out file cache idle for 30 s), and the 1-minute load average is
recorded: on 2 shared cores anything above ~0.5 means another process competed for the CPU.

The reports of the together cases (JSON) must be identical apart from ``generated_at``: this is
checked over all together cases and repeats, and the first differing paths are listed if not.

Writes ``bench/SCALE_OUT.md`` and ``bench/scale_out.json``; command output and reports go to
``bench/work/scale_out/``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import itertools
import json
import os
import platform
import socket
import statistics
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / "work" / "scale_out"
VENV_BIN = ROOT / ".venv" / "bin"
TRACEGUARD = VENV_BIN / "traceguard"
DASK = VENV_BIN / "dask"

#: Targets of issue 13 (2 cores): together ≤ 0.85 × the wall of the ranks one by one, and peak
#: RSS ≤ 1.5 × the peak RSS of the largest single rank, whatever the rank count.
TIME_RATIO = 0.85
RSS_RATIO = 1.5
#: Cases the targets apply to (serial together is the reference for today's behaviour).
TARGET_CASES = ("local", "dask")
#: Keys of a report that legitimately differ between two analyses of the same inputs.
PER_RUN_KEYS = ("generated_at",)


# -- measurement --------------------------------------------------------------------------------


@dataclass
class TreeSampler:
    """Poll RSS over the process trees rooted at ``roots`` every ``interval`` s, in a thread."""

    roots: list[int]
    interval: float = 0.05
    tree_peak: int = 0
    #: The largest Σ PSS over the tree at one sample: each shared page (the interpreter's and
    #: Polars' libraries, mapped by every process) counted once, split among its sharers.
    tree_pss_peak: int = 0
    process_peak: int = 0
    process_peak_name: str = ""
    samples: int = 0
    hwm: dict[int, tuple[str, int]] = field(default_factory=dict)
    peaks: dict[int, tuple[str, int]] = field(default_factory=dict)
    names: dict[int, str] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> TreeSampler:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()

    def add_root(self, pid: int) -> None:
        self.roots = [*self.roots, pid]

    def _procs(self) -> list[psutil.Process]:
        out: dict[int, psutil.Process] = {}
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                out[pid] = root
                for child in root.children(recursive=True):
                    out[child.pid] = child
            except psutil.Error:
                continue
        return list(out.values())

    def sample(self) -> None:
        total = pss_total = 0
        for proc in self._procs():
            try:
                pss_total += _pss(proc.pid)
                rss = proc.memory_info().rss
                name = self.names.get(proc.pid) or self._name(proc)
                hwm = _vm_hwm(proc.pid)
            except psutil.Error:
                continue
            total += rss
            if rss > self.peaks.get(proc.pid, ("", 0))[1]:
                self.peaks[proc.pid] = (name, rss)
            if rss > self.process_peak:
                self.process_peak, self.process_peak_name = rss, name
            if hwm:
                self.hwm[proc.pid] = (name, hwm)
        self.tree_peak = max(self.tree_peak, total)
        self.tree_pss_peak = max(self.tree_pss_peak, pss_total)
        self.samples += 1

    def _name(self, proc: psutil.Process) -> str:
        """A short label: the command line's tail, and which root the process descends from."""
        name = " ".join(proc.cmdline()[:4])[-60:] or proc.name()
        if proc.pid not in self.roots:
            parents = {p.pid for p in proc.parents()}
            root = next((r for r in self.roots if r in parents), None)
            name = f"{name} (under pid {root})" if root else name
        self.names[proc.pid] = name
        return name

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    @property
    def hwm_peak(self) -> int:
        """Largest kernel high-water mark (VmHWM) of any process seen, at its last sample."""
        return max((v for _, v in self.hwm.values()), default=0)


def _proc_kib(pid: int, name: str, key: str) -> int:
    """The ``key:`` line (kB) of ``/proc/PID/<name>``, in bytes; 0 when the process is gone."""
    try:
        with open(f"/proc/{pid}/{name}") as fh:
            for line in fh:
                if line.startswith(f"{key}:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _vm_hwm(pid: int) -> int:
    """The kernel's high-water mark of the process's RSS (``VmHWM``), in bytes."""
    return _proc_kib(pid, "status", "VmHWM")


def _pss(pid: int) -> int:
    """The process's proportional set size (shared pages split among their sharers), in bytes."""
    return _proc_kib(pid, "smaps_rollup", "Pss")


def tree_cpu_s(roots: list[int]) -> float:
    """CPU seconds (user + system, with reaped children's) of the processes under ``roots`` so far."""
    total = 0.0
    for pid in roots:
        try:
            root = psutil.Process(pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            continue
        for proc in procs:
            try:
                t = proc.cpu_times()
            except psutil.Error:
                continue
            total += t.user + t.system + t.children_user + t.children_system
    return total


def warm(paths: list[Path]) -> None:
    """Read the files once (untimed) so the command starts from a warm page cache."""
    for path in paths:
        with path.open("rb") as fh:
            while fh.read(1 << 24):
                pass


def run_measured(cmd: list[str], log_stem: Path, *, extra_roots: list[int] = (), interval: float) -> dict:
    """Run ``cmd``; wall, and RSS peaks over its tree plus ``extra_roots``' trees."""
    log_stem.parent.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    cluster_cpu0 = tree_cpu_s(list(extra_roots))
    with open(f"{log_stem}.out", "wb") as out, open(f"{log_stem}.err", "wb") as err:
        sampler = TreeSampler(list(extra_roots), interval)
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, cwd=ROOT)
        sampler.add_root(proc.pid)
        sampler.start()
        # wait4, not Popen.wait: the rusage gives the command's own high-water mark from the
        # kernel (its reaped children's included), so a peak between two samples still counts.
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        sampler.stop()
    root_hwm = usage.ru_maxrss * 1024
    # CPU seconds: the command's and its reaped descendants' (a local pool's workers), plus what the
    # extra roots (a Dask cluster, restarted before, so no other work) spent meanwhile. Unlike the
    # wall, hardly changed by other processes competing for the cores.
    cpu = usage.ru_utime + usage.ru_stime + (tree_cpu_s(list(extra_roots)) - cluster_cpu0)
    return {
        "cmd": " ".join(cmd),
        "rc": rc,
        "wall_s": round(wall, 3),
        "cpu_s": round(cpu, 3),
        "tree_peak_mb": round(sampler.tree_peak / 1e6, 1),
        "tree_pss_peak_mb": round(sampler.tree_pss_peak / 1e6, 1),
        "process_peak_mb": round(max(sampler.process_peak, sampler.hwm_peak, root_hwm) / 1e6, 1),
        "process_peak_sampled_mb": round(sampler.process_peak / 1e6, 1),
        "process_peak_name": sampler.process_peak_name,
        "hwm_peak_mb": round(sampler.hwm_peak / 1e6, 1),
        "command_maxrss_mb": round(root_hwm / 1e6, 1),
        "samples": sampler.samples,
        # The largest processes: which one holds the memory (client, pool or Dask worker).
        "processes": [
            {"name": name, "peak_mb": round(peak / 1e6, 1)}
            for name, peak in sorted(sampler.peaks.values(), key=lambda v: -v[1])[:6]
        ],
        "loadavg_1m_before": round(load, 2),
    }


# -- what travels, and the reduce ----------------------------------------------------------------

#: Run in a fresh process on one run directory: (1) the map of its first rank file, in this
#: process, and the size of what that task sends back (``MapOutcome``, pickled as a pool or Dask
#: sends it); (2) the whole analysis with ``--scheduler serial`` and the time from the last map's end
#: to the end of ``analyze`` (the reduce: run metrics, cross-rank checks, the report's data).
TRAVEL_CODE = """
import json, pickle, sys, time
from pathlib import Path
from traceguard.ingest import InputSpec
from traceguard.mapreduce import MapOptions, MapTask, map_input, plan
from traceguard.pipeline import analyze

run = Path(sys.argv[1])
manifest = json.loads((run / "manifest.json").read_text())
first = manifest["captures"][0]
spec = InputSpec(run / first["path"], int(first["rank"]), "argument")
assignments, _ = plan([spec])
t0 = time.perf_counter()
outcome = map_input(MapTask(0, spec, assignments[0], int(manifest["ranks"]), MapOptions()))
map_s = time.perf_counter() - t0
blob = pickle.dumps(outcome, protocol=pickle.HIGHEST_PROTOCOL)
del outcome
if len(sys.argv) > 2 and sys.argv[2] == "--map-only":
    print(json.dumps({"first_rank_map_s": round(map_s, 3), "outcome_pickled_bytes": len(blob)}))
    raise SystemExit(0)
marks = []
t0 = time.perf_counter()
analysis = analyze([str(run)], scheduler="serial", on_ranks=lambda done, total: marks.append(time.perf_counter()))
end = time.perf_counter()
print(json.dumps({
    "first_rank_map_s": round(map_s, 3),
    "outcome_pickled_bytes": len(blob),
    "analyze_s": round(end - t0, 3),
    "last_map_at_s": round(marks[-1] - t0, 3),
    "reduce_s": round(end - marks[-1], 3),
}))
"""


def measure_travel(run: Path, work: Path, *, map_only: bool = False) -> dict:
    """:data:`TRAVEL_CODE` on ``run`` in a fresh process (not timed against the other cases)."""
    work.mkdir(parents=True, exist_ok=True)
    warm([p for p, _ in _rank_files(run)])
    res = subprocess.run(
        [str(VENV_BIN / "python"), "-c", TRAVEL_CODE, str(run), *(["--map-only"] if map_only else [])],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=_clean_env(),
    )
    (work / "travel.err").write_text(res.stderr)
    if res.returncode != 0:
        return {"error": res.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(res.stdout.strip().splitlines()[-1])


# -- the dask cluster ---------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _clean_env() -> dict[str, str]:
    """This environment without the Dask scheduler variable (every case names its scheduler)."""
    return {k: v for k, v in os.environ.items() if k != "TRACEGUARD_DASK_SCHEDULER"}


class DaskCluster:
    """``dask scheduler`` + ``workers`` × ``dask worker --nworkers 1 --nthreads 1`` on this host."""

    def __init__(self, workers: int, logs: Path) -> None:
        self.workers = workers
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []
        self.address = ""
        self.start_s = 0.0
        self.idle_tree_mb = 0.0

    def start(self) -> DaskCluster:
        from distributed import Client

        self.logs.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        port = _free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        env = _clean_env()
        cmds = [[str(DASK), "scheduler", "--host", "127.0.0.1", "--port", str(port), "--no-dashboard"]]
        cmds += [
            [
                str(DASK),
                "worker",
                self.address,
                "--nworkers",
                "1",
                "--nthreads",
                "1",
                "--no-dashboard",
                "--name",
                f"worker{i}",
            ]
            for i in range(self.workers)
        ]
        for i, cmd in enumerate(cmds):
            with open(self.logs / f"dask{i}.log", "wb") as log:
                self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=ROOT))
            if i == 0:
                time.sleep(1.0)  # the scheduler listens before the workers dial it
        with Client(self.address, timeout=60) as client:
            client.wait_for_workers(self.workers, timeout=120)
        self.start_s = time.perf_counter() - t0
        time.sleep(1.0)
        sampler = TreeSampler(self.pids)
        sampler.sample()
        self.idle_tree_mb = round(sampler.tree_peak / 1e6, 1)
        return self

    def restart(self) -> None:
        """Fresh worker processes (through their nannies), as every local pool is fresh: a worker's
        allocator keeps the memory of the largest task it ran, which would be charged to the next
        case. The next case's first tasks then include the workers' import of traceguard."""
        from distributed import Client

        with Client(self.address, timeout=60) as client:
            client.restart(wait_for_workers=True)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def stop(self) -> None:
        for proc in reversed(self.procs):  # workers first, then the scheduler
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# -- reports ------------------------------------------------------------------------------------


def _normalised(path: Path) -> object:
    doc = json.loads(path.read_text())
    for key in PER_RUN_KEYS:
        doc.pop(key, None)
    return doc


def _digest(doc: object) -> str:
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()


def _diff(a: object, b: object, path: str = "$", out: list[str] | None = None, limit: int = 20) -> list[str]:
    """JSON paths where ``a`` and ``b`` differ (the first ``limit``)."""
    out = [] if out is None else out
    if len(out) >= limit:
        return out
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b), key=str):
            if key not in a or key not in b:
                out.append(f"{path}.{key}: only in {'second' if key not in a else 'first'}")
            else:
                _diff(a[key], b[key], f"{path}.{key}", out, limit)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} vs {len(b)} items")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            _diff(x, y, f"{path}[{i}]", out, limit)
    elif a != b:
        out.append(f"{path}: {str(a)[:80]!r} vs {str(b)[:80]!r}")
    return out[:limit]


# -- cases --------------------------------------------------------------------------------------


def supports_scheduler() -> bool:
    """Whether this traceguard's ``analyze`` takes ``--scheduler`` (the map/reduce landed)."""
    res = subprocess.run(
        [str(TRACEGUARD), "analyze", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**_clean_env(), "COLUMNS": "200"},
    )
    return "--scheduler" in res.stdout


def _rank_files(run: Path) -> list[tuple[Path, int]]:
    manifest = json.loads((run / "manifest.json").read_text())
    return [(run / c["path"], int(c["rank"])) for c in manifest["captures"]]


def case_one_by_one(run: Path, work: Path, sched: bool, interval: float) -> dict:
    per_rank = []
    load = os.getloadavg()[0]
    for path, rank in _rank_files(run):
        warm([path])
        cmd = [
            str(TRACEGUARD),
            "analyze",
            f"{path}:{rank}",
            *(["--scheduler", "serial"] if sched else []),
            "--format",
            "json",
            "-o",
            str(work / f"rank{rank:03d}.json"),
        ]
        per_rank.append(run_measured(cmd, work / "logs" / f"rank{rank:03d}", interval=interval))
    failed = [r["cmd"] for r in per_rank if r["rc"] != 0]
    return {
        "cmd": per_rank[0]["cmd"].replace(f"{per_rank[0]['cmd'].split()[2]}", "FILE:RANK") + " (each rank)",
        "rc": 1 if failed else 0,
        "failed": failed,
        "wall_s": round(sum(r["wall_s"] for r in per_rank), 3),
        "tree_peak_mb": max(r["tree_peak_mb"] for r in per_rank),
        "process_peak_mb": max(r["process_peak_mb"] for r in per_rank),
        "cpu_s": round(sum(r["cpu_s"] for r in per_rank), 3),
        "rank_wall_s": [r["wall_s"] for r in per_rank],
        "rank_cpu_s": [r["cpu_s"] for r in per_rank],
        "rank_peak_mb": [r["process_peak_mb"] for r in per_rank],
        "loadavg_1m_before": round(load, 2),
        "loadavg_1m_max": max(r["loadavg_1m_before"] for r in per_rank),
    }


def case_together(
    run: Path, work: Path, scheduler: str | None, jobs: int | None, interval: float, extra_roots: list[int] = ()
) -> dict:
    warm([p for p, _ in _rank_files(run)])
    cmd = [
        str(TRACEGUARD),
        "analyze",
        str(run),
        *(["--scheduler", scheduler] if scheduler else []),
        *(["--jobs", str(jobs)] if jobs else []),
        "--format",
        "json",
        "-o",
        str(work / "report.json"),
    ]
    return run_measured(cmd, work / "analyze", extra_roots=extra_roots, interval=interval)


def case_fixed(source: Path, work: Path, scheduler: str | None, interval: float, extra_roots: list[int] = ()) -> dict:
    """One unscaled real capture: the fixed cost of a process (start, imports, report) + 5 k kernels.
    On a Dask scheduler: the client's own fixed memory (with dask.distributed imported)."""
    warm([source])
    cmd = [
        str(TRACEGUARD),
        "analyze",
        f"{source}:0",
        *(["--scheduler", scheduler] if scheduler else []),
        "--format",
        "json",
        "-o",
        str(work / "report.json"),
    ]
    return run_measured(cmd, work / "analyze", extra_roots=extra_roots, interval=interval)


# -- summary ------------------------------------------------------------------------------------


def _sh(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def machine_facts(sched: bool) -> dict:
    from importlib import metadata

    cpuinfo = Path("/proc/cpuinfo").read_text().splitlines()
    meminfo = Path("/proc/meminfo").read_text().splitlines()
    cpu = next((ln.split(":", 1)[1].strip() for ln in cpuinfo if ln.startswith("model name")), "")
    mem_kb = next(int(ln.split()[1]) for ln in meminfo if ln.startswith("MemTotal:"))

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return ""

    return {
        "date_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpu_model": cpu,
        "ram_gb": round(mem_kb / 1024**2, 1),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "traceguard": version("traceguard"),
        "polars": version("polars"),
        "dask": version("dask"),
        "distributed": version("distributed"),
        "psutil": version("psutil"),
        "git_commit": _sh(["git", "rev-parse", "--short", "HEAD"]),
        "git_subject": _sh(["git", "log", "-1", "--format=%s"]),
        "traceguard_sources_dirty": bool(_sh(["git", "status", "--porcelain", "--", "traceguard"])),
        "scheduler_option": sched,
    }


def summarise(reps: list[dict]) -> dict:
    walls = [r["wall_s"] for r in reps]
    cpus = [r.get("cpu_s", 0.0) for r in reps]
    return {
        "wall_s_min": min(walls),
        "wall_s_median": round(statistics.median(walls), 3),
        "cpu_s_min": min(cpus),
        "cpu_s_median": round(statistics.median(cpus), 3),
        "tree_peak_mb": max(r["tree_peak_mb"] for r in reps),
        "tree_pss_peak_mb": max(r.get("tree_pss_peak_mb", 0.0) for r in reps),
        "process_peak_mb": max(r["process_peak_mb"] for r in reps),
        "loadavg_1m_before": [r["loadavg_1m_before"] for r in reps],
        "ok": all(r["rc"] == 0 for r in reps),
    }


CASE_TITLES = {
    "one_by_one": "ranks one by one (`--scheduler serial`, a process per rank)",
    "serial": "together, `--scheduler serial` (reference)",
    "local": "together, `--scheduler local`",
    "dask": "together, `--scheduler tcp://…` (Dask)",
}


def _times(ratio: float | None) -> str:
    return f"{ratio:.2f}×" if ratio is not None else "—"


def write_markdown(doc: dict, path: Path) -> None:
    f = doc["machine"]
    lines = [
        "# Scale-out: ranks one by one vs the run analysed together",
        "",
        "Generated by `bench/scale_out.py` (see its docstring and `docs/scale-out.md`); do not edit by hand.",
        "",
        f"- Date (UTC): {f['date_utc']}; {f['nproc']} CPUs ({f['cpu_model']}), {f['ram_gb']} GB RAM, "
        f"Linux {f['kernel']}",
        f"- traceguard {f['traceguard']} (git {f['git_commit']}"
        f"{', traceguard/ modified' if f['traceguard_sources_dirty'] else ''}: {f['git_subject'][:90]}); "
        f"Python {f['python']}, polars {f['polars']}, dask {f['dask']}, distributed {f['distributed']}",
        f"- Each case run {doc['repeat']}× (interleaved), each command in a fresh process after an untimed "
        "read of its inputs. Wall: min / median. Peak RSS sampled every "
        f"{doc['poll_ms']} ms over the whole process tree (`tree`: the largest sum over all processes at "
        "once; `process`: the largest single process, also checked against the kernel's high-water marks). "
        "Max over repeats.",
        f"- Local pool: `--jobs {doc['jobs'] or 'default (all cores)'}`. Dask: {doc['dask_workers']} workers "
        "(`dask worker --nworkers 1 --nthreads 1`, each a nanny + a worker process) and a `dask scheduler`, "
        "all on this machine, started before the runs"
        + (
            f" in {doc['dask']['start_s']:.1f} s, {doc['dask']['idle_tree_mb']:.0f} MB RSS idle"
            if doc.get("dask")
            else ""
        )
        + "; the workers are restarted before each Dask case (fresh processes, as a local pool's are), so its "
        "wall includes their import of traceguard; the Dask `tree` figures include the scheduler's and the "
        "nannies' memory.",
        "",
    ]
    if not f["scheduler_option"]:
        lines += ["**This traceguard has no `--scheduler`: only one by one and together (today's behaviour) ran.**", ""]
    for run in doc["runs"]:
        m = run["manifest"]
        one = run["cases"].get("one_by_one", {}).get("summary")
        lines += [
            f"## {m['ranks']} ranks × {m['kernels_per_rank']:,} kernels = {m['kernels_total']:,} kernels "
            f"({m['bytes_total'] / 1e9:.2f} GB), `{run['dir']}`",
            "",
            "| case | wall s (min / median) | wall × one by one (median / min) | CPU s (median) | CPU × one by one | "
            "peak RSS MB tree / process | tree × largest rank | process × largest rank | load 1 min before | "
            "target | pass |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        largest = one["process_peak_mb"] if one else None
        for name, case in run["cases"].items():
            s = case["summary"]
            t_ratio = s["wall_s_median"] / one["wall_s_median"] if one and name != "one_by_one" else None
            t_min = s["wall_s_min"] / one["wall_s_min"] if one and name != "one_by_one" else None
            c_ratio = (
                s.get("cpu_s_median", 0) / one["cpu_s_median"]
                if one and one.get("cpu_s_median") and name != "one_by_one"
                else None
            )
            tree_r = s["tree_peak_mb"] / largest if largest and name != "one_by_one" else None
            proc_r = s["process_peak_mb"] / largest if largest and name != "one_by_one" else None
            target, verdict = "", ""
            if name in TARGET_CASES and t_ratio is not None:
                target = f"wall ≤ {TIME_RATIO}×, RSS ≤ {RSS_RATIO}×"
                verdict = (
                    f"time **{'PASS' if t_ratio <= TIME_RATIO else 'FAIL'}**, "
                    f"RSS tree **{'PASS' if tree_r <= RSS_RATIO else 'FAIL'}** / "
                    f"process **{'PASS' if proc_r <= RSS_RATIO else 'FAIL'}**"
                )
            if name == "one_by_one":
                rss = f"largest rank {s['process_peak_mb']:.0f}"
            else:
                rss = f"{s['tree_peak_mb']:.0f} / {s['process_peak_mb']:.0f}"
            lines.append(
                f"| {CASE_TITLES[name]} | {s['wall_s_min']:.2f} / {s['wall_s_median']:.2f} | "
                f"{f'{t_ratio:.3f}× / {t_min:.3f}×' if t_ratio is not None else '—'} | "
                f"{s.get('cpu_s_median', 0):.1f} | {_times(c_ratio)} | {rss} | "
                f"{_times(tree_r)} | {_times(proc_r)} | "
                f"{', '.join(f'{x:.2f}' for x in s['loadavg_1m_before'])} | {target} | {verdict}"
                + ("" if s["ok"] else " (a command failed: see logs)")
                + " |"
            )
        pss = [
            f"`{name}` {c['summary']['tree_pss_peak_mb']:.0f} MB"
            + (f" ({c['summary']['tree_pss_peak_mb'] / largest:.2f}× the largest rank)" if largest else "")
            for name, c in run["cases"].items()
            if name != "one_by_one" and c["summary"].get("tree_pss_peak_mb")
        ]
        if pss:
            lines += [
                "",
                "- Peak of Σ PSS over the process tree (the tree's own memory: a page shared by several processes, "
                "such as the interpreter's and Polars' libraries, counted once; Σ RSS counts it in every process): "
                + "; ".join(pss),
            ]
        ident = run["identical"]
        lines += [
            "",
            f"- Reports of the together cases ({', '.join(ident['compared'])}; all repeats) identical apart from "
            f"`{'`, `'.join(PER_RUN_KEYS)}`: **{'yes' if ident['identical'] else 'NO'}**"
            + ("" if ident["identical"] else f" — differing paths: {'; '.join(ident['diff'][:10])}"),
        ]
        if one:
            walls = one["per_rank_wall_s"]
            lines.append(
                f"- One by one: per-rank wall {min(walls):.2f}–{max(walls):.2f} s "
                f"(median {statistics.median(walls):.2f}), per-rank peak RSS "
                f"{min(one['per_rank_peak_mb']):.0f}–{max(one['per_rank_peak_mb']):.0f} MB"
            )
        tr = run.get("travel") or {}
        if "outcome_pickled_bytes" in tr:
            lines.append(
                f"- What travels: one rank's map result (`MapOutcome`, pickled) is "
                f"{tr['outcome_pickled_bytes'] / 1e6:.2f} MB ({tr['first_rank_map_s']:.2f} s to map that rank "
                f"in-process); the reduce after the last map took {tr['reduce_s']:.2f} s of a "
                f'{tr["analyze_s"]:.1f} s serial analysis (in-process `analyze(..., scheduler="serial")`)'
            )
        for name in ("local", "dask"):
            case = run["cases"].get(name)
            if case:
                procs = case["reps"][-1]["processes"]
                shown = "; ".join(f"{p['peak_mb']:.0f} MB `{p['name'][-40:]}`" for p in procs[:4])
                lines.append(f"- {name}: largest processes (last repeat): {shown}")
        lines.append("")
    if doc.get("size_points"):
        lines += [
            "## Single-rank size points (one by one only)",
            "",
            "| run | kernels per rank | wall s (min / median) | peak RSS MB | load 1 min before |",
            "|---|---|---|---|---|",
        ]
        for pt in doc["size_points"]:
            s, m = pt["summary"], pt["manifest"]
            lines.append(
                f"| `{pt['dir']}` ({m['ranks']} rank{'s' if m['ranks'] > 1 else ''}) | {m['kernels_per_rank']:,} | "
                f"{s['wall_s_min']:.2f} / {s['wall_s_median']:.2f} | {s['process_peak_mb']:.0f} | "
                f"{', '.join(f'{x:.2f}' for x in s['loadavg_1m_before'])} |"
            )
        lines.append("")
    lines += paper_markdown(doc.get("paper") or {})
    fx = doc.get("fixed")
    if fx:
        lines += [
            f"Fixed cost of one `traceguard analyze` process (one unscaled real capture, "
            f"{fx['kernels']:,} kernels): wall {fx['summary']['wall_s_min']:.2f} / "
            f"{fx['summary']['wall_s_median']:.2f} s, peak RSS {fx['summary']['process_peak_mb']:.0f} MB.",
            "",
        ]
    lines += [
        "Load: on 2 shared CPUs a 1-minute load average above ~0.5 before a command means other processes",
        "competed with it; those figures are pessimistic (`scale_out.json` has every command's figures).",
    ]
    path.write_text("\n".join(lines) + "\n")


# -- main ---------------------------------------------------------------------------------------


def _identity(reports: list[tuple[str, Path]]) -> dict:
    """Whether every report in ``reports`` is the same apart from :data:`PER_RUN_KEYS`."""
    if len(reports) < 2:
        return {"compared": [label for label, _ in reports], "identical": True, "diff": [], "digests": {}}
    first_label, first_path = reports[0]
    first = _normalised(first_path)
    base = _digest(first)
    digests = {first_label: base}
    diff: list[str] = []
    for label, path in reports[1:]:
        doc = _normalised(path)
        digests[label] = _digest(doc)
        if digests[label] != base and not diff:
            diff = [f"{first_label} vs {label}: {d}" for d in _diff(first, doc)]
    return {
        "compared": sorted({label.split("#")[0] for label, _ in reports}),
        "identical": len(set(digests.values())) == 1,
        "diff": diff,
        "digests": digests,
    }


def _shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def _manifest_summary(run: Path) -> dict:
    manifest = json.loads((run / "manifest.json").read_text())
    kernels = [c["kernels"] for c in manifest["captures"]]
    return {
        "ranks": manifest["ranks"],
        "nodes": manifest.get("nodes"),
        "kernels_per_rank": max(kernels),
        "kernels_total": sum(kernels),
        "bytes_total": manifest["bytes_total"],
        "sources": sorted({(c["source"], c["source_sha256"]) for c in manifest["captures"]}),
        "skew_us": manifest.get("skew_us"),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--run", type=Path, action="append", help="run directory from make_run.py (repeatable)")
    parser.add_argument(
        "--size-point",
        type=Path,
        action="append",
        default=[],
        help="run directory measured one by one only (a per-rank size point for docs/scale-out.md; repeatable)",
    )
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--cases", nargs="+", default=list(CASE_TITLES), choices=list(CASE_TITLES))
    parser.add_argument("--jobs", type=int, default=None, help="--jobs for the local pool (default: its own)")
    parser.add_argument("--dask-workers", type=int, default=2)
    parser.add_argument("--poll-ms", type=float, default=50.0)
    parser.add_argument("--fixed-source", type=Path, default=ROOT / "tests/fixtures/h200x4/p2p_nsys/cap_0.sqlite.gz")
    parser.add_argument("--md", type=Path, default=HERE / "SCALE_OUT.md")
    parser.add_argument("--json", type=Path, default=HERE / "scale_out.json")
    parser.add_argument(
        "--rewrite", action="store_true", help="only recompute the on-paper scaling and rewrite --md from --json"
    )
    args = parser.parse_args(argv)
    if args.rewrite:
        doc = json.loads(args.json.read_text())
        doc["paper"] = paper(doc)
        args.json.write_text(json.dumps(doc, indent=2, default=list) + "\n")
        write_markdown(doc, args.md)
        return
    runs = [r.resolve() for r in (args.run or [HERE / "work" / "run64"])]
    interval = args.poll_ms / 1000
    sched = supports_scheduler()
    cases = [c for c in args.cases if sched or c in ("one_by_one", "serial")]
    if not sched:
        print("traceguard analyze has no --scheduler: measuring one by one and together only", flush=True)
    facts = machine_facts(sched)

    import gzip
    import shutil
    import sqlite3

    fixed = WORK / "fixed" / "source.sqlite"
    fixed.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(args.fixed_source, "rb") as fin, fixed.open("wb") as fout:
        shutil.copyfileobj(fin, fout)
    with sqlite3.connect(f"file:{fixed}?mode=ro", uri=True) as conn:
        fixed_kernels = conn.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]

    cluster = DaskCluster(args.dask_workers, WORK / "dask").start() if "dask" in cases else None
    if cluster:
        print(f"dask cluster {cluster.address}: up in {cluster.start_s:.1f} s, {cluster.idle_tree_mb:.0f} MB idle")
    results: dict[Path, dict[str, list[dict]]] = {run: {c: [] for c in cases} for run in runs}
    reports: dict[Path, list[tuple[str, Path]]] = {run: [] for run in runs}
    fixed_reps: list[dict] = []
    fixed_dask_reps: list[dict] = []
    points = [r.resolve() for r in args.size_point]
    point_reps: dict[Path, list[dict]] = {r: [] for r in points}
    try:
        for rep in range(args.repeat):
            fixed_reps.append(case_fixed(fixed, WORK / "fixed", "serial" if sched else None, interval))
            if cluster:
                cluster.restart()
                fixed_dask_reps.append(case_fixed(fixed, WORK / "fixed_dask", cluster.address, interval, cluster.pids))
            for point in points:
                res = case_one_by_one(point, WORK / point.name / "one_by_one" / f"rep{rep}", sched, interval)
                point_reps[point].append(res)
                print(
                    f"rep {rep} {point.name} one_by_one: wall {res['wall_s']:.2f} s, "
                    f"process {res['process_peak_mb']:.0f} MB",
                    flush=True,
                )
            for run in runs:
                for case in cases:
                    work = WORK / run.name / case / f"rep{rep}"
                    work.mkdir(parents=True, exist_ok=True)
                    if case == "one_by_one":
                        res = case_one_by_one(run, work, sched, interval)
                    elif case == "serial":
                        res = case_together(run, work, "serial" if sched else None, None, interval)
                    elif case == "local":
                        res = case_together(run, work, "local", args.jobs, interval)
                    else:
                        assert cluster is not None
                        cluster.restart()
                        res = case_together(run, work, cluster.address, None, interval, cluster.pids)
                    if case != "one_by_one" and res["rc"] == 0:
                        res["report_bytes"] = (work / "report.json").stat().st_size
                    results[run][case].append(res)
                    if case != "one_by_one" and res["rc"] == 0:
                        reports[run].append((f"{case}#{rep}", work / "report.json"))
                    print(
                        f"rep {rep} {run.name} {case}: wall {res['wall_s']:.2f} s, tree {res['tree_peak_mb']:.0f} MB, "
                        f"process {res['process_peak_mb']:.0f} MB, load {res['loadavg_1m_before']:.2f}, rc {res['rc']}",
                        flush=True,
                    )
    finally:
        if cluster:
            cluster.stop()
    travel = {run: measure_travel(run, WORK / run.name / "travel") for run in runs} if sched else {}
    point_travel = {pt: measure_travel(pt, WORK / pt.name / "travel", map_only=True) for pt in points} if sched else {}

    doc: dict = {
        "machine": facts,
        "repeat": args.repeat,
        "poll_ms": args.poll_ms,
        "jobs": args.jobs,
        "dask_workers": args.dask_workers,
        "targets": {"time_ratio_max": TIME_RATIO, "rss_ratio_max": RSS_RATIO, "cases": list(TARGET_CASES)},
        "dask": {"address": cluster.address, "start_s": round(cluster.start_s, 1), "idle_tree_mb": cluster.idle_tree_mb}
        if cluster
        else None,
        "fixed": {
            "source": str(args.fixed_source.relative_to(ROOT)),
            "kernels": fixed_kernels,
            "summary": summarise(fixed_reps),
            "reps": fixed_reps,
            "dask_client_mb": max((r["command_maxrss_mb"] for r in fixed_dask_reps), default=None),
            "dask_reps": fixed_dask_reps,
        },
        "runs": [],
        "size_points": [
            {
                "dir": _shown(point),
                "manifest": _manifest_summary(point),
                "summary": summarise(reps),
                "reps": reps,
                "travel": point_travel.get(point),
            }
            for point, reps in point_reps.items()
        ],
    }
    for run in runs:
        entry: dict = {
            "dir": _shown(run),
            "manifest": _manifest_summary(run),
            "cases": {},
            "identical": _identity(reports[run]),
            "travel": travel.get(run),
        }
        for case, reps in results[run].items():
            summary = summarise(reps)
            if case == "one_by_one":
                # Per rank, the least disturbed of the repeats.
                summary["per_rank_wall_s"] = [min(v) for v in zip(*(r["rank_wall_s"] for r in reps), strict=True)]
                summary["per_rank_cpu_s"] = [
                    min(v) for v in zip(*(r.get("rank_cpu_s", r["rank_wall_s"]) for r in reps), strict=True)
                ]
                summary["per_rank_peak_mb"] = [max(v) for v in zip(*(r["rank_peak_mb"] for r in reps), strict=True)]
            entry["cases"][case] = {"summary": summary, "reps": reps}
        one = entry["cases"].get("one_by_one")
        if one:
            largest = one["summary"]["process_peak_mb"]
            for case, data in entry["cases"].items():
                if case == "one_by_one":
                    continue
                s = data["summary"]
                s["wall_ratio_vs_one_by_one"] = round(s["wall_s_median"] / one["summary"]["wall_s_median"], 3)
                s["min_wall_ratio_vs_one_by_one"] = round(s["wall_s_min"] / one["summary"]["wall_s_min"], 3)
                if one["summary"]["cpu_s_median"]:
                    s["cpu_ratio_vs_one_by_one"] = round(s["cpu_s_median"] / one["summary"]["cpu_s_median"], 3)
                s["tree_rss_ratio_vs_largest_rank"] = round(s["tree_peak_mb"] / largest, 2)
                s["process_rss_ratio_vs_largest_rank"] = round(s["process_peak_mb"] / largest, 2)
                if case in TARGET_CASES:
                    s["pass_time"] = s["wall_ratio_vs_one_by_one"] <= TIME_RATIO
                    s["pass_rss_tree"] = s["tree_rss_ratio_vs_largest_rank"] <= RSS_RATIO
                    s["pass_rss_process"] = s["process_rss_ratio_vs_largest_rank"] <= RSS_RATIO
        doc["runs"].append(entry)
    doc["paper"] = paper(doc)
    args.json.write_text(json.dumps(doc, indent=2, default=list) + "\n")
    write_markdown(doc, args.md)
    print(f"wrote {args.md} and {args.json}")


# -- on paper: 1,024 ranks ------------------------------------------------------------------------

#: The run docs/scale-out.md scales to: this many ranks, each rank file this many bytes.
PAPER_RANKS = 1024
PAPER_RANK_BYTES = (0.2e9, 1e9, 5e9)
#: Workers of one thread each (a worker's rank file read also uses a helper process: 2 cores each).
PAPER_WORKERS = (16, 64, 256)


def _interp(points: list[tuple[float, float]], x: float) -> float:
    """Piecewise-linear through ``points``; beyond either end, the end segment's slope."""
    by_x: dict[float, list[float]] = {}
    for px, py in points:
        by_x.setdefault(px, []).append(py)
    pts = sorted((px, statistics.mean(ys)) for px, ys in by_x.items())
    if len(pts) == 1:
        return pts[0][1]
    segment = next((pair for pair in itertools.pairwise(pts) if x <= pair[1][0]), (pts[-2], pts[-1]))
    (x0, y0), (x1, y1) = segment
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def paper(doc: dict) -> dict:
    """Scale the measured per-rank costs to :data:`PAPER_RANKS` ranks of each size in
    :data:`PAPER_RANK_BYTES` (the arithmetic docs/scale-out.md shows).

    Per-rank points (kernels → CPU s, wall s, peak RSS MB, pickled map result bytes): the
    one-by-one figures of each run (per rank the least of the repeats, then the median over ranks;
    the largest per-rank peak), the size points (least of the repeats; largest peak), and the
    one-rank map results measured in-process. The per-rank time used is the CPU time, not the wall:
    on these shared cores the wall mostly measures the other processes, the CPU seconds hardly; a
    worker with its own cores takes at most that long (the rank read's helper process overlaps).
    Kernels of a rank file of S bytes: S ÷ (bytes per kernel of these exports). Map wall on W
    one-thread workers: ⌈ranks ÷ W⌉ × the per-rank time (ranks of equal size); the reduce: the
    measured reduce seconds per rank of the run with the most ranks × ranks."""
    pts_wall: list[tuple[float, float]] = []
    pts_cpu: list[tuple[float, float]] = []
    pts_rss: list[tuple[float, float]] = []
    pts_travel: list[tuple[float, float]] = []
    bpk: list[float] = []
    pts_reduce: list[tuple[float, float]] = []
    pts_client: list[tuple[float, float]] = []
    pts_report: list[tuple[float, float]] = []
    client_base = (doc.get("fixed") or {}).get("dask_client_mb")
    for run in doc["runs"]:
        m = run["manifest"]
        one = run["cases"].get("one_by_one")
        bpk.append(m["bytes_total"] / m["kernels_total"])
        if one:
            pts_wall.append((m["kernels_per_rank"], statistics.median(one["summary"]["per_rank_wall_s"])))
            if one["summary"].get("per_rank_cpu_s"):
                pts_cpu.append((m["kernels_per_rank"], statistics.median(one["summary"]["per_rank_cpu_s"])))
            pts_rss.append((m["kernels_per_rank"], one["summary"]["process_peak_mb"]))
        tr = run.get("travel") or {}
        if "outcome_pickled_bytes" in tr:
            pts_travel.append((m["kernels_per_rank"], tr["outcome_pickled_bytes"]))
            if "reduce_s" in tr:
                pts_reduce.append((m["kernels_per_rank"], tr["reduce_s"] / m["ranks"]))
        together = [c for name, c in run["cases"].items() if name != "one_by_one"]
        sizes = [r["report_bytes"] for c in together for r in c["reps"] if r.get("report_bytes")]
        if sizes:
            pts_report.append((m["kernels_per_rank"], max(sizes) / m["ranks"]))
        dask = run["cases"].get("dask")
        if dask and client_base:
            # The Dask client is the command alone (the workers are not its children): its peak
            # above the client's fixed peak, per rank (an upper bound: all growth charged to ranks).
            peak = statistics.median(r["command_maxrss_mb"] for r in dask["reps"])
            pts_client.append((m["kernels_per_rank"], max(peak - client_base, 0.0) / m["ranks"]))
    for pt in doc.get("size_points", []):
        m, s = pt["manifest"], pt["summary"]
        bpk.append(m["bytes_total"] / m["kernels_total"])
        pts_wall.append((m["kernels_per_rank"], s["wall_s_min"] / m["ranks"]))  # one rank, normally
        if s.get("cpu_s_min"):
            pts_cpu.append((m["kernels_per_rank"], s["cpu_s_min"] / m["ranks"]))
        pts_rss.append((m["kernels_per_rank"], s["process_peak_mb"]))
        tr = pt.get("travel") or {}
        if "outcome_pickled_bytes" in tr:
            pts_travel.append((m["kernels_per_rank"], tr["outcome_pickled_bytes"]))
    if not pts_wall:
        return {}
    per_kernel = statistics.median(bpk)
    rows = []
    for size in PAPER_RANK_BYTES:
        kernels = size / per_kernel
        wall = _interp(pts_cpu or pts_wall, kernels)
        rss = _interp(pts_rss, kernels)
        travel = _interp(pts_travel, kernels) if pts_travel else None
        reduce_s = _interp(pts_reduce, kernels) * PAPER_RANKS if pts_reduce else None
        client_mb = client_base + _interp(pts_client, kernels) * PAPER_RANKS if pts_client else None
        report_mb = _interp(pts_report, kernels) * PAPER_RANKS / 1e6 if pts_report else None
        rows.append(
            {
                "rank_bytes": size,
                "kernels_per_rank": round(kernels),
                "rank_s": round(wall, 2),
                "worker_peak_mb": round(rss),
                "result_bytes_per_rank": round(travel) if travel else None,
                "results_total_mb": round(travel * PAPER_RANKS / 1e6) if travel else None,
                "reduce_s": round(reduce_s, 1) if reduce_s is not None else None,
                "client_mb": round(client_mb) if client_mb is not None else None,
                "report_mb": round(report_mb) if report_mb is not None else None,
                "map_wall_s": {w: round(-(-PAPER_RANKS // w) * wall, 1) for w in PAPER_WORKERS},
                "cpu_s": round(PAPER_RANKS * wall),  # the map's CPU seconds for the whole run
            }
        )
    return {
        "ranks": PAPER_RANKS,
        "bytes_per_kernel": round(per_kernel, 1),
        "points_wall": sorted(pts_wall),
        "points_cpu": sorted(pts_cpu),
        "time_from": "cpu" if pts_cpu else "wall",
        "points_rss_mb": sorted(pts_rss),
        "points_result_bytes": sorted(pts_travel),
        "points_reduce_s_per_rank": sorted(pts_reduce),
        "points_client_mb_per_rank": sorted(pts_client),
        "points_report_bytes_per_rank": sorted(pts_report),
        "client_base_mb": client_base,
        "rows": rows,
    }


def shown(value: float | None, fmt: str = "{:,.0f}") -> str:
    return fmt.format(value) if value is not None else "—"


def paper_markdown(pp: dict) -> list[str]:
    if not pp:
        return []
    workers = " | ".join(f"map wall on {w} workers" for w in PAPER_WORKERS)
    lines = [
        f"## On paper: {pp['ranks']:,} ranks (the arithmetic of `docs/scale-out.md`)",
        "",
        f"Bytes per kernel of these exports: {pp['bytes_per_kernel']:.0f} (kernels + their CUDA runtime calls, "
        f"copies, NVTX). Per-rank time ({pp['time_from']} seconds: the CPU time is what a worker with its own "
        "cores needs at most; the wall on these shared cores mostly measures the other processes) and peak RSS: "
        "piecewise-linear through the measured one-by-one points "
        f"(kernels → CPU s: {', '.join(f'{k / 1e6:.2f} M → {v:.2f}' for k, v in pp.get('points_cpu', []))}; "
        f"kernels → wall s, for reference: {', '.join(f'{k / 1e6:.2f} M → {v:.2f}' for k, v in pp['points_wall'])}; "
        f"kernels → MB: {', '.join(f'{k / 1e6:.2f} M → {v:.0f}' for k, v in pp['points_rss_mb'])}), the last "
        "segment's slope beyond the largest. Map result per rank (pickled): "
        f"{', '.join(f'{k / 1e6:.2f} M → {v / 1e6:.2f} MB' for k, v in pp['points_result_bytes']) or 'not measured'}. "
        "Reduce seconds per rank: "
        f"{', '.join(f'{k / 1e6:.2f} M → {v:.4f}' for k, v in pp['points_reduce_s_per_rank']) or 'not measured'}"
        f" × {pp['ranks']:,}. Client (the Dask client process: reduce + report) MB per rank above its fixed "
        f"{pp['client_base_mb'] or 0:.0f} MB: "
        f"{', '.join(f'{k / 1e6:.2f} M → {v:.1f}' for k, v in pp['points_client_mb_per_rank']) or 'not measured'}"
        " (an upper bound). JSON report bytes per rank: "
        f"{', '.join(f'{k / 1e6:.2f} M → {v / 1e6:.2f} MB' for k, v in pp['points_report_bytes_per_rank'])}. "
        f"Map wall on W workers = ⌈{pp['ranks']:,} ÷ W⌉ × per-rank time (each worker one thread; "
        "its rank read also runs a helper process on a second core).",
        "",
        f"| rank file | kernels per rank | per-rank time s | memory per worker MB | result per rank MB | "
        f"all results MB | {workers} | reduce s | client MB | JSON report MB | CPU s in all |",
        "|---|---|---|---|---|---|" + "---|" * len(PAPER_WORKERS) + "---|---|---|---|",
    ]
    for r in pp["rows"]:
        walls = " | ".join(f"{v:,.0f} s ({v / 60:.1f} min)" for v in r["map_wall_s"].values())
        res = r["result_bytes_per_rank"]

        lines.append(
            f"| {r['rank_bytes'] / 1e9:g} GB | {r['kernels_per_rank'] / 1e6:.2f} M | {r['rank_s']:.1f} | "
            f"{r['worker_peak_mb']:,} | {shown(res / 1e6 if res else None, '{:.2f}')} | "
            f"{shown(r['results_total_mb'])} | {walls} | {shown(r['reduce_s'], '{:,.1f}')} | "
            f"{shown(r.get('client_mb'))} | {shown(r.get('report_mb'))} | {r['cpu_s']:,} |"
        )
    lines.append("")
    return lines


if __name__ == "__main__":
    main()
