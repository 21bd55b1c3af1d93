"""Collectives by type, point-to-point peers, and the gradient-reduction payload (pure functions).

Definitions (DESIGN.md, "Collectives by type"), over a rank's NCCL kernels in the analysis window:

- **collective**: what the kernel runs, from its name (:func:`traceguard.metrics.nccl.with_collective`):
  AllReduce, AllGather, ReduceScatter, Broadcast, Reduce, AllToAll, SendRecv, Send, Recv (RCCL's
  ``Generic``); a kernel NCCL names otherwise is ``Other``. PyTorch's ``all_to_all`` runs as
  grouped send/recv, so its kernels are SendRecv.
- **count**: kernels of the type. **time_ns**: the union of their intervals per device, summed
  over devices (the rule of ``nccl_time_ns``, per type). **exposed_ns**: the part of that union
  that no compute (non-NCCL) kernel of the window covers on the same device — the per-type
  ``nccl_exposed_ns``; the types' exposed times add up to ``nccl_exposed_ns`` unless NCCL kernels
  of two types overlap each other. **bytes**: Σ message size (``msg_bytes``: Kineto args, NCCL's
  NVTX payload) when every kernel of the group has one, else null (``bytes_known`` says how many
  had one). Per step: the same over the kernels attributed to the step; totals cover the window.
  **issued_as** (totals): kernels per c10d operation whose ``nccl:<op>`` range (PyTorch's
  profiler annotation, or its NVTX range under ``emit_nvtx``) holds the kernel's launch on the
  launching thread, e.g. ``{"all_to_all": 32}`` for an all-to-all's SendRecv kernels.
- **peer matrix** (point-to-point kernels, SendRecv/Send/Recv): per (rank, peer) ``kernels`` (P2P
  kernels that carried traffic with that peer), ``time_ns`` (Σ their durations: a grouped kernel
  serving two peers counts for both), ``sends``/``recvs`` (``ncclSend``/``ncclRecv`` calls naming
  the peer, nsys only; a call belongs to the next NCCL kernel its thread launches, as a grouped
  call's kernel is launched at ``ncclGroupEnd``), ``bytes`` (Σ those calls' message sizes, or the
  kernels' ``msg_bytes``; null when any is unknown), and ``source``, what named the peer:
  ``nccl_payload`` (the "Peer rank" of NCCL's NVTX payload, an export made with
  ``--include-blobs=true``; a rank of the communicator), ``kineto_args``
  (PyTorch's ``Dst Rank``/``Src Rank``, a global rank), or ``two_rank_group`` (nothing names it,
  but the communicator has two ranks, 0 and 1 — its size from the trace, else the run's world
  size, else the number of ranks analysed, DESIGN.md's rule for n — so the peer is the other one).
- **gradient-reduction payload**: DDP reduces gradients with all-reduce, FSDP/ZeRO with
  reduce-scatter; of the two, the collective with the larger known payload inside the steps
  carries the gradients, and its payload ÷ steps is ``gradient_reduction_bytes_per_step``.
  NCCL's NVTX payload of a reduce-scatter is its output (one rank's share); the rank metrics
  multiply it by the communicator size to give the input, as Kineto's args do. Gradients are
  never reduced in the forward pass: when at least :data:`FORWARD_SHARE` of the carrier's
  payload is launched from a step phase named like a forward pass (:data:`FORWARD_PHASE`), the
  collective carries activations (tensor or sequence parallelism), and the payload is null with
  that reason rather than a yardstick for gradient copies (the 2×H200 tensor-parallel run
  all-reduces 56 MiB a step, as much as its DTensor copies: ``dtod_copy_volume`` failed it with
  DDP's remedy).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics.intervals import running_max, union_segments, union_sorted_np
from traceguard.metrics.steps import containing_ids
from traceguard.metrics.table_rows import frame_dicts
from traceguard.model import OP_KINDS

#: Collective types in report order (DESIGN.md); others follow by name.
COLLECTIVE_ORDER: tuple[str, ...] = (
    "AllReduce",
    "AllGather",
    "ReduceScatter",
    "Broadcast",
    "Reduce",
    "AllToAll",
    "SendRecv",
    "Send",
    "Recv",
)
#: Kernels that move point-to-point traffic.
P2P_TYPES: tuple[str, ...] = ("SendRecv", "Send", "Recv")
#: The collectives that can carry a gradient reduction (DDP, FSDP/ZeRO).
GRADIENT_TYPES: tuple[str, ...] = ("AllReduce", "ReduceScatter")
#: A step phase of the forward pass: ``forward``, ``fwd``, ``model forward``, DeepSpeed's
#: ``DeepSpeedEngine.forward`` (a word, in any case; emit_nvtx's ``, op_id`` suffix allowed).
FORWARD_PHASE = r"(?i)(?:^|[^a-z])(?:forward|fwd)(?:[^a-z]|$)"
#: The share of the carrier's payload launched in forward phases from which it is not gradients.
FORWARD_SHARE = 0.1
OTHER = "Other"
#: NCCL calls whose NVTX payload is one rank's share of the message (AllGather: the send size;
#: ReduceScatter: the receive size), not the larger buffer nccl-tests counts.
PER_RANK_PAYLOAD_CALLS: tuple[str, ...] = ("ncclAllGather", "ncclReduceScatter")
#: NCCL's own point-to-point calls (its NVTX domain names its ranges after the API call).
P2P_CALLS = {"ncclSend": "send", "ncclRecv": "recv"}

PEER_FROM_PAYLOAD = "nccl_payload"
PEER_FROM_KINETO = "kineto_args"
PEER_FROM_TWO_RANKS = "two_rank_group"


@dataclass
class ComputeCover:
    """The window's compute (non-NCCL) kernels per device, kept so that the part of any interval
    they cover is measured by looking only at the kernels near it (:meth:`covered`).

    Per device: kernel starts in order, their ends (a row that is no compute kernel keeps its
    place with end = start, so it covers nothing), and the running max of those ends."""

    devices: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]

    def covered(self, device: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
        """Nanoseconds of each ``[start, end)`` that compute covers on its device."""
        out = np.zeros(len(start), dtype=np.int64)
        for dev, (kernel_start, kernel_end, reach) in self.devices.items():
            rows = np.flatnonzero(device == dev)
            if rows.size and kernel_start.size:
                out[rows] = _covered_sorted(kernel_start, kernel_end, reach, start[rows], end[rows])
        return out


def _covered_sorted(
    kernel_start: np.ndarray, kernel_end: np.ndarray, reach: np.ndarray, a: np.ndarray, b: np.ndarray
) -> np.ndarray:
    """|compute ∩ [a, b)| per query. Kernels that start before ``a`` cover [a, min(reach, b)) of it
    (each of those that reaches past ``a`` contains ``a``, so their union there is one piece); the
    kernels that start inside are few and are merged with that piece, one group per query."""
    a = np.asarray(a, dtype=np.int64)
    b = np.maximum(np.asarray(b, dtype=np.int64), a)
    first = np.searchsorted(kernel_start, a, side="left")
    past = np.maximum(np.searchsorted(kernel_start, b, side="left"), first)
    before = np.where(first > 0, reach[np.maximum(first - 1, 0)], a)
    counts = past - first
    sizes = counts + 1  # the piece from earlier kernels, then the kernels starting inside
    heads = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    starts = np.empty(total, dtype=np.int64)
    ends = np.empty(total, dtype=np.int64)
    starts[heads] = a
    ends[heads] = np.clip(before, a, b)
    body = np.ones(total, dtype=bool)
    body[heads] = False
    if total > len(a):
        rows = np.flatnonzero(body) - np.repeat(heads + 1, counts) + np.repeat(first, counts)
        inner_start = kernel_start[rows]
        starts[body] = inner_start
        ends[body] = np.maximum(np.minimum(kernel_end[rows], np.repeat(b, counts)), inner_start)
    group = np.repeat(np.arange(len(a), dtype=np.int64), sizes)
    return union_sorted_np(group, starts, ends)[1]


#: ``kind``'s code of kernels in :data:`traceguard.model.OpKind`.
_KERNEL_CODE = OP_KINDS.index("kernel")


def compute_cover(
    ops: pl.DataFrame, mask: pl.Series | None, union: dict[int, tuple[np.ndarray, np.ndarray]] | None = None
) -> ComputeCover:
    """:class:`ComputeCover` of the compute kernels of ``ops`` (``kind``, ``is_nccl``, ``device``,
    ``start``, ``end``) that ``mask`` keeps. The columns are read in place, never filtered: the
    rows from the first to the last kernel, in start order per device as a capture's kernel
    table is, need one pass for the ends and one running max; any other layout is sorted.

    ``union``: those kernels' union per device (:func:`traceguard.metrics.timeline.compute_union`)
    when the caller has it. Its disjoint segments cover exactly what the kernels cover (and the
    running max of their ends is their ends), so they serve as the kernels, with no per-kernel array."""
    if union is not None:
        return ComputeCover({dev: (s, e, e) for dev, (s, e) in union.items() if s.size})
    is_kernel = ops["kind"].to_physical().to_numpy() == _KERNEL_CODE
    if not is_kernel.any():
        return ComputeCover({})
    # Only the rows from the first to the last kernel: a reader's kernels come as one block (one
    # chunk), so these columns are read without a copy.
    lo = int(np.argmax(is_kernel))
    hi = ops.height - int(np.argmax(is_kernel[::-1]))
    part = ops.slice(lo, hi - lo)
    keep = is_kernel[lo:hi] & ~part["is_nccl"].fill_null(False).to_numpy()
    if mask is not None:
        keep &= mask.slice(lo, hi - lo).fill_null(False).to_numpy()
    timed = [part[c] for c in ("start", "end")]
    if any(col.null_count() for col in timed):
        keep &= (part["start"].is_not_null() & part["end"].is_not_null()).to_numpy()
        timed = [col.fill_null(0) for col in timed]
    start, end = (col.to_numpy().astype(np.int64, copy=False) for col in timed)
    device = part["device"].fill_null(-1).to_numpy()
    if not keep.any():
        return ComputeCover({})
    if int(device.min()) == int(device.max()) and bool(np.all(start[1:] >= start[:-1])):
        kernel_end = np.where(keep, end, start)
        return ComputeCover({int(device[0]): (start, kernel_end, running_max(kernel_end))})
    devices: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    for dev in np.unique(device[keep]).tolist():
        rows = np.flatnonzero(keep & (device == dev))
        kernel_start, kernel_end = start[rows], end[rows]
        if not bool(np.all(kernel_start[1:] >= kernel_start[:-1])):
            order = np.argsort(kernel_start, kind="stable")
            kernel_start, kernel_end = kernel_start[order], kernel_end[order]
        kernel_end = np.maximum(kernel_end, kernel_start)
        devices[int(dev)] = (kernel_start, kernel_end, running_max(kernel_end))
    return ComputeCover(devices)


def _labelled(nccl_ops: pl.DataFrame) -> pl.DataFrame:
    """NCCL kernels with ``collective`` as text (``Other`` where the name says nothing)."""
    return nccl_ops.with_columns(pl.col("collective").cast(pl.String).fill_null(OTHER).alias("collective"))


def _type_table(kernels: pl.DataFrame, by: list[str], cover: ComputeCover | None) -> pl.DataFrame:
    """Per ``by`` group: count, time_ns (union per device), exposed_ns, bytes, bytes_known."""
    counts = kernels.group_by(by).agg(
        pl.len().alias("count"),
        pl.col("msg_bytes").sum().alias("bytes"),
        pl.col("msg_bytes").is_not_null().sum().alias("bytes_known"),
    )
    segments = union_segments(kernels.filter(pl.col("start").is_not_null()), [*by, "device"]).collect()
    length = (segments["end"] - segments["start"]).to_numpy()
    if cover is not None and segments.height:
        covered = cover.covered(
            segments["device"].fill_null(-1).to_numpy(), segments["start"].to_numpy(), segments["end"].to_numpy()
        )
    else:
        covered = np.zeros(segments.height, dtype=np.int64)
    timed = (
        segments.select(by)
        .with_columns(pl.Series("time_ns", length, dtype=pl.Int64), pl.Series("exposed_ns", length - covered))
        .group_by(by)
        .agg(pl.col("time_ns").sum(), pl.col("exposed_ns").sum())
    )
    table = counts.join(timed, on=by, how="left", nulls_equal=True).with_columns(
        pl.col("time_ns").fill_null(0),
        pl.col("exposed_ns").fill_null(0),
        pl.when(pl.col("bytes_known") == pl.col("count")).then(pl.col("bytes")).alias("bytes"),
    )
    order = pl.col("collective").replace_strict(
        {name: i for i, name in enumerate(COLLECTIVE_ORDER)}, default=len(COLLECTIVE_ORDER), return_dtype=pl.Int32
    )
    return table.sort([*by[:-1], order, "collective"])


def _issued_as(kernels: pl.DataFrame) -> dict[str, dict[str, int]]:
    """collective → {framework operation: kernels}, where the capture names the operation."""
    if "operation" not in kernels.columns:
        return {}
    counted = kernels.filter(pl.col("operation").is_not_null()).group_by("collective", "operation").len()
    out: dict[str, dict[str, int]] = {}
    for collective, operation, n in counted.sort("collective", "operation").iter_rows():
        out.setdefault(collective, {})[operation] = int(n)
    return out


#: PyTorch's record_function around a c10d call: ``nccl:all_to_all`` (under ``emit_nvtx`` also
#: ``, op_id = N`` / ``, sizes = ...`` after it).
_FRAMEWORK_OP = r"^nccl:([^,\s]+)"


def with_operation(nccl_ops: pl.DataFrame, ranges: pl.DataFrame, nccl_domain: str) -> pl.DataFrame:
    """Add ``operation``: the c10d call (``all_to_all``, ``send``, ``_reduce_scatter_base`` ...)
    whose ``nccl:<op>`` range holds the kernel's launch on its thread (PyTorch's profiler and
    ``emit_nvtx`` name them so), null where none does. NCCL runs ``all_to_all`` as grouped
    send/recv, so this is what tells an all-to-all's SendRecv kernels from pipeline sends."""
    none = nccl_ops.with_columns(pl.lit(None, dtype=pl.String).alias("operation"))
    if nccl_ops.height == 0 or not {"launch_tid", "launch_start"} <= set(nccl_ops.columns):
        return none
    calls = ranges.filter(
        (pl.col("domain").is_null() | (pl.col("domain") != nccl_domain)) & pl.col("name").str.starts_with("nccl:")
    )
    if calls.height == 0:
        return none
    found = containing_ids(
        nccl_ops.select("pid", pl.col("launch_tid").alias("tid"), "launch_start"),
        "launch_start",
        calls.select("pid", "tid", "start", "end", "name"),
        "name",
        ["pid", "tid"],
    )
    return nccl_ops.with_columns(found.str.extract(_FRAMEWORK_OP, 1).alias("operation"))


def by_type(
    nccl_ops: pl.DataFrame,
    cover: ComputeCover | None,
    step_index: pl.DataFrame | None = None,
) -> dict[str, Any]:
    """Collectives by type of one rank: ``totals`` (the window) and ``steps`` (per step index).

    ``nccl_ops``: the window's NCCL kernels with ``collective``, ``device``, ``start``, ``end``,
    ``msg_bytes`` and ``step_id``; ``cover``: the window's compute kernels (None: exposed = time);
    ``step_index``: step_id → index of the rank's steps (None or empty: no steps, totals only).
    Rows: {collective, count, time_ns, exposed_ns, bytes, bytes_known}, per step with
    ``step_index``; totals also ``issued_as`` (needs the ``operation`` of :func:`with_operation`)."""
    out: dict[str, Any] = {"totals": [], "steps": [], "null_reasons": {}}
    if nccl_ops.height == 0:
        return out
    columns = ["collective", "device", "start", "end", "msg_bytes", "step_id"]
    if "operation" in nccl_ops.columns:
        columns.append("operation")
    kernels = _labelled(nccl_ops.select(columns))
    out["totals"] = _rows(_type_table(kernels, ["collective"], cover))
    issued = _issued_as(kernels)
    for row in out["totals"]:
        row["issued_as"] = issued.get(row["collective"], {})
    if step_index is not None and step_index.height:
        in_steps = kernels.filter(pl.col("step_id").is_not_null()).join(
            step_index.select("step_id", pl.col("index").cast(pl.Int64).alias("step_index")), on="step_id", how="inner"
        )
        if in_steps.height:
            out["steps"] = _rows(_type_table(in_steps, ["step_index", "collective"], cover))
    else:
        out["null_reasons"]["steps"] = "the rank has no steps: totals over the analysis window only"
    if any(row["bytes"] is None for row in out["totals"]):
        out["null_reasons"]["bytes"] = (
            "message sizes are not in this capture for every kernel (nsys: export with "
            "`--include-blobs=true` to keep NCCL's NVTX payloads; Kineto: PyTorch records them in collective args)"
        )
    return out


def _rows(table: pl.DataFrame) -> list[dict[str, Any]]:
    """The table's rows as dicts, booleans as 0/1 (built from its columns: 68 k step rows)."""
    return frame_dicts(table.with_columns(pl.col(pl.Boolean).cast(pl.Int64)))


def p2p_calls(ranges: pl.DataFrame, nccl_domain: str) -> pl.DataFrame:
    """NCCL's ``ncclSend``/``ncclRecv`` ranges: pid, tid, start, direction, peer, bytes."""
    calls = ranges.filter((pl.col("domain") == nccl_domain) & pl.col("name").is_in(list(P2P_CALLS)))
    return calls.select(
        "pid",
        "tid",
        "start",
        pl.col("name").replace_strict(P2P_CALLS, return_dtype=pl.String).alias("direction"),
        pl.col("payload_peer").alias("peer"),
        pl.col("payload_bytes").alias("bytes"),
    )


def peer_matrix(
    rank: int,
    nccl_ops: pl.DataFrame,
    calls: pl.DataFrame,
    *,
    group_size: int | None,
) -> dict[str, Any]:
    """One rank's row of the rank × peer matrix (see the module docstring for every number).

    ``nccl_ops``: the window's NCCL kernels (``collective``, ``start``, ``end``, ``peer``,
    ``msg_bytes``, ``pid``, ``launch_tid``, ``launch_start``); ``calls``: :func:`p2p_calls`;
    ``group_size``: the communicator size when the trace says, else the run's world size or the
    number of ranks analysed. Returns {"rows": [...], "null_reason": str | None}."""
    p2p = _labelled(nccl_ops).filter(pl.col("collective").is_in(list(P2P_TYPES))).with_row_index("_kernel")
    if p2p.height == 0:
        return {"rows": [], "null_reason": "no point-to-point (send/recv) kernels in the analysis window"}
    p2p = p2p.with_columns((pl.col("end") - pl.col("start")).alias("dur"))
    pieces: list[pl.DataFrame] = []
    # 1. Kineto: the kernel's own args name the peer.
    named = p2p.filter(pl.col("peer").is_not_null())
    if named.height:
        pieces.append(
            named.select(
                "_kernel",
                pl.col("peer").cast(pl.Int32),
                pl.lit(None, dtype=pl.String).alias("direction"),
                pl.col("msg_bytes").alias("bytes"),
                pl.lit(PEER_FROM_KINETO).alias("source"),
            )
        )
    # 2. nsys: each ncclSend/ncclRecv call belongs to the next NCCL kernel its thread launches
    #    (a grouped call's kernel is launched at ncclGroupEnd, after the calls).
    rest = p2p.filter(pl.col("peer").is_null())
    with_peer = calls.filter(pl.col("peer").is_not_null())
    if rest.height and with_peer.height and {"launch_tid", "launch_start"} <= set(rest.columns):
        launches = (
            _labelled(nccl_ops)
            .with_row_index("_any")
            .filter(pl.col("launch_start").is_not_null())
            .select(
                pl.col("pid").cast(pl.Int64),
                pl.col("launch_tid").cast(pl.Int64).alias("tid"),
                "launch_start",
                "_any",
                "collective",
            )
            .sort("launch_start")
        )
        matched = (
            with_peer.with_columns(pl.col("pid").cast(pl.Int64), pl.col("tid").cast(pl.Int64))
            .sort("start")
            .join_asof(  # both sides sorted on the key just above
                launches,
                left_on="start",
                right_on="launch_start",
                by=["pid", "tid"],
                strategy="forward",
                check_sortedness=False,
            )
            .filter(pl.col("collective").is_in(list(P2P_TYPES)))
        )
        # Back from the index among all NCCL kernels to the index among the P2P ones.
        index = (
            (_labelled(nccl_ops).with_row_index("_any").filter(pl.col("collective").is_in(list(P2P_TYPES))))
            .with_row_index("_kernel")
            .select("_any", "_kernel")
        )
        matched = matched.join(index, on="_any", how="inner")
        matched = matched.join(rest.select("_kernel"), on="_kernel", how="semi")
        if matched.height:
            pieces.append(
                matched.select(
                    "_kernel",
                    pl.col("peer").cast(pl.Int32),
                    "direction",
                    "bytes",
                    pl.lit(PEER_FROM_PAYLOAD).alias("source"),
                )
            )
    found = pl.concat(pieces) if pieces else None
    named_kernels = found["_kernel"].unique() if found is not None else pl.Series("_kernel", [], dtype=pl.UInt32)
    unnamed = p2p.filter(~pl.col("_kernel").is_in(named_kernels.implode()))
    # 3. Nothing names the peer, but a two-rank communicator has only one other rank.
    sizes = unnamed["group_size"].drop_nulls().unique().to_list() if "group_size" in unnamed.columns else []
    size = sizes[0] if len(sizes) == 1 else group_size if not sizes else None
    reason = None
    if unnamed.height:
        if size == 2 and rank in (0, 1):
            inferred = unnamed.select(
                "_kernel",
                pl.lit(1 - rank, dtype=pl.Int32).alias("peer"),
                pl.lit(None, dtype=pl.String).alias("direction"),
                pl.col("msg_bytes").alias("bytes"),
                pl.lit(PEER_FROM_TWO_RANKS).alias("source"),
            )
            found = inferred if found is None else pl.concat([found, inferred])
        else:
            reason = (
                f"{unnamed.height} of {p2p.height} point-to-point kernels have no named peer: the capture "
                "does not name it (nsys: export with `--include-blobs=true` to keep NCCL's NVTX payloads; "
                "Kineto: PyTorch >= 2.4 records `Dst Rank`/`Src Rank`)"
                + (f" and the communicator has {size} ranks" if size else " and the communicator size is unknown")
            )
    if found is None or found.height == 0:
        return {"rows": [], "null_reason": reason}
    durations = p2p.select("_kernel", "dur")
    per_kernel = (
        found.join(durations, on="_kernel", how="left")
        .group_by("peer", "_kernel")
        .agg(
            pl.col("dur").first(),
            (pl.col("direction") == "send").sum().alias("sends"),
            (pl.col("direction") == "recv").sum().alias("recvs"),
            pl.col("direction").is_not_null().any().alias("_calls"),
            pl.col("bytes").sum().alias("bytes"),
            pl.col("bytes").is_null().any().alias("_unknown"),
            pl.col("source").first(),
        )
    )
    table = (
        per_kernel.group_by("peer")
        .agg(
            pl.len().alias("kernels"),
            pl.col("dur").sum().alias("time_ns"),
            pl.when(pl.col("_calls").any()).then(pl.col("sends").sum()).alias("sends"),
            pl.when(pl.col("_calls").any()).then(pl.col("recvs").sum()).alias("recvs"),
            pl.when(~pl.col("_unknown").any()).then(pl.col("bytes").sum()).alias("bytes"),
            pl.col("source").unique().sort().str.join(",").alias("source"),
        )
        .sort("peer")
    )
    rows = [{"rank": rank, **row} for row in _rows(table)]
    return {"rows": rows, "null_reason": reason}


def gradient_reduction(
    nccl_in_steps: pl.DataFrame, step_count: int, phase_names: dict[int, str] | None = None
) -> tuple[str | None, float | None, str | None]:
    """(collective, payload bytes per step, null reason) of the gradient reduction.

    ``nccl_in_steps``: NCCL kernels attributed to steps, with ``collective`` and ``msg_bytes``
    (and ``phase_id``, named by ``phase_names``). Of all-reduce and reduce-scatter, the one with
    the larger known payload carries the gradients; its payload counts only when every one of its
    kernels has a message size, and not when it runs in the forward pass (module docstring)."""
    if not step_count:
        return None, None, "no steps"
    totals: dict[str, tuple[int, int, int]] = {}
    present = nccl_in_steps.filter(pl.col("collective").cast(pl.String).is_in(list(GRADIENT_TYPES)))
    for row in (
        present.group_by(pl.col("collective").cast(pl.String))
        .agg(pl.len().alias("n"), pl.col("msg_bytes").is_not_null().sum().alias("known"), pl.col("msg_bytes").sum())
        .iter_rows(named=True)
    ):
        totals[row["collective"]] = (int(row["n"]), int(row["known"]), int(row["msg_bytes"] or 0))
    if not totals:
        return None, None, "no all-reduce or reduce-scatter kernels inside the steps"
    complete = {name: t[2] for name, t in totals.items() if t[0] == t[1]}
    if not complete:
        return (
            None,
            None,
            "gradient-reduction message sizes are not in this capture (nsys: export with "
            "`nsys export --type sqlite --include-blobs=true`; or capture with torch.profiler)",
        )
    name = max(complete, key=lambda k: (complete[k], k == "AllReduce"))
    forward = {pid: n for pid, n in (phase_names or {}).items() if re.search(FORWARD_PHASE, n)}
    if forward and complete[name] and "phase_id" in present.columns:
        carrier = present.filter(pl.col("collective").cast(pl.String) == name)
        in_forward = int(carrier.filter(pl.col("phase_id").is_in(list(forward)))["msg_bytes"].sum() or 0)
        if in_forward >= FORWARD_SHARE * complete[name]:
            phases = sorted({forward[p] for p in carrier["phase_id"].drop_nulls().to_list() if p in forward})
            return (
                name,
                None,
                f"{in_forward / complete[name]:.0%} of the {name} payload is launched in the forward pass "
                f"({', '.join(f'`{p}`' for p in phases)}): it carries activations (tensor or sequence "
                "parallelism), not gradients, so it is no yardstick for gradient copies",
            )
    return name, complete[name] / step_count, None


def run_totals(per_rank: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Σ over ranks of each type's count, time_ns, exposed_ns; bytes when every rank knows them."""
    merged: dict[str, dict[str, Any]] = {}
    for doc in per_rank:
        for row in doc.get("totals", []):
            into = merged.setdefault(
                row["collective"],
                {
                    "collective": row["collective"],
                    "count": 0,
                    "time_ns": 0,
                    "exposed_ns": 0,
                    "bytes": 0,
                    "ranks": 0,
                    "issued_as": {},
                },
            )
            into["count"] += row["count"]
            into["time_ns"] += row["time_ns"]
            into["exposed_ns"] += row["exposed_ns"]
            into["ranks"] += 1
            for operation, n in (row.get("issued_as") or {}).items():
                into["issued_as"][operation] = into["issued_as"].get(operation, 0) + n
            into["bytes"] = None if into["bytes"] is None or row["bytes"] is None else into["bytes"] + row["bytes"]
    order = {name: i for i, name in enumerate(COLLECTIVE_ORDER)}
    return sorted(merged.values(), key=lambda r: (order.get(r["collective"], len(order)), r["collective"]))


def breakdown(
    rank: int,
    ops: pl.DataFrame,
    mask: pl.Series | None,
    nccl_ops: pl.DataFrame,
    steps: pl.DataFrame,
    ranges: pl.DataFrame,
    *,
    nccl_domain: str,
    group_size: int | None,
    compute: dict[int, tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(collectives by type, peer row) of one rank: :func:`by_type` and :func:`peer_matrix` from
    the attributed ops (``is_nccl``, ``step_id``), the window ``mask``, the window's NCCL kernels
    (with ``collective``), the rank's steps (``range_id``, ``index``) and its ranges; ``compute``:
    the window's compute union per device when the caller has it (:func:`compute_cover`)."""
    cover = compute_cover(ops, mask, compute) if nccl_ops.height else None
    step_index = None
    if steps.height:
        index = steps["index"] if "index" in steps.columns else pl.int_range(steps.height, eager=True)
        step_index = pl.DataFrame({"step_id": steps["range_id"].cast(pl.Int64), "index": index.cast(pl.Int64)})
    nccl_ops = with_operation(nccl_ops, ranges, nccl_domain)
    types = by_type(nccl_ops.with_columns(pl.col("step_id").cast(pl.Int64)), cover, step_index)
    peers = peer_matrix(rank, nccl_ops, p2p_calls(ranges, nccl_domain), group_size=group_size)
    return types, peers
