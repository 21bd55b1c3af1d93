"""Markdown rendering of the NCCL transport report (``traceguard nccl``, and report sections)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from traceguard.report.tables import table as md_table

TRANSPORT_ORDER = ("P2P", "NVLS", "COLLNET", "NET", "SHM")


def transport_order(kind: str) -> int:
    """Best first: P2P, NVLS, COLLNET, NET, SHM (the fallback), then anything else."""
    return TRANSPORT_ORDER.index(kind) if kind in TRANSPORT_ORDER else len(TRANSPORT_ORDER)


def pair_transports(connections: Iterable[tuple[int | None, int | None, str]]) -> dict[tuple[int, int], str]:
    """(rank, peer) → the transport classes NCCL logged for that pair, best first, joined by "+"
    (``"P2P"``, ``"SHM"``, ``"P2P+NET"`` when channels differ); from (rank, peer, transport) rows."""
    seen: dict[tuple[int, int], set[str]] = {}
    for rank, peer, transport in connections:
        if rank is not None and peer is not None:
            seen.setdefault((rank, peer), set()).add(str(transport).upper())
    return {pair: "+".join(sorted(kinds, key=transport_order)) for pair, kinds in sorted(seen.items())}


def matrix(doc: dict[str, Any]) -> tuple[list[int], dict[tuple[int, int], set[str]]]:
    cells: dict[tuple[int, int], set[str]] = {}
    for c in doc["connections"]:
        if c["rank"] is None or c["peer"] is None:
            continue
        cells.setdefault((c["rank"], c["peer"]), set()).add(c["transport"] + (f"/{c['detail']}" if c["detail"] else ""))
    ranks = sorted({r for pair in cells for r in pair})
    return ranks, cells


def _or_unknown(value: object) -> str:
    return "unknown" if value is None else str(value)


def render_markdown(doc: dict[str, Any]) -> str:
    """The ``traceguard nccl`` report of a :func:`~traceguard.metrics.transport.nccl_document`."""
    lines = ["# NCCL transports", ""]
    known = doc.get("transport_status", "known") == "known"
    transports = ", ".join(doc["transports"]) if known and doc["transports"] else "unknown"
    lines.append(
        f"NCCL {doc['version'] or ', '.join(doc['versions']) or 'version not in the log'} · "
        f"ranks {_or_unknown(doc['ranks'])} · nodes {_or_unknown(doc['nodes'])} · transports {transports}"
    )
    if not known:
        lines += ["", f"**Partial log — transport unknown**: {doc['transport_reason']}"]
    networks = doc.get("networks") or {}
    if any(networks.values()):
        lines += ["", "## Network", ""]
        labels = {"using": "Using network", "ib": "IB/RoCE devices", "socket": "Socket interfaces"}
        lines += [f"- {labels.get(k, k)}: {', '.join(f'`{v}`' for v in vs)}" for k, vs in networks.items() if vs]
    channels = {k: v for k, v in (doc.get("channels") or {}).items() if v is not None}
    if channels:
        lines += ["", "Channels: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in channels.items())]
    ranks, cells = matrix(doc)
    if ranks:
        lines += ["", "## Matrix (rank → peer)", ""]
        rows = [[str(r)] + [", ".join(sorted(cells.get((r, p), set()))) or "·" for p in ranks] for r in ranks]
        lines += md_table(["rank \\ peer", *map(str, ranks)], rows)
    if doc["env"]:
        lines += ["", "## Set by environment", ""] + [f"- `{k}={v}`" for k, v in doc["env"].items()]
    if doc.get("topology"):
        kinds: dict[str, int] = {}
        for row in doc["topology"]:
            kinds[row["kind"]] = kinds.get(row["kind"], 0) + 1
        lines += ["", "Topology and graph lines: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items()))]
    if doc["warnings"]:
        lines += ["", "## WARN and error lines", ""]
        lines += [f"- `{w['line'].strip()}`" for w in doc["warnings"][:8]]
        if len(doc["warnings"]) > 8:
            lines.append(f"- … {len(doc['warnings']) - 8} more in the JSON output")
    lines += ["", "## Findings", ""]
    if not doc["findings"]:
        lines.append("None.")
    for f in doc["findings"]:
        lines.append(f"- **{f['severity']}** `{f['id']}` (ranks {', '.join(map(str, f['ranks']))}): {f['message']}")
        lines += [f"  - `{line}`" for line in f["evidence"][:4]]
    return "\n".join(lines) + "\n"
