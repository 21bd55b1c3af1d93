"""NCCL Inspector reader on real runs made with the plugin on the lent 2-GPU machine (2×H200, NCCL
2.28.9; tests/fixtures/h200x2_inspector/README.md): default and verbose JSON dumps, and the
Prometheus textfiles copied while the job ran. Every expected value comes from plain ``json.loads``
(or a line-by-line reading of the Prometheus text), never from traceguard."""

from __future__ import annotations

import gzip
import json
import re
import shutil
from collections import Counter
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import OWN
from traceguard.ingest.nccl_inspector import PROM_METRICS, prom_name, read_inspector, read_inspector_json
from traceguard.ingest.sides import discover
from traceguard.ingest.uploads import classify

RUNS_DIR = OWN / "h200x2_inspector"
JSON_RUNS = ("clean_default", "slow_default", "shm_default", "clean_verbose", "slow_verbose")
SNAP = RUNS_DIR / "prom" / "snap"


def _files(run: str) -> list[Path]:
    return sorted((RUNS_DIR / run / "inspector").glob("*.log.gz"))


def _lines(path: Path) -> list[dict]:
    with gzip.open(path, "rt") as fh:
        return [json.loads(line) for line in fh]


@pytest.mark.parametrize("run", JSON_RUNS)
def test_real_runs_read_as_plain_json_says(run: str) -> None:
    files = _files(run)
    assert len(files) == 2
    for path in files:
        expected = _lines(path)
        record, ops = read_inspector_json(path)
        perf = [e["coll_perf"] for e in expected]
        assert record.lines == ops.height == len(expected)
        assert record.version == "v4.0" == expected[0]["metadata"]["inspector_output_format_version"]
        assert record.verbose == ("verbose" in run) == ("event_trace_ts" in perf[0])
        assert not record.warnings and record.bad_lines == 0
        assert record.processes == [(expected[0]["metadata"]["hostname"], expected[0]["metadata"]["pid"])]
        assert Counter(ops["coll"].cast(pl.String).to_list()) == Counter(p["coll"] for p in perf)
        assert ops["coll_sn"].to_list() == [p["coll_sn"] for p in perf]
        assert ops["exec_ns"].to_list() == [1000 * p["coll_exec_time_us"] for p in perf]
        assert ops["msg_bytes"].to_list() == [p["coll_msg_size_bytes"] for p in perf]
        assert ops["comm_rank"].to_list() == [e["header"]["rank"] for e in expected]
        assert set(ops["timing_source"].cast(pl.String)) == {p["coll_timing_source"] for p in perf} == {"kernel_gpu"}
        if record.verbose:
            events = [p["event_trace_ts"]["kernel_events"] for p in perf]
            assert ops["start_us"].to_list() == [
                min(k["kernel_start_ts"] for k in e if k["kernel_start_ts"]) for e in events
            ]
            assert ops["stop_us"].to_list() == [
                max(k["kernel_stop_ts"] for k in e if k["kernel_stop_ts"]) for e in events
            ]
            assert ops["channels"].to_list() == [sum(1 for k in e if k["kernel_start_ts"]) for e in events]
        else:
            assert ops["start_us"].null_count() == ops.height


@pytest.mark.parametrize("run", JSON_RUNS)
def test_bundle_finds_its_inspector_logs_and_the_ranks(run: str) -> None:
    assert discover(RUNS_DIR / run).nccl_inspector == _files(run)
    data = read_inspector(_files(run))
    manifest = json.loads((RUNS_DIR / run / "manifest.json").read_text())
    # The world rank of each process: header.rank in its (only, 2-rank) communicator; the harness
    # started ranks in pid order, as the manifest's NCCL log names say.
    pids = sorted(int(re.search(r"\.(\d+)\.log", name).group(1)) for name in manifest["nccl_logs"])
    expected = {}
    for path in _files(run):
        first = _lines(path)[0]
        expected[first["metadata"]["pid"]] = first["header"]["rank"]
    assert dict(zip(data.ranks["pid"], data.ranks["rank"], strict=True)) == expected
    assert sorted(expected) == pids and [expected[p] for p in pids] == [0, 1]


# --------------------------------------------------------------------------------------------
# Prometheus textfiles (NCCL_INSPECTOR_PROM_DUMP=1), copied every 3 s while the job ran

_SAMPLE = re.compile(r"^(\w+)\{(.*)\} (\S+)$")


def _prom_text(path: Path) -> list[tuple[str, dict[str, str], float]]:
    out = []
    for line in path.read_text().splitlines():
        name, labels, value = _SAMPLE.match(line).groups()
        tags = dict(part.split("=", 1) for part in labels.split(","))
        out.append((name, {k: v.strip('"') for k, v in tags.items()}, float(value)))
    return out


def test_prometheus_snapshots_parse_as_their_text_says() -> None:
    snaps = sorted(SNAP.glob("*.prom"))
    assert len(snaps) == 20
    for path in snaps:
        samples = _prom_text(path)
        assert {name for name, _, _ in samples} <= set(PROM_METRICS)
        data = read_inspector([path])
        rows = data.prom.to_dicts()
        assert classify(path).kind == "nccl_inspector" and data.ops.height == 0
        assert len(rows) * 2 == len(samples)  # one row per label set: busbw and exec time
        uuid, second = prom_name(path.name)
        assert path.name == f"nccl_inspector_metrics_{uuid}_t{second:03d}.prom"
        for name, tags, value in samples:
            row = next(r for r in rows if (r["message_size"], r["coll"]) == (tags["message_size"], tags["collective"]))
            assert (row["version"], row["slurm_job_id"], row["node"], row["gpu"]) == (
                tags["version"],
                tags["slurm_job_id"],
                tags["node"],
                tags["gpu"],
            )
            assert (row["comm_name"], row["n_nodes"], row["n_ranks"], row["algo_proto"]) == (
                tags["comm_name"],
                int(tags["n_nodes"]),
                int(tags["nranks"]),
                tags["algo_proto"],
            )
            assert (row["gpu_uuid"], row["snapshot_s"], row["p2p"]) == (uuid, second, False)
            column = "exec_mean_us" if name == "nccl_collective_exec_time_microseconds" else "busbw_gm_gbps"
            assert row[column] == value
        assert data.files[0].version == "v5.1" == samples[0][1]["version"]  # not the JSON format's v4.0


def test_the_gpu_label_is_the_cuda_ordinal_the_uuid_is_in_the_file_name() -> None:
    manifest = (RUNS_DIR / "prom" / "manifest.json").read_text()
    by_uuid = {}
    for path in sorted(SNAP.glob("*.prom")):
        gpus = {tags["gpu"] for _, tags, _ in _prom_text(path)}
        by_uuid.setdefault(prom_name(path.name)[0], set()).update(gpus)
    assert by_uuid == {
        "4dcaef53-c2ee-2d47-3ff0-bab0845de637": {"GPU0"},
        "b07a36d3-7282-1504-cfd0-b1522df2a917": {"GPU1"},
    }
    assert "NCCL_INSPECTOR_PROM_DUMP" in manifest


def test_a_directory_of_snapshots_reads_each_distinct_dump_once_per_gpu() -> None:
    snaps = sorted(SNAP.glob("*.prom"))
    # Plain reading: per GPU, the distinct contents in time order (the copy loop's _tNNN).
    distinct: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(snaps, key=lambda p: int(p.stem.rsplit("_t", 1)[1])):
        uuid = path.stem.removeprefix("nccl_inspector_metrics_").rsplit("_t", 1)[0]
        seen = distinct.setdefault(uuid, [])
        if not seen or seen[-1][1] != path.read_text():
            seen.append((int(path.stem.rsplit("_t", 1)[1]), path.read_text()))
    # The plugin rewrites its file every 30 s at most: the 3-s copies of this 76-s job (t051..t078)
    # all hold the one dump it made while they were taken.
    assert {u: [t for t, _ in v] for u, v in distinct.items()} == {
        "4dcaef53-c2ee-2d47-3ff0-bab0845de637": [51],
        "b07a36d3-7282-1504-cfd0-b1522df2a917": [51],
    }
    data = read_inspector(snaps)
    assert data.prom.height == sum(len(text.splitlines()) // 2 for v in distinct.values() for _, text in v) == 6
    assert set(zip(data.prom["gpu_uuid"], data.prom["snapshot_s"], strict=True)) == {(u, 51) for u in distinct}
    assert data.prom["latest"].all()
    repeats = [f for f in data.files if f.same_as]
    assert len(repeats) == 18 and all(f.same_as.endswith("_t051.prom") for f in repeats)
    assert all(prom_name(Path(f.path).name)[0] == prom_name(Path(f.same_as).name)[0] for f in repeats)


def test_a_later_distinct_snapshot_is_kept_and_marked_latest(tmp_path: Path) -> None:
    """Both copy namings (``_t030.prom`` and ``.prom_t030``); a dump that changed is a new snapshot."""
    first = SNAP / "nccl_inspector_metrics_b07a36d3-7282-1504-cfd0-b1522df2a917_t051.prom"
    shutil.copy(first, tmp_path / "nccl_inspector_metrics_b07a36d3-7282-1504-cfd0-b1522df2a917.prom_t051")
    changed = first.read_text().replace("} 154.5\n", "} 160.25\n")
    assert changed != first.read_text()
    (tmp_path / "nccl_inspector_metrics_b07a36d3-7282-1504-cfd0-b1522df2a917.prom_t081").write_text(changed)
    assert prom_name("nccl_inspector_metrics_b07a36d3-7282-1504-cfd0-b1522df2a917.prom_t081") == (
        "b07a36d3-7282-1504-cfd0-b1522df2a917",
        81,
    )
    assert prom_name("nccl_inspector_metrics_GPU-0.prom") == ("GPU-0", None)
    data = read_inspector(sorted(tmp_path.iterdir()))
    assert data.prom.height == 6 and not any(f.same_as for f in data.files)
    latest = data.prom.filter(pl.col("latest"))
    assert latest["snapshot_s"].unique().to_list() == [81]
    assert (
        160.25 in latest["exec_mean_us"].to_list() and 160.25 not in data.prom.filter(~pl.col("latest"))["exec_mean_us"]
    )


def test_a_log_sent_again_as_it_grew_is_read_once(tmp_path: Path) -> None:
    """One process's log twice, an early copy (its first 300 lines, the last one cut mid-line as a
    file still being written) beside the whole file: every line is read once, and the other
    process's file is untouched. Counts from plain ``json.loads``."""
    first, second = _files("slow_default")
    lines = gzip.decompress(first.read_bytes()).splitlines(keepends=True)
    early = tmp_path / "early.log"
    early.write_bytes(b"".join(lines[:300]) + lines[300][:100])
    whole = [json.loads(line) for path in (first, second) for line in gzip.decompress(path.read_bytes()).splitlines()]
    data = read_inspector([early, first, second])
    assert data.ops.height == len(whole) == 2 * 561
    keys = data.ops.select("host", "pid", "comm_id", "coll", "coll_sn")
    assert keys.unique().height == data.ops.height
    assert data.ranks.height == 2
    warned = [w for f in data.files for w in f.warnings if "read once" in w]
    assert any(str(first) in w and str(early) in w for w in warned)
    assert data.files[0].partial_tail_bytes == 100
