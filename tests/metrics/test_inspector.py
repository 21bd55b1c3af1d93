"""Cross-rank metrics from NCCL Inspector logs (traceguard.metrics.inspector) on the real 2×H100
FSDP2 dumps of ../shared/fixtures/nccl-inspector. Every expected value is computed here with plain
``json.loads`` over the same lines, following docs/inspector.md."""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from pathlib import Path

import pytest

from tests.conftest import SHARED
from traceguard.ingest.nccl_inspector import read_inspector
from traceguard.metrics.inspector import TOGETHER_NS, TOGETHER_SHARE, analyse_inspector

FIXTURES = SHARED / "fixtures" / "nccl-inspector"
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/nccl-inspector not present")


def _files(run: str) -> list[Path]:
    return sorted(FIXTURES.glob(f"fsdp2_{run}_rank*.log.gz"))


def exec_times(paths: list[Path]) -> dict[tuple, dict[int, int]]:
    """Plain ``json.loads`` of Inspector JSON-lines files: instances by (comm id, coll, coll_sn) →
    {rank: execution ns}."""
    instances: dict[tuple, dict[int, int]] = {}
    for path in paths:
        with gzip.open(path, "rt") as fh:
            for line in fh:
                doc = json.loads(line)
                perf = doc["coll_perf"]
                key = (doc["header"]["id"], perf["coll"], perf["coll_sn"])
                instances.setdefault(key, {})[doc["header"]["rank"]] = perf["coll_exec_time_us"] * 1000
    return instances


def _plain(run: str) -> dict:
    """Instances by (comm id, coll, coll_sn) → {rank: exec ns}, and each rank's lines' sums."""
    instances = exec_times(_files(run))
    wait: Counter = Counter()
    transfer: Counter = Counter()
    last: Counter = Counter()
    held: Counter = Counter()  # the members' waits at the instances each rank arrived last at
    together = 0
    for times in instances.values():
        shortest = min(times.values())
        for rank, ns in times.items():
            wait[rank] += ns - shortest
            transfer[rank] += shortest
        spread = max(times.values()) - shortest  # arrival = common end − exec
        if spread <= max(TOGETHER_NS, TOGETHER_SHARE * shortest):
            together += 1
        else:
            late = min(times, key=lambda r: (times[r], -r))
            last[late] += 1
            held[late] += sum(ns - shortest for ns in times.values())
    return {
        "instances": instances,
        "wait": wait,
        "transfer": transfer,
        "last": last,
        "held": held,
        "together": together,
    }


@pytest.mark.parametrize("run", ["p2p", "shm"])
def test_split_matches_plain_json(run: str) -> None:
    expected = _plain(run)
    result = analyse_inspector(read_inspector(_files(run)))
    m = result.metrics
    assert m["collective_instances_matched"] == len(expected["instances"]) == 540
    assert m["collective_instances_unmatched"] == 0
    assert m["nccl_wait_ns"] == sum(expected["wait"].values())
    assert m["nccl_transfer_ns"] == sum(expected["transfer"].values())
    for row in result.per_rank:
        assert row["nccl_wait_ns"] == expected["wait"][row["rank"]]
        assert row["nccl_transfer_ns"] == expected["transfer"][row["rank"]]
        assert row["last_arrivals"]["count"] == expected["last"][row["rank"]]
        if result.late is not None:
            assert row["last_arrivals"]["held_up_ns"] == expected["held"][row["rank"]]
    if result.late is not None:
        costliest = max(sorted(expected["held"]), key=lambda r: expected["held"][r])
        other = result.late["longest_held_up_by"]
        assert (other["rank"] if other else result.late["rank"]) == costliest
    assert result.arrival_source == "shortest execution time"
    # Per rank and type: the plugin's numbers, summed.
    by_type = {(r["rank"], r["coll"]): r for r in result.by_type}
    assert {k: v["count"] for k, v in by_type.items()} == {
        (0, "AllGather"): 360,
        (0, "ReduceScatter"): 180,
        (1, "AllGather"): 360,
        (1, "ReduceScatter"): 180,
    }


def test_p2p_run_names_the_rank_last_to_arrive_most_often() -> None:
    expected = _plain("p2p")
    result = analyse_inspector(read_inspector(_files("p2p")))
    late_rank, count = expected["last"].most_common(1)[0]
    assert result.metrics["late_rank"] == late_rank == 0
    assert result.late["last_arrivals"] == count
    # Read per rank, the waiting rank's lines look like a slow link: its median execution time is
    # far above the transfer, its plugin busbw far below the transfer-time busbw.
    waiting = next(r for r in result.by_type if r["rank"] == 1 and r["coll"] == "AllGather")
    transfer = next(r for r in result.transfer if r["coll"] == "AllGather")
    assert waiting["exec_median_ns"] > 2 * transfer["transfer_median_ns"]
    assert waiting["busbw_median_gbps"] < 0.5 * transfer["busbw_transfer_median_gbps"]
    assert result.metrics["nccl_wait_share"] > 0.5


def test_shm_run_is_mostly_transfer_both_ranks_arrive_together() -> None:
    expected = _plain("shm")
    result = analyse_inspector(read_inspector(_files("shm")))
    m = result.metrics
    assert m["nccl_transfer_ns"] / (m["nccl_wait_ns"] + m["nccl_transfer_ns"]) > 0.9
    assert result.late["instances_together"] == expected["together"]
    assert expected["together"] / 540 > 0.9
    # The typical instance has no wait at all beyond the µs noise.
    waits = [max(t.values()) - min(t.values()) for t in expected["instances"].values()]
    assert statistics.median(waits) <= TOGETHER_NS


def test_a_rank_file_cut_short_leaves_its_last_instances_unmatched(tmp_path: Path) -> None:
    rank0, rank1 = _files("p2p")
    lines = gzip.decompress(rank1.read_bytes()).splitlines(keepends=True)
    short = tmp_path / "rank1.log"
    short.write_bytes(b"".join(lines[:500]))
    result = analyse_inspector(read_inspector([rank0, short]))
    assert result.metrics["collective_instances_matched"] == 500
    assert result.metrics["collective_instances_unmatched"] == 40


def test_one_rank_alone_gives_no_split_with_the_reason() -> None:
    result = analyse_inspector(read_inspector(_files("p2p")[:1]))
    assert result.metrics["nccl_wait_share"] is None
    assert "two ranks" in result.null_reasons["nccl_wait_share"]
    assert len(result.by_type) == 2  # the per-rank numbers are still there


def test_windows_and_bandwidth_on_transfer_time() -> None:
    result = analyse_inspector(read_inspector(_files("p2p")), window_s=1, peak_busbw_gbps=400.0)
    assert sum(w["instances"] for w in result.windows) == 540
    assert result.metrics["matched_steps"] == len(result.windows) >= 1
    assert result.window_time == "dump timestamp"
    # The transfer-time busbw of an instance is the plugin busbw of the rank that did not wait.
    instances = _plain("p2p")["instances"]
    assert result.metrics["allreduce_largest_bytes"] == 33562624
    assert result.metrics["p2p_utilization"] == pytest.approx(result.metrics["allreduce_peak_busbw_gbps"] / 400.0)
    assert len(instances) == sum(r["instances"] for r in result.transfer)
    assert result.null_reasons["exposed_wait_share"].startswith("NCCL Inspector logs hold only")
