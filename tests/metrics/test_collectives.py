"""Collectives by type and the rank × peer matrix on real captures (metrics/collectives.py).

Every expected number is computed here from the raw file: plain ``sqlite3`` for nsys exports,
plain ``json`` for Kineto traces.
"""

from __future__ import annotations

import gzip
import json
import re
import shutil
import sqlite3
import struct
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import OWN, public_kineto, public_nsys
from traceguard import model
from traceguard.ingest import load_run
from traceguard.metrics import collectives
from traceguard.metrics.run import RunResult, analyse_run

KERNEL_TYPE = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)")
P2P_NSYS = OWN / "h200" / "p2p_nsys"
#: NCCL's payload schemas in mfu_2gpu_before with a "Peer rank" field (ncclSend, ncclRecv).
SEND_SCHEMA, RECV_SCHEMA = 16777225, 16777226


def _analyse(paths: list[Path], sources: tuple[str, ...] | None = None) -> RunResult:
    run = load_run([str(p) for p in paths])
    return analyse_run([(r.rank, r.capture) for r in run.ranks], step_sources=sources)


def _sql(db: Path, query: str, params: tuple = ()) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(query, params).fetchall()
    finally:
        con.close()


def _sendrecv_by_device(db: Path) -> dict[int, tuple[int, int]]:
    """deviceId → (SendRecv kernels, Σ durations): one stream per device, so Σ = union."""
    rows = _sql(
        db,
        "SELECT k.deviceId, COUNT(*), SUM(k.end - k.start) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY k.deviceId",
    )
    return {device: (count, total) for device, count, total in rows}


@pytest.fixture(scope="module")
def mfu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("mfu") / "mfu_2gpu_before.sqlite"
    with gzip.open(public_nsys("mfu_2gpu_before"), "rb") as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


def test_mfu_sendrecv_per_rank_and_peer_matrix_in_window_mode(mfu: Path) -> None:
    """One file, two GPU processes: ranks 0 and 1 (in order of their devices). Nothing in the
    capture names a peer (no payload blobs), but a two-rank run leaves one: the other rank."""
    expected = _sendrecv_by_device(mfu)
    assert sorted(expected) == [0, 1] and all(count == 33 for count, _ in expected.values())
    result = _analyse([mfu], ("window",))
    for rank in result.ranks:
        count, total = expected[rank.rank]
        (row,) = rank.collectives_by_type["totals"]
        assert (row["collective"], row["count"], row["time_ns"]) == ("SendRecv", count, total)
        assert row["bytes"] is None and "include-blobs" in rank.collectives_by_type["null_reasons"]["bytes"]
        assert row["exposed_ns"] == rank.metrics["nccl_exposed_ns"]  # one type: the same exposed time
        assert rank.peers["null_reason"] is None
        (peer,) = rank.peers["rows"]
        assert (peer["rank"], peer["peer"]) == (rank.rank, 1 - rank.rank)
        assert (peer["kernels"], peer["time_ns"]) == (count, total)
        assert peer["source"] == collectives.PEER_FROM_TWO_RANKS and peer["sends"] is None and peer["bytes"] is None
    matrix = {(r["rank"], r["peer"]): r["kernels"] for r in result.peer_matrix["rows"]}
    assert matrix == {(0, 1): expected[0][0], (1, 0): expected[1][0]}
    (run_row,) = result.collectives_by_type
    assert run_row["count"] == sum(c for c, _ in expected.values()) and run_row["ranks"] == 2


def test_mfu_per_step_rows_add_up_to_what_the_steps_hold(mfu: Path) -> None:
    """With whatever steps the rank has (the capture has no marker), the per-step rows add up
    to the kernels attributed to steps, and never exceed the window totals."""
    result = _analyse([mfu])
    for rank in result.ranks:
        by_type = rank.collectives_by_type
        steps = by_type["steps"]
        if not rank.steps:
            assert steps == [] and "steps" in by_type["null_reasons"]
            continue
        assert {row["step_index"] for row in steps} <= {s["index"] for s in rank.steps}
        (total,) = by_type["totals"]
        assert 0 < sum(r["count"] for r in steps) <= total["count"]
        assert sum(r["time_ns"] for r in steps) <= total["time_ns"]
        # Per step, the SendRecv time is the step's NCCL time (the only NCCL kernels there).
        nccl = {s["index"]: s["nccl_ns"] for s in rank.steps}
        assert all(r["time_ns"] == nccl[r["step_index"]] for r in steps)


def _peer_blob(schema: int, size: int, peer: int) -> bytes:
    """nsys 2025.3's blob layout (seen in the H200 exports): header (count 1, schema id, payload
    size, payload offset 32), then NCCL's payload (communicator id, message size, peer rank)."""
    return struct.pack("<QQQQ", 1, schema, 24, 32) + struct.pack("<QQiI", 0xC0FFEE, size, peer, 0)


@pytest.fixture(scope="module")
def mfu_with_peers(mfu: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mfu_2gpu_before with NCCL payloads written into its ncclSend/ncclRecv rows (its export
    had no blobs): in each group the k-th send and recv name peer k (PyTorch's all_to_all order)."""
    db = tmp_path_factory.mktemp("peers") / "mfu_peers.sqlite"
    shutil.copy(mfu, db)
    con = sqlite3.connect(db)
    rows = con.execute(
        "SELECT e.rowid, e.globalTid, s.value FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE e.domainId = 1 ORDER BY e.globalTid, e.start"
    ).fetchall()
    position: Counter[tuple[int, str]] = Counter()
    for rowid, tid, name in rows:
        if name == "ncclGroupStart":
            position = Counter()
        elif name in ("ncclSend", "ncclRecv"):
            k = position[(tid, name)]
            position[(tid, name)] += 1
            schema, size = (SEND_SCHEMA, 1 << (20 + k)) if name == "ncclSend" else (RECV_SCHEMA, 3 << (20 + k))
            con.execute("UPDATE NVTX_EVENTS SET binaryData = ? WHERE rowid = ?", (_peer_blob(schema, size, k), rowid))
    con.commit()
    con.close()
    return db


def test_peers_from_nccl_payloads(mfu_with_peers: Path) -> None:
    db = mfu_with_peers
    # Expected by plain SQL: the calls on each launching thread up to its last NCCL kernel
    # launch belong to a kernel; rank = order of the process's lowest device.
    pids = _sql(
        db,
        "SELECT (globalPid >> 24) & 16777215 AS pid, MIN(deviceId) FROM CUPTI_ACTIVITY_KIND_KERNEL GROUP BY pid "
        "ORDER BY MIN(deviceId)",
    )
    rank_of = {pid: rank for rank, (pid, _) in enumerate(pids)}
    last_launch = dict(
        _sql(
            db,
            "SELECT r.globalTid, MAX(r.start) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
            "ON k.correlationId = r.correlationId AND k.globalPid = (r.globalTid >> 24) << 24 "
            "JOIN StringIds s ON s.id = k.shortName WHERE s.value LIKE 'ncclDevKernel_%' GROUP BY r.globalTid",
        )
    )
    calls = _sql(
        db,
        "SELECT e.globalTid, s.value, e.start, e.binaryData FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE e.domainId = 1 AND s.value IN ('ncclSend', 'ncclRecv')",
    )
    expected: dict[tuple[int, int], dict[str, int]] = {}
    for tid, name, start, blob in calls:
        if tid not in last_launch or start > last_launch[tid]:
            continue
        size, peer = struct.unpack_from("<Qi", blob, 32 + 8)
        cell = expected.setdefault((rank_of[(tid >> 24) & 0xFFFFFF], peer), Counter())
        cell["sends" if name == "ncclSend" else "recvs"] += 1
        cell["bytes"] += size
    assert set(expected) == {(0, 0), (0, 1), (1, 0), (1, 1)}

    result = _analyse([db], ("window",))
    kernels = _sendrecv_by_device(db)
    got = {(r["rank"], r["peer"]): r for r in result.peer_matrix["rows"]}
    assert set(got) == set(expected)
    for key, cell in expected.items():
        assert (got[key]["sends"], got[key]["recvs"]) == (cell["sends"], cell["recvs"])
        assert collectives.PEER_FROM_PAYLOAD in got[key]["source"]
        # A cell that also holds a kernel named by the two-rank rule has bytes nobody recorded.
        inferred = collectives.PEER_FROM_TWO_RANKS in got[key]["source"]
        assert got[key]["bytes"] == (None if inferred else cell["bytes"])
    for rank in (0, 1):
        # Every SendRecv kernel moved data to the other rank: named by its calls, or (the one
        # kernel launched before the capture's window) by the two-rank rule.
        assert got[(rank, 1 - rank)]["kernels"] == kernels[rank][0]
        assert got[(rank, rank)]["kernels"] < kernels[rank][0]
    assert result.peer_matrix["null_reason"] is None


def _kineto_kernels(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel" and str(e.get("name", "")).startswith("nccl")]


@pytest.mark.parametrize(
    "fragment",
    ["trace_diff__control", "sampled_rank-0", "sampled_rank-1", "nccl_parser_config"],
)
def test_kineto_counts_per_type(fragment: str) -> None:
    path = public_kineto(fragment)
    kernels = _kineto_kernels(path)
    expected = Counter(KERNEL_TYPE.match(e["name"]).group(1) for e in kernels)
    result = _analyse([path], ("window",))
    (rank,) = result.ranks
    got = {row["collective"]: row["count"] for row in rank.collectives_by_type["totals"]}
    assert got == dict(expected)
    durations = Counter()
    for e in kernels:
        durations[KERNEL_TYPE.match(e["name"]).group(1)] += round(float(e["dur"]) * 1000)
    for row in rank.collectives_by_type["totals"]:  # one NCCL stream: the union is the sum
        assert row["time_ns"] == pytest.approx(durations[row["collective"]], abs=len(kernels))


def test_kineto_p2p_without_named_peers_says_why() -> None:
    """HTA's sampled ranks of a 128-rank job: SendRecv kernels, no Dst/Src Rank args, and a
    communicator far larger than two, so the peer is not guessed."""
    for fragment in ("sampled_rank-0", "sampled_rank-1"):
        path = public_kineto(fragment)
        with gzip.open(path, "rt") as fh:
            trace = json.load(fh)
        assert not any("Dst Rank" in (e.get("args") or {}) for e in trace["traceEvents"])
        (rank,) = _analyse([path], ("window",)).ranks
        assert rank.peers["rows"] == []
        assert str(trace["distributedInfo"]["world_size"]) in rank.peers["null_reason"]
        assert "10 of 10 point-to-point kernels" in rank.peers["null_reason"]


def test_kineto_message_bytes_per_type() -> None:
    """HTA's nccl_data trace: bytes per type = Σ max(In, Out msg nelems) × dtype size from the args."""
    path = public_kineto("nccl_parser_config")
    sizes = {"Float": 4, "Half": 2, "BFloat16": 2, "Double": 8, "Int": 4, "Long": 8, "Byte": 1, "Char": 1}
    expected: Counter[str] = Counter()
    for e in _kineto_kernels(path):
        args = e["args"]
        nelems = max(int(args["In msg nelems"]), int(args["Out msg nelems"]))
        expected[KERNEL_TYPE.match(e["name"]).group(1)] += nelems * sizes[args["dtype"]]
    (rank,) = _analyse([path], ("window",)).ranks
    assert {r["collective"]: r["bytes"] for r in rank.collectives_by_type["totals"]} == dict(expected)


def _allreduce_payloads(db: Path) -> list[tuple[int, int]]:
    """(start, message size) of each ncclAllReduce range, decoded by hand from its blob."""
    out = []
    for start, blob in _sql(
        db,
        "SELECT e.start, e.binaryData FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId "
        "WHERE s.value = 'ncclAllReduce' ORDER BY e.start",
    ):
        offset = struct.unpack_from("<Q", blob, 24)[0]
        out.append((start, struct.unpack_from("<Q", blob, offset + 8)[0]))
    return out


def test_h200_allreduce_bytes_per_step_are_the_nvtx_payloads(unpacked) -> None:
    """The harness's DDP capture (exported with --include-blobs=true): each step's AllReduce
    bytes equal the payload of the all-reduce NCCL recorded in that step, and the gradient
    reduction is the all-reduce."""
    paths = [unpacked(P2P_NSYS / f"cap_{i}.sqlite.gz") for i in (0, 1)]
    result = _analyse(paths)
    for rank, db in zip(result.ranks, paths, strict=True):
        payloads = _allreduce_payloads(db)
        steps = rank.collectives_by_type["steps"]
        assert len(steps) == rank.metrics["step_count"] == 3
        spans = {s["index"]: (s["start_ns"], s["start_ns"] + s["cpu_ns"]) for s in rank.steps}
        for row in steps:
            lo, hi = spans[row["step_index"]]  # the step's own NVTX range: DDP calls NCCL inside it
            inside = [size for start, size in payloads if lo <= start < hi]
            assert row["collective"] == "AllReduce" and row["count"] == len(inside) == 1
            assert row["bytes"] == inside[0]
        gradient = max(size for _, size in payloads)
        assert rank.metrics["gradient_reduction_collective"] == "AllReduce"
        assert rank.metrics["gradient_reduction_bytes_per_step"] == gradient
        assert rank.metrics["dtod_to_gradient_ratio"] == pytest.approx(rank.metrics["dtod_bytes_per_step"] / gradient)
        # One collective type: its exposed time is the rank's exposed NCCL time.
        (total,) = rank.collectives_by_type["totals"]
        assert total["exposed_ns"] == rank.metrics["nccl_exposed_ns"]
        assert rank.peers == {"rows": [], "null_reason": "no point-to-point (send/recv) kernels in the analysis window"}


def test_gradient_reduction_picks_the_collective_carrying_more_bytes() -> None:
    """FSDP: reduce-scatter carries the gradients, a small all-reduce (the grad norm) does not."""
    ops = pl.DataFrame(
        {
            "collective": ["ReduceScatter", "ReduceScatter", "AllReduce", "AllGather"],
            "msg_bytes": [1 << 30, 1 << 30, 4, 1 << 31],
        }
    )
    assert collectives.gradient_reduction(ops, 2) == ("ReduceScatter", float(1 << 30), None)
    unknown = ops.with_columns(pl.lit(None, dtype=pl.Int64).alias("msg_bytes"))
    name, size, reason = collectives.gradient_reduction(unknown, 2)
    assert name is None and size is None and "include-blobs" in str(reason)
    assert collectives.gradient_reduction(ops.filter(pl.col("collective") == "AllGather"), 2)[2] == (
        "no all-reduce or reduce-scatter kernels inside the steps"
    )


def _brute_covered(ops: pl.DataFrame, keep: list[bool], queries: list[tuple[int, int, int]]) -> list[int]:
    busy: dict[int, set[int]] = {}
    for row, kept in zip(ops.iter_rows(named=True), keep, strict=True):
        if kept and row["kind"] == "kernel" and not row["is_nccl"]:
            busy.setdefault(row["device"], set()).update(range(row["start"], row["end"]))
    return [len(busy.get(d, set()) & set(range(a, b))) for d, a, b in queries]


@pytest.mark.parametrize("layout", ["one device in start order", "two devices out of order"])
def test_compute_cover_measures_overlap_exactly(layout: str) -> None:
    """Covered time of query intervals against overlapping compute kernels, with NCCL kernels,
    a copy and a kernel outside the window among them, checked nanosecond by nanosecond."""
    rows = [  # kind, is_nccl, device, start, end, in window
        ("kernel", False, 0, 0, 12, True),
        ("kernel", False, 0, 5, 40, True),
        ("kernel", True, 0, 20, 70, True),  # NCCL: not compute
        ("kernel", False, 0, 30, 35, True),
        ("memcpy", False, 0, 45, 60, True),  # a copy: not compute
        ("kernel", False, 0, 50, 58, False),  # outside the window
        ("kernel", False, 0, 62, 90, True),
        ("kernel", False, 0, 95, 99, True),
    ]
    if layout != "one device in start order":
        rows = [*rows[::-1], ("kernel", False, 1, 10, 30, True), ("kernel", False, 1, 0, 15, True)]
    ops = pl.DataFrame(rows, schema=["kind", "is_nccl", "device", "start", "end", "window"], orient="row").with_columns(
        pl.col("kind").cast(model.OpKind), pl.col("device").cast(pl.Int32)
    )
    mask = ops["window"]
    cover = collectives.compute_cover(ops, mask)
    queries = [(0, 0, 100), (0, 20, 70), (0, 36, 44), (0, 40, 63), (0, 99, 120), (1, 5, 25), (1, 0, 100)]
    device, start, end = (np.array(col) for col in zip(*queries, strict=True))
    assert cover.covered(device, start, end).tolist() == _brute_covered(ops, mask.to_list(), queries)


def _kineto_p2p_trace(rank: int, peers: list[object]) -> dict:
    """A PyTorch >= 2.4 profiler trace (factory: no public trace has P2P args): one rank of a
    4-rank job, one SendRecv kernel per send/recv, args as the profiler writes them."""
    events: list[dict] = []
    for i, peer in enumerate(peers):
        send = i % 2 == 0
        ts = 1000.0 + 100 * i
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 7, "tid": 7, "ts": ts, "dur": 5,
             "args": {"correlation": 100 + i}}
        )  # fmt: skip
        args = {
            "device": rank, "stream": 20, "correlation": 100 + i, "Collective name": "send" if send else "recv",
            "In msg nelems": 1024 * (i + 1), "Out msg nelems": 1024 * (i + 1), "Group size": 4, "dtype": "Float",
            "Process Group Ranks": "[0, 1, 2, 3]", ("Dst Rank" if send else "Src Rank"): peer,
        }  # fmt: skip
        events.append(
            {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)",
             "pid": rank, "tid": 20, "ts": ts + 10, "dur": 50 + i, "args": args}
        )  # fmt: skip
    return {"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": 4},
            "traceEvents": events}  # fmt: skip


def test_kineto_peers_from_dst_and_src_rank_args(tmp_path: Path) -> None:
    peers = {0: [1, "1", 3, 2], 1: [0, 0]}  # numbers, or their text as some versions write them
    paths = []
    for rank, named in peers.items():
        path = tmp_path / f"rank{rank}.json"
        path.write_text(json.dumps(_kineto_p2p_trace(rank, named)))
        paths.append(path)
    result = _analyse(paths, ("window",))
    expected: dict[tuple[int, int], Counter] = {}
    for rank, named in peers.items():
        for i, peer in enumerate(named):
            cell = expected.setdefault((rank, int(peer)), Counter())
            cell["kernels"] += 1
            cell["time_ns"] += (50 + i) * 1000
            cell["bytes"] += 1024 * (i + 1) * 4
    got = {(r["rank"], r["peer"]): r for r in result.peer_matrix["rows"]}
    assert set(got) == set(expected)
    for key, cell in expected.items():
        row = got[key]
        assert (row["kernels"], row["time_ns"], row["bytes"]) == (cell["kernels"], cell["time_ns"], cell["bytes"])
        assert row["source"] == collectives.PEER_FROM_KINETO and row["sends"] is None
    assert result.peer_matrix["null_reason"] is None


def test_mfu_sendrecv_kernels_are_issued_by_all_to_all(mfu: Path) -> None:
    """Each SendRecv kernel whose launch lies inside PyTorch's ``nccl:all_to_all`` NVTX range (on
    the launching thread) counts as issued by all_to_all: by plain SQL, per device."""
    rows = _sql(
        mfu,
        "SELECT k.deviceId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
        "AND (r.globalTid >> 24) << 24 = k.globalPid "
        "WHERE s.value LIKE 'ncclDevKernel_SendRecv%' AND EXISTS (SELECT 1 FROM NVTX_EVENTS e "
        "WHERE e.globalTid = r.globalTid AND e.text LIKE 'nccl:all_to_all%' "
        "AND e.start <= r.start AND e.end >= r.start) "
        "GROUP BY k.deviceId",
    )
    expected = dict(rows)
    assert expected and all(n > 0 for n in expected.values())
    result = _analyse([mfu], ("window",))
    for rank in result.ranks:
        (row,) = rank.collectives_by_type["totals"]
        assert row["issued_as"] == {"all_to_all": expected[rank.rank]}
    assert result.collectives_by_type[0]["issued_as"] == {"all_to_all": sum(expected.values())}


def test_hta_kineto_operations_from_user_annotations() -> None:
    """HTA's control trace: kernels whose launch (same correlation) lies in a ``nccl:<op>``
    user annotation on the launching thread, counted with plain json."""
    path = public_kineto("trace_diff__control")
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    launches = {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") == "cuda_runtime" and e.get("ph") == "X" and "correlation" in (e.get("args") or {})
    }
    annotations = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    expected: Counter[tuple[str, str]] = Counter()
    for kernel in _kineto_kernels(path):
        launch = launches[kernel["args"]["correlation"]]
        t = float(launch["ts"])
        inside = [
            a
            for a in annotations
            if a["tid"] == launch["tid"] and float(a["ts"]) <= t <= float(a["ts"]) + float(a["dur"])
        ]
        if inside:
            innermost = max(inside, key=lambda a: float(a["ts"]))
            expected[(KERNEL_TYPE.match(kernel["name"]).group(1), innermost["name"].removeprefix("nccl:"))] += 1
    (rank,) = _analyse([path], ("window",)).ranks
    got = Counter(
        {(row["collective"], op): n for row in rank.collectives_by_type["totals"] for op, n in row["issued_as"].items()}
    )
    assert got == expected and expected[("SendRecv", "all_to_all")] == 42


def test_kineto_sizes_from_nccl_annotations_when_kernels_carry_none() -> None:
    """HTA's control trace (an older PyTorch: no collective args on kernels): each kernel's size
    is its ``nccl:all_reduce``/``nccl:all_to_all`` annotation's first input, elements × element
    size, as plain json gives it; the AllReduce payload per step follows."""
    path = public_kineto("trace_diff__control")
    with gzip.open(path, "rt") as fh:
        events = json.load(fh)["traceEvents"]
    element = {"float": 4, "int": 4, "long": 8, "unsigned char": 1, "signed char": 1}
    launches = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime" and "args" in e}
    annotations = [e for e in events if e.get("cat") == "user_annotation" and e["name"].startswith("nccl:")]
    expected: Counter[str] = Counter()
    for kernel in _kineto_kernels(path):
        assert "In msg nelems" not in kernel["args"]
        launch = launches[kernel["args"]["correlation"]]
        t = launch["ts"]
        (note,) = [a for a in annotations if a["tid"] == launch["tid"] and a["ts"] <= t <= a["ts"] + a["dur"]]
        dims, kind = note["args"]["Input Dims"][0], note["args"]["Input type"][0]
        expected[KERNEL_TYPE.match(kernel["name"]).group(1)] += element[kind] * int(np.prod(dims))
    (rank,) = _analyse([path], ("window",)).ranks
    assert {r["collective"]: r["bytes"] for r in rank.collectives_by_type["totals"]} == dict(expected)
    assert rank.metrics["gradient_reduction_collective"] == "AllReduce"
    per_step = rank.metrics["gradient_reduction_bytes_per_step"]
    assert per_step == expected["AllReduce"] / rank.metrics["step_count"]


def test_allgather_and_reducescatter_payloads_are_one_ranks_share() -> None:
    """NCCL's NVTX payload is AllGather's send size and ReduceScatter's receive size (NCCL's
    collectives.cc); msg_bytes counts the larger buffer (nccl-tests), so those are × n."""
    from traceguard.metrics.rank import _with_nccl_payload

    calls = ["ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast"]
    ranges = pl.DataFrame(
        {
            "pid": [1] * 4,
            "tid": [1] * 4,
            "start": [0, 100, 200, 300],
            "end": [50, 150, 250, 350],
            "name": calls,
            "domain": ["NCCL"] * 4,
            "payload_bytes": [4096, 1024, 1024, 512],
        }
    )
    ops = pl.DataFrame(
        {
            "is_nccl": [True] * 4,
            "msg_bytes": pl.Series([None] * 4, dtype=pl.Int64),
            "pid": [1] * 4,
            "launch_tid": [1] * 4,
            "launch_start": [10, 110, 210, 310],
        }
    )
    assert _with_nccl_payload(ops, ranges, group_size=8)["msg_bytes"].to_list() == [4096, 8192, 8192, 512]
    unknown = _with_nccl_payload(ops, ranges, group_size=None)["msg_bytes"].to_list()
    assert unknown == [4096, None, None, 512]


def _gradient_frame(rows: list[tuple[str, int, int | None]]) -> pl.DataFrame:
    schema = {"collective": pl.String, "msg_bytes": pl.Int64, "phase_id": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


PHASES = {1: "forward", 2: "backward", 3: "optimizer step"}


def test_a_gradient_all_reduce_runs_outside_the_forward_pass() -> None:
    """DDP's bucket all-reduces run in backward (or on the autograd thread, with no phase); a loss
    all-reduced in forward is under FORWARD_SHARE of the payload and changes nothing."""
    ddp = _gradient_frame([("AllReduce", 100, 2), ("AllReduce", 100, None), ("AllReduce", 4, 1)])
    assert collectives.gradient_reduction(ddp, 2, PHASES) == ("AllReduce", 102.0, None)
    assert collectives.gradient_reduction(ddp, 2, None) == ("AllReduce", 102.0, None)


@pytest.mark.parametrize("name", ["forward", "model forward", "DeepSpeedEngine.forward", "fwd, op_id = 7", "Forward"])
def test_all_reduces_in_the_forward_pass_are_not_gradients(name: str) -> None:
    """Tensor parallelism all-reduces activations in forward (and their gradients in backward):
    with a tenth or more of the carrier's payload launched in a forward phase it is no gradient
    payload; a phase merely containing the letters (`forwarding`, `fwdx`) is not forward."""
    tp = _gradient_frame([("AllReduce", 8, 1), ("AllReduce", 8, 1), ("AllReduce", 8, None)])
    carrier, payload, reason = collectives.gradient_reduction(tp, 1, {1: name})
    assert carrier == "AllReduce" and payload is None
    assert reason is not None and "67% of the AllReduce payload is launched in the forward pass" in reason
    for other in ("forwarding", "fwdx", "backward"):
        assert collectives.gradient_reduction(tp, 1, {1: other}) == ("AllReduce", 24.0, None)


def test_the_tensor_parallel_run_s_copies_are_not_judged_against_its_activations(tmp_path: Path) -> None:
    """The 2×H200 tensor-parallel bundle (torch 2.11, RowwiseParallel/ColwiseParallel): plain SQL
    puts 4 of the step's 7 all-reduce launches inside its `forward` range on the main thread
    (the other 3 on the autograd thread during `backward`). Its DtoD copies equal its all-reduce
    payload; DDP's remedy for them (`gradient_as_bucket_view`) does not apply, so the gradient
    payload is null with the forward share as reason and `dtod_copy_volume` skips."""
    bundle = OWN / "seed_studies" / "seed001-002_2gpu_p2p" / "tensor_parallel"
    db = tmp_path / "cap_0.sqlite"
    with gzip.open(bundle / "cap_0.sqlite.gz") as src, db.open("wb") as out:
        shutil.copyfileobj(src, out)
    query = (
        "WITH r AS (SELECT n.start, n.end, n.globalTid, coalesce(n.text, s.value) AS name FROM NVTX_EVENTS n "
        "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59), "
        "k AS (SELECT rt.start AS ls, rt.globalTid AS tid FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName "
        "JOIN CUPTI_ACTIVITY_KIND_RUNTIME rt ON rt.correlationId = k.correlationId "
        "WHERE s.value LIKE 'ncclDevKernel_AllReduce%') "
        "SELECT (SELECT count(*) FROM k WHERE k.ls >= f.start AND k.ls < f.end AND k.tid = f.globalTid), "
        "(SELECT count(*) FROM k, r b WHERE b.name LIKE 'Batch %' AND k.ls >= b.start AND k.ls < b.end) "
        "FROM r f WHERE f.name = 'forward'"
    )
    ((in_forward, in_step),) = _sql(db, query)
    assert (in_forward, in_step) == (4, 7)
    from traceguard.pipeline import analyze

    report = analyze([str(bundle)]).report
    for rank in report["ranks"]:
        reason = rank["metrics"]["null_reasons"]["gradient_reduction_bytes_per_step"]
        assert rank["metrics"]["gradient_reduction_bytes_per_step"] is None
        assert reason.startswith(f"{in_forward / in_step:.0%} of the AllReduce payload is launched in the forward pass")
    check = {c["id"]: c for c in report["checks"]}["dtod_copy_volume"]
    assert check["status"] == "skip" and "forward pass" in check["reason"]
