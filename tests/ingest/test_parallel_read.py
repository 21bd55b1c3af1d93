"""The two-process read of big nsys exports gives exactly the single-process result.

Big captures have their CUDA API rows read partly by a worker process (``nsys_sqlite``'s
``start_api_calls``); here the threshold is lowered so the public fixtures take that path, and
the frames are compared with a plain in-process read of the same file.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import OWN, PUBLIC_NSYS, public_nsys
from traceguard.ingest import nsys_sqlite
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite

FRAMES = ("gpu_ops", "api_calls", "ranges", "devices", "processes", "strings")
CASES = [public_nsys("h100_2gpu_1s"), public_nsys("saxpy"), OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"]


def force_worker(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Make every read use the worker process; returns the commands it was started with."""
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    return record_spawns(monkeypatch)


def record_spawns(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The commands of the worker processes reads start from now on (they still run)."""
    spawned: list[list[str]] = []
    real_popen = nsys_sqlite.subprocess.Popen

    def popen(command, **kwargs):
        spawned.append(command)
        return real_popen(command, **kwargs)

    monkeypatch.setattr(nsys_sqlite.subprocess, "Popen", popen)
    return spawned


def _serial(db: Path, monkeypatch: pytest.MonkeyPatch):
    with monkeypatch.context() as m:
        m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 10**18)
        return read_nsys_sqlite(db)


@pytest.mark.parametrize("gz", CASES, ids=lambda p: p.name)
@pytest.mark.parametrize("share", [0.0, 0.5, 1.0])
def test_worker_read_is_identical(gz: Path, share: float, unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    db = unpacked(gz)
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "WORKER_SHARE", share)
    spawned = force_worker(monkeypatch)
    parallel = read_nsys_sqlite(db)
    assert spawned, "the worker was not used"
    for name in FRAMES:
        assert getattr(parallel, name).equals(getattr(serial, name)), name


def test_failed_worker_falls_back(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    db = unpacked(public_nsys("h100_2gpu_1s"))
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    monkeypatch.setattr(nsys_sqlite, "_WORKER_CODE", "import sys; sys.exit(3)")
    again = read_nsys_sqlite(db)
    for name in FRAMES:
        assert getattr(again, name).equals(getattr(serial, name)), name


def test_every_public_fixture_splits_the_same(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nsys_sqlite, "_free_cores", lambda: 2)
    for gz in PUBLIC_NSYS:
        db = unpacked(gz)
        serial = _serial(db, monkeypatch)
        with monkeypatch.context() as m:
            m.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
            parallel = read_nsys_sqlite(db)
        assert parallel.api_calls.equals(serial.api_calls), gz.name


def test_a_read_that_shares_its_cores_starts_no_worker(unpacked, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where as many map processes as cores read at once (``share_cores``), a read keeps to its
    one core: no second process, and the same frames as the read that starts one."""
    db = unpacked(public_nsys("h100_2gpu_1s"))
    serial = _serial(db, monkeypatch)
    monkeypatch.setattr(nsys_sqlite, "PARALLEL_API_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    monkeypatch.setattr(nsys_sqlite, "_core_sharers", 1)  # restored after the test
    spawned = record_spawns(monkeypatch)
    alone = read_nsys_sqlite(db)
    assert len(spawned) == 1, "alone on two cores, the read starts its worker"
    nsys_sqlite.share_cores(2)
    assert nsys_sqlite._free_cores() == 1
    shared = read_nsys_sqlite(db)
    assert len(spawned) == 1, "sharing two cores with another map, the read starts none"
    for name in FRAMES:
        assert getattr(shared, name).equals(getattr(serial, name)), name
        assert getattr(alone, name).equals(getattr(serial, name)), name
    nsys_sqlite.share_cores(0)  # nonsense counts as alone
    assert nsys_sqlite._free_cores() == 2
