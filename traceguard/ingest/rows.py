"""Which rows of a table a read takes, in a form both of the nsys reader's readers take: SQLite
(as SQL) and the b-tree reader (``_int_scan.table``, as it is)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


def int_list(values: Sequence[int]) -> str:
    """Integers as an SQL list (``NULL`` for none, which matches nothing); never text."""
    return ",".join(str(int(v)) for v in values) or "NULL"


#: The lowest rowid SQLite allows: a range from here means "every rowid up to".
LOWEST_ROWID = -(1 << 63)


@dataclass(frozen=True)
class Rows:
    """Which rows of a table a read takes, said so that both readers take the same ones: rowid
    ranges ``[lo, hi)`` in order (None: every row) and, with ``column``, only rows whose value
    there is one of ``values``. ``rowid`` is the name the rowid goes by in that table.
    :meth:`where` is the SQL of it, for SQLite; the nsys reader's ``bulk`` gives it to the
    b-tree reader as it is (``_int_scan.table``)."""

    ranges: tuple[tuple[int, int], ...] | None = None
    column: str | None = None
    values: tuple[int, ...] = ()
    rowid: str = "rowid"

    def where(self) -> str:
        conditions = []
        if self.ranges is not None:
            spans = [f"({self.rowid} >= {int(a)} AND {self.rowid} < {int(b)})" for a, b in self.ranges]
            conditions.append(" OR ".join(spans) if spans else "0")
        if self.column is not None:
            # The range test first: SQLite skips the IN lookup (a b-tree probe) for names outside it.
            low, high = (min(self.values), max(self.values)) if self.values else (0, -1)
            column = self.column
            conditions.append(f"{column} BETWEEN {int(low)} AND {int(high)} AND {column} IN ({int_list(self.values)})")
        return "WHERE " + " AND ".join(f"({c})" for c in conditions) if conditions else ""
