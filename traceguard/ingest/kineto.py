"""Read PyTorch profiler (Kineto) Chrome-trace JSON, ``.json`` or ``.json.gz``, into a :class:`Capture`.

Formats seen in the wild (../shared/fixtures/public/kineto): 2021 traces with capitalised
categories (``Kernel``, ``Memcpy``, ``Memset``, ``Runtime``, ``Operator``) and string tids
(``"25738"``, ``"stream 7"``); modern lowercase ones (``kernel``, ``gpu_memcpy``, ``gpu_memset``,
``cuda_runtime``, ``cuda_driver``, ``cpu_op``, ``user_annotation``); ROCm traces, which reuse the
CUDA category names (``hipLaunchKernel`` is a ``cuda_runtime`` event) with roctracer args
(``cid``, string-typed ``stream``/``size``); traces with and without ``distributedInfo``.

Time: ``ts``/``dur`` are microseconds, as the Chrome trace format says, whatever
``displayTimeUnit`` claims (it only tells viewers how to display them: the ``"ns"`` fixture's ts
are ~1.7e15, i.e. µs since the epoch). Newer traces write ts relative to ``baseTimeNanoseconds``;
we keep the capture's own clock as written. µs with three decimals at epoch magnitudes do not
fit a float64 (spacing 0.25 µs), so ts/dur are taken as *text* and converted to int ns exactly.

Speed (1.5 M events, 433 MB JSON, 2 cores): ``json.load`` alone takes ~13 s and 2.0 GB,
``orjson.loads`` ~12 s / 3.3 GB, ``polars.read_json`` ~7.5 s / 4.1 GB (and it parses ts through
float64). msgspec decoding into typed, non-GC structs takes ~1 s: unknown keys (``args`` is
large and heterogeneous) are skipped without building objects, and ts/dur stay raw slices of
the input. Columns are then pulled out in C (``map``/``attrgetter``/``itemgetter``/
``bytes.join``) and all parsing and normalization happen in Polars; no Python bytecode runs per
event. Whole read: ~3.6 s and 1.67 GB peak RSS (4.3 s from ``.json.gz``).
"""

from __future__ import annotations

import gzip
import math
import re
import zlib
from itertools import compress, repeat
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any

import msgspec
import polars as pl

from traceguard import model
from traceguard.errors import InputError
from traceguard.model import Capture, CaptureInfo

GPU_CATEGORIES: dict[str, str] = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
#: CUDA runtime/driver calls; ROCm traces use the same names (``hipLaunchKernel`` etc.).
API_CATEGORIES: frozenset[str] = frozenset(
    {"cuda_runtime", "cuda_driver", "Runtime", "Driver", "hip_runtime", "hip_driver"}
)
#: Host-side categories a ``ProfilerStep#N`` range can carry across Kineto versions.
STEP_CATEGORIES: frozenset[str] = frozenset({"user_annotation", "cpu_op", "Operator"})
RANGE_CATEGORY = "user_annotation"
STEP_PREFIX = "ProfilerStep#"

#: Bytes per element of c10 ScalarType names as Kineto writes them in NCCL kernels' ``dtype``.
DTYPE_SIZES: dict[str, int] = {
    "Byte": 1,
    "Char": 1,
    "Bool": 1,
    "Short": 2,
    "Int": 4,
    "Long": 8,
    "Half": 2,
    "Float": 4,
    "Double": 8,
    "BFloat16": 2,
    "ComplexHalf": 4,
    "ComplexFloat": 8,
    "ComplexDouble": 16,
    "QInt8": 1,
    "QUInt8": 1,
    "QInt32": 4,
    "QUInt4x2": 1,
    "QUInt2x4": 1,
    "Bits1x8": 1,
    "Bits2x4": 1,
    "Bits4x2": 1,
    "Bits8": 1,
    "Bits16": 2,
    "Float8_e5m2": 1,
    "Float8_e4m3fn": 1,
    "Float8_e5m2fnuz": 1,
    "Float8_e4m3fnuz": 1,
    "Float8_e8m0fnu": 1,
    "Float4_e2m1fn_x2": 1,
    "UInt16": 2,
    "UInt32": 4,
    "UInt64": 8,
}

_OTHER, _GPU, _API, _HOST, _META = 0, 1, 2, 3, 4
#: One dict lookup per event classifies it (no category: metadata and instant events).
_CATEGORY_CODE: dict[str | None, int] = {
    **dict.fromkeys(GPU_CATEGORIES, _GPU),
    **dict.fromkeys(API_CATEGORIES, _API),
    **dict.fromkeys(STEP_CATEGORIES, _HOST),
    None: _META,
}

_GZIP_MAGIC = b"\x1f\x8b"
_HINT = "pass a PyTorch profiler trace (torch.profiler ... export_chrome_trace / tensorboard_trace_handler)"


class _Args(msgspec.Struct, gc=False):
    """The few ``args`` keys we read; typed ``Any`` so odd values never fail the decode."""

    device: Any = None
    stream: Any = None
    correlation: Any = None
    bytes: Any = None
    name: Any = None  # process_name metadata
    labels: Any = None  # process_labels metadata ("GPU 0", "CPU")
    collective: Any = msgspec.field(default=None, name="Collective name")
    in_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    # Point-to-point peers (PyTorch >= 2.4 profiler, global ranks): send → "Dst Rank", recv → "Src Rank".
    dst_rank: Any = msgspec.field(default=None, name="Dst Rank")
    src_rank: Any = msgspec.field(default=None, name="Src Rank")
    # record_function inputs (``nccl:all_reduce`` annotations of traces without collective args).
    input_dims: Any = msgspec.field(default=None, name="Input Dims")
    input_type: Any = msgspec.field(default=None, name="Input type")


_NO_ARGS = _Args()


class _Event(msgspec.Struct, gc=False):
    """One trace event; ts/dur stay raw JSON text so they convert to ns without float loss."""

    ph: str | None = None
    cat: str | None = None  # typed: categories are compared by hash; odd events go the slow path
    name: Any = None
    pid: Any = None
    tid: Any = None
    ts: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    dur: msgspec.Raw = msgspec.field(default_factory=msgspec.Raw)
    args: _Args | None = None


class _Trace(msgspec.Struct, gc=False):
    traceEvents: list[_Event] | None = None
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    displayTimeUnit: Any = None
    baseTimeNanoseconds: Any = None
    host_name: Any = None


class _RawTrace(msgspec.Struct, gc=False):
    """Fallback shape when some events are not objects: decode each one separately."""

    traceEvents: list[msgspec.Raw] | None = None


def looks_like_kineto(head: bytes) -> bool:
    """Content sniffing on the first few KiB (already gunzipped): a Chrome/Kineto trace?

    Kineto writes ``{"schemaVersion": ..., "traceEvents": [...]}``; the Chrome trace format also
    allows a bare array of event objects (``[{"ph": ...``).
    """
    text = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if text.startswith(b"{"):
        return b'"traceEvents"' in text or b'"schemaVersion"' in text
    if text.startswith(b"["):
        body = text[1:].lstrip()
        return body.startswith(b"{") and (b'"ph"' in body or b'"ts"' in body)
    return False


def read_kineto(path: Path, *, source_path: str | None = None) -> Capture:
    """Read one Kineto trace into the normalized model; every failure is an :class:`InputError`."""
    shown = source_path or str(path)
    data = _read_bytes(Path(path), shown)
    repaired = 0
    try:
        events, top = _decode(data, shown, repairable=True)
    except _NotUtf8:
        data, repaired = utf8_json(data)
        events, top = _decode(data, shown)
    del data  # the raw ts/dur slices keep only what they reference alive
    capture = _normalize(events, top, shown)
    if repaired:
        capture.info.notes.append(
            f"{repaired:,} string value{'s' if repaired != 1 else ''} held bytes that are not UTF-8 or lone "
            "UTF-16 surrogates (a damaged file, or a writer that escaped undecodable bytes): read with U+FFFD "
            "in their place"
        )
    return capture


class _NotUtf8(Exception):
    """The JSON's strings are not all text: :func:`utf8_json` repairs them."""


#: A ``\uXXXX`` escape of a UTF-16 surrogate after a run of backslashes (an even run is an escaped
#: backslash, then text): a high one with its low partner, or either alone.
_SURROGATE = re.compile(
    rb"(\\+)u([dD][89abAB][0-9a-fA-F]{2})(?:\\u([dD][c-fC-F][0-9a-fA-F]{2}))?|(\\+)u([dD][c-fC-F][0-9a-fA-F]{2})"
)
_FFFD = "\ufffd".encode()


def utf8_json(data: bytes) -> tuple[bytes, int]:
    """``data`` with each byte sequence that is not UTF-8, and each escaped UTF-16 surrogate
    without its partner (``"\udcff"``: what Python's ``json.dumps`` writes for a string decoded
    from bytes with ``surrogateescape``), replaced by U+FFFD; and how many were. Only a trace that
    failed to decode for either reason gets here: msgspec refuses both, and one bad name made the
    whole trace unreadable."""
    text = data.decode("utf-8", errors="replace").encode("utf-8")
    count = text.count(_FFFD) - data.count(_FFFD)

    def unpaired(match: re.Match[bytes]) -> bytes:
        nonlocal count
        slashes, high, low = match.group(1) or match.group(4), match.group(2), match.group(3)
        if len(slashes) % 2 == 0:  # not an escape; only a low escape right after it can be one
            if low is None:
                return match.group(0)
            count += 1
            return match.group(0)[: -len(low) - 2] + rb"\ufffd"
        if high is not None and low is not None:
            return match.group(0)  # a pair: one character
        count += 1
        return slashes + b"ufffd"

    return _SURROGATE.sub(unpaired, text), count


# --------------------------------------------------------------------------------------------
# reading and decoding


def _read_bytes(path: Path, shown: str) -> bytes:
    try:
        raw = path.read_bytes()
    except FileNotFoundError as exc:
        raise InputError(f"{shown}: no such file.") from exc
    except OSError as exc:
        raise InputError(f"{shown}: cannot read the file: {exc.strerror or exc}") from exc
    if raw[:2] == _GZIP_MAGIC:
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError, zlib.error) as exc:
            raise InputError(
                f"{shown}: the gzip stream is truncated or corrupt ({exc}).",
                hint="re-copy the file or gunzip it to see how much survives",
            ) from exc
    if not raw.strip():
        raise InputError(f"{shown}: the file is empty, not a Kineto trace.", hint=_HINT)
    return raw


def _decode(data: bytes, shown: str, *, repairable: bool = False) -> tuple[list[_Event], _Trace]:
    """Decode the trace; a JSON array is a bare event list. Non-object events are skipped. Text
    that is not UTF-8 raises :class:`_NotUtf8` when ``repairable`` (:func:`read_kineto` repairs it
    and decodes again), else :class:`InputError`."""
    is_array = data.lstrip(b"\xef\xbb\xbf \t\r\n")[:1] == b"["
    try:
        try:
            if is_array:
                events = msgspec.json.decode(data, type=list[_Event])
                if not events:
                    raise _not_a_trace(shown, "an empty JSON array holds no trace events")
                return events, _Trace()
            top = msgspec.json.decode(data, type=_Trace)
            if top.traceEvents is None:
                raise _not_a_trace(shown, 'the object has no "traceEvents" list')
            return top.traceEvents, top
        except msgspec.ValidationError:
            pass  # some event is not an object, or traceEvents is not a list: go slow and lenient
        if is_array:
            raws = msgspec.json.decode(data, type=list[msgspec.Raw])
            top = _Trace()
        else:
            try:
                top_any = msgspec.json.decode(data, type=dict[str, Any])
            except msgspec.ValidationError as exc:
                raise _not_a_trace(shown, "the top level is neither an object nor an array") from exc
            if not isinstance(top_any.get("traceEvents"), list):
                raise _not_a_trace(shown, 'the object has no "traceEvents" list')
            raws = msgspec.json.decode(data, type=_RawTrace).traceEvents or []
            top = msgspec.convert({k: v for k, v in top_any.items() if k != "traceEvents"}, _Trace)
            top.traceEvents = []
        events = []
        for raw in raws:  # fallback only: well-formed traces never get here
            try:
                events.append(msgspec.json.decode(raw, type=_Event))
            except msgspec.ValidationError:
                continue
        if raws and not events:
            raise _not_a_trace(shown, "none of its entries is a trace event object")
        return events, top
    except UnicodeDecodeError as exc:  # msgspec decodes strings strictly: read_kineto repairs them
        if repairable:
            raise _NotUtf8 from exc
        raise InputError(
            f"{shown}: not UTF-8 JSON (a string holds bytes that are not UTF-8: {exc.reason}); "
            "the file is damaged or not a trace.",
            hint="re-export the trace, or check that the copy finished",
        ) from exc
    except msgspec.DecodeError as exc:
        # msgspec 0.23 reports a string's bytes that are not UTF-8 here ("Invalid UTF-8 encoded
        # string"); earlier releases raised UnicodeDecodeError (above).
        not_utf8 = "utf-8" in str(exc).lower()
        if repairable and (not_utf8 or "surrogate" in str(exc) or _SURROGATE.search(data)):  # surrogates too
            raise _NotUtf8 from exc
        if not_utf8:
            raise InputError(
                f"{shown}: not UTF-8 JSON (a string holds bytes that are not UTF-8: {exc}); "
                "the file is damaged or not a trace.",
                hint="re-export the trace, or check that the copy finished",
            ) from exc
        raise InputError(
            f"{shown}: not valid JSON ({exc}); the file is probably truncated or not a trace.",
            hint="re-export the trace, or check that the copy finished",
        ) from exc


def _not_a_trace(shown: str, why: str) -> InputError:
    return InputError(f"{shown}: JSON but not a Kineto/Chrome trace: {why}.", hint=_HINT)


# --------------------------------------------------------------------------------------------
# normalization


def _pick(events: list[_Event], mask: pl.Series) -> list[_Event]:
    """The events where ``mask`` is true, gathered in C (``itemgetter``), not in a Python loop."""
    index = mask.fill_null(False).arg_true().to_list()
    if len(index) < 2:
        return [events[i] for i in index]
    return list(itemgetter(*index)(events))


def _column(items: list[Any], attr: str) -> list[Any]:
    return list(map(attrgetter(attr), items))


def _ns_from_text(raw: list[msgspec.Raw]) -> pl.Series:
    """Raw JSON numbers (µs, maybe fractional, maybe quoted) → exact int64 ns, vectorized.

    ``"1712195495519689.047"`` → 1712195495519689047: decimal digits are shifted, not multiplied
    through float64. Exponent forms (never written by Kineto) go through float; others → null.
    """
    if not raw:
        return pl.Series("ns", [], dtype=pl.Int64)
    # NUL never occurs unescaped in JSON, so it cannot appear inside a raw value.
    text = b"\x00".join(raw).decode("utf-8", "replace")
    lines = pl.Series("t", [text]).str.split("\x00").explode()
    lines = lines.str.strip_chars(' "\t\r')
    frame = lines.to_frame("t").select(
        pl.col("t").str.extract_groups(r"^(-)?(\d+)(?:\.(\d*))?$").alias("g"),
        pl.col("t"),
    )
    g = pl.col("g").struct
    frac = g.field("3").fill_null("")
    whole = g.field("2").cast(pl.Int64, strict=False) * 1000 + frac.str.pad_end(3, "0").str.slice(0, 3).cast(
        pl.Int64, strict=False
    )
    round_up = frac.str.slice(3, 1).is_in(["5", "6", "7", "8", "9"])  # round half up on text
    exact = whole + round_up.cast(pl.Int64)
    exact = pl.when(g.field("1") == "-").then(-exact).otherwise(exact)
    via_float = (pl.col("t").cast(pl.Float64, strict=False) * 1000).round(0).cast(pl.Int64, strict=False)
    return frame.select(pl.coalesce(exact, via_float).alias("ns")).to_series()


def _series(values: list[Any], dtype: pl.DataType) -> pl.Series:
    """``values`` as ``dtype``, a value that is not one (text, a number too wide) null. A damaged
    trace's list or object where a number belongs makes that value null too (the slow path only
    then: well-formed traces never take it)."""
    try:
        return pl.Series(values, dtype=dtype, strict=False)
    except (TypeError, OverflowError, pl.exceptions.PolarsError):
        scalar = [
            v if isinstance(v, str | float) or (type(v) is int and -(1 << 63) <= v < 1 << 63) else None for v in values
        ]
        return pl.Series(scalar, dtype=dtype, strict=False)


def _int_from_id(values: list[Any]) -> pl.Series:
    """pid/tid as int64: numbers as they are, strings by their digits ("25738", "stream 7")."""
    s = _series(values, pl.String())
    return s.str.extract(r"(-?\d+)").cast(pl.Int64, strict=False)


def _int(values: list[Any]) -> pl.Series:
    return _series(values, pl.Int64())


#: C++ element types as ``record_function`` writes them in ``Input type`` (``c10::`` dropped).
INPUT_TYPE_SIZES: dict[str, int] = {
    "float": 4,
    "double": 8,
    "half": 2,
    "bfloat16": 2,
    "int": 4,
    "unsigned int": 4,
    "long": 8,
    "long int": 8,
    "long long": 8,
    "int64_t": 8,
    "short": 2,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "char": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}
#: c10d calls whose input tensor is the whole message (input and output the same size).
_SAME_SIZE_CALLS = {"all_reduce", "allreduce", "all_to_all", "alltoall", "alltoall_base", "broadcast", "reduce"}
_SAME_SIZE_CALLS |= {"send", "recv"}
#: PyTorch's profiler annotation of a c10d call: ``<backend>:<op>``.
_C10D_ANNOTATION = r"^(?:nccl|gloo|mpi|ucc|xccl):"


def _annotation_bytes(items: list[_Event]) -> pl.Series:
    """``payload_bytes`` of ranges: for PyTorch's ``nccl:<op>`` (or ``gloo:<op>``, ``mpi:``,
    ``ucc:``) annotation of a call whose input is the whole message (all_reduce, all_to_all,
    broadcast, reduce, send, recv), the first input's elements (``Input Dims``) × its element size
    (``Input type``), recorded with ``record_shapes=True``: older traces, and gloo's, carry the
    size only there. Python runs for those few annotations only."""
    names = _str(_column(items, "name"))
    out: list[int | None] = [None] * len(items)
    for i in names.str.contains(_C10D_ANNOTATION).fill_null(False).arg_true().to_list():
        op = str(names[i]).split(":", 1)[1].split(",")[0].strip()
        args = items[i].args
        if op not in _SAME_SIZE_CALLS or args is None:
            continue
        dims, types = args.input_dims, args.input_type
        if not (isinstance(dims, list) and dims and isinstance(dims[0], list) and isinstance(types, list) and types):
            continue
        size = INPUT_TYPE_SIZES.get(str(types[0]).removeprefix("c10::").strip().lower())
        if size is None or not all(isinstance(d, int) and d >= 0 for d in dims[0]):
            continue
        payload = size * math.prod(dims[0])
        out[i] = payload if payload < 1 << 63 else None  # a damaged shape is no message size
    return pl.Series("payload_bytes", out, dtype=pl.Int64)


def _rank_arg(values: list[Any]) -> pl.Series:
    """A rank written as a number or as its text (PyTorch writes collective metadata as strings)."""
    if values.count(None) == len(values):  # C-level scan: most traces have no point-to-point args
        return pl.repeat(None, len(values), dtype=pl.Int32, eager=True)
    return _series(values, pl.String()).str.strip_chars().cast(pl.Int32, strict=False)


def _str(values: list[Any]) -> pl.Series:
    return _series(values, pl.String())


def _base_frame(items: list[_Event]) -> pl.DataFrame:
    """The columns every event family shares; rows without a usable ts are dropped later."""
    start = _ns_from_text(_column(items, "ts"))
    dur = _ns_from_text(_column(items, "dur"))
    return pl.DataFrame(
        {
            "ph": _str(_column(items, "ph")),
            "name": _str(_column(items, "name")),
            "pid": _int_from_id(_column(items, "pid")),
            "tid": _int_from_id(_column(items, "tid")),
            "start": start,
            "end": start + dur.fill_null(0).clip(lower_bound=0),
        }
    )


def _args_of(items: list[_Event]) -> list[_Args]:
    args = _column(items, "args")
    if None in args:
        args = [a if a is not None else _NO_ARGS for a in args]
    return args


def _gpu_ops(items: list[_Event], kinds: list[str]) -> pl.DataFrame:
    base = _base_frame(items)
    args = _args_of(items)
    dtype_size = pl.col("dtype").replace_strict(DTYPE_SIZES, default=None, return_dtype=pl.Int64)
    nelems = pl.max_horizontal("in_nelems", "out_nelems")
    copy = pl.col("name").str.extract_groups(r"^Memcpy\s+(\w+)(?:\s*\(([^)>]*?)\s*->\s*([^)]*?)\))?")
    return (
        base.with_columns(
            kind=pl.Series(kinds, dtype=model.OpKind),
            device=_int(_column(args, "device")),
            stream=_int_from_id(_column(args, "stream")),
            correlation_id=_int(_column(args, "correlation")),
            bytes=_int(_column(args, "bytes")),
            in_nelems=_int(_column(args, "in_nelems")),
            out_nelems=_int(_column(args, "out_nelems")),
            group_size=_int(_column(args, "group_size")),
            dtype=_str(_column(args, "dtype")),
            peer=pl.coalesce(_rank_arg(_column(args, "dst_rank")), _rank_arg(_column(args, "src_rank"))),
        )
        .with_columns(
            device=pl.coalesce("device", "pid"),  # GPU events carry pid = device
            stream=pl.coalesce("stream", "tid"),
            msg_bytes=nelems * dtype_size,
            copy=pl.when(pl.col("kind") == "memcpy").then(copy),
        )
        .with_columns(
            bytes=pl.when(pl.col("kind") != "kernel").then("bytes"),
            copy_kind=pl.when(pl.col("kind") == "memcpy").then(
                _enum_or_unknown(pl.col("copy").struct.field("1"), model.COPY_KINDS, "unknown")
            ),
            src_kind=_mem_kind(pl.col("copy").struct.field("2")),
            dst_kind=_mem_kind(pl.col("copy").struct.field("3")),
        )
    )


def _enum_or_unknown(text: pl.Expr, values: tuple[str, ...], unknown: str) -> pl.Expr:
    return pl.when(text.is_in(list(values))).then(text).otherwise(pl.lit(unknown))


def _mem_kind(text: pl.Expr) -> pl.Expr:
    """Memory kind from the name: Pinned → pinned, Device Static → device_static, Host (ROCm) → unknown."""
    norm = text.str.strip_chars().str.to_lowercase().str.replace_all(" ", "_")
    return pl.when(text.is_not_null()).then(_enum_or_unknown(norm, model.MEM_KINDS, "unknown"))


def _normalize(events: list[_Event], top: _Trace, shown: str) -> Capture:
    # Split events by category in C (map/itemgetter/compress): no bytecode runs per event, and
    # nothing is built for the events we drop (cpu_op, python_function, flows: most of a trace).
    codes = pl.Series(list(map(_CATEGORY_CODE.get, _column(events, "cat"), repeat(_OTHER, len(events)))), dtype=pl.Int8)
    gpu_items = _pick(events, codes == _GPU)
    api_items = _pick(events, codes == _API)
    host_items = _pick(events, codes == _HOST)
    meta_items = _pick(events, codes == _META)
    n_events = len(events)
    del events, codes

    is_range = (
        (_str(_column(host_items, "ph")) == "X")
        & (
            (_str(_column(host_items, "cat")) == RANGE_CATEGORY)
            | _str(_column(host_items, "name")).str.starts_with(STEP_PREFIX)
        ).fill_null(False)
    ).fill_null(False)
    range_items = list(compress(host_items, is_range.to_list()))
    del host_items
    gpu_kinds = _str(_column(gpu_items, "cat")).replace_strict(GPU_CATEGORIES).to_list()

    api = _base_frame(api_items).with_columns(correlation_id=_int(_column(_args_of(api_items), "correlation")))
    usable = (pl.col("ph") == "X") & pl.col("start").is_not_null()
    api = api.filter(usable)
    gpu = _gpu_ops(gpu_items, gpu_kinds).filter(usable)
    ranges = _base_frame(range_items).with_columns(payload_bytes=_annotation_bytes(range_items)).filter(usable)
    del api_items, gpu_items, range_items

    processes, gpu_pids = _processes(meta_items)
    gpu_pids |= set(gpu["pid"].drop_nulls().unique().to_list())
    host_pids = (
        set(api["pid"].drop_nulls().unique().to_list())
        | set(ranges["pid"].drop_nulls().unique().to_list())
        | set(processes["pid"].to_list())
    ) - gpu_pids
    processes = processes.filter(~pl.col("pid").is_in(list(gpu_pids)))

    # GPU op pid = the host pid of the launch with the same correlation id.
    launches = api.filter(pl.col("correlation_id").is_not_null()).unique(
        "correlation_id", keep="first", maintain_order=True
    )
    only_pid = next(iter(host_pids)) if len(host_pids) == 1 else None
    gpu = (
        gpu.drop("pid")
        .join(
            launches.select("correlation_id", pl.col("pid")),
            on="correlation_id",
            how="left",
            maintain_order="left",
        )
        .with_columns(pl.col("pid").fill_null(pl.lit(only_pid, dtype=pl.Int64)))
    )

    names = pl.concat([gpu["name"], api["name"]])
    name_ids, strings = model.intern(names)
    gpu = gpu.with_columns(name_id=name_ids.slice(0, gpu.height))
    api = api.with_columns(name_id=name_ids.slice(gpu.height))

    ranges = ranges.with_columns(
        range_id=pl.int_range(ranges.height, dtype=pl.Int64),
        depth=pl.lit(0, dtype=pl.Int32),
        parent=pl.lit(None, dtype=pl.Int64),
    )
    ranges = model.nest_ranges(model.conform(ranges, model.RANGES_SCHEMA))

    info = _info(top, shown, gpu.height > 0, api.height > 0)
    if n_events == 0:
        info.notes.append("the trace holds no events")
    info.gpu_metrics_reason = (
        "torch.profiler traces carry no link counters (capture with nsys `--gpu-metrics-devices` for them)"
    )
    return Capture(
        info=info,
        gpu_ops=model.conform(gpu, model.GPU_OPS_SCHEMA),
        api_calls=model.conform(api, model.API_CALLS_SCHEMA),
        ranges=model.conform(ranges, model.RANGES_SCHEMA),
        devices=_devices(top.deviceProperties),
        processes=model.conform(processes, model.PROCESSES_SCHEMA),
        strings=strings,
    )


def _processes(meta: list[_Event]) -> tuple[pl.DataFrame, set[int]]:
    """Host processes from ``process_name`` metadata, and the pids that are GPUs in disguise.

    Kineto names the GPU pseudo-processes (pid = device index) after the host process and tells
    them apart only by ``process_labels`` ("GPU 0" vs "CPU").
    """
    if not meta:
        return model.empty(model.PROCESSES_SCHEMA), set()
    args = _args_of(meta)
    frame = pl.DataFrame(
        {
            "kind": _str(_column(meta, "name")),
            "pid": _int_from_id(_column(meta, "pid")),
            "name": _str(_column(args, "name")),
            "labels": _str(_column(args, "labels")),
        }
    ).filter(pl.col("pid").is_not_null())
    gpu_pids = set(
        frame.filter((pl.col("kind") == "process_labels") & pl.col("labels").str.starts_with("GPU").fill_null(False))[
            "pid"
        ].to_list()
    )
    names = frame.filter(pl.col("kind") == "process_name").unique("pid", keep="first", maintain_order=True)
    return names.select("pid", "name"), gpu_pids


def _devices(props: Any) -> pl.DataFrame:
    """``deviceProperties`` → devices (no bus id in Kineto)."""
    rows = [p for p in props if isinstance(p, dict)] if isinstance(props, list) else []
    frame = pl.DataFrame(
        {
            "device": _int([p.get("id") for p in rows]),
            "name": _str([p.get("name") for p in rows]),
            "sm_count": _int([p.get("numSms") for p in rows]),
        }
    )
    return model.conform(frame, model.DEVICES_SCHEMA)


def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None


def _info(top: _Trace, shown: str, has_gpu: bool, has_api: bool) -> CaptureInfo:
    dist = top.distributedInfo if isinstance(top.distributedInfo, dict) else {}
    version = top.schemaVersion
    nccl = dist.get("nccl_version")
    info = CaptureInfo(
        path=shown,
        format="kineto",
        tool="torch.profiler",
        tool_version=f"kineto schema {version}" if version is not None else None,
        schema_version=str(version) if version is not None else None,
        host=top.host_name if isinstance(top.host_name, str) else None,
        rank_hint=_as_int(dist.get("rank")),
        world_size=_as_int(dist.get("world_size")),
        nccl_version=str(nccl) if nccl is not None else None,
        has_gpu_trace=has_gpu,
        has_api_trace=has_api,
        has_ranges=True,
    )
    if top.baseTimeNanoseconds is not None:
        # Event times stay as written (ts); the base puts them on the wall clock, which the
        # cross-rank reduce refines from the collectives themselves (metrics.waits).
        info.env["base_time_ns"] = str(top.baseTimeNanoseconds)
        base = _as_int(top.baseTimeNanoseconds)
        if base is not None and base > 0:
            info.clock_base_ns = base
            info.clock_source = "Kineto baseTimeNanoseconds"
    if isinstance(dist.get("backend"), str):
        info.env["distributed_backend"] = dist["backend"]
    return info
