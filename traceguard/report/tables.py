"""Markdown tables, the one helper every Markdown renderer of ``report/`` shares (the report,
its workload section, the NCCL transport summary, the sweep table). A module of its own, below
them all, so that none imports another renderer for it (``tests/report/test_import_graph.py``)."""

from __future__ import annotations


def table(header: list[str], rows: list[list[str]]) -> list[str]:
    """A Markdown table's lines; a ``|`` inside a cell is escaped."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return out
