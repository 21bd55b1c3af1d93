"""Turn what ``seed_studies.py collect`` brought back into the committed fixture ``tests/fixtures/seed_studies``.

The whole bundles (3 profiled steps a rank, 0.6 MB a capture gzipped) do not fit the repository's
budget (the tree a device call carries is capped at 64 MiB), so:

1. every group's results table (``traceguard harness table``: results.md / results.json) is made
   here from the WHOLE bundles, with the group's profile;
2. every bundle keeps its manifest, rank records, launcher log, NCCL logs, Inspector logs, topo and
   dmon (``nvidia-smi -q`` once, under ``machine/``);
3. the bundles in :data:`KEEP_WHOLE` keep their captures as they are; those in :data:`KEEP` keep
   them trimmed to their first profiled step (:data:`TRIM_STEPS`: more)
   (``trim_capture.py``: as if the job had stopped there; no value changed) and gzipped.

    python bench/gpu/pack_seed_results.py COLLECTED_DIR [--out tests/fixtures/seed_studies] [--machine NAME]

A later session's runs (another host of the same kind) go beside the earlier ones with
``--machine machine_<session>``; a group a cut-short session left part-done gains the new rows.

COLLECTED_DIR holds the group folders and ``machine/`` (the packs untarred, in order).
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(Path(__file__).resolve().parent)]

from trim_capture import cut_time, trim  # noqa: E402

#: group → profile its table is judged with (the lent machine: NVLink NV18 between every pair).
GROUPS = {
    "seed003_2gpu": "h200-nvlink",
    "seed001-002_2gpu_p2p": "h200-nvlink",
    "seed001-002_2gpu_shm": "h200-nvlink",
    "seed001-002_4gpu_p2p": "h200-nvlink",
    "seed001-002_4gpu_shm": "h200-nvlink",
    "seed003_4gpu": "h200-nvlink",
    "seed001-002_2gpu_torch": "h200-nvlink",
    "waits_4gpu": "h200-nvlink",
}
#: Bundles whose captures are committed (first profiled step), for tests that re-read them:
#: PowerSGD on small buckets (its PCIe reads, a waiting collective), tensor parallel on torch 2.11,
#: a late rank among four, a 4-stage pipeline. (DtoD without the bucket view and SHM have committed H200 captures in
#: tests/fixtures/sweep_h200 and h200x2_links already.)
KEEP = {
    ("seed003_2gpu", "powersgd_hook_bucket100"),
    ("seed001-002_2gpu_p2p", "tensor_parallel"),
    ("waits_4gpu", "slow_rank1"),
    ("seed001-002_4gpu_p2p", "pipeline4_1f1b_blocking"),
}
#: Of these, only some ranks' captures: the 4-stage pipeline's middle stages, whose send/recv
#: kernels show PCIe traffic beside P2P transfers (the transport rule's false lead, fixed).
KEEP_RANKS = {("seed001-002_4gpu_p2p", "pipeline4_1f1b_blocking"): (1, 2)}
#: Steps kept where one is not enough: the late rank among four needs the profile's 3 steps.
TRIM_STEPS = {("waits_4gpu", "slow_rank1"): 3}
#: Captures committed without their GPU metrics (the late rank needs none; 3 steps × 4 ranks of 2 kHz
#: samples would be 1.6 MB): the rows are deleted, the catalog stays.
NO_GPU_METRICS = {("waits_4gpu", "slow_rank1")}
#: Bundles whose NCCL Inspector logs are committed (each collective of all 66 steps, up to 90 kB a
#: rank): one bucket over NVLink and over SHM, and PowerSGD's small all-reduces.
INSPECTOR = {
    ("seed003_2gpu", "bucket_view"),
    ("seed003_2gpu", "shm_bucket_view"),
    ("seed003_2gpu", "powersgd_hook_bucket100"),
    ("waits_4gpu", "slow_rank1"),
    ("seed003_4gpu", "bucket_view"),
    ("seed003_4gpu", "shm_bucket_view"),
}
#: Bundles small enough to keep whole (NCCL inside a CUDA graph: 0.1 MB a capture).
KEEP_WHOLE = {("cuda_graphs_2gpu", "node"), ("cuda_graphs_2gpu", "graph")}
SIDE = ("manifest.json", "launcher.log", "topo.txt", "dmon.txt", "sweep.json")


def pack(collected: Path, out: Path, machine_name: str = "machine") -> None:
    out.mkdir(parents=True, exist_ok=True)
    machine = out / machine_name
    machine.mkdir(exist_ok=True)
    for f in (collected / "machine").iterdir():
        if f.is_file() and f.name != "plugin_build.txt":
            shutil.copy2(f, machine / f.name)
    for group in sorted(p.name for p in collected.iterdir() if p.is_dir() and p.name != "machine"):
        source, target = collected / group, out / group
        target.mkdir(exist_ok=True)
        if group in GROUPS:
            subprocess.run(
                [sys.executable, "-m", "traceguard.cli", "harness", "table", str(source), "--profile", GROUPS[group]],
                check=True,
                cwd=REPO,
            )
            _merge_tables(source, target, GROUPS[group])
        for bundle in sorted(p for p in source.iterdir() if p.is_dir()):
            keep = target / bundle.name
            keep.mkdir(exist_ok=True)
            for f in bundle.iterdir():
                if f.name in SIDE or (f.name.startswith(("rank", "nccl.")) and not f.name.endswith(".trace.json.gz")):
                    shutil.copy2(f, keep / f.name)
            if (bundle / "inspector").is_dir() and (group, bundle.name) in INSPECTOR:
                (keep / "inspector").mkdir(exist_ok=True)
                for f in (bundle / "inspector").iterdir():
                    shutil.copy2(f, keep / "inspector" / f.name)
            if (bundle / "nvidia-smi-q.txt").exists() and not (machine / "nvidia-smi-q.txt").exists():
                shutil.copy2(bundle / "nvidia-smi-q.txt", machine / "nvidia-smi-q.txt")
            if (group, bundle.name) in KEEP_WHOLE:
                for capture in sorted(bundle.glob("cap_*.sqlite.gz")):
                    shutil.copy2(capture, keep / capture.name)
            if (group, bundle.name) in KEEP:
                ranks = KEEP_RANKS.get((group, bundle.name))
                for capture in sorted(bundle.glob("cap_*.sqlite.gz")):
                    if ranks is None or int(capture.name.split("_")[1].split(".")[0]) in ranks:
                        _trimmed(
                            capture,
                            keep / capture.name,
                            TRIM_STEPS.get((group, bundle.name), 1),
                            drop_metrics=(group, bundle.name) in NO_GPU_METRICS,
                        )


def _merge_tables(source: Path, target: Path, profile: str) -> None:
    """The group's sweep.json and results into ``target``: a later session's rows (a group a cut-short
    session left part-done, rerun with ``seed_studies.py start --groups GROUP:SETTING``) join the rows
    committed before, each table row made from its own whole bundle, in the matrix's order."""
    import json

    from traceguard.capture.harness import MATRICES
    from traceguard.report.sweep import render_markdown

    new_sweep = json.loads((source / "sweep.json").read_text())
    new_rows = json.loads((source / "results.json").read_text())["rows"]
    if (target / "sweep.json").exists() and (target / "results.json").exists():
        old_sweep = json.loads((target / "sweep.json").read_text())
        old_rows = json.loads((target / "results.json").read_text())["rows"]
    else:
        old_sweep, old_rows = {"settings": []}, []
    order = [name for name, _ in MATRICES[new_sweep["matrix"]]]

    def merged(old: list[dict], new: list[dict], key: str) -> list[dict]:
        by_name = {item[key]: item for item in old} | {item[key]: item for item in new}
        return sorted(by_name.values(), key=lambda item: order.index(item[key]))

    sweep = {**new_sweep, "settings": merged(old_sweep["settings"], new_sweep["settings"], "name")}
    rows = merged(old_rows, new_rows, "setting")
    (target / "sweep.json").write_text(json.dumps(sweep, indent=2) + "\n")
    (target / "results.json").write_text(
        json.dumps({"profile": profile, "matrix": new_sweep["matrix"], "rows": rows}, indent=2) + "\n"
    )
    (target / "results.md").write_text(render_markdown(rows, profile))


def _trimmed(capture: Path, target: Path, steps: int, *, drop_metrics: bool = False) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        full, cut = Path(tmp) / "full.sqlite", Path(tmp) / "cut.sqlite"
        with gzip.open(capture) as src, full.open("wb") as dst:
            shutil.copyfileobj(src, dst)
        trim(full, cut, cut_time(full, steps), 200_000, before_first_op=True)
        if drop_metrics:
            with sqlite3.connect(cut) as conn:
                conn.execute("DELETE FROM GPU_METRICS")
            with sqlite3.connect(cut) as conn:
                conn.execute("VACUUM")
        with cut.open("rb") as src, gzip.open(target, "wb", compresslevel=9) as dst:
            shutil.copyfileobj(src, dst)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("collected", type=Path)
    p.add_argument("--out", type=Path, default=REPO / "tests" / "fixtures" / "seed_studies")
    p.add_argument(
        "--machine", default="machine", help="folder for the machine's facts (a later session's host: its own)"
    )
    args = p.parse_args()
    pack(args.collected, args.out, args.machine)


if __name__ == "__main__":
    main()
