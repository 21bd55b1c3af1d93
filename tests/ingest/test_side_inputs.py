"""Side-input parsers on our 2xH200 captures and on public examples (tests/fixtures/side, sources in each file)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from traceguard.errors import InputError
from traceguard.ingest.side_inputs import (
    nccl_graph_max_bw,
    parse_dmon,
    parse_nccl_tests,
    parse_topo,
    pcie_link_from_smi_q,
    pcie_saturation,
    rated_pcie_mb_s,
    sniff_side_input,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
H200 = FIXTURES / "h200"
SIDE = FIXTURES / "side"
H200_DMON = sorted(H200.glob("*/dmon.txt"))


def side(name: str) -> str:
    return (SIDE / name).read_text()


# ------------------------------------------------------------------------------------------ dmon


@pytest.mark.parametrize("path", H200_DMON, ids=lambda p: p.parent.name)
def test_h200_dmon_rows_are_the_data_lines(path: Path) -> None:
    text = path.read_text()
    data_lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    df = parse_dmon(text)
    assert df.height == len(data_lines)
    assert df.columns[:2] == ["gpu", "sample"]
    assert {"pwr", "gtemp", "mtemp", "sm", "mem", "rxpci", "txpci"} <= set(df.columns)
    assert set(df["gpu"].to_list()) == {0, 1}
    # samples number each GPU's rows 0, 1, 2, ... in order
    for gpu in (0, 1):
        samples = df.filter(pl.col("gpu") == gpu)["sample"].to_list()
        assert samples == list(range(len(samples)))
    first = data_lines[0].split()
    assert df.row(0, named=True)["gpu"] == int(first[0])
    assert df.row(0, named=True)["rxpci"] == float(first[10])
    assert df.row(0, named=True)["txpci"] == float(first[11])


def test_dmon_long_form_carries_units() -> None:
    long = parse_dmon((H200 / "p2p_torch" / "dmon.txt").read_text(), long=True)
    assert long.columns == ["gpu", "sample", "metric", "unit", "value"]
    units = dict(long.select("metric", "unit").unique().iter_rows())
    assert units["rxpci"] == "MB/s" and units["txpci"] == "MB/s"
    assert units["pwr"] == "W" and units["sm"] == "%"


def test_dmon_public_default_with_dashes() -> None:
    df = parse_dmon(side("dmon_leimao_default.txt"))
    assert df.height == 3
    assert df["mtemp"].null_count() == 3  # "-" is unavailable
    assert df["mclk"].to_list() == [405.0, 7001.0, 7001.0]
    assert df["sample"].to_list() == [0, 1, 2]
    assert "rxpci" not in df.columns


def test_dmon_public_2016_format() -> None:
    df = parse_dmon(side("dmon_deepspeech_pucvmet_2016.txt"))
    assert df.height == 4
    assert df["gpu"].to_list() == [0, 1, 2, 3]
    assert df["temp"].to_list() == [83.0, 84.0, 80.0, 70.0]
    assert df["sbecc"].null_count() == 4
    assert df["pci"].to_list() == [0.0] * 4  # replay errors, not throughput
    assert df["rxpci"].to_list() == [41.0, 25.0, 33.0, 62.0]
    assert df["txpci"].to_list() == [8.0, 14.0, 10.0, 5.0]


def test_dmon_date_time_csv_repeated_headers_and_junk() -> None:
    text = "\n".join(
        [
            "Warning: something unrelated",
            "#Date       Time        gpu  rxpci  txpci",
            "#YYYYMMDD   HH:MM:SS    Idx   MB/s   MB/s",
            " 20260529   09:51:25      0    100     20",
            " 20260529   09:51:25      1      -     30",
            " 20260529   09:51:26      0    120",  # short row: skipped
            "#Date       Time        gpu  rxpci  txpci",
            "#YYYYMMDD   HH:MM:SS    Idx   MB/s   MB/s",
            " 20260529   09:51:26      0    140     10",
        ]
    )
    df = parse_dmon(text)
    assert df.columns == ["gpu", "sample", "date", "time", "rxpci", "txpci"]
    assert df.height == 3
    assert df.filter(pl.col("gpu") == 0)["sample"].to_list() == [0, 1]
    assert df["time"].to_list() == ["09:51:25", "09:51:25", "09:51:26"]
    assert df["rxpci"].to_list() == [100.0, None, 140.0]
    csv = "#gpu, rxpci, txpci\n#Idx, MB/s, MB/s\n0, 5, 1152\n"
    assert parse_dmon(csv).row(0) == (0, 0, 5.0, 1152.0)


def test_dmon_nothing_parseable_is_input_error() -> None:
    with pytest.raises(InputError):
        parse_dmon("0 1 2\nhello\n")
    with pytest.raises(InputError):
        parse_dmon("")


# ------------------------------------------------------------------------------------------ PCIe


def test_rated_pcie() -> None:
    assert rated_pcie_mb_s(3, 16) == 985 * 16
    assert rated_pcie_mb_s(4, 16) == 1969 * 16
    assert rated_pcie_mb_s(5, 16) == 3938 * 16
    assert rated_pcie_mb_s(6, 8) == 7877 * 8
    with pytest.raises(ValueError):
        rated_pcie_mb_s(9, 16)
    with pytest.raises(ValueError):
        rated_pcie_mb_s(4, 0)


def test_pcie_link_from_h200_smi_q() -> None:
    text = (H200 / "nvidia-smi-q.txt").read_text()
    assert pcie_link_from_smi_q(text) == {0: (5, 16), 1: (5, 16)}
    assert pcie_link_from_smi_q(text, which="current") == {0: (5, 16), 1: (5, 16)}


def test_pcie_link_max_vs_idle_current() -> None:
    text = """
GPU 00000000:3B:00.0
    PCI
        GPU Link Info
            PCIe Generation
                Max                       : 4
                Current                   : 1
            Link Width
                Max                       : 16x
                Current                   : 8x
        Tx Throughput                     : 0 KB/s
GPU 00000000:86:00.0
    PCI
        GPU Link Info
            PCIe Generation
                Max                       : N/A
                Current                   : N/A
            Link Width
                Max                       : 16x
                Current                   : 16x
"""
    assert pcie_link_from_smi_q(text) == {0: (4, 16)}
    assert pcie_link_from_smi_q(text, which="current") == {0: (1, 8)}
    assert pcie_link_from_smi_q("nothing here") == {}


def test_pcie_saturation_public_8gpu() -> None:
    df = parse_dmon(side("dmon_gnosia93_pcut_8gpu.txt"))
    rated = rated_pcie_mb_s(5, 16)
    result = pcie_saturation(df, rated)
    # max(rx, tx) per sample, maximum per GPU, read off the file by hand
    peaks = {0: 21846, 1: 22874, 2: 22883, 3: 23359, 4: 18996, 5: 12951, 6: 18874, 7: 25966}
    assert {g: e["peak_mb_s"] for g, e in result["per_gpu"].items()} == peaks
    assert result["worst_gpu"] == 7
    assert result["peak"] == pytest.approx(25966 / rated)
    # GPU0 loads 21846, 14767, 16232, 20400: linear p95 = 20400 + 0.85 * (21846 - 20400)
    assert result["per_gpu"][0]["p95_mb_s"] == pytest.approx(21629.1)
    assert result["per_gpu"][0]["samples"] == 4 and result["per_gpu"][7]["samples"] == 3
    per_gpu_rated = pcie_saturation(df, {g: rated_pcie_mb_s(4, 16) for g in range(7)})
    assert per_gpu_rated["per_gpu"][7]["peak"] is None and "7" in per_gpu_rated["reason"]
    assert per_gpu_rated["worst_gpu"] == 3


def test_pcie_saturation_h200_and_long_form() -> None:
    text = (H200 / "p2p_torch" / "dmon.txt").read_text()
    rated = {
        g: rated_pcie_mb_s(*link) for g, link in pcie_link_from_smi_q((H200 / "nvidia-smi-q.txt").read_text()).items()
    }
    wide = pcie_saturation(parse_dmon(text), rated)
    long = pcie_saturation(parse_dmon(text, long=True), rated)
    assert wide["peak"] == pytest.approx(long["peak"])
    assert wide["per_gpu"][1]["peak_mb_s"] == 65.0  # the "65" rxpci sample of GPU 1
    assert wide["peak"] < 0.01  # NVLink carried the traffic: PCIe is idle


def test_pcie_saturation_without_pcie_columns_has_reason() -> None:
    result = pcie_saturation(parse_dmon(side("dmon_leimao_default.txt")), 1000.0)
    assert result["peak"] is None and "rxpci" in result["reason"]


# ------------------------------------------------------------------------------------------ nccl-tests


def test_nccl_tests_public_all_gather() -> None:
    df = parse_nccl_tests(side("nccl_tests_nccl1435_all_gather_bf16.txt"))
    assert df.height == 7
    assert df["collective"].unique().to_list() == ["all_gather"]
    first = df.row(0, named=True)
    assert first["size_bytes"] == 16777216 and first["count"] == 4194304
    assert first["dtype"] == "bfloat16" and first["redop"] == "none" and first["root"] == -1
    assert (first["oop_time_us"], first["oop_algbw"], first["oop_busbw"]) == (108.8, 154.20, 77.10)
    assert (first["ip_time_us"], first["ip_algbw"], first["ip_busbw"]) == (98.19, 170.86, 85.43)
    assert first["wrong"] == 0
    # 2 ranks: count is per rank, size = count * 2 B * 2 ranks, busbw = algbw / 2
    assert (df["count"] * 2 * 2 == df["size_bytes"]).all()
    assert ((df["oop_busbw"] - df["oop_algbw"] / 2).abs() < 0.01).all()


def test_nccl_tests_2021_broadcast_root_without_redop() -> None:
    df = parse_nccl_tests(side("nccl_tests_nccltests82_broadcast_2021.txt"))
    row = df.row(0, named=True)
    assert row["collective"] == "broadcast"
    assert row["redop"] is None and row["root"] == 0 and row["dtype"] == "float"
    assert row["oop_time_us"] == 45.82 and row["ip_time_us"] == 38.17
    assert row["wrong"] is None  # "N/A": not checked


def test_nccl_tests_row_cut_after_out_of_place() -> None:
    row = parse_nccl_tests(side("nccl_tests_nccl1530_rtx4090_tree.txt")).row(0, named=True)
    assert row["collective"] == "all_reduce" and row["redop"] == "sum" and row["size_bytes"] == 8
    assert row["oop_time_us"] == 42.56 and row["ip_time_us"] is None and row["wrong"] == 0


def test_nccl_tests_binary_name_and_cut_footer() -> None:
    row = parse_nccl_tests(side("nccl_tests_nixpkgs_all_gather_2.13.6.txt")).row(0, named=True)
    assert row["collective"] == "all_gather"
    assert row["ip_algbw"] == 619657.10 and row["oop_algbw"] == 1816.16
    assert row["avg_busbw"] is None


def test_nccl_tests_in_place_first() -> None:
    df = parse_nccl_tests(side("nccl_tests_mscclpp117_inplace_first.txt"))
    assert df["ip_busbw"].to_list() == [144.46, 159.12, 162.23]
    assert df["oop_busbw"].null_count() == 3
    assert df["collective"].null_count() == 3 and df["dtype"].null_count() == 3


def test_nccl_tests_header_missing_is_input_error() -> None:
    with pytest.raises(InputError):
        parse_nccl_tests(side("nccl_tests_nccl340_headerless_excerpt.txt"))


def test_nccl_tests_launcher_prefixes_footer_and_two_tables() -> None:
    header = [
        "#                                                              out-of-place                       in-place",
        "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong",  # noqa: E501
        "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)",
    ]
    text = "\n".join(
        ["[1,0]<stdout>:# Collective test starting: all_reduce_perf_mpi"]
        + [f"[1,0]<stdout>:{h}" for h in header]
        + [
            "[1,0]<stdout>:     1048576        262144     float     sum      -1    28.15   37.25   65.19      0    27.52   38.10   66.67      0",  # noqa: E501
            "[1,1]<stdout>:host:1:1 [1] NCCL INFO comm 0x1 rank 1 nranks 16 - Destroy COMPLETE",
            "[1,0]<stdout>:# Out of bounds values : 0 OK",
            "[1,0]<stdout>:# Avg bus bandwidth    : 65.93 ",
            "# Collective test starting: reduce_scatter_perf",
            *header,
            "[0]        1024           128     float     sum      -1[0]     9.10    0.11    0.10      0[0]     9.00    0.11    0.10      0",  # noqa: E501
        ]
    )
    df = parse_nccl_tests(text)
    assert df["collective"].to_list() == ["all_reduce", "reduce_scatter"]
    assert df["table"].to_list() == [0, 1]
    assert df["avg_busbw"].to_list() == [65.93, None]
    assert df.row(1, named=True)["ip_time_us"] == 9.00


def test_nccl_graph_max_bw() -> None:
    assert nccl_graph_max_bw("vm:1:1 [0] NCCL INFO === System : maxBw 48.0 totalBw 370.8 ===\n") == 48.0
    assert nccl_graph_max_bw("nothing") is None


# ------------------------------------------------------------------------------------------ topo


def test_h200_topo() -> None:
    topo = parse_topo((H200 / "topo.txt").read_text())  # has ANSI underline codes
    assert topo["gpus"] == [0, 1]
    assert topo["matrix"]["GPU0"]["GPU1"] == "NV18"
    assert topo["links"][(1, 0)] == "NV18"
    assert topo["nvlink_pairs"] == {frozenset({0, 1})}
    assert topo["cpu_affinity"] == {0: "0-31", 1: "0-31"}
    assert topo["numa_affinity"] == {0: "0", 1: "0"}
    assert topo["gpu_numa_id"] == {0: "N/A", 1: "N/A"}
    assert topo["nics"] == []


def test_topo_public_pcie_desktop() -> None:
    topo = parse_topo(side("topo_xuesongtap_2x1080ti_phb.txt"))
    assert topo["links"] == {(0, 1): "PHB", (1, 0): "PHB"}
    assert topo["nvlink_pairs"] == set()
    assert topo["numa_affinity"] == {0: "N/A", 1: "N/A"}


def test_topo_public_nv8_with_nics_cut_excerpt() -> None:
    topo = parse_topo(side("topo_nccl933_8gpu_nv8_nics.txt"))
    assert topo["gpus"] == list(range(8))
    assert len(topo["nvlink_pairs"]) == 28  # every pair of 8 GPUs; GPU7's own row is cut off
    assert topo["nics"] == [f"NIC{i}" for i in range(9)]
    assert topo["gpu_nic_links"][(0, "NIC2")] == "PIX"
    assert topo["gpu_nic_links"][(4, "NIC1")] == "PIX"
    assert topo["cpu_affinity"][4] == "48-95,144-191" and topo["numa_affinity"][4] == "1"
    assert 7 not in topo["cpu_affinity"]


def test_topo_public_pcie_only_mp() -> None:
    topo = parse_topo(side("topo_deepep60_mp_pcie_only.txt"))
    assert topo["nvlink_pairs"] == set()
    assert topo["links"][(0, 4)] == "SYS" and topo["links"][(0, 1)] == "NODE"
    assert topo["gpu_numa_id"][3] == "N/A" and topo["numa_affinity"][3] == "0"
    assert len(topo["nics"]) == 14


def test_topo_nic_legend_and_old_mlx_labels() -> None:
    text = (
        "\tGPU0\tGPU1\tmlx5_0\tCPU Affinity\n"
        "GPU0\t X \tNV2\tPIX\t0-19\n"
        "GPU1\tNV2\t X \tPHB\t0-19\n"
        "mlx5_0\tPIX\tPHB\t X \t\n"
        "\nNIC Legend:\n\n  NIC0: mlx5_0\n"
    )
    topo = parse_topo(text)
    assert topo["nics"] == ["mlx5_0"]
    assert topo["gpu_nic_links"][(1, "mlx5_0")] == "PHB"
    assert topo["nvlink_pairs"] == {frozenset({0, 1})}
    assert topo["nic_names"] == {"NIC0": "mlx5_0"}


def test_topo_nothing_is_input_error() -> None:
    with pytest.raises(InputError):
        parse_topo("Legend:\n  X    = Self\n")


# ------------------------------------------------------------------------------------------ sniffing


@pytest.mark.parametrize(
    ("path", "kind"),
    [
        *[(p, "dmon") for p in H200_DMON[:2]],
        (H200 / "topo.txt", "topo"),
        (H200 / "nvidia-smi-q.txt", "smi-q"),
        *[(p, "dmon") for p in SIDE.glob("dmon_*.txt")],
        *[(p, "nccl-tests") for p in SIDE.glob("nccl_tests_*.txt")],
        *[(p, "topo") for p in SIDE.glob("topo_*.txt")],
    ],
    ids=lambda v: v.name if isinstance(v, Path) else v,
)
def test_sniff(path: Path, kind: str) -> None:
    assert sniff_side_input(path.read_text()) == kind


def test_sniff_unknown() -> None:
    assert sniff_side_input("hello\nworld\n") is None
    assert sniff_side_input((H200 / "versions.txt").read_text()) is None


# ------------------------------------------------------------------------------------------ fuzz

CORPUS = [p.read_text() for p in [*H200_DMON[:1], H200 / "topo.txt", *sorted(SIDE.glob("*.txt"))]]
CORPUS.append((H200 / "nvidia-smi-q.txt").read_text()[:6000])


@st.composite
def mutated(draw: st.DrawFn) -> str:
    lines = draw(st.sampled_from(CORPUS)).splitlines()
    for _ in range(draw(st.integers(0, 6))):
        if not lines:
            break
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "dup", "cut", "insert", "swap_tokens"]))
        if action == "drop":
            del lines[i]
        elif action == "dup":
            lines.insert(i, lines[i])
        elif action == "cut":
            lines[i] = lines[i][: draw(st.integers(0, max(len(lines[i]), 0)))]
        elif action == "insert":
            lines.insert(i, draw(st.text(alphabet="# -0123456789.:,xXNVGPUidxMB/s\t", max_size=40)))
        else:
            tokens = lines[i].split()
            draw(st.randoms()).shuffle(tokens)
            lines[i] = "  ".join(tokens)
    return "\n".join(lines)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_mutated_inputs_never_crash(text: str) -> None:
    sniff_side_input(text)
    pcie_link_from_smi_q(text)
    nccl_graph_max_bw(text)
    for parse in (parse_dmon, parse_nccl_tests, parse_topo):
        try:
            out = parse(text)
        except InputError:
            continue
        if isinstance(out, pl.DataFrame) and parse is parse_dmon:
            pcie_saturation(out, 1000.0)


@pytest.mark.parametrize("variant", ["eager", "graph"])
def test_own_h200x2_bench_output(variant: str) -> None:
    df = parse_nccl_tests(side(f"bench_h200x2_{variant}.txt"))
    factors = {"all_reduce": 1.0, "all_gather": 0.5, "reduce_scatter": 0.5, "broadcast": 1.0}  # 2 ranks
    assert df["collective"].unique(maintain_order=True).to_list() == list(factors)
    for (op,), table in df.group_by("collective", maintain_order=True):
        assert table["size_bytes"].to_list() == [8 << i for i in range(28)]  # 8 B .. 1 GiB
        assert (table["wrong"] == 0).all()
        for kind in ("oop", "ip"):
            assert ((table[f"{kind}_busbw"] - table[f"{kind}_algbw"] * factors[op]).abs() <= 0.011).all()
        mean = (table["oop_busbw"].sum() + table["ip_busbw"].sum()) / (2 * table.height)
        assert table["avg_busbw"][0] == pytest.approx(mean, abs=0.01)
    big = df.filter(pl.col("size_bytes") == 1 << 30)
    assert (big["oop_busbw"] > 250).all()  # NVLink, not PCIe or SHM
