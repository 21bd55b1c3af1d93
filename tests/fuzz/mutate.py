"""Mutators for the fuzz suite: each takes a real input and a seeded ``random.Random`` and returns
a damaged copy (bytes flipped, truncated, duplicated, zeroed, non-UTF-8 inserted; JSON values
replaced or removed; text lines dropped, repeated or garbled; SQLite cells replaced, tables and
columns dropped, schema text and string columns made non-UTF-8). Deterministic for a given seed."""

from __future__ import annotations

import json
import random
import shutil
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Bytes that are not UTF-8 on their own (lone continuation bytes, overlong lead, surrogates).
NON_UTF8 = (b"\xff", b"\xfe", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf8\x88\x80\x80\x80")
#: Values that break assumptions: types, signs, widths, special floats, long and odd strings.
ODD_VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    2**31,
    2**63 - 1,
    -(2**63),
    2**64,
    10**30,
    1.5,
    -0.0,
    1e308,
    "",
    "x",
    "-1",
    "1e999",
    "NaN",
    "0x10",
    "\u0000",
    "\ud7ff\ue000",
    "[ncclDevKernel]",
    "a" * 5000,
    [],
    [1, "2", None],
    {},
    {"a": {"b": []}},
    True,
)


def _span(rng: random.Random, size: int) -> tuple[int, int]:
    start = rng.randrange(size)
    return start, min(size, start + rng.choice((1, 2, 4, 8, 64, 512, 4096)))


def flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    for _ in range(rng.choice((1, 2, 8, 32))):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def truncate(data: bytes, rng: random.Random) -> bytes:
    return data[: rng.randrange(len(data))]


def duplicate(data: bytes, rng: random.Random) -> bytes:
    start, end = _span(rng, len(data))
    at = rng.randrange(len(data) + 1)
    return data[:at] + data[start:end] + data[at:]


def zero(data: bytes, rng: random.Random) -> bytes:
    start, end = _span(rng, len(data))
    return data[:start] + bytes(end - start) + data[end:]


def non_utf8(data: bytes, rng: random.Random) -> bytes:
    out = data
    for _ in range(rng.choice((1, 3))):
        at = rng.randrange(len(out) + 1)
        out = out[:at] + rng.choice(NON_UTF8) + out[at:]
    return out


def random_bytes(data: bytes, rng: random.Random) -> bytes:
    start, end = _span(rng, len(data))
    return data[:start] + rng.randbytes(end - start) + data[end:]


BYTE_MUTATORS: tuple[Callable[[bytes, random.Random], bytes], ...] = (
    flip,
    truncate,
    duplicate,
    zero,
    non_utf8,
    random_bytes,
)


def mutate_bytes(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    if not data:
        return "random_bytes", rng.randbytes(rng.randrange(1, 64))
    mutator = rng.choice(BYTE_MUTATORS)
    return mutator.__name__, mutator(data, rng)


# -- text (NCCL logs, nvidia-smi output, nccl-tests output, manifests) ------------------------------


def mutate_text(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """A line-level change (most of the time) or a byte-level one."""
    lines = data.split(b"\n")
    if len(lines) < 2 or rng.random() < 0.3:
        return mutate_bytes(data, rng)
    i = rng.randrange(len(lines))
    how = rng.choice(("drop", "repeat", "swap", "numbers", "cut", "merge", "odd"))
    if how == "drop":
        del lines[i]
    elif how == "repeat":
        lines[i:i] = [lines[i]] * rng.choice((1, 2, 50))
    elif how == "swap":
        j = rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    elif how == "numbers":
        replacement = rng.choice((b"-1", b"0", b"99999999999999999999", b"1e999", b"nan", b"", b"-", b"0x7f"))
        lines[i] = bytes(
            b"".join(replacement if 48 <= c <= 57 and rng.random() < 0.5 else bytes([c]) for c in lines[i])
        )
    elif how == "cut":
        lines[i] = lines[i][: rng.randrange(len(lines[i]) + 1)]
    elif how == "merge" and i + 1 < len(lines):
        lines[i : i + 2] = [lines[i] + lines[i + 1]]
    else:
        odd = rng.choice((b"\x00", b"\xff\xfe", b"\t\t", b"[", b"]", b"%", b"|", b"NCCL INFO", b"\x1b[0m"))
        at = rng.randrange(len(lines[i]) + 1)
        lines[i] = lines[i][:at] + odd + lines[i][at:]
    return f"line_{how}", b"\n".join(lines)


# -- JSON (Kineto traces, manifests) ------------------------------------------------------------------


def _containers(doc: Any, limit: int = 20000) -> list[Any]:
    found: list[Any] = []
    stack = [doc]
    while stack and len(found) < limit:
        node = stack.pop()
        if isinstance(node, dict | list) and node:
            found.append(node)
            stack.extend(node.values() if isinstance(node, dict) else node)
    return found


def mutate_json_doc(doc: Any, rng: random.Random) -> str:
    """Change the parsed document in place; returns what was done."""
    containers = _containers(doc)
    if not containers:
        return "nothing"
    changes = []
    for _ in range(rng.choice((1, 1, 3, 20))):
        node = rng.choice(containers)
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        how = rng.choice(("replace", "replace", "delete", "wrap"))
        if how == "delete" and len(node) > 0:
            del node[key]
        elif how == "wrap":
            node[key] = [node[key]]
        else:
            node[key] = rng.choice(ODD_VALUES)
        changes.append(how)
        if not node:
            break
    return "json_" + "+".join(sorted(set(changes)))


def mutate_json(data: bytes, rng: random.Random) -> tuple[str, bytes]:
    """Replace or remove values in the JSON document (most of the time), or damage its bytes."""
    if rng.random() < 0.4:
        return mutate_bytes(data, rng)
    try:
        doc = json.loads(data)
    except ValueError:
        return mutate_bytes(data, rng)
    how = mutate_json_doc(doc, rng)
    return how, json.dumps(doc, allow_nan=True).encode()


# -- SQLite (nsys exports) ----------------------------------------------------------------------------

SQL_VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    2**63 - 1,
    -(2**63),
    1.5,
    float("inf"),
    "",
    "text",
    "\u00e9\u00e8",
    b"\xff\xfe",
    b"",
    bytes(64),
)


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
    return [r[0].decode("utf-8", "replace") for r in rows]


def string_columns(conn: sqlite3.Connection) -> list[tuple[str, str]]:
    """(table, column) of every column that holds text in some row, or is declared TEXT: every
    string-bearing column of the export (StringIds, NVTX text, TARGET_INFO names, metadata, enums)."""
    found = []
    for table in _tables(conn):
        if table.startswith("sqlite_"):
            continue
        quoted = table.replace('"', '""')
        for _, name, declared, *_ in conn.execute(f'PRAGMA table_info("{quoted}")'):
            column = name.decode() if isinstance(name, bytes) else name
            kind = (declared.decode() if isinstance(declared, bytes) else declared or "").upper()
            col = column.replace('"', '""')
            holds_text = conn.execute(f'SELECT 1 FROM "{quoted}" WHERE typeof("{col}") = \'text\' LIMIT 1').fetchone()
            if holds_text or "TEXT" in kind or "CHAR" in kind:
                found.append((table, column))
    return found


#: How text that is not UTF-8 gets into an export: bytes appended to a TEXT value (a writer that
#: does not validate), or the cell replaced by the BLOB x'00ff' (issue 25: a damaged file).
NOT_UTF8_VARIANTS = ("appended", "replaced")


def inject_not_utf8(conn: sqlite3.Connection, variant: str, columns: list[tuple[str, str]], every: int = 1) -> int:
    """Make the text of ``columns`` not UTF-8 in every ``every``-th row (by rowid); returns the
    cells changed."""
    changed = 0
    for table, column in columns:
        quoted, col = table.replace('"', '""'), column.replace('"', '""')
        value = f"CAST(CAST(\"{col}\" AS BLOB) || x'ff' AS TEXT)" if variant == "appended" else "x'00ff'"
        rows = f"rowid % {every} = 0 AND " if every > 1 else ""
        try:
            cursor = conn.execute(f'UPDATE "{quoted}" SET "{col}" = {value} WHERE {rows}typeof("{col}") = \'text\'')
        except sqlite3.IntegrityError:  # a UNIQUE text column: bytes appended to every value stay unique
            continue
        changed += cursor.rowcount
    return changed


def mutate_sqlite(source: Path, target: Path, rng: random.Random) -> str:
    """Write a damaged copy of the SQLite file ``source`` to ``target``; returns what was done."""
    if rng.random() < 0.35:
        how, data = mutate_bytes(source.read_bytes(), rng)
        target.write_bytes(data)
        return f"bytes_{how}"
    shutil.copyfile(source, target)
    conn = sqlite3.connect(target, isolation_level=None)
    conn.text_factory = bytes
    try:
        tables = _tables(conn)
        how = rng.choice(
            ("cells", "cells", "cells", "drop_table", "empty_table", "drop_column", "schema_text", "strings_not_utf8")
        )
        table = rng.choice(tables)
        quoted = table.replace('"', '""')
        if how == "strings_not_utf8":  # issue 25: text that is not UTF-8 in a string column
            columns = string_columns(conn)
            picked = rng.sample(columns, min(len(columns), rng.choice((1, 3, len(columns) or 1))))
            inject_not_utf8(conn, rng.choice(NOT_UTF8_VARIANTS), picked, rng.choice((1, 2, 7)))
            return f"sqlite_{how}"
        if how == "cells":
            columns = [r[1].decode() for r in conn.execute(f'PRAGMA table_info("{quoted}")')]
            count = conn.execute(f'SELECT count(*) FROM "{quoted}"').fetchone()[0]
            if not columns or not count:
                how = "drop_table"
            else:
                for _ in range(rng.choice((1, 5, 50))):
                    column = rng.choice(columns).replace('"', '""')
                    value = rng.choice(SQL_VALUES)
                    row = f'SELECT rowid FROM "{quoted}" LIMIT 1 OFFSET {rng.randrange(count)}'
                    where = "" if rng.random() < 0.1 else f"WHERE rowid IN ({row})"
                    try:
                        conn.execute(f'UPDATE "{quoted}" SET "{column}" = ? {where}', (value,))
                    except sqlite3.IntegrityError:  # NOT NULL / UNIQUE: a value nsys could not write either
                        continue
        if how == "drop_table":
            conn.execute(f'DROP TABLE "{quoted}"')
        elif how == "empty_table":
            conn.execute(f'DELETE FROM "{quoted}"')
        elif how == "drop_column":
            columns = [r[1].decode() for r in conn.execute(f'PRAGMA table_info("{quoted}")')]
            if len(columns) > 1:
                column = rng.choice(columns).replace('"', '""')
                try:
                    conn.execute(f'ALTER TABLE "{quoted}" DROP COLUMN "{column}"')
                except sqlite3.OperationalError:  # a key or indexed column: drop the table instead
                    conn.execute(f'DROP TABLE "{quoted}"')
        elif how == "schema_text":
            # The schema's SQL text made invalid UTF-8 (the crash class of issue 15).
            conn.execute("PRAGMA writable_schema=ON")
            # Inside a trailing comment the schema still parses; appended bare it does not.
            bad = rng.choice(NON_UTF8[:4])
            tail = b" /*" + bad + b"*/" if rng.random() < 0.7 else bad
            conn.execute(
                "UPDATE sqlite_master SET sql = CAST(CAST(sql AS BLOB) || ? AS TEXT) WHERE name = ?", (tail, table)
            )
        return f"sqlite_{how}"
    finally:
        conn.close()
