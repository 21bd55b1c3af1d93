"""The public NCCL_DEBUG corpus (tests/fixtures/nccl_logs, PROVENANCE.md): every log through the real
parser and the transport findings, compared with expectations written by hand from reading each log
(expected.json). Counts the test needs from the raw text it computes itself with plain regexes.

Also: a partial log (NCCL lines, no connection lines) is a valid document with transport "unknown"
and a reason, down to the `transport_p2p` check (skip, not pass); and ingest imports no metrics module.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator

from traceguard.ingest.nccl_log import TRANSPORTS, looks_like_nccl_log, parse_nccl_logs, read_nccl_logs
from traceguard.ingest.sides import side_files
from traceguard.metrics.transport import nccl_document
from traceguard.pipeline import analyze

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "tests" / "fixtures" / "nccl_logs"
EXPECTED: dict[str, dict] = json.loads((CORPUS / "expected.json").read_text())["logs"]
VALIDATOR = Draft202012Validator(json.loads((REPO / "docs" / "nccl.schema.json").read_text()))
REPORT_VALIDATOR = Draft202012Validator(json.loads((REPO / "docs" / "report.schema.json").read_text()))

#: A connection ("via") record in raw text, in any generation's wording.
VIA = re.compile(r"\bvia (?:P2P/|SHM/|NET/|COLLNET/|direct shared memory)")


def test_corpus_is_complete_and_documented() -> None:
    files = {p.name for p in CORPUS.glob("*.log")}
    assert files == set(EXPECTED)
    assert len(files) >= 60
    provenance = (CORPUS / "PROVENANCE.md").read_text()
    for name, expected in EXPECTED.items():
        assert f"`{name}`" in provenance, name
        assert f"# source: {expected['source']}" in (CORPUS / name).read_text(), name
    partial = [n for n, e in EXPECTED.items() if e["transports"] == "unknown"]
    assert len(partial) >= 15


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_corpus_log(name: str) -> None:
    expected = EXPECTED[name]
    path = CORPUS / name
    text = path.read_text()
    log = read_nccl_logs([path])
    doc = nccl_document(log)
    VALIDATOR.validate(doc)
    json.dumps(doc)

    assert log.nccl_lines > 0 and looks_like_nccl_log(text[:65536])
    if expected["transports"] == "unknown":
        assert doc["transports"] == []
    else:
        assert set(doc["transports"]) == set(expected["transports"]) <= set(TRANSPORTS)
    if expected["partial"]:
        assert doc["transport_status"] == "unknown" and doc["connections"] == []
        assert "connection lines" in doc["transport_reason"] or "one rank" in doc["transport_reason"]
    else:
        assert doc["transport_status"] == "known" and doc["transport_reason"] is None
    assert doc["version"] == expected["version"]

    stated_sizes = [c["nranks"] for c in doc["comms"] if c["nranks"] is not None] + log.stated_sizes
    if expected["nranks"] is None:
        assert stated_sizes == []
    else:
        assert doc["ranks"] == expected["nranks"] == max(stated_sizes)
    nnodes = [c["nnodes"] for c in doc["comms"] if c["nnodes"] is not None]
    assert (max(nnodes) if nnodes else None) == expected["nnodes"]

    # Every "via" record of the raw text is one connection row, quoting the text it came from.
    raw_lines = [line for line in text.splitlines() if not line.startswith("# ")]  # not the file's own header
    assert len(log.connections) == sum(len(VIA.findall(line)) for line in raw_lines)
    assert all(any(c.line in raw for raw in raw_lines) for c in log.connections)
    # Findings quote lines of the log, never text of their own.
    for finding in doc["findings"]:
        assert all(any(ev in raw for raw in raw_lines) for ev in finding["evidence"]), finding["id"]


def test_glued_records_keep_their_own_process() -> None:
    """Two processes writing at once: rank 7's record follows rank 6's prefix on the same line."""
    log = read_nccl_logs([CORPUS / "v2.3_interleaved_ring_ipc.log"])
    (conn,) = [c for c in log.connections if (c.rank, c.peer, c.channel) == (7, 3, 4)]
    assert (conn.pid, conn.host) == (40517, "learnfair062")
    assert conn.line.startswith("learnfair062:40517:40631 [7] NCCL INFO Ring 04")
    # Records of a paste that lost its newlines: each one parsed, NVLS included.
    log = read_nccl_logs([CORPUS / "v2.2x_newlines_lost_cumem_nvls.log"])
    assert sorted((c.rank, c.peer, c.channel) for c in log.connections) == [(7, 0, 15), (7, 6, 6), (7, 6, 14)]
    assert log.transports == ["NVLS", "P2P"]


def test_net_socket_thread_line_is_not_an_interface() -> None:
    log = read_nccl_logs([CORPUS / "v2.7_horovod_ompi_socket_threads.log"])
    assert log.networks["socket"] == []
    log = read_nccl_logs([CORPUS / "v2.18_ib_disabled_socket_mpi_noise_partial.log"])
    assert log.networks["socket"] == ["[0]ibs85f0:192.168.1.14<0> [1]ib0:192.168.1.15<0>"]


def test_network_in_use_is_the_network_line_not_the_plugin_line() -> None:
    # "NET/Plugin: Using internal network plugin." names no network; "Using network Socket" does.
    for name, using in [
        ("v2.21_docker_four_ranks_partial.log", []),
        ("v2.19.3_one_rank_rings_partial.log", ["Socket"]),
        ("v2.2x_ibext_sharp_devices_partial.log", ["IBext_v8"]),
    ]:
        text = (CORPUS / name).read_text()
        assert using == sorted(set(re.findall(r"NCCL INFO Using network (\S+)$", text, re.MULTILINE)))
        assert read_nccl_logs([CORPUS / name]).networks["using"] == using


def test_hosts_with_one_name_for_several_machines_are_not_one_node() -> None:
    """Both nodes are called "user" (rank 0 and rank 8 both claim busId 27000): NET between them is
    not a within-node fallback. Two ranks of one real host talking over NET/IB is one."""
    found = nccl_document(read_nccl_logs([CORPUS / "v2.18.1_two_hosts_same_name_ipc_socket.log"]))["findings"]
    assert "net_within_node" not in {f["id"] for f in found}
    found = nccl_document(read_nccl_logs([CORPUS / "v2.2x_net_ib_same_host_shared.log"]))["findings"]
    (within,) = [f for f in found if f["id"] == "net_within_node"]
    assert within["ranks"] == [0, 1] and within["severity"] == "fail"


def test_partial_log_document() -> None:
    path = CORPUS / "v2.2x_ring_neighbours_trees_partial.log"
    text = path.read_text()
    doc = nccl_document(read_nccl_logs([path]))
    assert (doc["ranks"], doc["nodes"]) == (4, 2)
    assert doc["transport_status"] == "unknown" and doc["transports"] == []
    assert "`Channel xx : a[b] -> c[d] via ...`" in doc["transport_reason"]
    assert "NCCL_DEBUG=INFO" in doc["transport_reason"]
    # Topology lines: every "Trees", "Tree N :" and "Ring NN : a -> b -> c" line of the raw text.
    kinds = [row["kind"] for row in doc["topology"]]
    assert kinds.count("tree") == len(re.findall(r"NCCL INFO Trees? ", text))
    assert kinds.count("ring") == len(re.findall(r"NCCL INFO Ring \d+ : \d+ -> \d+ -> \d+", text))
    doc = nccl_document(read_nccl_logs([CORPUS / "v2.1x_shm_p2p_level_loc_rings_trees.log"]))
    assert doc["channels"] == {"coll": 2, "collnet": None, "nvls": 0, "p2p": 2, "p2p_per_peer": 2, "rings": 2}
    doc = nccl_document(read_nccl_logs([CORPUS / "v2.19.3_one_rank_rings_partial.log"]))
    assert "one rank" in doc["transport_reason"] and doc["networks"]["using"] == ["Socket"]
    doc = nccl_document(read_nccl_logs([CORPUS / "v2.2x_nvls_tree_connected_partial.log"]))
    assert doc["transports"] == ["NVLS"] and doc["transport_status"] == "unknown"
    assert doc["channels"]["nvls"] == 16 and doc["ranks"] == 64


def test_partial_log_skips_the_transport_check() -> None:
    """Through the whole analysis: no connection lines → `transport_p2p` skip with the reason, never pass."""
    path = CORPUS / "v2.21_docker_four_ranks_partial.log"
    report = analyze([], side_files=side_files(nccl_logs=[path])).report
    REPORT_VALIDATOR.validate(report)
    (check,) = [c for c in report["checks"] if c["id"] == "transport_p2p"]
    assert check["status"] == "skip" and "no connection lines" in check["reason"]
    assert report["nccl"]["version"] == "2.21.5" and report["nccl"]["transport_status"] == "unknown"


def test_no_nccl_lines_is_not_a_partial_log() -> None:
    log = parse_nccl_logs([("python.log", "Traceback (most recent call last):\n  RuntimeError: CUDA out of memory\n")])
    assert log.nccl_lines == 0
    assert "no NCCL log lines" in log.transport_unknown_reason


def test_ingest_imports_no_metrics_module() -> None:
    """Parsing stays in ingest, judging in metrics: importing the NCCL parser (and all of ingest)
    loads no traceguard.metrics module."""
    code = (
        "import sys, traceguard.ingest, traceguard.ingest.nccl_log, traceguard.ingest.sides;"
        "print([m for m in sys.modules if m.startswith(('traceguard.metrics', 'traceguard.report'))])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "[]"
