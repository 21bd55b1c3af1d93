"""Minimum evidence (DESIGN.md): every rule has a floor in its profile below which it is ``skip``
with the evidence found and the floor, so a handful of events never decides a verdict.

The runs are real captures: nsys-ai's 2-GPU pipeline-parallel ``mfu_2gpu_before`` (34 host→device
copies of 8 B from pageable memory, no step marker), our H200 DDP bundles and collective
benchmarks. Each expected number is computed here from the raw file (plain ``sqlite3``, the
NCCL log and dmon text, the nccl-tests table), never taken from traceguard.
"""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests import reference
from tests.conftest import OWN, REPO, public_kineto, public_nsys
from traceguard.checks.profiles import Profile, RuleConfig, load_profile
from traceguard.checks.rules import CAPTURE_HEALTH, RULES, STEP_NOTES, CheckResult, evaluate, validate_profile
from traceguard.metrics.run import WINDOW_STEPS_NO_STRAGGLER, RunResult
from traceguard.pipeline import Analysis, analyze
from traceguard.report.document import CONTRACT_METRICS, EXTRA_METRICS, LINK_METRICS, RUN_ONLY

VALIDATOR = jsonschema.Draft202012Validator(json.loads((REPO / "docs" / "report.schema.json").read_text()))
MFU = "mfu_2gpu_before"
MiB = 1 << 20
#: CUPTI_ACTIVITY_KIND_MEMCPY codes, as the file's own ENUM tables name them (checked below).
HTOD, DTOH, PAGEABLE = 1, 2, 0


def _check(checks: list[CheckResult] | list[dict], rule_id: str) -> Any:
    return next(c for c in checks if (c["id"] if isinstance(c, dict) else c.id) == rule_id)


def _host_copies(path: Path) -> dict[str, int]:
    """Host↔device copies of the whole file, straight from CUPTI_ACTIVITY_KIND_MEMCPY."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    kinds = dict(db.execute("SELECT id, name FROM ENUM_CUDA_MEMCPY_OPER"))
    memory = dict(db.execute("SELECT id, name FROM ENUM_CUDA_MEM_KIND"))
    assert (kinds[HTOD], kinds[DTOH]) == ("CUDA_MEMCPY_KIND_HTOD", "CUDA_MEMCPY_KIND_DTOH")
    assert memory[PAGEABLE] == "CUDA_MEMOPR_MEMORY_KIND_PAGEABLE"
    host_side = "CASE copyKind WHEN 1 THEN srcKind WHEN 2 THEN dstKind END"
    copies, moved, pageable_copies, pageable = db.execute(
        f"SELECT count(*), sum(bytes), sum({host_side} = 0), sum(CASE WHEN {host_side} = 0 THEN bytes ELSE 0 END) "
        "FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind IN (1, 2)"
    ).fetchone()
    processes = db.execute("SELECT count(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    return {
        "copies": copies,
        "bytes": moved,
        "pageable_copies": pageable_copies,
        "pageable_bytes": pageable,
        "processes": processes,
    }


@pytest.fixture(scope="module")
def mfu(unpacked) -> Path:
    return unpacked(public_nsys(MFU))


# ---------------------------------------------------------------- pageable_host_copies on real captures


def test_mfu_pageable_scalars_skip_with_the_bytes_and_the_floor(mfu: Path) -> None:
    """34 HtoD copies of 8 B from pageable memory (272 B in all) are scalars, not a data path."""
    raw = _host_copies(mfu)
    assert (raw["copies"], raw["bytes"]) == (raw["pageable_copies"], raw["pageable_bytes"])  # all pageable
    assert raw["bytes"] == 8 * raw["copies"]
    # One step per rank (its whole GPU window) puts every copy of the file in the window.
    report = analyze([str(mfu)], step_sources=["window"]).report
    ranks = len(report["ranks"])
    assert ranks == raw["processes"]
    check = _check(report["checks"], "pageable_host_copies")
    assert check["status"] == "skip"
    assert check["value"] == 1.0  # every byte pageable: the share alone would fail (> 0.5)
    per_step = raw["bytes"] / ranks
    assert check["reason"] == (
        f"{raw['copies']} host↔device copies, {raw['bytes']} B over {ranks} steps = {per_step:.0f} B per step "
        "(< 1 MiB per step, the profile's min_bytes_per_step): too little to judge the data path"
    )
    assert check["evidence"] == [
        {
            "floor": "min_bytes_per_step",
            "minimum": float(MiB),
            "evidence_metric": "host_device_bytes_per_step",
            "found": per_step,
        }
    ]
    assert check["remedy"] is None
    assert STEP_NOTES["window"] in check["message"]
    assert report["verdict"] != "fail"  # the false alarm is gone: nothing else fails on this capture
    VALIDATOR.validate(report)  # the floor's evidence row and the new metrics are in the contract


def test_mfu_pageable_skips_whatever_steps_the_capture_gives(mfu: Path) -> None:
    """Default step sources (inferred on this capture): the copies inside the steps' window, at
    most the file's 34 × 8 B, are still far below the floor."""
    raw = _host_copies(mfu)
    report = analyze([str(mfu)]).report
    m = report["run"]["metrics"]
    check = _check(report["checks"], "pageable_host_copies")
    assert check["status"] == "skip"
    assert 0 < m["host_device_copies"] <= raw["copies"]
    assert m["host_device_bytes"] == 8 * m["host_device_copies"] <= raw["bytes"]
    assert m["host_device_bytes_per_step"] == m["host_device_bytes"] / m["step_count"] < MiB
    assert f"{m['host_device_copies']} host↔device copies, {m['host_device_bytes']} B over" in check["reason"]
    assert "(< 1 MiB per step, the profile's min_bytes_per_step): too little to judge the data path" in check["reason"]
    sources = {r["step_source"] for r in report["ranks"]}
    for source in sources & set(STEP_NOTES):
        assert STEP_NOTES[source] in check["message"]


def test_mfu_without_the_floor_still_fails_pageable(mfu: Path) -> None:
    """The floor, not a changed metric, is what turns the false alarm into a skip."""
    production = load_profile("production")
    config = production.rules["pageable_host_copies"]
    floorless = replace(production, rules={"pageable_host_copies": replace(config, minimum={})})
    check = _check(analyze([str(mfu)], profile=floorless).checks, "pageable_host_copies")
    assert check.status == "fail"
    assert check.value == 1.0


def test_cpu_staged_gradients_through_pageable_memory_still_fail(unpacked) -> None:
    """The sweep's cpu_staged run copies every gradient to the host and back (`tensor.cpu()` →
    all_reduce → `.to(device)`) from pageable memory: gigabytes per step, far above the floor."""
    files = [unpacked(p) for p in sorted((OWN / "sweep_h200" / "cpu_staged").glob("cap_*.sqlite.gz"))]
    raws = [_host_copies(f) for f in files]
    steps = 0
    for path in files:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        names = [
            row[0]
            for row in db.execute(
                "SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
            )
        ]
        steps += sum(bool(re.fullmatch(r"Batch \d+", name or "")) for name in names)
        # Every host↔device copy was launched inside a `Batch N` range: the window holds them all.
        outside = db.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY m JOIN CUPTI_ACTIVITY_KIND_RUNTIME r "
            "ON r.correlationId = m.correlationId AND r.globalTid / 16777216 = m.globalPid / 16777216 "
            "WHERE m.copyKind IN (1, 2) AND NOT EXISTS (SELECT 1 FROM NVTX_EVENTS e LEFT JOIN StringIds s "
            "ON s.id = e.textId WHERE coalesce(e.text, s.value) LIKE 'Batch %' "
            "AND e.globalTid / 16777216 = m.globalPid / 16777216 AND r.start BETWEEN e.start AND e.end)"
        ).fetchone()[0]
        assert outside == 0
    moved = sum(r["bytes"] for r in raws)
    pageable = sum(r["pageable_bytes"] for r in raws)
    assert pageable / steps > 1024 * MiB  # > 1 GiB per step from pageable memory

    report = analyze([str(f) for f in files]).report
    m = report["run"]["metrics"]
    assert (m["host_device_bytes"], m["pageable_host_bytes"], m["step_count"]) == (moved, pageable, steps)
    assert m["host_device_copies"] == sum(r["copies"] for r in raws)
    assert m["host_device_bytes_per_step"] == pytest.approx(moved / steps)
    check = _check(report["checks"], "pageable_host_copies")
    assert check["status"] == "fail"
    assert check["value"] == pytest.approx(pageable / moved)
    assert check["remedy"] and "pin_memory" in check["remedy"]
    assert "steps inferred" not in check["message"] and "window" not in check["message"]  # marker steps


def test_a_few_pageable_scalars_beside_a_pinned_data_path_are_no_finding(unpacked) -> None:
    """nsys-ai's h100_2gpu_1s: tens of GB of pinned HtoD copies and 4 pageable copies of 784 B.
    The share (~6e-8) is above production's warn bound (> 0); the finding floor makes it no alarm."""
    path = unpacked(public_nsys("h100_2gpu_1s"))
    raw = _host_copies(path)
    assert raw["pageable_copies"] == 4 and raw["pageable_bytes"] == 4 * 784
    analysis = analyze([str(path)], step_sources=["window"])  # every copy in the window
    m = analysis.result.metrics
    steps = len(analysis.result.ranks)
    assert (m["host_device_bytes"], m["pageable_host_bytes"], m["step_count"]) == (
        raw["bytes"],
        raw["pageable_bytes"],
        steps,
    )
    assert raw["bytes"] / steps >= MiB  # the data path itself is well above min_bytes_per_step
    check = _check(analysis.checks, "pageable_host_copies")
    assert check.status == "skip"
    assert check.reason == (
        f"3.062 KiB of pageable host↔device copies over {steps} steps = {raw['pageable_bytes'] / steps / 1024:.4g} KiB "
        "per step (< 1 MiB per step, the profile's min_pageable_bytes_per_step): too little pageable traffic to cost "
        "anything measurable: no finding"
    )
    production = load_profile("production")
    config = production.rules["pageable_host_copies"]
    # Without the finding floor (the data path's floor kept) the 3 KiB would warn.
    without = replace(config, minimum={"min_bytes_per_step": config.minimum["min_bytes_per_step"]})
    alarm = _check(evaluate(analysis.result, replace(production, rules={"pageable_host_copies": without})), check.id)
    assert alarm.status == "warn"
    assert alarm.value == pytest.approx(raw["pageable_bytes"] / raw["bytes"])


def test_a_few_syncs_over_many_steps_are_no_per_step_habit(unpacked) -> None:
    """h100_2gpu_1s again: 4 DtoH copies of 1-8 B in a capture of dozens of inferred steps."""
    path = unpacked(public_nsys("h100_2gpu_1s"))
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    dtoh = db.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 2").fetchone()[0]
    assert dtoh == 4
    analysis = analyze([str(path)])
    m = analysis.result.metrics
    assert m["gpu_to_cpu_copies"] <= dtoh < m["step_count"]
    check = _check(analysis.checks, "gpu_to_cpu_copy_rate")
    assert check.status == "skip"
    per_step = m["gpu_to_cpu_copies"] / m["step_count"]
    assert check.reason.startswith(
        f"{m['gpu_to_cpu_copies']} GPU→CPU copies over {m['step_count']} steps = {per_step:.3g} per step "
        "(< 1 copy per step, the profile's min_copies_per_step)"
    )
    sources = {r.step_source for r in analysis.result.ranks} & set(STEP_NOTES)
    assert all(STEP_NOTES[source] in check.message for source in sources)


def test_finding_floors_never_stop_a_pass(p2p_bundle: Analysis) -> None:
    """The H200 DDP run has no pageable byte and no GPU→CPU copy: far below both finding floors,
    and both rules pass (a pass needs no offending event)."""
    m = p2p_bundle.result.metrics
    assert m["pageable_host_bytes"] == 0 and m["gpu_to_cpu_copies"] == 0
    checks = {c.id: c for c in p2p_bundle.checks}
    assert checks["pageable_host_copies"].status == checks["gpu_to_cpu_copy_rate"].status == "pass"


# ---------------------------------------------------------------- one floor per rule, on real runs


@pytest.fixture(scope="module")
def p2p_bundle() -> Analysis:
    """2×H200 DDP (ViT-L/32, NCCL over NVLink): captures, NCCL logs and dmon found in the run folder."""
    return analyze([str(OWN / "h200" / "p2p_nsys")])


@pytest.fixture(scope="module")
def cpu_staged(unpacked) -> Analysis:
    return analyze([str(unpacked(p)) for p in sorted((OWN / "sweep_h200" / "cpu_staged").glob("cap_*.sqlite.gz"))])


@pytest.fixture(scope="module")
def benchmark() -> Analysis:
    """2×H200 nccl-tests-format all-reduce sweep (8 B – 1 GiB) in a CUDA graph."""
    return analyze([str(OWN / "collectives" / "h200x2" / "p2p_graph")])


def _with_floor(rule_id: str, key: str, minimum: float) -> Profile:
    """Production's bounds for one rule, with only the given floor."""
    config = load_profile("production").rules[rule_id]
    return Profile(name="floor", chain=["floor"], rules={rule_id: replace(config, minimum={key: minimum})})


def _at_and_below(result: RunResult, rule_id: str, key: str, evidence: float) -> tuple[CheckResult, CheckResult]:
    """The rule with its floor exactly at the evidence found (evaluated) and just above it (skip)."""
    at = _check(evaluate(result, _with_floor(rule_id, key, evidence)), rule_id)
    short = _check(evaluate(result, _with_floor(rule_id, key, evidence + 1)), rule_id)
    assert at.status != "skip" and at.reason is None, at
    assert short.status == "skip" and short.value == at.value
    assert f"the profile's {key}" in short.reason and short.remedy is None
    (row,) = short.evidence
    assert (row["floor"], row["minimum"], row["found"]) == (key, evidence + 1, evidence)
    return at, short


def _nsys_files(run: str, unpacked) -> list[Path]:
    return [unpacked(p) for p in sorted((OWN / run).glob("cap_*.sqlite.gz"))]


def test_gpu_to_cpu_copy_rate_floor_is_gpu_ops(cpu_staged: Analysis, unpacked) -> None:
    parts = [reference.expected(reference.read_nsys(f)) for f in _nsys_files("sweep_h200/cpu_staged", unpacked)]
    ops, copies = sum(p.gpu_ops for p in parts), sum(p.dtoh for p in parts)
    at, short = _at_and_below(cpu_staged.result, "gpu_to_cpu_copy_rate", "min_gpu_ops", ops)
    assert at.status == "fail" and at.value == pytest.approx(copies / ops)
    assert short.reason.startswith(f"{copies} GPU→CPU copies among {ops} GPU ops (< {ops + 1} GPU ops")
    assert short.reason.endswith("too few GPU ops for a rate: a single copy would cross the bounds")


def test_one_copy_among_a_few_ops_is_no_rate(unpacked) -> None:
    """nsys-ai's mock.sqlite: one DtoH copy among 3 GPU ops would be a 33 % copy rate."""
    path = unpacked(public_nsys("mock"))
    raw = reference.expected(reference.read_nsys(path), window_steps=True)
    assert (raw.gpu_ops, raw.dtoh) == (3, 1)
    check = _check(analyze([str(path)]).checks, "gpu_to_cpu_copy_rate")
    assert check.status == "skip"
    assert check.value == pytest.approx(raw.dtoh / raw.gpu_ops)
    assert check.reason == (
        f"{raw.dtoh} GPU→CPU copy among {raw.gpu_ops} GPU ops (< 1000 GPU ops, the profile's min_gpu_ops): "
        "too few GPU ops for a rate: a single copy would cross the bounds"
    )


def test_a_per_step_copy_habit_in_a_short_trace_is_still_judged() -> None:
    """HTA's sampled trace: 2 ProfilerSteps, 1204 GPU ops, 8 DtoH copies: above the floor, fails."""
    raw = reference.expected(reference.read_kineto(public_kineto("sampled_rank-0")))
    assert raw.gpu_ops >= 1000 and raw.steps == 2
    check = _check(analyze([str(public_kineto("sampled_rank-0"))]).checks, "gpu_to_cpu_copy_rate")
    assert check.status == "fail"
    assert check.value == pytest.approx(raw.dtoh / raw.gpu_ops)


def test_gpu_to_cpu_finding_floor_is_copies_per_step(cpu_staged: Analysis) -> None:
    m = cpu_staged.result.metrics
    per_step = m["gpu_to_cpu_copies"] / m["step_count"]
    at, short = _at_and_below(cpu_staged.result, "gpu_to_cpu_copy_rate", "min_copies_per_step", per_step)
    assert at.status == "fail"
    assert f"(< {per_step + 1:g} copies per step, the profile's min_copies_per_step)" in short.reason
    assert "the every-N-steps habit the remedy recommends" in short.reason


def test_pageable_finding_floor_is_pageable_bytes_per_step(cpu_staged: Analysis, unpacked) -> None:
    files = _nsys_files("sweep_h200/cpu_staged", unpacked)
    per_step = sum(_host_copies(f)["pageable_bytes"] for f in files) / cpu_staged.result.metrics["step_count"]
    at, short = _at_and_below(cpu_staged.result, "pageable_host_copies", "min_pageable_bytes_per_step", per_step)
    assert at.status == "fail"
    assert short.reason.endswith("too little pageable traffic to cost anything measurable: no finding")


def test_dtod_floor_is_the_gradient_payload(p2p_bundle: Analysis) -> None:
    gradient = json.loads((OWN / "h200" / "p2p_nsys" / "rank0.json").read_text())["gradient_bytes"]
    at, short = _at_and_below(p2p_bundle.result, "dtod_copy_volume", "min_gradient_bytes_per_step", gradient)
    assert at.status == "pass"
    gib = f"{gradient / (1 << 30):.4g} GiB"
    assert short.reason.startswith(f"gradient-reduction payload (AllReduce) {gib} per step (< {gib} per step")
    assert "too small a payload to be gradients" in short.reason


def test_dtod_skips_on_a_scalar_allreduce_payload(p2p_bundle: Analysis) -> None:
    """DDP's 4-byte start-up all-reduce as the only payload would make any DtoD copy 'many times
    the gradients': the production floor (1 MiB per step) skips it."""
    result = RunResult(
        metrics={**p2p_bundle.result.metrics, "gradient_reduction_bytes_per_step": 4.0, "dtod_to_gradient_ratio": 1e8},
        null_reasons={},
        ranks=p2p_bundle.result.ranks,
        straggler_steps=[],
    )
    check = _check(evaluate(result, load_profile("production")), "dtod_copy_volume")
    assert check.status == "skip"
    assert "payload (AllReduce) 4 B per step (< 1 MiB per step, the profile's min_gradient_bytes_per_step)" in (
        check.reason
    )


def test_nccl_share_floor_is_the_steps_gpu_span(p2p_bundle: Analysis, unpacked) -> None:
    parts = [reference.expected(reference.read_nsys(f)) for f in _nsys_files("h200/p2p_nsys", unpacked)]
    span, steps = sum(p.span_ns for p in parts), sum(p.steps for p in parts)
    at, short = _at_and_below(p2p_bundle.result, "nccl_step_share", "min_gpu_span_ns", span)
    assert at.status == "pass" and at.value == pytest.approx(sum(p.nccl_step_ns for p in parts) / span)
    assert short.reason.startswith(f"{span / 1e6:.4g} ms of GPU work in {steps} steps (< {(span + 1) / 1e6:.4g} ms")


def test_pageable_floor_is_bytes_per_step(cpu_staged: Analysis, unpacked) -> None:
    files = _nsys_files("sweep_h200/cpu_staged", unpacked)
    moved = sum(_host_copies(f)["bytes"] for f in files)
    per_step = moved / cpu_staged.result.metrics["step_count"]
    at, short = _at_and_below(cpu_staged.result, "pageable_host_copies", "min_bytes_per_step", per_step)
    assert at.status == "fail"
    assert short.reason.endswith("too little to judge the data path")


def test_homogeneous_gpus_floor_is_ranks_with_a_named_gpu(p2p_bundle: Analysis, unpacked) -> None:
    named = 0
    for path in _nsys_files("h200/p2p_nsys", unpacked):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        named += bool(db.execute("SELECT count(*) FROM TARGET_INFO_GPU WHERE name LIKE '%H200%'").fetchone()[0])
    assert named == 2
    at, short = _at_and_below(p2p_bundle.result, "homogeneous_gpus", "min_ranks", named)
    assert at.status == "pass"
    assert short.reason == "2 ranks with a named GPU model (< 3 ranks, the profile's min_ranks): nothing to compare"


def test_straggler_floor_is_steps_compared(p2p_bundle: Analysis, unpacked) -> None:
    per_rank = []
    for path in _nsys_files("h200/p2p_nsys", unpacked):
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        texts = db.execute(
            "SELECT coalesce(e.text, s.value) FROM NVTX_EVENTS e LEFT JOIN StringIds s ON s.id = e.textId"
        )
        per_rank.append({t for (t,) in texts if t and re.fullmatch(r"Batch \d+", t)})
    common = len(per_rank[0] & per_rank[1])
    assert common == 3
    at, short = _at_and_below(p2p_bundle.result, "straggler", "min_steps", common)
    # At the floor the rule judges: rank 1 reaches the single all-reduce 7-9 ms after rank 0 in
    # steps 1 and 2 (9.4 % of the step), though the GPU spans differ by 3.5 %: the message says so.
    assert at.status == "warn"
    assert "arrival spread 9.4%" in at.message and "rank 1 arrived last" in at.message
    assert short.reason.startswith("3 steps compared across ranks (< 4 steps, the profile's min_steps)")


def test_transport_floor_is_connection_lines(p2p_bundle: Analysis) -> None:
    lines = [
        line
        for log in sorted((OWN / "h200" / "p2p_nsys").glob("nccl.*.log"))
        for line in log.read_text().splitlines()
        if re.search(r"NCCL INFO Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] via ", line)
    ]
    at, short = _at_and_below(p2p_bundle.result, "transport_p2p", "min_connections", len(lines))
    assert at.status == "pass"
    # This capture has no GPU metrics: the observations are the log's connection lines alone.
    assert short.reason.startswith(f"{len(lines)} NCCL connection lines (< {len(lines) + 1} observations")


def test_pcie_floor_is_dmon_samples_per_gpu(p2p_bundle: Analysis) -> None:
    samples: dict[str, int] = {}
    for line in (OWN / "h200" / "p2p_nsys" / "dmon.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            samples[line.split()[0]] = samples.get(line.split()[0], 0) + 1
    fewest = min(samples.values())
    at, short = _at_and_below(p2p_bundle.result, "pcie_saturation", "min_samples", fewest)
    assert at.status == "pass"
    found = f"{fewest} dmon PCIe samples on the GPU with the fewest"
    assert short.reason.startswith(f"{found} (< {fewest + 1} samples, the profile's min_samples)")
    assert short.reason.endswith("too few samples: their peak is one burst, not the link's load")


def _all_reduce_rows() -> list[list[str]]:
    text = (OWN / "collectives" / "h200x2" / "p2p_graph" / "nccl-tests.txt").read_text()
    block = text.split("all_reduce_perf", 1)[1].split("Collective test concluded", 1)[0]
    return [line.split() for line in block.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\w+", line)]


def test_p2p_utilization_floor_is_the_largest_message(benchmark: Analysis) -> None:
    largest = max(int(row[0]) for row in _all_reduce_rows())
    assert largest == 1 << 30
    at, short = _at_and_below(benchmark.result, "p2p_utilization", "min_message_bytes", largest)
    assert at.status == "fail"  # 0.89 of NCCL's maxBw: production wants 0.95 (h200-nvlink relaxes it)
    assert short.reason.startswith("largest all-reduce message in the benchmark 1 GiB (< 1 GiB, ")
    assert "below the bandwidth plateau" in short.reason


def test_a_benchmark_without_large_messages_is_no_bandwidth_verdict_on_nvlink_class_profiles() -> None:
    """The NET (socket) benchmark stops at 64 MiB: below production's plateau floor (512 MiB,
    NVLink ramps up slowly) it skips; pcie-only nodes plateau early, and there it is judged."""
    run_dir = OWN / "collectives" / "h200x2" / "net_graph"
    text = (run_dir / "nccl-tests.txt").read_text()
    block = text.split("all_reduce_perf", 1)[1].split("Collective test concluded", 1)[0]
    largest = max(int(line.split()[0]) for line in block.splitlines() if re.match(r"^\s*\d+\s+\d+\s+\w+", line))
    assert largest == 64 * MiB
    production = _check(analyze([str(run_dir)]).checks, "p2p_utilization")
    assert production.status == "skip"
    assert production.reason.startswith("largest all-reduce message in the benchmark 64 MiB (< 512 MiB, the profile's")
    pcie = _check(analyze([str(run_dir)], profile="pcie-only").checks, "p2p_utilization")
    assert pcie.status != "skip" and pcie.value == production.value


def test_allreduce_latency_floor_is_small_message_samples(benchmark: Analysis) -> None:
    small = [row for row in _all_reduce_rows() if int(row[0]) <= 8192]
    assert len(small) == 11  # 8 B, 16 B, ..., 8 KiB
    at, short = _at_and_below(benchmark.result, "allreduce_latency", "min_sizes", len(small))
    assert at.status == "fail"
    assert short.reason.startswith("11 timed all-reduce sizes of at most 8 KiB (< 12 sizes")


def test_production_floors_keep_the_committed_verdicts(p2p_bundle: Analysis, benchmark: Analysis) -> None:
    """Every evidence metric of these real runs is above production's floors: no rule skips for
    want of evidence where it judged before (p2p bundle: 28 dmon samples per GPU, 48 connection
    lines, 3 steps on both ranks, 1.14 GiB of gradients per step; benchmark: 1 GiB, 11 sizes)."""
    for analysis in (p2p_bundle, benchmark):
        for check in analysis.checks:
            if check.status == "skip":
                assert "the profile's min_" not in (check.reason or ""), check


def test_every_rule_floor_reads_a_metric_of_the_json_contract() -> None:
    contract = set(CONTRACT_METRICS + EXTRA_METRICS + RUN_ONLY + LINK_METRICS)
    for rule in RULES.values():
        assert rule.floors, f"{rule.id} has no minimum evidence"
        for floor in rule.floors:
            assert floor.key.startswith("min_")
            assert floor.metric in contract, (rule.id, floor.metric)


# ---------------------------------------------------------------- steps: inferred and window


def test_window_steps_are_named_in_verdicts_and_never_straggle(mfu: Path) -> None:
    analysis = analyze([str(mfu)], step_sources=["window"])
    assert {r.step_source for r in analysis.result.ranks} == {"window"}
    assert all(len(r.steps) == 1 for r in analysis.result.ranks)
    straggler = _check(analysis.checks, "straggler")
    assert straggler.status == "skip" and straggler.reason == WINDOW_STEPS_NO_STRAGGLER
    assert analysis.result.metrics["straggler_steps_compared"] == 0
    nccl = _check(analysis.checks, "nccl_step_share")
    assert nccl.status == "pass"
    assert nccl.message.endswith(f"({STEP_NOTES['window']})")


def test_only_step_based_verdicts_name_window_steps() -> None:
    """The H200 bundle with its `Batch N` markers ignored: every verdict drawn from steps says
    they are whole windows; the link rules (NCCL log, dmon) say nothing about steps."""
    analysis = analyze([str(OWN / "h200" / "p2p_nsys")], step_sources=["window"])
    evaluated = [c for c in analysis.checks if c.id in RULES and c.status != "skip"]
    assert {c.id for c in evaluated} >= {"nccl_step_share", "dtod_copy_volume", "transport_p2p", "pcie_saturation"}
    for check in evaluated:
        assert (STEP_NOTES["window"] in check.message) == RULES[check.id].step_based, check.message


def test_marker_steps_add_no_note(p2p_bundle: Analysis) -> None:
    assert {r.step_source for r in p2p_bundle.result.ranks} == {"convention"}
    for check in p2p_bundle.checks:
        assert all(note not in check.message for note in STEP_NOTES.values())


def test_step_note_names_the_ranks_when_sources_differ(mfu: Path) -> None:
    analysis = analyze([str(mfu)], step_sources=["window"])
    ranks = analysis.result.ranks
    ranks[1].step_source = "inferred"  # as if rank 1's kernels had shown a period
    result = RunResult(analysis.result.metrics, analysis.result.null_reasons, ranks, [])
    message = _check(evaluate(result, load_profile("production")), "nccl_step_share").message
    assert f"rank 0: {STEP_NOTES['window']}" in message
    assert f"rank 1: {STEP_NOTES['inferred']}" in message


# ---------------------------------------------------------------- profiles


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "team.toml"
    path.write_text('extends = "production"\n' + text)
    return path


@pytest.mark.parametrize(
    ("rule_id", "key"),
    [("straggler", "min_step"), ("pageable_host_copies", "min_bytes"), ("capture_health", "min_gpu_ops")],
    ids=["typo", "other-rules-floor-name", "rule-without-floors"],
)
def test_validation_rejects_floors_the_rule_does_not_have(tmp_path: Path, rule_id: str, key: str) -> None:
    from traceguard.errors import ProfileError

    profile = load_profile(str(_write(tmp_path, f"[rules.{rule_id}]\n{key} = 3\n")))
    assert profile.rules[rule_id].minimum[key] == 3.0  # loads: the rule, not the loader, knows its floors
    with pytest.raises(ProfileError) as info:
        validate_profile(profile)
    assert key in info.value.message and rule_id in info.value.message
    declared = sorted(f.key for f in RULES[rule_id].floors) if rule_id in RULES else []
    assert info.value.hint and all(k in info.value.hint for k in declared)
    # The pipeline validates before analysing: a typo never silently turns a floor off.
    with pytest.raises(ProfileError):
        analyze([str(OWN / "collectives" / "h200x2" / "p2p_graph")], profile=profile)


@pytest.mark.parametrize("value", ['"1 MiB"', "-1", "true"])
def test_a_floor_must_be_a_number_at_least_zero(tmp_path: Path, value: str) -> None:
    from traceguard.errors import ProfileError

    with pytest.raises(ProfileError, match="min_bytes_per_step must be a number >= 0"):
        load_profile(str(_write(tmp_path, f"[rules.pageable_host_copies]\nmin_bytes_per_step = {value}\n")))


def test_a_child_profile_can_lower_a_floor_to_zero(tmp_path: Path, mfu: Path) -> None:
    profile = load_profile(str(_write(tmp_path, "[rules.pageable_host_copies]\nmin_bytes_per_step = 0\n")))
    validate_profile(profile)
    floors = profile.rules["pageable_host_copies"].minimum
    assert floors == {"min_bytes_per_step": 0.0, "min_pageable_bytes_per_step": float(MiB)}  # key by key
    assert profile.rules["pageable_host_copies"].fail == 0.5  # bounds still inherited
    check = _check(analyze([str(mfu)], profile=profile).checks, "pageable_host_copies")
    # The data path's floor is off; the finding still needs 1 MiB of pageable traffic per step.
    assert check.status == "skip" and "the profile's min_pageable_bytes_per_step" in check.reason
    both = _write(tmp_path, "[rules.pageable_host_copies]\nmin_bytes_per_step = 0\nmin_pageable_bytes_per_step = 0\n")
    assert _check(analyze([str(mfu)], profile=load_profile(str(both))).checks, "pageable_host_copies").status == "fail"


@pytest.mark.parametrize("path", sorted((Path(__file__).parents[2] / "profiles").glob("*.toml")), ids=lambda p: p.stem)
def test_every_shipped_profile_validates_and_sets_every_floor(path: Path) -> None:
    profile = load_profile(str(path))
    validate_profile(profile)
    for rule_id, rule in RULES.items():
        config = profile.rules.get(rule_id) or RuleConfig()
        assert {f.key for f in rule.floors} <= set(config.minimum), rule_id
        assert all(v >= 0 for v in config.minimum.values())
    assert profile.rules.get(CAPTURE_HEALTH, RuleConfig()).minimum == {}
