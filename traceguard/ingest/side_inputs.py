"""Side inputs: link measurements that sit next to a capture.

* ``nvidia-smi dmon`` (any ``-s`` groups, ``-o DT``/``-o T``, ``--format csv``): one row per GPU
  per sample. Columns and units come from the two ``#`` header lines that dmon repeats every few
  lines (``# gpu pwr gtemp ... rxpci txpci`` / ``# Idx W C ... MB/s MB/s``); ``-`` is "not
  available". ``-s t`` gives ``rxpci``/``txpci`` in MB/s (PCIe, host side of the GPU's link).
* nccl-tests tables (``all_reduce_perf`` and friends) and the same format printed by
  :mod:`traceguard.capture.bench_collectives`. Columns are read from the table's own header, so
  every generation parses: ``size count type redop root`` (2.13+), ``size count type redop``
  (no root), ``size count type root`` (old broadcast), ``size count type`` (2019), ``error``
  instead of ``#wrong``, ``cputime``, per-iteration ``i_*`` columns, a timestamp column, and
  tables whose in-place half comes first.
* ``nvidia-smi topo -m`` (with or without ANSI underline codes, tabs or spaces): GPU x GPU link
  kinds, NVLink pairs, CPU/NUMA affinity, NIC rows (``NIC0`` or old ``mlx5_0`` labels).
* ``nvidia-smi -q``: PCIe generation and width per GPU, for the rated PCIe speed.

Every parser skips lines it does not understand and raises :class:`InputError` only when nothing
at all could be read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any, Literal

import polars as pl

from traceguard.errors import InputError

__all__ = [
    "PCIE_LANE_MB_S",
    "Topology",
    "nccl_graph_max_bw",
    "parse_dmon",
    "parse_nccl_tests",
    "parse_topo",
    "pcie_link_from_smi_q",
    "pcie_saturation",
    "rated_pcie_mb_s",
    "sniff_side_input",
]

#: Terminal control sequences (CSI): nvidia-smi underlines the topo header when it believes it writes to a
#: terminal. Pasted into an issue they often arrive in caret notation (``^[[4m``, as ``cat -v`` and many
#: terminals copy them), which is stripped the same way.
_ANSI = re.compile(r"(?:\x1b|\^\[)\[[0-9;?]*[ -/]*[@-~]")
_NA = {"-", "N/A", "n/a", "NA", "na", "[N/A]", "[Not Supported]", "nan", "NaN", ""}


def _clean(text: str) -> list[str]:
    """Lines with ANSI escapes and carriage returns removed."""
    return _ANSI.sub("", text).replace("\r", "").split("\n")


def _num(token: str) -> float | None:
    """A float, or None for ``-``, ``N/A`` and anything else that is not a finite number."""
    if token in _NA:
        return None
    try:
        value = float(token)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


# --------------------------------------------------------------------------------------------
# nvidia-smi dmon

_DMON_TIME_COLS = {"date": "date", "time": "time"}


def _dmon_tokens(line: str) -> list[str]:
    return line.replace(",", " ").split()


def parse_dmon(text: str, *, long: bool = False) -> pl.DataFrame:
    """Parse ``nvidia-smi dmon`` output.

    Wide (default): ``gpu`` (Int64), ``sample`` (Int64, 0-based per GPU, in order of appearance),
    ``date``/``time`` (Utf8) when ``-o D``/``-o T`` was used, then one Float64 column per metric,
    named as in the header (``pwr``, ``sm``, ``rxpci``, ...; a repeated name gets ``_2``).
    Long (``long=True``): ``gpu, sample, metric, unit, value``. Units come from the ``# Idx`` line
    (``rxpci``/``txpci`` are MB/s). Rows whose token count does not match the current header are
    skipped. Raises InputError when no data row could be read.
    """
    names: list[str] | None = None
    # (gpu, time-column names, time values, metric names, metric values) per data row
    rows: list[tuple[int, list[str], list[str], list[str], list[float | None]]] = []
    all_names: dict[str, str] = {}  # metric -> unit, in first-seen order
    gpu_at = -1
    time_at: list[int] = []
    metric_at: list[int] = []
    metric_names: list[str] = []
    for raw in _clean(text):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            tokens = _dmon_tokens(line.lstrip("#"))
            lowered = [t.lower() for t in tokens]
            if "gpu" in lowered:
                names = tokens
                gpu_at = lowered.index("gpu")
                time_at = [i for i, t in enumerate(lowered) if t in _DMON_TIME_COLS]
                metric_at, metric_names, seen = [], [], {}
                for i, t in enumerate(tokens):
                    if i == gpu_at or i in time_at:
                        continue
                    seen[t] = seen.get(t, 0) + 1
                    metric_at.append(i)
                    metric_names.append(t if seen[t] == 1 else f"{t}_{seen[t]}")
            elif names is not None and "idx" in lowered and len(tokens) == len(names):
                for i, name in zip(metric_at, metric_names, strict=True):
                    if not all_names.get(name):
                        all_names[name] = tokens[i]
            continue
        if names is None:
            continue
        tokens = _dmon_tokens(line)
        if len(tokens) != len(names):
            continue
        gpu = _int(tokens[gpu_at]) if tokens[gpu_at].lstrip("-").isdigit() else None
        if gpu is None:  # not a GPU index (or a damaged one wider than 64 bits)
            continue
        for name in metric_names:
            all_names.setdefault(name, "")
        rows.append(
            (
                gpu,
                [_DMON_TIME_COLS[names[i].lower()] for i in time_at],
                [tokens[i] for i in time_at],
                list(metric_names),
                [_num(tokens[i]) for i in metric_at],
            )
        )
    if not rows:
        raise InputError(
            "no nvidia-smi dmon data rows found",
            hint="expected '# gpu ...' / '# Idx ...' header lines followed by one row per GPU",
        )
    counters: dict[int, int] = {}
    records: list[dict[str, Any]] = []
    for gpu, tnames, tvalues, mnames, mvalues in rows:
        sample = counters.get(gpu, 0)
        counters[gpu] = sample + 1
        rec: dict[str, Any] = {"gpu": gpu, "sample": sample}
        rec.update(zip(tnames, tvalues, strict=True))
        rec.update(zip(mnames, mvalues, strict=True))
        records.append(rec)
    has_date = any("date" in r for r in records)
    has_time = any("time" in r for r in records)
    schema: dict[str, Any] = {"gpu": pl.Int64, "sample": pl.Int64}
    if has_date:
        schema["date"] = pl.Utf8
    if has_time:
        schema["time"] = pl.Utf8
    for name in all_names:
        schema[name] = pl.Float64
    wide = pl.DataFrame(records, schema=schema)
    if not long:
        return wide
    metrics = list(all_names)
    out = wide.unpivot(index=["gpu", "sample"], on=metrics, variable_name="metric", value_name="value")
    unit_map = pl.DataFrame({"metric": metrics, "unit": [all_names[m] for m in metrics]})
    return out.join(unit_map, on="metric", how="left").select("gpu", "sample", "metric", "unit", "value")


# --------------------------------------------------------------------------------------------
# PCIe rates

#: Usable one-direction rate per lane in MB/s (after line encoding): Gen1/2 8b/10b, Gen3-5
#: 128b/130b, Gen6 FLIT/PAM4.
PCIE_LANE_MB_S: dict[int, float] = {1: 250.0, 2: 500.0, 3: 985.0, 4: 1969.0, 5: 3938.0, 6: 7877.0}


def rated_pcie_mb_s(gen: int, width: int) -> float:
    """Rated one-direction PCIe bandwidth in MB/s of a Gen ``gen`` x``width`` link."""
    if gen not in PCIE_LANE_MB_S:
        raise ValueError(f"unknown PCIe generation {gen!r} (known: {sorted(PCIE_LANE_MB_S)})")
    if width <= 0:
        raise ValueError(f"PCIe link width must be positive, got {width!r}")
    return PCIE_LANE_MB_S[gen] * width


def pcie_link_from_smi_q(text: str, which: Literal["max", "current"] = "max") -> dict[int, tuple[int, int]]:
    """``{gpu index: (generation, width)}`` from ``nvidia-smi -q`` text.

    GPUs are numbered in the order their ``GPU 0000:xx:yy.z`` sections appear (nvidia-smi lists
    them by index). ``which="max"`` (default) reads the ``Max`` entries, the link's rated
    capability; ``Current`` drops at idle (power saving), so it is the wrong denominator for a
    saturation check unless the GPU was busy when queried. GPUs whose values are ``N/A`` are left
    out.
    """
    key = "max" if which == "max" else "current"
    out: dict[int, tuple[int, int]] = {}
    gpu = -1
    section: str | None = None
    section_indent = -1
    gen: int | None = None
    width: int | None = None

    def flush() -> None:
        if gpu >= 0 and gen is not None and width is not None:
            out[gpu] = (gen, width)

    for raw in _clean(text):
        if not raw.strip():
            continue
        if re.match(r"^GPU [0-9A-Fa-f]+:[0-9A-Fa-f]+:[0-9A-Fa-f]+\.[0-9A-Fa-f]", raw):
            flush()
            gpu, gen, width, section = gpu + 1, None, None, None
            continue
        if gpu < 0:
            continue
        indent = len(raw) - len(raw.lstrip(" \t"))
        label, sep, value = raw.strip().partition(":")
        label, value = label.strip(), value.strip()
        if section is not None and indent <= section_indent:
            section = None
        if not sep:
            if label in ("PCIe Generation", "Link Width"):
                section, section_indent = label, indent
            continue
        if section is None or label.lower() != key:
            continue
        match = re.match(r"(\d+)", value)
        if not match:
            continue
        if section == "PCIe Generation":
            gen = int(match.group(1))
        else:
            width = int(match.group(1))
    flush()
    return out


def pcie_saturation(dmon: pl.DataFrame, rated_mb_s: dict[int, float] | float) -> dict[str, Any]:
    """PCIe load per GPU: peak and p95 of ``max(rxpci, txpci)`` over rated one-direction MB/s.

    ``rated_mb_s`` is one number for all GPUs or ``{gpu: MB/s}``. Returns ``{"per_gpu": {gpu:
    {"samples", "peak_mb_s", "p95_mb_s", "rated_mb_s", "peak", "p95"}}, "peak", "p95",
    "worst_gpu", "reason"}`` with fractions (0.3 = 30 %); p95 is linearly interpolated. ``peak``/
    ``p95`` are the worst GPU's and None, with ``reason`` set, when nothing can be computed.
    """
    if "metric" in dmon.columns and "value" in dmon.columns:  # long form
        dmon = dmon.pivot(on="metric", index=["gpu", "sample"], values="value", aggregate_function="first")
    result: dict[str, Any] = {"per_gpu": {}, "peak": None, "p95": None, "worst_gpu": None, "reason": None}
    cols = [c for c in ("rxpci", "txpci") if c in dmon.columns]
    if not cols or "gpu" not in dmon.columns:
        result["reason"] = "dmon output has no rxpci/txpci columns (run nvidia-smi dmon -s t)"
        return result
    load = dmon.select(pl.col("gpu"), pl.max_horizontal(*[pl.col(c).cast(pl.Float64) for c in cols]).alias("load"))
    stats = (
        load.drop_nulls("load")
        .group_by("gpu")
        .agg(
            pl.len().alias("samples"),
            pl.col("load").max().alias("peak"),
            pl.col("load").quantile(0.95, interpolation="linear").alias("p95"),
        )
        .sort("gpu")
    )
    if stats.height == 0:
        result["reason"] = "every rxpci/txpci value in the dmon output is unavailable ('-')"
        return result
    missing: list[int] = []
    for row in stats.iter_rows(named=True):
        gpu = int(row["gpu"])
        rated = rated_mb_s.get(gpu) if isinstance(rated_mb_s, dict) else float(rated_mb_s)
        entry: dict[str, Any] = {
            "samples": int(row["samples"]),
            "peak_mb_s": float(row["peak"]),
            "p95_mb_s": float(row["p95"]),
            "rated_mb_s": rated,
            "peak": None,
            "p95": None,
        }
        if rated and rated > 0:
            entry["peak"] = entry["peak_mb_s"] / rated
            entry["p95"] = entry["p95_mb_s"] / rated
        else:
            missing.append(gpu)
        result["per_gpu"][gpu] = entry
    rated_gpus = {g: e for g, e in result["per_gpu"].items() if e["peak"] is not None}
    if rated_gpus:
        worst = max(rated_gpus, key=lambda g: (rated_gpus[g]["peak"], rated_gpus[g]["p95"]))
        result["worst_gpu"] = worst
        result["peak"] = rated_gpus[worst]["peak"]
        result["p95"] = max(e["p95"] for e in rated_gpus.values())
    if missing:
        result["reason"] = f"no rated PCIe speed for GPU(s) {missing}"
    return result


# --------------------------------------------------------------------------------------------
# nccl-tests

_LAUNCHER_TAG = re.compile(r"\[\d+(?:,\d+)?\](?:<std(?:out|err)>)?:?")
_PERF_NAME = re.compile(r"\b([a-z][a-z0-9_]*?)_perf(?:_mpi)?\b")
_HEADER_ALIAS = {
    "size": "size",
    "bytes": "size",
    "count": "count",
    "n": "count",
    "type": "type",
    "redop": "redop",
    "op": "redop",
    "root": "root",
    "time": "time",
    "cputime": "time",
    "algbw": "algbw",
    "busbw": "busbw",
    "#wrong": "wrong",
    "wrong": "wrong",
    "error": "wrong",
    "res": "wrong",
}
_LEADING = ("size", "count", "type", "redop", "root")
NCCL_TESTS_COLUMNS: dict[str, Any] = {
    "collective": pl.Utf8,
    "table": pl.Int64,
    "size_bytes": pl.Int64,
    "count": pl.Int64,
    "dtype": pl.Utf8,
    "redop": pl.Utf8,
    "root": pl.Int64,
    "oop_time_us": pl.Float64,
    "oop_algbw": pl.Float64,
    "oop_busbw": pl.Float64,
    "ip_time_us": pl.Float64,
    "ip_algbw": pl.Float64,
    "ip_busbw": pl.Float64,
    "wrong": pl.Float64,
    "avg_busbw": pl.Float64,
}


@dataclass
class _Table:
    collective: str | None
    leading: list[str]
    groups: list[tuple[str, list[str]]]  # ("oop"|"ip", [field, ...]) in printed order
    index: int
    rows: list[dict[str, Any]] = field(default_factory=list)
    avg_busbw: float | None = None


def _header_layout(tokens: list[str], order: list[str]) -> tuple[list[str], list[tuple[str, list[str]]]] | None:
    names = [_HEADER_ALIAS.get(t.lower(), f"?{t.lower()}") for t in tokens]
    if "size" not in names or "time" not in names:
        return None
    first_time = names.index("time")
    leading = names[:first_time]
    groups: list[list[str]] = []
    for name in names[first_time:]:
        if name == "time":
            groups.append([])
        groups[-1].append(name)
    kinds = order or ["oop", "ip"]
    return leading, [(kinds[i] if i < len(kinds) else f"extra{i}", g) for i, g in enumerate(groups[:2])]


def _int(token: str) -> int | None:
    """A whole number that fits 64 bits (a damaged row's 30-digit "size" is no size), else None."""
    try:
        value: int | None = int(token)
    except ValueError:
        number = _num(token)
        value = int(number) if number is not None and number.is_integer() else None
    return value if value is not None and -(1 << 63) < value < 1 << 63 else None


def parse_nccl_tests(text: str) -> pl.DataFrame:
    """Parse nccl-tests result tables (one or several, any generation) into one frame.

    Columns: ``collective`` (``all_reduce``, ... from ``# Collective test starting:``, a
    ``*_perf`` binary name or the preamble before the table; null when nothing names it),
    ``table`` (0-based table index), ``size_bytes``, ``count``, ``dtype``, ``redop``, ``root``,
    ``oop_time_us/algbw/busbw``, ``ip_time_us/algbw/busbw`` (GB/s as printed), ``wrong`` (largest
    of the out-of-place/in-place ``#wrong``/``error`` values, null for ``N/A``) and
    ``avg_busbw`` (the table's ``# Avg bus bandwidth`` footer). Launcher prefixes (``[1,0]<stdout>:``,
    ``[0]``) and interleaved NCCL log lines are ignored. Raises InputError when no row is found.
    """
    tables: list[_Table] = []
    current: _Table | None = None
    name: str | None = None
    order: list[str] = []
    for raw in _clean(text):
        line = _LAUNCHER_TAG.sub(" ", raw).strip()
        if not line:
            continue
        started = re.search(r"Collective test (?:starting|concluded):\s*(\S+)", line)
        if started:
            match = _PERF_NAME.search(started.group(1) + " ")
            name = match.group(1) if match else started.group(1)
            continue
        if "NCCL INFO" not in line and "NCCL WARN" not in line:
            perf = _PERF_NAME.findall(line)
            if perf:
                name = perf[-1]
        if line.startswith("#"):
            body = line.lstrip("#").strip()
            lowered = body.lower()
            if "out-of-place" in lowered and "in-place" in lowered:
                order = ["oop", "ip"] if lowered.index("out-of-place") < lowered.index("in-place") else ["ip", "oop"]
                continue
            if "avg bus bandwidth" in lowered and current is not None:
                match = re.search(r":\s*([-+0-9.eE]+)", body)
                if match:
                    current.avg_busbw = _num(match.group(1))
                continue
            tokens = body.split()
            if tokens and tokens[0].lower() in ("size", "bytes") and any(t.lower() == "algbw" for t in tokens):
                layout = _header_layout(tokens, order)
                if layout is not None:
                    current = _Table(name, layout[0], layout[1], len(tables))
                    tables.append(current)
                    order = []
            continue
        if current is None:
            continue
        tokens = line.split()
        row = _nccl_row(tokens, current)
        if row is not None:
            current.rows.append(row)
    records: list[dict[str, Any]] = []
    for table in tables:
        for row in table.rows:
            row["collective"] = table.collective
            row["table"] = table.index
            row["avg_busbw"] = table.avg_busbw
            records.append(row)
    if not records:
        raise InputError(
            "no nccl-tests result rows found",
            hint="expected a '# size count type ... time algbw busbw' header followed by one row per size",
        )
    return pl.DataFrame(records, schema=NCCL_TESTS_COLUMNS)


def _nccl_row(tokens: list[str], table: _Table) -> dict[str, Any] | None:
    n_lead = len(table.leading)
    if len(tokens) < n_lead + 3 or not tokens[0].isdigit():
        return None
    lead = dict(zip(table.leading, tokens[:n_lead], strict=True))
    size = _int(lead["size"])
    count = _int(lead.get("count", "")) if "count" in lead else None
    if size is None or ("count" in lead and count is None):
        return None
    row: dict[str, Any] = {
        "size_bytes": size,
        "count": count,
        "dtype": lead.get("type"),
        "redop": lead.get("redop"),
        "root": _int(lead["root"]) if "root" in lead else None,
    }
    rest = tokens[n_lead:]
    wrongs: list[float] = []
    any_value = False
    for kind, fields in table.groups:
        values = dict(zip(fields, rest[: len(fields)], strict=False))
        rest = rest[len(fields) :]
        if kind not in ("oop", "ip"):
            continue
        for key in ("time", "algbw", "busbw"):
            value = _num(values.get(key, "")) if key in values else None
            row[f"{kind}_{'time_us' if key == 'time' else key}"] = value
            any_value = any_value or value is not None
        if "wrong" in values:
            wrong = _num(values["wrong"].rstrip("*"))
            if wrong is not None:
                wrongs.append(wrong)
    if not any_value:
        return None
    row["wrong"] = max(wrongs) if wrongs else None
    return row


def nccl_graph_max_bw(text: str) -> float | None:
    """Largest ``maxBw`` (GB/s) of NCCL's ``=== System : maxBw X totalBw Y ===`` GRAPH lines, or None."""
    values = [float(m) for m in re.findall(r"System\s*:\s*maxBw\s+([0-9.]+)", _ANSI.sub("", text))]
    return max(values) if values else None


# --------------------------------------------------------------------------------------------
# nvidia-smi topo -m

_LINK = re.compile(r"^(X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC|PCI|CPU|NV#|C2C\d*|N/A)$")


@dataclass
class Topology:
    """``nvidia-smi topo -m``: link kinds between devices and per-GPU affinity."""

    gpus: list[int]
    links: dict[tuple[int, int], str]  # (gpu, gpu) -> "NV18", "SYS", ... (both orders, no self)
    nvlink_pairs: set[frozenset[int]]
    cpu_affinity: dict[int, str]
    numa_affinity: dict[int, str]
    gpu_numa_id: dict[int, str]
    nics: list[str]  # column labels: NIC0 ... or mlx5_0 ...
    nic_names: dict[str, str]  # NIC0 -> mlx5_0 from the "NIC Legend"
    gpu_nic_links: dict[tuple[int, str], str]

    def as_dict(self) -> dict[str, Any]:
        """Plain dict view (what :func:`parse_topo` returns)."""
        return {
            "gpus": self.gpus,
            "matrix": {f"GPU{a}": {f"GPU{b}": k for (x, b), k in self.links.items() if x == a} for a in self.gpus},
            "links": self.links,
            "nvlink_pairs": self.nvlink_pairs,
            "cpu_affinity": self.cpu_affinity,
            "numa_affinity": self.numa_affinity,
            "gpu_numa_id": self.gpu_numa_id,
            "nics": self.nics,
            "nic_names": self.nic_names,
            "gpu_nic_links": self.gpu_nic_links,
        }


def parse_topo(text: str) -> dict[str, Any]:
    """Parse ``nvidia-smi topo -m`` (or ``-mp``) output.

    Returns ``{"gpus": [0, 1, ...] (from the header), "matrix": {"GPU0": {"GPU1": "NV18", ...}}, "links":
    {(0, 1): "NV18", ...}, "nvlink_pairs": {frozenset({0, 1}), ...}, "cpu_affinity": {0: "0-31"},
    "numa_affinity": {0: "0"}, "gpu_numa_id": {0: "N/A"}, "nics": ["NIC0", ...], "nic_names":
    {"NIC0": "mlx5_0"}, "gpu_nic_links": {(0, "NIC0"): "PIX"}}``. Rows cut off in an excerpt are
    simply missing. Raises InputError when no GPU row is found.
    """
    columns: list[str] | None = None
    topo = Topology([], {}, set(), {}, {}, {}, [], {}, {})
    gpu_rows = 0
    for raw in _clean(text):
        line = raw.strip()
        if not line:
            continue
        legend = re.match(r"^(NIC\d+)\s*:\s*(\S+)$", line)
        if legend:
            topo.nic_names[legend.group(1)] = legend.group(2)
            continue
        tokens = line.split()
        # The header starts with the GPU0 column and goes on with a device label or, on a one-GPU host,
        # "CPU Affinity" (whose "CPU" is also a link kind); GPU0's own row goes on with "X".
        if tokens[0] == "GPU0" and len(tokens) > 1 and (not _LINK.match(tokens[1]) or _AFFINITY_COLS[0] in line):
            columns = _topo_columns(line)
            topo.nics = [c for c in columns if not c.startswith("GPU") and c not in _AFFINITY_COLS]
            for col in columns:
                peer = re.match(r"^GPU(\d+)$", col)
                if peer and int(peer.group(1)) not in topo.gpus:
                    topo.gpus.append(int(peer.group(1)))
            continue
        if columns is None:
            continue
        device_cols = [c for c in columns if c not in _AFFINITY_COLS]
        row = re.match(r"^(GPU(\d+)|NIC\d+|mlx\d+_\d+|\S+)$", tokens[0])
        if not row or len(tokens) < 1 + len(device_cols):
            continue
        links = tokens[1 : 1 + len(device_cols)]
        if not all(_LINK.match(t) for t in links):
            continue
        if row.group(2) is None:
            continue  # a NIC row: the GPU rows already carry the same links
        gpu = int(row.group(2))
        if gpu not in topo.gpus:
            topo.gpus.append(gpu)
        for col, kind in zip(device_cols, links, strict=True):
            peer = re.match(r"^GPU(\d+)$", col)
            if peer:
                other = int(peer.group(1))
                if other == gpu or kind == "X":
                    continue
                topo.links[(gpu, other)] = kind
                topo.links.setdefault((other, gpu), kind)
                if kind.startswith("NV"):
                    topo.nvlink_pairs.add(frozenset((gpu, other)))
            else:
                topo.gpu_nic_links[(gpu, col)] = kind
        gpu_rows += 1
        affinity_cols = [c for c in columns if c in _AFFINITY_COLS]
        cells = _affinity_cells(raw, tokens, len(device_cols), affinity_cols)
        for col, value in zip(affinity_cols, cells, strict=False):
            target = {
                "CPU Affinity": topo.cpu_affinity,
                "NUMA Affinity": topo.numa_affinity,
                "GPU NUMA ID": topo.gpu_numa_id,
            }[col]
            if value:
                target[gpu] = value
    if not gpu_rows:
        raise InputError(
            "no GPU rows found in nvidia-smi topo output",
            hint="expected a 'GPU0 GPU1 ... CPU Affinity' header followed by 'GPU0  X  NV18 ...' rows",
        )
    topo.gpus.sort()
    return topo.as_dict()


_AFFINITY_COLS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")


def _affinity_cells(raw: str, tokens: list[str], devices: int, columns: list[str]) -> list[str]:
    """A GPU row's affinity values, in the order of ``columns`` ("" where the cell is empty).

    nvidia-smi separates cells by tabs and pads after the wide "NUMA Affinity" cell with an empty
    one (``0-31\t0\t\tN/A``); a GPU without CPU affinity prints empty cells
    (``GPU0\t X \t\t\t\tN/A``), which splitting on whitespace would shift onto the wrong column.
    Output whose tabs became spaces (pasted, re-indented) keeps the whitespace split.
    """
    if "\t" not in raw:
        return tokens[1 + devices :]
    cells = [cell.strip() for cell in raw.split("\t")][1 + devices :]
    if columns and columns[-1] == "GPU NUMA ID" and len(cells) > len(columns):
        return [*cells[: len(columns) - 1], cells[-1]]
    return cells[: len(columns)]


def _topo_columns(line: str) -> list[str]:
    """Header labels: device names, then the (multi-word) affinity columns in printed order."""
    found: list[tuple[int, str]] = []
    rest = line
    for label in _AFFINITY_COLS:
        at = line.find(label)
        if at >= 0:
            found.append((at, label))
            rest = rest.replace(label, " ")
    devices = rest.split()
    return devices + [label for _, label in sorted(found)]


# --------------------------------------------------------------------------------------------
# sniffing


def sniff_side_input(text: str) -> str | None:
    """``"dmon"``, ``"nccl-tests"``, ``"topo"``, ``"smi-q"`` or None, from the text's first 64 KiB."""
    head = _ANSI.sub("", text[:65536])
    if "NVSMI LOG" in head or re.search(r"^\s*Attached GPUs\s*:", head, re.M):
        return "smi-q"
    if re.search(r"^\s*#.*\b(?:size|bytes)\b.*\balgbw\b.*\bbusbw\b", head, re.M | re.I) or re.search(
        r"#\s*Avg bus bandwidth\s*:", head
    ):
        return "nccl-tests"
    if re.search(r"^\s*GPU0\s+(?:X|NV\d+|PIX|PXB|PHB|NODE|SYS|SOC)\s", head, re.M) or re.search(
        r"^\s*GPU0\s+GPU1\b.*(?:CPU Affinity|NIC0|mlx)", head, re.M
    ):
        return "topo"
    if re.search(r"^\s*#\s*(?:Date\s+)?(?:Time\s+)?gpu\b", head, re.M | re.I) and re.search(
        r"^\s*#\s*(?:\S+\s+)*Idx\b", head, re.M
    ):
        return "dmon"
    return None
