"""The run's analysis as a map per input file and a reduce over ranks (traceguard.mapreduce).

The oracle is the whole-in-memory path the pipeline used before: every capture loaded at once
(``load_run``), ranks resolved together, then ``analyse_run``. Whatever runs the map (this
process, a local process pool, a real ``dask.distributed`` cluster), the report must be that
report, byte for byte apart from ``generated_at`` — also where planning ranks without reading
the files guesses wrong (a file with two GPU processes, an unreadable file shifting position
guesses, a file whose content states another rank than its name, a duplicate).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import threading
from pathlib import Path
from typing import Any

import orjson
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import OWN, public_nsys
from traceguard import pipeline
from traceguard.checks.profiles import load_profile
from traceguard.checks.rules import evaluate
from traceguard.cli import app
from traceguard.ingest import load_run
from traceguard.ingest.sides import SideData, SideFiles, discover, load_side
from traceguard.mapreduce import SCHEDULER_ENV, peek_rank
from traceguard.metrics.link_counters import capture_link_rows, capture_null_reason
from traceguard.metrics.links import analyse_links
from traceguard.metrics.run import analyse_run
from traceguard.report import document

H200 = OWN / "h200"
H200X4 = OWN / "h200x4" / "p2p_nsys"
TORCH = sorted((H200 / "p2p_torch").glob("rank*.trace.json.gz"))


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))
    monkeypatch.delenv(SCHEDULER_ENV, raising=False)


def _whole_in_memory(inputs: list[str]) -> dict[str, Any]:
    """The report as the pipeline made it with every capture in memory at once."""
    profile = load_profile("production")
    files = SideFiles()
    for item in inputs:
        if Path(item).is_dir():
            files.extend(discover(Path(item)))
    side = load_side(files) if files.any() else SideData()
    loaded = load_run(inputs)
    result = analyse_run(
        [(r.rank, r.capture) for r in loaded.ranks],
        step_patterns=profile.step_patterns,
        small_bytes=profile.rule("small_collectives").params.get("small_bytes"),
    )
    links = analyse_links(
        side,
        peak_busbw_gbps=profile.rule("p2p_utilization").params.get("peak_busbw_gbps"),
        rated_pcie_gbps=profile.rule("pcie_saturation").params.get("rated_pcie_gbps"),
        capture=capture_link_rows(result.ranks),
        capture_reason=capture_null_reason(result.ranks),
        capture_pcie_share=profile.rule("transport_p2p").params.get("capture_pcie_share"),
        capture_nvlink_share=profile.rule("transport_p2p").params.get("capture_nvlink_share"),
    )
    result.links = links
    result.metrics.update(links.metrics)
    result.null_reasons.update(links.null_reasons)
    return document.build(loaded.inputs, result, evaluate(result, profile), profile, side=side)


def _same(report: dict[str, Any]) -> bytes:
    """The report without its one per-analysis field, as bytes."""
    return orjson.dumps({k: v for k, v in report.items() if k != "generated_at"}, option=orjson.OPT_SORT_KEYS)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory, unpacked) -> dict[str, list[str]]:
    """Runs where a plan made without reading the files is wrong, and one where it is right."""
    root = tmp_path_factory.mktemp("mapreduce")
    empty = root / "truncated.sqlite"
    empty.write_bytes(b"")
    stated = peek_rank(unpacked(H200 / "p2p_nsys" / "cap_1.sqlite.gz"))
    assert stated is not None
    misnamed = root / f"cap_{stated + 3}.sqlite"  # the file says one rank, its name another
    shutil.copy(unpacked(H200 / "p2p_nsys" / "cap_1.sqlite.gz"), misnamed)
    twin = root / "rank0.trace.json.gz"  # the same rank twice
    shutil.copy(TORCH[0], twin)
    mock, other = str(unpacked(public_nsys("mock"))), str(unpacked(public_nsys("at_ee4fcf3")))
    return {
        # Two GPU processes in the first file: it takes ranks 0 and 1, the next guess moves to 2.
        "two_processes_first": [str(unpacked(public_nsys("h100_2gpu_1s"))), mock],
        # The same file alone: it confirms its own two ranks as it is read (no second read).
        "two_processes_alone": [str(unpacked(public_nsys("h100_2gpu_1s")))],
        # The unreadable first file shifts both position guesses down by one.
        "unreadable_first": [str(empty), mock, other],
        "file_beats_name": [str(misnamed), str(TORCH[0])],
        "duplicate": [str(TORCH[0]), str(twin)],
        "bundle_of_four": [str(H200X4)],
        "kineto_pair": [str(t) for t in TORCH],
    }


CASES = [
    "two_processes_first",
    "two_processes_alone",
    "unreadable_first",
    "file_beats_name",
    "duplicate",
    "bundle_of_four",
    "kineto_pair",
]


@pytest.mark.parametrize("case", CASES)
def test_serial_map_gives_the_whole_in_memory_report(cases: dict[str, list[str]], case: str) -> None:
    expected = _whole_in_memory(cases[case])
    got = pipeline.analyze(cases[case], scheduler="serial").report
    assert _same(got) == _same(expected)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_process_pool_map_gives_the_whole_in_memory_report(cases: dict[str, list[str]], case: str) -> None:
    expected = _whole_in_memory(cases[case])
    got = pipeline.analyze(cases[case], scheduler="local", jobs=2).report
    assert _same(got) == _same(expected)


@pytest.mark.parametrize("sliced_above", [None, 0], ids=["whole", "sliced"])
def test_a_lone_file_of_two_ranks_is_read_once(
    cases: dict[str, list[str]], monkeypatch: pytest.MonkeyPatch, sliced_above: int | None
) -> None:
    """Planned as one rank (nothing read yet), the export holds two GPU processes: as the run's
    only input it takes ranks 0 and 1 as it is read, which the run's check then confirms, rather
    than being read (and, in slices, analysed) a second time under them. With two inputs the
    check still plans again (``two_processes_first``)."""
    from traceguard import mapreduce
    from traceguard.ingest import nsys_slices

    reads: list[str] = []
    whole, sliced = mapreduce.read_capture, nsys_slices.open_sliced

    def counted_whole(path: Path, **kwargs: Any) -> Any:
        reads.append("whole")
        return whole(path, **kwargs)

    def counted_sliced(path: Path, **kwargs: Any) -> Any:
        reads.append("sliced")
        return sliced(path, **kwargs)

    monkeypatch.setattr(mapreduce, "read_capture", counted_whole)
    monkeypatch.setattr(nsys_slices, "open_sliced", counted_sliced)
    report = pipeline.analyze(cases["two_processes_alone"], scheduler="serial", sliced_above=sliced_above).report
    assert [i["ranks"] for i in report["inputs"]] == [[0, 1]] and len(report["ranks"]) == 2
    assert reads == ["sliced" if sliced_above == 0 else "whole"]
    reads.clear()
    pipeline.analyze(cases["two_processes_first"], scheduler="serial", sliced_above=sliced_above)
    assert len(reads) == 4  # both again once the plan is checked: the first's two ranks move the second's


def test_the_plan_is_checked_against_what_the_files_say(cases: dict[str, list[str]]) -> None:
    """The cases above do exercise wrong plans: the ranks the reads confirm differ from the guesses."""
    report = pipeline.analyze(cases["two_processes_first"], scheduler="serial").report
    assert [(i["ranks"], i["rank_source"]) for i in report["inputs"]] == [([0, 1], "position"), ([2], "position")]
    report = pipeline.analyze(cases["unreadable_first"], scheduler="serial").report
    assert [i["ranks"] for i in report["inputs"]] == [[], [0], [1]]
    assert report["inputs"][0]["error"]
    report = pipeline.analyze(cases["duplicate"], scheduler="serial").report
    assert report["inputs"][1]["error_code"] == "duplicate_rank" and len(report["ranks"]) == 1


@pytest.mark.slow
def test_a_dask_cluster_gives_the_same_report(cases: dict[str, list[str]]) -> None:
    """A real dask.distributed cluster of two worker processes; paths relative to the caller's
    directory still name the files as given."""
    distributed = pytest.importorskip("distributed")
    inputs = [str(H200X4), *cases["two_processes_first"]]
    expected = _whole_in_memory(inputs)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        got = pipeline.analyze(inputs, scheduler=cluster.scheduler_address).report
        relative = pipeline.analyze([str(H200X4.relative_to(Path.cwd()))], scheduler=cluster.scheduler_address).report
    assert _same(got) == _same(expected)
    assert all(i["error"] is None for i in relative["inputs"])
    assert [i["path"] for i in relative["inputs"]] == [
        i["path"] for i in pipeline.analyze([str(H200X4.relative_to(Path.cwd()))], scheduler="serial").report["inputs"]
    ]


def test_progress_counts_every_input_once(cases: dict[str, list[str]]) -> None:
    seen: list[tuple[int, int]] = []
    inputs = cases["unreadable_first"]
    pipeline.analyze(inputs, scheduler="serial", on_ranks=lambda done, total: seen.append((done, total)))
    assert seen == [(i, len(inputs)) for i in range(1, len(inputs) + 1)]


def test_cli_scheduler_choices(tmp_path: Path) -> None:
    runner = CliRunner()
    serial = tmp_path / "serial.json"
    pool = tmp_path / "pool.json"
    for target, extra in ((serial, ["--scheduler", "serial"]), (pool, ["--scheduler", "local", "-j", "2"])):
        result = runner.invoke(app, ["analyze", str(H200X4), "-f", "json", "-o", str(target), *extra])
        assert result.exit_code == 0, result.output
    assert _same(orjson.loads(serial.read_bytes())) == _same(orjson.loads(pool.read_bytes()))
    bad = runner.invoke(app, ["analyze", str(H200X4), "--scheduler", "yarn"])
    assert bad.exit_code == 2
    assert "unknown scheduler 'yarn'" in bad.output and "tcp://host:8786" in bad.output


def test_scheduler_from_the_environment_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SCHEDULER_ENV, "spark://nowhere")
    result = CliRunner().invoke(app, ["analyze", str(H200X4)])
    assert result.exit_code == 2 and "unknown scheduler 'spark://nowhere'" in result.output


def _kill_fifo_openers(stop: threading.Event, killed: list[int]) -> None:
    """SIGKILL each descendant of this process that waits to open a named pipe (the kernel's
    ``wait_for_partner``), as the OOM killer would kill a worker."""
    me = os.getpid()
    while not stop.is_set():
        parent: dict[int, int] = {}
        waiting: list[int] = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                status = (entry / "status").read_text()
                # Any thread of it: a Dask worker reads on a thread of its own.
                wchans = {(task / "wchan").read_text() for task in (entry / "task").iterdir()}
            except OSError:
                continue
            ppid = next((line.split()[1] for line in status.splitlines() if line.startswith("PPid:")), "0")
            parent[int(entry.name)] = int(ppid)
            if "wait_for_partner" in wchans:
                waiting.append(int(entry.name))
        for pid in waiting:
            ancestor = parent.get(pid, 0)
            while ancestor not in (0, 1, me):
                ancestor = parent.get(ancestor, 0)
            if ancestor == me:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
        stop.wait(0.1)


@pytest.mark.slow
def test_a_worker_that_dies_loses_only_its_input(tmp_path: Path) -> None:
    """A pipe no one writes to keeps its reader waiting; the reader is killed each time, as a worker
    out of memory would be. That input becomes ``worker_lost`` after its retries; the other ranks
    of the run are analysed as without it."""
    stuck = tmp_path / "rank7.sqlite"
    os.mkfifo(stuck)
    inputs = [str(t) for t in TORCH]
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_fifo_openers, args=(stop, killed), daemon=True)
    killer.start()
    try:
        report = pipeline.analyze([*inputs, str(stuck)], scheduler="local", jobs=2).report
    finally:
        stop.set()
        killer.join()
    lost = report["inputs"][-1]
    assert lost["error_code"] == "worker_lost" and "rank7.sqlite" in lost["error"]
    assert len(killed) == 3  # tried in the pool, again in a new pool, then alone
    expected = _whole_in_memory(inputs)
    assert report["ranks"] == expected["ranks"] and report["checks"] == expected["checks"]


@pytest.mark.slow
def test_a_dask_worker_that_dies_loses_only_its_input(tmp_path: Path) -> None:
    """The same on a dask.distributed cluster: the scheduler gives up on the task after its
    allowed failures (KilledWorker); the input is ``worker_lost`` and the others are analysed."""
    distributed = pytest.importorskip("distributed")
    stuck = tmp_path / "rank7.sqlite"
    os.mkfifo(stuck)
    inputs = [str(t) for t in TORCH]
    stop, killed = threading.Event(), []
    killer = threading.Thread(target=_kill_fifo_openers, args=(stop, killed), daemon=True)
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster:
        killer.start()
        try:
            report = pipeline.analyze([*inputs, str(stuck)], scheduler=cluster.scheduler_address).report
        finally:
            stop.set()
            killer.join()
    lost = report["inputs"][-1]
    assert lost["error_code"] == "worker_lost" and "KilledWorker" in lost["error"]
    assert len(killed) >= 2
    expected = _whole_in_memory(inputs)
    assert report["ranks"] == expected["ranks"] and report["checks"] == expected["checks"]


def test_the_local_pool_reads_with_a_share_of_the_cores() -> None:
    """Each process of the local pool reads with its share of the cores (no second reader per
    map when the pool already keeps every core busy; nsys_sqlite.share_cores)."""
    from traceguard import mapreduce
    from traceguard.ingest import nsys_sqlite

    with mapreduce.map_pool(2) as pool:
        got = pool.submit(nsys_sqlite._free_cores).result()
    assert got == max(1, mapreduce.default_jobs() // 2)


@pytest.mark.slow
def test_dask_maps_read_with_their_share_of_the_host() -> None:
    """On Dask, a map's reads share the host's cores with every worker thread on that host."""
    distributed = pytest.importorskip("distributed")
    from traceguard import mapreduce
    from traceguard.ingest import InputSpec, nsys_sqlite

    task = mapreduce.MapTask(0, InputSpec(path=TORCH[0]), None, 1, mapreduce.MapOptions())
    with (
        distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0") as cluster,
        distributed.Client(cluster) as client,
    ):
        sharers = mapreduce._threads_per_host(client)
        assert list(sharers.values()) == [2]
        for address in client.scheduler_info()["workers"]:
            outcome = client.submit(mapreduce._map_on_worker, task, sharers, workers=[address], pure=False).result()
            assert outcome.record.error is None
        cores = client.run(lambda: len(os.sched_getaffinity(0)))
        shares = client.run(nsys_sqlite._free_cores)
    assert shares == {address: max(1, n // 2) for address, n in cores.items()}


def test_a_scheduler_without_n_workers_leaves_each_read_alone() -> None:
    """distributed before ``scheduler_info(n_workers=)``: no host counts, so every read on a
    worker takes all the cores it may run on (as before share_cores existed)."""
    from traceguard import mapreduce

    class OlderClient:  # the older signature: scheduler_info(self, **kwargs) had no n_workers
        def scheduler_info(self) -> dict[str, Any]:
            return {"workers": {"tcp://10.0.0.1:1": {"host": "10.0.0.1", "nthreads": 4}}}

    assert mapreduce._threads_per_host(OlderClient()) == {}


@pytest.mark.parametrize(("part_ranks", "part_bytes"), [(1, 4 << 20), (128, 4 << 20), (128, 1)])
@pytest.mark.parametrize("case", CASES)
def test_the_side_output_keeps_only_the_rows_the_report_uses(
    cases: dict[str, list[str]],
    case: str,
    part_ranks: int,
    part_bytes: int,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inputs mapped again under other ranks, unreadable ones and duplicates leave no stale rows in
    a summary's side output, whether their first rows were still buffered or already written in a
    part (of every table, or of one table whose rows filled a part): it gives back exactly the
    ranks of the full report (issue 30)."""
    from traceguard.report import detail
    from traceguard.report.detail import rank_entries

    monkeypatch.setattr(detail, "PART_RANKS", part_ranks)
    monkeypatch.setattr(detail, "PART_BYTES", part_bytes)
    full = pipeline.analyze(cases[case], scheduler="serial", detail="full").report
    summary = pipeline.analyze(cases[case], scheduler="serial", detail="summary", detail_dir=tmp_path / "d")
    assert summary.report["detail"]["mode"] == "summary"
    assert [e for batch in rank_entries(tmp_path / "d") for e in batch] == full["ranks"]
    tables = summary.report["detail"]["tables"]
    assert tables["phases"]["rows"] == sum(len(s["phases"]) for r in full["ranks"] for s in r["steps"])
    assert tables["collective_steps"]["rows"] == sum(len(r["collectives_by_type"]["steps"]) for r in full["ranks"])
    assert tables["timelines"]["rows"] == len(full["timeline"]["ranks"])
    kept = {r["rank"]: r for r in summary.report["ranks"]}
    assert kept and all(kept[rank] == r for r in full["ranks"] if (rank := r["rank"]) in kept)


def test_side_output_parts_share_one_schema(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank whose steps have link counters (nsys GPU metrics) and one whose steps have none
    (a Kineto trace), each in a part of its own: the parts are given one schema, so the folder
    reads as one table with plain ``scan_parquet`` and gives back both ranks exactly."""
    from traceguard.report import detail
    from traceguard.report.detail import TABLES, rank_entries

    monkeypatch.setattr(detail, "PART_RANKS", 1)
    inputs = [f"{OWN / 'h200x2_links' / 'p2p' / 'cap_0.sqlite.gz'}:0", f"{TORCH[1]}:1"]
    full = pipeline.analyze(inputs, scheduler="serial", detail="full").report
    pipeline.analyze(inputs, scheduler="serial", detail="summary", detail_dir=tmp_path / "d")
    for table in TABLES:
        files = sorted((tmp_path / "d" / table).glob("*.parquet"))
        assert len({tuple(pl.read_parquet_schema(f).items()) for f in files}) <= 1, table
    steps = pl.scan_parquet(tmp_path / "d" / "steps" / "*.parquet").collect()
    assert sorted(set(steps["rank"])) == [0, 1]
    assert steps.filter(pl.col("rank") == 0)["nvlink_avg_pct"].is_not_null().any()
    assert steps.filter(pl.col("rank") == 1)["nvlink_avg_pct"].is_null().all()
    assert [e for batch in rank_entries(tmp_path / "d") for e in batch] == full["ranks"]


@pytest.mark.parametrize(
    ("capture", "expected_early"),
    [(H200 / "p2p_nsys" / "cap_0.sqlite.gz", True), (public_nsys("mfu_2gpu_before"), False)],
    ids=["one rank", "two ranks"],
)
def test_steps_inferred_while_the_launches_are_joined_give_the_same_report(
    unpacked, monkeypatch: pytest.MonkeyPatch, capture: Path, expected_early: bool
) -> None:
    """A file read whole whose steps come from its kernel sequence has them inferred on a thread
    while the read joins its ops' launches (inference reads no launch column): the report is the
    one of inferring them after the read; a file of two ranks is left to each rank's analysis."""
    from traceguard import mapreduce

    inputs = [str(unpacked(capture))]
    used: list[bool] = []
    steps_of = mapreduce._EarlySteps.steps_of

    def spied(self: Any, rank: int) -> Any:
        found = steps_of(self, rank)
        used.append(found is not None)
        return found

    monkeypatch.setattr(mapreduce._EarlySteps, "steps_of", spied)
    early = pipeline.analyze(inputs, scheduler="serial", step_sources=["inferred"], sliced_above=1 << 40).report
    assert used == ([True] if expected_early else [])
    assert {r["step_source"] for r in early["ranks"]} == {"inferred"}
    monkeypatch.setattr(mapreduce._EarlySteps, "start", lambda self, capture: None)
    late = pipeline.analyze(inputs, scheduler="serial", step_sources=["inferred"], sliced_above=1 << 40).report
    assert _same(early) == _same(late)


def test_a_failure_of_the_early_step_search_is_not_taken_for_a_damaged_file(
    unpacked, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The early search starts inside the read, whose errors become the input's ("a damaged nsys
    export"); its own work runs on its thread and fails where the rank's analysis would: a fault
    of the analysis stays one, not an error blamed on the file."""
    import traceguard.metrics.sliced as sliced_module

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise pl.exceptions.InvalidOperationError("a fault of the analysis")

    monkeypatch.setattr(sliced_module, "steps_from_ranges", broken)
    inputs = [str(unpacked(H200 / "p2p_nsys" / "cap_0.sqlite.gz"))]
    with pytest.raises(pl.exceptions.InvalidOperationError, match="a fault of the analysis"):
        pipeline.analyze(inputs, scheduler="serial", step_sources=["inferred"], sliced_above=1 << 40)
