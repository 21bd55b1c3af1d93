"""bench_collectives prints nccl-tests' format: checked with our own nccl-tests parser."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from traceguard.capture import bench_collectives as bc
from traceguard.ingest.side_inputs import parse_nccl_tests

REPO = Path(__file__).resolve().parents[2]
FACTOR_2_RANKS = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}


def test_helpers() -> None:
    assert bc.parse_size("8") == 8 and bc.parse_size("64K") == 65536 and bc.parse_size("1G") == 1 << 30
    assert [bc.bus_factor(op, 2) for op in FACTOR_2_RANKS] == list(FACTOR_2_RANKS.values())
    assert bc.bus_factor("all_reduce", 8) == pytest.approx(1.75)
    # nccl-tests getFloatStr: 2 decimals while they fit, then fewer digits, then e-notation
    assert bc.float_str(42.561, 7) == "  42.56"
    assert bc.float_str(12345.6, 7) == "12345.6"
    assert bc.float_str(123456.7, 7) == " 123457"
    assert bc.float_str(1234.56, 6) == "1234.6"
    assert bc.float_str(0.0, 6) == "  0.00"


def test_format_round_trips_through_parser() -> None:
    row = {
        "size": 1048576,
        "count": 262144,
        "type": "float",
        "redop": "sum",
        "root": -1,
        "out_of_place": {"time_us": 28.15, "algbw": 37.25, "busbw": 65.19, "wrong": 0},
        "in_place": {"time_us": 27.52, "algbw": 38.10, "busbw": 66.67, "wrong": None},
    }
    text = "\n".join(["# Collective test starting: all_reduce_perf", *bc.header_lines(), bc.format_row(row)])
    got = parse_nccl_tests(text).row(0, named=True)
    assert got["collective"] == "all_reduce" and got["size_bytes"] == 1048576 and got["count"] == 262144
    assert (got["oop_time_us"], got["oop_busbw"], got["ip_algbw"], got["wrong"]) == (28.15, 65.19, 38.10, 0)


@pytest.mark.slow
def test_torchrun_gloo_two_ranks(tmp_path: Path) -> None:
    out, js = tmp_path / "bench.txt", tmp_path / "bench.json"
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "traceguard.capture.bench_collectives", "--backend", "gloo",
        "--ops", "all_reduce,broadcast,all_gather", "--max-bytes", "64K", "--iters", "5", "--warmup", "2",
        "--check", "--out", str(out), "--json", str(js),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    df = parse_nccl_tests(proc.stdout)
    assert parse_nccl_tests(out.read_text()).equals(df)
    assert df["collective"].unique(maintain_order=True).to_list() == ["all_reduce", "broadcast", "all_gather"]
    sizes = [8 << i for i in range(14)]  # 8 B .. 64 KiB, doubling
    record = json.loads(js.read_text())
    assert record["world_size"] == 2
    for op, table in df.group_by("collective", maintain_order=True):
        assert table["size_bytes"].to_list() == sizes
        per_rank = 2 if op[0] == "all_gather" else 1
        assert table["count"].to_list() == [s // 4 // per_rank for s in sizes]
        assert (table["wrong"] == 0).all()
        factor = FACTOR_2_RANKS[op[0]]
        for kind in ("oop", "ip"):
            diff = (table[f"{kind}_busbw"] - table[f"{kind}_algbw"] * factor).abs()
            assert (diff <= 0.011).all()  # both printed with 2 decimals
        rows = [r for r in record["rows"] if r["collective"] == op[0]]
        busbws = [r[k]["busbw"] for r in rows for k in ("out_of_place", "in_place")]
        for r in rows:
            for k in ("out_of_place", "in_place"):
                assert r[k]["busbw"] == pytest.approx(r[k]["algbw"] * factor, rel=1e-12)
                assert r[k]["algbw"] == pytest.approx(r["size"] / (r[k]["time_us"] * 1e-6) / 1e9, rel=1e-12)
        assert table["oop_time_us"].to_list() == pytest.approx([r["out_of_place"]["time_us"] for r in rows], abs=0.51)
        assert table["avg_busbw"][0] == pytest.approx(sum(busbws) / len(busbws), rel=1e-5, abs=1e-9)
