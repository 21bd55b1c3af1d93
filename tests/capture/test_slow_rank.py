"""``--slow-rank R:MS``: the option's syntax, and real 2-rank gloo jobs where rank 1 is late by a known sleep.

The evidence is what the captures themselves hold, read with plain JSON and SQL: rank 1's ``get batch``
ranges are longer than rank 0's by the sleep, under torch.profiler and under the real nsys.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sqlite3
import statistics
from pathlib import Path

import pytest

from tests.conftest import diagnostics_besides_relaunches
from traceguard.capture import harness
from traceguard.capture.slow_rank import merge_slow_ranks, parse_slow_rank

SLEEP_MS = 40.0
FAST = ["--world-size", "2", "--warmup", "1", "--timed", "1", "--mlp-width", "64", "--mlp-depth", "2"]


# ---------------------------------------------------------------------------------------------
# Syntax (no job runs).


def test_slow_rank_syntax() -> None:
    assert parse_slow_rank("1:30") == {1: 30.0}
    assert parse_slow_rank("0:2.5, 3:10") == {0: 2.5, 3: 10.0}
    assert merge_slow_ranks([{3: 10.0}, {1: 30.0}]) == {1: 30.0, 3: 10.0}
    assert merge_slow_ranks(None) == {}
    for bad in ("1", "1:", ":30", "a:30", "1:x", "-1:30", "1:-5", "1:inf", "1:nan", "1:30,", "1:30;2:10"):
        with pytest.raises(argparse.ArgumentTypeError, match="RANK:MILLISECONDS"):
            parse_slow_rank(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="rank 1 is given twice"):
        parse_slow_rank("1:30,1:10")
    with pytest.raises(ValueError, match="rank 1 is given twice"):
        merge_slow_ranks([{1: 30.0}, {1: 10.0}])


def test_harness_parses_repeated_and_comma_separated_options() -> None:
    cfg = harness.run_parser().parse_args(["--slow-rank", "1:30,2:5", "--slow-rank", "3:1", "--out", "x"])
    assert harness.slow_ranks(cfg) == {1: 30.0, 2: 5.0, 3: 1.0}
    args = harness.job_arguments(argparse.Namespace(**{**vars(cfg), "world_size": 4}), Path("x"))
    assert args[args.index("--slow-rank") + 1] == "1:30,2:5,3:1"
    assert "--slow-rank" not in harness.job_arguments(harness.run_parser().parse_args(["--out", "x"]), Path("x"))


def test_waits_matrix_is_clean_slow_shm_and_both() -> None:
    cfgs = {name: harness.run_parser().parse_args([*o, "--out", "x"]) for name, o in harness.MATRICES["waits"]}
    got = {name: (harness.slow_ranks(cfg), cfg.p2p) for name, cfg in cfgs.items()}
    assert got == {
        "clean": ({}, True),
        "slow_rank1": ({1: 30.0}, True),
        "shm": ({}, False),
        "shm_slow_rank1": ({1: 30.0}, False),
    }
    assert all(harness.workload_refusal(cfg) is None for cfg in cfgs.values())
    # a sweep's base arguments add to a setting's own --slow-rank
    cfg = harness.run_parser().parse_args(
        ["--slow-rank", "0:5", *dict(harness.MATRICES["waits"])["slow_rank1"], "--out", "x"]
    )
    assert harness.slow_ranks(cfg) == {0: 5.0, 1: 30.0}


def test_harness_rejects_bad_syntax_with_a_clear_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        harness.run_parser().parse_args(["--slow-rank", "1=30", "--out", "x"])
    assert exc.value.code == 2
    assert "argument --slow-rank: expected RANK:MILLISECONDS" in capsys.readouterr().err


def test_a_rank_outside_the_job_is_refused_before_any_rank_starts(tmp_path: Path) -> None:
    cfg = harness.run_parser().parse_args(["--world-size", "2", "--slow-rank", "2:30", "--out", str(tmp_path / "b")])
    with pytest.raises(harness.Refused, match=r"--slow-rank names rank 2, but --world-size 2 has ranks 0\.\.1"):
        harness.run_bundle(cfg)
    assert not (tmp_path / "b").exists()
    cfg = harness.run_parser().parse_args(["--slow-rank", "1:30", "--slow-rank", "1:5", "--out", str(tmp_path / "c")])
    with pytest.raises(SystemExit, match="rank 1 is given twice"):
        harness.run_bundle(cfg)


def test_the_job_rejects_bad_syntax_and_ranks_it_does_not_have(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("torch")
    from traceguard.capture import ddp_job

    with pytest.raises(SystemExit):
        ddp_job.parse_args(["--out", "x", "--slow-rank", "one:30"])
    assert "argument --slow-rank: expected RANK:MILLISECONDS" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # run outside torchrun: one rank
        ddp_job.parse_args(["--out", "x", "--slow-rank", "1:30"])
    assert "names rank 1, but the job has 1 rank(s)" in capsys.readouterr().err
    args = ddp_job.parse_args(["--out", "x", "--slow-rank", "0:3", "--workload", "fsdp"])
    assert args.slow_rank == {0: 3.0}


# ---------------------------------------------------------------------------------------------
# Real jobs.


def _run(tmp_path: Path, *options: str) -> tuple[Path, dict, list[dict]]:
    out = tmp_path / "bundle"
    code = harness.main(["run", *FAST, "--slow-rank", f"1:{SLEEP_MS:g}", *options, "--out", str(out)])
    assert code == 0, (out / "launcher.log").read_text()[-3000:]
    manifest = json.loads((out / "manifest.json").read_text())
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    return out, manifest, ranks


def _recorded(manifest: dict, ranks: list[dict]) -> None:
    assert manifest["config"]["slow_rank"] == {"1": SLEEP_MS}
    for record in ranks:
        assert record["config"]["slow_rank"] == {"1": SLEEP_MS}
    assert [r["slow_rank_sleep_ms"] for r in ranks] == [0.0, SLEEP_MS]


def _late_by_the_sleep(get_batch_ms: dict[int, list[float]], steps: int) -> None:
    assert [len(get_batch_ms[r]) for r in (0, 1)] == [steps, steps]
    assert min(get_batch_ms[1]) >= SLEEP_MS  # time.sleep sleeps at least that long, every step
    assert max(get_batch_ms[0]) < SLEEP_MS / 2
    assert statistics.median(get_batch_ms[1]) - statistics.median(get_batch_ms[0]) >= 0.9 * SLEEP_MS


def _torch_get_batch_ms(trace: Path) -> list[float]:
    opener = gzip.open if trace.suffix == ".gz" else open
    with opener(trace, "rt") as f:
        events = json.load(f)["traceEvents"]
    return [e["dur"] / 1000 for e in events if e.get("name") == "get batch" and e.get("cat") == "user_annotation"]


def _nsys_get_batch_ms(sqlite: Path) -> list[float]:
    with sqlite3.connect(sqlite) as db:
        rows = db.execute(
            "SELECT e.end - e.start FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId "
            "WHERE e.eventType IN (59, 60) AND COALESCE(e.text, s.value) = 'get batch'"
        ).fetchall()
    return [ns / 1e6 for (ns,) in rows]


def test_torch_profiler_shows_rank_1_late_by_the_sleep(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out, manifest, ranks = _run(tmp_path, "--capture", "torch", "--steps", "2")
    _recorded(manifest, ranks)
    # The profiler records the job's 2 steps (its own warm-up step is discarded).
    _late_by_the_sleep({r: _torch_get_batch_ms(out / f"rank{r}.trace.json") for r in (0, 1)}, steps=2)


@pytest.mark.slow
def test_real_nsys_shows_rank_1_late_by_the_sleep(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    if harness.find_nsys() is None:
        if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_NSYS"):
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("nsys is not installed")
    out, manifest, ranks = _run(tmp_path, "--capture", "nsys", "--steps", "2")
    assert diagnostics_besides_relaunches(manifest, out) == []
    _recorded(manifest, ranks)
    # A CPU job has no capture range: warm-up 1 + timed 1 + profiled 2, every one slowed.
    _late_by_the_sleep({r: _nsys_get_batch_ms(out / f"cap_{r}.sqlite") for r in (0, 1)}, steps=4)


@pytest.mark.slow
@pytest.mark.parametrize("workload", ["pipeline", "broadcast-reduce", "fsdp", "tensor-parallel"])
def test_every_workload_sleeps_in_get_batch(tmp_path: Path, workload: str) -> None:
    pytest.importorskip("torch")
    out, manifest, ranks = _run(tmp_path, "--workload", workload, "--capture", "torch", "--steps", "1")
    _recorded(manifest, ranks)
    assert {r["workload"]["name"] for r in ranks} == {workload}
    _late_by_the_sleep({r: _torch_get_batch_ms(out / f"rank{r}.trace.json") for r in (0, 1)}, steps=1)
