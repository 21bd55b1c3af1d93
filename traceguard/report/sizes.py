"""Collective payload sizes for the reports: the histogram per collective type (metrics.small_collectives)
and why small and large messages are judged by different rules."""

from __future__ import annotations

from typing import Any

#: Why the size matters, next to the two link rules that measure each regime.
REGIMES = (
    "Small collectives are latency-bound: each call pays the launch and synchronisation latency that "
    "`allreduce_latency` measures on the collective benchmark (microseconds, whatever the size), so many "
    "small calls add up to time the link never spends moving data. Large ones are bandwidth-bound: their "
    "time is bytes ÷ bus bandwidth, which `p2p_utilization` compares with the link's expected peak. "
    "`small_collectives` counts the first kind inside the steps."
)


def bands() -> list[str]:
    from traceguard.metrics.small_collectives import SIZE_BANDS

    return [label for label, _, _ in SIZE_BANDS]


def size_rows(doc: dict[str, Any]) -> list[tuple[int, str, dict[str, int]]]:
    """(rank, collective, {band: calls}) for every rank and collective type with sized calls."""
    rows: dict[tuple[int, str], dict[str, int]] = {}
    for rank in doc.get("ranks", []):
        for row in (rank.get("small_collectives") or {}).get("sizes", []):
            rows.setdefault((rank["rank"], row["collective"]), {})[row["band"]] = row["calls"]
    return [(rank, collective, counts) for (rank, collective), counts in sorted(rows.items())]


def small_bytes(doc: dict[str, Any]) -> int | None:
    for rank in doc.get("ranks", []):
        if (rank.get("small_collectives") or {}).get("small_bytes"):
            return int(rank["small_collectives"]["small_bytes"])
    return None
