"""CUDA graphs: how much GPU time runs in graphs, how they were traced, and what that hides.

Definitions (DESIGN.md's conventions: nanoseconds, per device then summed):

- A *graph execution* is a GPU op of kind ``graph``: one replay of a CUDA graph traced as a whole
  (nsys ``--cuda-graph-trace=graph``, its default). It is a real GPU interval, launched by its
  ``cudaGraphLaunch`` (same correlation id), so it counts in step spans and busy time; the kernels,
  copies and NCCL collectives it ran are not in the capture.
- *Graph-launched ops* are kernels, copies and sets whose launching API call is a graph launch
  (``cudaGraphLaunch*``, ``cuGraphLaunch*``): the nodes of a graph traced node by node (nsys
  ``--cuda-graph-trace=node``, torch.profiler). They are ordinary ops; nothing is hidden.
- ``graph_ns``: the union of graph-execution intervals; ``graph_launched_ns`` the union of
  graph-launched ops; ``gpu_busy_ns`` the union of all GPU ops (each per device, summed), all over
  the analysis window (``gpu_busy_ns`` is only computed, and otherwise None, when graphs ran).
- Trace mode: ``"graph"`` when the window holds graph executions and no graph-launched ops,
  ``"node"`` for the reverse, ``"mixed"`` for both, None when no graph ran.

While the window holds graph executions, every metric that counts what runs inside them
(:data:`HIDDEN_BY_GRAPHS`: NCCL time and share, exposed communication, copies, collectives by
type) is None with :func:`hidden_reason`, which names the fix, instead of a value that would read
too low and let a check pass.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import polars as pl

from traceguard.metrics import small_collectives
from traceguard.metrics.intervals import union_ns

#: The capture option that shows what runs inside graphs.
NODE_TRACE_FIX = (
    "re-capture with `nsys profile --cuda-graph-trace=node` (or torch.profiler, which records graph kernels)"
)
#: API calls that launch a graph.
GRAPH_LAUNCH = r"^cu(?:da)?GraphLaunch"

#: Rank metrics that need the kernels and copies inside graph executions.
HIDDEN_BY_GRAPHS: tuple[str, ...] = (
    "nccl_kernels",
    "nccl_time_ns",
    "nccl_exposed_ns",
    "nccl_step_ns",
    "nccl_share_of_step",
    "allreduce_bytes_per_step",
    "gradient_reduction_bytes_per_step",
    "dtod_to_gradient_ratio",
    "gpu_to_cpu_copies",
    "gpu_to_cpu_bytes",
    "gpu_to_cpu_copy_rate",
    "gpu_to_cpu_copies_per_step",
    "dtod_copies",
    "dtod_bytes",
    "dtod_bytes_in_steps",
    "dtod_bytes_per_step",
    "peer_copies",
    "peer_bytes",
    # metrics.small_collectives: the collective calls a step makes, their sizes and time.
    *small_collectives.RANK_METRICS,
)


def graph_launch_name_ids(strings: pl.DataFrame) -> pl.Series:
    """Interned names of graph-launch API calls."""
    return strings.filter(pl.col("value").str.contains(GRAPH_LAUNCH))["id"]


def launched_by_graph(ops: pl.DataFrame, strings: pl.DataFrame) -> pl.Expr:
    """Per op: not a graph execution, launched by a graph-launch API call (node-level tracing)."""
    if "launch_name_id" not in ops.columns:
        return pl.lit(False)
    ids = graph_launch_name_ids(strings).cast(ops.schema["launch_name_id"])
    if not ids.len():
        return pl.lit(False)
    return (pl.col("kind") != "graph") & pl.col("launch_name_id").is_in(ids.implode()).fill_null(False)


#: What :func:`summary` asks ``busy`` for: the union ns over devices of the window's graph
#: executions, of its graph-launched ops, and of all its ops.
BUSY_PARTS = ("graph", "launched", "all")


def summarize(ops: pl.DataFrame, mask: pl.Series, strings: pl.DataFrame) -> dict[str, Any]:
    """Graph executions and graph-launched ops of the window (``ops`` where ``mask``). Counts
    first, over two columns (a 10 M-op capture without graphs pays one pass, no copy); the unions
    only when there are graphs."""
    is_graph = pl.col("kind") == "graph"
    in_window = pl.lit(mask.fill_null(False))
    launched = launched_by_graph(ops, strings)
    counts = ops.select((is_graph & in_window).sum().alias("g"), (launched & in_window).sum().alias("l")).row(0)
    conditions = {"graph": is_graph, "launched": launched, "all": pl.lit(True)}

    def busy(part: str) -> int:
        frame = ops.lazy().filter(conditions[part] & in_window).select("device", "start", "end")
        return int(union_ns(frame.drop_nulls(["start", "end"]), ["device"]).collect()["union_ns"].sum() or 0)

    return summary(int(counts[0] or 0), int(counts[1] or 0), busy)


def summary(graph_count: int, launched_count: int, busy: Callable[[str], int]) -> dict[str, Any]:
    """The window's graph summary from its counts of graph executions and graph-launched ops;
    ``busy`` (one of :data:`BUSY_PARTS` → ns) is asked only when there are any."""
    mode = "mixed" if graph_count and launched_count else "graph" if graph_count else "node" if launched_count else None
    result: dict[str, Any] = {
        "cuda_graph_trace": mode,
        "graph_executions": graph_count,
        "graph_ns": 0,
        "graph_launched_ops": launched_count,
        "graph_launched_ns": 0,
        "gpu_busy_ns": None,
    }
    if mode is None:
        return result
    result["graph_ns"] = busy("graph") if graph_count else 0
    result["graph_launched_ns"] = busy("launched") if launched_count else 0
    result["gpu_busy_ns"] = busy("all")
    return result


def hidden_reason(summary: dict[str, Any]) -> str:
    """Why a metric that counts what runs inside graphs is unknown here, and the fix."""
    share = summary["graph_ns"] / summary["gpu_busy_ns"] if summary["gpu_busy_ns"] else None
    of_busy = f", {share:.0%} of the GPU busy time" if share is not None else ""
    return (
        f"{summary['graph_executions']} CUDA graph execution(s) ({summary['graph_ns'] / 1e6:.3f} ms{of_busy}) were "
        "traced as a whole (nsys --cuda-graph-trace=graph, its default): the kernels, copies and NCCL "
        f"collectives inside them are not in the capture, so a count would read too low; {NODE_TRACE_FIX}"
    )


def hide(metrics: dict[str, Any], null: dict[str, str], summary: dict[str, Any]) -> None:
    """Null every :data:`HIDDEN_BY_GRAPHS` metric when the window holds graph executions. The NCCL
    share's reason keeps the visible part as a stated lower bound. Safe to call again once more
    metrics exist (an earlier reason, lower bound included, is kept)."""
    if not summary["graph_executions"]:
        return
    reason = hidden_reason(summary)
    visible_share = metrics.get("nccl_share_of_step")
    for key in HIDDEN_BY_GRAPHS:
        if key in metrics:
            metrics[key] = None
            if not null.get(key, "").startswith(reason):
                null[key] = reason
    metrics["gradient_reduction_collective"] = None
    if visible_share is not None:
        null["nccl_share_of_step"] = (
            f"{reason}. NCCL kernels outside the graphs alone give {visible_share:.2%}: a lower bound only"
        )


def hide_in_steps(rows: list[dict[str, Any]], ops: pl.DataFrame, steps: pl.DataFrame) -> None:
    """Per step row holding graph executions: ``graph_ns`` (their union) and no NCCL share (its
    ``nccl_ns`` is then only the NCCL time outside the graphs). ``steps``: the resolved step ranges
    (``range_id`` = the ops' ``step_id``, ``index``)."""
    graphs = ops.filter((pl.col("kind") == "graph") & pl.col("step_id").is_not_null())
    if graphs.height == 0:
        return
    per_step = (
        union_ns(graphs.lazy(), ["step_id", "device"])
        .group_by("step_id")
        .agg(pl.col("union_ns").sum())
        .join(steps.lazy().select(pl.col("range_id").alias("step_id"), "index"), on="step_id")
        .collect()
    )
    by_index = {int(index): int(ns) for index, ns in per_step.select("index", "union_ns").iter_rows()}
    for row in rows:
        graph_ns = by_index.get(row["index"])
        if graph_ns is not None:
            row["graph_ns"] = graph_ns
            row["nccl_share"] = None
