"""``--slow-rank R:MS``: a known late rank, for testing cross-rank analysis against ground truth.

Rank R's host sleeps MS milliseconds at the start of every step's ``get batch`` range, before
forward — warm-up, timed and profiled steps alike — as a slow input pipeline would make it wait.
Its GPU then idles for that long each step and the other ranks' collectives wait for it: in a
2-rank DDP job the late rank's NCCL kernels start later than its peer's by about the sleep, while
both end together.

Standard library only: the harness (no torch) parses the option with the same code as the job.
"""

from __future__ import annotations

import argparse
import math
import time

#: Workloads whose every step has a ``get batch`` range that calls ``slow_input`` (the job refuses
#: ``--slow-rank`` for any other, rather than ignore it).
SLOW_INPUT_WORKLOADS = ("ddp", "pipeline", "broadcast-reduce", "fsdp", "tensor-parallel")

HELP = (
    "a known late rank: rank R's host sleeps MS milliseconds at the start of every step's `get batch` range, "
    "before forward (warm-up, timed and profiled steps alike; every --workload, --cuda-graphs too); several: "
    "comma-separated (1:30,3:10) or the option repeated"
)


def parse_slow_rank(text: str) -> dict[int, float]:
    """``R:MS[,R:MS...]`` → {rank: milliseconds}; an argparse ``type`` (raises ArgumentTypeError)."""
    out: dict[int, float] = {}
    for item in text.split(","):
        rank_text, sep, ms_text = item.strip().partition(":")
        try:
            rank, ms = int(rank_text), float(ms_text)
        except ValueError:
            rank, ms = -1, math.nan
        if not sep or rank < 0 or not math.isfinite(ms) or ms < 0:
            raise argparse.ArgumentTypeError(
                "expected RANK:MILLISECONDS (a rank >= 0 and a finite number of milliseconds >= 0, e.g. 1:30), "
                f"got {item.strip()!r}"
            )
        if rank in out:
            raise argparse.ArgumentTypeError(f"rank {rank} is given twice in {text!r}")
        out[rank] = ms
    return out


def merge_slow_ranks(values: list[dict[int, float]] | None) -> dict[int, float]:
    """Repeated ``--slow-rank`` options as one {rank: ms}, by rank; ValueError when a rank is given twice."""
    merged: dict[int, float] = {}
    for value in values or []:
        for rank, ms in value.items():
            if rank in merged:
                raise ValueError(f"--slow-rank: rank {rank} is given twice")
            merged[rank] = ms
    return dict(sorted(merged.items()))


def add_option(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    p.add_argument("--slow-rank", action="append", type=parse_slow_rank, default=None, metavar="R:MS", help=HELP)


def slow_input(seconds: float) -> None:
    """The sleep itself, called first thing inside ``get batch`` (nothing when ``seconds`` is 0)."""
    if seconds > 0:
        time.sleep(seconds)
