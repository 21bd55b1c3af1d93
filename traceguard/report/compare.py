"""Two reports side by side: checks whose status changed, run metric deltas, and the deltas per
step and per collective type. The one comparison the CLI (``traceguard compare``), the Python API
(``traceguard.compare``), the service's ``/v1/compare`` and its web compare page all show.

- ``delta`` = head − base; ``relative`` = delta ÷ |base| (null when base is 0 or either is null);
  ``delta_pp`` = delta × 100 for shares (fractions in [0, 1], :func:`is_share`): percentage points.
  Only numeric metrics get deltas; lists and texts (GPU models, transports) appear when they
  differ, with null deltas.
- ``changed_checks``: checks whose status differs; ``regression`` marks those the base passed
  and the head warns or fails on. ``regressions`` lists their ids (``fail_regressions``: those
  the head fails), the gate of ``traceguard compare``.
- ``steps``: per (rank, step index), present in either report: ``<field>_base``,
  ``<field>_head`` and ``<field>_delta`` for the step's GPU span, NCCL time and NCCL share (with
  ``nccl_share_delta_pp``), CPU time, DtoD bytes, the wait step fields (wait / transfer, the GPU
  time broken down, lateness: ns) and the link step fields (PCIe / NVLink load, % of the link's
  peak: their delta is in percentage points already). Steps pair by index (time order within the
  rank), not by name. A report by summary (issue 30) gives every rank's steps: read back from its
  Parquet side output while that exists, else from its rank × step heat maps (``rank_steps``: the
  NCCL share, wait, lateness and GPU span of every step, the other fields null; a matrix binned
  over more than 400 step indices gives only its kept ranks' steps).
- ``collectives``: per collective type over the run (``run.collectives_by_type``): count, time,
  exposed time and bytes, each as base / head / delta.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from traceguard.report.fields import LINK_STEP_FIELDS, WAIT_STEP_FIELDS
from traceguard.report.units import value_h

#: Statuses a check can regress to from ``pass``.
WORSE = ("warn", "fail")
STEP_FIELDS = ("gpu_span_ns", "nccl_ns", "nccl_share", "cpu_ns", "dtod_bytes", *WAIT_STEP_FIELDS, *LINK_STEP_FIELDS)
COLLECTIVE_FIELDS = ("count", "time_ns", "exposed_ns", "bytes")


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def is_share(name: str) -> bool:
    """A fraction in [0, 1] (shares, rates, spreads: shown as %, compared in percentage points)."""
    return name.endswith(("_rate", "_share", "share_of_step", "_spread")) or name == "nccl_share"


def _delta(base: Any, head: Any) -> Any:
    nb, nh = _number(base), _number(head)
    if nb is None or nh is None:
        return None
    delta = nh - nb
    return int(delta) if isinstance(base, int) and isinstance(head, int) else delta


def _paired(base: dict[str, Any] | None, head: dict[str, Any] | None, fields: tuple[str, ...]) -> dict[str, Any]:
    row: dict[str, Any] = {}
    for name in fields:
        b = base.get(name) if base else None
        h = head.get(name) if head else None
        row[f"{name}_base"], row[f"{name}_head"], row[f"{name}_delta"] = b, h, _delta(b, h)
        if is_share(name):
            delta = row[f"{name}_delta"]
            row[f"{name}_delta_pp"] = None if delta is None else 100 * delta
    return row


def steps_of(doc: dict[str, Any]) -> dict[tuple[int, int], dict[str, Any]]:
    """Every step of the report by (rank, step index) (module docstring, ``steps``)."""
    kept = {(r["rank"], s["index"]): s for r in doc.get("ranks", []) for s in r.get("steps", [])}
    detail = doc.get("detail") or {}
    if detail.get("mode") != "summary":
        return kept
    if detail.get("folder") and Path(detail["folder"]).is_dir():
        from traceguard.report.detail import rank_entries

        return {
            (e["rank"], s["index"]): s
            for batch in rank_entries(Path(detail["folder"]))
            for e in batch
            for s in e["steps"]
        }
    matrix = doc.get("rank_steps") or {}
    if matrix.get("binned"):
        return kept
    names = {s["index"]: s["name"] for s in kept.values()}
    found: dict[tuple[int, int], dict[str, Any]] = {}
    for name, rows in (matrix.get("fields") or {}).items():
        for rank, row in zip(matrix.get("ranks") or [], rows, strict=True):
            for index, value in zip(matrix.get("indices") or [], row, strict=True):
                if value is not None:
                    step = found.setdefault((rank, index), {"index": index, "name": names.get(index, f"#{index}")})
                    step[name] = value
    return {**found, **kept}


def _step_deltas(base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    b, h = steps_of(base), steps_of(head)
    rows = []
    for key in sorted(set(b) | set(h)):
        names = [s["name"] for s in (b.get(key), h.get(key)) if s]
        paired = _paired(b.get(key), h.get(key), STEP_FIELDS)
        rows.append({"rank": key[0], "index": key[1], "name": names[-1], **paired})
    return rows


def _collective_deltas(base: dict[str, Any], head: dict[str, Any]) -> list[dict[str, Any]]:
    def types_of(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
        return {t["collective"]: t for t in doc.get("run", {}).get("collectives_by_type") or []}

    b, h = types_of(base), types_of(head)
    order = [*b, *(name for name in h if name not in b)]
    return [{"collective": name, **_paired(b.get(name), h.get(name), COLLECTIVE_FIELDS)} for name in order]


def compare(base: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """The comparison of two report documents (module docstring)."""
    base_metrics = {k: v for k, v in base["run"]["metrics"].items() if k != "null_reasons"}
    head_metrics = {k: v for k, v in head["run"]["metrics"].items() if k != "null_reasons"}
    metrics = []
    for name in [*base_metrics, *(k for k in head_metrics if k not in base_metrics)]:
        b, h = base_metrics.get(name), head_metrics.get(name)
        nb, nh = _number(b), _number(h)
        if nb is not None and nh is not None:
            delta = nh - nb
            metrics.append(
                {
                    "metric": name,
                    "base": b,
                    "head": h,
                    "delta": delta,
                    "relative": delta / abs(nb) if nb else None,
                    "delta_pp": 100 * delta if is_share(name) else None,
                }
            )
        elif b != h:
            metrics.append({"metric": name, "base": b, "head": h, "delta": None, "relative": None, "delta_pp": None})
    base_checks = {c["id"]: c["status"] for c in base["checks"]}
    head_checks = {c["id"]: c["status"] for c in head["checks"]}
    changed = [
        {
            "id": rule,
            "base": base_checks.get(rule),
            "head": head_checks.get(rule),
            "regression": base_checks.get(rule) == "pass" and head_checks.get(rule) in WORSE,
        }
        for rule in [*base_checks, *(r for r in head_checks if r not in base_checks)]
        if base_checks.get(rule) != head_checks.get(rule)
    ]
    return {
        "base_verdict": base["verdict"],
        "head_verdict": head["verdict"],
        "metrics": metrics,
        "changed_checks": changed,
        "regressions": [c["id"] for c in changed if c["regression"]],
        "fail_regressions": [c["id"] for c in changed if c["regression"] and c["head"] == "fail"],
        "steps": _step_deltas(base, head),
        "collectives": _collective_deltas(base, head),
    }


def change_text(metric: str, delta: Any, relative: float | None = None) -> str:
    """A delta for people: percentage points for shares, else relative % (or the plain delta)."""
    if delta is None:
        return ""
    if is_share(metric):
        return f"{100 * delta:+.1f} pp"
    if relative is not None:
        return f"{100 * relative:+.1f} %"
    return f"{delta:+g}"


def _signed(metric: str, delta: Any) -> str:
    if delta is None:
        return ""
    if is_share(metric):
        return f"{100 * delta:+.1f} pp"
    text = value_h(metric, abs(delta))
    return ("+" if delta >= 0 else "−") + text


def _tables(comparison: dict[str, Any], steps_limit: int) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison as (title, header, rows) tables of text, for Markdown and HTML alike."""
    checks = [
        [c["id"], c["base"] or "—", c["head"] or "—", "regression" if c["regression"] else ""]
        for c in comparison["changed_checks"]
    ]
    metrics = [
        [m["metric"], value_h(m["metric"], m["base"]), value_h(m["metric"], m["head"]), change_text(**_args(m))]
        for m in comparison["metrics"]
        if m["delta"] not in (0, 0.0)
    ]
    collectives = [
        [
            c["collective"],
            f"{c['count_base'] if c['count_base'] is not None else '—'} → "
            f"{c['count_head'] if c['count_head'] is not None else '—'}",
            f"{value_h('time_ns', c['time_ns_base'])} → {value_h('time_ns', c['time_ns_head'])}",
            _signed("time_ns", c["time_ns_delta"]),
            f"{value_h('exposed_ns', c['exposed_ns_base'])} → {value_h('exposed_ns', c['exposed_ns_head'])}",
            _signed("exposed_ns", c["exposed_ns_delta"]),
        ]
        for c in comparison["collectives"]
    ]
    steps = [
        [
            str(s["rank"]),
            str(s["index"]),
            s["name"],
            f"{value_h('gpu_span_ns', s['gpu_span_ns_base'])} → {value_h('gpu_span_ns', s['gpu_span_ns_head'])}",
            _signed("gpu_span_ns", s["gpu_span_ns_delta"]),
            f"{value_h('nccl_share', s['nccl_share_base'])} → {value_h('nccl_share', s['nccl_share_head'])}",
            _signed("nccl_share", s["nccl_share_delta"]),
        ]
        for s in comparison["steps"][:steps_limit]
    ]
    more = len(comparison["steps"]) - steps_limit
    return [
        ("Checks that changed", ["check", "base", "head", ""], checks),
        ("Run metrics that changed", ["metric", "base", "head", "change"], metrics),
        ("Collectives by type", ["collective", "kernels", "time", "Δ time", "exposed", "Δ exposed"], collectives),
        (
            "Steps" + (f" (first {steps_limit} of {len(comparison['steps'])}; JSON has all)" if more > 0 else ""),
            ["rank", "step", "name", "GPU span", "Δ span", "NCCL share", "Δ share"],
            steps,
        ),
    ]


def _args(m: dict[str, Any]) -> dict[str, Any]:
    return {"metric": m["metric"], "delta": m["delta"], "relative": m["relative"]}


def _headline(comparison: dict[str, Any]) -> str:
    base = comparison.get("base_label", "base")
    head = comparison.get("head_label", "head")
    verdicts = f"{comparison['base_verdict']} → {comparison['head_verdict']}"
    regressed = comparison["regressions"]
    gate = f"regressed: {', '.join(regressed)}" if regressed else "no check regressed"
    return f"{base} → {head}: verdict {verdicts}; {gate}"


def render_markdown(comparison: dict[str, Any], steps_limit: int = 50) -> str:
    lines = ["# traceguard compare", "", _headline(comparison), ""]
    for title, header, rows in _tables(comparison, steps_limit):
        lines += [f"## {title}", ""]
        if not rows:
            lines += ["(none)", ""]
            continue
        lines.append("| " + " | ".join(header) + " |")
        lines.append("|" + "---|" * len(header))
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
        lines.append("")
    return "\n".join(lines)


def render_html(comparison: dict[str, Any], steps_limit: int = 500) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>traceguard compare</title>",
        "<style>body{font-family:system-ui,sans-serif;margin:2rem}table{border-collapse:collapse;margin:.5rem 0 "
        "1.5rem}td,th{border:1px solid #d0d7de;padding:.3rem .6rem;text-align:left}th{background:#f6f8fa}"
        ".regression{color:#cf222e;font-weight:600}</style></head><body>",
        "<h1>traceguard compare</h1>",
        f"<p id='headline'>{html.escape(_headline(comparison))}</p>",
    ]
    for title, header, rows in _tables(comparison, steps_limit):
        anchor = title.split(" (")[0].lower().replace(" ", "-")
        parts.append(f"<h2>{html.escape(title)}</h2><table id='{anchor}'><tr>")
        parts += [f"<th>{html.escape(h)}</th>" for h in header]
        parts.append("</tr>")
        for row in rows:
            cells = "".join(
                f"<td class='regression'>{html.escape(c)}</td>" if c == "regression" else f"<td>{html.escape(c)}</td>"
                for c in row
            )
            parts.append(f"<tr>{cells}</tr>")
        if not rows:
            parts.append(f"<tr><td colspan='{len(header)}'>(none)</td></tr>")
        parts.append("</table>")
    parts.append("</body></html>")
    return "\n".join(parts)
