"""Kineto ingestion against every public Kineto capture, checked against plain ``json``.

Expected values are computed here from the raw JSON with the standard library (``json`` with
``Decimal`` floats, so times are exact), independently of the reader's msgspec/Polars code.
"""

from __future__ import annotations

import gzip
import json
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import PUBLIC_KINETO, public_kineto
from traceguard.errors import InputError
from traceguard.ingest.kineto import looks_like_kineto, read_kineto
from traceguard.model import (
    API_CALLS_SCHEMA,
    DEVICES_SCHEMA,
    GPU_OPS_SCHEMA,
    PROCESSES_SCHEMA,
    RANGES_SCHEMA,
    STRINGS_SCHEMA,
    Capture,
)

KERNEL_CATS = {"kernel", "Kernel"}
MEMCPY_CATS = {"gpu_memcpy", "Memcpy"}
MEMSET_CATS = {"gpu_memset", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}
STEP_CATS = {"cpu_op", "Operator", "user_annotation"}

IDS = [p.name.split("__")[-1][:40] for p in PUBLIC_KINETO]


@cache
def raw(path: Path) -> dict[str, Any]:
    """The trace as the standard library sees it; floats as exact Decimals."""
    with gzip.open(path, "rt") as f:
        data = json.load(f, parse_float=Decimal)
    return data if isinstance(data, dict) else {"traceEvents": data}


@cache
def capture(path: Path) -> Capture:
    return read_kineto(path)


def events(path: Path, cats: set[str]) -> list[dict[str, Any]]:
    return [e for e in raw(path)["traceEvents"] if e.get("ph") == "X" and e.get("cat") in cats]


def ns(value: Any) -> int:
    """µs (as written) → ns, exactly."""
    return int((Decimal(value) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def test_every_public_kineto_fixture_is_listed() -> None:
    assert len(PUBLIC_KINETO) == 8


@pytest.mark.parametrize("path", PUBLIC_KINETO, ids=IDS)
def test_counts_match_plain_json(path: Path) -> None:
    cap = capture(path)
    ops = cap.gpu_ops
    assert ops.schema == pl.Schema(GPU_OPS_SCHEMA)
    assert cap.api_calls.schema == pl.Schema(API_CALLS_SCHEMA)
    assert cap.ranges.schema == pl.Schema(RANGES_SCHEMA)
    assert cap.devices.schema == pl.Schema(DEVICES_SCHEMA)
    assert cap.processes.schema == pl.Schema(PROCESSES_SCHEMA)
    assert cap.strings.schema == pl.Schema(STRINGS_SCHEMA)

    kernels = events(path, KERNEL_CATS)
    memcpys = events(path, MEMCPY_CATS)
    assert ops.filter(pl.col("kind") == "kernel").height == len(kernels)
    assert ops.filter(pl.col("kind") == "memset").height == len(events(path, MEMSET_CATS))
    assert cap.api_calls.height == len(events(path, RUNTIME_CATS))

    # "Memcpy DtoH (Device -> Pinned)" → DtoH
    expected_copies = Counter(e["name"].split()[1] for e in memcpys)
    got_copies = Counter(dict(ops.filter(pl.col("kind") == "memcpy").group_by("copy_kind").len().iter_rows()))
    assert got_copies == expected_copies

    dtoh_bytes = sum(e["args"].get("bytes", 0) for e in memcpys if e["name"].split()[1] == "DtoH")
    assert (ops.filter(pl.col("copy_kind") == "DtoH")["bytes"].sum() or 0) == dtoh_bytes

    names = cap.name_of()
    nccl = [names[i] for i in ops.filter(pl.col("kind") == "kernel")["name_id"]]
    assert sum(n.startswith("nccl") for n in nccl) == sum(e["name"].startswith("nccl") for e in kernels)

    steps = events(path, STEP_CATS)
    n_steps = sum(e["name"].startswith("ProfilerStep#") for e in steps)
    assert cap.ranges.filter(pl.col("name").str.starts_with("ProfilerStep#")).height == n_steps
    n_ranges = sum(e["cat"] == "user_annotation" or e["name"].startswith("ProfilerStep#") for e in steps)
    assert cap.ranges.height == n_ranges

    dist = raw(path).get("distributedInfo") or {}
    assert cap.info.rank_hint == dist.get("rank")
    assert cap.info.world_size == dist.get("world_size")
    assert cap.info.format == "kineto"
    assert cap.info.has_gpu_trace == bool(kernels or memcpys)
    assert ops["rank"].null_count() == ops.height  # rank is resolved later, not by the reader


@pytest.mark.parametrize("path", PUBLIC_KINETO, ids=IDS)
def test_sample_event_times_and_launch_pid_exact(path: Path) -> None:
    cap = capture(path)
    runtime = {e["args"]["correlation"]: e for e in events(path, RUNTIME_CATS) if "correlation" in e["args"]}
    kernels = events(path, KERNEL_CATS)
    for sample in (kernels[0], kernels[len(kernels) // 2], kernels[-1]):
        args = sample["args"]
        row = cap.gpu_ops.filter(
            (pl.col("correlation_id") == args["correlation"]) & (pl.col("start") == ns(sample["ts"]))
        )
        assert row.height == 1, sample
        assert row["end"][0] == ns(sample["ts"]) + ns(sample["dur"])
        assert row["device"][0] == args["device"]
        assert row["stream"][0] == args["stream"]
        launch = runtime.get(args["correlation"])
        if launch is not None:
            assert row["pid"][0] == launch["pid"]
            call = cap.api_calls.filter(pl.col("correlation_id") == args["correlation"])
            assert call["start"][0] == ns(launch["ts"])
            assert call["end"][0] == ns(launch["ts"]) + ns(launch["dur"])
            assert call["tid"][0] == int(str(launch["tid"]))


def test_ns_resolution_trace_keeps_sub_microsecond_digits() -> None:
    """ts is µs even with displayTimeUnit "ns"; 1712195495519689.047 µs must not go through float."""
    path = public_kineto("ns_resolution")
    assert raw(path)["displayTimeUnit"] == "ns"
    starts = set(capture(path).api_calls["start"].to_list())
    sample = events(path, RUNTIME_CATS)[100]
    assert ns(sample["ts"]) in starts
    assert ns(sample["ts"]) % 1000 != 0 or Decimal(sample["ts"]) % 1 == 0


def test_nccl_allreduce_message_size() -> None:
    path = public_kineto("nccl_data")
    cap = capture(path)
    names = cap.name_of()
    for e in events(path, KERNEL_CATS):
        args = e["args"]
        if "AllReduce" not in e["name"]:
            continue
        assert args["dtype"] == "Float"
        row = cap.gpu_ops.filter(pl.col("correlation_id") == args["correlation"])
        assert names[row["name_id"][0]] == e["name"]
        assert row["msg_bytes"][0] == args["In msg nelems"] * 4
        assert row["group_size"][0] == args["Group size"] == 2
    assert cap.info.nccl_version == "2.17.1"


def test_legacy_2021_trace_string_tids_and_processes() -> None:
    cap = capture(public_kineto("resnet50_num_workers_0"))
    assert cap.api_calls["tid"].null_count() == 0
    assert set(cap.gpu_ops["stream"].unique().to_list()) == {7}
    assert cap.processes["pid"].to_list() == [25738]
    assert cap.info.rank_hint is None and cap.info.world_size is None
    assert cap.gpu_ops["pid"].null_count() == 0


def test_rocm_trace_memcpy_host_kind_and_devices() -> None:
    cap = capture(public_kineto("mi250"))
    copies = cap.gpu_ops.filter(pl.col("kind") == "memcpy")
    assert copies["copy_kind"].to_list() == ["HtoD", "HtoD"]
    assert copies["src_kind"].to_list() == ["unknown", "unknown"]  # ROCm says "Host"
    assert copies["dst_kind"].to_list() == ["device", "device"]
    assert cap.devices["name"][0] == "AMD Radeon Graphics"
    assert cap.gpu_ops["pid"].null_count() == 0


def test_ranges_nest_under_profiler_step() -> None:
    ranges = capture(public_kineto("trace_diff__control")).ranges
    steps = ranges.filter(pl.col("name").str.starts_with("ProfilerStep#"))
    assert steps["depth"].to_list() == [0] * steps.height
    assert ranges["range_id"].n_unique() == ranges.height
    assert ranges.filter(pl.col("depth") > 0)["parent"].null_count() == 0


@pytest.mark.parametrize("path", PUBLIC_KINETO, ids=IDS)
def test_sniffing(path: Path) -> None:
    with gzip.open(path, "rb") as f:
        assert looks_like_kineto(f.read(4096))


def test_sniffing_rejects_other_content() -> None:
    assert not looks_like_kineto(b"SQLite format 3\x00")
    assert not looks_like_kineto(b'{"a": 1}')
    assert not looks_like_kineto(b"[1, 2, 3]")
    assert looks_like_kineto(b'[{"ph": "X", "ts": 1}]')


def write(tmp_path: Path, name: str, content: bytes) -> Path:
    target = tmp_path / name
    target.write_bytes(content)
    return target


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "empty"),
        (b"  \n", "empty"),
        (b'{"a": 1}', "traceEvents"),
        (b"[1, 2, 3]", "trace event"),
        (b"[]", "no trace events"),
        (b'{"traceEvents": 5}', "traceEvents"),
        (b"42", "neither an object nor an array"),
        (b'{"schemaVersion": 1, "traceEvents": [{"ph": "X", "cat": "kernel"', "not valid JSON"),
        (b"not json at all", "not valid JSON"),
    ],
)
def test_malformed_inputs_raise_input_error(tmp_path: Path, content: bytes, message: str) -> None:
    with pytest.raises(InputError, match=message):
        read_kineto(write(tmp_path, "bad.json", content))


def test_truncated_gzip_raises_input_error(tmp_path: Path) -> None:
    blob = public_kineto("mi250").read_bytes()
    with pytest.raises(InputError, match="gzip"):
        read_kineto(write(tmp_path, "cut.json.gz", blob[: len(blob) // 2]))


def test_missing_file_raises_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        read_kineto(tmp_path / "absent.json")


def test_events_with_missing_or_odd_fields_are_skipped(tmp_path: Path) -> None:
    trace = {
        "schemaVersion": 1,
        "traceEvents": [
            {
                "ph": "X",
                "cat": "kernel",
                "name": "k",
                "pid": 0,
                "tid": 7,
                "ts": 10.5,
                "dur": 2,
                "args": {"device": 0, "stream": 7, "correlation": 1},
            },
            {"ph": "X", "cat": "kernel", "name": "no ts", "pid": 0, "tid": 7, "dur": 2},
            {"ph": "X", "cat": "kernel"},
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "cudaLaunchKernel",
                "pid": 9,
                "tid": "9",
                "ts": 9,
                "dur": 1,
                "args": {"correlation": 1},
            },
            {
                "ph": "X",
                "cat": "cuda_runtime",
                "name": "bad args",
                "pid": 9,
                "tid": 9,
                "ts": 9,
                "dur": 1,
                "args": {"correlation": [1, 2]},
            },
            {"ph": "X", "cat": 17, "name": "category is not a string", "ts": 1},
            "not an event",
            {
                "ph": "X",
                "cat": "user_annotation",
                "name": "ProfilerStep#0",
                "pid": 9,
                "tid": 9,
                "ts": 8,
                "dur": 100,
            },
        ],
    }
    cap = read_kineto(write(tmp_path, "odd.json", json.dumps(trace).encode()))
    assert cap.gpu_ops.height == 1
    assert cap.gpu_ops.row(0, named=True) | {"name_id": 0} == {
        "rank": None, "pid": 9, "device": 0, "stream": 7, "kind": "kernel", "start": 10_500,
        "end": 12_500, "name_id": 0, "correlation_id": 1, "bytes": None, "copy_kind": None,
        "src_kind": None, "dst_kind": None, "msg_bytes": None, "group_size": None, "peer": None,
    }  # fmt: skip
    assert cap.api_calls.height == 2
    assert cap.api_calls["correlation_id"].to_list() == [1, None]
    assert cap.ranges["name"].to_list() == ["ProfilerStep#0"]
    assert cap.info.rank_hint is None


def test_bare_event_array_and_gzip_sniffed_by_content(tmp_path: Path) -> None:
    events_only = [
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy PtoP (Device -> Device)", "pid": 1,
         "tid": 3, "ts": 1.0005, "dur": 0.25, "args": {"device": 1, "stream": 3, "bytes": 64}},
    ]  # fmt: skip
    path = write(tmp_path, "trace.bin", gzip.compress(json.dumps(events_only).encode()))
    op = read_kineto(path, source_path="s3://bucket/trace").gpu_ops.row(0, named=True)
    assert (op["copy_kind"], op["src_kind"], op["dst_kind"]) == ("PtoP", "device", "device")
    assert (op["start"], op["end"], op["bytes"], op["pid"]) == (1001, 1251, 64, None)


@pytest.mark.parametrize(
    ("raw", "repaired", "count"),
    [
        (b'["a\\udc00b"]', ["a\ufffdb"], 1),  # a lone low surrogate
        (b'["a\\ud800"]', ["a\ufffd"], 1),  # a high one at the end of a string
        (b'["a\\ud800\\u0041"]', ["a\ufffdA"], 1),  # a high one before a non-surrogate
        (b'["\\ud83d\\ude00"]', ["\U0001f600"], 0),  # a pair is one character: kept
        (b'["x\\\\ud800"]', ["x\\ud800"], 0),  # an escaped backslash, then text: kept
        (b'["x\\\\\\ud800"]', ["x\\\ufffd"], 1),  # an escaped backslash, then a lone surrogate
        (b'["\\ud800\\ud800\\udc00"]', ["\ufffd\U00010000"], 1),
        (b'["a\xffb", "\xef\xbf\xbd"]', ["a\ufffdb", "\ufffd"], 1),  # raw bytes; a real U+FFFD is not counted
    ],
)
def test_strings_that_are_not_utf8_are_repaired(raw: bytes, repaired: list[str], count: int) -> None:
    """Issue 25: one bad string made the whole trace unreadable; now each is read with U+FFFD."""
    import msgspec

    from traceguard.ingest.kineto import utf8_json

    fixed, replaced = utf8_json(raw)
    assert msgspec.json.decode(fixed) == repaired and replaced == count
