"""The report's loops over per-step rows: is every row JSON as it is, and each row in the
contract's keys. A long run's report is mostly such rows (the CUDA-graph shape of
``bench/RESULTS.md``: 68 k steps of 28 values and two phase dicts each), so both run in C
(``_rows.c``) where it was built; the Python versions below give the same answers."""

from __future__ import annotations

import itertools
import math
from typing import Any

try:  # the optional C extension (setup.py); the loops below otherwise
    from traceguard.report import _rows as _native
except ImportError:  # pragma: no cover - exercised where the extension is not built
    _native = None

#: Values JSON holds as they are (``bool`` is an ``int`` to ``isinstance``, not to ``type``).
_PLAIN = frozenset({int, str, bool, type(None)})


def plain_rows(rows: list[Any]) -> bool:
    """Whether every row is a dict of str keys whose values (and those of dicts inside, two levels
    deep: a step's ``phases``) are ints, strs, bools, None or finite floats: what the report's
    cleaning would leave as it is. Anything else (NaN, a tuple, a numpy scalar) says no.

    In C, a walk over the dicts (68 k step rows: 0.01 s); else checked by value type over all the
    rows' values at once (``map``/``set`` loops in C: 0.25 s)."""
    if _native is not None:
        return bool(_native.plain_rows(rows))
    return python_plain_rows(rows)


def python_plain_rows(rows: list[Any]) -> bool:
    """:func:`plain_rows` without the extension."""
    if set(map(type, rows)) - {dict}:
        return False
    return _plain_values(rows, depth=0)


def _plain_values(dicts: list[dict[Any, Any]], depth: int) -> bool:
    """:func:`plain_rows` of dicts known to be dicts: their keys str, their values plain, and any
    dict among the values (up to two levels below the rows) plain too."""
    if set(map(type, itertools.chain.from_iterable(dicts))) - {str}:
        return False
    values = list(itertools.chain.from_iterable(map(dict.values, dicts)))
    kinds = set(map(type, values))
    if kinds - _PLAIN - {float, dict}:
        return False
    if float in kinds and not all(map(math.isfinite, [v for v in values if type(v) is float])):
        return False
    if dict in kinds:
        return depth < 2 and _plain_values([v for v in values if type(v) is dict], depth + 1)
    return True


def project_rows(rows: list[dict[str, Any]], keys: tuple[str, ...], defaults: dict[str, Any]) -> list[dict[str, Any]]:
    """Each row as a new dict of ``keys`` in that order: the row's value, else ``defaults``'s,
    else None. In C where built (68 k step rows of 29 keys: 0.05 s, not 0.18 s)."""
    if _native is not None:
        return list(_native.project_rows(rows, keys, defaults))
    return python_project_rows(rows, keys, defaults)


def python_project_rows(
    rows: list[dict[str, Any]], keys: tuple[str, ...], defaults: dict[str, Any]
) -> list[dict[str, Any]]:
    """:func:`project_rows` without the extension (zip of map: no per-key Python loop)."""
    fallback = [defaults.get(key) for key in keys]
    return [dict(zip(keys, map(row.get, keys, fallback), strict=True)) for row in rows]
