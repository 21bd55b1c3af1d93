"""Two reports side by side: run-level metric deltas and the checks whose status changed.

``delta`` = head − base; ``relative`` = delta ÷ |base| (null when base is 0 or either is null).
Only numeric run metrics are compared; lists and texts (GPU models, transports) appear when they
differ, with null deltas.
"""

from __future__ import annotations

from typing import Any


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def compare(base: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    base_metrics = {k: v for k, v in base["run"]["metrics"].items() if k != "null_reasons"}
    head_metrics = {k: v for k, v in head["run"]["metrics"].items() if k != "null_reasons"}
    metrics = []
    for name in [*base_metrics, *(k for k in head_metrics if k not in base_metrics)]:
        b, h = base_metrics.get(name), head_metrics.get(name)
        nb, nh = _number(b), _number(h)
        if nb is not None and nh is not None:
            delta = nh - nb
            metrics.append(
                {"metric": name, "base": b, "head": h, "delta": delta, "relative": delta / abs(nb) if nb else None}
            )
        elif b != h:
            metrics.append({"metric": name, "base": b, "head": h, "delta": None, "relative": None})
    base_checks = {c["id"]: c["status"] for c in base["checks"]}
    head_checks = {c["id"]: c["status"] for c in head["checks"]}
    changed = [
        {"id": rule, "base": base_checks.get(rule), "head": head_checks.get(rule)}
        for rule in [*base_checks, *(r for r in head_checks if r not in base_checks)]
        if base_checks.get(rule) != head_checks.get(rule)
    ]
    return {
        "base_verdict": base["verdict"],
        "head_verdict": head["verdict"],
        "metrics": metrics,
        "changed_checks": changed,
    }
