"""Content-addressed blob store on disk: ``<root>/<sha[:2]>/<sha>``, written once, never changed.

Writes go to a temporary file in the same file system (hashed and counted as they stream) and are
renamed into place, so a crash never leaves a partial blob under its final name and two uploads of
the same bytes end in one file.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from types import TracebackType

from traceguard.errors import InputError

_SHA = re.compile(r"^[0-9a-f]{64}$")


class TooLarge(InputError):
    """More bytes than the limit allows (HTTP 413)."""

    code = "too_large"

    def __init__(self, message: str, limit: int) -> None:
        super().__init__(message)
        self.limit = limit


class BlobWriter:
    """Stream bytes in with :meth:`write`; :meth:`commit` moves them under their SHA-256."""

    def __init__(self, store: BlobStore, limit: int | None, what: str) -> None:
        self._store = store
        self._limit = limit
        self._what = what
        self._hash = hashlib.sha256()
        fd, name = tempfile.mkstemp(dir=store.scratch, prefix="upload-")
        self._file = os.fdopen(fd, "wb")
        self.temp_path = Path(name)
        self.size = 0
        self.sha256: str | None = None

    def write(self, chunk: bytes) -> None:
        self.size += len(chunk)
        if self._limit is not None and self.size > self._limit:
            raise TooLarge(
                f"{self._what} is larger than the limit of {self._limit} bytes ({self._limit / (1 << 20):.0f} MiB)",
                self._limit,
            )
        self._hash.update(chunk)
        self._file.write(chunk)

    def finish(self) -> str:
        """Close the temporary file and return the SHA-256 (the blob is not stored yet)."""
        if not self._file.closed:
            self._file.flush()
            os.fsync(self._file.fileno())
            self._file.close()
        self.sha256 = self._hash.hexdigest()
        return self.sha256

    def commit(self) -> Path:
        sha = self.sha256 or self.finish()
        target = self._store.path(sha)
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists():
            self.temp_path.unlink(missing_ok=True)  # same bytes already stored
        else:
            os.replace(self.temp_path, target)
            target.chmod(0o444)
        return target

    def discard(self) -> None:
        if not self._file.closed:
            self._file.close()
        self.temp_path.unlink(missing_ok=True)

    def __enter__(self) -> BlobWriter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None or self.temp_path.exists():
            self.discard()


class BlobStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.scratch = root / ".incoming"
        self.scratch.mkdir(parents=True, exist_ok=True)

    def path(self, sha256: str) -> Path:
        if not _SHA.match(sha256):
            raise ValueError(f"not a SHA-256 hex digest: {sha256!r}")
        return self.root / sha256[:2] / sha256

    def exists(self, sha256: str) -> bool:
        return self.path(sha256).is_file()

    def writer(self, *, limit: int | None = None, what: str = "the upload") -> BlobWriter:
        return BlobWriter(self, limit, what)

    def put_file(self, source: Path, *, limit: int | None = None) -> tuple[str, int]:
        """Store a file already on disk (an archive member); returns (sha256, size)."""
        with self.writer(limit=limit, what=source.name) as writer, source.open("rb") as fh:
            while chunk := fh.read(1 << 20):
                writer.write(chunk)
            writer.commit()
            assert writer.sha256 is not None
            return writer.sha256, writer.size

    def writable(self) -> bool:
        try:
            with tempfile.NamedTemporaryFile(dir=self.scratch):
                return True
        except OSError:
            return False
