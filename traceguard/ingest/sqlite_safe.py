"""Open untrusted SQLite files (captures people upload) without trusting them.

Follows SQLite's "Defense Against the Dark Arts" (https://sqlite.org/security.html): read-only
URI, ``trusted_schema=OFF`` (no SQL functions or virtual tables smuggled in through views,
triggers or defaults), ``cell_size_check``, no memory-mapped I/O, ``query_only``, defensive
mode where Python exposes it, lowered limits and an optional deadline. Every SQLite failure
becomes an :class:`~traceguard.errors.InputError` that says what was wrong and what to do.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote

from traceguard.errors import InputError

SQLITE_MAGIC = b"SQLite format 3\x00"

#: Lowered limits: nsys exports have ~40 columns per table and short strings; nothing
#: legitimate comes close to these, and a hostile file cannot make us allocate more.
_LIMITS: tuple[tuple[str, int], ...] = (
    ("SQLITE_LIMIT_LENGTH", 64 * 1024 * 1024),
    ("SQLITE_LIMIT_SQL_LENGTH", 1_000_000),
    ("SQLITE_LIMIT_COLUMN", 500),
    ("SQLITE_LIMIT_EXPR_DEPTH", 100),
    ("SQLITE_LIMIT_COMPOUND_SELECT", 10),
    ("SQLITE_LIMIT_VDBE_OP", 25_000),
    ("SQLITE_LIMIT_FUNCTION_ARG", 8),
    ("SQLITE_LIMIT_ATTACHED", 0),
    ("SQLITE_LIMIT_LIKE_PATTERN_LENGTH", 50),
    ("SQLITE_LIMIT_VARIABLE_NUMBER", 100),
    ("SQLITE_LIMIT_TRIGGER_DEPTH", 10),
)

#: Pragmas applied to every connection we open on an untrusted file (sqlite3 and ADBC alike).
SAFE_PRAGMAS: tuple[str, ...] = (
    "PRAGMA trusted_schema=OFF",
    "PRAGMA cell_size_check=ON",
    "PRAGMA mmap_size=0",
    "PRAGMA query_only=ON",
)


def readonly_uri(path: Path) -> str:
    """``file:`` URI opening ``path`` read-only; the path is percent-encoded so that ``?``/``#``
    in a file name cannot inject URI parameters."""
    return f"file:{quote(str(Path(path).resolve()))}?mode=ro"


def check_header(path: Path) -> None:
    """Reject files that cannot be a complete SQLite database, before SQLite sees them.

    An empty file would otherwise open as an empty database, and a truncated one opens fine and
    fails only at the first page it lacks; the header states the database size, so compare.
    """
    try:
        size = path.stat().st_size
        with path.open("rb") as handle:
            header = handle.read(100)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    if size == 0:
        raise InputError(
            f"{path} is empty (0 bytes).",
            hint="the export was probably interrupted; run `nsys export --type sqlite` again",
        )
    if not header.startswith(SQLITE_MAGIC):
        raise InputError(
            f"{path} is not a SQLite database (no 'SQLite format 3' header).",
            hint="pass the output of `nsys export --type sqlite`, a .nsys-rep, or a Kineto JSON",
        )
    if len(header) < 100:
        raise InputError(f"{path} is truncated: only {size} bytes, shorter than a SQLite header.")
    page_size = int.from_bytes(header[16:18], "big")
    page_size = 65536 if page_size == 1 else page_size
    page_count = int.from_bytes(header[28:32], "big")
    # The in-header size is valid only when "version-valid-for" equals the change counter.
    if header[92:96] == header[24:28] and page_count and size < page_size * page_count:
        raise InputError(
            f"{path} is truncated: its header describes {page_size * page_count} bytes but the file has {size}.",
            hint="copy or download the file again, or re-run `nsys export --type sqlite`",
        )


def wrap_sqlite_error(path: Path | str, exc: BaseException) -> InputError:
    """Turn a SQLite (or ADBC) failure into an InputError naming the cause and the remedy."""
    text = str(exc).strip() or type(exc).__name__
    lowered = text.lower()
    if "not a database" in lowered:
        what = "is not a SQLite database"
    elif "malformed" in lowered or "corrupt" in lowered:
        what = "is a damaged SQLite database (truncated or corrupt)"
    elif "decode" in lowered or "utf-8" in lowered:
        what = "holds text that is not UTF-8 (damaged or not written by nsys)"
    elif "interrupted" in lowered:
        what = "took longer to read than the time limit allows"
    else:
        what = "could not be read as SQLite"
    return InputError(
        f"{path} {what}: {text}",
        hint="re-export it with `nsys export --type sqlite -o X.sqlite X.nsys-rep` or copy it again",
    )


def lenient_text(data: bytes) -> str:
    """SQLite TEXT as str, bytes that are not UTF-8 replaced (U+FFFD): a file's text (schema, names,
    metadata) cannot make a read fail by its encoding alone."""
    return data.decode("utf-8", errors="replace")


def sqlite_limits() -> list[tuple[int, int]]:
    """:data:`_LIMITS` as (SQLite's category number, value) pairs, for readers outside :mod:`sqlite3`."""
    return [(category, value) for name, value in _LIMITS if (category := getattr(sqlite3, name, None)) is not None]


def _apply_limits(conn: sqlite3.Connection) -> None:
    if not hasattr(conn, "setlimit"):  # Python < 3.11
        return
    for category, value in sqlite_limits():
        conn.setlimit(category, value)


def open_readonly(path: Path, *, quick_check: bool = False, deadline: float | None = None) -> sqlite3.Connection:
    """Open ``path`` read-only and hardened; ``deadline`` (seconds) interrupts long queries.

    ``quick_check`` runs ``PRAGMA quick_check`` (reads every page: O(file size)) and raises
    InputError unless it says "ok".
    """
    path = Path(path)
    check_header(path)
    try:
        conn = sqlite3.connect(readonly_uri(path), uri=True, check_same_thread=False)
    except sqlite3.Error as exc:
        raise wrap_sqlite_error(path, exc) from exc
    conn.text_factory = lenient_text
    try:
        if hasattr(conn, "setconfig") and hasattr(sqlite3, "SQLITE_DBCONFIG_DEFENSIVE"):
            conn.setconfig(sqlite3.SQLITE_DBCONFIG_DEFENSIVE, True)  # Python 3.12+
        _apply_limits(conn)
        for pragma in SAFE_PRAGMAS:
            conn.execute(pragma)
        if deadline is not None:
            stop_at = time.monotonic() + deadline
            conn.set_progress_handler(lambda: int(time.monotonic() > stop_at), 10_000)
        # Forces SQLite to read and parse the schema now, so a bad file fails here.
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        if quick_check:
            rows = [row[0] for row in conn.execute("PRAGMA quick_check")]
            if rows != ["ok"]:
                raise InputError(
                    f"{path} is a damaged SQLite database: quick_check reported {'; '.join(map(str, rows[:3]))}",
                    hint="copy the file again or re-run `nsys export --type sqlite`",
                )
    except (sqlite3.Error, UnicodeDecodeError) as exc:
        conn.close()
        raise wrap_sqlite_error(path, exc) from exc
    except InputError:
        conn.close()
        raise
    return conn


def real_tables(conn: sqlite3.Connection) -> set[str]:
    """Names of ordinary tables: never views (whose SQL the file's author wrote) and never
    virtual tables (whose module runs code)."""
    rows: Iterable[tuple[str, str | None]] = conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'")
    return {
        name
        for name, sql in rows
        if isinstance(name, str) and not (sql or "").lstrip().upper().startswith("CREATE VIRTUAL")
    }


def table_columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """Column names of ``table`` (assumed to be one of :func:`real_tables`)."""
    quoted = table.replace('"', '""')
    return [row[1] for row in conn.execute(f'PRAGMA table_info("{quoted}")')]
