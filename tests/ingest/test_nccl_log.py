"""NCCL_DEBUG=INFO parser: our own 2×H200 logs, every line format of NCCL_LOGS.md, public issue
excerpts (tests/fixtures/nccl_logs, each file names its source URL), console forms, and fuzzing.

Expected values are written down from reading the logs, never computed by the parser.
"""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

from traceguard.errors import InputError
from traceguard.ingest.nccl_log import looks_like_nccl_log, parse_nccl_logs, read_nccl_logs
from traceguard.metrics.transport import nccl_document

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "h200"
PUBLIC = REPO / "tests" / "fixtures" / "nccl_logs"
SCHEMA = json.loads((REPO / "docs" / "nccl.schema.json").read_text())
VALIDATOR = Draft202012Validator(SCHEMA)


def run_files(run: str) -> list[Path]:
    return sorted((H200 / run).glob("nccl.*.log"))


def conn_rows(log) -> set[tuple]:
    return {(c.rank, c.peer, c.channel, c.conn_index, c.direction, c.transport, c.detail) for c in log.connections}


def validate(log) -> dict:
    body = nccl_document(log)
    VALIDATOR.validate(body)
    json.dumps(body)  # JSON-serialisable as is
    return body


# -- our own logs: NCCL 2.28.9, 2×H200 with NVLink (NV18), one file per process ------------------

#: run folder → (transport classes, details, channels per direction) as read from the logs.
H200_RUNS = {
    "p2p_nsys": ({"P2P"}, {"CUMEM"}, 24),
    "p2p_nsys_bucket25": ({"P2P"}, {"CUMEM"}, 24),
    "p2p_torch": ({"P2P"}, {"CUMEM"}, 24),
    "bf16_torch": ({"P2P"}, {"CUMEM"}, 24),
    "nobucketview_torch": ({"P2P"}, {"CUMEM"}, 24),
    "nobucketview_nsys_bucket25": ({"P2P"}, {"CUMEM"}, 24),
    "shm_nsys": ({"SHM"}, {"direct/direct"}, 4),
    "shm_torch": ({"SHM"}, {"direct/direct"}, 4),
    "net_socket_logs": ({"NET"}, {"Socket/0"}, 2),
}


@pytest.mark.parametrize("run", sorted(H200_RUNS))
def test_h200_runs(run: str) -> None:
    transports, details, channels = H200_RUNS[run]
    log = read_nccl_logs(run_files(run))
    assert set(log.transports) == transports
    assert {c.detail for c in log.connections} == details
    assert log.version == "2.28.9" and log.versions == ["2.28.9"]
    assert log.ranks == 2
    assert log.hosts == ["vm"]
    for rank, peer in ((0, 1), (1, 0)):
        sends = [c for c in log.connections if c.rank == rank and c.direction == "send"]
        assert {c.peer for c in sends} == {peer}
        assert sorted(c.channel for c in sends) == list(range(channels))
    assert len({c.comm for c in log.connections}) == 1 and log.connections[0].comm.startswith("0x")
    assert {c.comm for c in log.comms} == {log.connections[0].comm}
    assert log.warnings == []
    assert log.env["NCCL_NVLS_ENABLE"] == "0"
    body = validate(log)
    assert body["transports"] == sorted(transports)


def test_h200_p2p_details() -> None:
    log = read_nccl_logs(run_files("p2p_nsys"))
    assert conn_rows(log) == {(0, 1, ch, 0, "send", "P2P", "CUMEM") for ch in range(24)} | {
        (1, 0, ch, 0, "send", "P2P", "CUMEM") for ch in range(24)
    }
    assert log.nodes == 1
    assert log.max_bw_by_rank == {0: 370.8, 1: 370.8}
    assert "NCCL_P2P_DISABLE" not in log.env
    by_rank = {c.rank: c for c in log.comms}
    assert (by_rank[0].pid, by_rank[0].cuda_dev, by_rank[0].bus_id, by_rank[0].nnodes) == (1737, 0, "60", 1)
    assert (by_rank[1].pid, by_rank[1].nvml_dev, by_rank[1].bus_id, by_rank[1].local_rank) == (1734, 1, "70", 1)
    assert by_rank[0].comm_id == "0x55419b148a6d254c" and by_rank[0].comm_ptr == "0x468054c0"
    assert log.ib_devices == []  # "NET/IB : No device found." then "Using [RO]" with no device


def test_h200_shm_details() -> None:
    log = read_nccl_logs(run_files("shm_nsys"))
    assert conn_rows(log) == {(0, 1, ch, None, "send", "SHM", "direct/direct") for ch in range(4)} | {
        (1, 0, ch, None, "send", "SHM", "direct/direct") for ch in range(4)
    }
    assert log.env["NCCL_P2P_DISABLE"] == "1"
    assert log.max_bw_by_rank == {0: 48.0, 1: 48.0}
    assert [e.rank for e in log.env_lines if e.name == "NCCL_P2P_DISABLE"] == [0, 1]


def test_h200_net_socket_details() -> None:
    log = read_nccl_logs(run_files("net_socket_logs"))
    # "[receive]" lines print peer -> me: rank is the receiver.
    expected = set()
    for me, other in ((0, 1), (1, 0)):
        for ch in (0, 1):
            expected.add((me, other, ch, 0, "send", "NET", "Socket/0"))
            expected.add((me, other, ch, 0, "recv", "NET", "Socket/0"))
    assert conn_rows(log) == expected
    assert log.env == {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1", "NCCL_NVLS_ENABLE": "0"}
    assert log.nodes == 2  # NCCL itself counted two nodes (nNodes 2) on the one VM
    assert log.max_bw_by_rank == {0: 1.2, 1: 1.2}
    assert {e.value for e in log.network_lines if e.name == "using"} == {"Socket"}


# -- every line format of NCCL_LOGS.md, version by version --------------------------------------

P = "host-a:100:101 [0] NCCL INFO "
#: (NCCL generation, message, expected (rank, peer, channel, conn_index, direction, transport, detail))
DOC_LINES = [
    ("2.4", "Ring 00 : 0[0] -> 1[1] via P2P/IPC", (0, 1, 0, None, "send", "P2P", "IPC")),
    ("2.4", "Ring 01 : 0[0] -> 1[1] via P2P/direct pointer", (0, 1, 1, None, "send", "P2P", "direct pointer")),
    ("2.4", "Ring 00 : 0[0] -> 1[1] via direct shared memory", (0, 1, 0, None, "send", "SHM", "direct shared memory")),
    ("2.4", "Ring 00 : 0 -> 8 [send] via NET/IB/0/GDRDMA", (0, 8, 0, None, "send", "NET", "IB/0/GDRDMA")),
    ("2.4", "Ring 00 : 8 -> 0 [receive] via NET/Socket/1", (0, 8, 0, None, "recv", "NET", "Socket/1")),
    ("2.5", "Ring 00 : 0[1e000] -> 1[23000] via P2P/IPC", (0, 1, 0, None, "send", "P2P", "IPC")),
    ("2.5", "Ring 02 : 1[23000] -> 8[1e000] [send] via NET/IB/1/GDRDMA", (1, 8, 2, None, "send", "NET", "IB/1/GDRDMA")),
    ("2.5", "Ring 02 : 8[1e000] -> 1[23000] [receive] via NET/IB/1", (1, 8, 2, None, "recv", "NET", "IB/1")),
    ("2.7", "Channel 00 : 0[1e000] -> 1[23000] via P2P/IPC/read", (0, 1, 0, None, "send", "P2P", "IPC/read")),
    (
        "2.8",
        "Channel 03 : 0[1e000] -> 2[41000] via P2P/indirect/1[23000]",
        (0, 2, 3, None, "send", "P2P", "indirect/1[23000]"),
    ),
    (
        "2.7",
        "Channel 01 : 0[1e000] -> 1[23000] via direct shared memory",
        (0, 1, 1, None, "send", "SHM", "direct shared memory"),
    ),
    (
        "2.8",
        "Channel 00 : 1[23000] -> 8[1e000] [send] via NET/IB/0/GDRDMA/Shared",
        (1, 8, 0, None, "send", "NET", "IB/0/GDRDMA/Shared"),
    ),
    (
        "2.13",
        "Channel 00 : 0[1e000] -> 1[23000] via SHM/direct/direct",
        (0, 1, 0, None, "send", "SHM", "direct/direct"),
    ),
    ("2.13", "Channel 01 : 0[1e000] -> 1[23000] via SHM/CE/direct", (0, 1, 1, None, "send", "SHM", "CE/direct")),
    (
        "2.12",
        "Channel 02/1 : 1[23000] -> 8[1e000] [send] via NET/IB/0/GDRDMA",
        (1, 8, 2, 1, "send", "NET", "IB/0/GDRDMA"),
    ),
    (
        "2.12",
        "Channel 02/0 : 1[23000] -> 9[23000] [send] via NET/IB/0(0)/GDRDMA",
        (1, 9, 2, 0, "send", "NET", "IB/0(0)/GDRDMA"),
    ),
    (
        "2.12",
        "Channel 05/0 : 9[23000] -> 1[23000] [receive] via NET/IB/1(8)/GDRDMA",
        (1, 9, 5, 0, "recv", "NET", "IB/1(8)/GDRDMA"),
    ),
    ("2.14", "Channel 00/0 : 0[1e000] -> 1[23000] via P2P/IPC/read/CE", (0, 1, 0, 0, "send", "P2P", "IPC/read/CE")),
    ("2.18.1", "Channel 00/1 : 0[1e000] -> 1[23000] via P2P/CUMEM/read", (0, 1, 0, 1, "send", "P2P", "CUMEM/read")),
    ("2.18.3", "Channel 07/0 : 0[0] -> 1[1] via P2P/CUMEM", (0, 1, 7, 0, "send", "P2P", "CUMEM")),
    ("2.19", "Channel 00 : 0[0] -> 1[1] via SHM/direct/direct", (0, 1, 0, None, "send", "SHM", "direct/direct")),
    ("2.20", "Channel 03/0 : 0[0] -> 1[1] via P2P/MNNVL/read", (0, 1, 3, 0, "send", "P2P", "MNNVL/read")),
    (
        "2.20",
        "Channel 03/0 : 0[0] -> 1[1] via P2P/direct pointer/read",
        (0, 1, 3, 0, "send", "P2P", "direct pointer/read"),
    ),
    (
        "2.20",
        "Channel 04/0 : 0[0] -> 2[2] via P2P/indirect/1[1]/read",
        (0, 2, 4, 0, "send", "P2P", "indirect/1[1]/read"),
    ),
    (
        "2.26",
        "Channel 00/0 : 0[0] -> 8[0] [send] via NET/IB/0/GDRDMA(PCI)/Shared",
        (0, 8, 0, 0, "send", "NET", "IB/0/GDRDMA(PCI)/Shared"),
    ),
    ("2.30.7", "Channel 00 : 0[0] -> 1[1] via SHM/direct", (0, 1, 0, None, "send", "SHM", "direct")),
    ("2.6", "Coll 00 : 0 [send] via COLLNET/SHARP/0", (0, None, 0, None, "send", "COLLNET", "SHARP/0")),
    (
        "2.9",
        "CollNet 01 : 3 [receive] via COLLNET/SHARP/0/GDRDMA",
        (3, None, 1, None, "recv", "COLLNET", "SHARP/0/GDRDMA"),
    ),
    (
        "2.18",
        "CollNet 01/1 : 3 [send] via COLLNET/SHARP/1/GDRDMA(PCI)",
        (3, None, 1, 1, "send", "COLLNET", "SHARP/1/GDRDMA(PCI)"),
    ),
]


@pytest.mark.parametrize(
    ("generation", "message", "expected"), DOC_LINES, ids=[f"{g}:{m[:40]}" for g, m, _ in DOC_LINES]
)
def test_doc_connection_lines(generation: str, message: str, expected: tuple) -> None:
    for text in (P + message, P + message + "   ", message):  # prefixed, trailing blanks, bare
        log = parse_nccl_logs([("doc", text)])
        assert conn_rows(log) == {expected}, (generation, text)
        assert log.connections[0].line == text
        validate(log)


def test_doc_seen_here_block() -> None:
    text = (
        "vm:1057:1057 [0] NCCL INFO NCCL version 2.28.9+cuda13.0\n"
        "vm:1057:1057 [0] NCCL INFO comm 0x3c4d1330 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n"
        "vm:1057:1057 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM\n"
        "vm:1057:1057 [0] NCCL INFO Connected all rings, use ring PXN 0 GDR 1\n"
    )
    log = parse_nccl_logs([("doc", text)])
    assert log.versions == ["2.28.9"] and log.version_lines[0].rank == 0
    assert conn_rows(log) == {(0, 1, 0, 0, "send", "P2P", "CUMEM")}
    assert log.connections[0].comm == "0x3c4d1330"
    assert (log.ranks, log.nodes) == (2, 1)
    info = log.comms[0]
    assert (info.nranks, info.nnodes, info.local_ranks, info.local_rank, info.mnnvl) == (2, 1, 2, 0, 0)


@pytest.mark.parametrize(
    ("line", "version", "cuda"),
    [
        ("NCCL version 2.4.8+cuda10.1", "2.4.8", "10.1"),  # <=2.21: bare printf
        ("host:1:1 [0] NCCL INFO NCCL version 2.22.3+cuda12.5", "2.22.3", "12.5"),  # >=2.22: INFO
        ("[1,0]<stdout>:NCCL version 2.5.6+cuda10.2", "2.5.6", "10.2"),
    ],
)
def test_version_banners(line: str, version: str, cuda: str) -> None:
    log = parse_nccl_logs([("x", line)])
    assert log.versions == [version] and log.version_lines[0].name == cuda


def test_error_text_version_is_not_a_banner() -> None:
    line = "RuntimeError: NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.19.3"  # noqa: E501
    log = parse_nccl_logs([("x", line)])
    assert log.versions == []
    assert [w.level for w in log.warnings] == ["ERROR"]


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        ("comm 0x5581c0 rank 1 nranks 2 cudaDev 1 busId 23000 - Init COMPLETE", (1, 2, 1, None, "23000", None)),
        ("comm 0x7f6548001d10 rank 0 nranks 32 cudaDev 0 nvmlDev 0 - Init COMPLETE", (0, 32, 0, 0, None, None)),
        (
            "comm 0x55a1 rank 3 nranks 8 cudaDev 3 nvmlDev 5 busId 4a000 commId 0xabc123 - Init COMPLETE",
            (3, 8, 3, 5, "4a000", "0xabc123"),
        ),
        (
            "ncclCommInitRank comm 0xaa2f160 rank 0 nranks 8 cudaDev 0 nvmlDev 0 busId 8000 commId 0x551d06754c6bacf2 - Init START",  # noqa: E501
            (0, 8, 0, 0, "8000", "0x551d06754c6bacf2"),
        ),
        ("rank 0 nranks 8", (0, 8, None, None, None, None)),  # 2.3
    ],
)
def test_doc_init_lines(message: str, fields: tuple) -> None:
    log = parse_nccl_logs([("x", P + message)])
    (info,) = log.comms
    assert (info.rank, info.nranks, info.cuda_dev, info.nvml_dev, info.bus_id, info.comm_id) == fields


def test_doc_env_net_nvls_bw_lines() -> None:
    text = "\n".join(
        P + m
        for m in (
            "NCCL_P2P_DISABLE set by environment to 1",
            "NCCL_P2P_LEVEL set by environment to NVL",
            "NCCL_SHM_DISABLE set by environment to 1.",
            "NCCL_NET_GDR_LEVEL set by environment to PHB",
            "NCCL_IB_HCA set to mlx5_2:1,mlx5_0:1",
            "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/RoCE [RO]; OOB ib0:10.0.0.1<0>",
            "NET/Socket : Using [0]eth0:10.0.0.1<0>",
            "Using network IB",
            "NVLS multicast support is available on dev 0 (NVLS_NCHANNELS 16)",
            "=== System : maxBw 240.0 totalBw 240.0 ===",
            "comm 0x1 rank 0 nRanks 8 nNodes 1 localRanks 8 localRank 0 MNNVL 0",
        )
    )
    log = parse_nccl_logs([("x", text)])
    assert log.env == {
        "NCCL_P2P_DISABLE": "1",
        "NCCL_P2P_LEVEL": "NVL",
        "NCCL_SHM_DISABLE": "1",
        "NCCL_NET_GDR_LEVEL": "PHB",
        "NCCL_IB_HCA": "mlx5_2:1,mlx5_0:1",
    }
    assert log.ib_devices == ["mlx5_0:1/IB", "mlx5_1:1/RoCE"]
    assert log.transports == []  # NVLS *available* is not NVLS connected
    assert log.max_bw_by_rank == {0: 240.0}
    for connected in (
        "Connected NVLS tree",
        "NVLS comm 0x55a7 headRank 0 nHeads 8 buffSize 4194304",
        "16 coll channels, 16 nvls channels, 16 p2p channels, 16 p2p channels per peer",
    ):
        assert parse_nccl_logs([("x", P + connected)]).transports == ["NVLS"]
    assert parse_nccl_logs([("x", P + "24 coll channels, 0 nvls channels, 32 p2p channels")]).transports == []


IBV = "Call to ibv_modify_qp failed with 110 Connection timed out, on dev mlx5_0:1, curr state INIT, next state RTR"


@pytest.mark.parametrize(
    ("line", "location", "function", "message"),
    [
        (
            "host-a:100:102 [1] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer b<4321>",
            "misc/socket.cc:50",
            None,
            "socketProgress: Connection closed by remote peer b<4321>",
        ),
        (  # 2.26+: NCCL's own timestamp before the prefix; master: "(function)"
            "[2025-01-02 03:04:05] host-a:100:102 [1] proxy.cc:1326 (ncclProxyService) NCCL WARN Socket recv failed while polling for opId=0x7f12",  # noqa: E501
            "proxy.cc:1326",
            "ncclProxyService",
            "Socket recv failed while polling for opId=0x7f12",
        ),
        (
            "host-a:100:101 [1] misc/ibvwrap.cc:262 NCCL WARN " + IBV,
            "misc/ibvwrap.cc:262",
            None,
            IBV,
        ),
    ],
)
def test_doc_warn_lines(line: str, location: str, function: str | None, message: str) -> None:
    text = "host-a:100:101 [1] NCCL INFO comm 0x9 rank 5 nranks 8 cudaDev 1 - Init COMPLETE\n\n" + line
    log = parse_nccl_logs([("x", text)])
    (w,) = log.warnings
    assert (w.level, w.rank, w.host, w.file and f"{w.file}:{w.file_line}", w.function, w.message) == (
        "WARN",
        5,
        "host-a",
        location,
        function,
        message,
    )
    assert w.line == line


@pytest.mark.parametrize(
    "text",
    [
        "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
        "unhandled system error (run with NCCL_DEBUG=INFO for details)",
        "internal error - please report this issue to the NCCL developers",
        "invalid usage (run with NCCL_DEBUG=WARN for details)",
        "remote process exited or there was a network error",
    ],
)
def test_doc_error_strings(text: str) -> None:
    line = f"[rank3]:torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:77, {text}, NCCL version 2.21.5"  # noqa: E501
    log = parse_nccl_logs([("console", line + "\n" + line)])  # repeated tracebacks count once
    (w,) = log.warnings
    assert (w.level, w.rank, w.line) == ("ERROR", 3, line)


# -- public issue excerpts (tests/fixtures/nccl_logs/*.log, source URL in each file) ------------

#: file → (transports, details, ranks that printed WARN/ERROR lines) as read from the excerpt.
PUBLIC_EXPECTED = {
    "v2.4_ring_p2p_shm_socket.log": ({"P2P", "SHM", "NET"}, {"IPC", "direct shared memory", "Socket/0"}, {4}),
    "v2.5_ompi_prefix_banner.log": (set(), set(), set()),
    "v2.5_busid_no_host.log": ({"P2P", "NET"}, {"IPC", "IB/1/GDRDMA"}, set()),
    "v2.7_channel_ib_gdrdma.log": ({"NET"}, {"IB/5/GDRDMA", "IB/2/GDRDMA"}, set()),
    "v2.1x_direct_pointer_read.log": ({"P2P"}, {"direct pointer/read"}, set()),
    "v2.18_ipc_read_socket.log": ({"P2P", "NET"}, {"IPC/read", "Socket/3"}, set()),
    "v2.1x_shm_failure_socket.log": ({"SHM", "NET"}, {"direct/direct", "Socket/0"}, {11, None}),
    "v2.2x_cumem_shared_attach.log": ({"P2P", "NET"}, {"CUMEM", "IB/9/GDRDMA/Shared"}, {0}),
    "v2.26_timestamp_warn.log": (set(), set(), {None}),
    "v2.2x_cloudwatch_cumem_read.log": ({"P2P"}, {"CUMEM/read"}, set()),
    "v2.19_nvls_connected.log": ({"P2P", "NVLS"}, {"direct pointer"}, set()),
    "v2.2x_nvls_available_only.log": (set(), set(), set()),
    "v2.2x_ibext_plugin.log": ({"NET"}, {"IBext_v8/3", "IBext_v8/7", "IBext_v8/5"}, set()),
    "v2.1x_pdsh_prefix_shm_ipc.log": ({"SHM", "P2P"}, {"direct/direct", "IPC"}, set()),
    "v2.x_python_logging_rings.log": (set(), set(), set()),
    "v2.2x_socket_ifname_ib_disabled.log": (set(), set(), set()),
}


def test_every_public_excerpt_names_its_source() -> None:
    # The whole corpus (and its hand-written expectations) is tested in test_nccl_corpus.py; these
    # first excerpts also pin their connection details and WARN ranks here.
    assert set(PUBLIC_EXPECTED) <= {p.name for p in PUBLIC.glob("*.log")}
    for path in PUBLIC.glob("*.log"):
        assert "# source: https://github.com/" in path.read_text(), path.name


@pytest.mark.parametrize("name", sorted(PUBLIC_EXPECTED))
def test_public_excerpts(name: str) -> None:
    transports, details, warn_ranks = PUBLIC_EXPECTED[name]
    log = read_nccl_logs([PUBLIC / name])
    assert set(log.transports) == transports
    assert {c.detail for c in log.connections} == details
    assert {w.rank for w in log.warnings} == warn_ranks
    raw = (PUBLIC / name).read_text().splitlines()
    assert all(any(c.line in line for line in raw) for c in log.connections)
    validate(log)


def test_public_excerpt_specifics() -> None:
    log = read_nccl_logs([PUBLIC / "v2.4_ring_p2p_shm_socket.log"])
    assert log.versions == ["2.4.2"]
    assert (4, 19, 2, None, "recv", "NET", "Socket/0") in conn_rows(log)  # "19 -> 4 [receive]"
    log = read_nccl_logs([PUBLIC / "v2.7_channel_ib_gdrdma.log"])
    assert (0, 2, 1, None, "recv", "NET", "IB/5/GDRDMA") in conn_rows(log)
    assert log.connections[0].rank_dev == "87000"  # busId hex in 2.5-2.18.1 brackets
    log = read_nccl_logs([PUBLIC / "v2.5_ompi_prefix_banner.log"])
    assert log.versions == ["2.5.6"] and log.hosts == ["5873af64cf59"]
    log = read_nccl_logs([PUBLIC / "v2.2x_nvls_available_only.log"])
    assert (log.ranks, log.nodes) == (16, 2)
    log = read_nccl_logs([PUBLIC / "v2.x_python_logging_rings.log"])
    assert log.connections == [] and log.hosts == ["g340-cd51-4900-b72a-d104-a9bf-df48"]
    log = read_nccl_logs([PUBLIC / "v2.2x_socket_ifname_ib_disabled.log"])
    assert log.env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "LOC"}
    log = read_nccl_logs([PUBLIC / "v2.2x_cloudwatch_cumem_read.log"])
    assert log.env == {}  # libfabric's "FI_OPT_... set to false" is not an NCCL echo


# -- real-life input forms ----------------------------------------------------------------------


def interleave(files: list[Path], prefix) -> str:
    """Merge per-rank files line by line, as a launcher's console shows them."""
    per_rank = [f.read_text().splitlines() for f in files]
    out = []
    for i in range(max(map(len, per_rank))):
        for rank, lines in enumerate(per_rank):
            if i < len(lines):
                out.append(prefix(rank, i) + lines[i])
                if i % 17 == 0:
                    out.append(prefix(rank, i) + "epoch 0 step 3 loss=2.31 [not an NCCL line]")
    return "\n".join(out)


CONSOLE_PREFIXES = {
    "openmpi+timestamp": lambda r, i: f"[2025-01-02 03:04:{i % 60:02d}] [1,{r}]<stdout>:",
    "torchrun": lambda r, i: f"[rank{r}]:",
    "python-logging": lambda r, i: "INFO:root:",
    "iso+pipe": lambda r, i: f"2024-12-04T05:27:{i % 60:02d}.080Z | ",
    "syslog": lambda r, i: f"Jan  2 03:04:{i % 60:02d} node7 python[4242]: ",
    "srun-label": lambda r, i: f"{r}: ",
}


@pytest.mark.parametrize("run", ["p2p_nsys", "shm_nsys", "net_socket_logs"])
@pytest.mark.parametrize("form", sorted(CONSOLE_PREFIXES))
def test_interleaved_console_matches_per_rank_files(run: str, form: str) -> None:
    files = run_files(run)
    per_file = read_nccl_logs(files)
    console = parse_nccl_logs([("console.log", interleave(files, CONSOLE_PREFIXES[form]))])
    assert conn_rows(console) == conn_rows(per_file)
    assert {c.comm for c in console.connections} == {c.comm for c in per_file.connections}
    assert console.env == per_file.env
    assert console.max_bw_by_rank == per_file.max_bw_by_rank
    assert (console.version, console.ranks, console.nodes) == (per_file.version, per_file.ranks, per_file.nodes)
    validate(console)


def test_excerpts_missing_first_and_last_lines() -> None:
    files = run_files("shm_nsys")
    full = read_nccl_logs(files)
    cut = parse_nccl_logs((f.name, "\n".join(f.read_text().splitlines()[40:-3])) for f in files)
    assert conn_rows(cut) == conn_rows(full)
    assert cut.versions == []  # the banner was in the cut-off head
    only_channels = [(f.name, "\n".join(line for line in f.read_text().splitlines() if "via" in line)) for f in files]
    bare = parse_nccl_logs(only_channels)
    assert conn_rows(bare) == conn_rows(full)
    assert {c.comm for c in bare.connections} == {None}
    assert bare.ranks == 2 and bare.nodes == 1


def test_garbage_and_truncated_lines_are_skipped() -> None:
    text = (H200 / "p2p_nsys" / "nccl.vm.1737.log").read_text()
    noise = [
        "\x00\x01\x02 binary junk \xff",
        "Traceback (most recent call last):",
        "vm:1737:1737 [0] NCCL INFO Channel 99/0 : 0[0] -> ",  # truncated mid-line
        "vm:1737:1737 [0] NCCL INFO Channel 98/0 : 0[0] -> 1[1] via UNKNOWN/thing",
        "vm:1737:1737 [0] NCCL INFO comm 0xzz rank x nRanks",
        "vm:1737:1737 [0] NCCL INFO === System : maxBw inf totalBw nan ===",
        "NCCL INFO",
        "x" * 100_000,
        "",
    ]
    lines = text.splitlines()
    mixed = "\n".join(lines[:60] + noise + lines[60:])
    assert conn_rows(parse_nccl_logs([("x", mixed)])) == conn_rows(parse_nccl_logs([("x", text)]))
    validate(parse_nccl_logs([("x", mixed)]))


def test_read_nccl_logs_gzip_and_errors(tmp_path: Path) -> None:
    src = H200 / "shm_nsys" / "nccl.vm.1979.log"
    gz = tmp_path / "nccl.vm.1979.log.gz"
    gz.write_bytes(gzip.compress(src.read_bytes()))
    assert conn_rows(read_nccl_logs([gz])) == conn_rows(read_nccl_logs([src]))
    with pytest.raises(InputError):
        read_nccl_logs([tmp_path / "missing.log"])


def test_empty_input() -> None:
    log = parse_nccl_logs([])
    body = validate(log)
    assert body["version"] is None and body["ranks"] is None and body["nodes"] is None
    assert body["connections"] == [] and body["findings"] == []


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        ((H200 / "p2p_nsys" / "nccl.vm.1734.log").read_text()[:4096], True),
        ((PUBLIC / "v2.5_ompi_prefix_banner.log").read_text(), True),
        ((PUBLIC / "v2.26_timestamp_warn.log").read_text(), True),
        ("NCCL version 2.4.8+cuda10.1\n", True),
        ('{"traceEvents": [{"name": "ncclKernel_AllReduce"}]}', False),
        ("SQLite format 3\x00", False),
        ("NCCL is a library. INFO: nothing here\n", False),
        ("", False),
    ],
)
def test_looks_like_nccl_log(head: str, expected: bool) -> None:
    assert looks_like_nccl_log(head) is expected


# -- property tests: random and mutated real text never raise, always validate ---------------------

REAL_LINES: list[str] = sorted(
    {
        line
        for path in [*H200.glob("*/nccl.*.log"), *PUBLIC.glob("*.log")]
        for line in path.read_text().splitlines()
        if line.strip()
    }
)


@st.composite
def mutated_logs(draw: st.DrawFn) -> str:
    lines = draw(st.lists(st.sampled_from(REAL_LINES), min_size=0, max_size=40))
    rnd = random.Random(draw(st.integers(0, 2**32 - 1)))
    out: list[str] = []
    for line in lines:
        op = rnd.randrange(7)
        if op == 0:
            line = line[: rnd.randrange(len(line) + 1)]  # truncate
        elif op == 1:
            at = rnd.randrange(len(line) + 1)
            line = line[:at] + draw(st.text(max_size=12)) + line[at:]  # insert random characters
        elif op == 2:
            out.append(line)  # duplicate
        elif op == 3 and out:
            line = out.pop() + line  # two lines glued together (no newline between writes)
        elif op == 4:
            line = "".join(rnd.sample(line, len(line)))  # shuffle characters
        out.append(line)
    if draw(st.booleans()):
        rnd.shuffle(out)
    return "\n".join(out)


FUZZ = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FUZZ
@given(st.text(max_size=2000))
def test_fuzz_random_text(text: str) -> None:
    validate(parse_nccl_logs([("random", text)]))
    looks_like_nccl_log(text)


@FUZZ
@given(st.lists(mutated_logs(), min_size=1, max_size=3))
def test_fuzz_mutated_real_lines(texts: list[str]) -> None:
    log = parse_nccl_logs((f"f{i}", t) for i, t in enumerate(texts))
    body = validate(log)
    assert set(body["transports"]) <= {"P2P", "SHM", "NET", "COLLNET", "NVLS"}
    for conn in log.connections:
        assert any(conn.line in line for t in texts for line in t.splitlines())  # a line, or one record of it


def test_two_communicators_in_one_process() -> None:
    # DDP's default group, then a subgroup: connection lines belong to the newest matching comm.
    text = "\n".join(
        [
            "n1:7:7 [0] NCCL INFO ncclCommInitRankConfig comm 0x10 rank 2 nranks 4 cudaDev 0 nvmlDev 0 busId 1000 commId 0xaaa - Init COMPLETE",  # noqa: E501
            "n1:7:7 [0] NCCL INFO Channel 00/0 : 2[0] -> 3[1] via P2P/CUMEM",
            "n1:7:7 [0] NCCL INFO ncclCommSplit comm 0x20 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0xbbb - Init COMPLETE",  # noqa: E501
            "n1:7:7 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct",
            "n1:7:7 [0] misc/socket.cc:50 NCCL WARN socketProgress: Connection closed by remote peer n2<1>",
        ]
    )
    log = parse_nccl_logs([("x", text)])
    assert [(c.comm, c.rank, c.peer, c.transport) for c in log.connections] == [
        ("0xaaa", 2, 3, "P2P"),
        ("0xbbb", 0, 1, "SHM"),
    ]
    assert log.ranks == 4
    assert log.warnings[0].rank == 2  # the process's rank in its largest communicator
