"""The harness: run the instrumented DDP job as an N-rank run bundle, and sweeps of settings.

``run`` launches ``traceguard/capture/ddp_job.py`` on N ranks itself (through
``torch.distributed.run``; the user needs no torchrun), optionally under Nsight Systems (one
report per rank, exported to SQLite) or torch.profiler, with NCCL_DEBUG logs per rank and
``nvidia-smi`` side files, and writes a bundle directory whose ``manifest.json`` says what ran:
config, versions, GPUs, throughput measured outside the profiled steps, each rank's exit status.
``sweep`` runs a matrix of settings into one bundle per setting.

Standard library only (the job itself needs torch): it runs as ``python -m
traceguard.capture.harness`` on GPU machines that have nothing but torch installed.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceguard.capture import slow_rank
from traceguard.tools import find_importer, find_nsys

BUNDLE_VERSION = 1
REPO_ROOT = Path(__file__).resolve().parents[2]
# ---------------------------------------------------------------------------------------------
# Job options: each maps to a real code path of ddp_job.py.


def add_job_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--world-size", type=int, default=2, help="ranks (processes; one GPU each on GPUs)")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None, help="default: nccl on GPUs, else gloo")
    p.add_argument("--capture", choices=["nsys", "torch", "none"], default="none")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--timed", type=int, default=5, help="steps timed for throughput, outside the capture")
    p.add_argument("--repeats", type=int, default=1, help="runs of the timed steps (throughput: median, spread)")
    p.add_argument(
        "--workload",
        choices=["ddp", "pipeline", "broadcast-reduce", "fsdp", "tensor-parallel"],
        default="ddp",
        help="ddp (default); pipeline (stages over ranks, send/recv); broadcast-reduce (parameters from rank 0, "
        "gradients to rank 0); fsdp (FSDP2 fully_shard); tensor-parallel (column/row-wise Linear pairs)",
    )
    p.add_argument("--microbatches", type=int, default=4, help="pipeline: microbatches per batch")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe", help="pipeline: schedule")
    p.add_argument(
        "--p2p",
        dest="p2p_calls",
        choices=["blocking", "batched"],
        default="blocking",
        help="pipeline: send/recv, or batch_isend_irecv",
    )
    p.add_argument("--comm-dtype", choices=["fp32", "fp16", "bf16"], default="fp32", help="broadcast-reduce: payload")
    p.add_argument(
        "--async",
        dest="async_op",
        action="store_true",
        help="broadcast-reduce: issue with async_op=True, compute, then wait",
    )
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--model", choices=["mlp", "vit_l_32"], default="mlp")
    p.add_argument("--mlp-width", type=int, default=1024)
    p.add_argument("--mlp-depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument(
        "--comm",
        choices=["ddp", "cpu-staged", "per-param", "allreduce", "none"],
        default="ddp",
        help="ddp; cpu-staged (gradients all-reduced on the CPU); per-param (every gradient all-reduced on its "
        "own, no bucketing: the small-collectives anti-pattern); allreduce (one explicit all-reduce of the "
        "flattened gradients, no DDP); none (no DDP)",
    )
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture the training step (forward, backward, gradient all-reduce, optimizer step) as one CUDA graph "
        "and replay it every step; needs CUDA (--comm ddp becomes allreduce inside the graph)",
    )
    p.add_argument(
        "--cuda-graph-trace",
        choices=["node", "graph"],
        default="node",
        help="with --cuda-graphs and nsys: trace each kernel of a replay (node) or each replay whole (graph, "
        "nsys's own default, which hides the kernels and NCCL collectives inside)",
    )
    p.add_argument("--static-graph", action="store_true")
    p.add_argument(
        "--no-bucket-view",
        dest="bucket_view",
        action="store_false",
        help="DDP without gradient_as_bucket_view (copies every gradient into its bucket)",
    )
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--comm-hook", choices=["none", "bf16", "fp16", "powersgd"], default="none")
    p.add_argument("--powersgd-rank", type=int, default=1)
    p.add_argument("--powersgd-start-iter", type=int, default=2)
    p.add_argument("--no-p2p", dest="p2p", action="store_false", help="NCCL_P2P_DISABLE=1")
    p.add_argument("--no-shm", dest="shm", action="store_false", help="NCCL_SHM_DISABLE=1")
    p.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="extra environment (repeatable)")
    p.add_argument("--num-workers", type=int, default=0)
    slow_rank.add_option(p)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds before the job is stopped")
    p.add_argument("--keep-reports", action="store_true", help="keep .nsys-rep files beside the SQLite exports")
    p.add_argument("--compress", action="store_true", help="gzip the SQLite exports and traces (traceguard reads .gz)")
    p.add_argument(
        "--gpu-metrics",
        action="store_true",
        help="with --capture nsys on GPUs: each rank's nsys samples its own GPU's counters (PCIe / NVLink "
        "throughput, SM active, DRAM bandwidth) with --gpu-metrics-devices=$LOCAL_RANK: one collector per GPU",
    )
    p.add_argument("--gpu-metrics-frequency", type=int, default=10000, help="samples per second (nsys: 10 to 200000)")
    p.add_argument(
        "--gpu-metrics-set",
        default=None,
        help="nsys metric set (default: the GPU's own; `nsys profile --gpu-metrics-set=help`)",
    )
    p.add_argument(
        "--nccl-inspector",
        type=Path,
        default=None,
        metavar="PLUGIN_SO",
        help="NCCL Inspector profiler plugin (libnccl-profiler-inspector.so): each rank writes one JSON line per "
        "collective under inspector/ in the bundle",
    )
    p.add_argument(
        "--nccl-inspector-verbose", action="store_true", help="with --nccl-inspector: per-channel kernel timestamps"
    )


def job_arguments(cfg: argparse.Namespace, out: Path) -> list[str]:
    args = [
        "--out",
        str(out),
        "--capture",
        cfg.capture,
        "--model",
        cfg.model,
        "--mlp-width",
        str(cfg.mlp_width),
        "--mlp-depth",
        str(cfg.mlp_depth),
        "--batch-size",
        str(cfg.batch_size),
        "--warmup",
        str(cfg.warmup),
        "--timed",
        str(cfg.timed),
        "--repeats",
        str(cfg.repeats),
        "--workload",
        cfg.workload,
        "--microbatches",
        str(cfg.microbatches),
        "--schedule",
        cfg.schedule,
        "--p2p",
        cfg.p2p_calls,
        "--comm-dtype",
        cfg.comm_dtype,
        "--steps",
        str(cfg.steps),
        "--comm",
        cfg.comm,
        "--bucket-cap-mb",
        str(cfg.bucket_cap_mb),
        "--comm-hook",
        cfg.comm_hook,
        "--powersgd-rank",
        str(cfg.powersgd_rank),
        "--powersgd-start-iter",
        str(cfg.powersgd_start_iter),
        "--num-workers",
        str(cfg.num_workers),
    ]
    if cfg.backend:
        args += ["--backend", cfg.backend]
    if cfg.static_graph:
        args.append("--static-graph")
    if not cfg.bucket_view:
        args.append("--no-bucket-view")
    if cfg.async_op:
        args.append("--async")
    if getattr(cfg, "cuda_graphs", False):
        args.append("--cuda-graphs")
    slow = slow_ranks(cfg)
    if slow:
        args += ["--slow-rank", ",".join(f"{rank}:{ms:g}" for rank, ms in slow.items())]
    return args


def slow_ranks(cfg: argparse.Namespace) -> dict[int, float]:
    """The ``--slow-rank`` options of ``cfg`` as one {rank: ms} (raises SystemExit on a rank given twice)."""
    value = getattr(cfg, "slow_rank", None)
    if isinstance(value, dict):
        return value
    try:
        return slow_rank.merge_slow_ranks(value)
    except ValueError as exc:
        raise SystemExit(str(exc)) from None


def job_environment(cfg: argparse.Namespace, out: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env["PYTHONUNBUFFERED"] = "1"
    env.update(NCCL_DEBUG="INFO", NCCL_DEBUG_SUBSYS="INIT,GRAPH,ENV", NCCL_DEBUG_FILE=str(out / "nccl.%h.%p.log"))
    if not cfg.p2p:
        env["NCCL_P2P_DISABLE"] = "1"
    if not cfg.shm:
        env["NCCL_SHM_DISABLE"] = "1"
    plugin = getattr(cfg, "nccl_inspector", None)
    if plugin is not None:
        if not Path(plugin).is_file():
            raise SystemExit(f"--nccl-inspector: {plugin} is not a file (build libnccl-profiler-inspector.so first)")
        (out / "inspector").mkdir(parents=True, exist_ok=True)
        env.update(
            NCCL_PROFILER_PLUGIN=str(Path(plugin).resolve()),
            NCCL_INSPECTOR_ENABLE="1",
            NCCL_INSPECTOR_DUMP_DIR=str(out / "inspector"),
            # Dump while the job runs (every 0.5 s), so a rank that dies still leaves its lines.
            NCCL_INSPECTOR_DUMP_THREAD_INTERVAL_MICROSECONDS="500000",
        )
        if getattr(cfg, "nccl_inspector_verbose", False):
            env["NCCL_INSPECTOR_DUMP_VERBOSE"] = "1"
    for item in cfg.env:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise SystemExit(f"--env expects NAME=VALUE, got {item!r}")
        env[name] = value
    return env


# ---------------------------------------------------------------------------------------------
# Tools on this machine.


def _output(cmd: Sequence[str], timeout: float = 60) -> str:
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (proc.stdout or "") + (proc.stderr or "")


def nsys_version(nsys: str) -> str | None:
    m = re.search(r"(\d{4}\.\d+\.\d+(?:\.\d+)?)", _output([nsys, "--version"]))
    return m.group(1) if m else None


def package_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text)[:3])


def nvtx_visibility_problem(nsys_ver: str | None, nvtx_ver: str | None) -> str | None:
    """The Python nvtx package from 0.2.13 on is invisible to nsys 2022.x (NSYS.md): the capture
    would hold NVTX domains but no ranges, so no steps."""
    if not nsys_ver or not nvtx_ver:
        return None
    if _version_tuple(nsys_ver)[0] <= 2022 and _version_tuple(nvtx_ver) >= (0, 2, 13):
        return (
            f"Python nvtx {nvtx_ver} writes ranges nsys {nsys_ver} cannot read (only domain events "
            "would be recorded, so no steps): install `nvtx==0.2.11` or a newer Nsight Systems"
        )
    return None


def cuda_available() -> bool:
    """Whether the job will run on GPUs (asked in a child: the launcher itself needs no torch)."""
    out = _output([sys.executable, "-c", "import torch; print(torch.cuda.device_count())"], timeout=120)
    m = re.search(r"^(\d+)\s*$", out, re.MULTILINE)
    return bool(m and int(m.group(1)) > 0)


# ---------------------------------------------------------------------------------------------
# One run.


def _launch_command(cfg: argparse.Namespace, out: Path, nsys: str | None, cuda: bool) -> list[str]:
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.world_size}"]
    job = ["-m", "traceguard.capture.ddp_job", *job_arguments(cfg, out)]
    if cfg.capture != "nsys":
        return [*launcher, *job]
    assert nsys is not None
    profile = [
        nsys,
        "profile",
        f"--trace={'cuda,nvtx,osrt' if cuda else 'nvtx,osrt'}",
        "--sample=none",
        "--cpuctxsw=none",
        "-f",
        "true",
        "-o",
        str(out / "cap_%q{RANK}"),
    ]
    if cuda:
        profile[3:3] = ["--capture-range=cudaProfilerApi", "--capture-range-end=stop"]
        if getattr(cfg, "cuda_graphs", False):
            profile.insert(3, f"--cuda-graph-trace={cfg.cuda_graph_trace}")
        if getattr(cfg, "gpu_metrics", False):
            metrics = [f"--gpu-metrics-frequency={cfg.gpu_metrics_frequency}"]
            if cfg.gpu_metrics_set:
                metrics.append(f"--gpu-metrics-set={cfg.gpu_metrics_set}")
            profile[3:3] = metrics
            # Two processes cannot both sample one GPU: each rank's nsys collects its own device, which
            # only the rank's environment knows ($LOCAL_RANK), so a shell expands it per rank.
            script = 'exec "$0" "$1" --gpu-metrics-devices="$LOCAL_RANK" "${@:2}"'
            return [*launcher, "--no-python", "bash", "-c", script, *profile, sys.executable, *job]
    return [*launcher, "--no-python", *profile, sys.executable, *job]


def _side_files(out: Path) -> tuple[subprocess.Popen[bytes] | None, list[str]]:
    """nvidia-smi topo / -q now, and dmon sampling for the duration of the run."""
    smi = shutil.which("nvidia-smi")
    if not smi or subprocess.run([smi, "-L"], capture_output=True, check=False).returncode != 0:
        return None, []  # no driver: a stub nvidia-smi only prints an error
    written = []
    for name, args in (("topo.txt", ["topo", "-m"]), ("nvidia-smi-q.txt", ["-q"])):
        (out / name).write_text(_output([smi, *args]))
        written.append(name)
    dmon_file = (out / "dmon.txt").open("wb")
    proc = subprocess.Popen([smi, "dmon", "-s", "put", "-d", "1"], stdout=dmon_file, stderr=subprocess.STDOUT)
    written.append("dmon.txt")
    return proc, written


def _export_reports(out: Path, nsys: str, world: int, keep: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """.qdstrm → .nsys-rep (importer, where the CLI could not find it) → SQLite per rank."""
    captures: list[dict[str, Any]] = []
    problems: list[str] = []
    importer = find_importer(nsys)
    blobs = "--include-blobs" in _output([nsys, "export", "--help"])
    for rank in range(world):
        rep, qdstrm, sqlite = out / f"cap_{rank}.nsys-rep", out / f"cap_{rank}.qdstrm", out / f"cap_{rank}.sqlite"
        if not rep.exists() and qdstrm.exists():
            if importer is None:
                problems.append(f"rank {rank}: nsys left {qdstrm.name} and no QdstrmImporter was found")
                continue
            _output([importer, "-i", str(qdstrm)], timeout=1800)
        if not rep.exists():
            problems.append(f"rank {rank}: no nsys report was written")
            continue
        cmd = [nsys, "export", "--type", "sqlite", "-f", "true", "-o", str(sqlite)]
        if blobs:  # NCCL's NVTX payloads (message sizes) live in the blobs
            cmd.append("--include-blobs=true")
        log = _output([*cmd, str(rep)], timeout=1800)
        if not sqlite.exists():
            problems.append(f"rank {rank}: nsys export failed: {log.strip()[-300:]}")
            continue
        captures.append({"path": sqlite.name, "rank": rank, "tool": "nsys"})
        qdstrm.unlink(missing_ok=True)
        if not keep:
            rep.unlink(missing_ok=True)
    return captures, problems


def _missing_gpu_metrics(out: Path, captures: list[dict[str, Any]], log: str) -> list[str]:
    """Ranks whose export has no GPU metrics although ``--gpu-metrics`` asked nsys for them, with
    what nsys said about it (counters restricted to admin users: ERR_NVGPUCTRPERM; a GPU another
    collector already samples; a GPU without a metric set)."""
    said = [
        line.strip()
        for line in log.splitlines()
        if re.search(r"gpu.?metric|NVGPUCTRPERM|performance counter|permission", line, re.IGNORECASE)
    ]
    missing = []
    for capture in captures:
        try:
            with sqlite3.connect(f"file:{out / capture['path']}?mode=ro", uri=True) as conn:
                has = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'GPU_METRICS'").fetchone()
        except sqlite3.Error:
            continue
        if not has:
            missing.append(capture["rank"])
    if not missing:
        return []
    return [
        f"rank {', '.join(map(str, missing))}: --gpu-metrics was given but the export has no GPU metrics; "
        + (f"nsys said: {' | '.join(said[:4])}" if said else "nsys said nothing about them")
        + " (pcie_saturation falls back to nvidia-smi dmon)"
    ]


#: torchrun's failure summary: one block per failed rank ("rank : 1 (local_rank: 1)", "exitcode : -9
#: (pid: 4242)", "traceback : Signal 9 (SIGKILL) received by PID 4242").
_TORCHRUN_FAILURE = re.compile(
    r"rank\s*:\s*(?P<rank>\d+)\s*\(local_rank:[^)]*\)\s*"
    r"exitcode\s*:\s*(?P<code>-?\d+)[^\n]*\n(?:[^\n]*\n){0,4}?\s*traceback\s*:\s*(?P<why>[^\n]*)"
)


def rank_failures(out: Path, world: int, log: str) -> list[dict[str, Any]]:
    """Every rank that failed, the first to fail first, each with its own exception.

    A rank's error file (``rank{N}.error.json``, written by the job as it dies) gives the exception's
    type, message and innermost frames; a rank killed without a Python exception (a signal, the OOM
    killer, a native abort) is found in torchrun's failure summary instead. The cause comes first:
    torchrun's "Root Cause (first observed failure)", then by the error files' times; ranks that fail
    after another (a peer's closed connection, a collective's timeout, torchrun's SIGTERM) follow.
    """
    failures: dict[int, dict[str, Any]] = {}
    for rank in range(world):
        path = out / f"rank{rank}.error.json"
        if path.exists():
            try:
                error = json.loads(path.read_text())
                if not isinstance(error, dict):
                    raise ValueError("not an object")
                failures[rank] = {"type": "?", "message": "", **error, "rank": rank, "source": path.name}
            except (ValueError, OSError):  # JSONDecodeError is a ValueError
                failures[rank] = {"rank": rank, "type": "?", "message": "unreadable error file", "source": path.name}
    root_at = log.find("Root Cause")  # torchrun's own "first observed failure" section
    root_causes = set()
    for match in _TORCHRUN_FAILURE.finditer(log):
        rank = int(match["rank"])
        if root_at >= 0 and match.start() > root_at:
            root_causes.add(rank)
        if rank in failures or rank >= world:
            continue
        code = int(match["code"])
        why = match["why"].strip()
        if why.startswith("To enable traceback"):  # torchrun's placeholder: the process said nothing itself
            why = ""
        failures[rank] = {
            "rank": rank,
            "type": f"exit code {code}" + (f" (signal {-code})" if code < 0 else ""),
            "message": why or _rank_log_tail(log, rank),
            "frames": [],
            "source": "launcher.log",
        }
    return sorted(
        failures.values(),
        key=lambda f: (
            f["rank"] not in root_causes,
            f["time"] if isinstance(f.get("time"), (int, float)) else float("inf"),
            f["rank"],
        ),
    )


#: torchrun's own lines in a launcher log (its banner, glog-style lines, a traceback), not nsys's.
_LAUNCHER_NOISE = re.compile(r"^(\s|\*|[WIEF]\d{4} |Setting OMP_NUM_THREADS|Traceback|torch\.distributed|=|-|$)")


def nsys_did_not_start(cfg: argparse.Namespace, out: Path, rc: int, log: str) -> str | None:
    """Why the launch failed in nsys itself, before any rank's job ran (None otherwise): the job
    ran under nsys, the launcher failed (not a timeout), and no rank wrote its record or its own
    error file — the job's Python never got to run, so starting again repeats no work."""
    if cfg.capture != "nsys" or rc in (0, 124):
        return None
    for rank in range(cfg.world_size):
        if (out / f"rank{rank}.json").exists() or (out / f"rank{rank}.error.json").exists():
            return None
    said = [line.strip() for line in log.splitlines() if not _LAUNCHER_NOISE.match(line)]
    first = said[0][:120] if said else "nothing"
    return f"nsys exited {rc} before the job ran on any rank (its first words: {first!r})"


def _rank_log_tail(log: str, rank: int, lines: int = 3) -> str:
    """The last lines torchrun prefixed with ``[rankN]:`` (its per-rank stderr tag), joined."""
    own = [line.split(":", 1)[1].strip() for line in log.splitlines() if line.startswith(f"[rank{rank}]:")]
    return " | ".join(own[-lines:]) or "no output of its own in launcher.log"


#: A failed rank's message in its diagnostic line (NCCL errors run to kilobytes; the file has all).
DIAGNOSTIC_MESSAGE_CHARS = 400


def failure_diagnostic(failure: dict[str, Any], first: bool) -> str:
    """One line: ``rank 1 failed: RuntimeError: … at file:line in function ← …`` (innermost first)."""
    where = " ← ".join(
        f"{Path(str(f.get('file', '?'))).name}:{f.get('line', '?')} in {f.get('function', '?')}"
        for f in reversed([f for f in failure.get("frames") or [] if isinstance(f, dict)][-3:])
    )
    message = " ".join(str(failure["message"]).split())  # one line; the error file keeps it whole
    if len(message) > DIAGNOSTIC_MESSAGE_CHARS:
        message = message[: DIAGNOSTIC_MESSAGE_CHARS - 1] + "…"
    text = f"rank {failure['rank']} {'failed' if first else 'then failed'}: {failure['type']}: {message}"
    return text + (f" (at {where})" if where else "") + f" [{failure['source']}]"


class Refused(SystemExit):
    """A combination the harness will not run (said before any rank starts); a sweep lists it and goes on."""


def workload_refusal(cfg: argparse.Namespace) -> str | None:
    """Why ``cfg``'s workload cannot run as asked (said before any rank starts), or None.

    FSDP2 and tensor parallelism run on gloo too (checked with torch 2.13 on CPU: all-gather,
    reduce-scatter and all-reduce of DTensors), as do send/recv, broadcast and reduce; so the
    backend refuses nothing. bf16 over gloo works (gloo reduces bf16 since torch 2.x)."""
    workload = cfg.workload
    slow = slow_ranks(cfg)
    if slow and workload not in slow_rank.SLOW_INPUT_WORKLOADS:
        return f"--slow-rank sleeps in the `get batch` range, which --workload {workload} does not have"
    if beyond := [rank for rank in slow if rank >= cfg.world_size]:
        return (
            f"--slow-rank names rank {beyond[0]}, but --world-size {cfg.world_size} has ranks 0..{cfg.world_size - 1}"
        )
    if workload == "ddp":
        return None
    if cfg.model != "mlp":
        return f"--workload {workload} splits or shards the MLP; use --model mlp (not {cfg.model})"
    if getattr(cfg, "cuda_graphs", False):
        return f"--cuda-graphs graphs the DDP step only, not --workload {workload}"
    if workload == "pipeline":
        if cfg.world_size < 2:
            return "--workload pipeline needs --world-size 2 or more (one stage per rank)"
        if cfg.mlp_depth + 1 < cfg.world_size:
            return f"--workload pipeline: {cfg.mlp_depth + 1} Linear layers cannot fill {cfg.world_size} stages"
        if cfg.microbatches < 1 or cfg.batch_size % cfg.microbatches:
            return f"--batch-size {cfg.batch_size} is not a multiple of --microbatches {cfg.microbatches}"
    if workload == "tensor-parallel" and cfg.mlp_depth < 2:
        return "--workload tensor-parallel needs --mlp-depth 2 or more (hidden Linear layers in pairs)"
    if workload == "tensor-parallel" and cfg.mlp_width % cfg.world_size:
        return f"--workload tensor-parallel: --mlp-width {cfg.mlp_width} does not split over {cfg.world_size} ranks"
    return None


def workload_summary(workload: str, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The manifest's ``workload``: what each rank saw, and the bytes each rank sent per peer and the
    payload per collective in every step (null where steps differ; ``per_step`` has each step)."""
    ranks, per_step = [], {}
    for record in records:
        entry = dict(record.get("workload") or {"name": workload})
        per_step[str(record["rank"])] = entry.pop("per_step", {})
        ranks.append({"rank": record["rank"], **entry})

    def constant(rank: str, kind: str) -> dict[str, int] | None:
        tables = [step.get(kind, {}) for step in per_step[rank].values()]
        return tables[0] if tables and all(t == tables[0] for t in tables) else None

    sent, received, payload = [], [], {}
    for rank in per_step:
        for kind, rows in (("sent_bytes", sent), ("received_bytes", received)):
            table = constant(rank, kind)
            for peer, n in sorted((table or {}).items(), key=lambda kv: int(kv[0])):
                rows.append({"rank": int(rank), "peer": int(peer), "bytes": n})
        payload[rank] = constant(rank, "payload_bytes")
    return {
        "name": workload,
        "ranks": ranks,
        "sent_bytes_per_step": sent,
        "received_bytes_per_step": received,
        "payload_bytes_per_step": payload,
        "per_step": per_step,
    }


def run_bundle(cfg: argparse.Namespace) -> dict[str, Any]:
    """Run the job once into ``cfg.out`` and write its manifest; returns the manifest."""
    cfg.slow_rank = slow_ranks(cfg)  # one {rank: ms}, as the manifest's config records it
    if problem := workload_refusal(cfg):
        raise Refused(problem)
    cuda = cuda_available()
    if cfg.workload == "ddp" and cfg.comm == "ddp" and cfg.comm_hook == "bf16" and not cuda:
        raise Refused("--comm-hook bf16: PyTorch's bf16_compress_hook needs CUDA and NCCL (it refuses gloo on CPU)")
    out: Path = cfg.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if getattr(cfg, "cuda_graphs", False) and not cuda:
        raise SystemExit(
            "--cuda-graphs needs a CUDA GPU (CUDA graphs replay GPU work); torch sees none on this machine: "
            "drop --cuda-graphs to run the job eagerly"
        )
    nsys = find_nsys() if cfg.capture == "nsys" else None
    diagnostics: list[str] = []
    if cfg.capture == "nsys" and nsys is None:
        # The contract: nsys when one is found, torch.profiler otherwise — said, not silent.
        diagnostics.append(
            "--capture nsys: no nsys found (PATH, $TRACEGUARD_NSYS, Debian's nsight-systems, Nsight "
            "Compute's bundled copy); captured with torch.profiler instead"
        )
        cfg.capture = "torch"
    nsys_ver = nsys_version(nsys) if nsys else None
    if cfg.capture == "nsys" and not cuda and (problem := nvtx_visibility_problem(nsys_ver, package_version("nvtx"))):
        raise SystemExit(f"--capture nsys: {problem}")
    if cfg.capture == "nsys" and not cuda and package_version("nvtx") is None:
        diagnostics.append("no Python nvtx package: a CPU job has no NVTX ranges (install nvtx==0.2.11)")
    if getattr(cfg, "gpu_metrics", False) and not (cfg.capture == "nsys" and cuda):
        diagnostics.append(
            "--gpu-metrics: GPU metrics are sampled by nsys on a GPU; this run "
            + ("has no CUDA GPU" if not cuda else f"captures with {cfg.capture}")
            + ", so none were collected (nvidia-smi dmon stays the link source)"
        )
    env = job_environment(cfg, out)
    dmon, side = _side_files(out)
    cmd = _launch_command(cfg, out, nsys, cuda)
    started = time.time()
    relaunches: list[dict[str, str]] = []
    try:
        for attempt in (1, 2):
            try:
                proc = subprocess.run(cmd, env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=cfg.timeout)
                rc, log = proc.returncode, proc.stdout + proc.stderr
            except subprocess.TimeoutExpired as exc:
                rc, log = 124, f"timed out after {cfg.timeout} s\n{exc.stdout or ''}{exc.stderr or ''}"
            if attempt == 1 and (why := nsys_did_not_start(cfg, out, rc, log)):
                # nsys itself failed before the job ran (seen on CI: Debian's nsys 2022.4 printing
                # "End of file" as two ranks' nsys start at once): once more, and the manifest says so.
                (out / "launcher.attempt1.log").write_text(log)
                relaunches.append({"why": why, "launcher_log": "launcher.attempt1.log"})
                diagnostics.append(f"{why}; the run was started again (first launcher log: launcher.attempt1.log)")
                continue
            break
    finally:
        if dmon is not None:
            dmon.terminate()
    seconds = time.time() - started
    (out / "launcher.log").write_text(log)

    ranks = []
    for rank in range(cfg.world_size):
        record_path = out / f"rank{rank}.json"
        record = json.loads(record_path.read_text()) if record_path.exists() else None
        ranks.append(
            {"rank": rank, "exit_status": 0 if record else (rc or 1), "record": record_path.name if record else None}
        )
    records = [json.loads((out / r["record"]).read_text()) for r in ranks if r["record"]]
    failures = rank_failures(out, cfg.world_size, log) if any(r["record"] is None for r in ranks) else []
    for failure in failures:
        ranks[failure["rank"]]["error"] = {k: failure.get(k) for k in ("type", "message", "frames", "source")}
    # A failed rank's own exception comes first: what went wrong, before what then could not be made.
    diagnostics[:0] = [failure_diagnostic(f, i == 0) for i, f in enumerate(failures)]
    if rc and not failures and not records:
        diagnostics.insert(0, f"the launcher exited {rc} before any rank wrote a record: {log.strip()[-300:]}")
    captures: list[dict[str, Any]] = []
    if cfg.capture == "nsys" and nsys:
        captures, problems = _export_reports(out, nsys, cfg.world_size, cfg.keep_reports)
        diagnostics += problems
        if getattr(cfg, "gpu_metrics", False) and cuda:
            diagnostics += _missing_gpu_metrics(out, captures, log)
    elif cfg.capture == "torch":
        captures = [
            {"path": f"rank{r['rank']}.trace.json", "rank": r["rank"], "tool": "torch.profiler"}
            for r in ranks
            if (out / f"rank{r['rank']}.trace.json").exists()
        ]
    if cfg.compress:
        captures = [_gzip(out, c) for c in captures]
    first = records[0] if records else {}
    throughputs = [r["throughput_steps_per_s"] for r in records if r.get("throughput_steps_per_s")]
    # Per run of the timed steps, the slowest rank's rate; the median of those is the throughput.
    repeats = [list(r.get("throughput_repeats_steps_per_s") or []) for r in records]
    paced = [min(rates) for rates in zip(*repeats, strict=False)] if repeats and all(repeats) else []
    manifest = {
        "traceguard_bundle": BUNDLE_VERSION,
        "created_unix": int(started),
        "command": cmd,
        "exit_status": rc,
        "seconds": round(seconds, 2),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(cfg).items() if k not in ("func",)},
        "environment": {k: v for k, v in env.items() if k.startswith("NCCL_")},
        "versions": {
            "python": first.get("python"),
            "torch": first.get("torch"),
            "cuda": first.get("cuda"),
            "nccl": first.get("nccl"),
            "nsys": nsys_ver,
            "nvtx": package_version("nvtx"),
            "driver": _driver_version(),
        },
        "gpus": sorted({r["gpu_name"] for r in records if r.get("gpu_name")}),
        # The slowest rank sets the pace of a synchronous job.
        "throughput_steps_per_s": (
            statistics.median(paced) if len(paced) > 1 else (min(throughputs) if throughputs else None)
        ),
        "throughput_repeats_steps_per_s": paced,
        # (max − min) ÷ median of the repeats: how far one timing can be trusted.
        "throughput_spread": (max(paced) - min(paced)) / statistics.median(paced) if len(paced) > 1 else None,
        "workload": workload_summary(cfg.workload, records),
        "gradient_bytes": first.get("gradient_bytes"),
        "ranks": ranks,
        "captures": captures,
        "nccl_logs": sorted(p.name for p in out.glob("nccl.*.log")),
        # GPU metrics live inside each rank's export; the manifest says they were asked for, and how.
        "gpu_metrics": (
            {"devices": "LOCAL_RANK", "frequency_hz": cfg.gpu_metrics_frequency, "set": cfg.gpu_metrics_set}
            if getattr(cfg, "gpu_metrics", False) and cfg.capture == "nsys" and cuda
            else None
        ),
        "inspector_logs": sorted(str(p.relative_to(out)) for p in (out / "inspector").glob("*") if p.is_file())
        if (out / "inspector").is_dir()
        else [],
        "side_files": side,
        # nsys failing before any rank's job ran is retried once; each such start is listed here
        # (and in diagnostics), so a reader can tell a recovered start from a run that went wrong.
        "relaunches": relaunches,
        "diagnostics": diagnostics,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def _gzip(out: Path, capture: dict[str, Any]) -> dict[str, Any]:
    import gzip

    source = out / capture["path"]
    target = source.with_name(source.name + ".gz")
    with source.open("rb") as src, gzip.open(target, "wb", compresslevel=9) as dst:
        shutil.copyfileobj(src, dst)
    source.unlink()
    return {**capture, "path": target.name}


def _driver_version() -> str | None:
    smi = shutil.which("nvidia-smi")
    if not smi or subprocess.run([smi, "-L"], capture_output=True, check=False).returncode != 0:
        return None
    text = _output([smi, "--query-gpu=driver_version", "--format=csv,noheader"])
    return text.splitlines()[0].strip() if text.strip() else None


# ---------------------------------------------------------------------------------------------
# Sweeps.

_POWERSGD = ["--comm-hook", "powersgd", "--powersgd-start-iter", "2"]

#: Named matrices: setting name → options changed from the sweep's base arguments.
MATRICES: dict[str, list[tuple[str, list[str]]]] = {
    # The study of issue 4 on two GPUs (ViT-L/32): what each setting engineers reach for costs.
    "gpu": [
        ("1gpu_no_ddp", ["--world-size", "1", "--comm", "none"]),
        ("ddp", []),
        ("static_graph", ["--static-graph"]),
        ("no_bucket_view", ["--no-bucket-view"]),
        ("bf16_hook", ["--comm-hook", "bf16"]),
        ("powersgd_hook", ["--comm-hook", "powersgd"]),
        ("bucket_100mb", ["--bucket-cap-mb", "100"]),
        ("bucket_2000mb", ["--bucket-cap-mb", "2000"]),
        ("shm_ddp", ["--no-p2p"]),
        ("shm_bf16_hook", ["--no-p2p", "--comm-hook", "bf16"]),
        ("shm_powersgd_hook", ["--no-p2p", "--comm-hook", "powersgd"]),
        ("cpu_staged", ["--comm", "cpu-staged"]),
    ],
    # The published DDP study (seed document 003) the way it was run: every comparison on ONE
    # 2000 MB bucket, cumulative (DDP; + static_graph; + gradient_as_bucket_view; + bf16 hook;
    # PowerSGD in place of bf16), then 25 / 100 MB buckets for the bf16 and PowerSGD variants —
    # each over P2P and over SHM. PowerSGD compresses from iteration 2 on, before the timed steps.
    "seed003": [
        (f"{link}{name}", [*link_options, *options])
        for link, link_options in (("", []), ("shm_", ["--no-p2p"]))
        for name, options in (
            ("ddp", ["--no-bucket-view", "--bucket-cap-mb", "2000"]),
            ("static_graph", ["--no-bucket-view", "--static-graph", "--bucket-cap-mb", "2000"]),
            ("bucket_view", ["--static-graph", "--bucket-cap-mb", "2000"]),
            ("bf16_hook", ["--static-graph", "--bucket-cap-mb", "2000", "--comm-hook", "bf16"]),
            ("powersgd_hook", ["--static-graph", "--bucket-cap-mb", "2000", *_POWERSGD]),
            ("bf16_hook_bucket25", ["--static-graph", "--bucket-cap-mb", "25", "--comm-hook", "bf16"]),
            ("bf16_hook_bucket100", ["--static-graph", "--bucket-cap-mb", "100", "--comm-hook", "bf16"]),
            ("powersgd_hook_bucket25", ["--static-graph", "--bucket-cap-mb", "25", *_POWERSGD]),
            ("powersgd_hook_bucket100", ["--static-graph", "--bucket-cap-mb", "100", *_POWERSGD]),
        )
    ],
    # The workloads of seed documents 001-002: broadcast/reduce fp32 vs fp16, blocking vs async;
    # pipeline GPipe vs 1F1B, blocking vs batched send/recv, on 2 and 4 stages; FSDP2 and TP beside.
    "seed001-002": [
        *(
            (f"bcast_reduce_{dtype}_{mode}", ["--workload", "broadcast-reduce", "--comm-dtype", dtype, *extra])
            for mode, extra in (("blocking", []), ("async", ["--async"]))
            for dtype in ("fp32", "fp16")
        ),
        *(
            (
                f"pipeline{stages}_{schedule}_{calls}",
                ["--workload", "pipeline", "--world-size", str(stages), "--schedule", schedule, "--p2p", calls],
            )
            for stages in (2, 4)
            for schedule in ("gpipe", "1f1b")
            for calls in ("blocking", "batched")
        ),
        ("fsdp", ["--workload", "fsdp"]),
        ("tensor_parallel", ["--workload", "tensor-parallel"]),
    ],
    # Known late ranks for the cross-rank analysis (issue 24): the same job clean, with rank 1's host
    # 30 ms late in every step's `get batch` (--slow-rank), and each over SHM (NCCL_P2P_DISABLE=1).
    "waits": [
        ("clean", []),
        ("slow_rank1", ["--slow-rank", "1:30"]),
        ("shm", ["--no-p2p"]),
        ("shm_slow_rank1", ["--no-p2p", "--slow-rank", "1:30"]),
    ],
    # A small CPU (gloo) matrix: every code path, fast.
    "cpu": [
        ("ddp", []),
        ("no_bucket_view", ["--no-bucket-view"]),
        ("powersgd_hook", ["--comm-hook", "powersgd"]),
        ("cpu_staged", ["--comm", "cpu-staged"]),
    ],
}


#: Options a matrix runs with unless the sweep's base arguments say otherwise: the seed studies time
#: throughput over 20 steps outside the capture, 3 times (median and spread in the manifest).
MATRIX_DEFAULTS: dict[str, list[str]] = {
    "seed003": ["--warmup", "3", "--timed", "20", "--repeats", "3"],
    "seed001-002": ["--warmup", "3", "--timed", "20", "--repeats", "3", "--microbatches", "8"],
}


def sweep(base: list[str], matrix: str, out: Path, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Run every setting of ``matrix`` into ``out/<setting>/``; writes ``out/sweep.json``.

    With ``only``, the settings run before into the same ``out`` (an earlier ``sweep.json`` of the
    same matrix) stay listed: a sweep split over several calls ends with one table."""
    if matrix not in MATRICES:
        raise SystemExit(f"unknown matrix {matrix!r}; choose one of {', '.join(MATRICES)}")
    out.mkdir(parents=True, exist_ok=True)
    earlier: dict[str, dict[str, Any]] = {}
    if only and (out / "sweep.json").exists():
        previous = json.loads((out / "sweep.json").read_text())
        if previous.get("matrix") == matrix:
            earlier = {s["name"]: s for s in previous.get("settings", [])}
    results = []
    for name, extra in MATRICES[matrix]:
        if only and name not in only:
            if name in earlier:
                results.append(earlier[name])
            continue
        cfg = run_parser().parse_args([*MATRIX_DEFAULTS.get(matrix, []), *base, *extra, "--out", str(out / name)])
        print(f"== {name}: {' '.join(extra) or '(base)'}", flush=True)
        try:
            manifest = run_bundle(cfg)
        except Refused as refused:
            print(f"   refused: {refused.code}", flush=True)
            results.append({"name": name, "options": extra, "bundle": name, "exit_status": 2, "refused": refused.code})
            continue
        print(
            f"   exit {manifest['exit_status']} in {manifest['seconds']} s, "
            f"{manifest['throughput_steps_per_s'] or 0:.2f} steps/s",
            flush=True,
        )
        results.append({"name": name, "options": extra, "bundle": name, "exit_status": manifest["exit_status"]})
    (out / "sweep.json").write_text(json.dumps({"matrix": matrix, "base": base, "settings": results}, indent=2) + "\n")
    return results


def run_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="traceguard harness run", description="Run the instrumented job (DDP or another --workload) once."
    )
    add_job_options(p)
    p.add_argument("--out", type=Path, required=True, help="bundle directory to write")
    return p


def sweep_parser(*, with_job_options: bool = False) -> argparse.ArgumentParser:
    """The sweep's own options; every other option is a job option, the base of every setting.

    ``with_job_options`` adds those too, for the help text (parsing leaves them to ``run_parser``).
    """
    p = argparse.ArgumentParser(
        prog="traceguard harness sweep",
        description="Run every setting of a matrix, one bundle per setting; other options are job options "
        "(those of `traceguard harness run`) applied to every setting.",
    )
    p.add_argument("--matrix", default="gpu", choices=sorted(MATRICES), help="named matrix of settings")
    p.add_argument("--out", type=Path, required=True, help="directory for one bundle per setting")
    p.add_argument("--only", action="append", help="run only these settings (repeatable)")
    if with_job_options:
        add_job_options(p.add_argument_group("job options (every setting)"))
    return p


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("run", "sweep"):
        print("usage: python -m traceguard.capture.harness run|sweep ...", file=sys.stderr)
        return 2
    if argv[0] == "run":
        manifest = run_bundle(run_parser().parse_args(argv[1:]))
        print(json.dumps({k: manifest[k] for k in ("exit_status", "seconds", "throughput_steps_per_s", "diagnostics")}))
        return 0 if manifest["exit_status"] == 0 else 1
    known, base = sweep_parser().parse_known_args(argv[1:])
    results = sweep(base, known.matrix, known.out, known.only)
    return 0 if all(r["exit_status"] == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
