"""A run of many ranks reported by summary (issue 30): 40 ranks made by ``bench/make_run.py`` from
the real 4×H200 captures, analysed whole (``--detail full``) and by summary (the default above 32
files). The summary is checked against the full report of the same run, and its distributions,
heat maps and worst steps against the full report's per-rank rows with plain Python (``statistics``,
sorting), not with the code that made them.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import jsonschema
import polars as pl
import pytest

from tests.conftest import MANY_RANKS, REPO
from traceguard.pipeline import analyze
from traceguard.report import markdown
from traceguard.report.detail import TABLES, rank_entries
from traceguard.report.summary import SUMMARY_ABOVE_INPUTS, WORST_RANKS, WORST_ROWS

RANKS = MANY_RANKS
SCHEMA = json.loads((REPO / "docs/report.schema.json").read_text())

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(many_ranks: Path) -> Path:
    return many_ranks


@pytest.fixture(scope="module")
def reports(run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, Path | None]]:
    base = tmp_path_factory.mktemp("detail")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(base / "cache"))
        full = analyze([str(run)], scheduler="serial", detail="full")
        summary = analyze([str(run)], scheduler="serial", detail_dir=base / "summary")
        both = analyze([str(run)], scheduler="serial", detail="full", detail_dir=base / "full")
    assert full.detail_folder is None
    return {
        "full": (full.report, None),
        "summary": (summary.report, summary.detail_folder),
        "full+detail": (both.report, both.detail_folder),
    }


def _without(doc: dict, *keys: str) -> dict:
    return {k: v for k, v in doc.items() if k not in (*keys, "generated_at")}


def test_above_32_files_the_report_is_a_summary_and_valid(reports) -> None:
    assert RANKS > SUMMARY_ABOVE_INPUTS
    full, _ = reports["full"]
    summary, folder = reports["summary"]
    assert full["schema_version"] == summary["schema_version"] == "2"
    assert full["detail"] == {"mode": "full", "folder": None, "tables": {}}
    assert summary["detail"]["mode"] == "summary" and summary["detail"]["folder"] == str(folder)
    for doc in (full, summary, reports["full+detail"][0]):
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}"
            for e in jsonschema.Draft202012Validator(SCHEMA).iter_errors(doc)
        ]
        assert errors == []
    assert len(json.dumps(summary)) < len(json.dumps(full)) / 4


def test_a_full_report_with_a_side_output_is_the_full_report(reports) -> None:
    full, _ = reports["full"]
    both, folder = reports["full+detail"]
    assert _without(both, "detail") == _without(full, "detail")
    assert both["detail"]["mode"] == "full" and both["detail"]["folder"] == str(folder)


def test_the_summary_keeps_the_run_and_its_chosen_ranks_as_the_full_report_has_them(reports) -> None:
    full, _ = reports["full"]
    summary, _ = reports["summary"]
    trimmed = ("ranks", "timeline", "run", "detail", "rank_summary", "rank_steps", "worst_steps")
    assert _without(summary, *trimmed) == _without(full, *trimmed)  # checks, inputs, nccl, inspector...
    kept = [e["rank"] for e in summary["rank_summary"]["in_report"]]
    assert 1 <= len(kept) <= WORST_RANKS and all(e["why"] for e in summary["rank_summary"]["in_report"])
    by_rank = {r["rank"]: r for r in full["ranks"]}
    assert [r["rank"] for r in summary["ranks"]] == sorted(kept)
    assert all(r == by_rank[r["rank"]] for r in summary["ranks"])  # phases, per-step collectives reloaded
    timelines = {t["rank"]: t for t in full["timeline"]["ranks"]}
    assert summary["timeline"]["ranks"] == [timelines[r] for r in sorted(kept)]
    run_full, run_summary = full["run"], summary["run"]
    for key in run_full:
        if key in ("collectives", "peer_matrix", "straggler_steps"):
            continue
        assert run_summary[key] == run_full[key], key
    assert run_summary["collectives"] == [c for c in run_full["collectives"] if c["rank"] in kept]
    assert run_summary["straggler_steps"] == run_full["straggler_steps"][:WORST_ROWS]
    late = full["run"]["late_rank"]
    if late:
        assert late["rank"] in kept
    for check in full["checks"]:
        if check["status"] in ("warn", "fail"):
            named = {row.get("rank") for row in check["evidence"]} - {None}
            assert named <= set(kept) or len(kept) == WORST_RANKS, check["id"]


def test_the_side_output_gives_back_every_rank_of_the_full_report(reports) -> None:
    full, _ = reports["full"]
    for name in ("summary", "full+detail"):
        _, folder = reports[name]
        entries = [entry for batch in rank_entries(folder, batch=7) for entry in batch]
        assert entries == full["ranks"], name
    summary, folder = reports["summary"]
    tables = summary["detail"]["tables"]
    assert set(tables) == set(TABLES)
    assert tables["ranks"]["rows"] == RANKS
    assert tables["steps"]["rows"] == sum(len(r["steps"]) for r in full["ranks"])
    assert tables["phases"]["rows"] == sum(len(s["phases"]) for r in full["ranks"] for s in r["steps"])
    steps = pl.read_parquet(folder / "steps" / "*.parquet")
    assert steps.height == tables["steps"]["rows"]
    assert set(tables["steps"]["columns"]) >= {"rank", "position", "index", "nccl_share", "nccl_wait_ns", "lateness_ns"}


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between the closest ranks (the definition in metrics/distributions.py)."""
    ordered = sorted(values)
    at = (len(ordered) - 1) * q
    low = math.floor(at)
    return ordered[low] + (ordered[min(low + 1, len(ordered) - 1)] - ordered[low]) * (at - low)


@pytest.mark.parametrize("key", ["nccl_share_of_step", "nccl_wait_ns", "gpu_span_ns", "nccl_wait_share"])
def test_distributions_match_the_full_reports_ranks(reports, key: str) -> None:
    full, _ = reports["full"]
    summary, _ = reports["summary"]
    values = {r["rank"]: r["metrics"][key] for r in full["ranks"] if r["metrics"][key] is not None}
    found = summary["rank_summary"]["distributions"][key]
    assert found["ranks"] == len(values) and found["unknown"] == RANKS - len(values)
    assert found["min"] == min(values.values()) and found["max"] == max(values.values())
    assert found["p50"] == pytest.approx(statistics.median(values.values()))
    assert found["p95"] == pytest.approx(_percentile(list(values.values()), 0.95))
    assert found["mean"] == pytest.approx(statistics.fmean(values.values()))
    assert found["max_rank"] == min(r for r, v in values.items() if v == found["max"])
    assert sum(found["histogram"]["counts"]) == len(values)


def test_heat_maps_and_worst_steps_are_the_full_reports_steps(reports) -> None:
    full, _ = reports["full"]
    summary, _ = reports["summary"]
    matrix = summary["rank_steps"]
    assert matrix["ranks"] == [r["rank"] for r in full["ranks"]] and not matrix["binned"]
    assert matrix["indices"] == sorted({s["index"] for r in full["ranks"] for s in r["steps"]})
    for field in ("nccl_share", "nccl_wait_ns", "lateness_ns"):
        for row, rank in zip(matrix["fields"][field], full["ranks"], strict=True):
            own = {s["index"]: s[field] for s in rank["steps"]}
            assert row == [own.get(i) for i in matrix["indices"]], (field, rank["rank"])
    steps = [(r["rank"], s) for r in full["ranks"] for s in r["steps"] if s["nccl_wait_ns"] is not None]
    steps.sort(key=lambda rs: (-rs[1]["nccl_wait_ns"], rs[0], rs[1]["index"]))
    worst = summary["worst_steps"]["nccl_wait_ns"]
    assert [(w["rank"], w["index"], w["nccl_wait_ns"]) for w in worst] == [
        (rank, s["index"], s["nccl_wait_ns"]) for rank, s in steps[:WORST_ROWS]
    ]


def test_markdown_of_a_summary_says_what_it_kept_and_where_the_rest_is(reports) -> None:
    summary, folder = reports["summary"]
    text = markdown.render(summary)
    assert f"## Ranks: a summary of {RANKS}" in text
    assert str(folder) in text
    kept = [e["rank"] for e in summary["rank_summary"]["in_report"]]
    assert text.count("\n## Rank ") == len(kept)
    assert "| `nccl_share_of_step` | 40 |" in text


def test_cli_writes_the_side_output_beside_the_report_and_replaces_its_own(run: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    command = [sys.executable, "-m", "traceguard.cli", "analyze", str(run), "--scheduler", "serial", "--out", str(out)]
    for _ in range(2):  # the second run replaces the first's side output
        done = subprocess.run(command, capture_output=True, text=True, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    folder = tmp_path / "report.json.detail"
    assert report["detail"]["folder"] == str(folder)
    assert pl.scan_parquet(folder / "ranks" / "*.parquet").select(pl.len()).collect().item() == RANKS
    taken = tmp_path / "taken"
    (taken / "mine.txt").parent.mkdir()
    (taken / "mine.txt").write_text("not a side output")
    done = subprocess.run([*command[:-2], "--detail-out", str(taken)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "exists and is not empty" in " ".join(done.stderr.split())
    assert (taken / "mine.txt").read_text() == "not a side output"
    done = subprocess.run([*command, "--detail", "most"], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 2 and "--detail must be full, summary or auto" in " ".join(done.stderr.split())


def test_the_python_frames_of_a_summary_hold_every_rank(reports) -> None:
    from traceguard.notebook import Analysis

    full, _ = reports["full"]
    summary, _ = reports["summary"]
    whole, partial = Analysis.from_report(full), Analysis.from_report(summary)
    assert len(summary["ranks"]) < RANKS
    assert partial.ranks == full["ranks"]
    for frame in ("steps", "phases", "waits", "collectives", "peers", "metrics"):
        assert getattr(partial, frame).equals(getattr(whole, frame)), frame
    assert repr(partial).endswith(f"ranks={RANKS} profile={full['profile']['name']}>")


@pytest.fixture(scope="module")
def other_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """The same real ranks laid out again, each rank made from the next source rank (rank 0 from the
    job's rank 1, ...), analysed whole and by summary: a second run whose steps differ, to compare with."""
    base = tmp_path_factory.mktemp("other")
    out = base / "run40b"
    sources = [str(REPO / "tests/fixtures/h200x4/p2p_nsys" / f"cap_{i}.sqlite.gz") for i in (1, 2, 3, 0)]
    command = [sys.executable, str(REPO / "bench/make_run.py"), "--ranks", str(RANKS), "--kernels-per-rank", "5308"]
    subprocess.run([*command, "--sources", *sources, "--out", str(out)], check=True, capture_output=True)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TRACEGUARD_CACHE_DIR", str(base / "cache"))
        return {
            "full": analyze([str(out)], scheduler="serial", detail="full").report,
            "summary": analyze([str(out)], scheduler="serial", detail_dir=base / "summary").report,
        }


def test_comparing_two_summaries_pairs_every_rank_s_steps(reports, other_run) -> None:
    from traceguard.report.compare import compare

    full, _ = reports["full"]
    summary, _ = reports["summary"]
    whole = compare(full, other_run["full"])
    assert len(whole["steps"]) == sum(len(r["steps"]) for r in full["ranks"])
    assert any(row["gpu_span_ns_delta"] for row in whole["steps"])  # each rank is another real rank now
    # With the side outputs: the very comparison of the full reports.
    assert compare(summary, other_run["summary"]) == whole
    # Stored without them (the service): every rank's step from the heat maps, their fields exact.
    stored = [{**doc, "detail": {**doc["detail"], "folder": None}} for doc in (summary, other_run["summary"])]
    from_maps = compare(*stored)["steps"]
    assert any(row["nccl_share_delta"] for row in from_maps)
    assert [(r["rank"], r["index"]) for r in from_maps] == [(r["rank"], r["index"]) for r in whole["steps"]]
    for got, want in zip(from_maps, whole["steps"], strict=True):
        for field in ("nccl_share", "nccl_wait_ns", "lateness_ns", "gpu_span_ns"):
            for side in ("base", "head", "delta"):
                assert got[f"{field}_{side}"] == pytest.approx(want[f"{field}_{side}"]), (got["rank"], field, side)


def test_no_usable_input_leaves_no_side_output(tmp_path: Path) -> None:
    """33 files of random bytes: exit 2 with the inputs' errors, and neither a folder the analysis
    made nor the contents of an empty one it was given are left behind."""
    import random

    run = tmp_path / "garbage"
    run.mkdir()
    rng = random.Random(5)
    for rank in range(33):
        (run / f"rank{rank:03d}.sqlite").write_bytes(bytes(rng.randrange(256) for _ in range(4096)))
    given = tmp_path / "given"
    given.mkdir()
    command = [sys.executable, "-m", "traceguard.cli", "analyze", str(run), "--scheduler", "serial", "-f", "json"]
    for folder, existed in ((tmp_path / "made", False), (given, True)):
        done = subprocess.run([*command, "--detail-out", str(folder)], capture_output=True, text=True)
        assert done.returncode == 2 and "no usable input" in " ".join(done.stderr.split())
        assert "Traceback" not in done.stderr
        assert folder.is_dir() == existed and (not existed or list(folder.iterdir()) == [])
