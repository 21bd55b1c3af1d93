"""Rank resolution of ``traceguard.ingest.load_run`` (DESIGN.md "Ranks").

Order of precedence: ``FILE:RANK``; the bundle manifest; the file itself (Kineto
``distributedInfo.rank``, the ``RANK`` nsys recorded); a number in the file name; the position
(with a warning). Expected ranks are read from the files here with plain ``json`` / ``sqlite3``.
"""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import OWN, public_nsys
from traceguard.errors import NoUsableInputError
from traceguard.ingest import InputSpec, load_run, rank_from_name

H200 = OWN / "h200"
TORCH = sorted((H200 / "p2p_torch").glob("rank*.trace.json.gz"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never write to the user's ~/.cache from tests."""
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


def _dist_rank(trace: Path) -> int:
    with gzip.open(trace, "rt") as fh:
        return json.load(fh)["distributedInfo"]["rank"]


def _nsys_env_rank(db: Path) -> int | None:
    """RANK=N in the environment nsys recorded (TARGET_INFO_SYSTEM_ENV), by plain SQL."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        values = [v for (v,) in con.execute("SELECT value FROM TARGET_INFO_SYSTEM_ENV") if isinstance(v, str)]
    finally:
        con.close()
    ranks = {int(item[5:]) for v in values for item in v.split(";") if item.startswith("RANK=") and item[5:].isdigit()}
    assert len(ranks) <= 1, ranks
    return ranks.pop() if ranks else None


@pytest.mark.parametrize(
    ("name", "rank"),
    [
        ("rank3.json", 3),
        ("cap_3.sqlite", 3),
        ("trace-3.json.gz", 3),
        ("rank12.trace.json.gz", 12),
        ("rank_2.nsys-rep", 2),
        ("sampled_rank-1.json.gz", 1),
        ("x.json", None),
        ("report1.sqlite", None),  # a digit glued to a word is not a rank
        ("h100_2gpu_1s.sqlite", None),
    ],
)
def test_rank_from_name(name: str, rank: int | None) -> None:
    assert rank_from_name(Path(name)) == rank


def test_kineto_distributed_info_wins_over_the_file_name(tmp_path: Path) -> None:
    source = TORCH[1]
    stated = _dist_rank(source)
    misleading = tmp_path / f"rank{stated + 5}.trace.json.gz"
    shutil.copy(source, misleading)
    run = load_run([str(misleading)])
    assert [r.rank for r in run.ranks] == [stated]
    (record,) = run.inputs
    assert (record.rank, record.rank_source) == (stated, "file")
    assert not any("position" in w for w in record.warnings)


def test_file_colon_rank_wins_over_distributed_info() -> None:
    source = TORCH[0]
    assert _dist_rank(source) != 6
    run = load_run([f"{source}:6"])
    assert [r.rank for r in run.ranks] == [6]
    assert (run.inputs[0].rank, run.inputs[0].rank_source) == (6, "argument")
    # Every frame of the rank's capture carries the rank.
    assert set(run.ranks[0].capture.gpu_ops["rank"].unique().to_list()) == {6}


def test_input_spec_rank_is_honoured() -> None:
    run = load_run([InputSpec(TORCH[0], 9, "manifest")])
    assert (run.inputs[0].rank, run.inputs[0].rank_source) == (9, "manifest")


@pytest.mark.parametrize("cap", ["cap_0", "cap_1"])
def test_nsys_recorded_rank_environment_gives_the_rank(tmp_path: Path, unpacked, cap: str) -> None:
    db = unpacked(H200 / "p2p_nsys" / f"{cap}.sqlite.gz")
    stated = _nsys_env_rank(db)
    assert stated is not None
    # No number in the name, and a second file before it: neither name nor position can explain it.
    anonymous = tmp_path / "capture.sqlite"
    shutil.copy(db, anonymous)
    run = load_run([str(TORCH[0]) + ":7", str(anonymous)])
    record = run.inputs[1]
    assert (record.rank, record.rank_source) == (stated, "file")
    assert not any("position" in w for w in record.warnings)


def test_nsys_recorded_rank_wins_over_the_file_name(tmp_path: Path, unpacked) -> None:
    db = unpacked(H200 / "p2p_nsys" / "cap_1.sqlite.gz")
    stated = _nsys_env_rank(db)
    renamed = tmp_path / f"cap_{stated + 3}.sqlite"
    shutil.copy(db, renamed)
    run = load_run([str(renamed)])
    assert [r.rank for r in run.ranks] == [stated]


def test_position_fallback_adds_a_warning(unpacked) -> None:
    # Two public single-GPU exports: no RANK recorded, no rank number in their names.
    files = [unpacked(public_nsys("mock")), unpacked(public_nsys("at_ee4fcf3"))]
    for f in files:
        assert _nsys_env_rank(f) is None and rank_from_name(f) is None
    run = load_run([str(f) for f in files])
    assert [r.rank for r in run.ranks] == [0, 1]
    for position, record in enumerate(run.inputs):
        assert (record.rank, record.rank_source) == (position, "position")
        (warning,) = [w for w in record.warnings if "position" in w]
        assert Path(record.path).name in warning and ":RANK" in warning


def test_file_name_rank_when_the_file_states_none(tmp_path: Path, unpacked) -> None:
    named = tmp_path / "cap_4.sqlite"
    shutil.copy(unpacked(public_nsys("mock")), named)
    run = load_run([str(named)])
    assert (run.inputs[0].rank, run.inputs[0].rank_source) == (4, "file name")
    assert not any("position" in w for w in run.inputs[0].warnings)


def test_explicit_rank_beats_a_position_guess_of_an_earlier_file(unpacked) -> None:
    unnamed = unpacked(public_nsys("mock"))  # no rank anywhere: position 0
    run = load_run([str(unnamed), f"{TORCH[0]}:0"])
    explicit = run.inputs[1]
    assert explicit.error is None and explicit.rank == 0


def test_two_gpu_processes_in_one_file_become_two_ranks(unpacked) -> None:
    db = unpacked(public_nsys("h100_2gpu_1s"))
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    per_pid: dict[int, int] = {}
    first_device: dict[int, int] = {}
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if table not in tables:
            continue
        query = f"SELECT (globalPid >> 24) & 0xFFFFFF, MIN(deviceId), COUNT(*) FROM {table} GROUP BY 1"
        for pid, device, count in con.execute(query):
            per_pid[pid] = per_pid.get(pid, 0) + count
            first_device[pid] = min(first_device.get(pid, device), device)
    con.close()
    assert len(per_pid) == 2
    # Ranks follow the lowest device each process used; the file itself gives base rank 0.
    expected = [per_pid[pid] for pid in sorted(per_pid, key=lambda p: (first_device[p], p))]

    run = load_run([str(db)])
    assert [r.rank for r in run.ranks] == [0, 1]
    assert [r.capture.gpu_ops.height for r in run.ranks] == expected
    assert [sorted(set(r.capture.gpu_ops["pid"].to_list())) for r in run.ranks] == [
        [pid] for pid in sorted(per_pid, key=lambda p: (first_device[p], p))
    ]
    (record,) = run.inputs
    assert record.ranks == [0, 1]
    assert any("2 GPU processes" in w for w in record.warnings)


def test_two_process_file_with_explicit_base_rank(unpacked) -> None:
    db = unpacked(public_nsys("h100_2gpu_1s"))
    run = load_run([f"{db}:4"])
    assert [r.rank for r in run.ranks] == [4, 5]


def test_all_inputs_failing_raises_no_usable_input(tmp_path: Path) -> None:
    empty = tmp_path / "cap_0.sqlite"
    empty.write_bytes(b"")
    missing = tmp_path / "cap_1.sqlite"
    with pytest.raises(NoUsableInputError) as info:
        load_run([str(empty), str(missing)])
    assert info.value.exit_code == 2
    assert str(empty) in info.value.message and str(missing) in info.value.message


def test_no_input_at_all_raises_no_usable_input() -> None:
    with pytest.raises(NoUsableInputError):
        load_run([])


def test_unreadable_input_keeps_its_place_in_inputs(tmp_path: Path) -> None:
    bad = tmp_path / "notes.json"
    bad.write_text('{"a": 1}')
    run = load_run([str(TORCH[0]), str(bad), str(TORCH[1])])
    assert [Path(r.path).name for r in run.inputs] == [TORCH[0].name, "notes.json", TORCH[1].name]
    assert [r.error is not None for r in run.inputs] == [False, True, False]
    assert run.inputs[1].error_code == "unsupported_format"
    assert [r.rank for r in run.ranks] == sorted(_dist_rank(t) for t in TORCH)
    assert [r.input_index for r in run.ranks] == [0, 2]


def test_bundle_without_manifest_skips_the_jobs_rank_records() -> None:
    run = load_run([str(H200 / "p2p_torch")])
    assert sorted(Path(r.path).name for r in run.inputs) == [t.name for t in TORCH]
    assert [r.rank for r in run.ranks] == sorted(_dist_rank(t) for t in TORCH)


def test_bundle_manifest_rank_wins_over_distributed_info(tmp_path: Path) -> None:
    shutil.copy(TORCH[0], tmp_path / "a.json.gz")
    shutil.copy(TORCH[1], tmp_path / "b.json.gz")
    manifest = {"captures": [{"path": "a.json.gz", "rank": 3}, {"path": "b.json.gz"}]}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    run = load_run([str(tmp_path)])
    by_name = {Path(r.path).name: r for r in run.inputs}
    assert (by_name["a.json.gz"].rank, by_name["a.json.gz"].rank_source) == (3, "manifest")
    # No rank in the manifest: the file's own distributedInfo.
    assert (by_name["b.json.gz"].rank, by_name["b.json.gz"].rank_source) == (_dist_rank(TORCH[1]), "file")
