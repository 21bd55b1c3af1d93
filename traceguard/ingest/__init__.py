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


def read_capture(path: Path) -> model.Capture:
    """Read one capture file of any supported format; every error it raises names ``path``."""
    try:
        return _read_capture(path)
    except TraceguardError as exc:
        naming(exc, path)
        raise


def _read_capture(path: Path) -> model.Capture:
    kind = sniff(path)
    # The analysis needs only the CUDA calls that launched GPU work, joined to the ops as the
    # ops' launch columns (a third of the API rows on real captures, and no join left to do).
    if kind == "nsys-sqlite":
        capture = read_nsys_sqlite(path, source_path=str(path), launches_only=True)
    elif kind == "nsys-rep":
        capture = read_nsys_sqlite(export_to_sqlite(path), source_path=str(path), launches_only=True)
        capture.info.format = "nsys-rep"
    else:
        capture = read_kineto(path, source_path=str(path))
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
                    devices=capture.devices,
                    processes=capture.processes.filter(keep),
                    strings=capture.strings,
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
        devices=capture.devices.with_columns(lit),
        processes=capture.processes.with_columns(lit),
        strings=capture.strings,
    )


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
    """
    specs = expand(a if isinstance(a, InputSpec) else parse_spec(a) for a in arguments)
    records: list[InputRecord] = []
    loaded: list[tuple[int, model.Capture]] = []
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
        record.format = capture.info.format
        record.tool_version = capture.info.tool_version
        record.schema_version = capture.info.schema_version
        record.warnings.extend(capture.info.notes)
        loaded.append((index, capture))

    # Resolve stated ranks first, by precedence, so that a guess never takes a rank some input
    # states; position guesses then take the first free rank from their position on.
    precedence = {"argument": 0, "manifest": 1, "file": 2, "file name": 3}
    planned: list[tuple[int, int, model.Capture, int | None, str | None]] = []
    for position, (index, capture) in enumerate(loaded):
        spec = specs[index]
        rank, source = spec.rank, spec.rank_source
        if rank is None and capture.info.rank_hint is not None:
            rank, source = capture.info.rank_hint, "file"
        if rank is None and (named := rank_from_name(spec.path)) is not None:
            rank, source = named, "file name"
        planned.append((position, index, capture, rank, source))
    planned.sort(key=lambda p: (precedence.get(p[4] or "", 9), p[0]))

    taken: dict[int, str] = {}
    ranks: list[RankCapture] = []
    for position, index, capture, rank, source in planned:
        record, spec = records[index], specs[index]
        pids = gpu_processes(capture)
        width = max(len(pids), 1)
        if rank is None:
            rank = position
            while any(r in taken for r in range(rank, rank + width)):
                rank += 1
            source = "position"
            record.warnings.append(
                f"no rank stated for {spec.path.name}: taken as rank {rank} from its position; "
                f"write {spec.path}:RANK to say which rank it is"
            )
        parts = split_by_process(capture, pids, rank) if len(pids) > 1 else [(rank, capture)]
        if len(parts) > 1:
            record.warnings.append(
                f"{len(parts)} GPU processes in one file: ranks {rank}..{rank + len(parts) - 1} "
                "in order of the devices they used"
            )
        clash = [r for r, _ in parts if r in taken]
        if clash:
            record.error_code = "duplicate_rank"
            record.error = (
                f"rank {clash[0]} is already given by {taken[clash[0]]}; name each file's rank explicitly as FILE:RANK"
            )
            continue
        record.rank, record.rank_source = rank, source
        for part_rank, part in parts:
            taken[part_rank] = spec.path.name
            record.ranks.append(part_rank)
            ranks.append(RankCapture(part_rank, with_rank(part, part_rank), index))
    if not ranks:
        reasons = "; ".join(r.error for r in records if r.error) or "no input given"
        raise NoUsableInputError(f"no usable input: {reasons}")
    ranks.sort(key=lambda r: r.rank)
    return LoadedRun(records, ranks)
