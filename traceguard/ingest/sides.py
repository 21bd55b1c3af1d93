"""Side inputs of a run: NCCL_DEBUG logs, ``nvidia-smi dmon`` / ``topo -m`` / ``-q`` output and
collective-benchmark output (nccl-tests format). Given explicitly or found in a run bundle by
content; each parsed by its own module and gathered into :class:`SideData`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import polars as pl

from traceguard.errors import InputError
from traceguard.ingest import InputSpec, parse_spec
from traceguard.ingest.nccl_inspector import InspectorData, read_inspector
from traceguard.ingest.nccl_log import NcclLog, read_nccl_logs

KINDS = ("nccl_log", "dmon", "nccl_tests", "topo", "smi_q", "nccl_inspector")
#: Where ``traceguard harness run --nccl-inspector`` puts the plugin's logs inside a bundle.
INSPECTOR_DIR = "inspector"
_MAX_SIDE_BYTES = 64 << 20
T = TypeVar("T")  # side files are text of a few MB at most


@dataclass
class SideData:
    """Parsed side inputs of one run (any may be missing)."""

    nccl: NcclLog | None = None
    nvlink_pairs: set[frozenset[int]] | None = None
    dmon: pl.DataFrame | None = None
    pcie_rated_mb_s: dict[int, float] | None = None
    nccl_tests: pl.DataFrame | None = None
    #: NCCL Inspector logs (traceguard.ingest.nccl_inspector): per-collective lines of every rank.
    inspector: InspectorData | None = None
    sources: dict[str, list[str]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


@dataclass
class SideFiles:
    nccl_log: list[Path] = field(default_factory=list)
    dmon: list[Path] = field(default_factory=list)
    nccl_tests: list[Path] = field(default_factory=list)
    topo: list[Path] = field(default_factory=list)
    smi_q: list[Path] = field(default_factory=list)
    nccl_inspector: list[Path] = field(default_factory=list)

    def extend(self, other: SideFiles) -> None:
        """Add ``other``'s files; one already here (the same file given as an option, positionally, or
        found in a run directory) is not added twice, so its lines are not counted twice."""
        seen = {path.resolve() for kind in KINDS for path in getattr(self, kind)}
        for kind in KINDS:
            for path in getattr(other, kind):
                if path.resolve() not in seen:
                    seen.add(path.resolve())
                    getattr(self, kind).append(path)

    def any(self) -> bool:
        return any(getattr(self, kind) for kind in KINDS)


def _text(path: Path) -> str:
    try:
        if path.stat().st_size > _MAX_SIDE_BYTES:
            raise InputError(f"{path}: larger than {_MAX_SIDE_BYTES >> 20} MiB, not a side file")
        raw = path.read_bytes()
    except OSError as exc:
        raise InputError(f"{path}: cannot be read ({exc.strerror})") from exc
    if raw[:2] == b"\x1f\x8b":
        import gzip

        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise InputError(f"{path}: gzip data is corrupt ({exc})") from exc
    return raw.decode("utf-8", errors="replace")


def classify(path: Path) -> str | None:
    """The side-input kind of a file (one of :data:`KINDS`), from its content; None: not a side input.

    The one content classifier is :func:`traceguard.ingest.uploads.classify` (the service's intake
    uses it too); this keeps only its side kinds.
    """
    from traceguard.ingest.uploads import classify as classify_content

    try:
        found = classify_content(path)
    except (InputError, OSError):
        return None
    return found.kind if found.kind in KINDS else None


def split_inputs(inputs: Iterable[str | InputSpec]) -> tuple[list[str | InputSpec], SideFiles]:
    """Positional inputs → (captures and run directories, side files), by content.

    A file whose content is an NCCL log, ``nvidia-smi`` or nccl-tests output goes to the side
    inputs; everything else (captures, directories, files that cannot be read or recognised) stays
    with the captures, whose reader says what is wrong with it. ``FILE:RANK`` names a capture's
    rank; on a side file the rank is ignored (the side readers find ranks in the content).
    """
    captures: list[str | InputSpec] = []
    found = SideFiles()
    for item in inputs:
        path = item.path if isinstance(item, InputSpec) else parse_spec(item).path
        kind = classify(path) if path.is_file() else None
        if kind:
            getattr(found, kind).append(path)
        else:
            captures.append(item)
    return captures, found


def discover(directory: Path) -> SideFiles:
    """Side files of a run bundle (text files beside the captures, and the NCCL Inspector logs in
    its ``inspector/`` folder), by content."""
    found = SideFiles()
    paths = sorted(directory.iterdir())
    if (directory / INSPECTOR_DIR).is_dir():
        paths += sorted((directory / INSPECTOR_DIR).iterdir())
    for path in paths:
        # ".prom" anywhere: snapshots of the Inspector's Prometheus file copied as they are rewritten
        # (nccl_inspector_metrics_<GPU>.prom_t030) are one file each.
        text_like = path.suffix in (".log", ".txt", ".out", ".gz", ".jsonl") or ".prom" in path.name
        if path.is_file() and text_like and (".json" not in path.name or ".jsonl" in path.name):
            kind = classify(path)
            if kind:
                getattr(found, kind).append(path)
    return found


def _each(paths: Iterable[Path], parse: Callable[[str], T], errors: list[str]) -> list[T]:
    """Parse every file; one that fails goes to ``errors`` and the others still count."""
    parsed = []
    for path in paths:
        try:
            parsed.append(parse(_text(path)))
        except InputError as exc:
            errors.append(str(exc) if str(path) in str(exc) else f"{path}: {exc}")
    return parsed


def load_side(files: SideFiles) -> SideData:
    """Parse every side file; a file that fails is reported in ``errors``, the rest still count."""
    from traceguard.ingest import side_inputs

    data = SideData(sources={k: [str(p) for p in getattr(files, k)] for k in KINDS if getattr(files, k)})
    if files.nccl_log:
        try:
            data.nccl = read_nccl_logs(files.nccl_log)
        except InputError as exc:
            data.errors.append(str(exc))
    for parsed in _each(files.topo, side_inputs.parse_topo, data.errors):
        data.nvlink_pairs = (data.nvlink_pairs or set()) | set(parsed.get("nvlink_pairs") or ())
    if frames := _each(files.dmon, side_inputs.parse_dmon, data.errors):
        data.dmon = pl.concat(frames, how="diagonal_relaxed")
    for links in _each(files.smi_q, side_inputs.pcie_link_from_smi_q, data.errors):
        rated = {gpu: side_inputs.rated_pcie_mb_s(gen, width) for gpu, (gen, width) in links.items() if gen and width}
        if rated:
            data.pcie_rated_mb_s = {**(data.pcie_rated_mb_s or {}), **rated}
    if tables := _each(files.nccl_tests, side_inputs.parse_nccl_tests, data.errors):
        data.nccl_tests = pl.concat(tables, how="diagonal_relaxed")
    if files.nccl_inspector:
        # Streamed by its own reader (no size limit: a long job's logs are gigabytes).
        data.inspector = read_inspector(files.nccl_inspector)
        data.errors.extend(data.inspector.errors)
    return data


def side_files(
    nccl_logs: Iterable[Path] = (),
    dmon: Iterable[Path] = (),
    nccl_tests: Iterable[Path] = (),
    topo: Iterable[Path] = (),
    smi_q: Iterable[Path] = (),
    nccl_inspector: Iterable[Path] = (),
) -> SideFiles:
    return SideFiles(list(nccl_logs), list(dmon), list(nccl_tests), list(topo), list(smi_q), list(nccl_inspector))
