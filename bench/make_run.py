#!/usr/bin/env python3
"""Make an N-rank run directory from real multi-rank nsys captures, scaled to benchmark size.

::

    python bench/make_run.py --ranks 64 --kernels-per-rank 160000 --out bench/work/run64

Every rank file is a real H200 capture (by default the four ranks of
``tests/fixtures/h200x4/p2p_nsys``: one 4×H200 ViT-L/32 DDP job, 5 308 kernels per rank)
scaled by ``scale_capture.py``'s doubling (whole copies, rounded up) and then made into one rank
of a larger job:

- The job is laid out as nodes of ``--ranks-per-node`` GPUs (default: as many as there are
  sources, 4). Rank ``r`` is local rank ``r % ranks_per_node`` of node ``r // ranks_per_node``
  and is made from source ``r % len(sources)``, so the four local ranks of every node are the
  four distinct real ranks of the source job, with their own real launch skew and their own
  collectives.
- The environment nsys recorded for the process (``META_DATA_CAPTURE``) is rewritten to the new
  rank: ``RANK``, ``LOCAL_RANK``, ``GROUP_RANK`` (the node), ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``,
  ``ROLE_RANK``, ``ROLE_WORLD_SIZE``, ``GROUP_WORLD_SIZE`` (torchrun sets them all);
  the capture host (``TARGET_INFO_SYSTEM_ENV`` ``Hostname``) becomes ``node<NN>``.
- Every timestamp of the file (each table's ``start``/``end`` columns, ``ANALYSIS_DETAILS``
  ``startTime``/``stopTime``) is shifted by the node's clock offset: one value per node drawn
  uniformly from ``[-skew, +skew]`` ns (``--skew-us``, default 200 µs, seeded), i.e. what
  NTP-synchronised hosts typically disagree by; ranks of one node share a clock, as they do
  on a real machine.

The directory gets ``rank<NNN>.sqlite`` files, a ``manifest.json`` that traceguard reads as a run
bundle (``"captures": [{"path": ..., "rank": N}, ...]``, plus each rank's node, source path and
sha256, copies, kernels and clock offset) and a ``README.md`` saying how it was made. Scaling is
done once per source (into ``OUT/.base/``, removed at the end); each rank is a file copy plus a
few ``UPDATE`` statements, so 64 ranks of 160 k kernels take about a minute and 2.6 GB of disk.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import shutil
import sqlite3
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import scale_capture  # noqa: E402  (a sibling script, not a package)

REPO = HERE.parent
DEFAULT_SOURCES = tuple(REPO / "tests/fixtures/h200x4/p2p_nsys" / f"cap_{i}.sqlite.gz" for i in range(4))


def _timed_tables(conn: sqlite3.Connection) -> list[tuple[str, list[str]]]:
    """Tables with ``start``/``end`` timestamp columns, and which of the two each has."""
    out = []
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name"):
        cols = [row[1] for row in conn.execute(f'PRAGMA table_info("{name}")')]
        stamped = [c for c in ("start", "end") if c in cols]
        if stamped:
            out.append((name, stamped))
    return out


def make_rank(
    base: Path, out: Path, *, rank: int, node: int, local_rank: int, world: int, per_node: int, offset_ns: int
) -> None:
    """Copy the scaled ``base`` to ``out`` and make it rank ``rank`` of a ``world``-rank job."""
    shutil.copyfile(base, out)
    conn = sqlite3.connect(out, isolation_level=None)
    conn.executescript("PRAGMA journal_mode=OFF; PRAGMA synchronous=OFF; BEGIN;")
    if offset_ns:
        for table, cols in _timed_tables(conn):
            sets = ", ".join(f'"{c}" = "{c}" + {offset_ns}' for c in cols)
            conn.execute(f'UPDATE "{table}" SET {sets}')
        conn.execute(
            f"UPDATE ANALYSIS_DETAILS SET startTime = startTime + {offset_ns}, stopTime = stopTime + {offset_ns}"
        )
    values = {
        "RANK": rank,
        "LOCAL_RANK": local_rank,
        "GROUP_RANK": node,
        "WORLD_SIZE": world,
        "LOCAL_WORLD_SIZE": per_node,
        "ROLE_RANK": rank,  # torchrun's rank within the worker role: the global rank here
        "ROLE_WORLD_SIZE": world,
        "GROUP_WORLD_SIZE": -(-world // per_node),  # torchrun's number of nodes
    }
    for key, value in values.items():
        conn.execute(
            "UPDATE META_DATA_CAPTURE SET value = ? WHERE name LIKE 'PROCESS_%:ENVIRONMENT_VARIABLE' AND value LIKE ?",
            (f'{key}="{value}"', f"{key}=%"),
        )
    conn.execute("UPDATE TARGET_INFO_SYSTEM_ENV SET value = ? WHERE name = 'Hostname'", (f"node{node:02d}",))
    conn.execute("COMMIT")
    conn.close()


def make_run(
    sources: list[Path], out: Path, *, ranks: int, kernels_per_rank: int, per_node: int, skew_us: float, seed: int
) -> dict:
    """Write the run directory; return its manifest."""
    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("rank*.sqlite"):
        old.unlink()
    base_dir = out / ".base"
    base_dir.mkdir(exist_ok=True)
    bases: list[tuple[Path, dict]] = []
    for i, src in enumerate(sources[:ranks]):  # only the sources some rank is made from
        base = base_dir / f"source{i}.sqlite"
        log = io.StringIO()
        with contextlib.redirect_stdout(log):  # scale_capture's progress lines: not needed here
            scale_capture.scale_nsys(src, base, kernels_per_rank, 1_000_000)
        side = Path(f"{base}.scale.json")
        bases.append((base, json.loads(side.read_text())))
        side.unlink()
        print(
            f"scaled {src.relative_to(REPO) if src.is_relative_to(REPO) else src}: "
            f"{bases[-1][1]['rows']['CUPTI_ACTIVITY_KIND_KERNEL']:,} kernels",
            flush=True,
        )

    rng = random.Random(seed)
    nodes = -(-ranks // per_node)
    skew_ns = round(skew_us * 1000)
    offsets = [rng.randint(-skew_ns, skew_ns) for _ in range(nodes)]
    captures = []
    for rank in range(ranks):
        node, local = divmod(rank, per_node)
        base, facts = bases[rank % len(sources)]
        name = f"rank{rank:03d}.sqlite"
        make_rank(
            base,
            out / name,
            rank=rank,
            node=node,
            local_rank=local,
            world=ranks,
            per_node=per_node,
            offset_ns=offsets[node],
        )
        src = Path(facts["source"])
        captures.append(
            {
                "path": name,
                "rank": rank,
                "node": node,
                "local_rank": local,
                "host": f"node{node:02d}",
                "clock_offset_ns": offsets[node],
                "source": str(src.relative_to(REPO)) if src.is_relative_to(REPO) else str(src),
                "source_sha256": facts["source_sha256"],
                "source_kernels": facts["source_kernels"],
                "copies": facts["copies"],
                "kernels": facts["rows"]["CUPTI_ACTIVITY_KIND_KERNEL"],
                "rows": facts["rows"],
                "bytes": (out / name).stat().st_size,
            }
        )
    shutil.rmtree(base_dir)
    manifest = {
        "generator": "bench/make_run.py",
        "ranks": ranks,
        "ranks_per_node": per_node,
        "nodes": nodes,
        "kernels_per_rank_target": kernels_per_rank,
        "kernels_total": sum(c["kernels"] for c in captures),
        "bytes_total": sum(c["bytes"] for c in captures),
        "skew_us": skew_us,
        "seed": seed,
        "build_s": round(time.perf_counter() - t0, 1),
        "captures": captures,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    _write_readme(out, manifest)
    print(
        f"wrote {out}: {ranks} ranks on {nodes} nodes, {manifest['kernels_total']:,} kernels, "
        f"{manifest['bytes_total'] / 1e9:.2f} GB in {manifest['build_s']} s"
    )
    return manifest


def _write_readme(out: Path, manifest: dict) -> None:
    sources: dict[str, dict] = {}
    for c in manifest["captures"]:
        sources.setdefault(c["source"], c)
    lines = [
        f"# Generated run: {manifest['ranks']} ranks, {manifest['kernels_total']:,} kernels",
        "",
        "Made by `bench/make_run.py` (see its docstring); not a real job of this size. Each rank file is",
        "a real H200 nsys capture scaled by whole copies (`bench/scale_capture.py`), given its rank",
        "(`RANK`/`LOCAL_RANK`/`GROUP_RANK`/`WORLD_SIZE` in the recorded environment, and in",
        "`manifest.json`), the host `node<NN>`, and its node's clock offset.",
        "",
        f"- {manifest['nodes']} nodes × {manifest['ranks_per_node']} ranks; node clock offsets uniform in "
        f"±{manifest['skew_us']} µs (seed {manifest['seed']})",
        f"- {manifest['bytes_total'] / 1e9:.2f} GB in all; built in {manifest['build_s']} s",
        "",
        "| source | sha256 | kernels in source | copies | kernels per rank | ranks |",
        "|---|---|---|---|---|---|",
    ]
    for src, c in sources.items():
        used = [x["rank"] for x in manifest["captures"] if x["source"] == src]
        shown = ", ".join(map(str, used[:4])) + (", …" if len(used) > 4 else "")
        lines.append(
            f"| `{src}` | `{c['source_sha256'][:16]}…` | {c['source_kernels']:,} | {c['copies']} | "
            f"{c['kernels']:,} | {len(used)} ({shown}) |"
        )
    (out / "README.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--sources",
        type=Path,
        nargs="+",
        default=list(DEFAULT_SOURCES),
        help="real nsys captures (.sqlite[.gz]), one per local rank (default: h200x4/p2p_nsys)",
    )
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument(
        "--kernels-per-rank", type=int, default=156_250, help="rounded up to whole copies (default: 10 M / 64)"
    )
    parser.add_argument("--ranks-per-node", type=int, default=None, help="default: the number of sources")
    parser.add_argument("--skew-us", type=float, default=200.0, help="node clock offsets uniform in ±this")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    make_run(
        [p.resolve() for p in args.sources],
        args.out,
        ranks=args.ranks,
        kernels_per_rank=args.kernels_per_rank,
        per_node=args.ranks_per_node or len(args.sources),
        skew_us=args.skew_us,
        seed=args.seed,
    )


if __name__ == "__main__":
    main()
