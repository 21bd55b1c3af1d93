"""The seed studies run on real GPUs (issues 28 and 31; bench/gpu/seed_studies.py on lent 4×H200 machines,
packed by bench/gpu/pack_seed_results.py into tests/fixtures/seed_studies; bench/gpu/SWEEP.md reads them).

Expected values come from the job's own records and manifests, from NCCL's payloads as the job
ledgered them, and from the captures through plain SQL — never from traceguard's output; the
results tables (made from the whole bundles on this machine) must agree with the manifests.
"""

from __future__ import annotations

import gzip
import itertools
import json
import shutil
import sqlite3
import statistics
from pathlib import Path

import pytest

from tests.conftest import OWN
from traceguard.pipeline import analyze

SEED = OWN / "seed_studies"
#: group → (ranks, settings run)
GROUPS = {
    "seed003_2gpu": (2, 18),
    "seed001-002_2gpu_p2p": (2, 10),
    "seed001-002_2gpu_shm": (2, 10),
    "seed001-002_4gpu_p2p": (4, 4),
    "seed001-002_4gpu_shm": (4, 4),
    "seed003_4gpu": (4, 18),
    "waits_4gpu": (4, 2),
}


def _manifest(group: str, setting: str) -> dict:
    return json.loads((SEED / group / setting / "manifest.json").read_text())


def _rows(group: str) -> dict[str, dict]:
    return {row["setting"]: row for row in json.loads((SEED / group / "results.json").read_text())["rows"]}


def _records(group: str, setting: str) -> list[dict]:
    return [
        json.loads(p.read_text()) for p in sorted((SEED / group / setting).glob("rank*.json")) if "error" not in p.name
    ]


def _unpacked(path: Path, tmp: Path) -> Path:
    target = tmp / path.name.removesuffix(".gz")
    with gzip.open(path) as src, target.open("wb") as dst:
        shutil.copyfileobj(src, dst)
    return target


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_every_setting_ran_on_the_gpus_with_torch_2_11(group: str) -> None:
    ranks, settings = GROUPS[group]
    sweep = json.loads((SEED / group / "sweep.json").read_text())
    assert len(sweep["settings"]) == settings and all(s["exit_status"] == 0 for s in sweep["settings"])
    for entry in sweep["settings"]:
        manifest = _manifest(group, entry["name"])
        assert manifest["exit_status"] == 0 and manifest["diagnostics"] == [], entry["name"]
        assert manifest["gpus"] == ["NVIDIA H200"]
        assert manifest["versions"]["torch"].startswith("2.11.") and manifest["versions"]["nccl"] == "2.28.9"
        assert manifest["config"]["world_size"] == ranks and len(_records(group, entry["name"])) == ranks
        # the protocol of the seed documents: ≥ 20 timed steps, 3 times, outside the capture
        assert manifest["config"]["timed"] >= 20 and manifest["config"]["repeats"] == 3
        assert manifest["nccl_logs"], "NCCL_DEBUG=INFO logs per rank"
        assert manifest["gpu_metrics"] == {"devices": "LOCAL_RANK", "frequency_hz": 2000, "set": None}


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_results_tables_give_the_manifests_throughput(group: str) -> None:
    """Median of the repeats, (max − min) ÷ median as the spread: the table's figures are the job's."""
    for setting, row in _rows(group).items():
        repeats = _manifest(group, setting)["throughput_repeats_steps_per_s"]
        assert row["throughput_repeats_steps_per_s"] == repeats and len(repeats) == 3
        assert row["throughput_steps_per_s"] == pytest.approx(statistics.median(repeats))
        assert row["throughput_spread"] == pytest.approx((max(repeats) - min(repeats)) / statistics.median(repeats))


@pytest.mark.parametrize("group", ["seed003_2gpu", "seed003_4gpu"])
def test_seed003_settings_reached_ddp(group: str) -> None:
    for link in ("", "shm_"):
        for setting, (static, view, hook, bucket) in {
            "ddp": (False, False, None, 2000),
            "static_graph": (True, False, None, 2000),
            "bucket_view": (True, True, None, 2000),
            "bf16_hook": (True, True, "bf16_compress_hook", 2000),
            "powersgd_hook": (True, True, "powerSGD_hook", 2000),
            "bf16_hook_bucket25": (True, True, "bf16_compress_hook", 25),
            "powersgd_hook_bucket100": (True, True, "powerSGD_hook", 100),
        }.items():
            for record in _records(group, link + setting):
                ddp = record["ddp"]
                assert (ddp["static_graph"], ddp["gradient_as_bucket_view"]) == (static, view), link + setting
                assert ddp.get("registered_comm_hook") == hook and ddp["bucket_cap_bytes"] == bucket * 1024 * 1024
                assert record["env"].get("NCCL_P2P_DISABLE") == ("1" if link else None)


@pytest.mark.parametrize("group", ["seed003_2gpu", "seed003_4gpu"])
def test_bucket_view_removes_one_gradient_of_device_copies(group: str) -> None:
    """Without gradient_as_bucket_view each step copies the whole gradient into the bucket: the
    table's DtoD per step drops by the gradient's bytes (the job's own count) with the view on."""
    gradient = _manifest(group, "ddp")["gradient_bytes"]
    for link in ("", "shm_"):
        rows = _rows(group)
        saved = rows[f"{link}static_graph"]["dtod_bytes_per_step"] - rows[f"{link}bucket_view"]["dtod_bytes_per_step"]
        assert saved == pytest.approx(gradient, rel=0.01)
        assert rows[f"{link}static_graph"]["checks"]["dtod_copy_volume"] == "fail"
        assert rows[f"{link}bucket_view"]["checks"]["dtod_copy_volume"] == "pass"


def test_fp16_halves_the_broadcast_and_reduce_payload() -> None:
    for group in ("seed001-002_2gpu_p2p", "seed001-002_2gpu_shm"):
        for mode in ("blocking", "async"):
            fp32 = _manifest(group, f"bcast_reduce_fp32_{mode}")["workload"]["payload_bytes_per_step"]["0"]
            fp16 = _manifest(group, f"bcast_reduce_fp16_{mode}")["workload"]["payload_bytes_per_step"]["0"]
            for op in ("broadcast", "reduce"):
                assert fp16[op] * 2 == pytest.approx(fp32[op], abs=8)  # the same elements at 2 bytes, not 4
            row16, row32 = _rows(group)[f"bcast_reduce_fp16_{mode}"], _rows(group)[f"bcast_reduce_fp32_{mode}"]
            assert row16["rooted_payload_bytes_per_step"] * 2 == pytest.approx(row32["rooted_payload_bytes_per_step"])


def test_shm_runs_are_found_as_shm_and_p2p_runs_as_p2p() -> None:
    for ranks, link in itertools.product((2, 4), ("p2p", "shm")):
        transport = [link.upper()]
        for setting, row in _rows(f"seed001-002_{ranks}gpu_{link}").items():
            assert row["transports"] == transport, setting
            assert row["checks"]["transport_p2p"] == ("pass" if link == "p2p" else "fail"), setting
    for group in ("seed003_2gpu", "seed003_4gpu"):
        for setting, row in _rows(group).items():
            assert row["transports"] == (["SHM"] if setting.startswith("shm_") else ["P2P"]), setting
            assert (row["checks"]["transport_p2p"] == "fail") is setting.startswith("shm_"), setting


@pytest.mark.parametrize("link", ["p2p", "shm"])
def test_four_stage_pipelines_send_each_boundary_s_activations_both_ways(link: str) -> None:
    """Three stage boundaries, each microbatch's activation forward and its gradient back: the
    table's P2P bytes per step are the job's own stage records' arithmetic, on either transport."""
    group = f"seed001-002_4gpu_{link}"
    for setting, row in _rows(group).items():
        stages = _manifest(group, setting)["workload"]["ranks"]
        assert [s["stage"] for s in stages] == [0, 1, 2, 3]
        sent = (len(stages) - 1) * stages[0]["microbatches"] * stages[0]["activation_bytes"] * 2
        assert row["p2p_sent_bytes_per_step"] == sent == 48 * 2**20, setting
        assert row["workload_kind"] == "pipeline" and row["bubble"] is not None


def test_four_ranks_inspector_bus_bandwidth_is_nccl_s_and_shm_is_slower() -> None:
    """The Inspector's own lines at 4 ranks: bus bandwidth = algorithm bandwidth × 2(n−1)/n for the
    all-reduce (NCCL's definition); traceguard's peak is the largest all-reduce's bus bandwidth on
    its transfer time (the shortest of the 4 ranks' execution times: the last to arrive waited for
    no one), median over the calls; the one-bucket all-reduce over SHM runs at a fraction of NVLink's."""
    medians = {}
    for setting in ("bucket_view", "shm_bucket_view"):
        folder = SEED / "seed003_4gpu" / setting / "inspector"
        lines = []
        for path in sorted(folder.glob("*.log.gz")):
            with gzip.open(path, "rt") as f:
                lines += [json.loads(line) for line in f if line.strip()]
        allreduce = [x for x in lines if x["coll_perf"]["coll"] == "AllReduce"]
        assert {x["header"]["n_ranks"] for x in lines} == {4} and len({x["header"]["rank"] for x in lines}) == 4
        for x in allreduce:
            perf = x["coll_perf"]
            assert perf["coll_busbw_gbs"] == pytest.approx(perf["coll_algobw_gbs"] * 2 * 3 / 4, rel=1e-5)
        largest = max(x["coll_perf"]["coll_msg_size_bytes"] for x in allreduce)
        calls: dict[int, list[int]] = {}
        for x in allreduce:
            if x["coll_perf"]["coll_msg_size_bytes"] == largest:
                calls.setdefault(x["coll_perf"]["coll_sn"], []).append(x["coll_perf"]["coll_exec_time_us"])
        busbw = statistics.median(largest / (min(t) * 1e3) * 2 * 3 / 4 for t in calls.values() if len(t) == 4)
        metrics = analyze([str(folder)], profile="h200-nvlink").report["inspector"]["metrics"]
        assert metrics["inspector_ranks"] == 4 and metrics["allreduce_largest_bytes"] == largest
        assert metrics["allreduce_peak_busbw_gbps"] == pytest.approx(busbw, rel=1e-6)
        medians[setting] = busbw
    assert medians["bucket_view"] > 3 * medians["shm_bucket_view"]


def test_kineto_sees_the_workloads_payloads_as_nsys_does() -> None:
    """The same 2-GPU workloads under torch.profiler: Kineto's collective records give the same
    bytes per step as the nsys runs (the job's ledger) — the two capture paths agree."""
    kineto, nsys = _rows("seed001-002_2gpu_torch"), _rows("seed001-002_2gpu_p2p")
    assert set(kineto) == set(nsys)
    for setting, row in kineto.items():
        manifest = _manifest("seed001-002_2gpu_torch", setting)
        assert manifest["exit_status"] == 0 and manifest["config"]["capture"] == "torch"
        assert manifest["versions"]["torch"].startswith("2.11.") and manifest["config"]["world_size"] == 2
        for key in ("rooted_payload_bytes_per_step", "p2p_sent_bytes_per_step", "allreduce_bytes_per_step"):
            assert row[key] == nsys[setting][key], (setting, key)
        assert row["workload_kind"] == nsys[setting]["workload_kind"] and row["transports"] == ["P2P"]


def test_tensor_parallel_ran_on_torch_2_11_with_one_tensor_type_per_optimizer_group(tmp_path: Path) -> None:
    """The run that died with "got mixed torch.Tensor and DTensor" on the GPU machines' torch."""
    for group in ("seed001-002_2gpu_p2p", "seed001-002_2gpu_shm"):
        for record in _records(group, "tensor_parallel"):
            assert record["workload"]["optimizer_groups"] == [
                {"tensor_type": "DTensor", "params": 16},
                {"tensor_type": "Tensor", "params": 2},
            ]
    # its all-reduces (RowwiseParallel's outputs and their gradients) are in the capture
    bundle = SEED / "seed001-002_2gpu_p2p" / "tensor_parallel"
    with sqlite3.connect(_unpacked(bundle / "cap_0.sqlite.gz", tmp_path)) as conn:
        (allreduces,) = conn.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value LIKE 'ncclDevKernel_AllReduce%'"
        ).fetchone()
    assert allreduces > 0


def test_a_late_rank_among_four_is_named(tmp_path: Path) -> None:
    """--slow-rank 1:30 on 4 GPUs: rank 1's host sleeps 30 ms in every step's `get batch`."""
    bundle = SEED / "waits_4gpu" / "slow_rank1"
    assert _manifest("waits_4gpu", "slow_rank1")["config"]["slow_rank"] == {"1": 30.0}
    report = analyze([str(bundle)], profile="h200-nvlink").report
    late = report["run"]["late_rank"]
    assert late["rank"] == 1 and late["last_arrivals"] >= 2 and late["of"] == 3
    # plain SQL: each rank's all-reduces on one clock (its session's UTC start, then each rank's
    # median offset of the kernels' ends from rank 0's: a collective ends together on every rank);
    # rank 1 starts last in as many of the matched calls as the analysis says
    kernels = {}
    for rank in range(4):
        with sqlite3.connect(_unpacked(bundle / f"cap_{rank}.sqlite.gz", tmp_path)) as conn:
            (base,) = conn.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME").fetchone()
            kernels[rank] = [
                (base + start, base + end)
                for start, end in conn.execute(
                    "SELECT k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds n ON n.id = k.shortName "
                    "WHERE n.value LIKE 'ncclDevKernel_AllReduce%' ORDER BY k.start"
                )
            ][: late["of"]]
    offsets = {r: statistics.median(a[1] - b[1] for a, b in zip(kernels[0], kernels[r], strict=True)) for r in kernels}
    last = [max(kernels, key=lambda r: kernels[r][call][0] + offsets[r]) for call in range(late["of"])]
    assert last.count(1) == late["last_arrivals"]
    checks = {c["id"]: c for c in report["checks"]}
    assert (
        checks["collective_wait"]["status"] == "fail" and "rank 1 arrived last" in checks["collective_wait"]["message"]
    )
    clean = _rows("waits_4gpu")["clean"]
    assert clean["verdict"] == "pass"


def test_the_rank_last_most_often_is_not_the_one_that_held_the_others_up_longest() -> None:
    """The whole job's NCCL Inspector logs of the 4-GPU late-rank run (warm-up, 3 × 20 timed steps,
    6 profiled): rank 2 is last at most all-reduces but by a few hundred µs, while the slowed rank 1
    is last by 6–30 ms where its host's sleep is not hidden behind the GPU's queue (the first steps
    of each timed block and the profiled steps). `late_rank` keeps the most frequent (DESIGN.md);
    `longest_held_up_by` names rank 1. Expected values from plain json.loads: per instance (comm id,
    coll, coll_sn) on all 4 ranks, transfer = the shortest execution time, the waits = the rest, the
    last rank = the shortest execution (as docs/inspector.md)."""
    from tests.metrics.test_inspector import exec_times
    from traceguard.ingest.nccl_inspector import read_inspector
    from traceguard.metrics.inspector import TOGETHER_NS, TOGETHER_SHARE, analyse_inspector

    folder = SEED / "waits_4gpu" / "slow_rank1" / "inspector"
    instances = exec_times(sorted(folder.glob("*.log.gz")))
    last_count: dict[int, int] = {}
    held: dict[int, int] = {}
    for members in instances.values():
        assert len(members) == 4
        transfer = min(members.values())
        if max(members.values()) - transfer <= max(TOGETHER_NS, TOGETHER_SHARE * transfer):
            continue
        last = min(members, key=lambda r: (members[r], r))
        last_count[last] = last_count.get(last, 0) + 1
        held[last] = held.get(last, 0) + sum(ns - transfer for ns in members.values())
    assert max(last_count, key=last_count.get) == 2 and max(held, key=held.get) == 1
    assert held[1] > 5 * held[2]  # measured: rank 1 0.61 s of waiting, rank 2 0.095 s

    result = analyse_inspector(read_inspector(sorted(folder.glob("*.log.gz"))))
    assert result.metrics["late_rank"] == 2
    assert result.late["last_arrivals"] == last_count[2] and result.late["held_up_ns"] == held[2]
    other = result.late["longest_held_up_by"]
    assert other["rank"] == 1 and other["last_arrivals"] == last_count[1] and other["held_up_ns"] == held[1]
    assert other["held_up_share"] == pytest.approx(held[1] / sum(held.values()))
    per_rank = {row["rank"]: row["last_arrivals"] for row in result.per_rank}
    assert {r: row["held_up_ns"] for r, row in per_rank.items()} == {r: held.get(r, 0) for r in range(4)}


def test_the_captured_steps_late_rank_is_also_the_one_that_held_up_longest() -> None:
    """In the 6 profiled steps the slowed rank 1 is both last most often and the costliest: no
    second rank is named, and its held-up share is the largest of the four."""
    report = analyze([str(SEED / "waits_4gpu" / "slow_rank1")], profile="h200-nvlink").report
    late = report["run"]["late_rank"]
    assert late["rank"] == 1 and late["longest_held_up_by"] is None
    shares = {r["rank"]: r["metrics"]["last_arrivals"]["held_up_share"] for r in report["ranks"]}
    assert max(shares, key=shares.get) == 1 and late["held_up_share"] == shares[1]
    assert sum(shares.values()) == pytest.approx(1.0)


def test_the_transport_of_a_p2p_pipeline_is_the_nccl_log_s_word(tmp_path: Path) -> None:
    """The 4-stage pipeline's middle stages read PCIe ≥ 5 % in half their send/recv kernels' samples
    with NVLink idle (other work beside small transfers); alone, the counters suggest a fallback, but
    NCCL's log shows every connection of the pair on P2P: transport_p2p passes."""
    bundle = SEED / "seed001-002_4gpu_p2p" / "pipeline4_1f1b_blocking"
    captures = [str(bundle / f"cap_{r}.sqlite.gz") for r in (1, 2)]
    topo = str(bundle / "topo.txt")
    alone = {c.id: c for c in analyze([*captures, topo], profile="h200-nvlink").checks}
    assert alone["transport_p2p"].status == "fail"
    assert [e["finding"] for e in alone["transport_p2p"].evidence] == ["pcie_while_nvlink_idle"]
    logs = [str(p) for p in sorted(bundle.glob("nccl.*.log.gz"))]
    with_logs = {c.id: c for c in analyze([*captures, topo, *logs], profile="h200-nvlink").checks}
    assert with_logs["transport_p2p"].status == "pass"
    text = ""
    for log in logs:
        with gzip.open(log, "rt") as f:
            text += f.read()
    assert " via P2P/" in text and " via SHM/" not in text


def test_a_gpu_metrics_stamp_starts_the_period_it_averages(tmp_path: Path) -> None:
    """On the real export: each 19 MB input copy (HtoD, ~0.35 ms) shows in the sample whose period
    AFTER its stamp overlaps the copy most; read as the period before the stamp, the busiest sample
    would lie before the copy began (docs/links.md)."""
    path = _unpacked(SEED / "seed003_2gpu" / "powersgd_hook_bucket100" / "cap_0.sqlite.gz", tmp_path)
    with sqlite3.connect(path) as conn:
        samples = conn.execute(
            "SELECT g.timestamp, g.value FROM GPU_METRICS g JOIN TARGET_INFO_GPU_METRICS i "
            "ON i.typeId = g.typeId AND i.metricId = g.metricId "
            "WHERE i.metricName = 'PCIe RX Throughput [Throughput %]' ORDER BY g.timestamp"
        ).fetchall()
        copies = conn.execute(
            "SELECT start, end FROM CUPTI_ACTIVITY_KIND_MEMCPY WHERE copyKind = 1 AND bytes > 1000000"
        ).fetchall()
    period = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(samples))
    assert copies
    for start, end in copies:
        near = [(t, v) for t, v in samples if start - 2 * period <= t <= end + period]
        busiest, value = max(near, key=lambda s: s[1])
        after = min(end, busiest + period) - max(start, busiest)
        before = min(end, busiest) - max(start, busiest - period)
        assert value >= 50 and after > 0 and after > before


def test_powersgd_collectives_wait_for_rank_1() -> None:
    """PowerSGD on 100 MB buckets over NVLink: the all-reduces are small (3 MB a step) and wait for
    rank 1 — which throughput alone (−19 % against plain DDP) would blame on the compression."""
    result = analyze([str(SEED / "seed003_2gpu" / "powersgd_hook_bucket100")], profile="h200-nvlink").result
    assert result.metrics["late_rank"] == 1 and result.metrics["nccl_wait_share"] > 0.5
    row = _rows("seed003_2gpu")["powersgd_hook_bucket100"]
    assert row["allreduce_bytes_per_step"] < 4e6 and row["checks"]["small_collectives"] == "fail"
    assert row["checks"]["collective_wait"] == "fail"


@pytest.mark.parametrize(("trace", "nccl_kernels"), [("node", True), ("graph", False)])
def test_nccl_inside_a_cuda_graph_on_two_gpus(tmp_path: Path, trace: str, nccl_kernels: bool) -> None:
    """--cuda-graphs: node-level tracing shows the all-reduce kernels inside each replay; graph
    level shows the replays whole, NCCL hidden."""
    bundle = SEED / "cuda_graphs_2gpu" / trace
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["exit_status"] == 0 and manifest["config"]["cuda_graphs"]
    with sqlite3.connect(_unpacked(bundle / "cap_0.sqlite.gz", tmp_path)) as conn:
        (nccl,) = conn.execute(
            "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName "
            "WHERE s.value LIKE 'nccl%' AND k.graphNodeId IS NOT NULL"
        ).fetchone()
    assert (nccl > 0) is nccl_kernels


def test_the_plan_runs_what_the_fixture_holds_and_gates_four_gpu_groups() -> None:
    """bench/gpu/seed_studies.py's plan: every setting is one of its matrix's, the 2-GPU groups run
    on 2 ranks, the 4-GPU groups only on a machine with 4 GPUs, and the committed groups are its own."""
    import importlib.util

    from traceguard.capture.harness import MATRICES, run_parser

    spec = importlib.util.spec_from_file_location("seed_studies", OWN.parents[1] / "bench" / "gpu" / "seed_studies.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    two, four = module.plan("plugin.so", 2), module.plan("plugin.so", 4)
    assert [g["name"] for g in two] == [g["name"] for g in four if "4gpu" not in g["name"]]
    assert set(GROUPS) | {"cuda_graphs_2gpu"} <= {g["name"] for g in four}
    for group in four:
        for name, options in (
            group["runs"].items()
            if "runs" in group
            else ((s, [*group["base"], *dict(MATRICES[group["matrix"]])[s]]) for s in group["settings"])
        ):
            cfg = run_parser().parse_args([*options, "--out", "x"])
            assert cfg.world_size == (4 if "4gpu" in group["name"] else 2), (group["name"], name)
            assert cfg.backend == "nccl" and cfg.compress
            assert (cfg.nccl_inspector is not None) == group["name"].startswith(("seed003", "waits")), name
    # A cut-short session's missing rows: GROUP:S1,S2 picks settings, GROUP alone all of them.
    assert module.wanted_settings(["seed003_4gpu", "seed001-002_4gpu_p2p:pipeline4_1f1b_batched,x"]) == {
        "seed003_4gpu": None,
        "seed001-002_4gpu_p2p": {"pipeline4_1f1b_batched", "x"},
    }
