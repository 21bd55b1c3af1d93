"""The one path from capture files to a report, shared by the CLI and the service.

ingest (read + resolve ranks; side inputs) → metrics (map per rank, reduce per run; links) →
checks (profile) → report document. Progress goes through an optional callback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceguard.checks.profiles import DEFAULT_PROFILE, Profile, load_profile
from traceguard.checks.rules import CheckResult, evaluate, validate_profile
from traceguard.errors import NoUsableInputError
from traceguard.ingest import InputSpec, LoadedRun, load_run
from traceguard.ingest.sides import SideData, SideFiles, discover, load_side, split_inputs
from traceguard.metrics.links import analyse_links
from traceguard.metrics.run import RunResult, analyse_run
from traceguard.report import document

Progress = Callable[[str], None]


@dataclass
class Analysis:
    loaded: LoadedRun
    result: RunResult
    side: SideData
    checks: list[CheckResult]
    profile: Profile
    report: dict[str, Any]


def _param(profile: Profile, rule: str, name: str) -> float | None:
    config = profile.rule(rule)
    return config.params.get(name) if config else None


def analyze(
    inputs: Iterable[str | InputSpec],
    *,
    profile: str | Profile = DEFAULT_PROFILE,
    side_files: SideFiles | None = None,
    step_patterns: Sequence[str] | None = None,
    step_sources: Sequence[str] | None = None,
    progress: Progress | None = None,
) -> Analysis:
    """Analyse one run's captures and side inputs under a profile.

    ``step_patterns`` are the user's step-range regexes (``--step-pattern``); they are tried
    before the profile's own ``step_patterns`` (DESIGN.md, "Steps": source ``pattern``).
    ``step_sources`` limits and orders the step sources tried (default: pattern, convention,
    inferred, window), e.g. ``["inferred"]`` to see the steps a capture's own structure gives.

    Raises NoUsableInputError when neither a capture nor a side input can be read.
    """
    chosen = profile if isinstance(profile, Profile) else load_profile(profile)
    validate_profile(chosen)
    say = progress or (lambda _msg: None)
    # Side files given among the captures (an NCCL log, nvidia-smi output) are recognised by content.
    inputs, positional_sides = split_inputs(inputs)
    files = SideFiles()
    if side_files:
        files.extend(side_files)
    files.extend(positional_sides)
    for item in inputs:
        path = item.path if isinstance(item, InputSpec) else Path(item)
        if path.is_dir():
            files.extend(discover(path))
    side = load_side(files) if files.any() else SideData()
    has_side = side.nccl is not None or side.dmon is not None or side.nccl_tests is not None
    if inputs:
        try:
            loaded = load_run(inputs, on_input=lambda spec: say(f"reading {spec.path.name}"))
        except NoUsableInputError:
            if not has_side:
                raise
            loaded = LoadedRun(inputs=[], ranks=[])
    elif has_side:
        loaded = LoadedRun(inputs=[], ranks=[])
    else:
        raise NoUsableInputError("no usable input: give capture files, a run directory, or side inputs")
    say(f"analysing {len(loaded.ranks)} rank(s)")
    patterns = [*(step_patterns or []), *chosen.step_patterns]
    result = analyse_run(
        [(r.rank, r.capture) for r in loaded.ranks],
        step_patterns=patterns,
        step_sources=step_sources,
        small_bytes=_param(chosen, "small_collectives", "small_bytes"),
    )
    links = analyse_links(
        side,
        peak_busbw_gbps=_param(chosen, "p2p_utilization", "peak_busbw_gbps"),
        rated_pcie_gbps=_param(chosen, "pcie_saturation", "rated_pcie_gbps"),
    )
    result.links = links
    result.metrics.update(links.metrics)
    result.null_reasons.update(links.null_reasons)
    say("checking")
    checks = evaluate(result, chosen)
    report = document.build(loaded.inputs, result, checks, chosen, side=side)
    return Analysis(loaded, result, side, checks, chosen, report)
