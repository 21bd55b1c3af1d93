"""Property-based fuzzing (hypothesis): inputs built from each format's own vocabulary, so that most
of them get past the first checks and into the parsing and normalization code.

The property is the same everywhere: a reader returns, or raises the project's error; nothing else.
Examples are derandomized (the same in every CI run); ``TRACEGUARD_FUZZ_EXAMPLES`` raises the count.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import examples_per_reader
from traceguard.errors import TraceguardError

FUZZ = settings(
    max_examples=examples_per_reader(60),
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large],
)

# -- JSON values of every shape ----------------------------------------------------------------------

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
    st.sampled_from(["", "0", "-1", "1e999", "cuda", "GPU 0", "ncclDevKernel_AllReduce", "Memcpy HtoD"]),
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)

CATEGORIES = ["kernel", "gpu_memcpy", "gpu_memset", "cuda_runtime", "cuda_driver", "user_annotation",
              "gpu_user_annotation", "cpu_op", "python_function", "ac2g", "Kernel", "Memcpy", "Runtime", "Trace"]
ARG_KEYS = ["device", "stream", "correlation", "bytes", "name", "labels", "Collective name", "In msg nelems",
            "Out msg nelems", "Group size", "dtype", "Dst Rank", "Src Rank", "Input Dims", "Input type",
            "External id", "context"]


def _maybe(value: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(value, json_values)


events = st.fixed_dictionaries(
    {},
    optional={
        "ph": _maybe(st.sampled_from(["X", "M", "i", "s", "f", "B", "E"])),
        "cat": _maybe(st.sampled_from(CATEGORIES)),
        "name": _maybe(st.sampled_from(["ncclDevKernel_AllReduce_Sum_f32_RING_LL", "cudaLaunchKernel",
                                        "ProfilerStep#3", "nccl:all_reduce", "process_name", "Memcpy DtoD"])),
        "pid": _maybe(st.integers(-5, 2**40)),
        "tid": _maybe(st.integers(-5, 2**40)),
        "ts": _maybe(st.floats(-1e18, 1e18, allow_nan=False)),
        "dur": _maybe(st.floats(-10, 1e12, allow_nan=False)),
        "id": json_values,
        "args": st.one_of(json_values, st.dictionaries(st.sampled_from(ARG_KEYS), _maybe(st.integers(-1, 2**40)))),
    },
)
traces = st.fixed_dictionaries(
    {"traceEvents": st.one_of(st.lists(events, max_size=25), json_values)},
    optional={
        "schemaVersion": json_values,
        "distributedInfo": st.one_of(
            json_values, st.fixed_dictionaries({"rank": json_values, "world_size": json_values})
        ),
        "deviceProperties": st.one_of(
            json_values, st.lists(st.dictionaries(st.sampled_from(["id", "name", "numSms"]), json_values))
        ),
        "displayTimeUnit": st.sampled_from(["ns", "ms", "us", 3]),
        "baseTimeNanoseconds": json_values,
    },
)


def _no_crash(read: Any, *args: Any) -> None:
    with contextlib.suppress(TraceguardError):
        read(*args)


def _sanitize(value: Any) -> Any:  # json.dumps writes NaN/inf as bare words, which is not JSON
    if isinstance(value, float) and not math.isfinite(value):
        return 0.0
    return value


@FUZZ
@given(doc=traces, compress=st.booleans())
def test_kineto_traces_of_any_shape(doc: dict[str, Any], compress: bool, tmp_path: Path) -> None:
    from traceguard.ingest import read_capture

    data = json.dumps(doc, default=str).encode()
    path = tmp_path / "trace.json"
    path.write_bytes(gzip.compress(data, mtime=0) if compress else data)
    _no_crash(read_capture, path)


PREFIXES = [b"", b"SQLite format 3\x00", b"\x1f\x8b\x08\x00", b'{"traceEvents": [', b"[{\"ph\": ", b"PK\x03\x04"]


@FUZZ
@given(prefix=st.sampled_from(PREFIXES), body=st.binary(max_size=2048))
def test_any_bytes_as_a_capture(prefix: bytes, body: bytes, tmp_path: Path) -> None:
    """Whatever the bytes, the content sniffing and the reader it picks end in the project's error."""
    from traceguard.ingest import read_capture
    from traceguard.ingest.uploads import classify

    path = tmp_path / "capture.bin"
    path.write_bytes(prefix + body)
    _no_crash(read_capture, path)
    _no_crash(classify, path)


# -- text side inputs, from their own line vocabulary ---------------------------------------------------

LINE_PARTS = {
    "dmon": ["# gpu", "# Idx", "pwr", "gtemp", "rxpci", "txpci", "MB/s", "#Date", "Time", "0", "1", "-", "N/A",
             "20240101", "12:00:00", "999999999999999999999", "-5", "3.5"],
    "topo": ["GPU0", "GPU1", "X", "NV18", "NV4", "PIX", "PHB", "SYS", "NODE", "PXB", "CPU Affinity", "NUMA Affinity",
             "0-63", "N/A", "NIC0", "Legend:", "\x1b[4m", "^[[0m", "\t"],
    "nccl_tests": ["#", "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "(B)",
                   "(elements)", "(us)", "(GB/s)", "float", "sum", "-1", "8", "1024", "12.5", "0", "N/A",
                   "# Collective test starting: all_reduce_perf", "# Avg bus bandwidth    : 1.5"],
    "smi_q": ["GPU 00000000:18:00.0", "PCI", "GPU Link Info", "PCIe Generation", "Max", "Current", "Link Width",
              ": 4", ": 16x", ": 5", "Bus Id", "Minor Number", ": 0", "N/A", "Device Current"],
    "nccl_log": ["host:123:456 [0] NCCL INFO", "NCCL version 2.21.5+cuda12.4", "Channel 00/0 :", "0[0] -> 1[1]",
                 "via P2P/IPC", "via NET/IB/0/GDRDMA", "via SHM/direct/direct", "comm 0x1234 rank 0 nranks 2",
                 "cudaDev 0 busId 18000", "Ring 00 : 0 1", "Trees [0] 1/-1/-1->0->-1", "NCCL WARN", "Init COMPLETE",
                 "[1]", "nvmlInit", "Connected all rings", "99999999999999999999", "-1", "\xff"],
}


def _text_of(kind: str) -> st.SearchStrategy[str]:
    token = st.one_of(st.sampled_from(LINE_PARTS[kind]), st.text(max_size=6))
    line = st.lists(token, max_size=12).map(lambda parts: " ".join(parts))
    return st.lists(line, max_size=30).map("\n".join)


@pytest.mark.parametrize("kind", sorted(LINE_PARTS))
def test_side_inputs_of_their_own_vocabulary(kind: str, tmp_path: Path) -> None:
    from traceguard.ingest.nccl_log import read_nccl_logs
    from traceguard.ingest.sides import SideFiles, load_side

    @FUZZ
    @given(text=_text_of(kind))
    def check(text: str) -> None:
        path = tmp_path / f"{kind}.txt"
        path.write_bytes(text.encode("utf-8", errors="surrogateescape"))
        if kind == "nccl_log":
            _no_crash(read_nccl_logs, [path])
        else:
            data = load_side(SideFiles(**{kind: [path]}))
            assert all(path.name in problem for problem in data.errors), data.errors

    check()


# -- profiles and manifests ---------------------------------------------------------------------------

toml_values = st.one_of(
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=10),
    st.lists(st.text(max_size=5), max_size=3),
)
RULE_KEYS = ["enabled", "op", "warn", "fail", "min_steps", "min_collectives", "expect_gpu", "bogus", "min_bytes"]


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


@FUZZ
@given(
    top=st.dictionaries(st.sampled_from(["name", "description", "extends", "step_patterns", "steps"]), toml_values),
    rules=st.dictionaries(
        st.sampled_from(["nccl_transport", "comm_overlap", "step_time_cv", "x"]),
        st.dictionaries(st.sampled_from(RULE_KEYS), toml_values, max_size=5),
        max_size=3,
    ),
)
def test_profiles_of_any_content(top: dict[str, Any], rules: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    from traceguard.checks.profiles import load_profile

    lines = [f"{key} = {_toml(value)}" for key, value in top.items()]
    for rule, keys in rules.items():
        lines.append(f"[rules.{rule}]")
        lines += [f"{key} = {_toml(value)}" for key, value in keys.items()]
    path = tmp_path / "fuzzed.toml"
    path.write_text("\n".join(lines) + "\n", errors="surrogateescape")
    _no_crash(load_profile, str(path))


@FUZZ
@given(
    doc=st.one_of(
        json_values,
        st.fixed_dictionaries(
            {"captures": st.lists(st.dictionaries(st.sampled_from(["path", "rank"]), json_values), max_size=4)}
        ),
    )
)
def test_manifests_of_any_content(doc: Any, tmp_path: Path) -> None:
    from traceguard.ingest import bundle_captures
    from traceguard.service.intake import _manifest_ranks

    folder = tmp_path / "bundle"
    folder.mkdir(exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(doc, default=_sanitize))
    _no_crash(bundle_captures, folder)
    _manifest_ranks({"manifest.json": folder / "manifest.json"})
