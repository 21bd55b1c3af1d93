"""One line saying where each rank's steps came from (DESIGN.md "Steps"), for report headers."""

from __future__ import annotations

from typing import Any

_MEANING = {
    "pattern": "a step pattern",
    "convention": "the training loop's own marker",
    "inferred": "inferred from the periodic GPU work, no step marker",
    "window": "each rank's whole GPU window as one step, no step marker and no periodic structure",
    None: "none found",
}


def _ranks(ranks: list[int]) -> str:
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}–{ranks[-1]}"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def step_sources_line(doc: dict[str, Any]) -> str | None:
    """``Steps: ranks 0–7: inferred from ... (1804 kernels per iteration)``; None without ranks."""
    groups: dict[tuple[str | None, str | None], list[int]] = {}
    for rank in doc.get("ranks", []):
        groups.setdefault((rank.get("step_source"), rank.get("step_detail")), []).append(rank["rank"])
    if not groups:
        return None
    parts = []
    for (source, detail), ranks in groups.items():
        text = _MEANING.get(source, str(source))
        if detail:
            text += f" ({detail})"
        parts.append(text if len(groups) == 1 else f"{_ranks(ranks)}: {text}")
    return "Steps: " + "; ".join(parts)
