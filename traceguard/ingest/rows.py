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


#: What PyTorch's ``emit_nvtx`` appends to the name of a call with an autograd sequence number:
#: an operator or an autograd node, never a ``record_function`` scope (``getNvtxStr``).
SEQ_MARK = ", seq = "
#: What ``emit_nvtx`` appends to every range it opens, scopes included.
OP_ID_MARK = ", op_id = "


@dataclass(frozen=True)
class Skip:
    """Rows to leave out but count: those whose ``column`` is a text starting with ``prefix``
    (ASCII, so that SQLite's character ``substr`` is the C reader's byte compare), counted per
    value of ``count_by`` (None: all together). ``operators``: also the texts ``emit_nvtx``
    writes for an operator or autograd node whatever its namespace: those holding
    :data:`SEQ_MARK`, and those holding :data:`OP_ID_MARK` that start with an operator
    namespace (lowercase letters, digits and ``_``, then ``::``: ``c10d::alltoall_base_``,
    ``flash_attn::_flash_attn_forward``; ``FSDP::pre_forward (...)`` is a scope and stays).
    The C reader tests the same bytes (``_int_scan.c``, ``tree_operator_text``)."""

    column: str
    prefix: str
    count_by: str | None = None
    operators: bool = False

    def __post_init__(self) -> None:
        if not self.prefix or not self.prefix.isascii() or "'" in self.prefix:
            raise ValueError(f"a skip prefix is a non-empty ASCII text without quotes, not {self.prefix!r}")

    def matches(self) -> str:
        """The SQL test of a skipped row."""
        column = self.column
        prefixed = f"substr({column}, 1, {len(self.prefix)}) = '{self.prefix}'"
        if self.operators:
            namespace = f"substr({column}, 1, instr({column}, '::') - 1)"
            prefixed = (
                f"{prefixed} OR instr({column}, '{SEQ_MARK}') > 0 OR (instr({column}, '{OP_ID_MARK}') > 0"
                f" AND instr({column}, '::') > 1 AND {namespace} NOT GLOB '*[^a-z0-9_]*')"
            )
        return f"typeof({column}) = 'text' AND ({prefixed})"


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
    #: Rows of those left out and counted instead (the nsys reader's ``bulk`` gives the counts).
    skip: Skip | None = None

    def where(self, *, skipped: bool = False) -> str:
        """The SQL of the rows read; ``skipped``: of the rows :attr:`skip` leaves out instead."""
        conditions = []
        if self.ranges is not None:
            spans = [f"({self.rowid} >= {int(a)} AND {self.rowid} < {int(b)})" for a, b in self.ranges]
            conditions.append(" OR ".join(spans) if spans else "0")
        if self.column is not None:
            # The range test first: SQLite skips the IN lookup (a b-tree probe) for names outside it.
            low, high = (min(self.values), max(self.values)) if self.values else (0, -1)
            column = self.column
            conditions.append(f"{column} BETWEEN {int(low)} AND {int(high)} AND {column} IN ({int_list(self.values)})")
        if self.skip is not None:
            conditions.append(self.skip.matches() if skipped else f"NOT ({self.skip.matches()})")
        return "WHERE " + " AND ".join(f"({c})" for c in conditions) if conditions else ""
