"""``traceguard.checks.rules.evaluate`` on hand-built run results.

The results are built here from plain dicts (no capture is read), so each test states exactly the
metric value and the bounds, and the expected status follows from the rule's definition in
DESIGN.md ("Checks and profiles"): a value crossing ``fail`` fails, else crossing ``warn`` warns,
else passes; a ``None`` metric skips with its null reason, never passes.
"""

from __future__ import annotations

from typing import Any

import polars as pl
import pytest

from traceguard.checks.profiles import Profile, RuleConfig
from traceguard.checks.rules import CAPTURE_HEALTH, RULES, evaluate
from traceguard.metrics.links import LinkResult
from traceguard.metrics.rank import RankResult
from traceguard.metrics.run import RunResult, StragglerStep

HEALTHY = {
    "gpu_ops": 1000,
    "api_calls": 1200,
    "ranges": 40,
    "steps": 3,
    "has_gpu_trace": True,
    "has_ranges": True,
    "nvtx_domains": [],
    "domains_without_ranges": [],
    "default_domain_ranges": 40,
    "ops_without_launch": 0,
    "negative_durations": 0,
}
#: Rule id → the run metric it reads (DESIGN.md's table), written out independently of RULES.
METRIC_OF = {
    "gpu_to_cpu_copy_rate": "gpu_to_cpu_copy_rate",
    "dtod_copy_volume": "dtod_to_gradient_ratio",
    "nccl_step_share": "nccl_share_of_step",
    "collective_wait": "nccl_wait_share",
    "pageable_host_copies": "pageable_host_share",
    "homogeneous_gpus": "distinct_gpu_models",
    # The worse of the GPU-span spread and the arrival spread (docs/collectives.md): a rank late on
    # its host stretches the others' spans, not its own.
    "straggler": "straggler_worst",
    # Link rules (side inputs, traceguard/metrics/links.py).
    "transport_p2p": "transport_fallback_pairs",
    "pcie_saturation": "pcie_saturation",
    "p2p_utilization": "p2p_utilization",
    "allreduce_latency": "allreduce_small_latency_us",
    # Small collectives (metrics/small_collectives.py).
    "small_collectives": "small_collective_time_share",
}


def _step(index: int, span: int = 10_000_000, nccl: int = 3_000_000) -> dict[str, Any]:
    return {
        "name": f"Batch {index}",
        "index": index,
        "start_ns": index * 20_000_000,
        "cpu_ns": 12_000_000,
        "gpu_span_ns": span,
        "nccl_ns": nccl,
        "nccl_share": nccl / span,
        "dtod_bytes": 4096,
        "dtod_copies": 2,
        "phases": {},
    }


def _rank(rank: int, metrics: dict[str, Any] | None = None, *, health: dict[str, Any] | None = None) -> RankResult:
    return RankResult(
        rank=rank,
        metrics=dict(metrics or {}),
        null_reasons={},
        steps=[_step(i) for i in range(3)],
        collectives=pl.DataFrame(),
        gpu_to_cpu_offenders=[{"nvtx_range": "Batch 1", "api_call": "cudaMemcpyAsync", "copies": 3, "bytes": 12}],
        health={**HEALTHY, **(health or {})},
        gpu_models=["NVIDIA H200"],
        spans_by_index={0: 10_000_000, 1: 10_000_000, 2: 10_000_000},
    )


def _run(
    metrics: dict[str, Any] | None = None,
    null_reasons: dict[str, str] | None = None,
    *,
    ranks: list[RankResult] | None = None,
) -> RunResult:
    """A two-rank run whose ranks carry the same metrics as the run (evidence reads rank rows)."""
    metrics = dict(metrics or {})
    # Link rules read their evidence from the side-input analysis (quoted log lines, samples).
    links = LinkResult(
        metrics={},
        null_reasons={},
        findings=[],
        evidence={
            "transport_p2p": [{"finding": "shm_within_node", "lines": ["... via SHM/direct/direct"]}],
            "pcie_saturation": [{"gpu": 0, "peak": 0.9}],
            "p2p_utilization": [{"size_bytes": 1 << 30, "busbw_gbps": 27.6, "expected_gbps": 48.0}],
            "allreduce_latency": [{"size_bytes": 8, "time_us": 42.0}],
        },
    )
    return RunResult(
        metrics=metrics,
        null_reasons=dict(null_reasons or {}),
        ranks=ranks if ranks is not None else [_rank(0, metrics), _rank(1, metrics)],
        straggler_steps=[StragglerStep(index=1, slowest_rank=1, slowest_ns=12_000_000, median_ns=11e6, spread=0.09)],
        links=links,
    )


def _profile(**rules: RuleConfig) -> Profile:
    return Profile(name="unit", chain=["unit"], rules=dict(rules))


def _only(run: RunResult, rule_id: str, config: RuleConfig):
    checks = {c.id: c for c in evaluate(run, _profile(**{rule_id: config}))}
    assert list(checks) == [CAPTURE_HEALTH, rule_id]
    return checks[rule_id]


# ---------------------------------------------------------------- threshold semantics


def test_every_implemented_rule_reads_the_metric_design_names() -> None:
    assert {rule_id: rule.metric for rule_id, rule in RULES.items()} == METRIC_OF


@pytest.mark.parametrize(
    ("op", "value", "status"),
    [
        (">=", 0.001, "fail"),  # exactly the fail bound counts for >=
        (">=", 0.0005, "warn"),  # exactly the warn bound counts for >=
        (">=", 0.00049, "pass"),
        (">", 0.001, "warn"),  # exactly the fail bound does not count for >, but it is above warn
        (">", 0.0005, "pass"),  # exactly the warn bound does not count for >
        (">", 0.0011, "fail"),
    ],
)
def test_op_is_inclusive_or_strict_at_exactly_the_bound(op: str, value: float, status: str) -> None:
    run = _run({"gpu_to_cpu_copy_rate": value})
    check = _only(run, "gpu_to_cpu_copy_rate", RuleConfig(op=op, warn=0.0005, fail=0.001))
    assert check.status == status
    assert (check.value, check.warn, check.fail, check.op) == (value, 0.0005, 0.001, op)


@pytest.mark.parametrize(
    ("op", "value", "status"),
    [
        ("<", 0.90, "fail"),
        ("<", 0.95, "warn"),  # exactly fail: not below it, but below warn
        ("<", 0.97, "pass"),
        ("<=", 0.95, "fail"),
        ("<=", 0.97, "warn"),
        ("<=", 0.98, "pass"),
    ],
)
def test_low_is_bad_ops_for_utilisation_style_rules(op: str, value: float, status: str) -> None:
    run = _run({"nccl_share_of_step": value})
    check = _only(run, "nccl_step_share", RuleConfig(op=op, warn=0.97, fail=0.95))
    assert check.status == status


def test_fail_beats_warn_when_both_bounds_are_crossed() -> None:
    run = _run({"nccl_share_of_step": 0.9})
    check = _only(run, "nccl_step_share", RuleConfig(op=">", warn=0.2, fail=0.35))
    assert check.status == "fail"
    assert "fail" in check.message


def test_fail_only_rule_without_warn_bound() -> None:
    # homogeneous_gpus: production has only `fail = 1`; two models fail, one model passes.
    config = RuleConfig(op=">", fail=1)
    assert _only(_run({"distinct_gpu_models": 2}), "homogeneous_gpus", config).status == "fail"
    assert _only(_run({"distinct_gpu_models": 1}), "homogeneous_gpus", config).status == "pass"


# ---------------------------------------------------------------- skip: never pass without a value


@pytest.mark.parametrize("rule_id", sorted(METRIC_OF))
def test_missing_metric_skips_with_its_null_reason(rule_id: str) -> None:
    metric = METRIC_OF[rule_id]
    reason = f"no data for {metric} in this unit test"
    run = _run({metric: None}, {metric: reason})
    # Bounds that any value, even 0, would cross: a None must still not pass or fail.
    check = _only(run, rule_id, RuleConfig(op=">=", warn=0.0, fail=0.0))
    assert check.status == "skip"
    assert check.reason == reason
    assert check.value is None
    assert check.remedy is None and check.evidence == []


def test_missing_metric_without_a_recorded_reason_still_skips_with_a_reason() -> None:
    check = _only(_run({}), "straggler", RuleConfig(warn=0.05, fail=0.15))
    assert check.status == "skip"
    assert check.reason  # never an empty reason


@pytest.mark.parametrize("rule_id", sorted(METRIC_OF))
def test_disabled_rule_skips_with_a_reason_even_when_it_would_fail(rule_id: str) -> None:
    run = _run({METRIC_OF[rule_id]: 5.0})
    check = _only(run, rule_id, RuleConfig(enabled=False, op=">", warn=0.1, fail=0.2))
    assert check.status == "skip"
    assert check.reason and "disabled" in check.reason
    assert check.remedy is None


def test_rules_the_profile_does_not_name_are_not_run() -> None:
    run = _run({"nccl_share_of_step": 0.99, "straggler_spread": 0.99})
    checks = evaluate(run, _profile(straggler=RuleConfig(warn=0.05, fail=0.15)))
    assert [c.id for c in checks] == [CAPTURE_HEALTH, "straggler"]


# ---------------------------------------------------------------- evidence and remedy


FAILING_VALUE = {
    "gpu_to_cpu_copy_rate": 0.01,
    "dtod_to_gradient_ratio": 2.0,
    "nccl_share_of_step": 0.5,
    "pageable_host_share": 0.8,
    "distinct_gpu_models": 2,
    "straggler_worst": 0.4,
    "nccl_wait_share": 0.9,
    "transport_fallback_pairs": 1,
    "pcie_saturation": 0.9,
    "p2p_utilization": 0.6,
    "allreduce_small_latency_us": 42.0,
    "small_collective_time_share": 0.9,
}


@pytest.mark.parametrize("status", ["warn", "fail"])
@pytest.mark.parametrize("rule_id", sorted(METRIC_OF))
def test_warn_and_fail_carry_evidence_and_a_remedy(rule_id: str, status: str) -> None:
    metric = METRIC_OF[rule_id]
    value = FAILING_VALUE[metric]
    # warn bound just below the value; fail bound below it too (fail) or far above it (warn).
    config = RuleConfig(op=">", warn=value / 2, fail=value / 1.5 if status == "fail" else value * 10)
    check = _only(_run({metric: value}), rule_id, config)
    assert check.status == status
    assert check.evidence, f"{rule_id} {status} without evidence"
    assert all(isinstance(row, dict) and row for row in check.evidence)
    assert check.remedy and len(check.remedy) > 40
    assert check.reason is None


@pytest.mark.parametrize("rule_id", sorted(METRIC_OF))
def test_pass_carries_no_remedy_and_no_evidence(rule_id: str) -> None:
    metric = METRIC_OF[rule_id]
    check = _only(_run({metric: 0.0}), rule_id, RuleConfig(op=">", warn=0.5, fail=1.0))
    assert check.status == "pass"
    assert check.remedy is None
    assert check.evidence == []
    assert "within bounds" in check.message


def test_nccl_evidence_names_the_worst_rank_first() -> None:
    ranks = [_rank(0, {"nccl_share_of_step": 0.25}), _rank(1, {"nccl_share_of_step": 0.61})]
    run = _run({"nccl_share_of_step": 0.43}, ranks=ranks)
    check = _only(run, "nccl_step_share", RuleConfig(op=">", warn=0.2, fail=0.35))
    rank_rows = [row for row in check.evidence if "nccl_share_of_step" in row]
    assert [row["rank"] for row in rank_rows] == [1, 0]
    assert any("step" in row and "nccl_share" in row for row in check.evidence)


def test_gpu_models_evidence_lists_each_rank_model() -> None:
    ranks = [_rank(0), _rank(1)]
    ranks[1].gpu_models = ["NVIDIA A100-SXM4-80GB"]
    run = _run({"distinct_gpu_models": 2}, ranks=ranks)
    check = _only(run, "homogeneous_gpus", RuleConfig(op=">", fail=1))
    assert check.status == "fail"
    assert {row["rank"]: tuple(row["gpus"]) for row in check.evidence} == {
        0: ("NVIDIA H200",),
        1: ("NVIDIA A100-SXM4-80GB",),
    }


# ---------------------------------------------------------------- capture_health


def _health(*ranks: dict[str, Any]):
    run = _run({}, ranks=[_rank(i, health=h) for i, h in enumerate(ranks)])
    (check,) = [c for c in evaluate(run, _profile()) if c.id == CAPTURE_HEALTH]
    return check


def test_capture_health_passes_with_gpu_ops_ranges_and_steps() -> None:
    check = _health({}, {})
    assert check.status == "pass"
    assert check.remedy is None and check.evidence == []
    assert "2000 GPU ops" in check.message and "6 steps" in check.message


@pytest.mark.parametrize(
    ("ranks", "shown"),
    [
        (({}, {}), "0 problems found"),
        (({}, {"steps": 0}), "1 problem found"),
        (({"steps": 0}, {"steps": 0}), "2 problems found"),
    ],
)
def test_capture_health_value_is_the_problems_found_and_reads_so(ranks: tuple[dict, ...], shown: str) -> None:
    """Issue 25: its value (the number of problems) was rendered as a bare `0`."""
    from traceguard.checks.rules import format_value

    check = _health(*ranks)
    assert check.value == len(check.evidence) and check.unit == "problems"
    assert format_value(check.value, check.unit) == shown


def test_capture_health_fails_when_no_rank_has_gpu_ops_or_ranges() -> None:
    empty = {"gpu_ops": 0, "ranges": 0, "steps": 0, "default_domain_ranges": 0}
    check = _health(empty, empty)
    assert check.status == "fail"
    assert check.remedy
    assert {row["rank"] for row in check.evidence} == {0, 1}
    assert all(row["severity"] == "fail" for row in check.evidence)


def test_capture_health_warns_when_only_one_rank_is_empty() -> None:
    check = _health({}, {"gpu_ops": 0, "ranges": 0, "steps": 0, "default_domain_ranges": 0})
    assert check.status == "warn"
    assert [row["rank"] for row in check.evidence] == [1]


def test_capture_health_with_gpu_ops_but_no_ranges_is_usable_but_warns_no_steps() -> None:
    check = _health({"ranges": 0, "steps": 0, "default_domain_ranges": 0})
    assert check.status == "warn"
    assert any("no step ranges" in row["problem"] for row in check.evidence)


def test_capture_health_warns_when_no_steps() -> None:
    check = _health({"steps": 0}, {"steps": 0})
    assert check.status == "warn"
    assert check.remedy
    assert [row["rank"] for row in check.evidence] == [0, 1]
    assert all("step" in row["problem"] for row in check.evidence)


def test_capture_health_warns_on_nvtx_domain_without_ranges() -> None:
    """nvtx 0.2.13 under nsys 2022.4: the domain is registered, its ranges are invisible."""
    signature = {
        "ranges": 0,
        "steps": 0,
        "nvtx_domains": ["MyTraining"],
        "domains_without_ranges": ["MyTraining"],
        "default_domain_ranges": 0,
    }
    check = _health(signature)
    assert check.status == "warn"
    nvtx_rows = [row for row in check.evidence if "NVTX" in row["problem"]]
    assert len(nvtx_rows) == 1
    assert nvtx_rows[0]["domains"] == ["MyTraining"]
    assert "0.2.13" in nvtx_rows[0]["problem"]
    assert check.remedy and "0.2.11" in check.remedy


def test_capture_health_domain_warning_only_without_default_domain_ranges() -> None:
    # Ranges were recorded in the default domain: an extra empty domain is not the nvtx signature.
    check = _health({"domains_without_ranges": ["unused"], "default_domain_ranges": 10})
    assert check.status == "pass"


@pytest.mark.parametrize(
    ("health", "words"),
    [({"has_gpu_trace": False}, "no GPU activity trace"), ({"negative_durations": 3}, "end before they start")],
)
def test_capture_health_warns_on_missing_gpu_trace_and_clock_anomalies(health: dict[str, Any], words: str) -> None:
    check = _health(health)
    assert check.status == "warn"
    assert any(words in row["problem"] for row in check.evidence)


def test_capture_health_disabled_skips_with_a_reason() -> None:
    run = _run({}, ranks=[_rank(0, health={"gpu_ops": 0, "ranges": 0})])
    (check,) = evaluate(run, _profile(capture_health=RuleConfig(enabled=False)))
    assert check.status == "skip" and check.reason and "disabled" in check.reason


def test_capture_health_comes_first_even_without_a_profile_entry() -> None:
    checks = evaluate(_run({"straggler_spread": 0.0}), _profile(straggler=RuleConfig(warn=0.05, fail=0.15)))
    assert checks[0].id == CAPTURE_HEALTH
