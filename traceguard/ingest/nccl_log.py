"""NCCL_DEBUG=INFO logs of every NCCL generation (2.3 to 2.30) → :class:`NcclLog`.

NCCL's own log is the only place that says *how* two GPUs talk (P2P over NVLink/PCIe, SHM
through host memory, NET through a NIC), so a slow all-reduce is often explained here and
nowhere else. The formats are those of /work/shared/docs/NCCL_LOGS.md (read from NCCL's source,
tag by tag); logs arrive as one file per process (``NCCL_DEBUG_FILE=nccl.%h.%p``) or as one
console log with every rank interleaved, behind launcher prefixes (``[1,3]<stdout>:``,
``[rank3]:``), Python logging prefixes and timestamps, and are often excerpts. So the parser is
line-oriented and forgiving: it looks for NCCL's ``host:pid:tid [dev] NCCL INFO|WARN`` core
anywhere in a line, recognises the messages it knows, and skips everything else — never fatal.

Logs are small (thousands of lines), so a plain Python loop with a few regexes is enough.
"""

from __future__ import annotations

import gzip
import math
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

from traceguard.errors import InputError

#: Transport classes, as the JSON contract names them.
TRANSPORTS: tuple[str, ...] = ("P2P", "SHM", "NET", "COLLNET", "NVLS")

#: Lines longer than this are cut before parsing: NCCL never prints such lines, and the cap keeps
#: the regexes linear on hostile uploads.
_MAX_LINE = 4096
#: The part of a line before "NCCL INFO|WARN" that is searched for the host:pid:tid [dev] core.
_MAX_HEAD = 512

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
#: "NCCL INFO" / "NCCL WARN" (TRACE lines share INFO's prefix; ABORT never appears in logs).
_LEVEL = re.compile(r"NCCL (INFO|WARN|TRACE)\b ?")
#: What precedes the level: "host:pid:tid [dev] " (all optional but [dev] in practice), then
#: WARN's "file.cc:123 " and the 2.26+ master "(function) ". Anchored at the end of the head.
_HEAD = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+)\s+)?"
    r"(?:\[(?P<dev>-?\d+)\]\s*)?"
    r"(?:(?P<file>[\w./+-]+\.\w+):(?P<fline>\d+)\s*)?"
    r"(?:\((?P<func>[\w:~<>]*)\)\s*)?$"
)
#: Launcher tags that name a process: OpenMPI ``[1,3]<stdout>:``, torchrun ``[rank3]:`` and
#: ``[default3]:``; used only to tie prefix-less lines (old version banners) to a process.
_TAG = re.compile(r"\[(?:\d+,(?P<mpi>\d+)\]<std(?:out|err)>|rank(?P<rank>\d+)\]|default(?P<dflt>\d+)\]):")

#: Version banner: "NCCL version 2.28.9+cuda13.0" (bare <=2.21, prefixed >=2.22).
_VERSION = re.compile(r"NCCL version (?P<version>\d+\.\d+\.\d+[\w.-]*?)\+cuda(?P<cuda>\d+\.\d+)")
#: Connection lines of every generation (see the module docstring of the tests for examples):
#: "Ring 00 : 0[0] -> 1[1] via P2P/IPC", "Ring 00 : 0 -> 1 [send] via NET/IB/0",
#: "Channel 00/1 : 0[1e000] -> 1[23000] [receive] via NET/IB/0(1)/GDRDMA",
#: "CollNet 00/0 : 3 [send] via COLLNET/SHARP/0/GDRDMA", "Coll 00 : 0 [receive] via COLLNET/...".
_CONN = re.compile(
    r"(?P<kind>Ring|Channel|CollNet|Coll)\s+(?P<ch>\d+)(?:/(?P<ci>\d+))?\s*:\s*"
    r"(?P<a>\d+)(?:\[(?P<adev>[0-9a-fA-Fx]+)\])?"
    r"(?:\s*->\s*(?P<b>\d+)(?:\[(?P<bdev>[0-9a-fA-Fx]+)\])?)?"
    r"\s*(?:\[(?P<dir>send|receive)\]\s*)?"
    r"via\s+(?P<via>P2P/direct pointer\S*|direct shared memory|\S+)"
)
#: "comm 0x.. rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0" (2.20+).
_COMM_TOPO = re.compile(
    r"comm (?P<ptr>0x[0-9a-fA-F]+|\(nil\)) rank (?P<rank>\d+) nRanks (?P<n>\d+) nNodes (?P<nn>\d+) "
    r"localRanks (?P<lr>\d+) localRank (?P<l>\d+)(?: MNNVL (?P<mnnvl>\d+))?"
)
#: "[func ]comm 0x.. rank 1 nranks 2 cudaDev 1 [nvmlDev 1] [busId 70] [commId 0x..] - Init COMPLETE"
#: (2.4 to 2.30) and the 2.3 "rank 0 nranks 8".
_COMM_INIT = re.compile(
    r"^(?:\w+ )?(?:comm (?P<ptr>0x[0-9a-fA-F]+|\(nil\)) )?rank (?P<rank>\d+) nranks (?P<n>\d+)"
    r"(?: cudaDev (?P<cuda>\d+))?(?: nvmlDev (?P<nvml>\d+))?(?: busId (?P<bus>[0-9a-fA-F]+))?(?P<rest>.*)$"
)
_COMM_ID = re.compile(r"commId (0x[0-9a-fA-F]+)")
#: "nranks 8": the communicator size alone (2.3-2.4 ncclCommInitAll, one process driving every GPU).
_NRANKS_ONLY = re.compile(r"^nranks (?P<n>\d+)\s*$")
_SYSTEM = re.compile(r"=== System : maxBw (?P<max>\d+(?:\.\d+)?) totalBw (?P<total>\d+(?:\.\d+)?) ===")
#: "NCCL_P2P_DISABLE set by environment to 1" (no period, paths.cc) and "... to 1." (param.cc).
_ENV = re.compile(r"(?P<name>[A-Z][A-Z0-9_]*) set by environment to (?P<value>.*)$")
#: "NCCL_IB_HCA set to mlx5_2:1" (net_ib.cc and plugins echo some variables this way).
_ENV_SET = re.compile(r"^(?P<name>NCCL_[A-Z0-9_]+) set to (?P<value>.*)$")
#: "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_2:1/RoCE [RO]; OOB ib0:..." (plugins: NET/IBext_v8).
_NET_IB = re.compile(r"NET/(?P<net>IB\w*) ?: ?Using(?P<rest>.*)$")
_NET_IB_OLD = re.compile(r"NET/IB ?: \[\d+\] ?(?P<dev>\S+:\d+/\S+)")  # 2.3: "NET/IB: [0] mlx5_1:1/IB"
_IB_DEV = re.compile(r"\[\d+\]\s?(?P<dev>[\w.-]+:\d+/(?:IB|RoCE)\S*)")
#: "NET/Socket : Using [0]eth0:10.0.0.1<0>" (the interfaces); not 2.7's "Using 2 threads and 8 sockets per thread".
_NET_SOCKET = re.compile(r"NET/Socket ?: ?Using ?(?P<rest>\[.*)$")
#: "Using network IB" / "Using network IBext_v8" (and 2.3's "Using internal Network Socket"); not
#: 2.19+'s "NET/Plugin: Using internal network plugin." (whichever network the plugin then picks).
_USING_NET = re.compile(r"^Using (?:internal )?[Nn]etwork (?P<name>(?!plugin\b)\S+)\s*$")
#: NCCL reporting that NVLS was set up and connected (not merely available).
_NVLS_CONNECTED = re.compile(r"Connected NVLS|NVLS comm 0x[0-9a-fA-F]+ headRank|\b(?P<n>[1-9]\d*) nvls channels")
#: "2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer"
#: (<=2.16 without nvls, 2.17-2.19 without collnet; src/init.cc).
_CHANNEL_COUNTS = re.compile(r"(?P<n>\d+) (?P<kind>coll|collnet|nvls|p2p) channels(?P<per_peer> per peer)?")
#: Ring orders "Channel 00/02 :    0   1   2   3" (2.5+) and "Ring 00 :    0   1" (<=2.4, no "->").
_RING_ORDER = re.compile(r"^(?:Channel|Ring) (?P<ch>\d+)(?:/\d+)? :(?P<order>(?:\s+\d+)+)\s*$")
#: Per-rank ring neighbours "Ring 00 : 7 -> 0 -> 1" (2.7+, src/graph/connect.cc).
_RING_NEIGHBOURS = re.compile(r"^Ring (?P<ch>\d+) : -?\d+ -> \d+ -> -?\d+\s*$")
#: "Trees [0] 1/-1/-1->0->-1 [1] ..." (2.7+) and "Tree 0 : 1 -> 0 -> -1/-1/-1" (2.4-2.6).
_TREES = re.compile(r"^Trees?\b.*-?\d+(?:/-?\d+)*\s*->\s*-?\d+")
#: Topology and graph dump (src/graph/topo.cc, search.cc): "=== System : ...", "CPU/0 (1/1/1)",
#: "+ PCI[24.0] - GPU/1000 (0)", "Pattern 4, crossNic 0, nChannels 2, bw ...", " 0 : GPU/0 GPU/1",
#: 2.3-2.4's "CUDA Dev 0[0], IB NIC distance :  PHB", affinity and NVLS head lines.
_TOPOLOGY = re.compile(
    r"^\s*(?:=== System|(?:CPU|GPU|NIC|NET|PCI|NVS)/[0-9a-fA-F-]+\b|\+ \w+\[|Pattern \d+, crossNic|"
    r"\d+ : (?:GPU|NET|NVS)/|"
    r"CUDA Dev \d+\[\d+\], |Setting affinity for GPU|ncclTopoGetCpuAffinity|NVLS Head|"
    r"Tree \d+ : |Connected all (?:rings|trees)|(?:Ring|Tree) latencies|threadThresholds)"
)
#: The kind of a :data:`_TOPOLOGY` line by its start; anything else is the system dump.
_TOPOLOGY_KINDS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("Pattern", "Ring latencies", "Tree latencies", "threadThresholds"), "graph"),
    (("Setting affinity", "ncclTopoGetCpuAffinity"), "affinity"),
    (("NVLS Head",), "nvls_head"),
    (("Tree ",), "tree"),
    (("Connected all",), "connected"),
)
#: ncclGetErrorString texts (src/init.cc) and the ncclResult_t names PyTorch prints.
_ERRORS = re.compile(
    r"unhandled cuda error|unhandled system error|internal error - please report|"
    r"invalid usage \(run with|remote process exited or there was a network error|"
    r"\bnccl(?:SystemError|InternalError|UnhandledCudaError|RemoteError|InvalidUsage|InvalidArgument)\b"
)
_VIA_CLASS = re.compile(r"^(?P<cls>P2P|SHM|NET|COLLNET|CollNet|NVLS)(?:/(?P<detail>.*))?$")


@dataclass
class Connection:
    """One "via" line: ``rank`` sends to (or, ``direction == "recv"``, receives from) ``peer``."""

    rank: int
    peer: int | None
    channel: int
    conn_index: int | None
    direction: str  # "send" | "recv"
    transport: str  # P2P | SHM | NET | COLLNET | NVLS
    detail: str
    comm: str | None = None
    host: str | None = None
    pid: int | None = None
    #: The bracket after each rank: a device index (2.4, 2.18.3+) or a hex busId (2.5 to 2.18.1).
    rank_dev: str | None = None
    peer_dev: str | None = None
    line: str = ""
    source: str = ""
    lineno: int = 0

    def key(self) -> tuple[Any, ...]:
        return (
            self.comm,
            self.rank,
            self.peer,
            self.channel,
            self.conn_index,
            self.direction,
            self.transport,
            self.detail,
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm": self.comm,
            "rank": self.rank,
            "peer": self.peer,
            "channel": self.channel,
            "conn_index": self.conn_index,
            "direction": self.direction,
            "transport": self.transport,
            "detail": self.detail,
        }


@dataclass
class CommInfo:
    """What one process said about one communicator (merged over its Init/topology lines)."""

    host: str | None
    pid: int | None
    rank: int
    comm_ptr: str | None = None
    comm_id: str | None = None
    nranks: int | None = None
    nnodes: int | None = None
    local_ranks: int | None = None
    local_rank: int | None = None
    cuda_dev: int | None = None
    nvml_dev: int | None = None
    bus_id: str | None = None
    mnnvl: int | None = None
    lines: list[str] = field(default_factory=list)
    #: Position of its first line, to tie later connection lines to the newest communicator.
    first_seen: int = 0

    @property
    def comm(self) -> str | None:
        """The communicator's name in reports: commId (shared by all ranks) or the pointer."""
        return self.comm_id or self.comm_ptr

    @property
    def device(self) -> int | None:
        """The GPU index ``nvidia-smi topo -m`` uses (NVML), else the CUDA index."""
        return self.nvml_dev if self.nvml_dev is not None else self.cuda_dev

    def to_dict(self) -> dict[str, Any]:
        return {
            "comm": self.comm,
            "comm_ptr": self.comm_ptr,
            "comm_id": self.comm_id,
            "host": self.host,
            "pid": self.pid,
            "rank": self.rank,
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "local_ranks": self.local_ranks,
            "local_rank": self.local_rank,
            "cuda_dev": self.cuda_dev,
            "nvml_dev": self.nvml_dev,
            "bus_id": self.bus_id,
            "mnnvl": self.mnnvl,
        }


@dataclass
class NcclWarning:
    """A ``NCCL WARN`` line (level "WARN") or a line carrying an NCCL error string ("ERROR")."""

    level: str
    message: str
    line: str
    rank: int | None = None
    host: str | None = None
    pid: int | None = None
    file: str | None = None
    file_line: int | None = None
    function: str | None = None
    source: str = ""
    lineno: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "host": self.host,
            "level": self.level,
            "location": f"{self.file}:{self.file_line}" if self.file else None,
            "function": self.function,
            "message": self.message,
            "line": self.line,
        }


@dataclass
class Evidence:
    """A fact NCCL echoed (env override, network, version, NVLS), with the line that says it."""

    rank: int | None
    host: str | None
    line: str
    value: str = ""
    name: str = ""


@dataclass
class NcclLog:
    """Everything the parser understood, each fact with the raw line that carries it."""

    sources: list[str] = field(default_factory=list)
    comms: list[CommInfo] = field(default_factory=list)
    connections: list[Connection] = field(default_factory=list)
    warnings: list[NcclWarning] = field(default_factory=list)
    #: (rank, version, line) per version banner; ``value`` = "2.28.9", ``name`` = CUDA "13.0".
    version_lines: list[Evidence] = field(default_factory=list)
    env_lines: list[Evidence] = field(default_factory=list)
    #: NET/IB device lists, NET/Socket interfaces, "Using network X": ``name`` is "ib", "socket"
    #: or "using", ``value`` the device/interface/network.
    network_lines: list[Evidence] = field(default_factory=list)
    nvls_lines: list[Evidence] = field(default_factory=list)
    max_bw_by_rank: dict[int, float] = field(default_factory=dict)
    total_bw_by_rank: dict[int, float] = field(default_factory=dict)
    hosts: list[str] = field(default_factory=list)
    #: Topology, graph, ring and tree lines (``name``: "system", "graph", "ring", "tree", "affinity",
    #: "connected", "nvls_head", "topology"), in input order.
    topology_lines: list[Evidence] = field(default_factory=list)
    #: Channel counts NCCL printed ("coll", "collnet", "nvls", "p2p", "p2p_per_peer"): the largest per kind.
    channel_counts: dict[str, int] = field(default_factory=dict)
    #: Ring channels whose rank order NCCL printed ("Channel 00/02 : 0 1 2 3").
    ring_channels: set[int] = field(default_factory=set)
    #: Communicator sizes stated without a rank ("nranks 8", 2.3-2.4).
    stated_sizes: list[int] = field(default_factory=list)
    #: Lines that carried an NCCL core or a known message (to tell an NCCL log from other text).
    nccl_lines: int = 0

    @property
    def versions(self) -> list[str]:
        return sorted({e.value for e in self.version_lines}, key=_version_key)

    @property
    def version(self) -> str | None:
        """The one NCCL version of the run; None when ranks differ or none was printed."""
        versions = self.versions
        return versions[0] if len(versions) == 1 else None

    @property
    def env(self) -> dict[str, str]:
        """Environment overrides NCCL echoed (first value per name; :attr:`env_lines` has all)."""
        out: dict[str, str] = {}
        for e in self.env_lines:
            out.setdefault(e.name, e.value)
        return out

    @property
    def ib_devices(self) -> list[str]:
        return sorted({e.value for e in self.network_lines if e.name == "ib"})

    @property
    def transports(self) -> list[str]:
        """Transport classes seen; NVLS only when NCCL reports connecting it."""
        seen = {c.transport for c in self.connections}
        if self.nvls_lines:
            seen.add("NVLS")
        return sorted(seen)

    @property
    def ranks(self) -> int | None:
        """Communicator size when stated, else the number of distinct ranks seen."""
        stated = [c.nranks for c in self.comms if c.nranks is not None] + self.stated_sizes
        if stated:
            return max(stated)
        seen = {c.rank for c in self.comms}
        for conn in self.connections:
            seen.add(conn.rank)
            if conn.peer is not None:
                seen.add(conn.peer)
        return len(seen) or None

    @property
    def nodes(self) -> int | None:
        """nNodes when NCCL stated it, else the number of distinct hosts, else None."""
        stated = [c.nnodes for c in self.comms if c.nnodes is not None]
        if stated:
            return max(stated)
        return len(self.hosts) or None

    @property
    def transport_known(self) -> bool:
        """Whether the log says how ranks are connected: it has at least one connection ("via") line."""
        return bool(self.connections)

    @property
    def transport_unknown_reason(self) -> str | None:
        """Why the log cannot tell the transport (None when it can): which lines are missing, why
        NCCL may not have printed them, and what to rerun with."""
        if self.connections:
            return None
        if self.nccl_lines == 0:
            return "the input has no NCCL log lines: run the job with NCCL_DEBUG=INFO"
        stated = [c.nranks for c in self.comms if c.nranks is not None] + self.stated_sizes
        if stated and max(stated) == 1:
            return (
                "every communicator in the log has one rank: NCCL connects no peer, so there is no transport "
                "to report (run with two or more ranks to see one)."
            )
        reason = (
            "the log has no connection lines (`Channel xx : a[b] -> c[d] via ...`): NCCL prints them at INFO "
            "level (subsystems INIT with P2P/SHM/NET) when a communicator connects its channels — during "
            "communicator init, or at the first collective with lazy connection (NCCL_RUNTIME_CONNECT, 2.22+) — "
            "so this log was cut before them (an excerpt, or one rank's start only), filtered by "
            "NCCL_DEBUG_SUBSYS (e.g. ENV or GRAPH alone), or the job stopped before connecting"
        )
        if self.warnings:
            reason += "; it holds WARN/error lines, so init may have failed before the connections were made"
        if self.nvls_lines:
            reason += "; NVLS was set up, but NVLS alone does not say how each pair of ranks talks"
        return (
            reason + ". Run with NCCL_DEBUG=INFO and NCCL_DEBUG_SUBSYS unset (or including INIT), and give "
            "every rank's whole log (NCCL_DEBUG_FILE=nccl.%h.%p.log) through its first collective."
        )

    @property
    def networks(self) -> dict[str, list[str]]:
        """What NCCL said about the network: "using" (the network chosen), "ib" (IB/RoCE devices),
        "socket" (socket interfaces), each distinct value once, in input order."""
        out: dict[str, list[str]] = {"using": [], "ib": [], "socket": []}
        for e in self.network_lines:
            values = out.setdefault(e.name, [])
            if e.value not in values:
                values.append(e.value)
        return out

    def facts(self, *, max_topology_lines: int = 400) -> dict[str, Any]:
        """What the log holds, JSON-ready: every key of docs/nccl.schema.json but ``findings``
        (:func:`traceguard.metrics.transport.nccl_document` adds those: ingest does not judge)."""
        return {
            "version": self.version,
            "versions": self.versions,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "nccl_lines": self.nccl_lines,
            "transport_status": "known" if self.transport_known else "unknown",
            "transport_reason": self.transport_unknown_reason,
            "connections": [c.to_dict() for c in self.connections],
            "transports": self.transports,
            "env": self.env,
            "warnings": [w.to_dict() for w in self.warnings],
            "comms": [c.to_dict() for c in self.comms],
            "hosts": list(self.hosts),
            "networks": self.networks,
            "channels": {
                **{kind: self.channel_counts.get(kind) for kind in ("coll", "collnet", "nvls", "p2p", "p2p_per_peer")},
                "rings": len(self.ring_channels) or None,
            },
            "topology": [
                {"rank": e.rank, "kind": e.name, "line": e.line} for e in self.topology_lines[:max_topology_lines]
            ],
            "max_bw": {str(rank): bw for rank, bw in sorted(self.max_bw_by_rank.items())},
        }


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", version)[:3])


@dataclass
class _Line:
    """One input line after prefix stripping: NCCL's core fields (when present) and the message."""

    source: str
    lineno: int
    pos: int  # global position over all sources
    raw: str
    msg: str
    level: str | None = None
    host: str | None = None
    pid: int | None = None
    tid: int | None = None
    dev: int | None = None
    file: str | None = None
    file_line: int | None = None
    func: str | None = None
    tag: str | None = None

    @property
    def proc(self) -> tuple[Any, ...]:
        """The process that printed the line: (host, pid), or the source and launcher tag."""
        if self.host is not None and self.pid is not None:
            return (self.host, self.pid)
        return ("@" + self.source, self.tag)


def _split(source: str, lineno: int, pos: int, raw: str) -> _Line:
    """Find NCCL's core in a line, whatever launcher/logging/timestamp prefix precedes it."""
    text = _ANSI.sub("", raw[:_MAX_LINE]).rstrip()
    level_match = _LEVEL.search(text)
    head = text[: level_match.start()] if level_match else text
    tag_match = _TAG.search(head[-_MAX_HEAD:])
    tag = None
    if tag_match:
        tag = tag_match.group("mpi") or tag_match.group("rank") or tag_match.group("dflt")
    line = _Line(source, lineno, pos, raw.rstrip("\r\n"), text, tag=tag)
    if not level_match:
        return line
    line.level = level_match.group(1)
    line.msg = text[level_match.end() :]
    core = _HEAD.search(head[-_MAX_HEAD:].rstrip() + " ") if head.strip() else None
    if core:
        line.host = core.group("host")
        line.pid = int(core.group("pid")) if core.group("pid") else None
        line.tid = int(core.group("tid")) if core.group("tid") else None
        line.dev = int(core.group("dev")) if core.group("dev") else None
        line.file = core.group("file")
        line.file_line = int(core.group("fline")) if core.group("fline") else None
        line.func = core.group("func") or None
    return line


def _classify(via: str) -> tuple[str, str] | None:
    """Transport class and detail of a "via" text: "P2P/CUMEM/read" → ("P2P", "CUMEM/read")."""
    if via == "direct shared memory":
        return "SHM", via
    match = _VIA_CLASS.match(via)
    if not match:
        return None
    cls = match.group("cls").upper()
    return cls, match.group("detail") or ""


#: Where an NCCL record starts inside a line: "host:pid:tid [dev] [file:line ]NCCL INFO|WARN".
_RECORD_START = re.compile(
    r"[^\s:\[\]]*:\d+:\d+\s+\[-?\d+\]\s+(?:[\w./+-]+:\d+\s+(?:\([^)]*\)\s+)?)?NCCL (?:INFO|WARN)\b"
)
#: Longest line searched for several records (pastes that lost their newlines run to a few KiB).
_MAX_GLUED = 65536


def _records(raw: str) -> list[str]:
    """One physical line as NCCL records. Pastes that lost their newlines, and processes that wrote
    at the same time, put several ``host:pid:tid [dev] NCCL INFO`` records on one line; each is cut
    out at its own core, so it keeps its own process and device. A line holds one record otherwise."""
    if raw.count("NCCL ") < 2:
        return [raw]
    starts = [m.start() for m in _RECORD_START.finditer(raw, 0, _MAX_GLUED)]
    if len(starts) < 2:
        return [raw]
    cuts = [0, *starts[1:], len(raw)]
    return [raw[a:b] for a, b in pairwise(cuts) if raw[a:b].strip()]


class _Parser:
    """Two passes: collect every record, then resolve ranks and communicators across sources."""

    def __init__(self) -> None:
        self.log = NcclLog()
        self.pos = 0
        #: (kind, _Line, payload) in input order; resolved once every comm line has been seen.
        self.records: list[tuple[str, _Line, Any]] = []
        self.comms: dict[tuple[Any, ...], CommInfo] = {}
        self.tag_proc: dict[tuple[str, str], tuple[Any, ...]] = {}
        self.source_procs: dict[str, set[tuple[Any, ...]]] = defaultdict(set)
        self.hosts: set[str] = set()
        self.by_proc: dict[tuple[Any, ...], list[CommInfo]] = defaultdict(list)
        #: Ranks each process, and each of its threads, printed connection lines for.
        self.conn_ranks: dict[tuple[Any, ...], set[int]] = defaultdict(set)

    def feed(self, name: str, text: str) -> None:
        self.log.sources.append(name)
        for lineno, raw in enumerate(text.splitlines(), start=1):
            self.pos += 1
            if len(raw) < 8:
                continue
            for piece in _records(raw):
                try:
                    self._line(_split(name, lineno, self.pos, piece))
                except (ValueError, IndexError, OverflowError):  # a mangled line is skipped, never fatal
                    continue

    def _line(self, line: _Line) -> None:
        msg = line.msg
        if line.host is not None and line.pid is not None:
            self.hosts.add(line.host)
            self.source_procs[line.source].add(line.proc)
            if line.tag is not None:
                self.tag_proc.setdefault((line.source, line.tag), line.proc)
        known = line.level is not None
        if line.level == "WARN":
            self.records.append(("warn", line, msg.strip()))
        elif _ERRORS.search(msg):
            self.records.append(("error", line, msg.strip()))
            known = True
        if (m := _CONN.search(msg)) is not None:
            self._connection(line, m)
            known = True
        elif (m := _VERSION.search(msg)) is not None:
            self.records.append(("version", line, (m.group("version"), m.group("cuda"))))
            known = True
        elif line.level is not None:
            self._info(line, msg)
        if known:
            self.log.nccl_lines += 1

    def _info(self, line: _Line, msg: str) -> None:
        if (m := _COMM_TOPO.search(msg)) is not None:
            info = self._comm(line, m.group("ptr"), int(m.group("rank")))
            info.nranks = int(m.group("n"))
            info.nnodes = int(m.group("nn"))
            info.local_ranks = int(m.group("lr"))
            info.local_rank = int(m.group("l"))
            if m.group("mnnvl") is not None:
                info.mnnvl = int(m.group("mnnvl"))
        elif (m := _COMM_INIT.match(msg)) is not None:
            info = self._comm(line, m.group("ptr"), int(m.group("rank")))
            info.nranks = int(m.group("n"))
            if m.group("cuda") is not None:
                info.cuda_dev = int(m.group("cuda"))
            if m.group("nvml") is not None:
                info.nvml_dev = int(m.group("nvml"))
            if m.group("bus") is not None:
                info.bus_id = m.group("bus").lower()
            if (cid := _COMM_ID.search(m.group("rest"))) is not None:
                info.comm_id = cid.group(1).lower()
        elif (m := _NRANKS_ONLY.match(msg.strip())) is not None:
            self.log.stated_sizes.append(int(m.group("n")))
        elif (m := _SYSTEM.search(msg)) is not None:
            bw = (float(m.group("max")), float(m.group("total")))
            if all(math.isfinite(x) for x in bw):
                self.records.append(("bw", line, bw))
            self.records.append(("topology", line, ("system", None)))
        elif (" set by environment to " in msg and (m := _ENV.search(msg)) is not None) or (
            (m := _ENV_SET.match(msg.strip())) is not None
        ):
            value = m.group("value").strip()
            if value.endswith(".") and not value.endswith(".."):
                value = value[:-1]
            self.records.append(("env", line, (m.group("name"), value)))
        elif (m := _NET_IB.search(msg)) is not None:
            for dev in _IB_DEV.finditer(m.group("rest")):
                self.records.append(("net", line, ("ib", dev.group("dev"))))
        elif (m := _NET_IB_OLD.search(msg)) is not None:
            self.records.append(("net", line, ("ib", m.group("dev"))))
        elif (m := _NET_SOCKET.search(msg)) is not None:
            self.records.append(("net", line, ("socket", m.group("rest").strip())))
        elif (m := _USING_NET.search(msg.strip())) is not None:
            self.records.append(("net", line, ("using", m.group("name"))))
        elif (counts := _CHANNEL_COUNTS.findall(msg)) and " channels" in msg:
            for n, kind, per_peer in counts:
                self.records.append(("channels", line, ("p2p_per_peer" if per_peer else kind, int(n))))
            if _NVLS_CONNECTED.search(msg) is not None:
                self.records.append(("nvls", line, None))
        elif _NVLS_CONNECTED.search(msg) is not None:
            self.records.append(("nvls", line, None))
        else:
            self._topology(line, msg.strip())

    def _topology(self, line: _Line, msg: str) -> None:
        """Ring orders, trees, and the topology/graph dump: kept as evidence lines."""
        if (m := _RING_ORDER.match(msg)) is not None:
            self.records.append(("topology", line, ("ring", int(m.group("ch")))))
        elif _RING_NEIGHBOURS.match(msg) is not None:
            self.records.append(("topology", line, ("ring", None)))
        elif _TREES.match(msg) is not None:
            self.records.append(("topology", line, ("tree", None)))
        elif _TOPOLOGY.match(msg) is not None:
            if msg[:1].isdigit():  # " 0 : GPU/0 GPU/1 ..." one channel of a graph
                kind = "graph"
            else:
                kind = next((k for prefixes, k in _TOPOLOGY_KINDS if msg.startswith(prefixes)), "system")
            self.records.append(("topology", line, (kind, None)))

    def _comm(self, line: _Line, ptr: str | None, rank: int) -> CommInfo:
        ptr = None if ptr in (None, "(nil)") else ptr.lower()
        key = (*line.proc, ptr if ptr is not None else f"rank{rank}")
        info = self.comms.get(key)
        if info is None or info.rank != rank:
            info = CommInfo(host=line.host, pid=line.pid, rank=rank, comm_ptr=ptr, first_seen=line.pos)
            self.comms[key] = info
            self.by_proc[line.proc].append(info)
        if len(info.lines) < 8:
            info.lines.append(line.raw)
        return info

    def _connection(self, line: _Line, m: re.Match[str]) -> None:
        classified = _classify(m.group("via"))
        if classified is None:
            return
        transport, detail = classified
        if m.group("kind") in ("CollNet", "Coll"):
            transport = "COLLNET"
        a, b = int(m.group("a")), m.group("b")
        peer = int(b) if b is not None else None
        if m.group("dir") == "receive" and peer is not None:
            rank, peer, rank_dev, peer_dev = peer, a, m.group("bdev"), m.group("adev")
        else:
            rank, rank_dev, peer_dev = a, m.group("adev"), m.group("bdev")
        conn = Connection(
            rank=rank,
            peer=peer,
            channel=int(m.group("ch")),
            conn_index=int(m.group("ci")) if m.group("ci") is not None else None,
            direction="recv" if m.group("dir") == "receive" else "send",
            transport=transport,
            detail=detail,
            host=line.host,
            pid=line.pid,
            rank_dev=rank_dev,
            peer_dev=peer_dev,
            line=line.raw,
            source=line.source,
            lineno=line.lineno,
        )
        self.records.append(("conn", line, conn))
        if line.host is not None and line.pid is not None:
            self.conn_ranks[line.proc].add(rank)
            self.conn_ranks[(*line.proc, line.tid)].add(rank)

    # -- second pass ---------------------------------------------------------------------------

    def _proc_of(self, line: _Line) -> tuple[Any, ...]:
        """The (host, pid) of a prefix-less line, via its launcher tag or its single-process file."""
        if line.host is not None and line.pid is not None:
            return line.proc
        if line.tag is not None and (line.source, line.tag) in self.tag_proc:
            return self.tag_proc[(line.source, line.tag)]
        procs = self.source_procs.get(line.source, set())
        if len(procs) == 1:
            return next(iter(procs))
        return line.proc

    def _rank_of(self, line: _Line, by_proc: dict[tuple[Any, ...], list[CommInfo]]) -> int | None:
        """The rank of the process that printed a line (largest communicator wins); for excerpts
        without Init lines, the one rank the same thread (or process) printed connections for."""
        proc = self._proc_of(line)
        comms = by_proc.get(proc, [])
        if line.dev is not None:
            same_dev = [c for c in comms if c.cuda_dev == line.dev]
            comms = same_dev or comms
        if comms:
            return max(comms, key=lambda c: (c.nranks or 0, -c.first_seen)).rank
        for seen in (self.conn_ranks.get((*proc, line.tid)), self.conn_ranks.get(proc)):
            if seen is not None and len(seen) == 1:
                return next(iter(seen))
        return None

    def finish(self) -> NcclLog:
        log = self.log
        log.comms = sorted(self.comms.values(), key=lambda c: c.first_seen)
        log.hosts = sorted(self.hosts)
        by_proc = self.by_proc
        seen_conn: set[tuple[Any, ...]] = set()
        seen_warn: set[tuple[Any, ...]] = set()
        for kind, line, payload in self.records:
            if kind == "conn":
                conn: Connection = payload
                conn.comm = self._comm_of(conn, line, by_proc)
                if conn.key() not in seen_conn:
                    seen_conn.add(conn.key())
                    log.connections.append(conn)
                continue
            rank = self._rank_of(line, by_proc)
            if kind == "error" and line.tag is not None and rank is None:
                rank = int(line.tag)
            if kind in ("warn", "error"):
                key = (rank, line.host, line.pid, payload)
                if key in seen_warn:
                    continue
                seen_warn.add(key)
                log.warnings.append(
                    NcclWarning(
                        level="WARN" if kind == "warn" else "ERROR",
                        message=payload,
                        line=line.raw,
                        rank=rank,
                        host=line.host,
                        pid=line.pid,
                        file=line.file,
                        file_line=line.file_line,
                        function=line.func,
                        source=line.source,
                        lineno=line.lineno,
                    )
                )
            elif kind == "version":
                log.version_lines.append(Evidence(rank, line.host, line.raw, value=payload[0], name=payload[1]))
            elif kind == "env":
                log.env_lines.append(Evidence(rank, line.host, line.raw, value=payload[1], name=payload[0]))
            elif kind == "net":
                log.network_lines.append(Evidence(rank, line.host, line.raw, value=payload[1], name=payload[0]))
            elif kind == "nvls":
                log.nvls_lines.append(Evidence(rank, line.host, line.raw))
            elif kind == "channels":
                name, count = payload
                log.channel_counts[name] = max(count, log.channel_counts.get(name, 0))
            elif kind == "topology":
                topo_kind, channel = payload
                log.topology_lines.append(Evidence(rank, line.host, line.raw, name=topo_kind))
                if channel is not None:
                    log.ring_channels.add(channel)
            elif kind == "bw" and rank is not None:
                max_bw, total_bw = payload
                log.max_bw_by_rank[rank] = max(max_bw, log.max_bw_by_rank.get(rank, 0.0))
                log.total_bw_by_rank[rank] = max(total_bw, log.total_bw_by_rank.get(rank, 0.0))
        return log

    @staticmethod
    def _comm_of(conn: Connection, line: _Line, by_proc: dict[tuple[Any, ...], list[CommInfo]]) -> str | None:
        """The communicator a connection belongs to: the newest one of its process with its rank."""
        candidates = [
            c
            for c in by_proc.get(line.proc, [])
            if c.rank == conn.rank and (c.nranks is None or conn.peer is None or conn.peer < c.nranks)
        ]
        if not candidates:
            return None
        before = [c for c in candidates if c.first_seen <= line.pos]
        chosen = max(before, key=lambda c: c.first_seen) if before else min(candidates, key=lambda c: c.first_seen)
        return chosen.comm


def parse_nccl_logs(sources: Iterable[tuple[str, str]]) -> NcclLog:
    """Parse NCCL logs given as (name, text): one file per process, or one interleaved console log.

    Unknown lines are skipped; nothing in the text can make this raise.
    """
    parser = _Parser()
    for name, text in sources:
        parser.feed(name, text)
    return parser.finish()


def read_nccl_logs(paths: Iterable[Path]) -> NcclLog:
    """Read NCCL log files (plain or gzip; undecodable bytes replaced) and parse them together."""
    sources: list[tuple[str, str]] = []
    for path in paths:
        path = Path(path)
        try:
            data = path.read_bytes()
            if data[:2] == b"\x1f\x8b":
                data = gzip.decompress(data)
        except (OSError, EOFError, gzip.BadGzipFile) as exc:
            raise InputError(f"cannot read NCCL log {path}: {exc}", hint="pass the NCCL_DEBUG_FILE output") from exc
        sources.append((str(path), data.decode("utf-8", errors="replace")))
    return parse_nccl_logs(sources)


_SNIFF_CORE = re.compile(
    r"(?:[^\s:\[\]]*:\d+:\d+\s+)?\[-?\d+\]\s+(?:[\w./+-]+:\d+\s+(?:\([^)]*\)\s+)?)?NCCL (?:INFO|WARN)\b"
)


def looks_like_nccl_log(head: str) -> bool:
    """Whether the start of an upload is NCCL_DEBUG output (content sniffing, never file names)."""
    for raw in head[:65536].splitlines():
        line = raw[:_MAX_LINE]
        at = line.find("NCCL ")
        if at < 0:
            continue
        if _VERSION.search(line) or _SNIFF_CORE.search(line[max(0, at - _MAX_HEAD) : at + 10]):
            return True
    return False
