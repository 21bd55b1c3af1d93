"""The checklist: each rule reads one run metric, compares it with the profile's bounds and
says why, with evidence rows and a remedy written for the engineer on call.

Rules know metric names and nothing of formats or SQL; bounds come only from the profile.
A metric that is ``None`` makes its rule ``skip`` with the metric's null reason — never ``pass``.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from traceguard.checks.profiles import Profile, RuleConfig
from traceguard.errors import ProfileError
from traceguard.metrics.run import RunResult

PASS, WARN, FAIL, SKIP = "pass", "warn", "fail", "skip"
_COMPARE: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt,
    ">=": operator.ge,
    "<": operator.lt,
    "<=": operator.le,
}


@dataclass
class CheckResult:
    id: str
    title: str
    status: str
    value: float | None
    warn: float | None
    fail: float | None
    op: str | None
    message: str
    reason: str | None
    evidence: list[dict[str, Any]] = field(default_factory=list)
    remedy: str | None = None
    #: How ``value`` reads: "share" (fraction), "ratio", "count" or "us".
    unit: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Rule:
    id: str
    title: str
    metric: str | None
    unit: str
    remedy: str
    evidence: Callable[[RunResult], list[dict[str, Any]]]


def _pct(value: float) -> str:
    return f"{value:.2%}"


def format_value(value: float | None, unit: str | None) -> str:
    """A check value as people read it: shares in %, ratios with ×, latencies in µs."""
    if value is None:
        return "n/a"
    if unit == "share":
        return _pct(value)
    if unit == "ratio":
        return f"{value:.3f}×"
    if unit == "count":
        return f"{value:g}"
    if unit == "us":
        return f"{value:.2f} µs"
    return f"{value:.4g}"


def _rank_evidence(
    result: RunResult, metric: str, *, limit: int = 4, extra: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    rows = [
        {"rank": r.rank, metric: r.metrics.get(metric), **{k: r.metrics.get(k) for k in extra}}
        for r in result.ranks
        if r.metrics.get(metric) is not None
    ]
    rows.sort(key=lambda row: row[metric], reverse=True)
    return rows[:limit]


def _worst_steps(result: RunResult, key: str, *, limit: int = 5) -> list[dict[str, Any]]:
    rows = [
        {
            "rank": r.rank,
            "step": s["name"],
            "index": s["index"],
            key: s.get(key),
            "gpu_span_ns": s["gpu_span_ns"],
            "nccl_ns": s["nccl_ns"],
        }
        for r in result.ranks
        for s in r.steps
        if s.get(key) is not None
    ]
    rows.sort(key=lambda row: row[key], reverse=True)
    return rows[:limit]


def _copy_evidence(result: RunResult) -> list[dict[str, Any]]:
    rows = _rank_evidence(result, "gpu_to_cpu_copy_rate", extra=("gpu_to_cpu_copies", "gpu_to_cpu_bytes", "gpu_ops"))
    for r in result.ranks:
        for offender in r.gpu_to_cpu_offenders:
            rows.append({"rank": r.rank, **offender})
    return rows


def _dtod_evidence(result: RunResult) -> list[dict[str, Any]]:
    rows = _rank_evidence(result, "dtod_to_gradient_ratio", extra=("dtod_bytes_per_step", "allreduce_bytes_per_step"))
    steps = [
        {"rank": r.rank, "step": s["name"], "dtod_copies": s["dtod_copies"], "dtod_bytes": s["dtod_bytes"]}
        for r in result.ranks
        for s in r.steps
    ]
    steps.sort(key=lambda row: row["dtod_bytes"], reverse=True)
    return rows + steps[:3]


def _nccl_evidence(result: RunResult) -> list[dict[str, Any]]:
    return _rank_evidence(
        result, "nccl_share_of_step", extra=("nccl_step_ns", "gpu_span_ns", "nccl_exposed_ns")
    ) + _worst_steps(result, "nccl_share")


def _pageable_evidence(result: RunResult) -> list[dict[str, Any]]:
    return _rank_evidence(result, "pageable_host_share", extra=("pageable_host_bytes", "host_device_bytes"))


def _gpu_evidence(result: RunResult) -> list[dict[str, Any]]:
    return [{"rank": r.rank, "gpus": r.gpu_models} for r in result.ranks if r.gpu_models]


def _straggler_evidence(result: RunResult) -> list[dict[str, Any]]:
    return [
        {
            "index": s.index,
            "slowest_rank": s.slowest_rank,
            "slowest_gpu_span_ns": s.slowest_ns,
            "median_gpu_span_ns": s.median_ns,
            "spread": s.spread,
        }
        for s in result.straggler_steps[:5]
    ]


def _link_evidence(rule_id: str) -> Callable[[RunResult], list[dict[str, Any]]]:
    def evidence(result: RunResult) -> list[dict[str, Any]]:
        return list(result.links.evidence.get(rule_id, [])) if result.links else []

    return evidence


RULES: dict[str, Rule] = {
    rule.id: rule
    for rule in (
        Rule(
            "gpu_to_cpu_copy_rate",
            "GPU→CPU copies",
            "gpu_to_cpu_copy_rate",
            "share",
            "Keep training data on the GPU: remove per-step host synchronisations (`loss.item()`, "
            "`.cpu()`, `.numpy()`, `print(tensor)`, metric logging every step — log every N steps "
            "instead) and never stage gradients through the CPU for all-reduce (`tensor.cpu()` → "
            "all_reduce → `.to(device)`); let DDP/NCCL reduce them on the GPU.",
            _copy_evidence,
        ),
        Rule(
            "dtod_copy_volume",
            "Device-to-device copy volume per step",
            "dtod_to_gradient_ratio",
            "ratio",
            "Construct DDP with `gradient_as_bucket_view=True`: gradients then live in the all-reduce "
            "buckets instead of being copied into them every step. If copies remain, look for "
            "`.clone()`/`.contiguous()` on gradients and custom comm hooks; tune `bucket_cap_mb`.",
            _dtod_evidence,
        ),
        Rule(
            "nccl_step_share",
            "NCCL share of step time",
            "nccl_share_of_step",
            "share",
            "Find out why communication dominates: check the transport in `NCCL_DEBUG=INFO` (`via P2P` "
            "expected inside a node; unset `NCCL_P2P_DISABLE`, enlarge `/dev/shm` if SHM fails); let "
            "all-reduce overlap backward (`bucket_cap_mb` 25–100); on PCIe-bound nodes register a bf16 "
            "or fp16 compression hook, on slow links PowerSGD; a larger per-GPU batch amortises the "
            "all-reduce. NCCL kernel time includes waiting for the slowest rank: compare "
            "`nccl_exposed_ns` and the straggler check.",
            _nccl_evidence,
        ),
        Rule(
            "pageable_host_copies",
            "Host↔device copies from pageable memory",
            "pageable_host_share",
            "share",
            "Pin host memory: `DataLoader(pin_memory=True)`, `tensor.pin_memory()`, and copy with "
            "`.to(device, non_blocking=True)`; pageable copies are staged through a driver buffer and "
            "block the host.",
            _pageable_evidence,
        ),
        Rule(
            "homogeneous_gpus",
            "One GPU model across ranks",
            "distinct_gpu_models",
            "count",
            "Schedule the job on one GPU model (node selector / partition): every collective runs at "
            "the pace of the slowest GPU.",
            _gpu_evidence,
        ),
        Rule(
            "straggler",
            "Straggler spread of step time",
            "straggler_spread",
            "share",
            "One rank is slower than the rest: compare its phases with the others' (data loading, CPU "
            "contention or affinity, a different GPU or NUMA placement, thermal or power throttling — "
            "`nvidia-smi -q -d CLOCK,PERFORMANCE`), and its NCCL transport.",
            _straggler_evidence,
        ),
        Rule(
            "transport_p2p",
            "NCCL transport inside a node",
            "transport_fallback_pairs",
            "count",
            "GPUs of one node talk through shared memory or the network instead of P2P (NVLink/PCIe): "
            "unset `NCCL_P2P_DISABLE` / `NCCL_P2P_LEVEL` (and `NCCL_SHM_DISABLE`), check that the "
            "container sees every GPU of the node (`CUDA_VISIBLE_DEVICES`, `--ipc=host`, IOMMU/ACS "
            "settings that block peer access), and enlarge `/dev/shm` (`--shm-size`) if SHM set-up fails.",
            _link_evidence("transport_p2p"),
        ),
        Rule(
            "pcie_saturation",
            "PCIe link saturation",
            "pcie_saturation",
            "share",
            "A GPU's PCIe link runs near its rated speed: communication or host copies are PCIe-bound. "
            "Keep gradients on NVLink (P2P), compress them (bf16/fp16 hook, PowerSGD), pin host memory "
            "and cut host↔device traffic (data on the GPU, no per-step `.cpu()`).",
            _link_evidence("pcie_saturation"),
        ),
        Rule(
            "p2p_utilization",
            "Collective bus bandwidth vs expected peak",
            "p2p_utilization",
            "share",
            "Large all-reduces run below the links' expected bandwidth: compare the NCCL transport "
            "(`NCCL_DEBUG=INFO`), the algorithm/protocol (`NCCL_ALGO`, `NCCL_PROTO` left unset), channel "
            "count (`NCCL_MIN_NCHANNELS`), GPU clocks and link errors (`nvidia-smi nvlink -e`).",
            _link_evidence("p2p_utilization"),
        ),
        Rule(
            "allreduce_latency",
            "Small-message all-reduce latency",
            "allreduce_small_latency_us",
            "us",
            "Small all-reduces are slow: launch overhead or a slow transport. Capture the step in a CUDA "
            "graph, let NCCL pick LL/LL128 (`NCCL_PROTO` unset), check the transport, and fuse small "
            "tensors into larger buckets.",
            _link_evidence("allreduce_latency"),
        ),
    )
}
CAPTURE_HEALTH = "capture_health"
KNOWN_RULES = frozenset({CAPTURE_HEALTH, *RULES})


def validate_profile(profile: Profile) -> None:
    """Reject rule ids no rule has: a typo must not silently turn a check off."""
    unknown = sorted(set(profile.rules) - KNOWN_RULES)
    if unknown:
        raise ProfileError(
            f"profile {profile.name!r} configures unknown rule(s) {', '.join(unknown)}",
            hint=f"known rules: {', '.join(sorted(KNOWN_RULES))}",
        )


CAPTURE_HEALTH_REMEDY = (
    "Capture GPU activity and step ranges: `nsys profile --trace=cuda,nvtx ...` (or torch.profiler with "
    "CUDA activity), and wrap every training step in an NVTX range named like `Batch N` (or call "
    "`prof.step()` with torch.profiler) with phases nested inside. With nsys 2022.4 use the Python "
    "`nvtx` package 0.2.11 or older (0.2.13+ ranges are invisible to it), or `torch.cuda.nvtx`."
)


def evaluate(result: RunResult, profile: Profile) -> list[CheckResult]:
    """Run every rule the profile knows, in a stable order: capture health first."""
    checks = [capture_health(result, profile.rule(CAPTURE_HEALTH) or RuleConfig())]
    for rule_id, rule in RULES.items():
        config = profile.rule(rule_id)
        if config is None:
            continue
        checks.append(_threshold_check(rule, config, result))
    return checks


def _threshold_check(rule: Rule, config: RuleConfig, result: RunResult) -> CheckResult:
    value = result.metrics.get(rule.metric) if rule.metric else None
    base = dict(
        id=rule.id, title=rule.title, value=value, warn=config.warn, fail=config.fail, op=config.op, unit=rule.unit
    )
    if not config.enabled:
        return CheckResult(**base, status=SKIP, message="disabled by the profile", reason="disabled by the profile")
    if value is None:
        reason = result.null_reasons.get(rule.metric or "", "not available from these inputs")
        return CheckResult(**base, status=SKIP, message=f"{rule.title}: not available", reason=reason)
    crosses = _COMPARE[config.op]
    if config.fail is not None and crosses(value, config.fail):
        status, bound = FAIL, config.fail
    elif config.warn is not None and crosses(value, config.warn):
        status, bound = WARN, config.warn
    else:
        status, bound = PASS, None
    shown = format_value(value, rule.unit)
    if status == PASS:
        limits = " / ".join(
            f"{k} {config.op} {format_value(v, rule.unit)}"
            for k, v in (("warn", config.warn), ("fail", config.fail))
            if v is not None
        )
        message = f"{rule.title}: {shown} (within bounds: {limits})"
    else:
        message = f"{rule.title}: {shown} {config.op} {status} bound {format_value(bound, rule.unit)}"
    evidence = rule.evidence(result) if status != PASS else []
    return CheckResult(
        **base,
        status=status,
        message=message,
        reason=None,
        evidence=evidence,
        remedy=rule.remedy if status != PASS else None,
    )


def capture_health(result: RunResult, config: RuleConfig) -> CheckResult:
    """Fail: nothing usable. Warn: no steps, NVTX domains without ranges, clock anomalies."""
    base = dict(id=CAPTURE_HEALTH, title="Capture health", warn=None, fail=None, op=None, unit="count")
    if not config.enabled:
        return CheckResult(
            **base,
            value=None,
            status=SKIP,
            message="disabled by the profile",
            reason="disabled by the profile",
        )
    if not result.ranks:
        reason = "no capture given: only side inputs were analysed"
        return CheckResult(**base, value=None, status=SKIP, message=reason, reason=reason)
    problems: list[dict[str, Any]] = []
    usable = 0
    for r in result.ranks:
        h = r.health
        if h["gpu_ops"] == 0 and h["ranges"] == 0:
            problems.append({"rank": r.rank, "severity": FAIL, "problem": "no GPU activity and no ranges"})
            continue
        usable += 1
        if h["steps"] == 0:
            problems.append(
                {"rank": r.rank, "severity": WARN, "problem": "no step ranges found", "ranges": h["ranges"]}
            )
        if h["domains_without_ranges"] and h["default_domain_ranges"] == 0:
            problems.append(
                {
                    "rank": r.rank,
                    "severity": WARN,
                    "problem": "NVTX domains were created but no ranges were recorded (an NVTX library "
                    "the profiler cannot read: Python nvtx >= 0.2.13 under nsys 2022.4)",
                    "domains": h["domains_without_ranges"],
                }
            )
        if not h["has_gpu_trace"] and config.params.get("expect_gpu", 1.0):
            problems.append({"rank": r.rank, "severity": WARN, "problem": "no GPU activity trace"})
        if h["negative_durations"]:
            problems.append(
                {
                    "rank": r.rank,
                    "severity": WARN,
                    "problem": "events end before they start",
                    "events": h["negative_durations"],
                }
            )
    status = FAIL if usable == 0 else WARN if problems else PASS
    counts = {k: sum(r.health[k] for r in result.ranks) for k in ("gpu_ops", "ranges", "steps")}
    if status == PASS:
        message = (
            f"{len(result.ranks)} rank(s): {counts['gpu_ops']} GPU ops, {counts['ranges']} ranges, "
            f"{counts['steps']} steps"
        )
    else:
        message = "; ".join(f"rank {p['rank']}: {p['problem']}" for p in problems[:4])
    return CheckResult(
        **base,
        value=float(len(problems)),
        status=status,
        message=message,
        reason=None,
        evidence=problems,
        remedy=CAPTURE_HEALTH_REMEDY if status != PASS else None,
    )


def verdict(checks: list[CheckResult]) -> str:
    statuses = {c.status for c in checks}
    return FAIL if FAIL in statuses else WARN if WARN in statuses else PASS
