"""The store's tables: what an engineer queries with plain SQL (SQLite or PostgreSQL).

Times are int64 nanoseconds as in the report (``*_ns``); shares are fractions 0–1; byte counts are
bytes. Result rows (rank results, steps, phases, collectives, connections, check results) always
describe the run's latest successful analysis: a job replaces them in one transaction, and a
failed job leaves them as they were.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    TypeDecorator,
    UniqueConstraint,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

JSONType = JSON().with_variant(JSONB(), "postgresql")

NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


class Timestamp(TypeDecorator[datetime]):
    """UTC timestamps, timezone-aware in Python on both engines (SQLite keeps them naive)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Project(Base):
    __tablename__ = "projects"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(200), unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)


class Token(Base):
    """An API token: only its SHA-256 is kept; ``prefix`` identifies it in lists and logs."""

    __tablename__ = "tokens"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    prefix: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[str] = mapped_column(String(100))  # comma-separated: read, upload, admin
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)
    last_used_at: Mapped[datetime | None] = mapped_column(Timestamp(), nullable=True)
    revoked_at: Mapped[datetime | None] = mapped_column(Timestamp(), nullable=True)
    project: Mapped[Project] = relationship()


class WebSession(Base):
    """A browser session made at the login form; the cookie carries the secret, we keep its hash."""

    __tablename__ = "web_sessions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token_id: Mapped[int] = mapped_column(ForeignKey("tokens.id", ondelete="CASCADE"), index=True)
    session_hash: Mapped[str] = mapped_column(String(64), unique=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(Timestamp())
    token: Mapped[Token] = relationship()


class Run(Base):
    """One training run (not an analysis job). ``status``: created → queued → running →
    analysed | failed (the latest job's outcome); ``verdict`` from the latest successful analysis."""

    __tablename__ = "runs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    project_id: Mapped[int] = mapped_column(ForeignKey("projects.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(200), default="")
    profile: Mapped[str] = mapped_column(String(100), default="production")
    #: The user's step regexes (``--step-pattern``), tried before the profile's; fixed at creation.
    step_patterns: Mapped[list[str]] = mapped_column(JSONType, default=list)
    status: Mapped[str] = mapped_column(String(20), default="created", index=True)
    verdict: Mapped[str | None] = mapped_column(String(10), nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow, index=True)
    updated_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow, onupdate=utcnow)
    labels: Mapped[list[RunLabel]] = relationship(
        cascade="all, delete-orphan", lazy="selectin", order_by="RunLabel.key"
    )


class RunLabel(Base):
    __tablename__ = "run_labels"
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True)
    key: Mapped[str] = mapped_column(String(100), primary_key=True)
    value: Mapped[str] = mapped_column(String(500))
    __table_args__ = (Index("ix_run_labels_key_value", "key", "value"),)


class Blob(Base):
    """Raw upload bytes, content-addressed on disk at ``blobs/<sha[:2]>/<sha>``; shared by runs."""

    __tablename__ = "blobs"
    sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    size: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)


class File(Base):
    """A file of a run. ``kind``: nsys-sqlite, nsys-rep, kineto, nccl_log, dmon, nccl_tests, topo,
    smi_q. ``rank`` as given (or from a bundle's manifest); ``resolved_rank`` as the analysis
    resolved it (DESIGN.md precedence)."""

    __tablename__ = "files"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    sha256: Mapped[str] = mapped_column(ForeignKey("blobs.sha256"))
    name: Mapped[str] = mapped_column(String(255))
    kind: Mapped[str] = mapped_column(String(20))
    compressed: Mapped[bool] = mapped_column(default=False)
    size: Mapped[int] = mapped_column(BigInteger)
    rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    rank_source: Mapped[str | None] = mapped_column(String(20), nullable=True)
    resolved_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    archive: Mapped[str | None] = mapped_column(String(255), nullable=True)  # the bundle it came in
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)
    __table_args__ = (UniqueConstraint("run_id", "sha256", name="uq_files_run_sha256"),)


class Job(Base):
    """An analysis job. ``status``: queued → running → succeeded | failed. A running job holds a
    lease it renews; one whose lease ran out (its worker died) goes back to the queue. ``worker``
    names the process that holds (or last held) it: ``host:pid:thread``.

    Progress of the current attempt: ``ranks_total`` captures (inputs) in the analysis,
    ``ranks_done`` of them whose per-rank map has finished; both null until the attempt's analysis
    reports them, and reset when the job is claimed again."""

    __tablename__ = "jobs"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    profile: Mapped[str] = mapped_column(String(100))
    input_key: Mapped[str] = mapped_column(String(64))  # hash of the run's (file, rank) set
    status: Mapped[str] = mapped_column(String(20), default="queued", index=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(100), nullable=True)
    lease_expires_at: Mapped[datetime | None] = mapped_column(Timestamp(), nullable=True)
    error_code: Mapped[str | None] = mapped_column(String(50), nullable=True)
    error_message: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(Timestamp(), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(Timestamp(), nullable=True)
    ranks_done: Mapped[int | None] = mapped_column(Integer, nullable=True)
    ranks_total: Mapped[int | None] = mapped_column(Integer, nullable=True)


class Report(Base):
    """The JSON report of one analysis of a run's input set under one profile (the contract in
    docs/report.schema.json). The run's own profile's report comes from its job; others are
    computed on request and kept."""

    __tablename__ = "reports"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    profile: Mapped[str] = mapped_column(String(100))
    input_key: Mapped[str] = mapped_column(String(64))
    verdict: Mapped[str] = mapped_column(String(10))
    document: Mapped[dict[str, Any]] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(Timestamp(), default=utcnow)
    __table_args__ = (UniqueConstraint("run_id", "profile", "input_key", name="uq_reports_run_profile_key"),)


class RankResult(Base):
    """Per-rank headline metrics of the latest analysis (all of them in ``metrics``)."""

    __tablename__ = "rank_results"
    __table_args__ = (Index("ix_rank_results_run_rank", "run_id", "rank"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    job_id: Mapped[int | None] = mapped_column(ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True)
    rank: Mapped[int] = mapped_column(Integer)
    input: Mapped[str | None] = mapped_column(String(255), nullable=True)
    gpu_models: Mapped[str | None] = mapped_column(String(255), nullable=True)
    #: Where the rank's steps came from: pattern, convention, inferred, window (DESIGN.md "Steps").
    step_source: Mapped[str | None] = mapped_column(String(20), nullable=True)
    step_count: Mapped[int | None] = mapped_column(Integer, nullable=True)
    gpu_ops: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_time_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_share_of_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    gpu_to_cpu_copy_rate: Mapped[float | None] = mapped_column(Float, nullable=True)
    dtod_bytes_per_step: Mapped[float | None] = mapped_column(Float, nullable=True)
    # Who waited for whom (docs/collectives.md): the rank's matched NCCL kernel time split into
    # waiting for the last rank and transfer; how often it arrived last and how late (median);
    # whether it is the run's late rank; its clock's offset and residual after alignment.
    nccl_wait_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_transfer_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_wait_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_arrivals: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_arrivals_of: Mapped[int | None] = mapped_column(Integer, nullable=True)
    median_late_ns: Mapped[float | None] = mapped_column(Float, nullable=True)
    is_late_rank: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    clock_offset_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    clock_residual_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    # The link counters (nsys GPU metrics; docs/report.schema.json ranks[].metrics and .links): the
    # GPU sampled, its samples during the NCCL kernels, PCIe and NVLink load then (fractions of the
    # link's peak), and where NCCL's bytes went (shares of those samples; times = share × the NCCL
    # kernels' time, link_nccl_ns). Null when the capture has no GPU metrics of the rank's GPU.
    link_device: Mapped[int | None] = mapped_column(Integer, nullable=True)
    link_nccl_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    pcie_nccl_avg: Mapped[float | None] = mapped_column(Float, nullable=True)
    pcie_nccl_p95: Mapped[float | None] = mapped_column(Float, nullable=True)
    pcie_nccl_peak: Mapped[float | None] = mapped_column(Float, nullable=True)
    nvlink_nccl_avg: Mapped[float | None] = mapped_column(Float, nullable=True)
    nvlink_nccl_p95: Mapped[float | None] = mapped_column(Float, nullable=True)
    nvlink_nccl_peak: Mapped[float | None] = mapped_column(Float, nullable=True)
    nccl_nvlink_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    nccl_pcie_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    nccl_link_idle_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    link_nccl_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_nvlink_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_pcie_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_link_idle_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    metrics: Mapped[dict[str, Any]] = mapped_column(JSONType)


class Step(Base):
    """One step of one rank. ``step_index`` counts the rank's steps in time order from 0;
    ``nccl_share`` = nccl_ns ÷ gpu_span_ns (DESIGN.md).

    Who waited for whom (docs/collectives.md; null where the report has null): ``nccl_wait_ns`` /
    ``nccl_transfer_ns`` split the NCCL kernel time of the step's matched collectives at the last
    rank's arrival; the step's *period* (``period_ns``: previous step's GPU end to its own) is
    broken down into ``compute_ns``, ``comm_ns`` (exposed NCCL, split into ``comm_wait_ns`` and
    ``comm_transfer_ns``), ``copy_ns``, ``idle_host_ns`` (the GPU waited for its host) and
    ``idle_other_ns``; ``lateness_ns`` is the rank's median arrival − the earliest member's at the
    step's collectives.

    The link counters (nsys GPU metrics; null without them): ``pcie_avg_pct`` / ``pcie_peak_pct`` and
    ``nvlink_avg_pct`` / ``nvlink_peak_pct`` over the step's GPU span, ``nccl_pcie_avg_pct`` /
    ``nccl_nvlink_avg_pct`` over its NCCL kernels; per sample the busier direction, % of the
    link's peak (0–100)."""

    __tablename__ = "steps"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    name: Mapped[str] = mapped_column(String(255))
    cpu_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_span_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    dtod_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    dtod_copies: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    peer_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    peer_copies: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_wait_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_transfer_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    period_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    compute_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    comm_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    comm_wait_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    comm_transfer_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    copy_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    idle_host_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    idle_other_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    lateness_ns: Mapped[float | None] = mapped_column(Float, nullable=True)
    pcie_avg_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    pcie_peak_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    nvlink_avg_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    nvlink_peak_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    nccl_pcie_avg_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    nccl_nvlink_avg_pct: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (Index("ix_steps_run_rank_index", "run_id", "rank", "step_index"),)


class Phase(Base):
    """A phase of a step (a range directly inside it). ``cpu_ns`` range duration, ``gpu_ns`` union
    of attributed GPU op time, ``nccl_ns`` attributed NCCL time; ``nccl_share`` = nccl_ns ÷ gpu_ns
    (null when the phase has no GPU time)."""

    __tablename__ = "phases"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(255))
    cpu_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    gpu_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    nccl_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    __table_args__ = (
        Index("ix_phases_run_rank_index", "run_id", "rank", "step_index"),
        Index("ix_phases_phase_share", "phase", "nccl_share"),
    )


class Collective(Base):
    """Per rank, collective and message size: count and kernel-duration statistics, algbw/busbw.
    ``transfer_median_ns``: median transfer time (after the last rank arrived) of the ``matched``
    calls; ``bandwidth_time`` says whether algbw/busbw use it (``transfer``) or kernel time
    (``kernel``, a lower bound: it includes waiting for the last rank)."""

    __tablename__ = "collectives"
    __table_args__ = (Index("ix_collectives_run_rank", "run_id", "rank"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    collective: Mapped[str] = mapped_column(String(100))
    msg_bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    group_size: Mapped[int | None] = mapped_column(Integer, nullable=True)
    count: Mapped[int] = mapped_column(BigInteger)
    total_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    median_ns: Mapped[float | None] = mapped_column(Float, nullable=True)
    p95_ns: Mapped[float | None] = mapped_column(Float, nullable=True)
    min_ns: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    algbw_gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    busbw_gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    transfer_median_ns: Mapped[float | None] = mapped_column(Float, nullable=True)
    matched: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bandwidth_time: Mapped[str | None] = mapped_column(String(10), nullable=True)


class CollectiveType(Base):
    """Collectives by type of one rank (DESIGN.md "Collectives by type"): ``step_index`` null for
    the rank's totals over the analysis window, else one step. ``time_ns`` union of the type's
    kernel time per device; ``exposed_ns`` the part no compute kernel covers; ``bytes`` Σ message
    sizes when every kernel has one, else null; ``issued_as`` (totals rows) kernels per framework
    operation that issued them, e.g. {"all_to_all": 32}."""

    __tablename__ = "collective_types"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    rank: Mapped[int] = mapped_column(Integer)
    step_index: Mapped[int | None] = mapped_column(Integer, nullable=True)
    collective: Mapped[str] = mapped_column(String(50))
    count: Mapped[int] = mapped_column(BigInteger)
    time_ns: Mapped[int] = mapped_column(BigInteger)
    exposed_ns: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    issued_as: Mapped[dict[str, int] | None] = mapped_column(JSONType, nullable=True)
    __table_args__ = (
        Index("ix_collective_types_run_rank_index", "run_id", "rank", "step_index"),
        Index("ix_collective_types_run_collective", "run_id", "collective"),
    )


class InspectorWindow(Base):
    """One time window of a run's NCCL Inspector logs (docs/inspector.md): the collectives matched
    on all their ranks whose time falls in [``window_start_s``, + ``window_s``) (wall clock, s since
    the epoch), their wait / transfer split, the rank last to arrive most often there, and the median
    bus bandwidth on transfer time. A long job's logs sent again as they grow are merged into these
    rows, so the run's rows show the trend window by window: an analysis adds the windows not stored yet and
    replaces a stored one only when it has more ``lines`` there (the Inspector lines of the window's
    matched instances; null on rows stored before migration 0009)."""

    __tablename__ = "inspector_windows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    window_start_s: Mapped[int] = mapped_column(BigInteger)
    window_s: Mapped[int] = mapped_column(Integer)
    instances: Mapped[int] = mapped_column(BigInteger)
    wait_ns: Mapped[int] = mapped_column(BigInteger)
    transfer_ns: Mapped[int] = mapped_column(BigInteger)
    nccl_wait_share: Mapped[float | None] = mapped_column(Float, nullable=True)
    late_rank: Mapped[int | None] = mapped_column(Integer, nullable=True)
    last_arrivals: Mapped[int] = mapped_column(BigInteger)
    bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    busbw_transfer_median_gbps: Mapped[float | None] = mapped_column(Float, nullable=True)
    lines: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    __table_args__ = (Index("ix_inspector_windows_run_start", "run_id", "window_start_s"),)


class PeerTraffic(Base):
    """One cell of the rank × peer matrix of point-to-point kernels: ``kernels`` carrying traffic
    with ``peer``, ``time_ns`` Σ their durations, ``sends``/``recvs`` NCCL calls naming the peer,
    ``bytes`` their message sizes, ``source`` what named the peer (metrics/collectives.py)."""

    __tablename__ = "peer_traffic"
    __table_args__ = (Index("ix_peer_traffic_run_rank", "run_id", "rank"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    rank: Mapped[int] = mapped_column(Integer)
    peer: Mapped[int] = mapped_column(Integer)
    kernels: Mapped[int] = mapped_column(BigInteger)
    time_ns: Mapped[int] = mapped_column(BigInteger)
    sends: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    recvs: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    bytes: Mapped[int | None] = mapped_column(BigInteger, nullable=True)
    source: Mapped[str] = mapped_column(String(100))


class Connection(Base):
    """One NCCL channel connection from the NCCL_DEBUG logs (the transport map)."""

    __tablename__ = "connections"
    __table_args__ = (Index("ix_connections_run_rank", "run_id", "rank"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    comm: Mapped[str | None] = mapped_column(String(64), nullable=True)
    rank: Mapped[int] = mapped_column(Integer)
    peer: Mapped[int] = mapped_column(Integer)
    channel: Mapped[int | None] = mapped_column(Integer, nullable=True)
    direction: Mapped[str | None] = mapped_column(String(10), nullable=True)
    transport: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str | None] = mapped_column(String(100), nullable=True)


class CheckResult(Base):
    """A check of the latest analysis under the run's profile."""

    __tablename__ = "check_results"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"), index=True)
    profile: Mapped[str] = mapped_column(String(100))
    rule_id: Mapped[str] = mapped_column(String(100))
    status: Mapped[str] = mapped_column(String(10), index=True)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    unit: Mapped[str | None] = mapped_column(String(20), nullable=True)
    warn: Mapped[float | None] = mapped_column(Float, nullable=True)
    fail: Mapped[float | None] = mapped_column(Float, nullable=True)
    message: Mapped[str | None] = mapped_column(Text, nullable=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    remedy: Mapped[str | None] = mapped_column(Text, nullable=True)
    evidence: Mapped[list[Any]] = mapped_column(JSONType)
