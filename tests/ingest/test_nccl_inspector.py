"""NCCL Inspector logs (traceguard.ingest.nccl_inspector): real 2×H100 FSDP2 dumps from
../shared/fixtures/nccl-inspector, expected values from plain ``json.loads`` over the same lines.

Only the error cases (a line cut short, an unknown format version, a line that is not JSON) are
made here, by editing a copy of a real file."""

from __future__ import annotations

import gzip
import json
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SHARED
from traceguard.errors import UnsupportedFormatError
from traceguard.ingest.nccl_inspector import (
    FORMAT_MAJOR,
    looks_like_inspector,
    looks_like_inspector_prom,
    parse_prom,
    read_inspector,
    read_inspector_json,
)
from traceguard.ingest.sides import discover, split_inputs
from traceguard.ingest.uploads import classify

FIXTURES = SHARED / "fixtures" / "nccl-inspector"
RUNS = ("p2p", "shm")
pytestmark = pytest.mark.skipif(not FIXTURES.is_dir(), reason="../shared/fixtures/nccl-inspector not present")


def _files(run: str) -> list[Path]:
    return sorted(FIXTURES.glob(f"fsdp2_{run}_rank*.log.gz"))


def _lines(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("run", RUNS)
def test_reader_matches_plain_json(run: str) -> None:
    for path in _files(run):
        expected = _lines(path)
        record, ops = read_inspector_json(path)
        assert record.lines == ops.height == len(expected) == 540
        assert record.version == expected[0]["metadata"]["inspector_output_format_version"] == "v4.0"
        assert not record.verbose and not record.warnings and record.partial_tail_bytes == 0
        perf = [e["coll_perf"] for e in expected]
        assert dict(Counter(p["coll"] for p in perf)) == dict(
            ops.group_by("coll").len().select(pl.col("coll").cast(pl.String), "len").iter_rows()
        )
        assert Counter(p["coll"] for p in perf) == {"AllGather": 360, "ReduceScatter": 180}
        assert ops["exec_ns"].sum() == 1000 * sum(p["coll_exec_time_us"] for p in perf)
        assert ops["msg_bytes"].sum() == sum(p["coll_msg_size_bytes"] for p in perf)
        assert ops["busbw_gbps"].sum() == pytest.approx(sum(p["coll_busbw_gbs"] for p in perf))
        assert ops["dump_us"].to_list() == [e["metadata"]["dump_timestamp_us"] for e in expected]
        assert ops["coll_sn"].to_list() == [p["coll_sn"] for p in perf]
        assert set(ops["timing_source"].cast(pl.String)) == {p["coll_timing_source"] for p in perf}
        header, meta = expected[0]["header"], expected[0]["metadata"]
        assert ops["comm_id"].unique().to_list() == [int(header["id"], 16)]
        assert ops["comm_rank"].unique().to_list() == [header["rank"]]
        assert record.processes == [(meta["hostname"], meta["pid"])]
        assert ops["start_us"].null_count() == ops.height  # default dump: no event trace


@pytest.mark.parametrize("run", RUNS)
def test_directory_of_ranks_gives_each_process_its_rank(run: str) -> None:
    data = read_inspector(_files(run))
    expected = {
        (e["metadata"]["hostname"], e["metadata"]["pid"]): e["header"]["rank"]
        for path in _files(run)
        for e in _lines(path)[:1]
    }
    assert {(h, p): r for h, p, r in data.ranks.select("host", "pid", "rank").iter_rows()} == expected
    assert sorted(expected.values()) == [0, 1]
    assert data.ops.height == 1080 and not data.errors


def test_plain_and_gzip_and_small_blocks_read_the_same(tmp_path: Path) -> None:
    path = _files("p2p")[1]
    plain = tmp_path / "vm-pid933.log"
    plain.write_bytes(gzip.decompress(path.read_bytes()))
    _, from_gz = read_inspector_json(path)
    _, from_plain = read_inspector_json(plain)
    _, in_blocks = read_inspector_json(plain, block_bytes=1000)  # lines cut across block boundaries
    assert from_gz.equals(from_plain) and from_gz.equals(in_blocks)


def test_partial_last_line_is_a_file_still_being_written(tmp_path: Path) -> None:
    raw = gzip.decompress(_files("p2p")[0].read_bytes())
    lines = raw.splitlines(keepends=True)
    growing = tmp_path / "vm-pid932.log"
    growing.write_bytes(b"".join(lines[:-1]) + lines[-1][:100])  # the writer is mid-line
    record, ops = read_inspector_json(growing)
    assert ops.height == 539
    assert record.partial_tail_bytes == 100
    assert "still being written" in record.warnings[0]
    # A complete last line without its newline is a line, not a fragment.
    no_newline = tmp_path / "vm-pid932-done.log"
    no_newline.write_bytes(raw.rstrip(b"\n"))
    record, ops = read_inspector_json(no_newline)
    assert ops.height == 540 and not record.warnings
    # A gzip stream cut short (the writer's gzip still open) keeps what came before.
    cut = tmp_path / "vm-pid932.log.gz"
    cut.write_bytes(gzip.compress(raw)[:-200])
    record, ops = read_inspector_json(cut)
    assert 0 < ops.height <= 540 and any("ends early" in w or "still being written" in w for w in record.warnings)


def test_unknown_major_version_is_refused(tmp_path: Path) -> None:
    raw = gzip.decompress(_files("p2p")[0].read_bytes())
    newer = tmp_path / "vm-pid932.log"
    newer.write_bytes(
        raw.replace(b'"inspector_output_format_version":"v4.0"', b'"inspector_output_format_version":"v5.0"')
    )
    with pytest.raises(UnsupportedFormatError) as caught:
        read_inspector_json(newer)
    message = str(caught.value)
    assert "'v5.0'" in message and f"v{FORMAT_MAJOR}.x" in message and str(newer) in message
    # In a directory, the refused file is an error entry and the other rank is still read.
    other = tmp_path / "vm-pid933.log"
    other.write_bytes(gzip.decompress(_files("p2p")[1].read_bytes()))
    data = read_inspector([newer, other])
    assert data.ops.height == 540 and len(data.errors) == 1 and "v5.0" in data.errors[0]


def test_a_line_that_is_not_json_is_skipped_and_counted(tmp_path: Path) -> None:
    lines = gzip.decompress(_files("shm")[0].read_bytes()).splitlines(keepends=True)
    damaged = tmp_path / "vm-pid1010.log"
    damaged.write_bytes(b"".join(lines[:10]) + b"{not json\n" + b"".join(lines[10:]))
    record, ops = read_inspector_json(damaged)
    assert ops.height == 540 and record.bad_lines == 1
    # JSON, but a field of another type than the plugin writes: that line alone is left out.
    odd = tmp_path / "vm-pid1010-odd.log"
    wrong = lines[20].replace(b'"coll_sn":', b'"coll_sn":"x","was":', 1)
    odd.write_bytes(b"".join(lines[:20]) + wrong + b"".join(lines[21:]))
    record, ops = read_inspector_json(odd)
    assert ops.height == 539 and record.bad_lines == 1


def test_recognised_by_content(tmp_path: Path) -> None:
    for path in _files("p2p"):
        assert classify(path).kind == "nccl_inspector"
        assert looks_like_inspector(gzip.decompress(path.read_bytes())[:4096])
    captures, sides = split_inputs([str(p) for p in _files("shm")])
    assert captures == [] and sides.nccl_inspector == _files("shm")
    # A bundle keeps them under inspector/ (traceguard harness run --nccl-inspector).
    (tmp_path / "inspector").mkdir()
    for path in _files("p2p"):
        (tmp_path / "inspector" / path.name).write_bytes(path.read_bytes())
    assert [p.name for p in discover(tmp_path).nccl_inspector] == [p.name for p in _files("p2p")]


#: The Prometheus textfile form, as inspector_prom.cc writes it (its snprintf formats; the label
#: values are the plugin README's own example). Real dumps: tests/ingest/test_nccl_inspector_h200x2.py.
PROM_FROM_PLUGIN_FORMAT = """\
nccl_bus_bandwidth_gbs{version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="GPU0",comm_name="DP Group 0",n_nodes="1",nranks="4",collective="AllReduce",message_size="4-5GB",algo_proto="Ring_ll"} 678.263
nccl_collective_exec_time_microseconds{version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="GPU0",comm_name="DP Group 0",n_nodes="1",nranks="4",collective="AllReduce",message_size="4-5GB",algo_proto="Ring_ll"} 9498.47
nccl_p2p_bus_bandwidth_gbs{version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="GPU0",comm_name="DP Group 0",n_nodes="1",nranks="4",p2p_operation="Send",message_size="512-513MB"} 464.9
nccl_p2p_exec_time_microseconds{version="v5.1",slurm_job_id="unknown",node="nvl72004-T01",gpu="GPU0",comm_name="DP Group 0",n_nodes="1",nranks="4",p2p_operation="Send",message_size="512-513MB"} 1154.87
"""  # noqa: E501


def test_prometheus_textfile_in_the_plugins_format(tmp_path: Path) -> None:
    assert looks_like_inspector_prom(PROM_FROM_PLUGIN_FORMAT)
    rows = parse_prom(PROM_FROM_PLUGIN_FORMAT).to_dicts()
    assert len(rows) == 2
    coll, p2p = rows
    assert (coll["coll"], coll["p2p"], coll["n_ranks"], coll["algo_proto"]) == ("AllReduce", False, 4, "Ring_ll")
    assert (coll["exec_mean_us"], coll["busbw_gm_gbps"]) == (9498.47, 678.263)
    assert (p2p["coll"], p2p["p2p"], p2p["message_size"]) == ("Send", True, "512-513MB")
    path = tmp_path / "nccl_inspector_metrics_GPU-0.prom"
    path.write_text(PROM_FROM_PLUGIN_FORMAT)
    assert classify(path).kind == "nccl_inspector"
    data = read_inspector([path])
    assert data.prom.height == 2 and data.ops.height == 0 and data.files[0].version == "v5.1"


#: The plugin README's verbose example (NVIDIA's, ../shared/device/nccl-inspector-src.tar.gz), written
#: on one line as the plugin writes it. Real verbose dumps: tests/fixtures/h200x2_inspector.
VERBOSE_FROM_PLUGIN_README = {
    "header": {"id": "0xe62dedaa97644a", "rank": 4, "n_ranks": 8, "nnodes": 1},
    "metadata": {
        "inspector_output_format_version": "v4.0",
        "git_rev": "9019a1912-dirty",
        "rec_mechanism": "nccl_profiler_interface",
        "dump_timestamp_us": 1752867229276385,
        "hostname": "example-hostname",
        "pid": 438776,
    },
    "coll_perf": {
        "coll": "ReduceScatter",
        "coll_sn": 1231,
        "coll_msg_size_bytes": 2147483648,
        "coll_exec_time_us": 41057,
        "coll_timing_source": "kernel_gpu",
        "coll_algobw_gbs": 418.439467,
        "coll_busbw_gbs": 366.134533,
        "event_trace_sn": {
            "coll_start_sn": 1,
            "coll_stop_sn": 2,
            "kernel_events": [{"channel_id": 0, "kernel_start_sn": 3, "kernel_stop_sn": 48, "kernel_record_sn": 47}],
        },
        "event_trace_ts": {
            "coll_start_ts": 1752867229235059,
            "coll_stop_ts": 1752867229235064,
            "kernel_events": [
                {
                    "channel_id": 0,
                    "kernel_start_ts": 1752867229235181,
                    "kernel_stop_ts": 1752867229275811,
                    "kernel_record_ts": 1752867229275811,
                }
            ],
        },
    },
}


def test_verbose_line_in_the_plugins_readme_format(tmp_path: Path) -> None:
    path = tmp_path / "example-hostname-pid438776.log"
    path.write_text(json.dumps(VERBOSE_FROM_PLUGIN_README, separators=(",", ":")) + "\n")
    record, ops = read_inspector_json(path)
    row = ops.row(0, named=True)
    trace = VERBOSE_FROM_PLUGIN_README["coll_perf"]["event_trace_ts"]["kernel_events"]
    assert record.verbose
    assert (row["start_us"], row["stop_us"], row["channels"]) == (
        min(k["kernel_start_ts"] for k in trace),
        max(k["kernel_stop_ts"] for k in trace),
        len(trace),
    )
    assert (row["comm_rank"], row["n_ranks"], row["exec_ns"]) == (4, 8, 41_057_000)
    assert row["comm_name"] is None  # older lines have no comm_name


def test_upload_validation_holds_inspector_logs_to_the_capture_limit(tmp_path: Path) -> None:
    from traceguard.ingest.uploads import validate

    for path in _files("p2p"):
        found = classify(path)
        # A long job's log is far above the side-file limit: it is held to the capture one.
        validate(path, found, scratch=tmp_path, max_expanded_bytes=1 << 30, max_side_bytes=1024)
