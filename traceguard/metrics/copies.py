"""Copy metrics: GPU→CPU copies, device-to-device and peer copies, pageable host memory.

- GPU→CPU copy rate = memcpys of kind DtoH or unified DtoH ÷ GPU ops (kernels + memcpys +
  memsets) in the analysis window.
- DtoD: device-to-device copies on one GPU (``DtoD``); peer copies between GPUs (``PtoP``) apart.
- Pageable share = bytes of host↔device copies (HtoD, DtoH) whose host side is pageable ÷ bytes
  of host↔device copies whose host memory kind is known; the count of those copies is the
  evidence the pageable rule's floor reads with their bytes.
"""

from __future__ import annotations

import polars as pl

GPU_TO_CPU = ("DtoH", "unified_DtoH")
HOST_KINDS = ("pageable", "pinned", "managed", "managed_static")


def copy_counts(ops: pl.DataFrame) -> dict[str, int]:
    """Counts and bytes of the copy families over ``ops`` (the window)."""
    kind = pl.col("copy_kind")
    row = (
        ops.lazy()
        .select(
            pl.len().alias("gpu_ops"),
            kind.is_in(GPU_TO_CPU).sum().alias("gpu_to_cpu_copies"),
            pl.col("bytes").filter(kind.is_in(GPU_TO_CPU)).sum().alias("gpu_to_cpu_bytes"),
            (kind == "DtoD").sum().alias("dtod_copies"),
            pl.col("bytes").filter(kind == "DtoD").sum().alias("dtod_bytes"),
            (kind == "PtoP").sum().alias("peer_copies"),
            pl.col("bytes").filter(kind == "PtoP").sum().alias("peer_bytes"),
        )
        .collect()
        .row(0, named=True)
    )
    return {k: int(v or 0) for k, v in row.items()}


def pageable_bytes(ops: pl.DataFrame) -> tuple[int, int, int]:
    """(pageable host↔device bytes, host↔device bytes with a known host memory kind, and the
    number of those copies)."""
    host_side = (
        pl.when(pl.col("copy_kind") == "HtoD")
        .then(pl.col("src_kind"))
        .when(pl.col("copy_kind") == "DtoH")
        .then(pl.col("dst_kind"))
        .otherwise(None)
    )
    row = (
        ops.lazy()
        .with_columns(host_side.cast(pl.String).alias("host_kind"))
        .filter(pl.col("host_kind").is_in(HOST_KINDS))
        .select(
            pl.col("bytes").filter(pl.col("host_kind") == "pageable").sum().alias("pageable"),
            pl.col("bytes").sum().alias("known"),
            pl.len().alias("copies"),
        )
        .collect()
        .row(0)
    )
    return int(row[0] or 0), int(row[1] or 0), int(row[2] or 0)
