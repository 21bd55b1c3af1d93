"""Transport matrix and findings on real NCCL logs (our 2×H200 runs, public issue excerpts).

Expected findings are stated from what the logs say (e.g. the SHM run was made with
NCCL_P2P_DISABLE=1 on two NVLink-joined GPUs), never derived from the code under test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from traceguard.ingest.nccl_log import parse_nccl_logs, read_nccl_logs
from traceguard.metrics.transport import Finding, findings, nccl_document, transport_matrix

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "tests" / "fixtures" / "h200"
PUBLIC = REPO / "tests" / "fixtures" / "nccl_logs"


def run(name: str):
    return read_nccl_logs(sorted((H200 / name).glob("nccl.*.log")))


def by_id(found: list[Finding]) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in found:
        out.setdefault(f.id, []).append(f)
    return out


def nvlink_pairs_from_topo(text: str) -> set[frozenset[int]]:
    """GPU pairs joined by NVLink in `nvidia-smi topo -m` (cells "NV<n>"); test-side reader."""
    pairs: set[frozenset[int]] = set()
    for line in text.splitlines():
        cells = line.split("\t")
        m = re.match(r"GPU(\d+)$", cells[0].strip())
        if not m:
            continue
        for j, cell in enumerate(cells[1:]):
            if re.fullmatch(r"NV\d+", cell.strip()):
                pairs.add(frozenset((int(m.group(1)), j)))
    return pairs


TOPO = nvlink_pairs_from_topo((H200 / "topo.txt").read_text())


def all_input_lines(log_files: list[Path]) -> set[str]:
    return {line for f in log_files for line in f.read_text().splitlines()}


def test_topology_reader_sees_the_nvlink_pair() -> None:
    assert {frozenset((0, 1))} == TOPO


@pytest.mark.parametrize("name", ["p2p_nsys", "p2p_torch", "bf16_torch", "nobucketview_torch"])
def test_p2p_run_is_clean(name: str) -> None:
    log = run(name)
    assert findings(log) == []
    assert findings(log, nvlink_pairs=TOPO) == []
    matrix = transport_matrix(log)
    assert matrix["ranks"] == [0, 1]
    assert matrix["matrix"]["0"]["1"] == {
        "transports": ["P2P"],
        "details": ["P2P/CUMEM"],
        "channels": 24,
        "directions": ["send"],
    }
    assert matrix["matrix"]["1"]["0"]["transports"] == ["P2P"]


@pytest.mark.parametrize("name", ["shm_nsys", "shm_torch"])
def test_shm_run_fails_shm_within_node(name: str) -> None:
    log = run(name)
    files = sorted((H200 / name).glob("nccl.*.log"))
    for pairs in (None, TOPO):
        found = by_id(findings(log, nvlink_pairs=pairs))
        (shm,) = found["shm_within_node"]
        assert shm.severity == "fail"
        assert shm.ranks == [0, 1]
        assert "NCCL_P2P_DISABLE=1" in shm.message
        assert any(line.endswith("NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct") for line in shm.evidence)
        assert any("NCCL_P2P_DISABLE set by environment to 1" in line for line in shm.evidence)
        assert set(shm.evidence) <= all_input_lines(files)
        (p2p,) = found["p2p_disabled_by_env"]
        assert (p2p.severity, p2p.ranks) == ("warn", [0, 1])
        assert "net_within_node" not in found
    assert transport_matrix(log)["matrix"]["0"]["1"]["details"] == ["SHM/direct/direct"]


def test_shm_without_nvlink_between_the_pair_is_not_flagged() -> None:
    found = by_id(findings(run("shm_nsys"), nvlink_pairs=set()))
    assert "shm_within_node" not in found
    assert "p2p_disabled_by_env" in found


def test_net_run_fails_net_within_node() -> None:
    log = run("net_socket_logs")
    found = by_id(findings(log, nvlink_pairs=TOPO))
    (net,) = found["net_within_node"]
    assert (net.severity, net.ranks) == ("fail", [0, 1])
    assert "NCCL_P2P_DISABLE=1" in net.message and "NCCL_SHM_DISABLE=1" in net.message
    assert any("via NET/Socket/0" in line for line in net.evidence)
    assert "socket_with_ib" not in found  # "NET/IB : No device found." on this VM
    assert "shm_within_node" not in found
    assert transport_matrix(log)["matrix"]["1"]["0"]["directions"] == ["recv", "send"]


def test_socket_with_ib_device_listed() -> None:
    # Line formats from NCCL_LOGS.md: an IB device was listed, yet the connection went over sockets.
    text = "\n".join(
        [
            "node1:10:10 [0] NCCL INFO NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.0.0.1<0>",
            "node1:10:10 [0] NCCL INFO Using network Socket",
            "node1:10:10 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/Socket/0",
        ]
    )
    (f,) = by_id(findings(parse_nccl_logs([("x", text)])))["socket_with_ib"]
    assert f.severity == "fail" and "mlx5_0:1/IB" in f.message
    assert f.evidence[0].endswith("NET/IB : Using [0]mlx5_0:1/IB [RO]; OOB ib0:10.0.0.1<0>")
    assert f.evidence[1].endswith("[send] via NET/Socket/0")


def test_ib_without_gdrdma() -> None:
    found = by_id(findings(read_nccl_logs([PUBLIC / "v2.2x_ibext_plugin.log"])))
    (f,) = found["ib_without_gdrdma"]
    assert f.severity == "warn" and f.ranks == [32, 35, 36]
    assert "ib_without_gdrdma" not in by_id(findings(read_nccl_logs([PUBLIC / "v2.7_channel_ib_gdrdma.log"])))
    assert "ib_without_gdrdma" not in by_id(findings(read_nccl_logs([PUBLIC / "v2.2x_cumem_shared_attach.log"])))


@pytest.mark.parametrize(
    ("name", "ranks", "quoted"),
    [
        ("v2.1x_shm_failure_socket.log", [11], "Error while creating shared memory segment /dev/shm/nccl-KWfVyt"),
        ("v2.26_timestamp_warn.log", [], "failed to extend /dev/shm/nccl-WU88OE to 9637892 bytes"),
        ("v2.2x_cumem_shared_attach.log", [0], "Error while attaching to shared memory segment /dev/shm/nccl-glnlGK"),
        ("v2.4_ring_p2p_shm_socket.log", [4], "include/shm.h:42 NCCL WARN Cuda failure 'invalid argument'"),
    ],
)
def test_shm_failure(name: str, ranks: list[int], quoted: str) -> None:
    found = by_id(findings(read_nccl_logs([PUBLIC / name])))
    (f,) = found["shm_failure"]
    assert f.severity == "fail" and f.ranks == ranks
    assert any(quoted in line for line in f.evidence)
    assert set(f.evidence) <= all_input_lines([PUBLIC / name])
    assert all(w.severity == "warn" for w in found["nccl_warn"])


def test_nccl_warn_quotes_each_line_with_rank() -> None:
    found = by_id(findings(read_nccl_logs([PUBLIC / "v2.2x_cumem_shared_attach.log"])))
    warns = found["nccl_warn"]
    assert len(warns) == 2 and all(w.ranks == [0] for w in warns)
    assert [w.evidence for w in warns] == [
        ["g148:14937:69361 [0] misc/shmutils.cc:93 NCCL WARN Call to open failed: No such file or directory"],
        [
            "g148:14937:69361 [0] misc/shmutils.cc:129 NCCL WARN Error while attaching to shared memory segment "
            "/dev/shm/nccl-glnlGK (size 14156128), error: No such file or directory (2)"
        ],
    ]
    assert "rank(s) 0" in warns[0].message and "misc/shmutils.cc:93" in warns[0].message


def test_error_string_is_a_failing_nccl_warn() -> None:
    line = "[rank1]: torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:77, remote process exited or there was a network error, NCCL version 2.21.5"  # noqa: E501
    (f,) = by_id(findings(parse_nccl_logs([("console", line)])))["nccl_warn"]
    assert (f.severity, f.ranks, f.evidence) == ("fail", [1], [line])


def test_mixed_versions() -> None:
    files = sorted((H200 / "p2p_nsys").glob("nccl.*.log"))
    # Rank 1 (pid 1734) as if it had loaded another libnccl: only its banner changes.
    sources = [
        (
            f.name,
            f.read_text().replace("NCCL version 2.28.9", "NCCL version 2.27.3") if "1734" in f.name else f.read_text(),
        )
        for f in files
    ]
    log = parse_nccl_logs(sources)
    assert log.version is None and log.versions == ["2.27.3", "2.28.9"]
    assert nccl_document(log)["version"] is None
    (f,) = by_id(findings(log))["mixed_versions"]
    assert f.severity == "fail" and f.ranks == [0, 1]
    assert "2.27.3 on rank(s) 1" in f.message and "2.28.9 on rank(s) 0" in f.message
    assert len(f.evidence) == 2


def test_p2p_level_from_env_and_shm_on_public_excerpts() -> None:
    found = by_id(findings(read_nccl_logs([PUBLIC / "v2.2x_socket_ifname_ib_disabled.log"])))
    (f,) = found["p2p_disabled_by_env"]
    assert f.severity == "warn" and "NCCL_P2P_LEVEL=LOC" in f.message
    found = by_id(findings(read_nccl_logs([PUBLIC / "v2.1x_pdsh_prefix_shm_ipc.log"])))
    assert found["shm_within_node"][0].ranks == [11, 12]


def test_findings_in_the_json_contract() -> None:
    body = nccl_document(run("shm_nsys"), nvlink_pairs=TOPO)
    ids = [f["id"] for f in body["findings"]]
    assert ids[0] == "shm_within_node" and "p2p_disabled_by_env" in ids
    assert body["transports"] == ["SHM"] and body["env"]["NCCL_P2P_DISABLE"] == "1"
