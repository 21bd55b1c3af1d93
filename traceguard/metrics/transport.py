"""Transport health from NCCL logs: who talks to whom over what, and what an engineer should fix.

Pure functions over a parsed :class:`~traceguard.ingest.nccl_log.NcclLog` (no I/O). The
findings are the ones engineers keep rediscovering by hand in NCCL_DEBUG=INFO output:

- ``shm_within_node`` / ``net_within_node`` (fail): two GPUs of one node talk through host
  memory or a NIC although P2P (NVLink/PCIe) was possible — typically ``NCCL_P2P_DISABLE=1``
  left in a job script, or a container without IPC/peer access. Same node means the same host
  name, or ``nNodes == 1`` in the communicator; "P2P possible" means the device pair is in
  ``nvlink_pairs`` when that is given (``nvidia-smi topo -m``), else it is assumed.
- ``p2p_disabled_by_env``: NCCL echoed ``NCCL_P2P_DISABLE`` / ``NCCL_P2P_LEVEL`` from the env.
- ``socket_with_ib`` (fail): NET/Socket connections while NCCL listed an InfiniBand/RoCE device.
- ``ib_without_gdrdma`` (warn): IB connections without GPUDirect RDMA (data bounces via host).
- ``shm_failure`` (fail): ``/dev/shm`` segment creation/attach failures (too small in containers).
- ``mixed_versions`` (fail): ranks running different NCCL versions.
- ``nccl_warn``: each distinct WARN / error line, quoted with the ranks that printed it.

Every finding quotes the exact log lines it rests on, so a report can show the evidence.
:func:`nccl_document` is the JSON contract (docs/nccl.schema.json): the parser's facts plus these
findings. A partial log (NCCL lines but no connection lines) is a valid document: transport
``unknown`` with the log's reason, and the findings its WARN/env/version lines still support.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from traceguard.ingest.nccl_log import CommInfo, Connection, NcclLog, NcclWarning

#: Evidence lines kept per finding: enough to act on, short enough to read.
MAX_EVIDENCE = 12

_SHM_FAILURE = re.compile(r"/dev/shm|shared memory|\bshm\b|shmutils|shm\.(?:cc|h)\b", re.IGNORECASE)
_P2P_ENV = ("NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL")


@dataclass
class Finding:
    """One thing to act on: ``severity`` is "fail", "warn" or "info"; ``evidence`` is raw log lines."""

    id: str
    severity: str
    message: str
    ranks: list[int] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "severity": self.severity,
            "message": self.message,
            "ranks": list(self.ranks),
            "evidence": list(self.evidence),
        }


def nccl_document(log: NcclLog, *, nvlink_pairs: set[frozenset[int]] | None = None) -> dict[str, Any]:
    """The JSON contract of a parsed log (docs/nccl.schema.json): its facts and the findings.

    ``nvlink_pairs`` (GPU index pairs joined by NVLink, from ``nvidia-smi topo -m``) narrows the
    within-node findings to pairs where P2P was really possible.
    """
    doc = log.facts()
    doc["findings"] = [f.to_dict() for f in findings(log, nvlink_pairs=nvlink_pairs)]
    return doc


def transport_matrix(log: NcclLog, *, comm: str | None = None) -> dict[str, Any]:
    """Rank × peer → transport classes and details (JSON-ready: keys are strings).

    ``comm`` restricts to one communicator; by default every connection counts (ranks of
    different communicators are then mixed, which is what a single-communicator DDP job has).
    """
    cells: dict[tuple[int, int], dict[str, set[Any]]] = defaultdict(
        lambda: {"transports": set(), "details": set(), "channels": set(), "directions": set()}
    )
    ranks: set[int] = set()
    for conn in log.connections:
        if conn.peer is None or (comm is not None and conn.comm != comm):
            continue
        cell = cells[(conn.rank, conn.peer)]
        cell["transports"].add(conn.transport)
        cell["details"].add(f"{conn.transport}/{conn.detail}" if conn.detail else conn.transport)
        cell["channels"].add(conn.channel)
        cell["directions"].add(conn.direction)
        ranks.update((conn.rank, conn.peer))
    matrix: dict[str, dict[str, dict[str, Any]]] = {}
    for (rank, peer), cell in sorted(cells.items()):
        matrix.setdefault(str(rank), {})[str(peer)] = {
            "transports": sorted(cell["transports"]),
            "details": sorted(cell["details"]),
            "channels": len(cell["channels"]),
            "directions": sorted(cell["directions"]),
        }
    return {"ranks": sorted(ranks), "transports": log.transports, "matrix": matrix}


def findings(log: NcclLog, *, nvlink_pairs: set[frozenset[int]] | None = None) -> list[Finding]:
    """Every transport finding of a log, most severe first (stable order within a severity)."""
    out: list[Finding] = []
    out.extend(_within_node(log, "SHM", nvlink_pairs))
    out.extend(_within_node(log, "NET", nvlink_pairs))
    out.extend(_p2p_disabled(log))
    out.extend(_socket_with_ib(log))
    out.extend(_ib_without_gdrdma(log))
    out.extend(_shm_failure(log))
    out.extend(_mixed_versions(log))
    out.extend(_nccl_warn(log))
    order = {"fail": 0, "warn": 1, "info": 2}
    return sorted(out, key=lambda f: order.get(f.severity, 3))


class _Topology:
    """Where each (communicator, rank) lives: host, device, and the communicator's node count."""

    def __init__(self, log: NcclLog) -> None:
        self.by_comm_rank: dict[tuple[str | None, int], CommInfo] = {}
        for info in log.comms:
            self.by_comm_rank.setdefault((info.comm, info.rank), info)
        self.single_node = {info.comm for info in log.comms if info.nnodes == 1}
        self.ambiguous_hosts = _ambiguous_hosts(log)
        #: Hosts that printed connection lines for a (communicator, rank): where the rank runs when
        #: the excerpt has no Init line for it.
        self.printed_from: dict[tuple[str | None, int], set[str]] = defaultdict(set)
        for conn in log.connections:
            if conn.host is not None:
                self.printed_from[(conn.comm, conn.rank)].add(conn.host)

    def host(self, comm: str | None, rank: int, printed_by: Connection | None = None) -> str | None:
        info = self.by_comm_rank.get((comm, rank))
        if info is not None and info.host is not None:
            return info.host
        if printed_by is not None and printed_by.rank == rank:
            return printed_by.host
        hosts = self.printed_from.get((comm, rank), set())
        return next(iter(hosts)) if len(hosts) == 1 else None

    def same_node(self, conn: Connection) -> bool | None:
        """True/False when the log tells, None when it cannot (excerpt without the peer's lines)."""
        if conn.peer is None:
            return False
        if conn.transport == "SHM":  # NCCL only connects SHM between ranks of one host
            return True
        if conn.comm is not None and conn.comm in self.single_node:
            return True
        mine, theirs = self.host(conn.comm, conn.rank, conn), self.host(conn.comm, conn.peer)
        if mine is None or theirs is None or mine in self.ambiguous_hosts:
            return None
        return mine == theirs

    def device(self, comm: str | None, rank: int, bracket: str | None) -> int | None:
        """The GPU index of a rank: from its Init line, else from the connection's bracket when that
        bracket is a device index (2.4 and 2.18.3+ print the device, 2.5 to 2.18.1 the busId)."""
        info = self.by_comm_rank.get((comm, rank))
        if info is not None and info.device is not None:
            return info.device
        if bracket is None or not bracket.isdigit() or len(bracket) > 3:
            return None
        return int(bracket)


def _ambiguous_hosts(log: NcclLog) -> set[str]:
    """Host names that stand for several machines: two ranks of one communicator printed from that
    name claim the same GPU (device index or busId), which no single machine can hold. Clusters with
    default host names ("ubuntu", "user") do this; such a name cannot tell whether ranks share a node."""
    claimed: dict[tuple[str, str | None, str], set[int]] = defaultdict(set)
    for conn in log.connections:
        if conn.host is not None and conn.rank_dev is not None:
            claimed[(conn.host, conn.comm, conn.rank_dev.lower())].add(conn.rank)
    for info in log.comms:
        device = info.bus_id if info.bus_id is not None else info.device
        if info.host is not None and device is not None:
            claimed[(info.host, info.comm, str(device).lower())].add(info.rank)
    return {host for (host, _, _), ranks in claimed.items() if len(ranks) > 1}


def _env_lines(log: NcclLog, names: Iterable[str]) -> list[str]:
    wanted = set(names)
    return _unique(e.line for e in log.env_lines if e.name in wanted)


def _unique(lines: Iterable[str], limit: int = MAX_EVIDENCE) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line not in out:
            out.append(line)
            if len(out) >= limit:
                break
    return out


def _within_node(log: NcclLog, transport: str, nvlink_pairs: set[frozenset[int]] | None) -> list[Finding]:
    topo = _Topology(log)
    pairs: dict[frozenset[int], list[Connection]] = defaultdict(list)
    for conn in log.connections:
        if conn.transport != transport or conn.peer is None or conn.peer == conn.rank:
            continue
        if not topo.same_node(conn):
            continue
        if nvlink_pairs is not None:
            mine = topo.device(conn.comm, conn.rank, conn.rank_dev)
            theirs = topo.device(conn.comm, conn.peer, conn.peer_dev)
            if mine is None or theirs is None or frozenset((mine, theirs)) not in nvlink_pairs:
                continue
        pairs[frozenset((conn.rank, conn.peer))].append(conn)
    if not pairs:
        return []
    env = log.env
    set_by_env = [f"{name}={env[name]}" for name in (*_P2P_ENV, "NCCL_SHM_DISABLE") if name in env]
    described = ", ".join(
        f"{min(p)}↔{max(p)}" + (f" ({conns[0].detail})" if conns[0].detail else "")
        for p, conns in sorted(pairs.items(), key=lambda kv: sorted(kv[0]))[:8]
    )
    why = "over NVLink" if nvlink_pairs is not None else "(P2P assumed possible: no topology given)"
    message = (
        f"{transport} transport between GPUs of the same node for {len(pairs)} rank pair(s): {described}; "
        f"P2P was possible {why}."
    )
    if set_by_env:
        message += f" Set by environment: {', '.join(set_by_env)} — unset to let NCCL use P2P."
    evidence = _unique([conns[0].line for _, conns in sorted(pairs.items(), key=lambda kv: sorted(kv[0]))])
    evidence = _unique([*_env_lines(log, (*_P2P_ENV, "NCCL_SHM_DISABLE"))[:3], *evidence])
    ranks = sorted({r for p in pairs for r in p})
    return [Finding(f"{transport.lower()}_within_node", "fail", message, ranks, evidence)]


def _p2p_disabled(log: NcclLog) -> list[Finding]:
    env_rows = [e for e in log.env_lines if e.name in _P2P_ENV]
    if not env_rows:
        return []
    env = log.env
    disabled = env.get("NCCL_P2P_DISABLE", "0") not in ("0", "")
    level = env.get("NCCL_P2P_LEVEL")
    severity = "warn" if disabled or (level or "").upper() in ("LOC", "0") else "info"
    settings = ", ".join(f"{name}={env[name]}" for name in _P2P_ENV if name in env)
    message = f"P2P restricted by environment ({settings}): GPUs of one node may fall back to SHM or NET."
    ranks = sorted({e.rank for e in env_rows if e.rank is not None})
    return [Finding("p2p_disabled_by_env", severity, message, ranks, _unique(e.line for e in env_rows))]


def _socket_with_ib(log: NcclLog) -> list[Finding]:
    ib_lines = [e for e in log.network_lines if e.name == "ib"]
    sockets = [c for c in log.connections if c.transport == "NET" and c.detail.lower().startswith("socket")]
    if not ib_lines or not sockets:
        return []
    devices = sorted({e.value for e in ib_lines})
    ranks = sorted({c.rank for c in sockets})
    message = (
        f"NET/Socket used on {len(ranks)} rank(s) although NCCL found InfiniBand/RoCE device(s) "
        f"{', '.join(devices[:6])}: check NCCL_IB_DISABLE, NCCL_NET, the IB plugin and NCCL_IB_HCA."
    )
    evidence = _unique([ib_lines[0].line, *(c.line for c in sockets)])
    return [Finding("socket_with_ib", "fail", message, ranks, evidence)]


def _ib_without_gdrdma(log: NcclLog) -> list[Finding]:
    plain = [
        c
        for c in log.connections
        if c.transport in ("NET", "COLLNET") and c.detail.upper().startswith("IB") and "GDRDMA" not in c.detail.upper()
    ]
    if not plain:
        return []
    ranks = sorted({c.rank for c in plain})
    env = log.env
    hint = "; ".join(
        f"{n}={env[n]}" for n in ("NCCL_NET_GDR_LEVEL", "NCCL_IB_GDR_LEVEL", "NCCL_NET_GDR_READ") if n in env
    )
    message = (
        f"InfiniBand without GPUDirect RDMA on {len(ranks)} rank(s) ({len(plain)} connection(s)): data is staged "
        "through host memory. Check nvidia-peermem / dmabuf support and the GPU–NIC distance (NCCL_NET_GDR_LEVEL)."
    )
    if hint:
        message += f" Set by environment: {hint}."
    return [Finding("ib_without_gdrdma", "warn", message, ranks, _unique(c.line for c in plain))]


def _is_shm_failure(w: NcclWarning) -> bool:
    return bool(_SHM_FAILURE.search(w.message) or (w.file and _SHM_FAILURE.search(w.file)))


def _shm_failure(log: NcclLog) -> list[Finding]:
    failures = [w for w in log.warnings if _is_shm_failure(w)]
    if not failures:
        return []
    ranks = sorted({w.rank for w in failures if w.rank is not None})
    message = (
        f"Shared-memory (/dev/shm) failures on {len(ranks) or 'unknown'} rank(s): NCCL could not create or attach "
        "its SHM segments. Enlarge /dev/shm (docker --shm-size / --ipc=host, a Kubernetes emptyDir with "
        "medium: Memory) or set NCCL_SHM_DISABLE=1 as a last resort."
    )
    return [Finding("shm_failure", "fail", message, ranks, _unique(w.line for w in failures))]


def _mixed_versions(log: NcclLog) -> list[Finding]:
    versions = log.versions
    if len(versions) < 2:
        return []
    by_version: dict[str, set[int]] = defaultdict(set)
    for e in log.version_lines:
        if e.rank is not None:
            by_version[e.value].add(e.rank)
    parts = [
        f"{v} on rank(s) {', '.join(map(str, sorted(by_version[v])))}" if by_version[v] else f"{v} (rank unknown)"
        for v in versions
    ]
    message = f"Ranks run different NCCL versions: {'; '.join(parts)}. Use one NCCL build on every node."
    ranks = sorted({r for rs in by_version.values() for r in rs})
    evidence: list[str] = []
    for v in versions:
        evidence.extend(_unique((e.line for e in log.version_lines if e.value == v), limit=2))
    return [Finding("mixed_versions", "fail", message, ranks, evidence[:MAX_EVIDENCE])]


def _nccl_warn(log: NcclLog) -> list[Finding]:
    """One finding per distinct WARN/error text, with every rank that printed it."""
    groups: dict[tuple[str, str | None, str], list[NcclWarning]] = defaultdict(list)
    for w in log.warnings:
        text = re.sub(r"0x[0-9a-fA-F]+|\d+", "N", w.message)  # same warning, other pointers/sizes
        groups[(w.level, w.file, text)].append(w)
    out: list[Finding] = []
    for (level, file, _), rows in groups.items():
        ranks = sorted({w.rank for w in rows if w.rank is not None})
        where = f" ({file}:{rows[0].file_line})" if file else ""
        who = f"rank(s) {', '.join(map(str, ranks))}" if ranks else "unknown rank"
        kind = "NCCL WARN" if level == "WARN" else "NCCL error"
        message = f"{kind} on {who}{where}: {rows[0].message}"
        severity = "warn" if level == "WARN" else "fail"
        out.append(Finding("nccl_warn", severity, message, ranks, _unique(w.line for w in rows)))
    return out
