"""The report's columnar side output: every rank's and every step's rows as Parquet, written as the
ranks are reduced (issue 30, ``docs/scale-out.md``).

A run of many ranks is reported by summary (:mod:`traceguard.report.summary`): the JSON report
carries the run, distributions over ranks and the worst ranks; the rows behind them go here, one
folder per table, one or more ``part-NNNNN.parquet`` files each (a partitioned folder: read it
with ``pl.scan_parquet("DIR/steps/*.parquet")``, DuckDB ``read_parquet('DIR/steps/*.parquet')`` or
pandas). :data:`TABLES` lists the tables; the report's ``detail.tables`` gives each one's columns,
types and rows.

Two moments write rows:

- **As each input's map arrives** (:meth:`DetailWriter.take`, the map's ``keep`` hook): the rows
  the reduce never reads — steps' phases, collectives per step, GPU→CPU copy offenders, timeline
  lanes — are buffered and written in parts; in summary mode they are then dropped from the
  rank's result (:func:`traceguard.metrics.run.lighten`), so the client holds each rank's
  metrics, step scalars and collective calls, not its rows.
- **After the reduce** (:meth:`DetailWriter.finish`): the rows the reduce completes (each rank's
  metrics with its wait split and last arrivals, each step with its wait fields, collectives with
  transfer bandwidth, peer rows).

An input mapped twice (its ranks were planned wrongly, ``traceguard.mapreduce``) or dropped keeps
only its last, used rows: :meth:`DetailWriter.finish` rewrites the parts that hold stale ones.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import orjson
import polars as pl

from traceguard.errors import InputError
from traceguard.mapreduce import MapOutcome
from traceguard.metrics.rank import RankResult
from traceguard.metrics.run import lighten
from traceguard.report.entries import rank_entry

#: Tables of the side output, and what a row is.
TABLES = {
    "ranks": "one rank: its scalar metrics (columns) and its whole report entry without the row lists (entry, JSON)",
    "steps": "one step of one rank: the step breakdown with its wait split (the report's step fields)",
    "phases": "one phase of one step of one rank: CPU, GPU and NCCL time",
    "collectives": "one (collective, payload) of one rank: calls, times, bandwidth",
    "collective_totals": "one collective type over one rank's analysis window: calls, time, exposed time, bytes",
    "collective_steps": "one collective type in one step of one rank: calls, time, exposed time, bytes",
    "peers": "one (rank, peer) pair: point-to-point kernels, time, sends, receives, bytes",
    "offenders": "one GPU→CPU copy issuer of one rank: NVTX range, API call, copies, bytes",
    "timelines": "one rank's timeline lanes (the report's timeline entry, as JSON text)",
}
#: The file that marks a folder as a side output (a default folder holding one may be replaced).
MARKER = "_traceguard_detail.json"
#: Rows buffered before a part is written (a part per this many rows of a table, at least).
PART_ROWS = 200_000
#: Ranks buffered before the parts are written, whatever their rows.
PART_RANKS = 128
#: Bytes of a table's buffered rows (Polars' estimate) before that table's part is written.
PART_BYTES = 4 << 20
#: A table's buffered frames merged into one once there are this many.
MERGE_FRAMES = 8


@dataclass
class Detail:
    """How much the report holds: ``full`` (every rank and step, version 1's report) or ``summary``
    (:mod:`traceguard.report.summary`), and the side output's ``folder`` and ``tables``
    (:meth:`DetailWriter.tables`) when one was written."""

    mode: str = "full"
    folder: Path | None = None
    tables: dict[str, Any] = field(default_factory=dict)


@dataclass
class _Part:
    path: Path
    #: input index → the generation of its rows in this part.
    inputs: dict[int, int]


@dataclass
class _Buffer:
    frames: list[pl.DataFrame] = field(default_factory=list)
    rows: int = 0
    size: int = 0
    inputs: dict[int, int] = field(default_factory=dict)


class DetailWriter:
    """Writes the side output into ``folder`` (created; must be empty or absent).

    ``lighten_results``: drop what was written from the ranks' results (summary mode); otherwise
    the results keep everything (a full report that also wants the Parquet)."""

    def __init__(self, folder: Path, *, lighten_results: bool, replace_previous: bool = False) -> None:
        self.folder = Path(folder)
        if replace_previous and (self.folder / MARKER).is_file():
            shutil.rmtree(self.folder)
        self._created = not self.folder.exists()
        if self.folder.exists() and (not self.folder.is_dir() or any(self.folder.iterdir())):
            raise InputError(
                f"the detail folder {self.folder} exists and is not empty",
                hint="give --detail-out a new or empty folder (the side output of one run)",
            )
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / MARKER).write_text(json.dumps({"tables": list(TABLES)}) + "\n")
        self.lighten_results = lighten_results
        self._generation: dict[int, int] = {}
        self._buffers: dict[str, _Buffer] = {}
        self._parts: dict[str, list[_Part]] = {}
        self._pending_ranks = 0
        self._counter = 0

    # -- as the map's outcomes arrive --------------------------------------------------------------

    def take(self, outcome: MapOutcome) -> MapOutcome:
        """The map's ``keep`` hook: buffer the rows the reduce never reads, return what it keeps."""
        generation = self._generation.get(outcome.index, -1) + 1
        self._generation[outcome.index] = generation
        if generation:  # mapped again: its earlier rows still buffered are stale (written parts: finish)
            self._unbuffer(outcome.index)
        for result in outcome.results:
            for table, frame in arrival_rows(result).items():
                self._add(table, frame, outcome.index, generation)
            self._pending_ranks += 1
        if self._pending_ranks >= PART_RANKS or any(b.rows >= PART_ROWS for b in self._buffers.values()):
            self._flush()
        if not self.lighten_results:
            return outcome
        return replace(outcome, results=[lighten(r) for r in outcome.results])

    # -- after the reduce ----------------------------------------------------------------------------

    def finish(
        self, results: list[RankResult], input_of: dict[int, int], paths: dict[int, str], used: frozenset[int]
    ) -> dict[str, Any]:
        """Write the rows the reduce completed, drop stale rows, and return ``detail.tables``:
        per table its folder (relative), columns with their types, and rows.

        ``input_of``: each rank's input index; ``paths``: each rank's input path as the report
        gives it; ``used``: the inputs whose results count."""
        for at, result in enumerate(results, 1):
            index = input_of.get(result.rank, -1)
            generation = self._generation.get(index, 0)
            for table, frame in reduced_rows(result, paths.get(result.rank)).items():
                self._add(table, frame, index, generation)
            if at % PART_RANKS == 0:  # a part at a time: the client never holds every rank's rows
                self._flush()
        self._flush()
        self._drop_stale(used)
        for table in TABLES:
            self._unify(table)
        return self.tables()

    def tables(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for table in TABLES:
            files = sorted((self.folder / table).glob("*.parquet"))
            if not files:
                out[table] = {"path": f"{table}/", "rows": 0, "columns": {}}
                continue
            schema = pl.read_parquet_schema(files[0])
            rows = pl.scan_parquet(files).select(pl.len()).collect().item()
            out[table] = {
                "path": f"{table}/",
                "rows": int(rows),
                "columns": {name: str(dtype) for name, dtype in schema.items()},
            }
        return out

    def discard(self) -> None:
        """Remove what this writer wrote (the analysis made no report): its tables and marker, and
        the folder itself when the writer created it."""
        if self._created:
            shutil.rmtree(self.folder, ignore_errors=True)
            return
        for table in TABLES:
            shutil.rmtree(self.folder / table, ignore_errors=True)
        (self.folder / MARKER).unlink(missing_ok=True)

    # -- parts -------------------------------------------------------------------------------------

    def _add(self, table: str, frame: pl.DataFrame, index: int, generation: int) -> None:
        if frame.height == 0:
            return
        buffer = self._buffers.setdefault(table, _Buffer())
        buffer.frames.append(frame.with_columns(pl.lit(index, dtype=pl.Int32).alias("input_index")))
        buffer.rows += frame.height
        buffer.size += frame.estimated_size()
        buffer.inputs[index] = generation
        if len(buffer.frames) >= MERGE_FRAMES:
            # Many small frames cost far more than their rows (64 ranks' step rows: +58 MB as frames
            # of one rank each, +5 MB merged): the buffer is kept as one contiguous frame.
            buffer.frames = [pl.concat(buffer.frames, how="diagonal_relaxed", rechunk=True)]
        if buffer.size >= PART_BYTES:  # a table of large rows (timelines): its own part at once
            self._flush(only=table)

    def _unbuffer(self, index: int) -> None:
        for buffer in self._buffers.values():
            if index in buffer.inputs:
                buffer.frames = [f.filter(pl.col("input_index") != index) for f in buffer.frames]
                buffer.rows = sum(f.height for f in buffer.frames)
                del buffer.inputs[index]

    def _flush(self, only: str | None = None) -> None:
        for table, buffer in list(self._buffers.items()):
            if only is not None and table != only:
                continue
            if buffer.frames:
                folder = self.folder / table
                folder.mkdir(exist_ok=True)
                path = folder / f"part-{self._counter:05d}.parquet"
                self._counter += 1
                # No statistics on the timelines' JSON text: min/max of 100 kB strings help no query
                # and cost their writer tens of MB.
                frame = pl.concat(buffer.frames, how="diagonal_relaxed")
                frame.write_parquet(path, statistics=table != "timelines")
                self._parts.setdefault(table, []).append(_Part(path, dict(buffer.inputs)))
            del self._buffers[table]
        if only is None:
            self._pending_ranks = 0

    def _unify(self, table: str) -> None:
        """Give every part of ``table`` the same columns and types (a column all null in one part
        and typed in another, one present in some parts only), so that one ``scan_parquet`` of the
        folder, or DuckDB's ``read_parquet``, reads them all: each part that differs is rewritten
        with the relaxed union of the parts' schemas."""
        files = sorted((self.folder / table).glob("*.parquet"))
        schemas = [pl.read_parquet_schema(f) for f in files]
        if len(files) < 2 or all(s == schemas[0] for s in schemas):
            return
        target = pl.concat([pl.scan_parquet(f) for f in files], how="diagonal_relaxed").collect_schema()
        for path, schema in zip(files, schemas, strict=True):
            if schema == dict(target):
                continue
            part = pl.read_parquet(path)
            columns = [
                pl.col(name).cast(dtype) if name in part.columns else pl.lit(None, dtype=dtype).alias(name)
                for name, dtype in target.items()
            ]
            part.select(columns).write_parquet(path, statistics=True)

    def _drop_stale(self, used: frozenset[int]) -> None:
        """Rewrite the parts holding rows of an input mapped again since, or not used at all."""
        for parts in self._parts.values():
            for part in parts:
                stale = [i for i, g in part.inputs.items() if i not in used or g != self._generation.get(i)]
                if not stale:
                    continue
                kept = pl.read_parquet(part.path).filter(~pl.col("input_index").is_in(stale))
                if kept.height:
                    kept.write_parquet(part.path, statistics=True)
                else:
                    part.path.unlink()


def arrival_rows(result: RankResult) -> dict[str, pl.DataFrame]:
    """The rows of a rank the reduce never reads, as frames (each with ``rank``)."""
    rank = result.rank
    phases = [
        {"rank": rank, "position": position, "index": step.get("index"), "phase": name, **values}
        for position, step in enumerate(result.steps)
        for name, values in (step.get("phases") or {}).items()
    ]
    by_type = [{"rank": rank, **row} for row in (result.collectives_by_type or {}).get("steps", [])]
    offenders = [{"rank": rank, **row} for row in result.gpu_to_cpu_offenders]
    timeline = [{"rank": rank, "timeline": json.dumps(result.timeline)}] if result.timeline else []
    return {
        "phases": _frame(phases),
        "collective_steps": _frame(by_type),
        "offenders": _frame(offenders),
        "timelines": _frame(timeline),
    }


def reduced_rows(result: RankResult, input_path: str | None) -> dict[str, pl.DataFrame]:
    """The rows of a rank the reduce completes (after :func:`traceguard.metrics.run.reduce_results`),
    from its report entry (:func:`traceguard.report.document.rank_entry`, JSON-safe): ``ranks``
    holds the scalar metrics as columns and the entry without its row lists as JSON text (``entry``),
    so :func:`rank_entries` gives back the report's rank entry exactly."""
    entry = orjson.loads(orjson.dumps(rank_entry(result, input_path), option=orjson.OPT_SERIALIZE_NUMPY))
    rank = result.rank
    metrics: dict[str, Any] = {"rank": rank, "step_source": entry["step_source"], "input": input_path}
    for key, value in entry["metrics"].items():
        if key != "null_reasons" and not isinstance(value, dict | list):
            metrics[key] = value
    steps = [
        {"rank": rank, "position": at, **{k: v for k, v in step.items() if k != "phases"}}
        for at, step in enumerate(entry["steps"])
    ]
    collectives = [{**row, "rank": rank} for row in entry["collectives"]]  # the report's rows name their rank
    totals = [
        {"rank": rank, **{k: (json.dumps(v) if isinstance(v, dict) else v) for k, v in row.items()}}
        for row in entry["collectives_by_type"]["totals"]
    ]
    skeleton = {
        **entry,
        "steps": [],
        "collectives": [],
        "collectives_by_type": {**entry["collectives_by_type"], "steps": []},
    }
    metrics["entry"] = orjson.dumps(skeleton).decode()
    return {
        "ranks": _frame([metrics]),
        "steps": _frame(steps),
        "collectives": _frame(collectives),
        "collective_totals": _frame(totals),
        "peers": _frame(list(entry["peers"].get("rows", []))),
    }


def rank_entries(folder: Path, *, batch: int = 64) -> Iterator[list[dict[str, Any]]]:
    """The report's rank entries of every rank in a side output, in rank order, ``batch`` ranks at a
    time (what the store writes for a report by summary, without the whole run in memory)."""
    ranks_table = scan(folder, "ranks")
    if ranks_table is None:
        return
    every = ranks_table.select("rank", "entry").collect().sort("rank")
    for start in range(0, every.height, batch):
        chunk = every.slice(start, batch)
        wanted = chunk["rank"].to_list()
        steps = _rows_by_rank(folder, "steps", wanted, ["position"])
        phases = _rows_by_rank(folder, "phases", wanted, ["position"])
        collectives = _rows_by_rank(folder, "collectives", wanted, [], keep_rank=True)
        by_step = _rows_by_rank(folder, "collective_steps", wanted, [])
        out = []
        for rank, text in chunk.rows():
            entry = orjson.loads(text)
            own_phases: dict[int, dict[str, Any]] = {}
            for row in phases.get(rank, []):
                own_phases.setdefault(row.pop("position"), {})[row.pop("phase")] = _no_index(row)
            entry["steps"] = [
                {**{k: v for k, v in step.items() if k != "position"}, "phases": own_phases.get(step["position"], {})}
                for step in steps.get(rank, [])
            ]
            entry["collectives"] = collectives.get(rank, [])
            entry["collectives_by_type"]["steps"] = by_step.get(rank, [])
            out.append(entry)
        yield out


def _no_index(row: dict[str, Any]) -> dict[str, Any]:
    row.pop("index", None)
    return row


def _rows_by_rank(
    folder: Path, table: str, ranks: list[int], order: list[str], *, keep_rank: bool = False
) -> dict[int, list[dict[str, Any]]]:
    """The rows of ``ranks`` in ``table``, per rank, without ``input_index`` (and without ``rank``
    unless ``keep_rank``: the report's rows of that table name their rank), in the order they
    were written (then by ``order``)."""
    lazy = scan(folder, table)
    if lazy is None:
        return {}
    frame = lazy.filter(pl.col("rank").is_in(ranks)).collect()
    if order:
        frame = frame.sort(["rank", *order], maintain_order=True)
    out: dict[int, list[dict[str, Any]]] = {}
    for row in frame.drop("input_index").to_dicts():
        out.setdefault(row["rank"] if keep_rank else row.pop("rank"), []).append(row)
    return out


def _frame(rows: list[dict[str, Any]]) -> pl.DataFrame:
    """Rows as a frame, every column's type from all its rows (a first row of nulls is common)."""
    return pl.DataFrame(rows, infer_schema_length=None) if rows else pl.DataFrame()


def remove(folder: Path) -> None:
    """Delete a side output (the service drops it once its rows are stored)."""
    shutil.rmtree(folder, ignore_errors=True)


def scan(folder: Path, table: str) -> pl.LazyFrame | None:
    """One table of a side output, lazily (None when it has no rows)."""
    files = sorted((Path(folder) / table).glob("*.parquet"))
    return pl.scan_parquet(files) if files else None
