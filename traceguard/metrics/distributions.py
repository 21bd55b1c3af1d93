"""Distributions over ranks and the rank × step matrices: what a run of many ranks is reported by
(issue 30, ``docs/scale-out.md``), computed in the reduce from each rank's metrics and step scalars.

Definitions:

- A per-rank metric's **distribution** is over the ranks where it is known (``ranks``; the others
  are ``unknown``): ``min``, ``p50``, ``p95``, ``max`` (percentiles linearly interpolated between
  the closest ranks, NumPy's default), ``mean``, the ranks holding the min and the max (the lowest
  rank on a tie), and a histogram of :data:`HISTOGRAM_BINS` equal-width bins from min to max
  (``edges`` has one more value than ``counts``; the last bin includes the max; one bin when every
  rank has the same value).
- The **rank × step matrix** of a step field: one row per rank (rank order), one column per step
  index present on any rank (index order); a cell is the rank's value at that step, null where the
  rank has no such step or the value is unknown. With more than ``max_columns`` step indices,
  consecutive indices are binned into ``max_columns`` columns of equal index width and a cell is
  the mean of the known values in the bin (``binned`` says so; ``indices`` then gives each bin's
  first index).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from traceguard.metrics.rank import RankResult

HISTOGRAM_BINS = 10
#: Step-index columns of a rank × step matrix before indices are binned.
MATRIX_COLUMNS = 400


def distribution(values: dict[int, float]) -> dict[str, Any]:
    """The distribution (module docstring) of ``values`` (rank → value, known values only)."""
    if not values:
        return {"ranks": 0}
    ranks = np.fromiter(values.keys(), dtype=np.int64, count=len(values))
    data = np.fromiter(values.values(), dtype=np.float64, count=len(values))
    order = np.lexsort((ranks, data))
    low, high = float(data[order[0]]), float(data[order[-1]])
    top = ranks[data == high].min()
    if high > low:
        counts, edges = np.histogram(data, bins=HISTOGRAM_BINS, range=(low, high))
    else:
        counts, edges = np.array([data.size]), np.array([low, high])
    return {
        "ranks": int(data.size),
        "min": low,
        "p50": float(np.percentile(data, 50)),
        "p95": float(np.percentile(data, 95)),
        "max": high,
        "mean": float(data.mean()),
        "min_rank": int(ranks[order[0]]),
        "max_rank": int(top),
        "histogram": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
    }


def rank_distributions(results: Sequence[RankResult], keys: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Per metric key, its distribution over ``results``' ranks; ``unknown`` counts the ranks where
    it is null (or not a finite number)."""
    out: dict[str, dict[str, Any]] = {}
    for key in keys:
        known: dict[int, float] = {}
        for result in results:
            value = result.metrics.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                known[result.rank] = float(value)
        if not known and not any(key in r.metrics for r in results):
            continue
        out[key] = {**distribution(known), "unknown": len(results) - len(known)}
    return out


def rank_step_matrix(
    results: Sequence[RankResult], fields: Sequence[str], *, max_columns: int = MATRIX_COLUMNS
) -> dict[str, Any]:
    """The rank × step matrices (module docstring) of ``fields``, sharing rows and columns."""
    ranks = [r.rank for r in results]
    indices = sorted({int(s["index"]) for r in results for s in r.steps if s.get("index") is not None})
    if not indices:
        return {"ranks": ranks, "indices": [], "binned": False, "fields": {f: [] for f in fields}}
    first, last = indices[0], indices[-1]
    binned = len(indices) > max_columns
    width = math.ceil((last - first + 1) / max_columns) if binned else 1
    columns = sorted({(i - first) // width for i in indices}) if binned else list(range(len(indices)))
    column_of = {c: at for at, c in enumerate(columns)} if binned else {index: at for at, index in enumerate(indices)}
    out: dict[str, list[list[float | None]]] = {}
    for name in fields:
        sums = np.zeros((len(ranks), len(columns)))
        counts = np.zeros((len(ranks), len(columns)), dtype=np.int64)
        for row, result in enumerate(results):
            for step in result.steps:
                value, index = step.get(name), step.get("index")
                if index is None or not isinstance(value, int | float) or not math.isfinite(value):
                    continue
                at = column_of[(int(index) - first) // width] if binned else column_of[int(index)]
                sums[row, at] += value
                counts[row, at] += 1
        with np.errstate(invalid="ignore", divide="ignore"):
            means = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
        out[name] = [[None if math.isnan(v) else float(v) for v in row] for row in means]
    shown = [first + c * width for c in columns] if binned else indices
    return {"ranks": ranks, "indices": shown, "binned": binned, "bin_width": width, "fields": out}
