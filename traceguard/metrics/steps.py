"""Steps, phases and the attribution of GPU work to them (DESIGN.md, "Steps", "Attribution").

- A **step** comes from the first source that yields any for the rank (:func:`resolve_steps`):
  ``pattern`` (a range matching the user's or the profile's step patterns), ``convention`` (a
  range matching a known training loop's per-iteration marker, :data:`CONVENTIONS`),
  ``inferred`` or ``window`` (:mod:`traceguard.metrics.step_inference`). Ranges of NCCL's own
  NVTX domain are never steps; when matching ranges nest, the innermost one is the step.
- A **phase** is a range nested directly inside a step on the step's thread.
- A GPU op belongs to the innermost step (and phase) of its own process whose interval contains
  the start of the op's launching API call (joined on correlation id within the process), on any
  thread. Inferred and window steps are intervals of the GPU timeline: an op belongs to the one
  that contains its own start. A step's GPU span is [first attributed op start, last attributed
  op end].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import polars as pl

from traceguard import model
from traceguard.metrics.intervals import containing_rows, gather_rows
from traceguard.metrics.step_inference import inferred_steps, window_steps

NCCL_DOMAIN = "NCCL"

#: Step sources in the order they are tried (DESIGN.md, "Steps").
STEP_SOURCES: tuple[str, ...] = ("pattern", "convention", "inferred", "window")
#: Sources whose steps lie on the GPU timeline (attributed by GPU start, not by launch).
GPU_TIMED_SOURCES = frozenset({"inferred", "window"})


@dataclass(frozen=True)
class Convention:
    """A training loop's own per-iteration range: who emits it and where (provenance)."""

    framework: str
    pattern: str
    source: str


#: Per-iteration markers of the training loops people run, tried one framework at a time in
#: this order (specific before generic). Names end at ``$`` or at ``,``: under
#: ``torch.autograd.profiler.emit_nvtx`` (Megatron-LM's and NeMo's nsys modes, Lightning's
#: ``emit_nvtx=True``) every range name gets ``, op_id = N`` appended (pytorch
#: torch/csrc/profiler/util.cpp ``getNvtxStr``). Megatron-LM's nsys mode, NeMo's NsysCallback,
#: DeepSpeed (``DeepSpeedEngine.forward``/``backward`` ranges, per micro-batch) and the Hugging
#: Face Trainer emit no per-iteration range of their own: their captures get inferred steps.
#: The per-iteration names of hand-written loops (docs/steps.md, "Conventions"): ``batch``,
#: ``step``, ``train_step`` / ``training_step`` (the two words joined by ``_``, ``-``, a space or
#: nothing), ``iteration`` or ``iter``, in any case, then the step number, after nothing or one
#: separator (``_``, ``-``, ``#``, ``:``, ``=``, with spaces around it or a space alone, and ``#``
#: after another one: ``step #3``). Nothing may follow the number but ``emit_nvtx``'s ``, op_id =
#: N``: ``train_step 3 loss`` or ``steps 3`` is not a step, nor is ``train_step`` alone.
GENERIC_STEP = r"(?i)^(?:batch|step|train(?:ing)?[ _-]?step|iteration|iter)(?:\s*[_:=#-]?\s*#?)\d+(?:,|$)"

CONVENTIONS: tuple[Convention, ...] = (
    Convention(
        "traceguard harness",
        r"^Batch \d+(?:,|$)",
        "traceguard/capture/ddp_job.py: an NVTX (and record_function) range `Batch N` around each step",
    ),
    Convention(
        "Megatron-Bridge",
        r"^training_step_\d+(?:,|$)",
        "NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/training/train.py train() (PR #5642): "
        "nvtx_range_push(`training_step_<step>`) around each iteration",
    ),
    Convention(
        "PyTorch Lightning",
        r"^\[pl\]\[profile\]run_training_batch(?:,|$)",
        "Lightning-AI/pytorch-lightning src/lightning/pytorch/loops/training_epoch_loop.py advance(): "
        "profile(`run_training_batch`), recorded as `[pl][profile]run_training_batch` (one per batch)",
    ),
    Convention(
        "torch.profiler",
        r"^ProfilerStep#\d+(?:,|$)",
        "pytorch torch/profiler/profiler.py profile.step(): record_function(`ProfilerStep#N`); the marker of "
        "torchtitan (torchtitan/train.py), Megatron-LM --use-pytorch-profiler (megatron/training/training.py) "
        "and Trainer callbacks that call prof.step()",
    ),
    Convention(
        "generic",
        GENERIC_STEP,
        "hand-written loops: `step 12`, `train_step 3`, `training step #4`, `iteration3` (the "
        "torch.cuda.nvtx examples), `iter_4`, `Batch-5`; any case, a separator or none",
    ),
)

_STEP_COLUMNS = ["rank", "pid", "tid", "range_id", "name", "start", "end", "depth"]


def _not_nccl(ranges: pl.DataFrame) -> pl.DataFrame:
    return ranges.filter(pl.col("domain").is_null() | (pl.col("domain") != NCCL_DOMAIN))


def find_steps(ranges: pl.DataFrame, patterns: Sequence[str]) -> pl.DataFrame:
    """Step ranges, innermost when matches nest, with ``index`` = position in time in the rank."""
    if not patterns or ranges.height == 0:
        return pl.DataFrame(schema={**ranges.select(_STEP_COLUMNS).schema, "index": pl.Int64})
    matches = pl.any_horizontal([pl.col("name").str.contains(p) for p in patterns])
    candidates = _not_nccl(ranges).filter(matches.fill_null(False)).select(_STEP_COLUMNS)
    # A candidate that contains another candidate of its process is not the innermost: in
    # (start asc, end desc) order such a contained candidate is the very next one.
    ordered = candidates.sort(["pid", "start", "end"], descending=[False, False, True])
    next_start = pl.col("start").shift(-1).over("pid")
    next_end = pl.col("end").shift(-1).over("pid")
    contains_next = next_start.is_not_null() & (next_start < pl.col("end")) & (next_end <= pl.col("end"))
    steps = ordered.filter(~contains_next.fill_null(False))
    return steps.sort("start").with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("index"))


@dataclass
class ResolvedSteps:
    """A rank's steps and where they came from."""

    steps: pl.DataFrame
    #: One of :data:`STEP_SOURCES`, or None when no source yields a step.
    source: str | None
    #: For ``inferred``: kernels per iteration, per process.
    period_kernels: dict[int, int]
    #: For ``convention``: the framework whose marker matched.
    convention: str | None = None

    @property
    def gpu_timed(self) -> bool:
        return self.source in GPU_TIMED_SOURCES


def _indexed(steps: pl.DataFrame) -> pl.DataFrame:
    return steps.sort("start").with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("index"))


def resolve_steps(
    ranges: pl.DataFrame,
    gpu_ops: pl.DataFrame,
    strings: pl.DataFrame,
    patterns: Sequence[str] = (),
    sources: Sequence[str] = STEP_SOURCES,
) -> ResolvedSteps:
    """The rank's steps from the first of ``sources`` that yields any (DESIGN.md, "Steps").

    ``patterns`` are the user's and the profile's regexes (source ``pattern``); conventions are
    tried one framework at a time, in :data:`CONVENTIONS` order, so two loops' markers in one
    capture never mix."""
    unknown = set(sources) - set(STEP_SOURCES)
    if unknown:
        raise ValueError(f"unknown step source(s) {sorted(unknown)}; known: {', '.join(STEP_SOURCES)}")
    for source in sources:
        if source == "pattern" and patterns:
            steps = find_steps(ranges, patterns)
            if steps.height:
                return ResolvedSteps(steps, "pattern", {})
        elif source == "convention":
            for convention in CONVENTIONS:
                steps = find_steps(ranges, [convention.pattern])
                if steps.height:
                    return ResolvedSteps(steps, "convention", {}, convention.framework)
        elif source == "inferred":
            steps, periods = inferred_steps(gpu_ops, strings)
            if steps.height:
                return ResolvedSteps(_indexed(steps), "inferred", {p: v.kernels for p, v in periods.items()})
        elif source == "window":
            steps = window_steps(gpu_ops)
            if steps.height:
                return ResolvedSteps(_indexed(steps), "window", {})
    return ResolvedSteps(find_steps(ranges, []), None, {})


def validate_patterns(patterns: Sequence[str]) -> None:
    """Raise ValueError naming the first pattern that is not a valid regular expression for the
    engine that matches it (Polars' Rust regex: no look-around, no back-references)."""
    for pattern in patterns:
        try:
            pl.select(pl.lit("").str.contains(pattern))
        except pl.exceptions.PolarsError as exc:
            lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
            reason = next((line.removeprefix("error: ") for line in lines if line.startswith("error: ")), lines[0])
            raise ValueError(f"{pattern!r} is not a valid regular expression: {reason}") from None


def find_phases(ranges: pl.DataFrame, steps: pl.DataFrame) -> pl.DataFrame:
    """Ranges directly inside a step on its thread: (step_id, phase range columns)."""
    if steps.height == 0 or ranges.height == 0:
        return pl.DataFrame(
            schema={
                "step_id": pl.Int64,
                "phase_id": pl.Int64,
                "name": pl.String,
                "pid": pl.Int64,
                "tid": pl.Int64,
                "start": pl.Int64,
                "end": pl.Int64,
            }
        )
    children = _not_nccl(ranges).filter(pl.col("parent").is_not_null())
    return children.join(
        steps.select(pl.col("range_id").alias("parent"), pl.col("pid"), pl.col("tid")),
        on=["parent", "pid", "tid"],
        how="inner",
    ).select(
        pl.col("parent").alias("step_id"),
        pl.col("range_id").alias("phase_id"),
        "name",
        "pid",
        "tid",
        "start",
        "end",
    )


def launches(gpu_ops: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """GPU ops with their launching call's start, thread and name (null when no call matched):
    the first call (in frame order) with the op's (pid, correlation id) (:func:`model.join_launches`)."""
    return model.join_launches(gpu_ops, api_calls)


def with_launches(gpu_ops: pl.DataFrame, api_calls: pl.DataFrame) -> pl.DataFrame:
    """``gpu_ops`` with the launch columns: as the reader attached them (nsys, launches-only
    read), else joined from ``api_calls`` (Kineto, full nsys read)."""
    if all(c in gpu_ops.columns for c in model.LAUNCH_SCHEMA):
        return gpu_ops
    return launches(gpu_ops, api_calls)


_packable = model._packable


def containing_ids(
    points: pl.DataFrame, point_col: str, intervals: pl.DataFrame, id_col: str, by: list[str]
) -> pl.Series:
    """``id_col`` of the latest-starting interval (same ``by``) that contains each point, as a
    column aligned with ``points`` (null where none). Same rule as :func:`innermost_containing`,
    but only the key columns are sorted and joined, and the ids are scattered back by row."""
    few = _one_per_group(points, point_col, intervals, id_col, by)
    if few is not None:
        return few
    rows = containing_rows(points, point_col, intervals, by)
    if rows is not None:
        return gather_rows(intervals[id_col], rows).alias(id_col)
    dtype = intervals.schema[id_col]
    n = points.height
    right = intervals.select(
        [*by, pl.col("start").alias("_istart"), pl.col("end").alias("_iend"), pl.col(id_col).alias("_id")]
    ).sort("_istart")
    left = (
        points.lazy()
        .select([*by, pl.col(point_col).alias("_p")])
        .with_row_index("_row")
        .filter(pl.col("_p").is_not_null())
        .sort("_p")
        .collect()
    )
    joined = left.join_asof(
        right, left_on="_p", right_on="_istart", by=by, strategy="backward", check_sortedness=False
    ).select("_row", pl.when(pl.col("_p") <= pl.col("_iend")).then(pl.col("_id")).otherwise(None).alias("_id"))
    out = pl.repeat(None, n, dtype=dtype, eager=True).alias(id_col)
    if joined.height:
        out = out.scatter(joined["_row"], joined["_id"])
    return out


#: Up to how many intervals, each alone in its group, :func:`containing_ids` tests every point
#: against each in one expression instead of searching them.
FEW_INTERVALS = 4


def _one_per_group(
    points: pl.DataFrame, point_col: str, intervals: pl.DataFrame, id_col: str, by: list[str]
) -> pl.Series | None:
    """:func:`containing_ids` where there are at most :data:`FEW_INTERVALS` intervals and no two
    share a group (integer keys, no null bound or key): each is then its group's only candidate,
    so a point has its id exactly when it has the key and ``start <= point <= end``. One pass of
    comparisons where the search would sort, search and gather (the window steps: one step a
    process; a rank's 6.6 M ops of the per-op NVTX shape in 15 ms instead of 0.13 s), else None."""
    if not 0 < intervals.height <= FEW_INTERVALS:
        return None
    if any(intervals[c].null_count() for c in ("start", "end", *by)):
        return None
    if not all(points.schema[c].is_integer() and intervals.schema[c].is_integer() for c in by):
        return None
    if (intervals.select(by).n_unique() if by else 1) != intervals.height:
        return None
    dtype = intervals.schema[id_col]
    point = pl.col(point_col)
    found: Any = None
    for *keys, start, end, ident in intervals.select(*by, "start", "end", id_col).iter_rows():
        hit = (point >= start) & (point <= end)
        for column, key in zip(by, keys, strict=True):
            hit &= pl.col(column) == key
        found = (pl.when if found is None else found.when)(hit).then(pl.lit(ident, dtype=dtype))
    return points.select(found.otherwise(pl.lit(None, dtype=dtype)).alias(id_col)).to_series()


def innermost_containing(
    points: pl.LazyFrame, point_col: str, intervals: pl.DataFrame, id_col: str, by: list[str]
) -> pl.LazyFrame:
    """Attach ``id_col`` of the latest-starting interval (same ``by``) that contains the point.

    Intervals here do not overlap without nesting (steps of a process; phases of a step), so
    the latest-starting interval that started before the point is the innermost candidate.
    """
    right = (
        intervals.lazy()
        .select([*by, pl.col("start").alias("_istart"), pl.col("end").alias("_iend"), pl.col(id_col)])
        .sort("_istart")
    )
    with_point = points.filter(pl.col(point_col).is_not_null()).sort(point_col)
    without = points.filter(pl.col(point_col).is_null()).with_columns(pl.lit(None, dtype=pl.Int64).alias(id_col))
    joined = with_point.join_asof(
        right, left_on=point_col, right_on="_istart", by=by, strategy="backward", check_sortedness=False
    )
    inside = pl.col(point_col) <= pl.col("_iend")
    joined = joined.with_columns(pl.when(inside).then(pl.col(id_col)).otherwise(None).alias(id_col)).drop(
        "_istart", "_iend"
    )
    return pl.concat([joined, without], how="diagonal_relaxed")


def attribute(
    gpu_ops: pl.DataFrame,
    api_calls: pl.DataFrame,
    steps: pl.DataFrame,
    phases: pl.DataFrame,
    *,
    gpu_timed: bool = False,
) -> pl.DataFrame:
    """GPU ops with ``launch_start``, ``launch_tid``, ``step_id`` and ``phase_id`` (null if none).

    Same rule as :func:`containing_ids` for the steps (by process), then for the phases of each
    op's step (by process and step). The point is the op's launch start, or with ``gpu_timed``
    steps (inferred, window) the op's own GPU start."""
    ops = with_launches(gpu_ops, api_calls)
    n = ops.height
    # The ids are range ids (row numbers of the ranges): 32 bits hold them, and at 10 M ops the
    # two columns are 90 MB narrower than int64. Joins with the int64 ``range_id`` widen them.
    ids = [steps["range_id"], *([phases["phase_id"], phases["step_id"]] if phases.height else [])]
    narrow = all(int(i.max() or 0) < 1 << 31 and int(i.min() or 0) >= -(1 << 31) for i in ids if i.len())
    id_type = pl.Int32 if narrow else pl.Int64
    step_id = pl.repeat(None, n, dtype=id_type, eager=True).alias("step_id")
    phase_id = pl.repeat(None, n, dtype=id_type, eager=True).alias("phase_id")
    if not steps.height:
        return model.add_columns(ops, [step_id, phase_id])
    points = ops.select("pid", pl.col("start" if gpu_timed else "launch_start").alias("_p"))
    step_ranges = steps.select("pid", "start", "end", pl.col("range_id").cast(id_type).alias("step_id"))
    step_id = containing_ids(points, "_p", step_ranges, "step_id", ["pid"])
    if phases.height:
        points = points.with_columns(step_id)
        phase_ranges = phases.select(
            "pid", pl.col("step_id").cast(id_type), "start", "end", pl.col("phase_id").cast(id_type)
        )
        phase_id = _phase_ids(points, phase_ranges)
    return model.add_columns(ops, [step_id, phase_id])


def _phase_ids(points: pl.DataFrame, phases: pl.DataFrame) -> pl.Series:
    """``containing_ids(points, "_p", phases, "phase_id", ["pid", "step_id"])``, searched among the
    process's phases alone first (one key: no per-point group codes to build, the costlier half of
    that search at 10 M ops). Where the phase found there is of the point's own step, it is the
    answer of the search by step as well: it is the latest-starting of all the process's phases
    that start by the point, so of its step's too, and it contains the point. The points left
    (the found phase ended before the point, or is another step's) are searched by step."""
    rows = containing_rows(points, "_p", phases, ["pid"])
    if rows is None:
        return containing_ids(points, "_p", phases, "phase_id", ["pid", "step_id"])
    settled = (gather_rows(phases["step_id"], rows) == points["step_id"]).fill_null(False)
    found = gather_rows(phases["phase_id"], rows).set(~settled, None)  # a point of no step has no phase
    redo = ~settled & points["step_id"].is_not_null()
    if not redo.any():
        return found.alias("phase_id")
    again = containing_ids(points.filter(redo), "_p", phases, "phase_id", ["pid", "step_id"])
    return found.scatter(redo.arg_true(), again).alias("phase_id")


def step_spans(attributed: pl.DataFrame) -> pl.DataFrame:
    """GPU span of each step: [first attributed op start, last attributed op end]."""
    return step_spans_query(attributed).collect()


def step_spans_query(attributed: pl.LazyFrame | pl.DataFrame) -> pl.LazyFrame:
    """:func:`step_spans` as a query (collected with others: traceguard.metrics.sliced)."""
    return (
        attributed.lazy()
        .filter(pl.col("step_id").is_not_null())
        .group_by("step_id")
        .agg(pl.col("start").min().alias("gpu_start"), pl.col("end").max().alias("gpu_end"))
    )


def in_window(ops: pl.DataFrame, spans: pl.DataFrame, pid_of_step: pl.DataFrame) -> pl.DataFrame:
    """Ops whose start lies in the union of their process's step GPU spans (the analysis window)."""
    if spans.height == 0:
        return ops
    return ops.filter(window_mask(ops, spans, pid_of_step))


def window_segments(spans: pl.DataFrame, pid_of_step: pl.DataFrame) -> pl.DataFrame:
    """The analysis window as :func:`window_mask` searches it: the union of each process's step
    GPU spans (``pid``, ``start``, ``end``, numbered by ``_window``). A caller masking many slices
    of ops against the same spans takes it once (68 k steps: 20 ms a slice)."""
    from traceguard.metrics.intervals import union_segments

    window = union_segments(
        spans.join(pid_of_step, on="step_id").select(
            "pid", pl.col("gpu_start").alias("start"), pl.col("gpu_end").alias("end")
        ),
        ["pid"],
    ).collect()
    return window.with_columns(pl.int_range(pl.len(), dtype=pl.Int64).alias("_window"))


def window_mask(
    ops: pl.DataFrame, spans: pl.DataFrame, pid_of_step: pl.DataFrame, *, segments: pl.DataFrame | None = None
) -> pl.Series:
    """Per op: does it lie in the analysis window (see :func:`in_window`); all true without steps.

    A mask instead of a filtered copy: the window holds nearly every op of a capture, and its
    users each read a few columns of it (``ops.lazy().filter(mask)``).

    When ``spans`` are :func:`step_spans` of ``ops`` (as here), an op attributed to a step lies
    in that step's span by construction (the span runs from its ops' first start to their last
    end, in their own process), so only the other ops are searched. ``segments``:
    :func:`window_segments` of the same spans, when the caller has them."""
    if spans.height == 0:
        return pl.repeat(True, ops.height, eager=True).alias("in_window")
    numbered = segments if segments is not None else window_segments(spans, pid_of_step)
    if "step_id" not in ops.columns:
        return containing_ids(ops, "start", numbered, "_window", ["pid"]).is_not_null().alias("in_window")
    # An inverted or open op (not start <= end) is searched like an unattributed one.
    sane = pl.col("step_id").is_not_null() & (pl.col("start") <= pl.col("end")).fill_null(False)
    attributed = ops.select(sane.alias("in_window")).to_series()
    if attributed.all():
        return attributed
    searched = (~attributed).arg_true()
    inside = containing_ids(ops.select("pid", "start")[searched], "start", numbered, "_window", ["pid"])
    return attributed.scatter(searched, inside.is_not_null())


def calls_in_steps(calls: pl.DataFrame, steps: pl.DataFrame, phases: pl.DataFrame) -> pl.DataFrame:
    """``calls`` (``pid``, ``start``: host calls such as c10d's ``gloo:all_reduce`` ranges) with the
    ``step_id`` and ``phase_id`` (Int64, null when none) of the step and phase of their own process
    that contain their start."""
    if steps.height:
        step_id = containing_ids(
            calls.select("pid", "start"),
            "start",
            steps.select("pid", "start", "end", pl.col("range_id").cast(pl.Int64).alias("step_id")),
            "step_id",
            ["pid"],
        )
        calls = calls.with_columns(step_id.cast(pl.Int64).alias("step_id"))
    else:
        calls = calls.with_columns(pl.lit(None, dtype=pl.Int64).alias("step_id"))
    if not (phases.height and steps.height and calls.height):
        return calls.with_columns(pl.lit(None, dtype=pl.Int64).alias("phase_id"))
    phase_id = containing_ids(
        calls.select("pid", "step_id", "start"),
        "start",
        phases.select("pid", pl.col("step_id").cast(pl.Int64), "start", "end", pl.col("phase_id").cast(pl.Int64)),
        "phase_id",
        ["pid", "step_id"],
    )
    return calls.with_columns(phase_id.cast(pl.Int64).alias("phase_id"))
