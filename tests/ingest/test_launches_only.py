"""The launches-only nsys read (what the analysis uses) against the full read.

``read_nsys_sqlite(..., launches_only=True)`` reads only the CUDA calls that can launch GPU work
and joins them to the ops in the reader. On every real capture the ops, their launch columns and
the whole analysis must come out exactly as from the full read joined afterwards; an op launched
by a call outside the name pattern must still find its launch (re-read by correlation id, or the
whole API tables when there are many such ops).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN, PUBLIC_NSYS
from tests.ingest.test_parallel_read import force_worker
from traceguard import model
from traceguard.ingest import nsys_sqlite, read_capture
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite
from traceguard.metrics.run import analyse_run

OWN_NSYS = sorted(OWN.glob("h200*/*/cap_*.sqlite.gz"))
CAPTURES = PUBLIC_NSYS + OWN_NSYS
LAUNCH = list(model.LAUNCH_SCHEMA)


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _ident(path: Path) -> str:
    return f"{path.parent.parent.name}/{path.parent.name}/{path.name}"


def _same_as_full(db: Path) -> model.Capture:
    """Read ``db`` both ways and check that the launches-only read is the full read joined."""
    full = read_nsys_sqlite(db)
    fast = read_nsys_sqlite(db, launches_only=True)
    assert fast.api_calls.height == 0
    assert fast.gpu_ops.columns == [*model.GPU_OPS_SCHEMA, *LAUNCH]
    assert fast.gpu_ops.schema == pl.Schema({**model.GPU_OPS_SCHEMA, **model.LAUNCH_SCHEMA})
    joined = model.join_launches(full.gpu_ops, full.api_calls)
    assert fast.gpu_ops.equals(joined)
    for name in ("ranges", "devices", "processes", "strings"):
        assert getattr(fast, name).equals(getattr(full, name)), name
    assert fast.info == full.info
    return fast


def _results(capture: model.Capture) -> tuple:
    result = analyse_run([(0, capture)])
    # Offenders tied on (copies, bytes) come in no fixed order (nor does the cut at 5 among
    # them pick fixed ones): compare what is not tied.
    ranks = [
        (
            r.metrics,
            r.null_reasons,
            r.steps,
            r.collectives.to_dicts(),
            sorted((o["copies"], o["bytes"]) for o in r.gpu_to_cpu_offenders),
            r.health,
        )
        for r in result.ranks
    ]
    return result.metrics, result.null_reasons, ranks


@pytest.mark.parametrize("gz", CAPTURES, ids=[_ident(p) for p in CAPTURES])
def test_launches_only_matches_full_read(gz: Path, unpacked) -> None:
    db = unpacked(gz)
    fast = _same_as_full(db)
    full = read_nsys_sqlite(db)
    fast_results, full_results = _results(fast), _results(full)
    # The health count of API rows is the only number that differs: the fast read holds none.
    for rank_fast, rank_full in zip(fast_results[2], full_results[2], strict=True):
        rank_fast[5].pop("api_calls")
        rank_full[5].pop("api_calls")
    assert fast_results == full_results


def test_analysis_reads_launches_only(unpacked) -> None:
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    capture = read_capture(db)
    assert capture.api_calls.height == 0
    assert all(c in capture.gpu_ops.columns for c in LAUNCH)
    assert capture.gpu_ops["launch_start"].null_count() == 0


def _renamed(db: Path, tmp_path: Path, renames: dict[str, str]) -> Path:
    """A copy of ``db`` whose StringIds entries read as ``renames`` says (calls outside the pattern)."""
    copy = tmp_path / f"renamed-{db.name}"
    shutil.copyfile(db, copy)
    with sqlite3.connect(copy) as conn:
        for old, new in renames.items():
            changed = conn.execute("UPDATE StringIds SET value = ? WHERE value = ?", (new, old)).rowcount
            assert changed == 1, old
    return copy


@pytest.mark.parametrize("walk", [True, False])
def test_op_launched_outside_the_pattern(walk: bool, unpacked, tmp_path: Path, monkeypatch) -> None:
    """513 memsets launched by a renamed call: re-read by id, by the b-tree walk or (no walk, the
    IN lists few) by SQLite's rowid-chunk pass matched in memory."""
    if not walk:
        monkeypatch.setattr(nsys_sqlite._Reader, "api_table_walked", lambda self, table, rows: None)
        monkeypatch.setattr(nsys_sqlite, "IN_LISTS", 0)
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    copy = _renamed(db, tmp_path, {"cudaMemsetAsync_v3020": "someUnlistedCall_v1"})
    fast = _same_as_full(copy)
    memsets = fast.gpu_ops.filter(pl.col("kind") == "memset")
    assert memsets.height == 513 and memsets["launch_start"].null_count() == 0
    names = fast.name_of()
    assert {names[i] for i in memsets["launch_name_id"].unique().to_list()} == {"someUnlistedCall_v1"}
    assert _results(fast)[0] == _results(read_nsys_sqlite(db, launches_only=True))[0]


def test_every_launch_name_renamed(unpacked, tmp_path: Path) -> None:
    """No launch call left inside the pattern at all: everything comes from the re-read."""
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    names = ("cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC_v11060", "cudaLaunchKernel_v7000")
    names += ("cudaMemcpyAsync_v3020", "cudaMemsetAsync_v3020")
    copy = _renamed(db, tmp_path, {name: f"unlisted{i}" for i, name in enumerate(names)})
    fast = _same_as_full(copy)
    assert fast.gpu_ops["launch_start"].null_count() == 0


@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_worker_split_in_launches_only_mode(share: float, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    with monkeypatch.context() as m:
        m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 10**18)
        serial = read_nsys_sqlite(db, launches_only=True)
    monkeypatch.setattr(nsys_sqlite, "LAUNCHES_WORKER_SHARE", share)
    spawned = force_worker(monkeypatch)
    parallel = read_nsys_sqlite(db, launches_only=True)
    assert spawned, "the worker was not used"
    assert parallel.gpu_ops.equals(serial.gpu_ops)


def _edited(db: Path, tmp_path: Path, name: str, statements: list[str]) -> Path:
    copy = tmp_path / f"{name}-{db.name}"
    shutil.copyfile(db, copy)
    with sqlite3.connect(copy) as conn:
        for statement in statements:
            assert conn.execute(statement).rowcount >= 1, statement
    return copy


def _plain_pid_device(db: Path, table: str) -> list[tuple[int | None, int]]:
    """(pid, device) per row of ``table`` in table order, by plain SQL (nsys's GlobalId layout)."""
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT (globalPid >> 24) & 16777215, deviceId FROM {table} ORDER BY rowid").fetchall()


FIRST_KERNEL = "(SELECT min(rowid) FROM CUPTI_ACTIVITY_KIND_KERNEL)"


@pytest.mark.parametrize(
    "edit",
    [
        # a null globalPid: the op's pid is null
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL WHERE rowid = {FIRST_KERNEL}",
        # a device id above 24 bits (nsys's own ids are small)
        f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = {1 << 25} WHERE rowid = {FIRST_KERNEL}",
    ],
    ids=["null-globalPid", "device-above-24-bits"],
)
def test_pid_and_device_as_plain_sql_reads_them(edit: str, unpacked, tmp_path: Path) -> None:
    """Every GPU op carries exactly the pid and device the two columns say, including a null
    pid and a device id wider than nsys's own (pid comes from ``globalPid`` by bit arithmetic)."""
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    copy = _edited(db, tmp_path, "pid-device", [edit])
    kernels = read_nsys_sqlite(copy, launches_only=True).gpu_ops.filter(pl.col("kind") == "kernel")
    assert list(zip(kernels["pid"].to_list(), kernels["device"].to_list(), strict=True)) == _plain_pid_device(
        copy, "CUPTI_ACTIVITY_KIND_KERNEL"
    )


def test_launch_with_correlation_id_beyond_32_bits(unpacked, tmp_path: Path) -> None:
    """A correlation id beyond 32 bits (CUPTI's own are 32-bit): the launches-only read still
    joins the op to its launch, as the full read does."""
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    big = (1 << 32) + 7
    with sqlite3.connect(db) as conn:
        (correlation,) = conn.execute(
            f"SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE rowid = {FIRST_KERNEL}"
        ).fetchone()
    copy = _edited(
        db,
        tmp_path,
        "big-correlation",
        [
            f"UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET correlationId = {big} WHERE correlationId = {correlation}",
            f"UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET correlationId = {big} WHERE correlationId = {correlation}",
        ],
    )
    fast = _same_as_full(copy)
    moved = fast.gpu_ops.filter(pl.col("correlation_id") == big)
    assert moved.height >= 1 and moved["launch_start"].null_count() == 0
