"""The public Python API (``traceguard.analyze`` → Polars frames, ``traceguard.compare``) on real
captures, every expected number computed here from the raw file with plain sqlite3 / json; and the
example notebook in docs/examples executed end to end (nbclient), so it cannot rot."""

from __future__ import annotations

import json
import re
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import polars as pl
import pytest

import traceguard
from tests.conftest import OWN, REPO, public_kineto, public_nsys
from traceguard.errors import NoUsableInputError

P2P = OWN / "h200" / "p2p_nsys"
SHM = OWN / "h200" / "shm_nsys"
_COPY_KINDS = {1: "HtoD", 2: "DtoH", 8: "DtoD", 10: "PtoP"}


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEGUARD_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tg-cache"))


@pytest.fixture(scope="module")
def p2p() -> traceguard.Analysis:
    return traceguard.analyze(P2P)


def _nvtx(db: sqlite3.Connection) -> list[tuple[str, int, int, int]]:
    """(name, start, end, thread) of the push/pop and start/end ranges."""
    names = dict(db.execute("SELECT id, value FROM StringIds"))
    return [
        (text if text is not None else names.get(text_id, ""), start, end, tid)
        for text, text_id, start, end, tid in db.execute(
            "SELECT text, textId, start, end, globalTid FROM NVTX_EVENTS "
            "WHERE eventType IN (59, 60) AND end IS NOT NULL"
        )
    ]


def test_steps_and_phases_match_the_nvtx_ranges(p2p: traceguard.Analysis, unpacked) -> None:
    """Each step row is a `Batch N` range of the rank's file (CPU time = its length); each phase
    row a range directly inside it (summed when a name repeats)."""
    assert p2p.verdict == p2p.report["verdict"] and "Analysis verdict=" in repr(p2p)
    for rank in (0, 1):
        db = sqlite3.connect(unpacked(P2P / f"cap_{rank}.sqlite.gz"))
        ranges = _nvtx(db)
        steps = p2p.steps.filter(pl.col("rank") == rank).sort("step_index")
        batches = {name: (start, end, tid) for name, start, end, tid in ranges if re.fullmatch(r"Batch \d+", name)}
        assert steps.height > 0
        for row in steps.iter_rows(named=True):
            start, end, tid = batches[row["name"]]
            assert row["cpu_ns"] == end - start
            inside: dict[str, int] = defaultdict(int)
            for name, s, e, t in ranges:
                if t == tid and start < s and e <= end and name != row["name"]:
                    inside[name] += e - s
            phases = p2p.phases.filter((pl.col("rank") == rank) & (pl.col("step_index") == row["step_index"]))
            assert dict(zip(phases["phase"], phases["cpu_ns"], strict=True)) == dict(inside)
            assert (phases["step"] == row["name"]).all()
        shares = (steps["nccl_ns"] / steps["gpu_span_ns"]).to_list()
        assert shares == pytest.approx(steps["nccl_share"].to_list())


def test_copies_match_sql(p2p: traceguard.Analysis, unpacked) -> None:
    for rank in (0, 1):
        db = sqlite3.connect(unpacked(P2P / f"cap_{rank}.sqlite.gz"))
        expected = {
            ("memcpy", _COPY_KINDS[kind]): (count, total)
            for kind, count, total in db.execute(
                "SELECT copyKind, COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY GROUP BY copyKind"
            )
        }
        ((count, total),) = db.execute("SELECT COUNT(*), SUM(bytes) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchall()
        expected[("memset", None)] = (count, total)
        got = p2p.copies.filter(pl.col("rank") == rank)
        assert {(r["kind"], r["copy_kind"]): (r["ops"], r["bytes"]) for r in got.iter_rows(named=True)} == expected


def test_collectives_checks_metrics_and_timeline_frames(p2p: traceguard.Analysis, unpacked) -> None:
    for rank in (0, 1):
        db = sqlite3.connect(unpacked(P2P / f"cap_{rank}.sqlite.gz"))
        batches = [(s, e) for name, s, e, _ in _nvtx(db) if re.fullmatch(r"Batch \d+", name)]
        # A kernel belongs to the step whose range holds its launch call (DESIGN.md, "Steps").
        launched = [
            (re.match(r"nccl(?:Dev)?Kernel_([A-Za-z]+)", name).group(1), launch)
            for name, launch in db.execute(
                "SELECT s.value, r.start FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
                "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId "
                "WHERE s.value LIKE 'nccl%Kernel_%'"
            )
        ]
        in_steps = Counter(kind for kind, launch in launched if any(s <= launch <= e for s, e in batches))
        assert len(launched) > sum(in_steps.values())  # some ran outside the steps: not counted
        totals = p2p.collectives.filter((pl.col("rank") == rank) & pl.col("step_index").is_null())
        assert dict(zip(totals["collective"], totals["count"], strict=True)) == dict(in_steps)
        per_step = p2p.collectives.filter((pl.col("rank") == rank) & pl.col("step_index").is_not_null())
        assert per_step["count"].sum() == totals["count"].sum()
    report = json.loads(json.dumps(p2p.report))
    assert p2p.checks.select("id", "status").rows() == [(c["id"], c["status"]) for c in report["checks"]]
    run_metrics = p2p.metrics.filter(pl.col("rank").is_null())
    values = dict(zip(run_metrics["metric"], run_metrics["value"], strict=True))
    assert values["nccl_exposed_ns"] == report["run"]["metrics"]["nccl_exposed_ns"]
    exposed = p2p.timeline.filter(pl.col("lane") == "exposed")
    assert exposed["busy_ns"].sum() == report["run"]["metrics"]["nccl_exposed_ns"]
    assert set(p2p.timeline["kind"]) == {"step", "phase", "compute", "nccl", "exposed", "memcpy"}


def test_peers_match_sql(tmp_path: Path, unpacked) -> None:
    """Two GPU processes of one file exchanging SendRecv kernels: each rank's one peer is the other."""
    path = public_nsys("mfu_2gpu_before")
    run = traceguard.analyze(path, step_source="window")
    db = sqlite3.connect(unpacked(path))
    per_device = dict(
        db.execute(
            "SELECT k.deviceId, COUNT(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value LIKE 'ncclDevKernel_SendRecv%' GROUP BY k.deviceId"
        )
    )
    assert run.peers.select("rank", "peer", "kernels").rows() == [(0, 1, per_device[0]), (1, 0, per_device[1])]


def test_kineto_steps_match_the_profiler_steps(unpacked) -> None:
    path = public_kineto("trace_filter__sampled_rank-0")
    run = traceguard.analyze(path)
    with open(unpacked(path)) as fh:
        events = json.load(fh)["traceEvents"]
    steps = {e["name"]: round(float(e["dur"]) * 1000) for e in events if e.get("name", "").startswith("ProfilerStep#")}
    assert dict(zip(run.steps["name"], run.steps["cpu_ns"], strict=True)) == steps
    sendrecv = sum(1 for e in events if e.get("cat") == "kernel" and "SendRecv" in e.get("name", ""))
    totals = run.collectives.filter(pl.col("step_index").is_null() & (pl.col("collective") == "SendRecv"))
    assert totals["count"].sum() == sendrecv


def test_compare_and_report_round_trip(p2p: traceguard.Analysis, tmp_path: Path) -> None:
    shm = traceguard.analyze(SHM)
    diff = traceguard.compare(p2p, shm)
    base = dict(p2p.checks.select("id", "status").rows())
    head = dict(shm.checks.select("id", "status").rows())
    assert diff["regressions"] == [c for c in base if base[c] == "pass" and head[c] in ("warn", "fail")]
    assert "transport_p2p" in diff["regressions"]
    # SHM → P2P: no link check regresses; the cross-rank ones do (rank 1's lateness, docs/collectives.md).
    assert set(traceguard.compare(shm, p2p)["regressions"]) <= {"collective_wait", "straggler"}
    share = next(m for m in diff["metrics"] if m["metric"] == "nccl_share_of_step")
    assert share["delta_pp"] == pytest.approx(100 * (share["head"] - share["base"]))
    steps = pl.DataFrame(diff["steps"])
    assert steps.height == p2p.steps.height and (steps["gpu_span_ns_delta"] > 0).all()
    path = tmp_path / "report.json"
    path.write_text(json.dumps(p2p.report))
    loaded = traceguard.Analysis.from_report(path)
    assert loaded.steps.equals(p2p.steps) and loaded.raw is None
    with pytest.raises(ValueError, match="captures"):
        _ = loaded.copies
    page = p2p.to_html(tmp_path / "report.html")
    assert (tmp_path / "report.html").read_text() == page and "id=\"timeline\"" in page
    assert "traceguard verdict" in p2p._repr_html_()


BUCKET25 = OWN / "h200" / "p2p_nsys_bucket25"
WAIT_COLUMNS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "period_ns",
    "compute_ns",
    "comm_ns",
    "comm_wait_ns",
    "comm_transfer_ns",
    "copy_ns",
    "idle_host_ns",
    "idle_other_ns",
    "lateness_ns",
)


def test_who_waits_for_whom_frames() -> None:
    """2×H200 DDP with 25 MB buckets: rank 0 reaches 110 of 111 all-reduces last. The frames carry
    the report's numbers; each step's GPU time parts add up to its period (one device a rank), every
    call of a step was matched so wait + transfer is the step's NCCL time, and the per-rank split
    adds up to the run's."""
    run = traceguard.analyze(BUCKET25)
    report = run.report
    report_steps = [(r["rank"], s["index"], *(s[c] for c in WAIT_COLUMNS)) for r in report["ranks"] for s in r["steps"]]
    assert run.steps.select("rank", "step_index", *WAIT_COLUMNS).rows() == report_steps
    parts = run.steps.select(
        pl.sum_horizontal("compute_ns", "comm_ns", "copy_ns", "idle_host_ns", "idle_other_ns") == pl.col("period_ns"),
        (pl.col("nccl_wait_ns") + pl.col("nccl_transfer_ns")) == pl.col("nccl_ns"),
    )
    assert parts.to_series(0).all() and parts.to_series(1).all()

    late = run.late_rank
    assert late is not None and (late["rank"], late["last_arrivals"], late["of"]) == (0, 110, 111)
    waits = run.waits
    assert waits["rank"].to_list() == [0, 1] and waits["is_late_rank"].to_list() == [True, False]
    assert waits["last_arrivals"].to_list() == [110, 1] and waits["last_arrivals_of"].to_list() == [111, 111]
    metrics = report["run"]["metrics"]
    assert waits["nccl_wait_ns"].sum() == metrics["nccl_wait_ns"]
    assert waits["nccl_transfer_ns"].sum() == metrics["nccl_transfer_ns"]
    assert waits["nccl_wait_share"].to_list() == pytest.approx(
        (waits["nccl_wait_ns"] / (waits["nccl_wait_ns"] + waits["nccl_transfer_ns"])).to_list()
    )
    assert run.clock_alignment is not None and run.clock_alignment["trusted"]
    assert waits["clock_residual_ns"].to_list() == [c["residual_ns"] for c in run.clock_alignment["ranks"]]
    assert waits["clock_offset_ns"][0] == 0 and waits["null_reason"].null_count() == 2
    # The rank × step lateness: rank 0 is the late one in every step, rank 1 never.
    lateness = run.steps.pivot("rank", index="step_index", values="lateness_ns").sort("step_index")
    assert (lateness["0"] > 0).all() and (lateness["1"] == 0).all()
    assert run.arrivals["latest_rank"].to_list() == [0, 0, 0]
    assert run.arrivals["spread"].to_list() == sorted(run.arrivals["spread"].to_list(), reverse=True)

    alone = traceguard.Analysis.from_report(traceguard.analyze(BUCKET25 / "cap_0.sqlite.gz").report)
    assert alone.late_rank is None and alone.arrivals.height == 0
    assert alone.waits.select("rank", "nccl_wait_ns", "is_late_rank", "null_reason").rows() == [
        (0, None, None, "needs at least two ranks")
    ]
    assert alone.steps["lateness_ns"].null_count() == alone.steps.height
    assert alone.steps["period_ns"].null_count() == 0  # one rank's own breakdown needs no other rank


def test_bad_input_raises_the_projects_error(tmp_path: Path) -> None:
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not a database")
    with pytest.raises(NoUsableInputError, match=r"junk\.sqlite: not a capture"):
        traceguard.analyze(junk)


@pytest.mark.slow
def test_example_notebook_runs(tmp_path: Path) -> None:
    """docs/examples/analyze_and_compare.ipynb, executed as a reader would (a fresh kernel)."""
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(REPO / "docs" / "examples" / "analyze_and_compare.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO / "docs" / "examples")}}
    ).execute()
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "\n".join(str(o.get("data", {}).get("text/plain", o.get("text", ""))) for o in outputs)
    assert "transport_p2p" in text  # the comparison cell names the regression
