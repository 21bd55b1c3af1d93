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
    def bulk(self, table: str, spec: Sequence[tuple[str, str, str]], where: str = "") -> pl.DataFrame: ...


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


def read_link_samples(
    src: _Source, gpu_devices: Callable[[], dict[int, int]]
) -> tuple[pl.DataFrame, dict[str, Any] | None, str]:
    """The capture's link samples (:data:`model.LINK_SAMPLES_SCHEMA`), their info as a dict (or
    None), and when there are none, why. ``gpu_devices``: GPU id → CUDA device (TARGET_INFO_GPU)."""
    empty = model.empty(model.LINK_SAMPLES_SCHEMA)
    if "GPU_METRICS" not in src.tables:
        if "GENERIC_EVENTS" in src.tables and _generic_events_hold_metrics(src):
            return (
                empty,
                None,
                (
                    "the export keeps GPU metrics in the nsys 2021 form (JSON in GENERIC_EVENTS), which traceguard "
                    "does not read: re-export the report with nsys 2022.4 or later (`nsys export --type sqlite`)"
                ),
            )
        return (
            empty,
            None,
            "the capture has no GPU metrics (record them with `nsys profile --gpu-metrics-devices=<GPU>`)",
        )
    if "TARGET_INFO_GPU_METRICS" not in src.tables:
        return empty, None, "the export has GPU_METRICS but no TARGET_INFO_GPU_METRICS naming its counters"
    cols = src.columns("GPU_METRICS")
    if not {"timestamp", "typeId", "metricId", "value"} <= cols:
        return empty, None, f"GPU_METRICS lacks the columns traceguard reads (has: {', '.join(sorted(cols))})"
    catalog = src.small("SELECT DISTINCT typeId, metricId, metricName FROM TARGET_INFO_GPU_METRICS")
    wanted, names, others = _select_counters([(int(t), int(m), str(n or "")) for t, m, n in catalog])
    if not wanted:
        found = ", ".join(sorted({str(n) for _, _, n in catalog})[:8]) or "none"
        return empty, None, f"the GPU metric set records no PCIe/NVLink/SM/DRAM load counter (its counters: {found})"
    pairs = pl.DataFrame(
        [(t, m, key) for (t, m), key in wanted.items()],
        schema={"type_id": pl.Int64, "metric_id": pl.Int64, "key": pl.String},
        orient="row",
    )
    metric_ids = sorted({m for _, m in wanted})
    raw = src.bulk(
        "GPU_METRICS",
        [
            ("time", "timestamp", "int"),
            ("type_id", "typeId", "int"),
            ("metric_id", "metricId", "int"),
            ("value", "value", "int"),
        ],
        f"WHERE metricId IN ({', '.join(str(m) for m in metric_ids)})",
    )
    if raw.height == 0:
        return empty, None, "the capture's GPU_METRICS table holds no samples of the link counters"
    keyed = raw.join(pairs, on=["type_id", "metric_id"], how="inner")
    devices = gpu_devices()
    gpu = (pl.col("type_id") & 0xFF).cast(pl.Int32)
    keyed = keyed.with_columns(gpu.replace_strict(devices, default=gpu, return_dtype=pl.Int32).alias("device"))
    # Requests + responses (or read + write) are separate counters of one sample: summed per key.
    wide = (
        keyed.group_by("device", "time", "key")
        .agg(pl.col("value").sum())
        .pivot(on="key", index=["device", "time"], values="value")
        .sort("device", "time")
    )
    samples = model.conform(
        wide.with_columns(pl.col(c).clip(0, 100) for c in wide.columns if c in names), model.LINK_SAMPLES_SCHEMA
    )
    samples = samples.filter(pl.col("time") >= 0)  # nsys writes a few samples before the session's time 0
    info = GpuMetricsInfo(
        source="GPU_METRICS",
        names=names,
        other_names=others,
        devices=sorted(samples["device"].unique().to_list()),
        samples=samples.height,
        frequency_hz=_frequency(samples),
    )
    return samples, asdict(info), ""


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
