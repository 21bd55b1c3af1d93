"""Files into a run: classify and validate what arrived, keep its bytes once, and record it.

An archive (a run bundle as .tar, .tar.gz or .zip) is unpacked member by member; its
``manifest.json`` gives the ranks of its captures; members that are not files traceguard reads
(the job's stdout, per-rank records) are listed as skipped. One damaged or unsafe member refuses
the whole archive, so a bundle is stored completely or not at all.

Whatever an upload holds, checking it ends in the file being kept or in an
:class:`~traceguard.errors.InputError` naming it (HTTP 422): a failure of the checks themselves on
some content (a bug) is logged with its traceback and refuses the file, never answers 500.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from sqlalchemy.orm import Session

from traceguard.errors import InputError, UnsupportedFormatError
from traceguard.ingest import MANIFEST
from traceguard.ingest.uploads import Classified, classify, unpack, validate
from traceguard.service.context import Context
from traceguard.store.blobs import BlobWriter
from traceguard.store.runs import add_file
from traceguard.store.tables import File, Run

log = logging.getLogger("traceguard.intake")


@dataclass
class Intake:
    files: list[tuple[File, bool]] = field(default_factory=list)  # (row, newly added)
    skipped: list[dict[str, str]] = field(default_factory=list)


def _named(exc: InputError, name: str) -> InputError:
    """The same error, its message prefixed with the file it is about."""
    exc.message = f"{name}: {exc.message}"
    return exc


@contextmanager
def _checking(name: str) -> Iterator[None]:
    """Content checks of an uploaded file: InputError named after the file; any other failure (a bug
    the content triggered) logged with its traceback and turned into a refusal of the file."""
    try:
        yield
    except InputError as exc:
        raise _named(exc, name) from exc
    except MemoryError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) and exc.errno is not None:  # the server's disk, not the upload
            raise
        log.exception("checking the upload %r failed on an internal error", name)
        raise InputError(
            f"{name}: the file could not be checked ({type(exc).__name__}) and was not stored",
            hint="it is probably damaged; if it is not, this is a bug in traceguard: report it with the file",
        ) from exc


def _guarded(name: str, check: Callable[[], Classified]) -> Classified:
    with _checking(name):
        return check()


def _validate(ctx: Context, path: Path, kind: Classified, name: str) -> None:
    with _checking(name):
        validate(
            path,
            kind,
            scratch=ctx.blobs.scratch,
            max_expanded_bytes=ctx.settings.max_archive_bytes,
            max_side_bytes=ctx.settings.max_side_file_bytes,
        )


def _manifest_ranks(members: dict[str, Path]) -> dict[str, int]:
    ranks: dict[str, int] = {}
    for name, path in members.items():
        if PurePosixPath(name).name != MANIFEST or path.stat().st_size > 1 << 20:
            continue
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        base = PurePosixPath(name).parent
        captures = doc.get("captures") if isinstance(doc, dict) else None
        for entry in captures if isinstance(captures, list) else []:
            if isinstance(entry, dict) and isinstance(entry.get("path"), str) and isinstance(entry.get("rank"), int):
                ranks[str(base / entry["path"]) if str(base) != "." else entry["path"]] = entry["rank"]
    return ranks


def _only(kinds: tuple[str, ...]) -> str:
    return "NCCL Inspector logs" if kinds == ("nccl_inspector",) else ", ".join(kinds)


def receive(
    ctx: Context,
    session: Session,
    run: Run,
    upload: BlobWriter,
    *,
    name: str,
    rank: int | None = None,
    kinds: tuple[str, ...] | None = None,
) -> Intake:
    """Keep one received upload (already streamed to ``upload``'s temporary file) in ``run``.

    ``kinds``: only files of these kinds are taken (a single file of another kind is refused; an
    archive's members of other kinds are skipped, and an archive with none of them is refused).

    Raises UnsupportedFormatError (not a kind traceguard reads) or InputError (damaged, unsafe,
    over a limit), naming the file; nothing is recorded then.
    """
    limits = ctx.settings
    upload.finish()
    found = _guarded(name, lambda: classify(upload.temp_path))
    if kinds is not None and not found.is_archive and found.kind not in kinds:
        raise UnsupportedFormatError(
            f"{name}: a {found.kind} file, not {_only(kinds)}",
            hint="this route takes only " + _only(kinds) + " (or a tar/zip of them); upload other files to "
            f"/v1/runs/{run.id}/files",
        )
    intake = Intake()
    if found.is_archive:
        with tempfile.TemporaryDirectory(dir=ctx.blobs.scratch) as tmp:
            with _checking(name):
                members = unpack(
                    upload.temp_path,
                    found,
                    Path(tmp) / "members",
                    max_members=limits.max_archive_members,
                    max_bytes=limits.max_archive_bytes,
                )
                ranks = _manifest_ranks({m.name: m.path for m in members})
            accepted: list[tuple[str, Path, Classified]] = []
            for member in members:
                try:
                    kind = _guarded(f"{name}/{member.name}", lambda path=member.path: classify(path))
                except UnsupportedFormatError:
                    intake.skipped.append({"name": member.name, "reason": "not a file traceguard reads"})
                    continue
                if kind.is_archive:
                    intake.skipped.append({"name": member.name, "reason": "archives inside archives are not opened"})
                    continue
                if kinds is not None and kind.kind not in kinds:
                    intake.skipped.append({"name": member.name, "reason": f"a {kind.kind} file, not {_only(kinds)}"})
                    continue
                _validate(ctx, member.path, kind, f"{name}/{member.name}")
                accepted.append((member.name, member.path, kind))
            if not accepted and kinds is not None:
                raise InputError(f"{name}: the archive holds no {_only(kinds)}")
            if not accepted:
                raise InputError(f"{name}: the archive holds no capture, NCCL log or nvidia-smi/nccl-tests output")
            for member_name, path, kind in accepted:
                sha, size = ctx.blobs.put_file(path, limit=limits.max_file_bytes)
                member_rank = ranks.get(member_name)
                intake.files.append(
                    add_file(
                        session,
                        run,
                        sha256=sha,
                        size=size,
                        name=PurePosixPath(member_name).name,
                        kind=kind.kind,
                        compressed=kind.compressed,
                        rank=member_rank,
                        rank_source="manifest" if member_rank is not None else None,
                        archive=name,
                    )
                )
        upload.discard()
        return intake
    _validate(ctx, upload.temp_path, found, name)
    upload.commit()
    assert upload.sha256 is not None
    intake.files.append(
        add_file(
            session,
            run,
            sha256=upload.sha256,
            size=upload.size,
            name=name,
            kind=found.kind,
            compressed=found.compressed,
            rank=rank if found.is_capture else None,
            rank_source="argument" if rank is not None and found.is_capture else None,
        )
    )
    return intake


def receive_path(ctx: Context, session: Session, run: Run, path: Path, *, rank: int | None = None) -> Intake:
    """:func:`receive` for a file already on disk (the CLI's local store)."""
    writer = ctx.blobs.writer(limit=ctx.settings.max_file_bytes, what=path.name)
    with writer, path.open("rb") as fh:
        while chunk := fh.read(ctx.settings.upload_chunk_bytes):
            writer.write(chunk)
        return receive(ctx, session, run, writer, name=path.name, rank=rank)
