"""Steps from any training loop (DESIGN.md "Steps", docs/steps.md): user patterns, known
training-loop markers, steps inferred from the periodic GPU work, and the whole GPU window.

The proof of inference is on this project's own harness captures: with the NVTX step ranges
ignored, the inferred steps must be the NVTX steps (count, and GPU-span boundaries within a few
percent of the step time). The public captures that carry no marker are checked against numbers
the tests compute with plain SQL."""

from __future__ import annotations

import gzip
import json
import random
import re
import sqlite3
from collections import Counter
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import OWN, public_kineto, public_nsys
from traceguard.ingest import InputSpec, load_run
from traceguard.metrics.rank import analyse_rank
from traceguard.metrics.step_inference import boundaries, find_period, idle_before
from traceguard.metrics.steps import CONVENTIONS, resolve_steps
from traceguard.pipeline import analyze

#: Every bundle the harness captured on GPUs with NVTX `Batch N` steps (nsys) or ProfilerStep (torch).
HARNESS_GPU_RUNS = sorted(
    {p.parent for p in OWN.glob("h200/*/cap_0.sqlite.gz")}
    | {p.parent for p in OWN.glob("h200/*/rank0.trace.json.gz")}
    | {p.parent for p in OWN.glob("h200x4/*/cap_0.sqlite.gz")}
    | {p.parent for p in OWN.glob("sweep_h200/*/cap_0.sqlite.gz")}
)
#: "A few percent of the step time".
BOUNDARY_TOLERANCE = 0.03


@pytest.mark.parametrize("run", HARNESS_GPU_RUNS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_inferred_steps_are_the_harness_nvtx_steps(run: Path) -> None:
    marked = analyze([str(run)], step_sources=["convention"]).result
    inferred = analyze([str(run)], step_sources=["inferred"]).result
    assert [r.rank for r in marked.ranks] == [r.rank for r in inferred.ranks]
    for by_marker, by_inference in zip(marked.ranks, inferred.ranks, strict=True):
        assert by_marker.step_source == "convention"
        assert by_inference.step_source == "inferred", f"rank {by_inference.rank}: no period found"
        assert len(by_inference.steps) == len(by_marker.steps) >= 3
        for nvtx, guess in zip(by_marker.steps, by_inference.steps, strict=True):
            span = nvtx["gpu_span_ns"]
            nvtx_end = nvtx["gpu_start_ns"] + span
            guess_end = guess["gpu_start_ns"] + guess["gpu_span_ns"]
            assert abs(guess["gpu_start_ns"] - nvtx["gpu_start_ns"]) <= BOUNDARY_TOLERANCE * span, nvtx["name"]
            assert abs(guess_end - nvtx_end) <= BOUNDARY_TOLERANCE * span, nvtx["name"]


def _process_of_rank(path: Path) -> dict[int, int]:
    """rank → pid as traceguard resolves a file that holds several processes (by first device)."""
    run = load_run([InputSpec(path)])
    return {r.rank: int(r.capture.gpu_ops["pid"].drop_nulls()[0]) for r in run.ranks}


def _kernels_by_pid(db: Path) -> dict[int, list[tuple[int, int, int, str]]]:
    """(start, end, device, name) of every kernel, per pid, in start order — plain SQL."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT (k.globalPid >> 24) & 16777215, k.start, k.end, k.deviceId, s.value "
        "FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName ORDER BY k.start"
    ).fetchall()
    con.close()
    out: dict[int, list[tuple[int, int, int, str]]] = {}
    for pid, start, end, device, name in rows:
        out.setdefault(pid, []).append((start, end, device, name))
    return out


def _all_ops_by_pid(db: Path) -> dict[int, list[tuple[int, int]]]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    out: dict[int, list[tuple[int, int]]] = {}
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET"):
        if con.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (table,)).fetchone():
            for pid, start, end in con.execute(f"SELECT (globalPid >> 24) & 16777215, start, end FROM {table}"):
                out.setdefault(pid, []).append((start, end))
    con.close()
    return out


def _union(intervals: list[tuple[int, int]]) -> int:
    total, current = 0, None
    for start, end in sorted(intervals):
        if current is None or start > current[1]:
            if current:
                total += current[1] - current[0]
            current = [start, end]
        else:
            current[1] = max(current[1], end)
    return total + (current[1] - current[0] if current else 0)


def test_mfu_2gpu_before_window_nccl_share_from_plain_sql(unpacked) -> None:
    """nsys-ai's pipeline-parallel capture has no step marker: in window mode each rank's NCCL
    share is the union of its SendRecv kernels ÷ its whole GPU window."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    report = analyze([str(db)], step_sources=["window"]).report
    kernels, ops = _kernels_by_pid(db), _all_ops_by_pid(db)
    pid_of = _process_of_rank(db)
    for rank in report["ranks"]:
        pid = pid_of[rank["rank"]]
        window = max(e for _, e in ops[pid]) - min(s for s, _ in ops[pid])
        nccl = _union([(s, e) for s, e, _, name in kernels[pid] if name.startswith("nccl")])
        assert rank["step_source"] == "window"
        assert [s["gpu_span_ns"] for s in rank["steps"]] == [window]
        assert rank["metrics"]["nccl_share_of_step"] == pytest.approx(nccl / window, rel=1e-12)
        assert sum(name.startswith("ncclDevKernel_SendRecv") for *_, name in kernels[pid]) == 33


def test_mfu_2gpu_before_gets_steps_and_step_based_checks(unpacked) -> None:
    """The issue's regression: no step was found, so the NCCL share, DtoD per step and the
    straggler were null. Now its iterations are inferred and each of them is a number."""
    db = unpacked(public_nsys("mfu_2gpu_before"))
    report = analyze([str(db)]).report
    assert {r["step_source"] for r in report["ranks"]} == {"inferred"}
    metrics = report["run"]["metrics"]
    for key in ("nccl_share_of_step", "dtod_bytes_per_step", "straggler_spread"):
        assert metrics[key] is not None, metrics["null_reasons"].get(key)
    checks = {c["id"]: c for c in report["checks"]}
    assert checks["nccl_step_share"]["status"] != "skip"


def _step_kernel_names(kernels: list[tuple[int, int, int, str]], start: int, end: int) -> Counter[str]:
    return Counter(name for s, _, _, name in kernels if start <= s <= end)


def test_h100_2gpu_1s_inferred_iterations_repeat_the_same_kernels(unpacked) -> None:
    """nsys-ai's 1-second H100 window: each inferred iteration holds the same kernels (by name
    and count, from plain SQL) as every other — they are iterations, not arbitrary slices."""
    db = unpacked(public_nsys("h100_2gpu_1s"))
    report = analyze([str(db)]).report
    kernels = _kernels_by_pid(db)
    pid_of = _process_of_rank(db)
    for rank in report["ranks"]:
        assert rank["step_source"] == "inferred"
        steps = rank["steps"]
        assert len(steps) >= 20  # ~29 ms iterations in one second
        of_rank = kernels[pid_of[rank["rank"]]]
        result = analyse_rank(rank["rank"], load_run([InputSpec(db)]).ranks[rank["rank"]].capture)
        bags = [
            _step_kernel_names(of_rank, s["gpu_start_ns"], s["gpu_start_ns"] + s["gpu_span_ns"]) for s in result.steps
        ]
        typical = Counter(tuple(sorted(b.items())) for b in bags).most_common(1)[0][0]
        same = sum(tuple(sorted(b.items())) == typical for b in bags)
        assert same >= 0.8 * len(bags)
        assert sum(dict(typical).values()) == int(rank["step_detail"].split()[0])  # kernels per iteration


def _without_profiler_steps(source: Path, target: Path) -> Path:
    """A real Kineto trace as a loop without torch.profiler's schedule records it: the same
    events less every ``ProfilerStep#N`` annotation."""
    doc = json.loads(gzip.decompress(source.read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if not str(e.get("name", "")).startswith("ProfilerStep#")]
    target.write_text(json.dumps(doc))
    return target


def test_kineto_trace_without_profiler_step_gets_step_metrics(tmp_path: Path) -> None:
    source = public_kineto("trace_diff__control")
    with_marker = analyze([str(source)]).report
    stripped = analyze([str(_without_profiler_steps(source, tmp_path / "rank3.json"))]).report
    assert with_marker["ranks"][0]["step_source"] == "convention"
    rank = stripped["ranks"][0]
    assert rank["step_source"] in ("inferred", "window")
    assert rank["metrics"]["nccl_share_of_step"] is not None
    assert rank["metrics"]["dtod_bytes_per_step"] is not None
    if rank["step_source"] == "window":
        assert len(rank["steps"]) == 1


def test_user_pattern_comes_before_conventions(unpacked) -> None:
    db = unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")
    report = analyze([str(db)], step_patterns=[r"^forward$"]).report
    rank = report["ranks"][0]
    assert rank["step_source"] == "pattern"
    assert [s["name"] for s in rank["steps"]] == ["forward"] * 3
    # A pattern that matches nothing falls through to the harness's own `Batch N`.
    fallback = analyze([str(db)], step_patterns=[r"^no such range$"]).report["ranks"][0]
    assert (fallback["step_source"], fallback["step_detail"]) == ("convention", "traceguard harness")


def _ranges(*names: str) -> pl.DataFrame:
    from traceguard import model

    rows = [
        {"pid": 1, "tid": 1, "range_id": i, "start": 100 * i, "end": 100 * i + 90, "name": n, "depth": 0}
        for i, n in enumerate(names)
    ]
    return model.conform(pl.DataFrame(rows), model.RANGES_SCHEMA)


@pytest.mark.parametrize(
    ("name", "framework"),
    [
        ("Batch 3", "traceguard harness"),
        ("training_step_12", "Megatron-Bridge"),
        ("[pl][profile]run_training_batch", "PyTorch Lightning"),
        ("ProfilerStep#4", "torch.profiler"),
        ("ProfilerStep#4, op_id = 17", "torch.profiler"),  # emit_nvtx appends the op id
        ("iteration3", "generic"),
    ],
)
def test_each_convention_is_recognised(name: str, framework: str) -> None:
    from traceguard import model

    ranges = _ranges(name, "not a step", name.replace("3", "4").replace("12", "13"))
    resolved = resolve_steps(ranges, model.empty(model.GPU_OPS_SCHEMA), model.empty(model.STRINGS_SCHEMA))
    assert (resolved.source, resolved.convention) == ("convention", framework)
    assert resolved.steps.height == 2


#: Hand-written per-step names (issue 25: `train_step N` got inferred steps): each word, case and
#: separator the generic convention accepts.
GENERIC_NAMES = [
    "step 12",
    "Step 12",
    "step_12",
    "step-12",
    "step#12",
    "step #12",
    "step: 12",
    "step=12",
    "step12",
    "train_step 3",
    "train_step_3",
    "train-step-3",
    "Train Step 3",
    "TRAIN_STEP #3",
    "trainstep3",
    "training_step 4",
    "training step: 4",
    "Training-Step-4",
    "iteration 5",
    "iteration5",
    "Iteration: 5",
    "iter_6",
    "iter 6",
    "ITER-6",
    "batch#7",
    "train_step 3, op_id = 41",  # under emit_nvtx
]


@pytest.mark.parametrize("name", GENERIC_NAMES)
def test_hand_written_step_names_are_steps(name: str) -> None:
    from traceguard import model

    other = re.sub(r"\d+", lambda m: str(int(m.group()) + 1), name, count=1)
    ranges = _ranges(name, "forward", other)
    resolved = resolve_steps(ranges, model.empty(model.GPU_OPS_SCHEMA), model.empty(model.STRINGS_SCHEMA))
    assert (resolved.source, resolved.convention) == ("convention", "generic")
    assert resolved.steps["name"].to_list() == [name, other]


@pytest.mark.parametrize(
    "name",
    [
        "train_step",
        "steps 3",
        "train_step 3 loss",
        "step_size 3",
        "iterator 3",
        "stepper 1",
        "step 3/10",
        "my step 3",
        "step__3",
        "training_steps 3",
    ],
)
def test_names_that_only_look_like_steps_are_not(name: str) -> None:
    from traceguard import model

    resolved = resolve_steps(_ranges(name, name), model.empty(model.GPU_OPS_SCHEMA), model.empty(model.STRINGS_SCHEMA))
    assert resolved.source is None


def test_megatron_bridge_keeps_its_own_name() -> None:
    """`training_step_N` is Megatron-Bridge's marker (tried before the generic one)."""
    from traceguard import model

    resolved = resolve_steps(
        _ranges("training_step_1", "training_step_2"),
        model.empty(model.GPU_OPS_SCHEMA),
        model.empty(model.STRINGS_SCHEMA),
    )
    assert resolved.convention == "Megatron-Bridge"


def test_conventions_never_match_whole_loop_ranges() -> None:
    import re

    for whole in ("[pl][profile]run_training_epoch", "train", "training_step", "Batch", "ProfilerStep"):
        assert not any(re.search(c.pattern, whole) for c in CONVENTIONS), whole


def test_capture_without_marker_or_gpu_work_has_no_steps_and_says_why() -> None:
    """Nothing to infer from: no step, and the reason names the way out (--step-pattern)."""
    from traceguard import model

    capture = model.Capture(
        info=model.CaptureInfo(path="idle.json", format="kineto", tool="torch.profiler"),
        gpu_ops=model.empty(model.GPU_OPS_SCHEMA),
        api_calls=model.empty(model.API_CALLS_SCHEMA),
        ranges=_ranges("load", "model"),
        devices=model.empty(model.DEVICES_SCHEMA),
        processes=model.empty(model.PROCESSES_SCHEMA),
        strings=model.empty(model.STRINGS_SCHEMA),
    )
    result = analyse_rank(0, capture)
    assert result.step_source is None and result.steps == []
    assert "--step-pattern" in result.null_reasons["nccl_share_of_step"]


# ---- the period finder on sequences built to the shapes real loops have ----------------------


def _transformer_iteration(layers: int = 24) -> list[int]:
    """embedding, `layers` identical forward layers, loss, backward layers, optimizer."""
    forward_layer = [10, 11, 12, 13, 11, 14, 15, 16]
    backward_layer = [20, 21, 22, 12, 21, 23, 24, 25, 26, 27]
    return [1, 2] + forward_layer * layers + [3, 4, 5] + backward_layer * layers + [6, 7, 90, 91, 92]


def test_period_is_the_iteration_not_the_layer() -> None:
    iteration = _transformer_iteration()
    names = np.array(iteration * 5, dtype=np.int64)
    period = find_period(names)
    assert period is not None and period.kernels == len(iteration)


def test_period_survives_streams_interleaving_differently() -> None:
    rng = random.Random(7)
    iteration = _transformer_iteration(12)
    sequence: list[int] = []
    for _ in range(6):
        one = list(iteration)
        for _ in range(40):  # NCCL and compute kernels of two streams swap places
            i = rng.randrange(len(one) - 1)
            one[i], one[i + 1] = one[i + 1], one[i]
        sequence += one
    period = find_period(np.array(sequence, dtype=np.int64))
    assert period is not None and period.kernels == len(iteration)


@pytest.mark.parametrize("partial", [0, 17], ids=["capture-opens-on-an-iteration", "capture-opens-mid-iteration"])
def test_boundaries_follow_an_iteration_with_one_kernel_more(partial: int) -> None:
    iteration = _transformer_iteration(6)
    p = len(iteration)
    head = iteration[-partial:] if partial else []  # the end of an iteration the capture cut into
    sequence = head + iteration * 2 + iteration[:30] + [99] + iteration[30:] + iteration * 3  # iteration 2: p + 1
    names = np.array(sequence, dtype=np.int64)
    # 1 µs kernels, back to back inside an iteration, 50 µs idle before each iteration.
    start = np.cumsum(np.full(names.size, 1_000, dtype=np.int64))
    firsts = [partial + f for f in (0, p, 2 * p, 3 * p + 1, 4 * p + 1, 5 * p + 1)]
    for first in firsts:
        if first:
            start[first:] += 50_000
    end = start + 900
    optimizer = np.isin(names, [90, 91, 92])
    period = find_period(names)
    assert period is not None and period.kernels == p
    for known_optimizer in (optimizer, None):  # the idle gap alone finds the same boundaries
        found = [first for first, _ in boundaries(names, start, end, p, known_optimizer)]
        if partial:
            assert found == firsts
        else:  # no gap before the capture's first kernel to tell where the first iteration begins
            assert found[1:] == firsts[1:] and abs(found[0] - firsts[0]) <= 2
    assert idle_before(start, end)[firsts[1]] == 50_000 + 100


def test_no_period_in_a_sequence_that_does_not_repeat() -> None:
    rng = np.random.default_rng(3)
    assert find_period(rng.integers(0, 50, size=5_000)) is None
    assert find_period(np.full(100, 7)) is None  # one kernel over and over is a loop, not an iteration


# ---- issue 25: a capture with no marker and no globalPid (nsys-ai's healthy_1pct) ------------


def _healthy_kernels(db: Path) -> list[tuple[int, int, str]]:
    """(start, end, name) of every kernel, in start order — plain SQL (the file has no globalPid)."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    rows = con.execute(
        "SELECT k.start, k.end, s.value FROM CUPTI_ACTIVITY_KIND_KERNEL k "
        "JOIN StringIds s ON s.id = k.shortName ORDER BY k.start"
    ).fetchall()
    con.close()
    return rows


def test_healthy_1pct_iterations_are_its_gemm_and_add(unpacked) -> None:
    """nsys-ai's healthy_1pct (nsys 2026.1.1): 200 × (gemm_nn_128x128, elementwise_add), no NVTX,
    and kernel tables without globalPid. It analysed to no step at all (every step metric null):
    its ops had no process, and inference and the window step are per process. Each inferred step
    is now one add and one gemm (plain SQL), and every step metric is a number."""
    db = unpacked(public_nsys("healthy_1pct"))
    kernels = _healthy_kernels(db)
    assert len(kernels) == 400
    analysis = analyze([str(db)])
    report = analysis.report
    rank = report["ranks"][0]
    assert (rank["step_source"], rank["step_detail"]) == ("inferred", "2 kernels per iteration")
    assert len(rank["steps"]) == 200
    for step in analysis.result.ranks[0].steps:
        lo, hi = step["gpu_start_ns"], step["gpu_start_ns"] + step["gpu_span_ns"]
        inside = [name for start, end, name in kernels if lo <= start and end <= hi]
        # The loop opens on the add (start 0): all gaps are equal, so which of the two begins an
        # iteration the capture cannot tell; every iteration holds one of each, in turn.
        assert inside == ["elementwise_add", "gemm_nn_128x128"], step["name"]
    metrics = rank["metrics"]
    assert metrics["step_count"] == 200
    assert metrics["nccl_share_of_step"] == 0.0 and metrics["dtod_bytes_per_step"] == 0.0
    warnings = report["inputs"][0]["warnings"]
    assert any("no globalPid" in w and "process 0" in w for w in warnings), warnings


def test_healthy_1pct_window_step_is_its_whole_gpu_window(unpacked) -> None:
    """`--step-source window` gave 0 steps too: now the one step is first kernel start to last
    kernel end (plain SQL)."""
    db = unpacked(public_nsys("healthy_1pct"))
    kernels = _healthy_kernels(db)
    rank = analyze([str(db)], step_sources=["window"]).report["ranks"][0]
    assert rank["step_source"] == "window"
    assert [s["gpu_span_ns"] for s in rank["steps"]] == [max(e for _, e, _ in kernels) - kernels[0][0]]
    assert rank["metrics"]["nccl_share_of_step"] == 0.0


@pytest.mark.parametrize("sources", [("inferred",), ("window",)])
def test_healthy_1pct_sliced_agrees(sources: tuple[str, ...], unpacked) -> None:
    """The sliced path reads the GPU tables through the same reader: the same steps and metrics."""
    from tests.metrics.test_sliced import result_differences, time_slices
    from traceguard.ingest import read_capture, with_rank
    from traceguard.metrics.sliced import analyse_rank_sliced

    capture = with_rank(read_capture(unpacked(public_nsys("healthy_1pct")), keep_correlation=False), 0)
    whole = analyse_rank(0, capture, step_sources=sources)
    assert whole.step_source == sources[0]
    for count in (1, 9):
        sliced = analyse_rank_sliced(0, capture, time_slices(capture.gpu_ops, count), step_sources=sources)
        assert result_differences(whole, sliced) == [], count


def test_healthy_1pct_ops_get_the_process_of_their_launches(unpacked) -> None:
    """Its one process (the runtime calls' globalTid) owns every op, so each op joins its
    cudaLaunchKernel (correlation id within the process): the launch columns are filled."""
    from traceguard.ingest import read_capture

    ops = read_capture(unpacked(public_nsys("healthy_1pct"))).gpu_ops
    assert ops["pid"].null_count() == 0 and ops["pid"].unique().to_list() == [0]
    assert ops["launch_start"].null_count() == 0
    assert (ops["launch_start"] < ops["start"]).all()


def test_ops_of_several_processes_without_globalpid_get_their_launching_process(unpacked, tmp_path: Path) -> None:
    """A real two-process export (nsys-ai's mfu_2gpu_before) with globalPid dropped from its GPU
    tables: each op takes the process of the CUDA call with its correlation id, where one process
    alone has that id; the pids agree with the ones nsys wrote."""
    import shutil

    from traceguard.ingest import read_capture

    original = unpacked(public_nsys("mfu_2gpu_before"))
    stripped = tmp_path / "mfu_no_globalpid.sqlite"
    shutil.copyfile(original, stripped)
    con = sqlite3.connect(stripped)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        con.execute(f"ALTER TABLE {table} DROP COLUMN globalPid")
    con.commit()
    con.close()
    truth = read_capture(original).gpu_ops["pid"]
    got = read_capture(stripped).gpu_ops["pid"]
    named = got.is_not_null()
    assert named.mean() > 0.9  # the rest were launched before the capture's 1-second window
    agree = (got.filter(named) == truth.filter(named)).mean()
    assert agree > 0.999  # a correlation id of one process's ops seen only in the other's calls
    report = analyze([str(stripped)]).report
    assert all(r["step_source"] in ("inferred", "window") and r["steps"] for r in report["ranks"])
