"""Request and response models, one family per resource (``RunCreate``, ``RunPublic``, ...)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field


class ErrorBody(BaseModel):
    code: str
    message: str
    hint: str | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class RunCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("", max_length=200)
    labels: dict[str, str] = Field(default_factory=dict, description="e.g. git_sha, branch, cluster, model")
    profile: str = Field("production", description="the checklist profile the run's jobs use")
    step_patterns: list[Annotated[str, Field(max_length=500)]] = Field(
        default_factory=list,
        max_length=20,
        description="regular expressions naming the run's step ranges, tried before the profile's and the "
        "known training-loop markers (DESIGN.md 'Steps')",
    )


class JobError(BaseModel):
    code: str
    message: str


class JobPublic(BaseModel):
    id: int
    run_id: int
    status: str = Field(description="queued, running, succeeded or failed")
    profile: str
    attempts: int
    ranks_done: int | None = Field(
        description="captures (ranks' inputs) of the current attempt whose per-rank analysis has finished; "
        "null before the attempt starts"
    )
    ranks_total: int | None = Field(description="captures in the analysis; null before the attempt starts")
    error: JobError | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    url: str


class FilePublic(BaseModel):
    id: int
    name: str
    kind: str
    compressed: bool
    size: int
    sha256: str
    rank: int | None = Field(description="as given at upload or by a bundle's manifest")
    rank_source: str | None
    resolved_rank: int | None = Field(description="as the latest analysis resolved it")
    archive: str | None
    created_at: datetime


class RunPublic(BaseModel):
    id: int
    name: str
    profile: str
    step_patterns: list[str] = Field(description="the user's step regexes, tried before the profile's")
    status: str = Field(description="created, queued, running, analysed or failed")
    verdict: str | None = Field(description="pass, warn or fail of the latest successful analysis")
    labels: dict[str, str]
    created_at: datetime
    updated_at: datetime
    url: str


class RunDetail(RunPublic):
    files: list[FilePublic]
    jobs: list[JobPublic]


class RunList(BaseModel):
    runs: list[RunPublic]
    next_cursor: str | None


class Skipped(BaseModel):
    name: str
    reason: str


class UploadResult(BaseModel):
    files: list[FilePublic]
    duplicates: list[int] = Field(description="ids of files that were already in the run (same bytes)")
    skipped: list[Skipped]
    job: JobPublic | None


class PhaseRow(BaseModel):
    phase: str
    cpu_ns: int | None
    gpu_ns: int | None
    nccl_ns: int | None
    nccl_share: float | None


class CollectiveTypeRow(BaseModel):
    """Collectives of one type (DESIGN.md "Collectives by type"): ``step_index`` null for the
    rank's totals over the analysis window."""

    rank: int
    step_index: int | None
    collective: str
    count: int
    time_ns: int = Field(description="union of the type's kernel intervals per device, summed over devices")
    exposed_ns: int = Field(description="the part of time_ns no compute kernel covers on the same device")
    bytes: int | None = Field(description="Σ message sizes when every kernel has one, else null")
    issued_as: dict[str, int] | None = Field(
        default=None, description="totals: kernels per framework operation that issued them (e.g. all_to_all)"
    )


class PeerRow(BaseModel):
    """One cell of the point-to-point rank × peer matrix."""

    rank: int
    peer: int
    kernels: int
    time_ns: int
    sends: int | None
    recvs: int | None
    bytes: int | None
    source: str = Field(description="what named the peer: nccl_payload, kineto_args or two_rank_group")


_NO_SPLIT = " Null when the step holds no matched collective or the run's split is not available."
_PART = " One part of the step's period; null when the step has no GPU span."


_LINK = (
    " nsys GPU metrics: per sample the busier direction, max(RX, TX), % of the link's peak (0–100); null without GPU "
    "metrics of the rank's GPU."
)


class StepRow(BaseModel):
    """One step of one rank: the CPU range, GPU span and NCCL time; the NCCL time of its matched
    collectives split into waiting for the last rank and transfer; its GPU time broken down over
    its period (docs/collectives.md, docs/report.schema.json ``ranks[].steps[]``). Times in ns."""

    rank: int
    step_index: int
    name: str
    cpu_ns: int | None
    gpu_span_ns: int | None
    nccl_ns: int | None
    nccl_share: float | None
    dtod_bytes: int | None
    dtod_copies: int | None
    peer_bytes: int | None
    peer_copies: int | None
    nccl_wait_ns: int | None = Field(
        default=None,
        description="NCCL kernel time of the step's matched collectives spent waiting for the last member rank."
        + _NO_SPLIT,
    )
    nccl_transfer_ns: int | None = Field(
        default=None,
        description="NCCL kernel time of the step's matched collectives after the last rank arrived." + _NO_SPLIT,
    )
    period_ns: int | None = Field(
        default=None,
        description="From the previous step's GPU end to this step's; compute + comm + copy + idle_host + idle_other "
        "= period × the rank's devices.",
    )
    compute_ns: int | None = Field(default=None, description="A compute (non-NCCL) kernel runs." + _PART)
    comm_ns: int | None = Field(
        default=None, description="Exposed communication: NCCL runs, no compute kernel." + _PART
    )
    comm_wait_ns: int | None = Field(
        default=None, description="The part of comm_ns before the last rank arrived (exposed waiting)." + _NO_SPLIT
    )
    comm_transfer_ns: int | None = Field(
        default=None, description="The part of comm_ns after the last rank arrived (exposed transfer)." + _NO_SPLIT
    )
    copy_ns: int | None = Field(default=None, description="Only a memcpy or memset runs." + _PART)
    idle_host_ns: int | None = Field(
        default=None, description="GPU idle waiting for its host (the next op was launched after it fell idle)." + _PART
    )
    idle_other_ns: int | None = Field(
        default=None, description="GPU idle with the next op already launched (an event, another stream)." + _PART
    )
    lateness_ns: float | None = Field(
        default=None,
        description="The rank's median arrival − the earliest member's at the step's matched collectives (0: first)."
        + _NO_SPLIT,
    )
    pcie_avg_pct: float | None = Field(default=None, description="Mean PCIe load over the step's GPU span." + _LINK)
    pcie_peak_pct: float | None = Field(default=None, description="Highest PCIe load over the step's GPU span." + _LINK)
    nvlink_avg_pct: float | None = Field(default=None, description="Mean NVLink load over the step's GPU span." + _LINK)
    nvlink_peak_pct: float | None = Field(
        default=None, description="Highest NVLink load over the step's GPU span." + _LINK
    )
    nccl_pcie_avg_pct: float | None = Field(
        default=None, description="Mean PCIe load over the step's NCCL kernels." + _LINK
    )
    nccl_nvlink_avg_pct: float | None = Field(
        default=None, description="Mean NVLink load over the step's NCCL kernels." + _LINK
    )
    phases: list[PhaseRow]
    collectives: list[CollectiveTypeRow] = Field(default_factory=list, description="collectives by type in this step")


class StepList(BaseModel):
    run_id: int
    steps: list[StepRow]


class PhaseHit(PhaseRow):
    run_id: int
    run_name: str
    labels: dict[str, str]
    rank: int
    step_index: int


class PhaseList(BaseModel):
    phases: list[PhaseHit]


class MetricDelta(BaseModel):
    metric: str
    base: Any
    head: Any
    delta: float | None
    relative: float | None
    delta_pp: float | None = Field(default=None, description="head − base in percentage points (shares only)")


class CheckChange(BaseModel):
    id: str
    base: str | None
    head: str | None
    regression: bool = Field(default=False, description="the base passed, the head warns or fails")


class Comparison(BaseModel):
    base: int
    head: int
    profile: str
    base_verdict: str
    head_verdict: str
    metrics: list[MetricDelta]
    changed_checks: list[CheckChange]
    regressions: list[str] = Field(default_factory=list, description="checks the base passed and the head does not")
    fail_regressions: list[str] = Field(default_factory=list, description="regressions the head fails")
    steps: list[dict[str, Any]] = Field(
        default_factory=list, description="per (rank, step index): <field>_base/_head/_delta (report/compare.py)"
    )
    collectives: list[dict[str, Any]] = Field(
        default_factory=list, description="per collective type: count, time_ns, exposed_ns, bytes base/head/delta"
    )


class ProfilePublic(BaseModel):
    name: str
    description: str | None
    chain: list[str]
    rules: dict[str, dict[str, Any]]


class TokenCreate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("", max_length=200)
    scopes: list[str] = Field(description="subset of read, upload, admin")


class TokenPublic(BaseModel):
    id: int
    name: str
    prefix: str
    scopes: list[str]
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None


class TokenCreated(TokenPublic):
    token: str = Field(description="the secret; shown only in this response")


class CollectiveRow(BaseModel):
    rank: int
    collective: str
    msg_bytes: int | None
    group_size: int | None
    count: int
    total_ns: int | None
    median_ns: float | None
    p95_ns: float | None
    min_ns: int | None
    algbw_gbps: float | None
    busbw_gbps: float | None
    transfer_median_ns: float | None = Field(
        default=None, description="median transfer time (after the last rank arrived) of the matched calls"
    )
    matched: int | None = Field(default=None, description="calls of the row matched across their ranks")
    bandwidth_time: str | None = Field(
        default=None,
        description="what algbw/busbw divide by: transfer (every call matched) or kernel (a lower bound: it includes "
        "waiting for the last rank)",
    )


class RankWaitRow(BaseModel):
    """One rank's part in who waited for whom (docs/collectives.md): its matched NCCL kernel time split
    into waiting for the last rank and transfer, how often it arrived last and how late, its clock."""

    rank: int
    nccl_wait_ns: int | None
    nccl_transfer_ns: int | None
    nccl_wait_share: float | None = Field(description="wait ÷ (wait + transfer)")
    last_arrivals: int | None = Field(description="matched collectives this rank arrived last at")
    last_arrivals_of: int | None = Field(description="matched collectives this rank is a member of")
    median_late_ns: float | None = Field(description="median lateness when it arrived last (its arrival − the first)")
    is_late_rank: bool | None = Field(description="whether it is the run's late rank; null when the run has none")
    clock_offset_ns: int | None = Field(description="offset lining its collective ends up with the reference rank's")
    clock_residual_ns: int | None = Field(description="median disagreement of its collective ends after alignment")
    null_reason: str | None = Field(description="why the split is null for this rank")


_NCCL_SAMPLES = " Of the samples during its NCCL kernels; null without GPU metrics of the rank's GPU."


class RankLinkRow(BaseModel):
    """One rank's link counters during its NCCL kernels (nsys GPU metrics; docs/report.schema.json
    ``ranks[].metrics`` and ``ranks[].links``): PCIe and NVLink load as fractions of the link's peak
    (per sample the busier direction), and where NCCL's bytes went."""

    rank: int
    link_device: int | None = Field(description="the CUDA device sampled")
    link_nccl_samples: int | None = Field(description="GPU metrics samples that lie in the rank's NCCL kernels")
    pcie_nccl_avg: float | None = Field(description="mean PCIe load (fraction of peak)." + _NCCL_SAMPLES)
    pcie_nccl_p95: float | None = Field(description="95th percentile of the PCIe load." + _NCCL_SAMPLES)
    pcie_nccl_peak: float | None = Field(description="highest PCIe load." + _NCCL_SAMPLES)
    nvlink_nccl_avg: float | None = Field(description="mean NVLink load (fraction of peak)." + _NCCL_SAMPLES)
    nvlink_nccl_p95: float | None = Field(description="95th percentile of the NVLink load." + _NCCL_SAMPLES)
    nvlink_nccl_peak: float | None = Field(description="highest NVLink load." + _NCCL_SAMPLES)
    nccl_nvlink_share: float | None = Field(description="share with NVLink busy (≥ 5 % of peak)." + _NCCL_SAMPLES)
    nccl_pcie_share: float | None = Field(description="share with PCIe busy, NVLink not." + _NCCL_SAMPLES)
    nccl_link_idle_share: float | None = Field(description="share with neither link busy." + _NCCL_SAMPLES)
    link_nccl_ns: int | None = Field(description="the NCCL kernels' time (the union of their intervals), ns")
    nccl_nvlink_ns: int | None = Field(description="nccl_nvlink_share × link_nccl_ns")
    nccl_pcie_ns: int | None = Field(description="nccl_pcie_share × link_nccl_ns")
    nccl_link_idle_ns: int | None = Field(description="nccl_link_idle_share × link_nccl_ns")
    null_reason: str | None = Field(description="why the rank has no link figures")


class StepLinkRow(BaseModel):
    """One step's link figures (the step rows' link fields; % of the link's peak, 0–100)."""

    rank: int
    step_index: int
    name: str
    pcie_avg_pct: float | None
    pcie_peak_pct: float | None
    nvlink_avg_pct: float | None
    nvlink_peak_pct: float | None
    nccl_pcie_avg_pct: float | None
    nccl_nvlink_avg_pct: float | None


class ConnectionRow(BaseModel):
    comm: str | None
    rank: int
    peer: int
    channel: int | None
    direction: str | None
    transport: str
    detail: str | None


class LinkTables(BaseModel):
    run_id: int
    collectives: list[CollectiveRow]
    connections: list[ConnectionRow]
    collectives_by_type: list[CollectiveTypeRow] = Field(
        default_factory=list, description="per rank and collective type, totals over the analysis window"
    )
    peers: list[PeerRow] = Field(default_factory=list, description="the point-to-point rank × peer matrix")
    transport_matrix: dict[str, dict[str, str]] = Field(
        description="rank → peer → transport classes NCCL logged for the pair (e.g. P2P, SHM, P2P+NET)"
    )
    waits: list[RankWaitRow] = Field(
        default_factory=list, description="per rank: NCCL time waiting for the last rank vs transfer, last arrivals"
    )
    late_rank: int | None = Field(default=None, description="the rank the others waited for most often; null if none")
    link_counters: list[RankLinkRow] = Field(
        default_factory=list,
        description="per rank: PCIe and NVLink load during its NCCL kernels and where NCCL's bytes went (nsys GPU "
        "metrics)",
    )
    link_steps: list[StepLinkRow] = Field(
        default_factory=list, description="per rank and step: PCIe and NVLink load over the step and its NCCL kernels"
    )
    from_rank: int | None = Field(
        default=None, description="the first rank of this page of ranks (null when one rank was asked for)"
    )
    next_from_rank: int | None = Field(
        default=None, description="where the next page of ranks starts; null on the last page or for one rank"
    )


class InspectorWindowRow(BaseModel):
    """One stored time window of the run's NCCL Inspector logs (docs/inspector.md): the collectives
    matched on all their ranks whose time falls in it, across ranks."""

    window_start_s: int = Field(description="the window's start, s since the epoch (UTC)")
    window_s: int = Field(description="the window's length, s (the profile's inspector_window_s)")
    instances: int = Field(description="collective instances matched on all their ranks")
    lines: int | None = Field(
        description="the Inspector lines of those instances (what a later upload must exceed to replace the window); "
        "null on rows stored before it was kept"
    )
    wait_ns: int = Field(description="Σ over the members of each instance: its execution time − the transfer")
    transfer_ns: int = Field(description="Σ over the members: the instance's transfer (its shortest execution time)")
    nccl_wait_share: float | None = Field(description="wait ÷ (wait + transfer)")
    late_rank: int | None = Field(description="the rank last to arrive most often in the window; null if none was")
    last_arrivals: int = Field(description="instances with a last rank (the others' members arrived together)")
    bytes: int | None = Field(description="Σ message bytes over the members")
    busbw_transfer_median_gbps: float | None = Field(description="median bus bandwidth on transfer time, GB/s")


class InspectorRankRow(BaseModel):
    """One rank's part of the Inspector's split over the latest analysis."""

    rank: int
    host: str | None
    pid: int | None
    collective_instances_matched: int
    nccl_wait_ns: int
    nccl_transfer_ns: int
    nccl_wait_share: float | None
    last_arrivals: int = Field(description="matched instances it arrived last at")
    median_late_ns: float | None = Field(description="median lateness when it arrived last")


class InspectorSummary(BaseModel):
    """The run-level Inspector figures of the latest analysis (the report's ``inspector`` section)."""

    nccl_wait_ns: int | None
    nccl_transfer_ns: int | None
    nccl_wait_share: float | None
    late_rank: int | None
    late_rank_share: float | None = Field(description="of the instances with a last rank, the late rank's share")
    collective_instances_matched: int | None
    collective_instances_unmatched: int | None
    matched_steps: int | None = Field(description="windows with matched instances in that analysis")
    inspector_lines: int | None
    arrival_source: str | None
    window_time: str | None = Field(description="what places an instance in a window: dump timestamp or kernel start")
    null_reasons: dict[str, str] = Field(default_factory=dict)
    ranks: list[InspectorRankRow] = Field(default_factory=list)


class InspectorTables(BaseModel):
    run_id: int
    window_s: int | None = Field(description="the stored windows' length, s; null when none is stored")
    windows: list[InspectorWindowRow] = Field(
        description="the stored windows, oldest first: merged across uploads (a long job's trend)"
    )
    summary: InspectorSummary | None = Field(
        description="the latest analysis's run-level figures; null when it had no Inspector logs"
    )
