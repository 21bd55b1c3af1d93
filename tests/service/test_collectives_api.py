"""Collectives by type and the rank × peer matrix through the store and the API (SQLite and
PostgreSQL), compared with the CLI's own analysis of the same files and with plain SQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests.conftest import public_nsys
from tests.service.conftest import P2P, P2P_FILES, Api
from traceguard.pipeline import analyze

MFU = public_nsys("mfu_2gpu_before")


@pytest.fixture(scope="module")
def mfu_report() -> dict:
    return analyze([str(MFU)]).report


def _allreduce_payloads(db: Path) -> list[int]:
    """Message sizes of the NCCL ncclAllReduce ranges, decoded by hand from the blob: a 32-byte
    header (count, schema id, size, offset), then the payload (communicator id, message size)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    blobs = [
        b
        for (b,) in con.execute(
            "SELECT e.binaryData FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
            "WHERE s.value = 'ncclAllReduce' AND e.binaryData IS NOT NULL"
        )
    ]
    con.close()
    sizes = []
    for blob in blobs:
        offset = int.from_bytes(blob[24:32], "little")
        sizes.append(int.from_bytes(blob[offset + 8 : offset + 16], "little"))
    return sizes


def test_links_and_steps_by_collective_on_a_p2p_capture(api: Api, mfu_report: dict) -> None:
    run_id = api.new_run(name="mfu")
    response = api.post(f"/v1/runs/{run_id}/files", files=[("file", (MFU.name, MFU.read_bytes()))])
    assert response.status_code == 202, response.text
    assert api.wait(response.json()["job"]["url"])["status"] == "succeeded"

    links = api.get(f"/v1/runs/{run_id}/links").json()
    expected_types = [
        (r["rank"], t["collective"], t["count"], t["time_ns"], t["exposed_ns"], t["bytes"])
        for r in mfu_report["ranks"]
        for t in r["collectives_by_type"]["totals"]
    ]
    assert expected_types and {t[1] for t in expected_types} == {"SendRecv"}
    assert [
        (t["rank"], t["collective"], t["count"], t["time_ns"], t["exposed_ns"], t["bytes"])
        for t in links["collectives_by_type"]
    ] == expected_types
    assert all(t["step_index"] is None for t in links["collectives_by_type"])
    assert [t["issued_as"] for t in links["collectives_by_type"]] == [
        t["issued_as"] for r in mfu_report["ranks"] for t in r["collectives_by_type"]["totals"]
    ]
    assert all(t["issued_as"] == {"all_to_all": t["count"]} for t in links["collectives_by_type"])
    keys = ("rank", "peer", "kernels", "time_ns", "sends", "recvs", "bytes", "source")
    assert [tuple(p[k] for k in keys) for p in links["peers"]] == [
        tuple(p[k] for k in keys) for p in mfu_report["run"]["peer_matrix"]["rows"]
    ]
    assert [(p["rank"], p["peer"]) for p in links["peers"]] == [(0, 1), (1, 0)]

    # ?collective= is matched without regard to case; another type empties the tables.
    assert api.get(f"/v1/runs/{run_id}/links", params={"collective": "sendrecv"}).json()["peers"] == links["peers"]
    allreduce = api.get(f"/v1/runs/{run_id}/links", params={"collective": "AllReduce"}).json()
    assert allreduce["collectives_by_type"] == [] and allreduce["peers"] == [] and allreduce["collectives"] == []
    bad = api.get(f"/v1/runs/{run_id}/links", params={"collective": "AllShuffle"})
    assert bad.status_code == 422 and "AllReduce" in bad.text

    steps = api.get(f"/v1/runs/{run_id}/steps", params={"collective": "SendRecv"}).json()["steps"]
    with_sendrecv = {
        (r["rank"], row["step_index"]): row
        for r in mfu_report["ranks"]
        for row in r["collectives_by_type"]["steps"]
        if row["collective"] == "SendRecv"
    }
    assert steps and {(s["rank"], s["step_index"]) for s in steps} == set(with_sendrecv)
    for step in steps:
        (row,) = step["collectives"]
        expected = with_sendrecv[(step["rank"], step["step_index"])]
        assert (row["collective"], row["count"], row["time_ns"]) == ("SendRecv", expected["count"], expected["time_ns"])
    none = api.get(f"/v1/runs/{run_id}/steps", params={"collective": "AllReduce"}).json()["steps"]
    assert none == []


def test_allreduce_bytes_per_step_from_nvtx_payloads_through_the_api(api: Api, unpacked) -> None:
    """H200 DDP capture exported with --include-blobs=true: each step's AllReduce bytes are what
    NCCL's NVTX payload of that step's all-reduce says (decoded here by hand)."""
    run_id = api.analysed(P2P, P2P_FILES, profile="h200-nvlink")
    steps = api.get(f"/v1/runs/{run_id}/steps", params={"collective": "AllReduce"}).json()["steps"]
    assert len(steps) == 6  # 3 profiled steps on each of 2 ranks
    gradient = max(_allreduce_payloads(unpacked(P2P / "cap_0.sqlite.gz")))
    for step in steps:
        (row,) = step["collectives"]
        assert row["collective"] == "AllReduce" and row["count"] == 1 and row["bytes"] == gradient
    links = api.get(f"/v1/runs/{run_id}/links").json()
    assert links["peers"] == []
