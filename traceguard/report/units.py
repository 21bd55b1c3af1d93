"""Human formatting of report values; the JSON keeps raw integers and fractions."""

from __future__ import annotations

from typing import Any


def ms(ns: float | None) -> str:
    return "n/a" if ns is None else f"{ns / 1e6:.2f} ms"


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def bytes_h(n: float | None) -> str:
    if n is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def value_h(key: str, value: Any) -> str:
    """Format by the metric's name: *_ns as ms, *_bytes as bytes, shares/rates/spreads as %."""
    if value is None:
        return "n/a"
    if isinstance(value, list):
        return ", ".join(str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {v}" for k, v in value.items())
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    if key.endswith("_ns"):
        return ms(value)
    if key.endswith("bytes") or key.endswith("bytes_per_step"):
        return bytes_h(value)
    if key.endswith(("_rate", "_share", "share_of_step", "_spread", "spread")) or key == "nccl_share":
        return pct(value)
    if key == "gbps":
        return f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def held_up_clause(late: dict[str, Any]) -> str:
    """ "; but rank 1 held the others up longest: last at 12, median 30.2 ms late, 94 % of the
    waiting for last ranks (rank 2: 5 %)" — when the rank last most often is not the costliest
    (metrics.waits, ``late.longest_held_up_by``); "" otherwise."""
    other = late.get("longest_held_up_by")
    if not other:
        return ""
    return (
        f"; but rank {other['rank']} held the others up longest: last at {other['last_arrivals']}, median "
        f"{ms(other['median_late_ns'])} late, {pct(other['held_up_share'])} of the waiting for last ranks "
        f"(rank {late['rank']}: {pct(late.get('held_up_share'))})"
    )
