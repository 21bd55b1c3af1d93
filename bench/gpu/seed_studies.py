"""The seed studies on real GPUs (issues 28 and 31) as ONE background plan that short device calls collect.

A device call lasts at most 10 minutes and a machine goes back 30 s after a call, so the whole plan
runs detached on the machine (``start``) while each call waits for finished bundles and packs them
under ``$OUT`` (``collect``): the GPUs never idle between calls. The plan runs in priority order, so
whatever the session's device time allows is the most useful part:

1. ``seed003_2gpu``: ``harness sweep --matrix seed003`` (the published DDP study: one 2000 MB bucket,
   cumulative settings, then 25 / 100 MB buckets for bf16 and PowerSGD; P2P, then SHM), ViT-L/32,
   batch 32, 20 timed steps × 3 outside the capture, 3 steps under nsys with GPU metrics (2 kHz,
   each rank its own GPU) and the NCCL Inspector plugin.
2. ``seed001-002_2gpu_p2p`` / ``_shm``: broadcast/reduce fp32/fp16 × blocking/async, pipeline GPipe/1F1B
   × blocking/batched (2 stages), FSDP2, tensor parallel; MLP 8 × 8192² (2.1 GB fp32), batch 256 in 8
   microbatches; nsys with GPU metrics; P2P, then ``NCCL_P2P_DISABLE=1``.
3. ``cuda_graphs_2gpu``: the step as one CUDA graph with the all-reduce inside, nsys at node and at
   graph level.
4. ``seed001-002_2gpu_torch``: the same workloads under torch.profiler (Kineto's collective records
   carry sizes and peers), 5 timed steps (throughput is the nsys groups').
5. 4 GPUs (issue 31), where the machine has them: ``waits_4gpu`` (clean and ``--slow-rank 1:30``),
   ``seed001-002_4gpu_p2p`` / ``_shm`` (the 4-stage pipelines), ``seed003_4gpu``.

Every setting is its own ``sweep --only`` call into its group's folder (the sweep keeps the settings
run before in ``sweep.json``), and is tarred into ``ready/`` as soon as it ends.

    python3 bench/gpu/seed_studies.py start [--groups G[:S,S] ...]  # detached; returns at once
    OUT=/dir python3 bench/gpu/seed_studies.py collect --wait 520  # packs what finished under $OUT
    python3 bench/gpu/seed_studies.py plan                        # prints the plan

Needs only the standard library and the repository (the harness needs torch alone); on the GPU
machine, ``.gpuwork/`` holds ../shared/device's libdw/libelf .debs and nccl-inspector-src.tar.gz.
``--cpu-smoke`` runs the same plan on this CPU with a tiny MLP over gloo, to test the plan itself.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from traceguard.capture.harness import MATRICES  # noqa: E402  (stdlib-only module)

WORK = Path(os.environ.get("SEED_DIR", "/tmp/seed"))
READY = WORK / "ready"
#: A file back from a device call may hold 16 MiB, and 8 files come back: 7 packs and the status.
PACK_BYTES = 15 * 1024 * 1024
PACKS = 7

VIT = ["--model", "vit_l_32", "--batch-size", "32"]
MLP = ["--model", "mlp", "--mlp-width", "8192", "--mlp-depth", "8", "--batch-size", "256"]
NSYS = ["--capture", "nsys", "--gpu-metrics", "--gpu-metrics-frequency", "2000"]
COMMON = ["--backend", "nccl", "--compress", "--timeout", "240"]
#: The seeds' protocol where a group states it (the sweeps' defaults are the same): 3 warm-up
#: steps, then 3 × 20 timed steps outside the capture.
TIMED = ["--warmup", "3", "--timed", "20", "--repeats", "3"]


def _settings(matrix: str, stages: int | None = None) -> list[str]:
    """The matrix's settings; for seed001-002, the pipelines of ``stages`` stages (others: all but pipelines)."""
    names = [name for name, _ in MATRICES[matrix]]
    if stages is None:
        return names
    if stages == 2:
        return [n for n in names if not n.startswith("pipeline4")]
    return [n for n in names if n.startswith(f"pipeline{stages}")]


def plan(plugin: str | None, gpus: int) -> list[dict[str, Any]]:
    """The groups in priority order: name, matrix, settings, base options."""
    inspector = ["--nccl-inspector", plugin] if plugin else []
    groups = [
        {
            "name": "seed003_2gpu",
            "matrix": "seed003",
            "settings": _settings("seed003"),
            "base": [*VIT, *NSYS, *inspector, *COMMON, "--world-size", "2", "--steps", "3"],
        },
        {
            "name": "seed001-002_2gpu_p2p",
            "matrix": "seed001-002",
            "settings": _settings("seed001-002", 2),
            "base": [*MLP, *NSYS, *COMMON, "--world-size", "2", "--steps", "3"],
        },
        {
            "name": "seed001-002_2gpu_shm",
            "matrix": "seed001-002",
            "settings": _settings("seed001-002", 2),
            "base": [*MLP, *NSYS, *COMMON, "--world-size", "2", "--steps", "3", "--no-p2p"],
        },
        {
            "name": "cuda_graphs_2gpu",
            "runs": {
                trace: [
                    *MLP[:-2],
                    "--batch-size",
                    "64",
                    "--capture",
                    "nsys",
                    "--cuda-graphs",
                    "--cuda-graph-trace",
                    trace,
                    *COMMON,
                    "--world-size",
                    "2",
                    "--comm",
                    "allreduce",
                    *TIMED,
                    "--steps",
                    "3",
                ]
                for trace in ("node", "graph")
            },
        },
    ]
    if gpus >= 4:
        groups += [
            {
                "name": "waits_4gpu",
                "matrix": "waits",
                "settings": ["clean", "slow_rank1"],
                "base": [
                    *VIT,
                    *NSYS,
                    *inspector,
                    *COMMON,
                    "--world-size",
                    "4",
                    "--bucket-cap-mb",
                    "2000",
                    *TIMED,
                    "--steps",
                    "6",
                ],
            },
            {
                "name": "seed001-002_4gpu_p2p",
                "matrix": "seed001-002",
                "settings": _settings("seed001-002", 4),
                "base": [*MLP, *NSYS, *COMMON, "--steps", "3"],
            },
            {
                "name": "seed001-002_4gpu_shm",
                "matrix": "seed001-002",
                "settings": _settings("seed001-002", 4),
                "base": [*MLP, *NSYS, *COMMON, "--steps", "3", "--no-p2p"],
            },
            {
                "name": "seed003_4gpu",
                "matrix": "seed003",
                "settings": _settings("seed003"),
                "base": [*VIT, *NSYS, *inspector, *COMMON, "--world-size", "4", "--steps", "3"],
            },
        ]
    # Kineto's view of the 2-GPU workloads last: nsys already has their throughput and kernels.
    groups.append(
        {
            "name": "seed001-002_2gpu_torch",
            "matrix": "seed001-002",
            "settings": _settings("seed001-002", 2),
            "base": [
                *MLP,
                "--capture",
                "torch",
                *COMMON,
                "--world-size",
                "2",
                "--steps",
                "3",
                "--timed",
                "5",
                "--repeats",
                "1",
            ],
        }
    )
    return groups


def _cpu_smoke(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan shrunk for a CPU: a 64-wide MLP over gloo, one timed step, every group's first two settings."""
    small = ["--model", "mlp", "--mlp-width", "64", "--mlp-depth", "3", "--batch-size", "16", "--microbatches", "2"]

    def shrink(options: list[str]) -> list[str]:
        out, skip = [], 0
        drop = {
            "--model": 1,
            "--mlp-width": 1,
            "--mlp-depth": 1,
            "--batch-size": 1,
            "--backend": 1,
            "--timed": 1,
            "--repeats": 1,
            "--gpu-metrics-frequency": 1,
            "--cuda-graphs": 0,
            "--cuda-graph-trace": 1,
        }
        for item in options:
            if skip:
                skip -= 1
                continue
            if item in drop:
                skip = drop[item]
                continue
            out.append(item)
        return [*out, *small, "--backend", "gloo", "--timed", "1", "--repeats", "2"]

    shrunk = []
    for group in groups:
        group = dict(group)
        if "runs" in group:
            group["runs"] = {k: shrink(v) for k, v in list(group["runs"].items())[:1]}
        else:
            group["settings"] = group["settings"][:2]
            group["base"] = shrink(group["base"])
        shrunk.append(group)
    return shrunk


def _log(message: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {message}"
    print(line, flush=True)
    with (WORK / "progress.txt").open("a") as f:
        f.write(line + "\n")


def _setup() -> str | None:
    """nsys (Nsight Compute's copy with the importer's libdw, ../shared/docs/NSYS.md) and the Inspector
    plugin built from source; machine facts under ``WORK/machine``. Returns the plugin's path or None."""
    gpuwork = REPO / ".gpuwork"
    machine = WORK / "machine"
    machine.mkdir(parents=True, exist_ok=True)
    for deb in sorted(gpuwork.glob("*.deb")):
        subprocess.run(["dpkg", "-x", str(deb), "/tmp/libdw"], check=False)
    os.environ["LD_LIBRARY_PATH"] = ":".join(
        filter(None, ["/tmp/libdw/usr/lib/x86_64-linux-gnu", os.environ.get("LD_LIBRARY_PATH")])
    )
    hosts = sorted(glob.glob("/opt/nvidia/nsight-compute/*/host"))
    if hosts:
        host = Path(hosts[-1])
        if not (host / "host-linux-x64").exists():
            (host / "host-linux-x64").symlink_to("linux-desktop-glibc_2_11_3-x64")
        os.environ["TRACEGUARD_NSYS"] = str(host / "target-linux-x64" / "nsys")
    plugin = None
    source = gpuwork / "nccl-inspector-src.tar.gz"
    libs = sorted(glob.glob("/usr/local/cuda*/targets/x86_64-linux/lib"))
    if source.exists() and libs:
        subprocess.run(["tar", "-xzf", str(source), "-C", "/tmp"], check=False)
        build = subprocess.run(
            [
                "make",
                "-j8",
                "libnccl-profiler-inspector.so",
                "CUDA_HOME=/tmp",
                "CXXSTD=-std=c++17",
                f"CUDA_INC={libs[0][:-4]}/include",
                f"CUDA_LIB={libs[0]}",
            ],
            cwd="/tmp/nccl-inspector",
            capture_output=True,
            text=True,
            check=False,
        )
        (machine / "plugin_build.txt").write_text(build.stdout + build.stderr)
        found = sorted(Path("/tmp/nccl-inspector").rglob("libnccl-profiler-inspector.so"))
        plugin = str(found[0]) if found else None
        os.environ["LD_LIBRARY_PATH"] = f"{libs[0]}:{os.environ['LD_LIBRARY_PATH']}"
    for name, cmd in {
        "topo.txt": ["nvidia-smi", "topo", "-m"],
        "nvidia-smi-L.txt": ["nvidia-smi", "-L"],
        "nvidia-smi-q.txt": ["nvidia-smi", "-q"],
        "nsys-version.txt": [os.environ.get("TRACEGUARD_NSYS", "nsys"), "--version"],
        "versions.txt": [
            sys.executable,
            "-c",
            "import torch; print('torch', torch.__version__, 'cuda', "
            "torch.version.cuda, 'nccl', torch.cuda.nccl.version() if torch.cuda.is_available() "
            "else None, 'gpus', torch.cuda.device_count())",
        ],
    }.items():
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
            (machine / name).write_text(done.stdout + done.stderr)
        except (OSError, subprocess.TimeoutExpired) as exc:
            (machine / name).write_text(f"{exc}\n")
    (machine / "env.txt").write_text(
        "".join(f"{k}={v}\n" for k, v in sorted(os.environ.items()) if k.startswith(("NCCL_", "TORCH_", "NVSHMEM_")))
    )
    with tarfile.open(READY / "00_machine.tar", "w") as tar:
        tar.add(machine, arcname="machine")
    return plugin


def _gpu_count() -> int:
    try:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.splitlines() if line.startswith("GPU "))


def _ready(group: str, item: str, paths: list[Path]) -> None:
    target = READY / f"{time.time():.0f}_{group}__{item}.tar"
    with tarfile.open(target, "w") as tar:
        for path in paths:
            if path.exists():
                tar.add(path, arcname=f"{group}/{path.name}")


def wanted_settings(wanted: list[str] | None) -> dict[str, set[str] | None]:
    """``--groups`` items, ``group`` (all its settings) or ``group:setting,setting`` (only those; the
    rows a cut-short session did not reach), as {group: settings or None}."""
    chosen: dict[str, set[str] | None] = {}
    for item in wanted or []:
        group, _, settings = item.partition(":")
        chosen[group] = set(settings.split(",")) if settings else None
    return chosen


def run(groups_wanted: list[str] | None, cpu_smoke: bool) -> None:
    WORK.mkdir(parents=True, exist_ok=True)
    READY.mkdir(exist_ok=True)
    plugin = None if cpu_smoke else _setup()
    gpus = _gpu_count() if not cpu_smoke else 4
    groups = plan(plugin, gpus)
    if cpu_smoke:
        groups = _cpu_smoke(groups)
    _log(f"start: {gpus} GPUs, plugin {plugin}, groups {[g['name'] for g in groups]}")
    chosen = wanted_settings(groups_wanted)
    known = {g["name"] for g in groups}
    if unknown := sorted(set(chosen) - known):
        _log(f"not in the plan (with {gpus} GPUs): {unknown}")
    for group in groups:
        if chosen and group["name"] not in chosen:
            continue
        if only := chosen.get(group["name"]):
            if "runs" in group:
                group = {**group, "runs": {k: v for k, v in group["runs"].items() if k in only}}
            else:
                group = {**group, "settings": [s for s in group["settings"] if s in only]}
        folder = WORK / group["name"]
        folder.mkdir(parents=True, exist_ok=True)
        harness = [sys.executable, "-m", "traceguard.capture.harness"]
        items = (
            [
                (name, [*harness, "run", *options, "--out", str(folder / name)])
                for name, options in group["runs"].items()
            ]
            if "runs" in group
            else [
                (
                    name,
                    [
                        *harness,
                        "sweep",
                        "--matrix",
                        group["matrix"],
                        "--out",
                        str(folder),
                        "--only",
                        name,
                        *group["base"],
                    ],
                )
                for name in group["settings"]
            ]
        )
        for name, cmd in items:
            started = time.time()
            log = folder / f"{name}.log"
            with log.open("w") as f:
                f.write(" ".join(cmd) + "\n")
                f.flush()
                try:
                    rc = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, timeout=420).returncode
                except subprocess.TimeoutExpired:
                    rc = 124
            _log(f"{group['name']}/{name}: rc {rc} in {time.time() - started:.0f} s")
            for nccl in (folder / name).glob("nccl.*.log"):
                subprocess.run(["gzip", "-9", str(nccl)], check=False)
            for lines in (folder / name / "inspector").glob("*.log"):
                subprocess.run(["gzip", "-9", str(lines)], check=False)
            _ready(group["name"], name, [folder / name, log, folder / "sweep.json"])
    _log("plan done")
    (WORK / "DONE").write_text("done\n")


def collect(wait: float, out: Path) -> None:
    """Wait up to ``wait`` s (less once the plan is done), then pack every ready tar not collected
    before into at most ``PACKS`` files of ``PACK_BYTES`` under ``out``; the rest waits for the next call."""
    deadline = time.time() + wait
    while time.time() < deadline and not (WORK / "DONE").exists():
        time.sleep(5)
    out.mkdir(parents=True, exist_ok=True)
    collected = WORK / "collected"
    collected.mkdir(parents=True, exist_ok=True)
    pending = sorted(p for p in READY.glob("*.tar") if not (collected / p.name).exists())
    packs: list[list[Path]] = []
    size = 0
    for path in pending:
        n = path.stat().st_size
        if not packs or size + n > PACK_BYTES:
            if len(packs) == PACKS:
                break
            packs.append([])
            size = 0
        packs[-1].append(path)
        size += n
    for i, members in enumerate(packs):
        with tarfile.open(out / f"pack{i}_{int(time.time())}.tar", "w") as tar:
            for path in members:
                tar.add(path, arcname=path.name)
                (collected / path.name).touch()
    left = len(pending) - sum(len(p) for p in packs)
    status = (WORK / "progress.txt").read_text() if (WORK / "progress.txt").exists() else "no progress yet\n"
    (out / "status.txt").write_text(status + f"packed {sum(len(p) for p in packs)}, left for later {left}\n")
    print(status[-3000:], f"packed {sum(len(p) for p in packs)}, left {left}", sep="\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="verb", required=True)
    start = sub.add_parser("start", help="run the plan detached (setsid)")
    for q in (start, sub.add_parser("run", help="run the plan in the foreground")):
        q.add_argument("--groups", nargs="*", help="only these groups; GROUP:S1,S2 runs only those settings")
        q.add_argument("--cpu-smoke", action="store_true", help="the plan shrunk for a CPU (gloo, tiny MLP)")
    c = sub.add_parser("collect", help="pack finished bundles under $OUT")
    c.add_argument("--wait", type=float, default=0.0, help="seconds to wait for more to finish")
    sub.add_parser("plan", help="print the plan")
    args = p.parse_args()
    if args.verb == "start":
        WORK.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, __file__, "run", *(["--cpu-smoke"] if args.cpu_smoke else [])]
        if args.groups:
            cmd += ["--groups", *args.groups]
        with (WORK / "master.log").open("a") as log:
            subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=REPO)
    elif args.verb == "run":
        run(args.groups, args.cpu_smoke)
    elif args.verb == "collect":
        collect(args.wait, Path(os.environ.get("OUT", "/tmp/out")))
    else:
        print(json.dumps(plan("PLUGIN", 4), indent=1))


if __name__ == "__main__":
    main()
