"""The link counters beside the kernels: nsys GPU metrics over a rank's steps, NCCL kernels and copies.

Inputs: the capture's link samples (traceguard.ingest.gpu_metrics; percentages of each counter's
peak, one row per sample time and GPU) of the rank's own GPU, and the intervals of its GPU work.

Definitions (DESIGN.md, "Link counters"):

- A sample stamped *t* averages the sample period that STARTS at *t*: [t, t + period). Measured on
  real exports (nsys 2025.3, 2×H200 at 2 kHz, bench/gpu/SWEEP.md): a 19 MB input copy over
  [260.527, 260.876] ms reads 58 % PCIe in the sample stamped 260.562 and 6 % in the one stamped
  260.062, as the period after each stamp predicts (63 % and 7 % of the copy's rate), not the period
  before it (7 % and 0 %); an NCCL kernel's last busy sample is the one stamped before its end. A
  sample's time here is therefore the middle of its period, t + period / 2 (:func:`sample_midpoints`).
  A sample is *in* an interval [start, end] of GPU work when start ≤ that time ≤ end; *over* a set
  of intervals when it is in any of them. Statistics over a window are over the samples in it:
  ``avg`` (mean), ``p95`` (linear interpolation), ``peak`` (max). A window shorter than the sample period can hold none:
  its figures are then null.
- ``pcie`` and ``nvlink`` of a sample: the busier direction, max(RX, TX), the figure a link's
  saturation is judged on (as ``nvidia-smi dmon``'s PCIe load is).
- Windows: each step (its GPU span: first GPU start to last GPU end of the work it launched), the
  NCCL kernels (every NCCL kernel of the analysis window), the copies (memcpy and memset ops of the
  window, as the timeline's copies lane), and the whole window (the samples in any step, or all of
  them when the rank has no steps).
- Where NCCL's bytes went: each sample over the NCCL kernels is *NVLink* when the NVLink figure is
  at least :data:`LINK_BUSY_PCT`, else *PCIe* when the PCIe figure is, else *idle* (the kernel waits
  or moves too little to show). The shares are of those samples; the times are the shares × the
  NCCL kernels' time (the union of their intervals).

Rank metrics are fractions (0.2 = 20 %) so that they compare with ``pcie_saturation`` from dmon.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import polars as pl

from traceguard.metrics.intervals import running_max
from traceguard.metrics.timeline import MAX_SEGMENTS
from traceguard.model import LINK_METRICS, OP_KINDS, Capture

#: memcpy and memset, as the timeline's copies lane.
COPY_CODES = (OP_KINDS.index("memcpy"), OP_KINDS.index("memset"))

#: A link direction at or above this share of its peak (percent) carries the sample's traffic.
#: Idle links read 0–1 % on 2×H200 (tests/fixtures/h200x2_links): 5 % is well above that noise.
LINK_BUSY_PCT = 5.0
#: The combined figures (max of the two directions) next to the normalized counters.
COMBINED = {"pcie": ("pcie_rx_pct", "pcie_tx_pct"), "nvlink": ("nvlink_rx_pct", "nvlink_tx_pct")}
#: Per-step fields of the step rows (what the store and `traceguard steps` carry), null when the
#: capture has no link counters for the rank's GPU.
LINK_STEP_FIELDS = (
    "pcie_avg_pct",
    "pcie_peak_pct",
    "nvlink_avg_pct",
    "nvlink_peak_pct",
    "nccl_pcie_avg_pct",
    "nccl_nvlink_avg_pct",
)
#: Rank metrics (fractions), null with the capture's reason when it has no link counters.
LINK_RANK_METRICS = (
    "link_samples",
    "link_nccl_samples",
    "pcie_nccl_avg",
    "pcie_nccl_p95",
    "pcie_nccl_peak",
    "nvlink_nccl_avg",
    "nvlink_nccl_p95",
    "nvlink_nccl_peak",
    "nccl_nvlink_share",
    "nccl_pcie_share",
    "nccl_link_idle_share",
)


class IntervalMarks:
    """Which of a sorted array of sample times fall in any of a set of intervals, fed in parts
    (the sliced analysis feeds each slice's copies): a difference array over sample positions."""

    def __init__(self, times: np.ndarray) -> None:
        self.times = times
        self._diff = np.zeros(times.size + 1, dtype=np.int64)

    def mark(self, starts: np.ndarray, ends: np.ndarray) -> None:
        if starts.size == 0 or self.times.size == 0:
            return
        lo = np.searchsorted(self.times, starts, side="left")
        hi = np.searchsorted(self.times, ends, side="right")
        keep = hi > lo
        size = self._diff.size
        self._diff += np.bincount(lo[keep], minlength=size)[:size]
        self._diff -= np.bincount(hi[keep], minlength=size)[:size]

    def mask(self) -> np.ndarray:
        return np.cumsum(self._diff[:-1]) > 0


def sample_midpoints(samples: pl.DataFrame, capture: Capture) -> pl.DataFrame:
    """``samples`` with each ``time`` moved from its stamp, the start of the period it averages, to
    the period's middle (module docstring); the period is the capture's median sample period."""
    frequency = (capture.info.gpu_metrics or {}).get("frequency_hz")
    if not frequency or samples.height == 0:
        return samples
    half = round(0.5e9 / float(frequency))
    return samples.with_columns(pl.col("time") + half)


def rank_device_samples(
    capture: Capture, devices_used: Sequence[int | None]
) -> tuple[pl.DataFrame, int | None, str | None]:
    """The capture's samples of the rank's GPU (the first device its window's work ran on that was
    sampled), sorted by time, each at the middle of its period (:func:`sample_midpoints`); that
    device; or why there are none."""
    capture.resolve_links()
    samples = sample_midpoints(capture.link_samples, capture)
    info = capture.info
    if samples.height == 0:
        return samples, None, info.gpu_metrics_reason or "the capture has no GPU metrics"
    sampled = set(samples["device"].unique().to_list())
    used = [d for d in devices_used if d is not None]
    device = next((d for d in used if d in sampled), None)
    if device is None:
        return (
            samples.clear(),
            None,
            f"GPU metrics were sampled on GPU {', '.join(map(str, sorted(sampled)))}, not on this rank's GPU "
            f"{', '.join(map(str, used)) or '(none used)'}: give each rank's nsys its own GPU "
            "(`--gpu-metrics-devices=$LOCAL_RANK`; one collector per GPU)",
        )
    own = samples.filter(pl.col("device") == device).sort("time")
    return own, device, None


def window_stats(frame: pl.DataFrame) -> dict[str, dict[str, float | None]]:
    """avg / p95 / peak (percent) of every counter present and of the combined pcie / nvlink."""
    if frame.height == 0:
        return {}
    present = [c for c in (*COMBINED, *LINK_METRICS) if c in frame.columns and frame[c].null_count() < frame.height]
    row = frame.select(
        *(pl.col(c).mean().alias(f"{c}|avg") for c in present),
        *(pl.col(c).quantile(0.95, interpolation="linear").alias(f"{c}|p95") for c in present),
        *(pl.col(c).max().alias(f"{c}|peak") for c in present),
    ).row(0, named=True)
    out: dict[str, dict[str, float | None]] = {}
    for key, value in row.items():
        name, stat = key.split("|")
        out.setdefault(name, {})[stat] = None if value is None else round(float(value), 3)
    return out


def with_combined(samples: pl.DataFrame) -> pl.DataFrame:
    """The samples with ``pcie`` and ``nvlink``: the busier direction (null when neither is known)."""
    return samples.with_columns(pl.max_horizontal(rx, tx).alias(name) for name, (rx, tx) in COMBINED.items())


def rank_links(
    capture: Capture,
    own: pl.DataFrame,
    device: int | None,
    reason: str | None,
    step_rows: list[dict[str, Any]],
    nccl_in_window: pl.DataFrame,
    copy_mask: np.ndarray | None,
) -> tuple[dict[str, Any], dict[str, str], dict[str, Any]]:
    """The rank's link metrics, their null reasons, and the detail for the report; fills the
    :data:`LINK_STEP_FIELDS` of ``step_rows`` in place. ``own, device, reason``: what
    :func:`rank_device_samples` gave; ``copy_mask``: which of those samples lie over the copies."""
    m: dict[str, Any] = dict.fromkeys(LINK_RANK_METRICS)
    null: dict[str, str] = {}
    for row in step_rows:
        row.update(dict.fromkeys(LINK_STEP_FIELDS))
    if device is None or own.height == 0:
        why = reason or "no GPU metrics samples of this rank's GPU"
        null.update(dict.fromkeys(LINK_RANK_METRICS, why))
        return m, null, {"null_reason": why}
    own = with_combined(own)
    times = own["time"].to_numpy()
    # The samples of each step (its GPU span) and of the NCCL kernels.
    step_of = np.full(times.size, -1, dtype=np.int64)
    timed_steps = [r for r in step_rows if r.get("gpu_start_ns") is not None and r.get("gpu_span_ns")]
    for position, row in enumerate(timed_steps):
        lo = np.searchsorted(times, row["gpu_start_ns"], side="left")
        hi = np.searchsorted(times, row["gpu_start_ns"] + row["gpu_span_ns"], side="right")
        step_of[lo:hi] = np.where(step_of[lo:hi] < 0, position, step_of[lo:hi])
    nccl = nccl_in_window.filter(pl.col("start").is_not_null() & pl.col("end").is_not_null())
    if "device" in nccl.columns:
        nccl = nccl.filter(pl.col("device").is_null() | (pl.col("device") == device))
    marks = IntervalMarks(times)
    marks.mark(nccl["start"].to_numpy(), nccl["end"].to_numpy())
    in_nccl = marks.mask()
    in_copies = copy_mask if copy_mask is not None and copy_mask.size == times.size else np.zeros(times.size, bool)
    frame = own.with_columns(
        pl.Series("step", step_of), pl.Series("in_nccl", in_nccl), pl.Series("in_copies", in_copies)
    )
    window = frame.filter(pl.col("step") >= 0) if timed_steps else frame
    over = {
        "window": window_stats(window),
        "nccl": window_stats(window.filter(pl.col("in_nccl"))),
        "copies": window_stats(window.filter(pl.col("in_copies"))),
    }
    counts = {
        "window": window.height,
        "nccl": int(window["in_nccl"].sum()),
        "copies": int(window["in_copies"].sum()),
    }
    split = _nccl_split(window.filter(pl.col("in_nccl")), _union_ns(nccl))
    m["link_samples"] = counts["window"]
    m["link_nccl_samples"] = counts["nccl"]
    nccl_over = over["nccl"]
    for link in COMBINED:
        for stat in ("avg", "p95", "peak"):
            value = nccl_over.get(link, {}).get(stat)
            m[f"{link}_nccl_{stat}"] = None if value is None else value / 100
    for key in ("nvlink", "pcie", "idle"):
        m[f"nccl_{key}_share" if key != "idle" else "nccl_link_idle_share"] = split.get(f"{key}_share")
    no_nccl = "no NCCL kernel of this rank's window holds a GPU metrics sample" if counts["nccl"] == 0 else None
    for key in LINK_RANK_METRICS:
        if m[key] is None:
            if key.startswith(("pcie", "nvlink")) and "nccl" in key:
                link = key.split("_", 1)[0]
                name = "PCIe" if link == "pcie" else "NVLink"
                null[key] = no_nccl or f"the capture's GPU metrics hold no valid {name} throughput value"
            else:
                null[key] = no_nccl or "not available from these samples"
    per_step = _per_step(frame, timed_steps)
    for position, row in enumerate(timed_steps):
        stats = per_step.get(position, {})
        row["pcie_avg_pct"] = stats.get("step", {}).get("pcie", {}).get("avg")
        row["pcie_peak_pct"] = stats.get("step", {}).get("pcie", {}).get("peak")
        row["nvlink_avg_pct"] = stats.get("step", {}).get("nvlink", {}).get("avg")
        row["nvlink_peak_pct"] = stats.get("step", {}).get("nvlink", {}).get("peak")
        row["nccl_pcie_avg_pct"] = stats.get("nccl", {}).get("pcie", {}).get("avg")
        row["nccl_nvlink_avg_pct"] = stats.get("nccl", {}).get("nvlink", {}).get("avg")
    info = capture.info.gpu_metrics or {}
    detail = {
        "device": device,
        "source": info.get("source"),
        "frequency_hz": info.get("frequency_hz"),
        "invalid_values": info.get("invalid_values", 0),
        "names": info.get("names", {}),
        "samples": counts,
        "over": over,
        "nccl_split": split,
        "steps": [{"index": timed_steps[p]["index"], **stats} for p, stats in sorted(per_step.items())],
        "null_reason": None,
    }
    return m, null, detail


def _per_step(frame: pl.DataFrame, timed_steps: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """Per step position: avg / p95 / peak of the links (the combined ``pcie`` and ``nvlink``)
    over the step, its NCCL kernels and its copies, one group-by per window. The other counters
    (SM, DRAM, each direction) are per rank only: thousands of steps × every counter would make the
    report several times larger for figures nobody reads step by step."""
    out: dict[int, dict[str, Any]] = {}
    if not timed_steps:
        return out
    stepped = frame.filter(pl.col("step") >= 0)
    known = stepped.height
    present = [c for c in COMBINED if c in stepped.columns and stepped[c].null_count() < known]
    aggregations = [
        pl.len().alias("samples"),
        *(pl.col(c).mean().alias(f"{c}|avg") for c in present),
        *(pl.col(c).quantile(0.95, interpolation="linear").alias(f"{c}|p95") for c in present),
        *(pl.col(c).max().alias(f"{c}|peak") for c in present),
    ]
    windows = (
        ("step", stepped),
        ("nccl", stepped.filter(pl.col("in_nccl"))),
        ("copies", stepped.filter(pl.col("in_copies"))),
    )
    for window, part in windows:
        table = part.group_by("step").agg(aggregations)
        columns = {name: table[name].to_list() for name in table.columns}
        for i, position in enumerate(columns.pop("step")):
            entry = out.setdefault(int(position), {"samples": 0, "step": {}, "nccl": {}, "copies": {}})
            samples = columns["samples"][i]
            if window == "step":
                entry["samples"] = samples
            stats = entry[window]
            for key, values in columns.items():
                if key == "samples":
                    continue
                name, stat = key.split("|")
                value = values[i]
                stats.setdefault(name, {})[stat] = None if value is None else round(float(value), 3)
    return out


def _nccl_split(over_nccl: pl.DataFrame, nccl_ns: int) -> dict[str, Any]:
    """Where the NCCL kernels' samples show traffic (module docstring): shares and times."""
    total = over_nccl.height
    out: dict[str, Any] = {"samples": total, "nccl_ns": nccl_ns, "busy_pct": LINK_BUSY_PCT}
    if total == 0:
        return (
            out
            | {f"{k}_share": None for k in ("nvlink", "pcie", "idle")}
            | {f"{k}_ns": None for k in ("nvlink", "pcie", "idle")}
        )
    nvlink = pl.col("nvlink").fill_null(0) >= LINK_BUSY_PCT if "nvlink" in over_nccl.columns else pl.lit(False)
    pcie = pl.col("pcie").fill_null(0) >= LINK_BUSY_PCT if "pcie" in over_nccl.columns else pl.lit(False)
    counts = over_nccl.select(
        nvlink.sum().alias("nvlink"), (~nvlink & pcie).sum().alias("pcie"), (~nvlink & ~pcie).sum().alias("idle")
    ).row(0, named=True)
    for key, count in counts.items():
        share = int(count) / total
        out[f"{key}_share"] = share
        out[f"{key}_ns"] = round(share * nccl_ns)
    return out


def _union_ns(intervals: pl.DataFrame) -> int:
    if intervals.height == 0:
        return 0
    ordered = intervals.select("start", "end").sort("start")
    starts, ends = ordered["start"].to_numpy(), ordered["end"].to_numpy()
    reach = running_max(ends)
    new = np.ones(starts.size, dtype=bool)
    new[1:] = starts[1:] > reach[:-1]  # a segment starts where no earlier interval still runs
    seg_end = np.maximum.reduceat(ends, np.flatnonzero(new))
    return int((seg_end - starts[new]).sum())


def copy_mask_of(ops: pl.DataFrame, mask: pl.Series, times: np.ndarray) -> np.ndarray:
    """Which sample ``times`` lie over the window's copies (memcpy and memset ops): the whole-file
    analysis's ``RankInputs.copy_mask``."""
    marks = IntervalMarks(times)
    if times.size:
        kind = pl.col("kind").to_physical()
        moved = (
            ops.lazy()
            .filter(mask)
            .filter(kind.is_in(list(COPY_CODES)) & pl.col("start").is_not_null() & pl.col("end").is_not_null())
            .select("start", "end")
            .collect()
        )
        marks.mark(moved["start"].to_numpy(), moved["end"].to_numpy())
    return marks.mask()


def with_link_lane(timeline: dict[str, Any], own: pl.DataFrame, device: int | None) -> dict[str, Any]:
    """``timeline`` with ``link_lane``: the rank's PCIe and NVLink load (the busier direction, %)
    on the timeline's scale (ns from its ``origin_ns``), at most ``MAX_SEGMENTS`` buckets of
    consecutive samples, each with its mean and its peak, so a lane of 1 M samples still shows
    the bursts. Without samples, ``{"null_reason": ...}``."""
    if not timeline:
        return timeline
    origin = timeline.get("origin_ns")
    if device is None or own.height == 0 or origin is None:
        return {**timeline, "link_lane": {"null_reason": "no GPU metrics samples of this rank's GPU"}}
    samples = with_combined(own)
    end = timeline.get("span_ns")
    times = samples["time"].to_numpy()
    keep = times >= origin if end is None else (times >= origin) & (times <= origin + end)
    samples = samples.filter(pl.Series(keep))
    if samples.height == 0:
        return {**timeline, "link_lane": {"null_reason": "no GPU metrics sample lies in the timeline's window"}}
    buckets = min(MAX_SEGMENTS, samples.height)
    lane = (
        samples.with_columns((pl.int_range(pl.len()) * buckets // pl.len()).alias("bucket"))
        .group_by("bucket", maintain_order=True)
        .agg(
            pl.col("time").first().alias("start"),
            pl.col("time").last().alias("end"),
            *(pl.col(c).mean().alias(f"{c}_avg") for c in COMBINED),
            *(pl.col(c).max().alias(f"{c}_peak") for c in COMBINED),
        )
    )
    out: dict[str, Any] = {"device": device, "samples": samples.height, "null_reason": None}
    out["start"] = (lane["start"] - origin).to_list()
    out["end"] = (lane["end"] - origin).to_list()
    for column in lane.columns:
        if column.endswith(("_avg", "_peak")):
            out[column] = [None if v is None else round(float(v), 1) for v in lane[column].to_list()]
    return {**timeline, "link_lane": out}


def capture_link_rows(ranks: Sequence[Any]) -> list[dict[str, Any]]:
    """One compact row per rank with link counters (the reduce's input to the link rules):
    rank, host, GPU, NCCL-time figures (fractions), where NCCL's bytes went, and the copies' PCIe."""
    rows = []
    for result in ranks:
        detail = getattr(result, "link_counters", None) or {}
        if detail.get("device") is None:
            continue
        m = result.metrics
        copies = (detail.get("over") or {}).get("copies", {}).get("pcie", {})
        rows.append(
            {
                "rank": result.rank,
                "host": (result.clock or {}).get("host"),
                "gpu": detail["device"],
                "samples_nccl": m.get("link_nccl_samples"),
                **{key: m.get(key) for key in LINK_RANK_METRICS if key not in ("link_samples", "link_nccl_samples")},
                "copies_pcie_avg": None if copies.get("avg") is None else copies["avg"] / 100,
                "copies_pcie_peak": None if copies.get("peak") is None else copies["peak"] / 100,
                "nccl_ns": (detail.get("nccl_split") or {}).get("nccl_ns"),
            }
        )
    return rows


def capture_null_reason(ranks: Sequence[Any]) -> str:
    """Why no rank has link counters: the first rank's reason (they share the capture settings)."""
    for result in ranks:
        reason = (getattr(result, "link_counters", None) or {}).get("null_reason")
        if reason:
            return f"rank {result.rank}: {reason}"
    return "no capture was analysed"
