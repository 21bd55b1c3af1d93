"""The harness's workloads beyond DDP on CPU (gloo): each captured under the real nsys and under
torch.profiler, analysed, and checked against what the job itself recorded and the raw capture.

Evidence of "the option reached the job" is what each rank wrote (its stage's layers, the dtype of
the payload it sent, FSDP's and DTensor's own placements, the environment it saw); expected bytes
come from the config and from the raw trace (PyTorch's c10d annotations, plain json / sqlite3),
never from traceguard's output. On CPU there are no GPU kernels: the pipeline bubble is null with
its reason (it needs GPU captures, issue "GPU runs on 2 and 4 H200"), and "exposed" communication is
the time the host thread was blocked in it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from traceguard.capture import harness
from traceguard.pipeline import analyze

SMALL = ["--world-size", "2", "--warmup", "1", "--timed", "1", "--steps", "2", "--mlp-width", "64", "--mlp-depth", "3"]
#: Each bundle the tests read: name → harness options. Run once per session, on first use.
RUNS: dict[str, list[str]] = {
    "pipeline_gpipe_torch": ["--workload", "pipeline", "--microbatches", "2", "--capture", "torch"],
    "pipeline_1f1b_batched_nsys": [
        *("--workload", "pipeline", "--microbatches", "4", "--schedule", "1f1b", "--p2p", "batched"),
        *("--capture", "nsys", "--env", "NCCL_ALGO=Ring"),
    ],
    # A wider model for broadcast-reduce: enough payload for the host's waiting to be measurable.
    "br_fp32_blocking_torch": ["--workload", "broadcast-reduce", "--mlp-width", "256", "--capture", "torch"],
    "br_fp32_async_torch": ["--workload", "broadcast-reduce", "--mlp-width", "256", "--async", "--capture", "torch"],
    "br_fp16_async_torch": [
        *("--workload", "broadcast-reduce", "--mlp-width", "256", "--async", "--comm-dtype", "fp16"),
        *("--capture", "torch"),
    ],
    "br_bf16_nsys": ["--workload", "broadcast-reduce", "--comm-dtype", "bf16", "--capture", "nsys"],
    "fsdp_torch": ["--workload", "fsdp", "--capture", "torch"],
    "fsdp_nsys": ["--workload", "fsdp", "--capture", "nsys"],
    "tp_torch": ["--workload", "tensor-parallel", "--capture", "torch"],
    "tp_nsys": ["--workload", "tensor-parallel", "--capture", "nsys"],
}


def _need_nsys() -> None:
    if harness.find_nsys() is None:
        if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_NSYS"):
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("needs nsys")


class Bundle:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.manifest: dict[str, Any] = json.loads((out / "manifest.json").read_text())
        self.records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
        self._report: dict[str, Any] | None = None

    @property
    def report(self) -> dict[str, Any]:
        if self._report is None:
            self._report = analyze([str(self.out)], profile="ci-cpu").report
        return self._report


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory):
    made: dict[str, Bundle] = {}
    root = tmp_path_factory.mktemp("workloads")

    def get(name: str) -> Bundle:
        if name not in made:
            if "nsys" in name:
                _need_nsys()
            out = root / name
            code = harness.main(["run", *SMALL, *RUNS[name], "--out", str(out)])
            assert code == 0, (out / "launcher.log").read_text()[-3000:]
            made[name] = Bundle(out)
        return made[name]

    get.root = root  # type: ignore[attr-defined]
    return get


def _trace_events(bundle: Bundle, rank: int) -> list[dict[str, Any]]:
    return json.loads((bundle.out / f"rank{rank}.trace.json").read_text())["traceEvents"]


ELEMENT = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2}


def _annotation_bytes(event: dict[str, Any]) -> int:
    """A c10d annotation's payload from its first input's shape and type (PyTorch's own record)."""
    args = event["args"]
    return math.prod(args["Input Dims"][0]) * ELEMENT[args["Input type"][0]]


def _inside_steps(events: list[dict[str, Any]], wanted: re.Pattern[str]) -> tuple[list[dict[str, Any]], int]:
    steps = [e for e in events if re.fullmatch(r"Batch \d+", e.get("name", "")) and e.get("ph") == "X"]
    hits = [
        e
        for e in events
        if wanted.match(e.get("name", ""))
        and e.get("cat") == "user_annotation"
        and any(s["ts"] <= e["ts"] <= s["ts"] + s["dur"] for s in steps)
    ]
    return hits, len(steps)


# ---------------------------------------------------------------------------------------------
# Fast: the matrices and refusals (no job runs).


def _cfg(*options: str) -> argparse.Namespace:
    return harness.run_parser().parse_args([*options, "--out", "x"])


def test_seed003_runs_every_comparison_on_one_2000mb_bucket_cumulatively() -> None:
    settings = dict(harness.MATRICES["seed003"])
    assert len(settings) == 18
    cfgs = {name: _cfg(*harness.MATRIX_DEFAULTS["seed003"], *options) for name, options in settings.items()}
    for link in ("", "shm_"):
        ddp, static, view = cfgs[f"{link}ddp"], cfgs[f"{link}static_graph"], cfgs[f"{link}bucket_view"]
        bf16, powersgd = cfgs[f"{link}bf16_hook"], cfgs[f"{link}powersgd_hook"]
        for cfg in (ddp, static, view, bf16, powersgd):
            assert cfg.bucket_cap_mb == 2000 and cfg.p2p is (link == "")
        assert (ddp.static_graph, ddp.bucket_view, ddp.comm_hook) == (False, False, "none")
        assert (static.static_graph, static.bucket_view) == (True, False)
        assert (view.static_graph, view.bucket_view, view.comm_hook) == (True, True, "none")
        assert (bf16.static_graph, bf16.bucket_view, bf16.comm_hook) == (True, True, "bf16")
        assert (powersgd.comm_hook, powersgd.static_graph, powersgd.bucket_view) == ("powersgd", True, True)
        # compression is on before the first timed step: PowerSGD counts iterations from the start
        assert powersgd.powersgd_start_iter <= powersgd.warmup
        for hook in ("bf16", "powersgd"):
            sizes = {cfgs[f"{link}{hook}_hook{suffix}"].bucket_cap_mb for suffix in ("", "_bucket25", "_bucket100")}
            assert sizes == {25, 100, 2000}
        for cfg in cfgs.values():
            assert cfg.timed >= 20 and cfg.repeats == 3


def test_seed001_002_covers_dtypes_async_schedules_and_stages() -> None:
    cfgs = [_cfg(*harness.MATRIX_DEFAULTS["seed001-002"], *o) for _, o in harness.MATRICES["seed001-002"]]
    rooted = {(c.comm_dtype, c.async_op) for c in cfgs if c.workload == "broadcast-reduce"}
    assert rooted == {("fp32", False), ("fp16", False), ("fp32", True), ("fp16", True)}
    pipes = {(c.world_size, c.schedule, c.p2p_calls) for c in cfgs if c.workload == "pipeline"}
    assert pipes == {(s, k, p) for s in (2, 4) for k in ("gpipe", "1f1b") for p in ("blocking", "batched")}
    assert {c.workload for c in cfgs} == {"broadcast-reduce", "pipeline", "fsdp", "tensor-parallel"}
    assert all(harness.workload_refusal(c) is None for c in cfgs)


@pytest.mark.slow
def test_seed003_powersgd_compresses_in_the_timed_steps(tmp_path: Path) -> None:
    """The seed003 PowerSGD setting as the matrix runs it (its warm-up and start iteration), on gloo."""
    options = dict(harness.MATRICES["seed003"])["powersgd_hook"]
    out = tmp_path / "b"
    base = ["--world-size", "2", "--mlp-width", "64", "--mlp-depth", "2", "--timed", "2", "--repeats", "2"]
    assert harness.main(["run", "--warmup", "3", *base, *options, "--out", str(out)]) == 0
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["throughput_repeats_steps_per_s"]) == 2 and manifest["throughput_spread"] is not None
    for r in range(2):
        ddp = json.loads((out / f"rank{r}.json").read_text())["ddp"]
        assert ddp["registered_comm_hook"] == "powerSGD_hook" and ddp["bucket_cap_bytes"] == 2000 * 1024 * 1024
        assert ddp["static_graph"] and ddp["gradient_as_bucket_view"]
        assert ddp["powersgd_iter_before_timed"] >= ddp["powersgd_start_iter"]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--workload", "pipeline", "--world-size", "1"], "needs --world-size 2"),
        (["--workload", "pipeline", "--world-size", "8", "--mlp-depth", "2"], "cannot fill 8 stages"),
        (["--workload", "pipeline", "--batch-size", "30", "--microbatches", "4"], "not a multiple"),
        (["--workload", "fsdp", "--model", "vit_l_32"], "use --model mlp"),
        (["--workload", "tensor-parallel", "--mlp-depth", "1"], "Linear layers in pairs"),
    ],
)
def test_impossible_combinations_are_refused_before_any_rank_starts(
    tmp_path: Path, options: list[str], message: str
) -> None:
    with pytest.raises(SystemExit, match=re.escape(message)):
        harness.main(["run", *options, "--out", str(tmp_path / "b")])
    assert not (tmp_path / "b").exists()


def test_bf16_hook_is_refused_without_gpus(tmp_path: Path) -> None:
    """PyTorch's bf16_compress_hook raises on gloo/CPU; the harness says so before starting ranks (and
    a sweep, e.g. seed003 on CPU, lists the setting as refused and goes on)."""
    if harness.cuda_available():
        pytest.skip("a GPU is here: the hook runs")
    with pytest.raises(harness.Refused, match="bf16_compress_hook needs CUDA"):
        harness.main(["run", *SMALL, "--comm-hook", "bf16", "--out", str(tmp_path / "b")])


# ---------------------------------------------------------------------------------------------
# Pipeline.


@pytest.mark.slow
def test_pipeline_stages_microbatches_and_transfers_reached_the_job(bundle) -> None:
    b = bundle("pipeline_gpipe_torch")
    stages = [r["workload"] for r in b.records]
    # 3 hidden Linear layers + the classifier = 4, split 2 + 2 over the two ranks
    assert [s["stage_layers"] for s in stages] == [["Linear", "ReLU", "Linear", "ReLU"], ["Linear", "ReLU", "Linear"]]
    assert {(s["schedule"], s["p2p"], s["microbatches"], s["microbatch_size"]) for s in stages} == {
        ("gpipe", "blocking", 2, 16)
    }
    assert sum(r["parameters"] for r in b.records) == (64 * 64 + 64) * 3 + 64 * 10 + 10
    for rank in range(2):
        names = {e["name"] for e in _trace_events(b, rank) if e.get("cat") == "user_annotation"}
        assert {
            "microbatch 0 forward",
            "microbatch 1 forward",
            "microbatch 0 backward",
            "microbatch 1 backward",
        } <= names
        other, verb = 1 - rank, ("send to", "recv from")
        assert f"{verb[rank]} {other} (4096 B)" in names and f"{verb[1 - rank]} {other} (4096 B)" in names


@pytest.mark.slow
def test_pipeline_peer_matrix_matches_the_manifest_and_the_raw_trace(bundle) -> None:
    b = bundle("pipeline_gpipe_torch")
    cfg = b.manifest["config"]
    # activations forward (rank 0 → 1), gradients back (1 → 0): microbatches × (batch/M × width × 4 B)
    per_step = cfg["microbatches"] * (cfg["batch_size"] // cfg["microbatches"]) * cfg["mlp_width"] * 4
    manifest = {(r["rank"], r["peer"]): r["bytes"] for r in b.manifest["workload"]["sent_bytes_per_step"]}
    assert manifest == {(0, 1): per_step, (1, 0): per_step}
    matrix = {(r["rank"], r["peer"]): r for r in b.report["run"]["workload"]["peer_matrix"]}
    assert set(matrix) == set(manifest)
    for (rank, peer), row in matrix.items():
        events = _trace_events(b, rank)
        sends, steps = _inside_steps(events, re.compile(r"gloo:send\b"))
        recvs, _ = _inside_steps(events, re.compile(r"gloo:recv\b"))
        assert row["sent_bytes_per_step"] == manifest[(rank, peer)]
        assert row["received_bytes_per_step"] == manifest[(peer, rank)]
        assert row["profiler_sent_bytes_per_step"] == sum(map(_annotation_bytes, sends)) / steps == per_step
        assert row["profiler_received_bytes_per_step"] == sum(map(_annotation_bytes, recvs)) / steps == per_step
    assert b.report["run"]["workload"]["kind"] == "pipeline"
    from traceguard.report.markdown import render

    text = render(b.report)
    assert "## Workload: pipeline" in text and f"| 0 | 1 | {per_step // 1024}.0 KiB |" in text
    for rank in b.report["ranks"]:
        assert all(list(s["phases"]) == ["get batch", "forward", "backward", "optimizer step"] for s in rank["steps"])
        assert rank["workload"]["bubble"] is None
        assert "no GPU kernels" in rank["workload"]["null_reasons"]["bubble"]


@pytest.mark.slow
def test_pipeline_1f1b_batched_under_nsys(bundle) -> None:
    b = bundle("pipeline_1f1b_batched_nsys")
    assert [c["path"] for c in b.manifest["captures"]] == ["cap_0.sqlite", "cap_1.sqlite"]
    assert {r["env"]["NCCL_ALGO"] for r in b.records} == {"Ring"}
    assert {(r["workload"]["schedule"], r["workload"]["p2p"]) for r in b.records} == {("1f1b", "batched")}
    for rank in range(2):
        db = sqlite3.connect(f"file:{b.out / f'cap_{rank}.sqlite'}?mode=ro", uri=True)
        names = [
            n
            for (n,) in db.execute(
                "SELECT COALESCE(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
            )
        ]
        batched = [n for n in names if n and n.startswith("batch_isend_irecv: ")]
        # 1F1B on 2 stages, 4 microbatches, 4 steps: the steady state pairs a send with a receive
        assert any("send to" in n and "recv from" in n for n in batched)
        assert sum(n.count("send to") for n in batched) == 4 * 4  # one per microbatch per step
    report = b.report
    assert [i["format"] for i in report["inputs"]] == ["nsys-sqlite", "nsys-sqlite"]
    manifest = {(r["rank"], r["peer"]): r["bytes"] for r in b.manifest["workload"]["sent_bytes_per_step"]}
    matrix = {(r["rank"], r["peer"]): r for r in report["run"]["workload"]["peer_matrix"]}
    assert {k: r["sent_bytes_per_step"] for k, r in matrix.items()} == manifest
    assert all(r["profiler_sent_bytes"] is None for r in matrix.values())  # nsys has no c10d annotations
    for rank in report["ranks"]:
        assert len(rank["steps"]) == 4  # the whole CPU job is captured: warm-up 1 + timed 1 + profiled 2
        assert "nsys capture" in rank["workload"]["null_reasons"]["profiler_bytes"]


# ---------------------------------------------------------------------------------------------
# Broadcast / reduce.


def _rooted(report: dict[str, Any], rank: int = 0) -> dict[str, dict[str, Any]]:
    return {row["collective"]: row for row in report["ranks"][rank]["workload"]["payload"]}


@pytest.mark.slow
def test_broadcast_reduce_payload_matches_the_manifest_and_the_raw_trace(bundle) -> None:
    b = bundle("br_fp32_blocking_torch")
    cfg = b.manifest["config"]
    w, d = cfg["mlp_width"], cfg["mlp_depth"]
    parameters = (w * w + w) * d + w * 10 + 10
    assert {r["workload"]["payload_dtypes"][0] for r in b.records} == {"torch.float32"}
    assert {r["workload"]["async_op"] for r in b.records} == {False}
    for rank in range(2):
        assert b.manifest["workload"]["payload_bytes_per_step"][str(rank)] == {
            "broadcast": parameters * 4,
            "reduce": parameters * 4,
        }
        events = _trace_events(b, rank)
        rows = _rooted(b.report, rank)
        for op in ("broadcast", "reduce"):
            annotations, steps = _inside_steps(events, re.compile(rf"gloo:{op}\b"))
            assert rows[op]["profiler_bytes_per_step"] == sum(map(_annotation_bytes, annotations)) / steps
            assert rows[op]["bytes_per_step"] == rows[op]["profiler_bytes_per_step"] == parameters * 4
            assert rows[op]["calls_per_step"] == d + 1  # one per Linear layer
    assert b.report["run"]["workload"]["kind"] == "broadcast-reduce"
    assert b.report["run"]["workload"]["asynchronous"] is False


@pytest.mark.slow
def test_fp16_halves_the_payload(bundle) -> None:
    fp32, fp16 = bundle("br_fp32_async_torch"), bundle("br_fp16_async_torch")
    assert {r["workload"]["payload_dtypes"][0] for r in fp16.records} == {"torch.float16"}
    for rank in range(2):
        wide, half = _rooted(fp32.report, rank), _rooted(fp16.report, rank)
        for op in ("broadcast", "reduce"):
            assert half[op]["profiler_bytes_per_step"] * 2 == wide[op]["profiler_bytes_per_step"]
            assert half[op]["bytes_per_step"] == fp16.manifest["workload"]["payload_bytes_per_step"][str(rank)][op]


@pytest.mark.slow
def test_async_issues_computes_then_waits(bundle) -> None:
    """What --async changes, measured on CPU: the collective is in flight while the host computes
    (issue … wait), and the host is blocked only in the waits; blocking calls block for their whole
    range and are never in flight beside compute.

    Whether that makes FEWER exposed nanoseconds is a GPU question: on this 2-core host the gloo
    threads compete with compute for the same cores and the ranks' skew (rank 0 alone steps the
    optimizer) dominates — four back-to-back pairs of runs measured 18/36, 11/18, 66/10 and 94/20 ms
    of host-blocked time per step (blocking/async), either way round. The GPU runs compare
    exposed NCCL time per step: on 2×H200 `async_op` cut the host's blocked time 1.88 → 0.50 ms a step
    and exposed NCCL 13.5 → 3.7 ms (bench/gpu/SWEEP.md, tests/fixtures/seed_studies).
    """
    blocking, asynchronous = bundle("br_fp32_blocking_torch"), bundle("br_fp32_async_torch")
    assert {r["workload"]["async_op"] for r in asynchronous.records} == {True}
    assert asynchronous.report["run"]["workload"]["asynchronous"] is True

    def raw_blocked(b: Bundle, rank: int) -> float:  # from the trace: the waits (async) or the calls (blocking)
        pattern = re.compile(r"(wait )?(broadcast|reduce) layer \d+( \(\d+ B\))?$")
        hits, steps = _inside_steps(_trace_events(b, rank), pattern)
        return sum(e["dur"] for e in hits) * 1000 / steps

    for b, in_flight in ((blocking, False), (asynchronous, True)):
        for rank in b.report["ranks"]:
            w = rank["workload"]
            assert sum(w["host_blocked_ns_per_step"].values()) == pytest.approx(raw_blocked(b, rank["rank"]), rel=0.01)
            assert set(w["in_flight_ns_per_step"]) == {"broadcast", "reduce"}
            assert all((ns > 0) is in_flight for ns in w["in_flight_ns_per_step"].values()), w
            assert w["gpu_exposed_ns_per_step"] == {}  # no NCCL kernels on CPU


@pytest.mark.slow
def test_bf16_broadcast_reduce_under_nsys(bundle) -> None:
    b = bundle("br_bf16_nsys")
    assert {r["workload"]["payload_dtypes"][0] for r in b.records} == {"torch.bfloat16"}
    report = b.report
    for rank in range(2):
        rows = _rooted(report, rank)
        expected = b.manifest["workload"]["payload_bytes_per_step"][str(rank)]
        assert {op: rows[op]["bytes_per_step"] for op in ("broadcast", "reduce")} == expected
        assert rows["broadcast"]["profiler_bytes_per_step"] is None  # nsys: no c10d annotations
    assert report["run"]["workload"]["payload_bytes_per_step"] == {
        op: b.manifest["workload"]["payload_bytes_per_step"]["0"][op] for op in ("broadcast", "reduce")
    }


# ---------------------------------------------------------------------------------------------
# FSDP2 and tensor parallelism.


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["torch", "nsys"])
def test_fsdp_shards_every_linear_and_runs_its_collectives(bundle, tool: str) -> None:
    b = bundle(f"fsdp_{tool}")
    for record in b.records:
        w = record["workload"]
        assert w["module"] == "FSDPSequential" and w["mesh"] == [2]
        assert set(w["placements"].values()) == {"S(0)"}  # every parameter sharded on dim 0
        assert w["optimizer_groups"] == [{"tensor_type": "DTensor", "params": 8}]
    _steps_and_phases(b)
    if tool == "torch":
        names = {e["name"] for e in _trace_events(b, 0) if e.get("cat") == "user_annotation"}
        assert any(n.startswith("gloo:all_gather") or n.startswith("gloo:_allgather") for n in names), names
        # gloo has no reduce-scatter: FSDP2 reduces the gradients there with an all-reduce (NCCL: reduce-scatter)
        assert "FSDP::post_backward_reduce (0)" in names and "gloo:all_reduce" in names, names


@pytest.mark.slow
@pytest.mark.parametrize("tool", ["torch", "nsys"])
def test_tensor_parallel_splits_linear_pairs(bundle, tool: str) -> None:
    b = bundle(f"tp_{tool}")
    for record in b.records:
        w = record["workload"]
        assert w["plan"] == {"0": "ColwiseParallel", "2": "RowwiseParallel"}
        assert (w["placements"]["0.weight"], w["placements"]["2.weight"]) == ("S(0)", "S(1)")
        assert w["placements"]["4.weight"] == "local"  # the third hidden layer has no partner; not split
        # torch 2.11's foreach optimizer refuses a group mixing DTensors and plain tensors (the GPU
        # machines' torch; CI's 2.13 accepts it): the split layers and the rest step in separate groups.
        assert w["optimizer_groups"] == [
            {"tensor_type": "DTensor", "params": 4},
            {"tensor_type": "Tensor", "params": 4},
        ]
    _steps_and_phases(b)
    if tool == "torch":
        names = {e["name"] for e in _trace_events(b, 0) if e.get("cat") == "user_annotation"}
        assert "gloo:all_reduce" in names, names


def _steps_and_phases(b: Bundle) -> None:
    report = b.report
    # (the verdict itself may fail: a 64-wide model's collectives are all "small", which is true)
    assert next(c["status"] for c in report["checks"] if c["id"] == "capture_health") in ("pass", "warn")
    for rank in report["ranks"]:
        assert rank["steps"], rank["rank"]
        assert all(list(s["phases"]) == ["get batch", "forward", "backward", "optimizer step"] for s in rank["steps"])


# ---------------------------------------------------------------------------------------------
# The results table over real bundles.


@pytest.mark.slow
def test_results_table_of_workload_bundles(bundle) -> None:
    from typer.testing import CliRunner

    from traceguard.cli import app

    names = ["pipeline_gpipe_torch", "br_fp32_blocking_torch", "br_fp16_async_torch"]
    bundles = [bundle(n) for n in names]
    root = bundle.root
    settings = [{"name": n, "options": RUNS[n], "bundle": n, "exit_status": 0} for n in names]
    settings.append({"name": "refused", "options": [], "bundle": "refused", "exit_status": 2, "refused": "why"})
    (root / "sweep.json").write_text(json.dumps({"matrix": "seed001-002", "base": [], "settings": settings}))
    result = CliRunner().invoke(app, ["harness", "table", str(root), "--profile", "ci-cpu"])
    assert result.exit_code == 0, result.output
    rows = {r["setting"]: r for r in json.loads((root / "results.json").read_text())["rows"]}
    pipe = rows["pipeline_gpipe_torch"]
    assert pipe["workload"] == "pipeline" and pipe["workload_kind"] == "pipeline"
    assert pipe["p2p_sent_bytes_per_step"] == sum(
        r["bytes"] for r in bundles[0].manifest["workload"]["sent_bytes_per_step"]
    )
    assert pipe["bubble"] is None and "no GPU kernels" in pipe["bubble_null_reason"]
    fp32, fp16 = rows["br_fp32_blocking_torch"], rows["br_fp16_async_torch"]
    assert fp32["rooted_payload_bytes_per_step"] == sum(
        bundles[1].manifest["workload"]["payload_bytes_per_step"]["0"].values()
    )
    assert fp16["rooted_payload_bytes_per_step"] * 2 == fp32["rooted_payload_bytes_per_step"]
    assert rows["refused"]["refused"] == "why" and rows["refused"]["verdict"] is None
    text = (root / "results.md").read_text()
    assert "| pipeline_gpipe_torch |" in text and "refused: why" in text
