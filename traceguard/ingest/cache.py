"""A content-addressed cache for derived files (gunzipped captures, nsys SQLite exports).

Keys are the sha256 of the *input* bytes, so a renamed or re-copied capture is not redone and a
changed one never reuses a stale result. Writes go to a temporary name and are renamed into
place, so a crash or a concurrent reader never sees a half-written file.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import zlib
from pathlib import Path

from traceguard.errors import InputError

_CHUNK = 1 << 20


def cache_dir() -> Path:
    """``$TRACEGUARD_CACHE_DIR``, else ``$XDG_CACHE_HOME/traceguard``, else ``~/.cache/traceguard``;
    created on demand."""
    explicit = os.environ.get("TRACEGUARD_CACHE_DIR")
    if explicit:
        root = Path(explicit).expanduser()
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "traceguard"
    root.mkdir(parents=True, exist_ok=True)
    return root


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (captures can be GBs)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _suffix_after_gz(path: Path) -> str:
    """``x.sqlite.gz`` → ``.sqlite``: keep the inner extension so the cached file is typed."""
    inner = Path(path.name.removesuffix(".gz")).suffix
    return inner or ".bin"


def gunzip_cached(path: Path) -> Path:
    """Decompress ``path`` (gzip) into the cache, streaming; return the cached file.

    Reused when present. A truncated or corrupt gzip raises InputError and leaves nothing behind.
    """
    path = Path(path)
    try:
        key = sha256_file(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    root = cache_dir() / "gunzip"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{key}{_suffix_after_gz(path)}"
    if target.exists():
        return target
    fd, tmp_name = tempfile.mkstemp(dir=root, prefix=f".{key}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as dst, gzip.open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                dst.write(chunk)
        os.replace(tmp, target)
    except (OSError, EOFError, zlib.error) as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, EOFError):
            why = "it is truncated (the compressed stream ends early)"
        elif isinstance(exc, gzip.BadGzipFile):
            why = f"it is not a valid gzip file ({exc})"
        elif isinstance(exc, zlib.error):
            why = f"its compressed data is corrupt ({exc})"
        else:
            why = f"decompression failed ({exc})"
        raise InputError(
            f"{path} cannot be decompressed: {why}.",
            hint="copy or download the file again; `gzip -t FILE` checks a gzip file",
        ) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return target
