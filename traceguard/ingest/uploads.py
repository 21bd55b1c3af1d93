"""What an uploaded file is, whether it can be trusted enough to keep, and how archives unpack.

The service stores a file only after :func:`classify` named its kind from the content (never from
the name) and :func:`validate` checked it: SQLite through the hardened read-only opening with
``quick_check`` and only real tables of nsys's names; gzip streams read to their end (CRC checked)
under a size limit; archives unpacked member by member with no absolute paths, no ``..``, no
links or devices, and limits on member count and bytes.

Errors: :class:`~traceguard.errors.UnsupportedFormatError` when the kind is not one traceguard
reads (HTTP 415); :class:`~traceguard.errors.InputError` when it is, but the content is damaged or
unsafe (HTTP 422).
"""

from __future__ import annotations

import gzip
import shutil
import sqlite3
import tarfile
import tempfile
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from traceguard.errors import InputError, UnsupportedFormatError
from traceguard.ingest.kineto import looks_like_kineto
from traceguard.ingest.nccl_inspector import check_inspector_head, looks_like_inspector, looks_like_inspector_prom
from traceguard.ingest.nccl_log import looks_like_nccl_log
from traceguard.ingest.nsys_rep import is_nsys_rep
from traceguard.ingest.nsys_sqlite import META_TABLES, NVTX
from traceguard.ingest.side_inputs import sniff_side_input
from traceguard.ingest.sqlite_safe import open_readonly, real_tables, wrap_sqlite_error

SQLITE_MAGIC = b"SQLite format 3\x00"
GZIP_MAGIC = b"\x1f\x8b"
ZIP_MAGIC = b"PK\x03\x04"
CAPTURE_KINDS = ("nsys-sqlite", "nsys-rep", "kineto")
SIDE_KINDS = ("nccl_log", "dmon", "nccl_tests", "topo", "smi_q", "nccl_inspector")
#: Side kinds that grow with the job (read streamed): held to the capture size limit, not the side one.
LARGE_SIDE_KINDS = ("nccl_inspector",)
ARCHIVE_KINDS = ("tar", "zip")
_SIDE_NAMES = {"dmon": "dmon", "nccl-tests": "nccl_tests", "topo": "topo", "smi-q": "smi_q"}
#: Tables nsys writes that the analysis reads; any of them present as a view (or virtual table)
#: means the file was made by someone other than nsys.
NSYS_TABLES = (
    "StringIds",
    "CUPTI_ACTIVITY_KIND_KERNEL",
    "CUPTI_ACTIVITY_KIND_MEMCPY",
    "CUPTI_ACTIVITY_KIND_MEMSET",
    "CUPTI_ACTIVITY_KIND_RUNTIME",
    "CUPTI_ACTIVITY_KIND_DRIVER",
    "TARGET_INFO_GPU",
    "TARGET_INFO_CUDA_DEVICE",
    "PROCESSES",
    "ThreadNames",
    NVTX,
    *META_TABLES,
)


@dataclass(frozen=True)
class Classified:
    kind: str  # one of CAPTURE_KINDS + SIDE_KINDS + ARCHIVE_KINDS
    compressed: bool = False

    @property
    def is_capture(self) -> bool:
        return self.kind in CAPTURE_KINDS

    @property
    def is_archive(self) -> bool:
        return self.kind in ARCHIVE_KINDS


def _head(path: Path, size: int = 65536) -> bytes:
    with path.open("rb") as fh:
        return fh.read(size)


def _gunzip_head(path: Path, size: int = 65536) -> bytes:
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(size)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"the gzip data is corrupt or truncated ({exc})") from exc


def classify(path: Path) -> Classified:
    """The kind of ``path`` from its first bytes (decompressed when gzip)."""
    raw = _head(path)
    if not raw:
        raise InputError("the file is empty")
    if raw.startswith(ZIP_MAGIC):
        return Classified("zip")
    compressed = raw.startswith(GZIP_MAGIC)
    head = _gunzip_head(path) if compressed else raw
    if len(head) >= 262 and head[257:262] == b"ustar":
        return Classified("tar", compressed)
    if head.startswith(SQLITE_MAGIC):
        return Classified("nsys-sqlite", compressed)
    if not compressed and is_nsys_rep(path):
        return Classified("nsys-rep")
    if looks_like_kineto(head):
        return Classified("kineto", compressed)
    if looks_like_inspector(head):
        return Classified("nccl_inspector", compressed)
    text = head.decode("utf-8", errors="replace")
    if looks_like_inspector_prom(text):
        return Classified("nccl_inspector", compressed)
    if looks_like_nccl_log(text):
        return Classified("nccl_log", compressed)
    side = sniff_side_input(text)
    if side:
        return Classified(_SIDE_NAMES[side], compressed)
    raise UnsupportedFormatError(
        "not a file traceguard reads",
        hint="upload an nsys SQLite export (plain or .gz), an .nsys-rep, a PyTorch profiler (Kineto) JSON "
        "trace (plain or .gz), an NCCL_DEBUG=INFO log, NCCL Inspector logs (JSON lines or .prom), "
        "nvidia-smi dmon / topo -m / -q output, nccl-tests "
        "output, or a run bundle as .tar, .tar.gz or .zip",
    )


def _gunzip_to(path: Path, target: Path, limit: int) -> None:
    """Decompress the whole gzip stream (so its CRC is checked) into ``target``, at most ``limit`` bytes."""
    written = 0
    try:
        with gzip.open(path, "rb") as src, target.open("wb") as dst:
            while chunk := src.read(1 << 20):
                written += len(chunk)
                if written > limit:
                    raise InputError(f"the gzip stream expands to more than {limit} bytes")
                dst.write(chunk)
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"the gzip data is corrupt or truncated ({exc})") from exc


def _check_gzip(path: Path, limit: int) -> None:
    written = 0
    try:
        with gzip.open(path, "rb") as src:
            while chunk := src.read(1 << 20):
                written += len(chunk)
                if written > limit:
                    raise InputError(f"the gzip stream expands to more than {limit} bytes")
    except (OSError, EOFError, zlib.error) as exc:
        raise InputError(f"the gzip data is corrupt or truncated ({exc})") from exc


def validate_sqlite(path: Path, *, deadline: float = 120.0) -> None:
    """Hardened read-only open, ``quick_check``, and nsys's tables as real tables (never views)."""
    conn = open_readonly(path, quick_check=True, deadline=deadline)
    try:
        placeholders = ",".join("?" * len(NSYS_TABLES))
        query = f"SELECT name, type, sql FROM sqlite_master WHERE name IN ({placeholders})"
        rows = conn.execute(query, NSYS_TABLES).fetchall()
        tables = real_tables(conn)
    except sqlite3.Error as exc:
        raise wrap_sqlite_error(path, exc) from exc
    finally:
        conn.close()
    disguised = sorted(
        name for name, kind, sql in rows if kind != "table" or (sql or "").lstrip().upper().startswith("CREATE VIRTUAL")
    )
    if disguised:
        raise InputError(
            f"the SQLite file defines {', '.join(disguised)} as views or virtual tables, not tables: "
            "it was not written by nsys and is not read",
            hint="upload the file `nsys export --type sqlite` wrote",
        )
    if "StringIds" not in tables or not (
        any(t in tables for t in (*META_TABLES, NVTX)) or any(t.startswith("CUPTI_ACTIVITY_KIND_") for t in tables)
    ):
        raise InputError(
            "the SQLite file is not an Nsight Systems export (no StringIds and no event tables)",
            hint="upload the file `nsys export --type sqlite` wrote",
        )


def validate(path: Path, found: Classified, *, scratch: Path, max_expanded_bytes: int, max_side_bytes: int) -> None:
    """Check a classified upload before it is kept; raises InputError naming the problem."""
    if found.kind == "nsys-sqlite":
        if found.compressed:
            with tempfile.TemporaryDirectory(dir=scratch) as tmp:
                inner = Path(tmp) / "capture.sqlite"
                _gunzip_to(path, inner, max_expanded_bytes)
                validate_sqlite(inner)
        else:
            validate_sqlite(path)
    elif found.compressed:
        _check_gzip(path, max_expanded_bytes if found.kind in ("kineto", "tar", *LARGE_SIDE_KINDS) else max_side_bytes)
    elif found.kind in SIDE_KINDS and found.kind not in LARGE_SIDE_KINDS and path.stat().st_size > max_side_bytes:
        raise InputError(f"a {found.kind} text file larger than {max_side_bytes} bytes is not a side input")
    if found.kind == "nccl_inspector":
        check_inspector_head(path)  # parses, and a format version this reader knows


@dataclass(frozen=True)
class Member:
    name: str  # the member's path inside the archive (POSIX, relative, checked)
    path: Path  # where it was unpacked


def safe_member_name(name: str) -> str:
    """The member path if it stays inside the archive's root; InputError otherwise."""
    if "\x00" in name or "\\" in name:
        raise InputError(f"archive member {name!r} has a NUL or backslash in its path; the archive is refused")
    pure = PurePosixPath(name)
    if pure.is_absolute() or any(part == ".." for part in pure.parts):
        raise InputError(
            f"archive member {name!r} points outside the archive (absolute or '..'); the archive is refused"
        )
    parts = [p for p in pure.parts if p not in ("", ".")]
    if not parts:
        raise InputError(f"archive member {name!r} has no file name")
    return "/".join(parts)


def unpack(path: Path, found: Classified, dest: Path, *, max_members: int, max_bytes: int) -> list[Member]:
    """Unpack every regular file of a tar/zip archive into ``dest`` (flat names, no links).

    Refuses the whole archive when any member's path is unsafe, when it holds links or devices,
    or when it exceeds the member or byte limits.
    """
    dest.mkdir(parents=True, exist_ok=True)
    members: list[Member] = []
    total = 0

    def copy(stream: object, name: str) -> None:
        nonlocal total
        target = dest / f"{len(members):05d}"
        with target.open("wb") as out:
            while chunk := stream.read(1 << 20):  # type: ignore[attr-defined]
                total += len(chunk)
                if total > max_bytes:
                    raise InputError(f"the archive expands to more than {max_bytes} bytes")
                out.write(chunk)
        members.append(Member(name, target))

    try:
        if found.kind == "zip":
            with zipfile.ZipFile(path) as archive:
                infos = archive.infolist()
                if len(infos) > max_members:
                    raise InputError(f"the archive holds {len(infos)} members, more than the limit of {max_members}")
                for info in infos:
                    name = safe_member_name(info.filename)
                    if info.is_dir():
                        continue
                    if (info.external_attr >> 16) & 0o170000 == 0o120000:
                        raise InputError(f"archive member {info.filename!r} is a symbolic link; the archive is refused")
                    with archive.open(info) as stream:
                        copy(stream, name)
        else:
            with tarfile.open(path, mode="r:*") as archive:
                count = 0
                for info in archive:
                    count += 1
                    if count > max_members:
                        raise InputError(f"the archive holds more than the limit of {max_members} members")
                    name = safe_member_name(info.name)
                    if info.isdir():
                        continue
                    if not info.isfile():
                        raise InputError(
                            f"archive member {info.name!r} is a link or device, not a file; the archive is refused"
                        )
                    stream = archive.extractfile(info)
                    if stream is None:
                        continue
                    with stream:
                        copy(stream, name)
    except InputError:
        shutil.rmtree(dest, ignore_errors=True)
        raise
    except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError, zlib.error) as exc:
        shutil.rmtree(dest, ignore_errors=True)
        raise InputError(f"the archive is corrupt or truncated ({exc})") from exc
    except (NotImplementedError, RuntimeError, ValueError) as exc:  # zipfile: encrypted, unknown method/version
        shutil.rmtree(dest, ignore_errors=True)
        raise InputError(f"the archive uses a feature traceguard does not unpack ({exc})") from exc
    return members
