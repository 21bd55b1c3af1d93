"""The one path from capture files to a report, shared by the CLI and the service.

map per input file (ingest + per-rank metrics, on a scheduler: traceguard.mapreduce) → reduce per
run (run metrics; links from side inputs) → checks (profile) → report document. Progress goes
through optional callbacks.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import polars as pl

from traceguard.checks.profiles import DEFAULT_PROFILE, Profile, load_profile
from traceguard.checks.rules import CheckResult, evaluate, validate_profile
from traceguard.errors import InputError, NoUsableInputError
from traceguard.ingest import InputRecord, InputSpec, bundle_captures, no_input_reasons, parse_spec
from traceguard.ingest.sides import SideData, SideFiles, discover, load_side, split_inputs
from traceguard.mapreduce import MapOptions, RankProgress, map_run
from traceguard.memory import fewer_collections
from traceguard.metrics.inspector import WINDOW_S, analyse_inspector
from traceguard.metrics.link_counters import capture_link_rows, capture_null_reason
from traceguard.metrics.links import analyse_links
from traceguard.metrics.run import RunResult, reduce_results
from traceguard.report import document
from traceguard.report.detail import Detail, DetailWriter
from traceguard.report.summary import summary_wanted

Progress = Callable[[str], None]


@dataclass
class Analysis:
    #: The inputs as the report lists them (format, resolved ranks, errors, warnings).
    inputs: list[InputRecord]
    result: RunResult
    side: SideData
    checks: list[CheckResult]
    profile: Profile
    report: dict[str, Any]
    #: Per rank: the whole capture's memcpys and memsets by kind and direction
    #: (:func:`traceguard.mapreduce.copy_summary`); empty when no capture was read.
    copies: pl.DataFrame
    #: The report's side output (traceguard.report.detail): every rank's and step's rows as Parquet,
    #: when one was written (a report by summary, or ``detail_dir`` given); None otherwise.
    detail_folder: Path | None = None


def _param(profile: Profile, rule: str, name: str) -> float | None:
    config = profile.rule(rule)
    return config.params.get(name) if config else None


@fewer_collections()
def analyze(
    inputs: Iterable[str | InputSpec],
    *,
    profile: str | Profile = DEFAULT_PROFILE,
    side_files: SideFiles | None = None,
    step_patterns: Sequence[str] | None = None,
    step_sources: Sequence[str] | None = None,
    progress: Progress | None = None,
    scheduler: str | None = None,
    jobs: int | None = None,
    on_ranks: RankProgress | None = None,
    sliced_above: int | None = None,
    detail: str = "auto",
    detail_dir: Path | None = None,
    detail_default_dir: Path | None = None,
) -> Analysis:
    """Analyse one run's captures and side inputs under a profile.

    ``step_patterns`` are the user's step-range regexes (``--step-pattern``); they are tried
    before the profile's own ``step_patterns`` (DESIGN.md, "Steps": source ``pattern``).
    ``step_sources`` limits and orders the step sources tried (default: pattern, convention,
    inferred, window), e.g. ``["inferred"]`` to see the steps a capture's own structure gives.

    The inputs are mapped one task per file on ``scheduler`` (``local``: ``jobs`` processes, by
    default one per core; ``serial``; or a Dask address; default ``TRACEGUARD_DASK_SCHEDULER``
    else ``local``) and ``on_ranks(done, total)`` is called as each finishes; the report is the
    same whichever runs it (traceguard.mapreduce). nsys exports of at least ``sliced_above``
    bytes (default: traceguard.mapreduce.sliced_above) are analysed in time slices, with memory
    bounded by a slice; the report is the same (traceguard.metrics.sliced).

    ``detail`` (``full``, ``summary`` or ``auto``: summary above
    :data:`traceguard.report.summary.SUMMARY_ABOVE_INPUTS` capture files) says whether the report
    holds every rank and step or a summary with the worst ranks; a summary's rows go to a Parquet
    side output in ``detail_dir`` (which must be new or empty), else ``detail_default_dir`` (a
    previous side output there is replaced), else a new temporary folder; it is written as each
    rank's map arrives, and the reduce keeps only what it needs of each rank
    (traceguard.report.detail). With ``detail_dir`` a full report gets the side output too.

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
    found_in: dict[Path, SideFiles] = {}
    for item in inputs:
        path = item.path if isinstance(item, InputSpec) else Path(item)
        if path.is_dir():
            found_in[path] = discover(path)
            files.extend(found_in[path])
    side = load_side(files) if files.any() else SideData()
    inspected = side.inspector is not None and (side.inspector.ops.height > 0 or side.inspector.prom.height > 0)
    has_side = side.nccl is not None or side.dmon is not None or side.nccl_tests is not None or inspected
    patterns = (*(step_patterns or []), *chosen.step_patterns)
    small_bytes = _param(chosen, "small_collectives", "small_bytes")
    options = MapOptions(
        step_patterns=tuple(patterns),
        step_sources=tuple(step_sources) if step_sources else None,
        small_bytes=int(small_bytes) if small_bytes else None,
        sliced_above=sliced_above,
    )
    specs = _captures(inputs, found_in)
    if not specs and not has_side:
        why = "; ".join(side.errors) or "give capture files, a run directory, or side inputs"
        raise NoUsableInputError(f"no usable input: {why}")
    say(f"analysing {len(specs)} input(s)")
    by_summary = summary_wanted(detail, len(specs))
    writer: DetailWriter | None = None
    if detail_dir is not None:
        writer = DetailWriter(Path(detail_dir), lighten_results=by_summary)
    elif by_summary and detail_default_dir is not None:
        writer = DetailWriter(Path(detail_default_dir), lighten_results=True, replace_previous=True)
    elif by_summary:
        writer = DetailWriter(Path(tempfile.mkdtemp(prefix="traceguard-detail-")), lighten_results=True)
    try:
        mapped = map_run(
            specs, options, scheduler=scheduler, jobs=jobs, on_ranks=on_ranks, keep=writer.take if writer else None
        )
        if specs and not mapped.results and not has_side:
            raise NoUsableInputError(f"no usable input: {no_input_reasons(mapped.inputs)}")
    except BaseException:
        if writer is not None:  # no report: no side output left behind either
            writer.discard()
        raise
    result = reduce_results(mapped.results)
    links = analyse_links(
        side,
        peak_busbw_gbps=_param(chosen, "p2p_utilization", "peak_busbw_gbps"),
        rated_pcie_gbps=_param(chosen, "pcie_saturation", "rated_pcie_gbps"),
        capture=capture_link_rows(result.ranks),
        capture_reason=capture_null_reason(result.ranks),
        capture_pcie_share=_param(chosen, "transport_p2p", "capture_pcie_share"),
        capture_nvlink_share=_param(chosen, "transport_p2p", "capture_nvlink_share"),
    )
    result.links = links
    result.metrics.update(links.metrics)
    result.null_reasons.update(links.null_reasons)
    if side.inspector is not None:
        say("matching NCCL Inspector lines across ranks")
        nccl_peak = min(side.nccl.max_bw_by_rank.values()) if side.nccl and side.nccl.max_bw_by_rank else None
        peak = nccl_peak or _param(chosen, "p2p_utilization", "peak_busbw_gbps")
        window = _param(chosen, "collective_wait", "inspector_window_s")
        result.inspector = analyse_inspector(
            side.inspector, peak_busbw_gbps=peak, window_s=int(window) if window else WINDOW_S
        )
        merge_inspector(result, peak_from="NCCL GRAPH maxBw" if nccl_peak else "profile peak_busbw_gbps")
    say("checking")
    checks = evaluate(result, chosen)
    shape = Detail()
    if writer is not None:
        say("writing the side output")
        input_of = {rank: index for index, record in enumerate(mapped.inputs) for rank in record.ranks}
        paths = {rank: record.path for record in mapped.inputs for rank in record.ranks}
        tables = writer.finish(result.ranks, input_of, paths, mapped.used)
        shape = Detail("summary" if by_summary else "full", writer.folder, tables)
    report = document.build(mapped.inputs, result, checks, chosen, side=side, detail=shape)
    return Analysis(
        mapped.inputs, result, side, checks, chosen, report, mapped.copies, writer.folder if writer else None
    )


def _captures(inputs: Iterable[str | InputSpec], found_in: dict[Path, SideFiles]) -> list[InputSpec]:
    """The capture inputs: files as given, directories by their captures. A directory that holds
    no capture but side inputs (NCCL Inspector logs on their own, say) gives no capture input."""
    specs: list[InputSpec] = []
    for item in inputs:
        spec = item if isinstance(item, InputSpec) else parse_spec(item)
        if not spec.path.is_dir():
            specs.append(spec)
            continue
        try:
            specs.extend(bundle_captures(spec.path))
        except InputError:
            if spec.path in found_in and found_in[spec.path].any():
                continue
            raise
    return specs


#: Run metrics the Inspector fills when the captures leave them null (the who-waits contract).
INSPECTOR_FILLS = (
    "nccl_wait_ns",
    "nccl_transfer_ns",
    "nccl_wait_share",
    "late_rank",
    "collective_instances_matched",
    "collective_instances_unmatched",
    "matched_steps",
    "exposed_wait_share",
)
#: Link metrics it fills when no collective benchmark gives them (production traffic instead).
INSPECTOR_LINK_FILLS = ("p2p_utilization", "allreduce_largest_bytes", "allreduce_peak_busbw_gbps")


def merge_inspector(result: RunResult, *, peak_from: str) -> None:
    """The Inspector's run metrics into the run's, where the captures (or the benchmark) left them
    null: the captures' own split wins, since it is per step and knows the exposed time.
    ``metrics.wait_source`` / ``utilization_source`` say which source each comes from."""
    inspector = result.inspector
    m, null = result.metrics, result.null_reasons
    took = False
    if m.get("nccl_wait_share") is None and inspector.metrics.get("nccl_wait_share") is not None:
        # Key by key: what the captures did say (a CPU capture's late rank, say) stays theirs.
        for key in INSPECTOR_FILLS:
            if m.get(key) is not None:
                continue
            m[key] = inspector.metrics.get(key)
            if m[key] is None:
                null[key] = inspector.null_reasons.get(key, "not available from the NCCL Inspector logs")
            else:
                null.pop(key, None)
        took = True
    m["wait_source"] = "nccl_inspector" if took else "captures" if m.get("nccl_wait_share") is not None else None
    if m.get("p2p_utilization") is None and inspector.metrics.get("allreduce_peak_busbw_gbps") is not None:
        for key in INSPECTOR_LINK_FILLS:
            m[key] = inspector.metrics.get(key)
            if m[key] is None:
                null[key] = inspector.null_reasons.get(key, "not available from the NCCL Inspector logs")
            else:
                null.pop(key, None)
        m["utilization_source"] = "nccl_inspector"
        evidence = inspector.metrics.get("utilization_evidence")
        if evidence and result.links is not None:
            result.links.evidence["p2p_utilization"] = [{**evidence, "expected_from": peak_from}]
