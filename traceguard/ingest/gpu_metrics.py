"""nsys GPU metrics (``--gpu-metrics-devices``): the link counters, read into a few columns.

Generations (NSYS.md, "GPU metrics"; public readers of the same tables agree):

- nsys 2022.x and later: ``GPU_METRICS([rawTimestamp,] timestamp, typeId, metricId, value)``, one
  row per counter per sample, names in ``TARGET_INFO_GPU_METRICS(typeId, sourceId, typeName,
  metricId, metricName)``. The GPU is ``typeId & 0xFF``, the ``id`` of ``TARGET_INFO_GPU``, whose
  ``cuDevice`` is the CUDA device the rank's kernels report (seen on 2×H200, nsys 2025.3: rank 1's
  typeId 0x1000100000001, GPU id 1, cuDevice 1, kernels on device 1).
- nsys 2021.x kept the samples as JSON in ``GENERIC_EVENTS``; traceguard does not read that form
  (no export of it could be checked) and says so: re-export the report with nsys 2022.4 or later.

Metric sets differ per chip (``nsys profile --gpu-metrics-set=help``: ga100, gh100, gb10x, ...) and
names changed across versions, so the raw name is kept and mapped to a small normalized set
(:data:`traceguard.model.LINK_METRICS`) by pattern. Where a set splits a link's user data into
requests and responses (gh100: "NVLink RX Requests User Data", "NVLink RX Responses User Data"),
the normalized value is their sum: both share the link's one direction, so the sum is that
direction's user-data load. DRAM read and write are summed the same way. Sets that only give a
link's total ("NVLink RX Throughput") map to it, protocol overhead included (the info says which).

Bounded memory: only the counters of the normalized set are read (9 of gh100's 30), as integers,
then pivoted to one row per sample time and GPU: 36 bytes a sample instead of 30 rows of 40.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import polars as pl

from traceguard import model
from traceguard.ingest.rows import Rows

#: Normalized metric → raw-name patterns, tried in order: the first pattern that matches any of
#: the capture's names wins, and every name it matches is summed (requests + responses).
PATTERNS: dict[str, tuple[str, ...]] = {
    "pcie_rx_pct": (r"^PCIe RX Throughput\b",),
    "pcie_tx_pct": (r"^PCIe TX Throughput\b",),
    "nvlink_rx_pct": (r"^NVLink RX (Requests |Responses )?User Data\b", r"^NVLink RX Throughput\b"),
    "nvlink_tx_pct": (r"^NVLink TX (Requests |Responses )?User Data\b", r"^NVLink TX Throughput\b"),
    "sm_active_pct": (r"^SMs? Active\b",),
    "dram_bw_pct": (r"^DRAM (Read|Write) Bandwidth\b", r"^DRAM Bandwidth\b"),
}
#: Only percentages are normalized: a name with another unit (bytes/s, MHz, warps) is not a load.
_PERCENT = re.compile(r"\[.*%.*\]\s*$")
_UNIT = re.compile(r"\[[^\]]*\]\s*$")


class _Source(Protocol):
    tables: set[str]

    def columns(self, table: str) -> set[str]: ...
    def small(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...
    def bulk(self, table: str, spec: Sequence[tuple[str, str, str]], where: str | Rows = "") -> pl.DataFrame: ...


@dataclass
class GpuMetricsInfo:
    """What a capture holds of GPU metrics (``CaptureInfo.gpu_metrics`` as a dict)."""

    source: str
    #: Normalized metric → the raw counter names summed into it.
    names: dict[str, list[str]] = field(default_factory=dict)
    #: Counters of the capture that are not normalized (kept by name for the report).
    other_names: list[str] = field(default_factory=list)
    #: CUDA devices sampled, and the GPUs' names.
    devices: list[int] = field(default_factory=list)
    gpu_names: list[str] = field(default_factory=list)
    samples: int = 0
    #: Median sample period → rate, per the first GPU sampled.
    frequency_hz: float | None = None
    #: Counter values outside 0..100 % (a damaged file), read as unknown.
    invalid_values: int = 0


#: GPU_METRICS rows scanned per chunk (by rowid): the read holds one chunk's integers at a time.
CHUNK_ROWS = 1_000_000

Bulk = Callable[[str, Sequence[tuple[str, str, str]], "str | Rows"], pl.DataFrame]


@dataclass
class LinkPlan:
    """What to read of GPU_METRICS, decided from the small tables (:func:`plan_link_read`)."""

    #: (typeId, metricId) → normalized key.
    wanted: dict[tuple[int, int], str]
    names: dict[str, list[str]]
    others: list[str]
    #: GPU id → CUDA device.
    devices: dict[int, int]
    max_rowid: int


def plan_link_read(src: _Source, gpu_devices: Callable[[], dict[int, int]]) -> LinkPlan | str:
    """The plan for :func:`load_link_samples`, or why the capture has no link samples."""
    if "GPU_METRICS" not in src.tables:
        if "GENERIC_EVENTS" in src.tables and _generic_events_hold_metrics(src):
            return (
                "the export keeps GPU metrics in the nsys 2021 form (JSON in GENERIC_EVENTS), which traceguard "
                "does not read: re-export the report with nsys 2022.4 or later (`nsys export --type sqlite`)"
            )
        return "the capture has no GPU metrics (record them with `nsys profile --gpu-metrics-devices=<GPU>`)"
    if "TARGET_INFO_GPU_METRICS" not in src.tables:
        return "the export has GPU_METRICS but no TARGET_INFO_GPU_METRICS naming its counters"
    cols = src.columns("GPU_METRICS")
    if not {"timestamp", "typeId", "metricId", "value"} <= cols:
        return f"GPU_METRICS lacks the columns traceguard reads (has: {', '.join(sorted(cols))})"
    # Rows whose ids are not integers (a damaged file) name no counter that GPU_METRICS could hold.
    catalog = src.small(
        "SELECT DISTINCT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS "
        "WHERE typeof(typeId) = 'integer' AND typeof(metricId) = 'integer'"
    )
    wanted, names, others = _select_counters([(int(t), int(m), str(n or "")) for t, m, n in catalog])
    if not wanted:
        found = ", ".join(sorted({str(n) for _, _, n in catalog})[:8]) or "none"
        return f"the GPU metric set records no PCIe/NVLink/SM/DRAM load counter (its counters: {found})"
    (top,) = src.small("SELECT max(rowid) FROM GPU_METRICS")[0]
    return LinkPlan(wanted, names, others, gpu_devices(), int(top or 0))


def load_link_samples(plan: LinkPlan, bulk: Bulk) -> tuple[pl.DataFrame, dict[str, Any] | None, str]:
    """The samples of ``plan`` (:data:`model.LINK_SAMPLES_SCHEMA`), their info as a dict, or why
    none. ``bulk(table, spec, where)`` reads integer columns (the nsys reader's). Safe to run on
    another thread than the plan's when ``bulk`` opens its own connection (the C reader does)."""
    ids = tuple(sorted({m for _, m in plan.wanted}))
    types = sorted({t for t, _ in plan.wanted})
    # One GPU's counters (one collector per rank, the usual file): its typeId need not be read.
    spec = [("time", "timestamp", "int"), ("metric_id", "metricId", "int"), ("value", "value", "int")]
    if len(types) > 1:
        spec.insert(1, ("type_id", "typeId", "int"))
    parts: list[pl.DataFrame] = []
    carry: pl.DataFrame | None = None
    invalid = 0
    for low in range(0, plan.max_rowid + 1, CHUNK_ROWS):
        chunk = bulk("GPU_METRICS", spec, Rows(((low, low + CHUNK_ROWS),), "metricId", ids))
        if len(types) == 1:
            chunk = chunk.with_columns(pl.lit(types[0], dtype=pl.Int64).alias("type_id"))
        # A throughput outside 0..100 % is no measurement (a damaged file): that counter of that
        # sample is unknown, never clipped into a saturated link.
        valid = pl.col("value").is_between(0, 100)
        invalid += int(chunk.select((~valid).sum()).item() or 0)
        chunk = chunk.with_columns(pl.when(valid).then(pl.col("value")).alias("value"))
        if carry is not None:
            chunk = pl.concat([carry, chunk])
        last = low + CHUNK_ROWS > plan.max_rowid
        if not last and chunk.height:
            # A sample's counters may straddle the chunk's end: its last time per GPU goes on.
            cutoff = chunk.group_by("type_id").agg(pl.col("time").max())["time"].min()
            carry, chunk = chunk.filter(pl.col("time") >= cutoff), chunk.filter(pl.col("time") < cutoff)
        if chunk.height:
            parts.append(_wide(chunk, plan))
    samples = model.conform(pl.concat(parts), model.LINK_SAMPLES_SCHEMA) if parts else None
    if samples is None or samples.height == 0:
        return (
            model.empty(model.LINK_SAMPLES_SCHEMA),
            None,
            "the capture's GPU_METRICS holds no sample of the link counters",
        )
    samples = samples.filter(pl.col("time") >= 0).sort("device", "time")  # nsys writes a few before time 0
    info = GpuMetricsInfo(
        source="GPU_METRICS",
        names=plan.names,
        other_names=plan.others,
        devices=sorted(samples["device"].unique().to_list()),
        samples=samples.height,
        frequency_hz=_frequency(samples),
        invalid_values=invalid,
    )
    return samples, asdict(info), ""


def read_link_samples(
    src: _Source, gpu_devices: Callable[[], dict[int, int]]
) -> tuple[pl.DataFrame, dict[str, Any] | None, str]:
    """The capture's link samples (:data:`model.LINK_SAMPLES_SCHEMA`), their info as a dict (or
    None), and when there are none, why. ``gpu_devices``: GPU id → CUDA device (TARGET_INFO_GPU)."""
    plan = plan_link_read(src, gpu_devices)
    if isinstance(plan, str):
        return model.empty(model.LINK_SAMPLES_SCHEMA), None, plan
    return load_link_samples(plan, src.bulk)


def _wide(chunk: pl.DataFrame, plan: LinkPlan) -> pl.DataFrame:
    """One row per (GPU, sample time) with the normalized keys (requests + responses summed),
    whole percents clipped to 0..100. Each counter of a GPU is sampled at the same times, so the
    columns line up by position; where they do not, a group-by pivot does the same, slower."""
    columns: dict[str, pl.Series] = {}
    frames = []
    for (type_id,), part in chunk.group_by("type_id", maintain_order=True):
        by_metric = part.partition_by("metric_id", as_dict=True, include_key=False)
        keyed = [(plan.wanted.get((int(type_id), int(m))), frame) for (m,), frame in by_metric.items()]  # type: ignore[call-overload]
        keyed = [(k, f) for k, f in keyed if k is not None]
        times = keyed[0][1]["time"] if keyed else None
        if times is None or not all(f.height == times.len() and f["time"].equals(times) for _, f in keyed):
            frames.append(_wide_by_group(part, int(type_id), plan))  # type: ignore[call-overload]
            continue
        columns = {}
        for key, frame in keyed:
            values = frame["value"]
            columns[key] = values if key not in columns else columns[key] + values
        device = plan.devices.get(int(type_id) & 0xFF, int(type_id) & 0xFF)  # type: ignore[call-overload]
        frames.append(
            pl.DataFrame(
                {"device": pl.repeat(device, times.len(), dtype=pl.Int32, eager=True), "time": times}
            ).with_columns(s.clip(0, 100).alias(k) for k, s in columns.items())
        )
    return pl.concat([model.conform(f, model.LINK_SAMPLES_SCHEMA) for f in frames])


def _wide_by_group(part: pl.DataFrame, type_id: int, plan: LinkPlan) -> pl.DataFrame:
    keys = pl.DataFrame(
        [(m, key) for (t, m), key in plan.wanted.items() if t == type_id],
        schema={"metric_id": pl.Int64, "key": pl.String},
        orient="row",
    )
    device = plan.devices.get(type_id & 0xFF, type_id & 0xFF)
    wide = (
        part.join(keys, on="metric_id", how="inner")
        .group_by("time", "key")
        .agg(pl.col("value").sum())
        .pivot(on="key", index="time", values="value")
    )
    return wide.with_columns(
        pl.lit(device, dtype=pl.Int32).alias("device"), *(pl.col(k).clip(0, 100) for k in wide.columns if k != "time")
    )


def _select_counters(
    catalog: Sequence[tuple[int, int, str]],
) -> tuple[dict[tuple[int, int], str], dict[str, list[str]], list[str]]:
    """(typeId, metricId) → normalized key for the counters to read; the raw names per key; the rest."""
    wanted: dict[tuple[int, int], str] = {}
    names: dict[str, list[str]] = {}
    all_names = sorted({name for _, _, name in catalog})
    for key, patterns in PATTERNS.items():
        for pattern in patterns:
            regex = re.compile(pattern, re.IGNORECASE)
            hits = [(t, m, n) for t, m, n in catalog if regex.search(n) and (_PERCENT.search(n) or not _UNIT.search(n))]
            if hits:
                for t, m, _ in hits:
                    wanted[(t, m)] = key
                names[key] = sorted({n for _, _, n in hits})
                break
    used = {n for ns in names.values() for n in ns}
    return wanted, names, [n for n in all_names if n not in used]


def _frequency(samples: pl.DataFrame) -> float | None:
    if samples.height < 3:
        return None
    first = samples.filter(pl.col("device") == samples["device"][0])
    period = first["time"].diff().drop_nulls().median()
    return round(1e9 / float(period), 1) if period else None  # type: ignore[arg-type]


def _generic_events_hold_metrics(src: _Source) -> bool:
    if "data" not in src.columns("GENERIC_EVENTS"):
        return False
    row = src.small("SELECT 1 FROM GENERIC_EVENTS WHERE data LIKE '%Throughput%' LIMIT 1")
    return bool(row)
