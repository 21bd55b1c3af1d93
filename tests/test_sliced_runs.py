"""Runs whose nsys exports are analysed in time slices (``--sliced-above``, traceguard.metrics.sliced)
give the report, byte for byte apart from ``generated_at``, that the whole-in-memory path gives:
on the map/reduce cases where the rank plan is wrong (two GPU processes in one file, an unreadable
first file, a file that states another rank than its name), the 4×H200 bundle and mixed runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from typer.testing import CliRunner

import traceguard.metrics.sliced as sliced_module
from tests.conftest import OWN, PUBLIC, public_nsys
from tests.test_mapreduce import CASES, _private_cache, _same, _whole_in_memory, cases  # noqa: F401
from traceguard import mapreduce, pipeline
from traceguard.cli import app
from traceguard.errors import InputError, NoUsableInputError
from traceguard.ingest.nsys_slices import SlicedNsys
from traceguard.mapreduce import SLICED_ABOVE_ENV, parse_size


@pytest.fixture
def sliced_ranks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The ranks analysed by the sliced path (to know it ran, not the whole-file one)."""
    seen: list[int] = []
    real = sliced_module.analyse_rank_sliced

    def spy(rank: int, *args: object, **kwargs: object) -> sliced_module.RankResult:
        seen.append(rank)
        return real(rank, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sliced_module, "analyse_rank_sliced", spy)
    return seen


@pytest.mark.parametrize("case", CASES)
def test_sliced_run_gives_the_whole_in_memory_report(
    cases: dict[str, list[str]],  # noqa: F811
    case: str,
    sliced_ranks: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = SlicedNsys.op_slices
    monkeypatch.setattr(
        SlicedNsys, "op_slices", lambda self, max_rows=0, launches=True: real(self, 997, launches=launches)
    )  # many slices a file
    expected = _whole_in_memory(cases[case])
    got = pipeline.analyze(cases[case], scheduler="serial", sliced_above=0).report
    assert _same(got) == _same(expected)
    sqlite_inputs = [p for p in cases[case] if Path(p).suffix == ".sqlite" and Path(p).stat().st_size]
    assert bool(sliced_ranks) == bool(sqlite_inputs)


@pytest.mark.slow
def test_sliced_run_on_the_process_pool(cases: dict[str, list[str]], sliced_ranks: list[int]) -> None:  # noqa: F811
    inputs = cases["two_processes_first"]
    expected = _whole_in_memory(inputs)
    got = pipeline.analyze(inputs, scheduler="local", jobs=2, sliced_above=0).report
    assert _same(got) == _same(expected)


def test_only_exports_above_the_size_are_sliced(
    cases: dict[str, list[str]],  # noqa: F811
    sliced_ranks: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inputs = cases["two_processes_first"]  # the h100 export (2 ranks) is 4 MB, mock 0.3 MB
    sizes = sorted(Path(p).stat().st_size for p in inputs)
    monkeypatch.setenv(SLICED_ABOVE_ENV, str(sizes[1]))
    report = pipeline.analyze(inputs, scheduler="serial").report
    assert sliced_ranks == [0, 1]
    assert _same(report) == _same(_whole_in_memory(inputs))


def test_cli_sliced_above(cases: dict[str, list[str]], tmp_path: Path) -> None:  # noqa: F811
    runner = CliRunner()
    inputs = cases["two_processes_first"]
    out = tmp_path / "sliced.json"
    done = runner.invoke(app, ["analyze", *inputs, "--scheduler", "serial", "--sliced-above", "1K", "-o", str(out)])
    assert done.exit_code == 0, done.output
    bad = runner.invoke(app, ["analyze", *inputs, "--sliced-above", "lots"])
    assert bad.exit_code == 2
    assert "'lots' is not a size" in bad.output


def test_sizes() -> None:
    assert parse_size("4096") == 4096
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GB") == 3 << 29
    assert parse_size("2 GiB") == 2 << 30


@pytest.mark.slow
def test_an_nsys_report_is_exported_then_sliced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sliced_ranks: list[int]
) -> None:
    """A real .nsys-rep (nsys on this machine, CPU only): its cached export is what is sliced,
    and the report says the input was a report, as the whole read does."""
    from tests.ingest.test_nsys_sqlite import _make_report

    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path / "cache"))
    report = _make_report(tmp_path)
    whole = pipeline.analyze([str(report)], scheduler="serial", sliced_above=1 << 40).report
    assert sliced_ranks == []
    sliced = pipeline.analyze([str(report)], scheduler="serial", sliced_above=0).report
    assert sliced_ranks == [0]
    assert sliced["inputs"][0]["format"] == "nsys-rep"
    assert _same(sliced) == _same(whole)


def test_python_api_takes_a_size(cases: dict[str, list[str]], sliced_ranks: list[int]) -> None:  # noqa: F811
    import traceguard

    inputs = cases["two_processes_first"]
    sliced = traceguard.analyze(inputs, scheduler="serial", sliced_above="0")
    assert set(sliced_ranks) == {0, 1, 2}  # the mock is first planned as rank 1, then analysed as 2
    assert _same(sliced.report) == _same(traceguard.analyze(inputs, scheduler="serial").report)


def test_an_export_out_of_time_order_is_that_inputs_error(tmp_path: Path, unpacked) -> None:
    """Slicing needs the GPU tables in start order (as nsys writes them): a file that breaks it
    is reported as that input's error, saying how to analyse it whole; the other ranks go on."""
    import shutil
    import sqlite3

    from tests.conftest import OWN

    good = tmp_path / "good.sqlite"
    shutil.copy(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"), good)
    swapped = tmp_path / "swapped.sqlite"
    shutil.copy(good, swapped)
    with sqlite3.connect(swapped) as conn:
        (rowid, start), (_, later) = conn.execute(
            "SELECT rowid, start FROM CUPTI_ACTIVITY_KIND_KERNEL ORDER BY rowid LIMIT 2 OFFSET 100"
        ).fetchall()
        conn.execute(
            "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET start = start + ?, end = end + ? WHERE rowid = ?",
            (later - start + 1_000_000, later - start + 1_000_000, rowid),
        )
    report = pipeline.analyze([f"{swapped}:1", f"{good}:0"], scheduler="serial", sliced_above=0).report
    error = report["inputs"][0]
    assert error["error_code"] == "invalid_input"
    assert "CUPTI_ACTIVITY_KIND_KERNEL is not in time order" in error["error"]
    assert [r["rank"] for r in report["ranks"]] == [0]
    whole = pipeline.analyze([f"{swapped}:1"], scheduler="serial", sliced_above=1 << 40).report
    assert whole["inputs"][0]["error"] is None  # the whole read takes it


@pytest.mark.parametrize("damage", ["truncated", "random", "not_nsys"])
def test_damaged_files_on_the_sliced_path_are_input_errors(tmp_path: Path, unpacked, damage: str) -> None:
    """A damaged file that goes the sliced way is that input's error, with the good rank analysed,
    and alone it exits 2 naming it: no traceback."""
    import os
    import sqlite3

    from tests.conftest import OWN

    good = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    bad = tmp_path / f"{damage}.sqlite"
    if damage == "truncated":
        bad.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    elif damage == "random":
        bad.write_bytes(b"SQLite format 3\x00" + os.urandom(200_000))
    else:
        with sqlite3.connect(bad) as conn:
            conn.execute("CREATE TABLE t (a)")
    report = pipeline.analyze([f"{bad}:1", f"{good}:0"], scheduler="serial", sliced_above=0).report
    assert report["inputs"][0]["error_code"] == "invalid_input"
    assert str(bad) in report["inputs"][0]["error"]
    assert [r["rank"] for r in report["ranks"]] == [0]
    alone = CliRunner().invoke(app, ["analyze", str(bad), "--sliced-above", "0", "--scheduler", "serial"])
    assert alone.exit_code == 2
    assert bad.name in alone.output and "Traceback" not in alone.output


def test_default_threshold_reads_whole_only_an_export_whose_steps_need_its_kernel_sequence(
    unpacked: Callable[[Path], Path],
    sliced_ranks: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under the default threshold (here lowered to 0 B), an export whose steps come from its
    ranges is sliced; one whose steps must be inferred from its kernel sequence is read whole
    while it is below a quarter of memory (sliced, it would be read twice); asked for, it is
    sliced all the same. The report is the same every way."""
    monkeypatch.delenv(SLICED_ABOVE_ENV, raising=False)
    monkeypatch.setattr(mapreduce, "SLICED_ABOVE_DEFAULT", 0)
    inputs = [str(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"))]
    for sources in (None, ["inferred"]):
        whole = pipeline.analyze(inputs, scheduler="serial", step_sources=sources, sliced_above=1 << 40).report
        assert sliced_ranks == []
        default = pipeline.analyze(inputs, scheduler="serial", step_sources=sources).report
        assert sliced_ranks == ([] if sources else [0])
        assert whole["ranks"][0]["step_source"] == ("inferred" if sources else "convention")
        sliced_ranks.clear()
        asked = pipeline.analyze(inputs, scheduler="serial", step_sources=sources, sliced_above=0).report
        assert sliced_ranks == [0]
        sliced_ranks.clear()
        assert _same(default) == _same(whole) == _same(asked)


def test_an_export_of_one_process_reads_its_first_slice_beside_its_small_capture_unless_read_whole(
    unpacked: Callable[[Path], Path],
    sliced_ranks: list[int],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An export of one process reads its small capture on a thread of its own while it reads its
    first slice, however few its NVTX rows; not where its steps surely come from its kernel
    sequence and it may be read whole (that slice would be read for nothing), but again where
    it is sliced as asked. The report is the whole read's every way."""
    monkeypatch.delenv(SLICED_ABOVE_ENV, raising=False)
    monkeypatch.setattr(mapreduce, "SLICED_ABOVE_DEFAULT", 0)
    readers: list[str] = []
    small_capture = SlicedNsys.small_capture

    def spied(self: SlicedNsys, **kwargs: Any) -> Any:
        readers.append(threading.current_thread().name)
        return small_capture(self, **kwargs)

    monkeypatch.setattr(SlicedNsys, "small_capture", spied)
    inputs = [str(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"))]
    for sources, sliced_above, beside, sliced in (
        (None, None, True, True),  # steps from ranges: sliced, the first slice read meanwhile
        (["inferred"], None, False, False),  # surely from the sequence: read whole after the look
        (["inferred"], 0, True, True),  # sliced as asked: never read whole
    ):
        readers.clear()
        sliced_ranks.clear()
        whole = pipeline.analyze(inputs, scheduler="serial", step_sources=sources, sliced_above=1 << 40).report
        got = pipeline.analyze(inputs, scheduler="serial", step_sources=sources, sliced_above=sliced_above).report
        assert len(readers) == 1 and readers[0].startswith("traceguard-small") == beside, (sources, readers)
        assert sliced_ranks == ([0] if sliced else [])
        assert _same(got) == _same(whole)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_export_read_whole_after_the_sliced_look_reads_its_nvtx_table_once(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """The sliced reader's look at an export of one process whose steps must come from its
    kernel sequence is followed by a whole read of the same file: the NVTX rows it read are
    handed over, not read again (a per-op NVTX capture's table is most of its file), and the
    report is the one of a plain whole read; also when the look read the first slice while the
    NVTX table was read (``overlap``: a large table)."""
    from traceguard.ingest import nsys_sqlite

    monkeypatch.delenv(SLICED_ABOVE_ENV, raising=False)
    if overlap:
        monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    inputs = [str(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz"))]
    inferred = ["inferred"]
    whole = pipeline.analyze(inputs, scheduler="serial", step_sources=inferred, sliced_above=1 << 40).report
    reads: list[str] = []
    bulk = nsys_sqlite._Reader.bulk

    def counted(self: nsys_sqlite._Reader, table: str, *args: Any, **kwargs: Any) -> Any:
        reads.append(table)
        return bulk(self, table, *args, **kwargs)

    monkeypatch.setattr(nsys_sqlite._Reader, "bulk", counted)
    monkeypatch.setattr(mapreduce, "SLICED_ABOVE_DEFAULT", 0)
    default = pipeline.analyze(inputs, scheduler="serial", step_sources=inferred).report
    assert sliced_ranks == []  # looked at sliced, read whole
    assert reads.count(nsys_sqlite.NVTX) == 1
    assert _same(default) == _same(whole)


@pytest.mark.parametrize("overlap", [False, True])
def test_an_export_of_several_ranks_is_sliced_by_default_even_when_steps_need_the_kernel_sequence(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch, overlap: bool
) -> None:
    """nsys-ai's 2-rank export (no step markers): under the default threshold its ranks share one
    sliced read instead of a whole read (bench/README.md, fifth pass); the report is the whole
    read's, also when the first slice is read while the NVTX table is (``overlap``)."""
    monkeypatch.delenv(SLICED_ABOVE_ENV, raising=False)
    if overlap:
        monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    assert sliced_ranks == []
    monkeypatch.setattr(mapreduce, "SLICED_ABOVE_DEFAULT", 0)
    default = pipeline.analyze(inputs, scheduler="serial").report
    assert sorted(sliced_ranks) == [0, 1]
    assert _same(default) == _same(whole)


def test_two_ranks_in_one_export_read_their_kernel_sequences_once(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """nsys-ai's 2-rank export has no step markers: each rank's steps come from its kernel
    sequence. Sliced, the file is read once without launches for both ranks' sequences, then
    once with them for both ranks' first passes (mapreduce._fan_out), not once more per rank;
    the report is the whole read's."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    assert [r["step_source"] for r in whole["ranks"]] == ["inferred", "inferred"]
    real = SlicedNsys.op_slices
    reads: list[bool] = []

    def counted(self: SlicedNsys, max_rows: int = 0, launches: bool = True) -> Any:
        reads.append(launches)
        return real(self, 997, launches=launches)  # many slices

    monkeypatch.setattr(SlicedNsys, "op_slices", counted)
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert sorted(sliced_ranks) == [0, 1]
    assert reads.count(False) == 1 and reads.count(True) == 1
    assert _same(sliced) == _same(whole)


def _finishes(run: Callable[[], Any], seconds: float = 300) -> Any:
    """``run()``'s result or exception, asserting it returned at all (a stalled hand-on between
    the read and a rank's thread must fail the test, not hang it)."""
    outcome: list[Any] = []

    def target() -> None:
        try:
            outcome.append(run())
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(seconds)
    assert outcome, f"no outcome after {seconds} s: the shared read stalled"
    return outcome[0]


def test_a_rank_that_fails_in_a_shared_read_fails_the_run_without_stalling_it(
    unpacked: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bug in one rank's analysis (here: it raises after its third slice) while the read still
    has slices for it: the error reaches the caller; the read does not wait for room forever."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    real_slices = SlicedNsys.op_slices
    monkeypatch.setattr(
        SlicedNsys, "op_slices", lambda self, max_rows=0, launches=True: real_slices(self, 997, launches=launches)
    )
    real = sliced_module.analyse_rank_sliced

    def failing(rank: int, capture: Any, op_slices: Callable[[], Any], **kwargs: Any) -> Any:
        def some() -> Any:
            for index, part in enumerate(op_slices()):
                if rank == 1 and index == 3:
                    raise RuntimeError("rank 1 broke")
                yield part

        return real(rank, capture, some, **kwargs)

    monkeypatch.setattr(sliced_module, "analyse_rank_sliced", failing)
    got = _finishes(lambda: pipeline.analyze(inputs, scheduler="serial", sliced_above=0))
    assert isinstance(got, RuntimeError) and str(got) == "rank 1 broke"


def test_a_read_error_in_a_shared_read_is_the_inputs_error(
    unpacked: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared read fails after some slices (a damaged page, say): both ranks' analyses end,
    and the input carries the read's error like any sliced read's."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    real_slices = SlicedNsys.op_slices

    def breaking(self: SlicedNsys, max_rows: int = 0, launches: bool = True) -> Any:
        for index, part in enumerate(real_slices(self, 997, launches=launches)):
            if launches and index == 4:
                raise InputError("page 7 of the export does not parse")
            yield part

    monkeypatch.setattr(SlicedNsys, "op_slices", breaking)
    got = _finishes(lambda: pipeline.analyze(inputs, scheduler="serial", sliced_above=0))
    assert isinstance(got, NoUsableInputError)
    assert "page 7 of the export does not parse" in str(got)


def test_ranks_planned_wrong_from_the_first_slice_are_analysed_again(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first slice plans a file's GPU processes; the census of every slice, taken by the
    shared read, confirms them or has the file analysed again under the confirmed ones (here the
    first plan has the two in the wrong order, as when the process with the lower device starts
    its GPU work later). The second attempt starts from the same small capture, its ranges read
    again (the first attempt let the file's go once each rank held its own): the report is the
    whole read's."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    real = mapreduce.gpu_processes
    plans: list[list[int]] = []

    def first_plan_reversed(capture: Any) -> list[int]:
        pids = real(capture)
        plans.append(pids)
        return pids[::-1] if len(plans) == 1 else pids

    monkeypatch.setattr(mapreduce, "gpu_processes", first_plan_reversed)
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert len(plans) >= 2 and len(plans[0]) == 2  # planned, then confirmed otherwise
    assert sorted(sliced_ranks) == [0, 0, 1, 1]  # both ranks analysed twice
    assert [r["rank"] for r in sliced["ranks"]] == [0, 1]
    assert _same(sliced) == _same(whole)


def test_the_sequence_read_begun_beside_the_nvtx_table_is_let_go_when_ranges_settle_the_steps(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of several ranks with a large NVTX table: its kernel sequences are read while the
    table is (their steps usually need them). Where its ranges settle the steps after all (here a
    step pattern), that read is stopped and let go, and the ranks are planned from the first
    slice read then: the report is the whole read's; and with the sequences used, it is too."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    closed: list[bool] = []
    finished: list[bool] = []
    close, finish = mapreduce._SequenceRead.close, mapreduce._SequenceRead.finish

    def spied_close(self: Any) -> None:
        closed.append(True)
        close(self)

    def spied_finish(self: Any, by_pid: bool) -> Any:
        finished.append(by_pid)
        return finish(self, by_pid)

    monkeypatch.setattr(mapreduce._SequenceRead, "close", spied_close)
    monkeypatch.setattr(mapreduce._SequenceRead, "finish", spied_finish)
    pattern = ["^record_param_comms"]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40, step_patterns=pattern).report
    assert [r["step_source"] for r in whole["ranks"]] == ["pattern", "pattern"]
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0, step_patterns=pattern).report
    assert closed == [True] and finished == []
    assert sorted(sliced_ranks) == [0, 1]
    # Each of these steps' phases has one call: the late rank's phases tie, and are named in order.
    launched_in = whole["run"]["late_rank"]["launched_in"]
    assert [p["calls"] for p in launched_in] == [1, 1, 1]
    assert launched_in == sorted(launched_in, key=lambda p: p["phase"])
    assert _same(sliced) == _same(whole)
    inferred_whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    inferred = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert finished == [True]  # the sequences read beside the table, by process
    assert _same(inferred) == _same(inferred_whole)


@pytest.mark.parametrize("by_pid", [True, False])
def test_the_sequence_read_beside_the_nvtx_table_gives_what_one_read_after_it_gives(
    unpacked: Callable[[Path], Path], by_pid: bool
) -> None:
    """The kernel sequences read block by block beside the NVTX table, each block split by
    process as it is taken, are the sequences of one read after it, by process or not. Not by
    process, a block that holds both processes is what the ranks read whole: that read starts
    again (nsys-ai's two ranks interleave in every block)."""
    from traceguard.ingest.nsys_slices import open_sliced

    path = unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz")
    with open_sliced(path) as source:
        early = mapreduce._SequenceRead(source, 997)
        early.read_while(iter([True, True, False]).__next__)  # two blocks now, the rest at the end
        got, others = early.finish(by_pid)
        expected = mapreduce._kernel_sequences(source, 997, by_pid)
        ops = pl.concat(list(source.op_slices(997, launches=False)))
    assert sorted(got, key=str) == sorted(expected, key=str)
    # The copies and sets beside them (pass 2's window, traceguard.metrics.sliced.known_window):
    # by process, each process's in read order; not by process, none (the read starts again).
    if by_pid:
        assert others is not None and sorted(others) == sorted(expected)
        moved = ops.filter(pl.col("kind") != "kernel").select("pid", "start", "end")
        for pid, pieces in others.items():
            held = pl.concat([mapreduce._unpacked(piece) for piece in pieces])
            assert held.equals(moved.filter(pl.col("pid") == pid))
        assert sum(len(pieces) for pieces in others.values()) > 2 and moved.height > 0
    else:
        assert others is None
    assert len(got) == (2 if by_pid else 1)
    for pid, pieces in expected.items():
        whole = pl.concat([mapreduce._unpacked(piece) for piece in pieces])
        assert pl.concat([mapreduce._unpacked(piece) for piece in got[pid]]).equals(whole)
        assert "rank" not in whole.columns  # set by each rank's steps
        # A process's pieces are held without its pid and device (one each here); both
        # processes' together keep them.
        held = {column for piece in pieces for column in piece.frame.columns}
        assert ({"pid", "device"} & held) == (set() if by_pid else {"pid", "device"})
        assert whole["pid"].n_unique() == (1 if by_pid else 2) and whole["device"].null_count() == 0


@pytest.mark.parametrize(
    ("pids", "devices", "left_out"),
    [
        ([5, 5, 5], [1, 1, 1], {"pid", "device"}),  # one process on one device
        ([5, 5, 5], [1, None, 1], {"pid"}),  # a device unknown for one op: kept
        ([None, None, None], [None, None, None], {"pid", "device"}),  # all null: one value, null
        ([5, 6, 5], [0, 1, 0], set()),  # two processes: nothing left out
        ([], [], set()),  # an empty piece is held as it is
    ],
)
def test_a_held_sequence_piece_gives_back_the_frame_it_was_given(
    pids: list[int | None], devices: list[int | None], left_out: set[str]
) -> None:
    """A kernel sequence's piece is held without the columns that hold one value in it, and is
    unpacked to the same frame, types and column order included."""
    frame = pl.DataFrame(
        {
            "pid": pids,
            "device": devices,
            "kind": ["kernel"] * len(pids),
            "start": list(range(len(pids))),
            "end": list(range(1, len(pids) + 1)),
            "name_id": [7] * len(pids),
        },
        schema={
            "pid": pl.Int32,
            "device": pl.Int32,
            "kind": pl.Enum(["kernel", "memcpy"]),
            "start": pl.Int64,
            "end": pl.Int64,
            "name_id": pl.Int32,
        },
    )
    piece = mapreduce._packed(frame)
    assert set(frame.columns) - set(piece.frame.columns) == left_out
    back = mapreduce._unpacked(piece)
    assert back.schema == frame.schema and back.equals(frame)


def test_steps_from_the_kernel_sequence_feed_pass_2_beside_pass_1(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file of several ranks whose steps come from their kernel sequences (nsys-ai's
    ``mfu_2gpu_before``: inferred steps) has its sequences read beside the NVTX table, with its
    copies and sets: every step's GPU span, the window's NCCL kernels and the pipeline test are
    known before the shared read, so pass 2 is fed each slice as pass 1 takes it and nothing is
    spilled; pass 1 finds the same (checked) and the report is the whole read's."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    windows: list[Any] = []
    spilled: list[Path] = []
    known_window, read_back = sliced_module.known_window, sliced_module._second_pass_slice

    def spied_window(*args: Any) -> Any:
        windows.append(known_window(*args))
        return windows[-1]

    def spied_read_back(path: Path, **kwargs: Any) -> Any:
        spilled.append(path)
        return read_back(path, **kwargs)

    monkeypatch.setattr(sliced_module, "known_window", spied_window)
    monkeypatch.setattr(sliced_module, "_second_pass_slice", spied_read_back)
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    assert [r["step_source"] for r in whole["ranks"]] == ["inferred", "inferred"]
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert sorted(sliced_ranks) == [0, 1]
    assert len(windows) == 2 and all(w is not None and w.spans.height for w in windows)
    assert sum(len(w.nccl_by_device) for w in windows) > 0  # the window holds NCCL kernels
    assert spilled == []
    assert _same(sliced) == _same(whole)


def test_a_window_known_before_the_read_that_pass_1_contradicts_fails_loudly(
    unpacked: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pass 1 still finds the window itself: should the one pass 2 was fed with differ (a bug:
    both are searched alike), the analysis stops with an internal error instead of reporting
    numbers measured against another window."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    known_window = sliced_module.known_window

    def shifted(*args: Any) -> Any:
        window = known_window(*args)
        later = window.spans.with_columns(pl.col("gpu_start") + 1)
        return sliced_module.KnownWindow(later, window.nccl_by_device, window.pipeline)

    monkeypatch.setattr(sliced_module, "known_window", shifted)
    with pytest.raises(AssertionError, match="window found before the read differs"):
        pipeline.analyze(inputs, scheduler="serial", sliced_above=0)


def test_no_window_is_known_before_the_read_where_graphs_launch_or_ranges_set_the_steps() -> None:
    """Graph-launched ops' busy time needs their launches (the read with launches), and steps
    from ranges attribute ops by their launch: pass 2 then waits for pass 1, as before."""
    from traceguard import model
    from traceguard.metrics.steps import ResolvedSteps

    steps = pl.DataFrame(
        {"pid": [1], "start": [0], "end": [100], "range_id": [0]},
        schema={"pid": pl.Int32, "start": pl.Int64, "end": pl.Int64, "range_id": pl.Int64},
    )
    sequence = pl.DataFrame(
        {"pid": [1], "device": [0], "kind": ["kernel"], "start": [10], "end": [20], "name_id": [5]},
        schema={c: model.GPU_OPS_SCHEMA[c] for c in ("pid", "device", "kind", "start", "end", "name_id")},
    )
    others = sequence.select("pid", "start", "end").clear()
    ranges = model.empty(model.RANGES_SCHEMA)

    def capture(names: list[str]) -> Any:
        ids = list(range(len(names)))
        strings = pl.DataFrame({"id": ids, "value": names}, schema={"id": pl.Int64, "value": pl.String})
        return type("Small", (), {"strings": strings, "ranges": ranges})()

    inferred = ResolvedSteps(steps, "inferred", {1: 1})
    window = sliced_module.known_window(capture(["sgemm", "void"]), inferred, sequence, others)
    assert window is not None and window.spans.to_dicts() == [{"step_id": 0, "gpu_start": 10, "gpu_end": 20}]
    assert sliced_module.known_window(capture(["cudaGraphLaunch_v10000"]), inferred, sequence, others) is None
    from_ranges = ResolvedSteps(steps, "pattern", {})
    assert sliced_module.known_window(capture(["sgemm"]), from_ranges, sequence, others) is None


def _launch_passes_beside(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Hold the NVTX table's read until the kernel sequences are read whole, so that the launch
    join's passes are handed to a thread of their own; the threads they ran on."""
    monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    sequences_read = threading.Event()
    threads: list[str] = []
    read_while, small_capture = mapreduce._SequenceRead.read_while, SlicedNsys.small_capture
    prepare_launches = SlicedNsys.prepare_launches

    def spied_read_while(self: Any, going_on: Callable[[], bool]) -> None:
        read_while(self, going_on)
        if self.read_all:
            sequences_read.set()

    def held_small_capture(self: Any, **kwargs: Any) -> Any:
        assert sequences_read.wait(60)
        return small_capture(self, **kwargs)

    def spied_prepare(self: Any, going_on: Callable[[], bool]) -> None:
        threads.append(threading.current_thread().name)
        prepare_launches(self, going_on)

    monkeypatch.setattr(mapreduce._SequenceRead, "read_while", spied_read_while)
    monkeypatch.setattr(SlicedNsys, "small_capture", held_small_capture)
    monkeypatch.setattr(SlicedNsys, "prepare_launches", spied_prepare)
    return threads


def test_the_launch_passes_run_beside_the_steps_and_change_nothing(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the kernel sequences of a file of several ranks are read and its NVTX table is not,
    the launch join's passes go on a thread of their own (on past that table, beside the ranks'
    steps) and are stopped before the shared read: the report is the whole read's."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    threads = _launch_passes_beside(monkeypatch)
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert threads and all(name.startswith("traceguard-small") for name in threads)
    assert threading.current_thread().name not in threads
    assert sorted(sliced_ranks) == [0, 1]
    assert _same(sliced) == _same(whole)


def test_an_error_in_the_launch_passes_beside_the_steps_is_the_analysis_error(
    unpacked: Callable[[Path], Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The passes on their own thread read the file too: should that read fail, the input fails
    with that error (raised where the passes are stopped), not with another."""
    inputs = [str(unpacked(PUBLIC / "nsys-sqlite" / "GindaChen__nsys-ai__tests__fixtures__mfu_2gpu_before.sqlite.gz"))]
    threads = _launch_passes_beside(monkeypatch)

    def failing(self: Any, going_on: Callable[[], bool]) -> None:
        threads.append(threading.current_thread().name)
        raise InputError("the API tables could not be read")

    monkeypatch.setattr(SlicedNsys, "prepare_launches", failing)
    with pytest.raises(NoUsableInputError, match="API tables could not be read"):
        pipeline.analyze(inputs, scheduler="serial", sliced_above=0)
    assert threads and threads[0].startswith("traceguard-small")


@pytest.mark.parametrize("fixture", ["mfu_2gpu_before", "report1.sqlite__at_ee4fcf3"])
def test_the_reading_thread_takes_pieces_of_a_long_nvtx_read(
    unpacked: Callable[[Path], Path], sliced_ranks: list[int], monkeypatch: pytest.MonkeyPatch, fixture: str
) -> None:
    """While the NVTX table is read on a thread, the thread that reads the file's slices, once it
    has nothing else to do (the kernel sequences of a file of several ranks read; the first slice
    of a file of one), takes pieces of that read (``SlicedNsys.help_read_nvtx``); the report is
    the whole read's. Here the table's thread is slowed so that the other surely catches it up:
    nsys-ai's two-rank per-op capture, and a one-process capture of NVIDIA's Fuser."""
    from traceguard.ingest import nsys_sqlite

    inputs = [str(unpacked(public_nsys(fixture)))]
    whole = pipeline.analyze(inputs, scheduler="serial", sliced_above=1 << 40).report
    monkeypatch.setattr(mapreduce, "OVERLAP_NVTX_ROWS", 0)
    monkeypatch.setattr(nsys_sqlite, "NVTX_PIECE_ROWS", 500)
    helped: list[int] = []
    bulk = nsys_sqlite._Reader.bulk

    def paced(self: nsys_sqlite._Reader, table: str, *args: Any, **kwargs: Any) -> Any:
        if table == nsys_sqlite.NVTX:
            if threading.current_thread() is threading.main_thread():
                helped.append(1)
            else:
                time.sleep(0.02)
        return bulk(self, table, *args, **kwargs)

    monkeypatch.setattr(nsys_sqlite._Reader, "bulk", paced)
    sliced = pipeline.analyze(inputs, scheduler="serial", sliced_above=0).report
    assert sliced_ranks
    assert helped, "the reading thread took no piece of the NVTX read"
    assert _same(sliced) == _same(whole)
