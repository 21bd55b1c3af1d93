"""Ingest: any capture file → :class:`traceguard.model.Capture`, and a run's files → ranks.

Formats are recognised by content, never by name: SQLite header (nsys export), nsys report
magic (``.nsys-rep``, exported with ``nsys export`` and cached), Kineto JSON (plain or gzip),
or a run-bundle directory with ``manifest.json``. Ranks are resolved as DESIGN.md says; a file
that cannot be read becomes an input with ``error`` set and the other ranks go on.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceguard import model
from traceguard.errors import InputError, NoUsableInputError, TraceguardError, UnsupportedFormatError, naming
from traceguard.ingest.kineto import looks_like_kineto, read_kineto
from traceguard.ingest.nsys_rep import export_to_sqlite, is_nsys_rep
from traceguard.ingest.nsys_sqlite import read_nsys_sqlite

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
MANIFEST = "manifest.json"
#: Files a bundle directory without a manifest is searched for.
CAPTURE_GLOBS = ("*.sqlite", "*.sqlite.gz", "*.nsys-rep", "*.json", "*.json.gz")
_RANK_IN_NAME = re.compile(r"(?:rank[_-]?|[_-])(\d+)(?=(?:\.[A-Za-z0-9-]+)*$)", re.IGNORECASE)
_DATE_AT_END = re.compile(r"\d{4}[-_]\d{2}[-_]\d{2}(?=(?:\.[A-Za-z0-9-]+)*$)")
_SPEC = re.compile(r"^(?P<path>.+):(?P<rank>\d+)$")


@dataclass
class InputSpec:
    """One capture named on the command line or in a bundle; ``rank`` when given explicitly."""

    path: Path
    rank: int | None = None
    rank_source: str | None = None  # "argument" | "manifest"


@dataclass
class InputRecord:
    """What the report says about one input (``inputs[]`` of the JSON contract)."""

    path: str
    format: str | None = None
    tool_version: str | None = None
    schema_version: str | None = None
    rank: int | None = None
    ranks: list[int] = field(default_factory=list)
    rank_source: str | None = None
    error: str | None = None
    error_code: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass
class RankCapture:
    """The events of one rank (one process of one capture file)."""

    rank: int
    capture: model.Capture
    input_index: int


@dataclass
class LoadedRun:
    inputs: list[InputRecord]
    ranks: list[RankCapture]


def parse_spec(argument: str) -> InputSpec:
    """``FILE`` or ``FILE:RANK`` (a path that exists as written wins over the suffix)."""
    match = _SPEC.match(argument)
    if match and not Path(argument).exists():
        return InputSpec(Path(match["path"]), int(match["rank"]), "argument")
    return InputSpec(Path(argument))


def expand(specs: Iterable[InputSpec]) -> list[InputSpec]:
    """Replace run-bundle directories by the captures they hold."""
    out: list[InputSpec] = []
    for spec in specs:
        if spec.path.is_dir():
            out.extend(bundle_captures(spec.path))
        else:
            out.append(spec)
    return out


def bundle_captures(directory: Path) -> list[InputSpec]:
    """Captures of a run bundle: from ``manifest.json`` when present, else by file pattern."""
    manifest = directory / MANIFEST
    if manifest.is_file():
        try:
            doc = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise InputError(f"{manifest}: not a readable JSON manifest ({exc})") from exc
        captures = doc.get("captures", []) if isinstance(doc, dict) else None
        if not isinstance(captures, list):
            raise InputError(f'{manifest}: not a run-bundle manifest (no "captures" list)')
        specs = []
        for entry in captures:
            if isinstance(entry, dict) and isinstance(entry.get("path"), str):
                rank = entry.get("rank")
                specs.append(
                    InputSpec(
                        directory / entry["path"],
                        rank if isinstance(rank, int) else None,
                        "manifest" if isinstance(rank, int) else None,
                    )
                )
        if specs:
            return specs
    found = sorted({p for pattern in CAPTURE_GLOBS for p in directory.glob(pattern)})
    # rank<N>.json beside the captures are the job's own per-rank records, not traces.
    found = [p for p in found if p.name != MANIFEST and not re.fullmatch(r"rank\d+\.json", p.name)]
    if not found:
        raise InputError(
            f"{directory} holds no capture (.sqlite, .sqlite.gz, .nsys-rep, Kineto .json[.gz])",
            hint="pass capture files, or a run bundle made by `traceguard harness run`",
        )
    return [InputSpec(p) for p in found]


def sniff(path: Path) -> str:
    """Return "nsys-sqlite", "nsys-rep" or "kineto" from the file's content."""
    try:
        with path.open("rb") as fh:
            head = fh.read(8192)
    except FileNotFoundError as exc:
        raise InputError(f"{path}: no such file") from exc
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from exc
    if not head:
        raise InputError(f"{path}: the file is empty", hint="the capture was probably not written completely")
    if head.startswith(GZIP_MAGIC):
        try:
            with gzip.open(path, "rb") as fh:
                head = fh.read(8192)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(f"{path}: gzip data is corrupt or truncated ({exc})") from exc
    if head.startswith(SQLITE_MAGIC):
        return "nsys-sqlite"
    if is_nsys_rep(path):
        return "nsys-rep"
    if looks_like_kineto(head):
        return "kineto"
    raise UnsupportedFormatError(
        f"{path}: not a capture traceguard reads",
        hint="expected an nsys SQLite export, an .nsys-rep, or a PyTorch profiler (Kineto) JSON trace",
    )


def read_capture(
    path: Path,
    *,
    shown: str | None = None,
    keep_correlation: bool = True,
    nvtx_rows: tuple[pl.DataFrame, pl.DataFrame] | None = None,
    on_ops: Callable[[model.Capture], None] | None = None,
) -> model.Capture:
    """Read one capture file of any supported format; every error it raises names the file.

    ``shown`` is what messages and the capture call the file (the path the user gave, when
    ``path`` is that path made absolute for a worker elsewhere); by default ``path`` itself.
    ``keep_correlation=False`` (the analysis' map): an nsys export's ops lose their correlation
    ids once their launches are joined (no metric reads them; ~9 bytes an op). ``nvtx_rows``: an
    nsys export's NVTX rows read already by another reader of this file (``read_nsys_sqlite``).
    ``on_ops``: an nsys export's capture before its launches are joined (``read_nsys_sqlite``);
    not called for other formats."""
    name = shown or str(path)
    try:
        return _read_capture(path, name, keep_correlation, nvtx_rows, on_ops)
    except TraceguardError as exc:
        if shown and str(path) != shown:
            exc.message = exc.message.replace(str(path), shown)
            exc.hint = exc.hint.replace(str(path), shown) if exc.hint else exc.hint
        naming(exc, name)
        raise


def _read_capture(
    path: Path,
    shown: str,
    keep_correlation: bool,
    nvtx_rows: tuple[pl.DataFrame, pl.DataFrame] | None = None,
    on_ops: Callable[[model.Capture], None] | None = None,
) -> model.Capture:
    kind = sniff(path)
    # The analysis needs only the CUDA calls that launched GPU work, joined to the ops as the
    # ops' launch columns (a third of the API rows on real captures, and no join left to do).
    if kind == "nsys-sqlite":
        capture = read_nsys_sqlite(
            path,
            source_path=shown,
            launches_only=True,
            keep_correlation=keep_correlation,
            nvtx_rows=nvtx_rows,
            on_ops=on_ops,
        )
    elif kind == "nsys-rep":
        capture = read_nsys_sqlite(
            export_to_sqlite(path),
            source_path=shown,
            launches_only=True,
            keep_correlation=keep_correlation,
            on_ops=on_ops,
        )
        capture.info.format = "nsys-rep"
    else:
        capture = read_kineto(path, source_path=shown)
    return with_rank_hint(capture)


def with_rank_hint(capture: model.Capture) -> model.Capture:
    """The capture, its ``rank_hint`` taken from the ``RANK`` nsys recorded for the process
    when the reader found none."""
    if capture.info.rank_hint is None:
        stated = capture.info.env.get("RANK")  # the environment nsys recorded for the process
        if stated is not None and stated.isdigit():
            capture.info.rank_hint = int(stated)
    return capture


def rank_from_name(path: Path) -> int | None:
    """A rank number in the file name: ``rank3``, ``cap_3.sqlite``, ``trace-3.json``."""
    if _DATE_AT_END.search(path.name):  # trace-2024-01-05.json: a date, not rank 5
        return None
    match = _RANK_IN_NAME.search(path.name)
    return int(match.group(1)) if match else None


def gpu_processes(capture: model.Capture) -> list[int]:
    """Processes with GPU work, ordered by the lowest device they used (then pid)."""
    ops = capture.gpu_ops.select("pid", "device").filter(pl.col("pid").is_not_null())
    if ops.height == 0:
        return []
    first = ops.group_by("pid").agg(pl.col("device").min().alias("device")).sort(["device", "pid"])
    return first["pid"].to_list()


def split_by_process(capture: model.Capture, pids: list[int], base_rank: int) -> list[tuple[int, model.Capture]]:
    """One capture per process: a file of ``nsys profile torchrun ...`` holds every rank."""
    out = []
    for offset, pid in enumerate(pids):
        keep = pl.col("pid") == pid
        out.append(
            (
                base_rank + offset,
                model.Capture(
                    info=capture.info,
                    gpu_ops=capture.gpu_ops.filter(keep),
                    api_calls=capture.api_calls.filter(keep),
                    ranges=capture.ranges.filter(keep),
                    folded_ranges=capture.folded_ranges.filter(keep),
                    devices=capture.devices,
                    processes=capture.processes.filter(keep),
                    strings=capture.strings,
                    # Every GPU's samples: each rank takes its own device's (metrics.link_counters).
                    link_samples=capture.link_samples,
                    pending_links=capture.pending_links,
                ),
            )
        )
    return out


def with_rank(capture: model.Capture, rank: int) -> model.Capture:
    lit = pl.lit(rank, dtype=pl.Int32).alias("rank")
    return model.Capture(
        info=capture.info,
        gpu_ops=capture.gpu_ops.with_columns(lit),
        api_calls=capture.api_calls.with_columns(lit),
        ranges=capture.ranges.with_columns(lit),
        folded_ranges=capture.folded_ranges,
        devices=capture.devices.with_columns(lit),
        processes=capture.processes.with_columns(lit),
        strings=capture.strings,
        link_samples=capture.link_samples,
        pending_links=capture.pending_links,
    )


@dataclass
class RankFacts:
    """What rank resolution needs to know of one readable input (DESIGN.md, "Ranks")."""

    index: int  # the input's place among all inputs
    position: int  # its place among the readable inputs (the position guess)
    path: Path
    rank: int | None  # stated: argument, manifest, the file itself, or its name
    source: str | None  # "argument" | "manifest" | "file" | "file name" | None
    width: int  # GPU processes in the file (≥ 1): a file of ``nsys profile torchrun`` holds every rank


@dataclass
class RankAssignment:
    """Where resolution put one input: its first rank and source, the ranks of its processes,
    the warnings to add to its record, or the error that keeps it out of the run."""

    rank: int | None
    source: str | None
    ranks: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    error: str | None = None
    error_code: str | None = None


def stated_rank(spec: InputSpec, rank_hint: int | None) -> tuple[int | None, str | None]:
    """The rank an input states, by precedence: ``FILE:RANK``/manifest, the file itself, its name."""
    if spec.rank is not None:
        return spec.rank, spec.rank_source
    if rank_hint is not None:
        return rank_hint, "file"
    if (named := rank_from_name(spec.path)) is not None:
        return named, "file name"
    return None, None


def resolve_ranks(facts: Iterable[RankFacts]) -> dict[int, RankAssignment]:
    """Every readable input's ranks, by input index (pure: the rules of DESIGN.md, "Ranks").

    Stated ranks are placed first, by precedence, so that a guess never takes a rank some input
    states; position guesses then take the first free rank from their position on. A file with
    several GPU processes takes consecutive ranks from its own. A rank already taken is an error
    for the later input (``duplicate_rank``)."""
    precedence = {"argument": 0, "manifest": 1, "file": 2, "file name": 3}
    ordered = sorted(facts, key=lambda f: (precedence.get(f.source or "", 9), f.position))
    taken: dict[int, str] = {}
    out: dict[int, RankAssignment] = {}
    for fact in ordered:
        rank, source = fact.rank, fact.source
        assignment = RankAssignment(rank, source)
        if rank is None:
            rank = fact.position
            while any(r in taken for r in range(rank, rank + fact.width)):
                rank += 1
            source = "position"
            assignment.warnings.append(
                f"no rank stated for {fact.path.name}: taken as rank {rank} from its position; "
                f"write {fact.path}:RANK to say which rank it is"
            )
        parts = list(range(rank, rank + fact.width))
        if len(parts) > 1:
            assignment.warnings.append(
                f"{len(parts)} GPU processes in one file: ranks {rank}..{rank + len(parts) - 1} "
                "in order of the devices they used"
            )
        clash = [r for r in parts if r in taken]
        if clash:
            assignment.error_code = "duplicate_rank"
            assignment.error = (
                f"rank {clash[0]} is already given by {taken[clash[0]]}; name each file's rank explicitly as FILE:RANK"
            )
            out[fact.index] = assignment
            continue
        assignment.rank, assignment.source, assignment.ranks = rank, source, parts
        for part in parts:
            taken[part] = fact.path.name
        out[fact.index] = assignment
    return out


def load_run(
    arguments: Iterable[str | InputSpec],
    *,
    on_input: Callable[[InputSpec], None] | None = None,
) -> LoadedRun:
    """Read every input, resolve ranks, and keep going past unreadable files.

    Rank order of precedence (DESIGN.md): ``FILE:RANK``; the bundle manifest; the file itself
    (Kineto ``distributedInfo.rank``, the ``RANK`` nsys recorded in the process environment);
    a number in the file name; the input's position (with a warning). A file holding several
    GPU processes (``nsys profile torchrun ...``) gives one rank per process, numbered from the
    file's rank in order of the devices they used.

    Holds every capture in memory at once: for notebooks and tests. The analysis itself reads
    one input at a time (:mod:`traceguard.mapreduce`).
    """
    specs = expand(a if isinstance(a, InputSpec) else parse_spec(a) for a in arguments)
    records: list[InputRecord] = []
    loaded: dict[int, tuple[model.Capture, list[int]]] = {}
    facts: list[RankFacts] = []
    for index, spec in enumerate(specs):
        if on_input:
            on_input(spec)
        record = InputRecord(path=str(spec.path))
        records.append(record)
        try:
            capture = read_capture(spec.path)
        except TraceguardError as exc:
            record.error, record.error_code = str(exc), exc.code
            continue
        describe(record, capture)
        pids = gpu_processes(capture)
        rank, source = stated_rank(spec, capture.info.rank_hint)
        facts.append(RankFacts(index, len(facts), spec.path, rank, source, max(len(pids), 1)))
        loaded[index] = (capture, pids)

    ranks: list[RankCapture] = []
    for index, assignment in resolve_ranks(facts).items():
        record = records[index]
        apply_assignment(record, assignment)
        if assignment.error:
            continue
        capture, pids = loaded[index]
        for part_rank, part in rank_parts(capture, pids, assignment):
            ranks.append(RankCapture(part_rank, part, index))
    if not ranks:
        raise NoUsableInputError(f"no usable input: {no_input_reasons(records)}")
    ranks.sort(key=lambda r: r.rank)
    return LoadedRun(records, ranks)


def describe(record: InputRecord, capture: model.Capture) -> None:
    """The record's facts about a capture that was read."""
    record.format = capture.info.format
    record.tool_version = capture.info.tool_version
    record.schema_version = capture.info.schema_version
    record.warnings.extend(capture.info.notes)


def apply_assignment(record: InputRecord, assignment: RankAssignment) -> None:
    """Write resolution's outcome for one input into its record."""
    record.warnings.extend(assignment.warnings)
    if assignment.error:
        record.error, record.error_code = assignment.error, assignment.error_code
        return
    record.rank, record.rank_source = assignment.rank, assignment.source
    record.ranks.extend(assignment.ranks)


def rank_parts(capture: model.Capture, pids: list[int], assignment: RankAssignment) -> list[tuple[int, model.Capture]]:
    """The capture's ranks under an assignment, each with its rank column set."""
    rank = assignment.ranks[0]
    parts = split_by_process(capture, pids, rank) if len(pids) > 1 else [(rank, capture)]
    return [(part_rank, with_rank(part, part_rank)) for part_rank, part in parts]


def no_input_reasons(records: Iterable[InputRecord]) -> str:
    return "; ".join(r.error for r in records if r.error) or "no input given"
