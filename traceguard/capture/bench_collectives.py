"""Collective benchmark with torch.distributed that prints nccl-tests' output format.

Runs under ``torchrun`` (one process per rank) and needs only torch, so the same link rules run
on any cluster without building nccl-tests. For each op and size it times like nccl-tests:
``warmup`` untimed operations, a barrier, then ``iters`` back-to-back operations between two
CUDA events (with ``--cuda-graph``: the ``iters`` operations captured once in a CUDA graph and
the graph replayed between the events, so Python launch overhead does not pose as latency);
time = elapsed / iters, averaged over ranks. On CPU (gloo) a ``time.perf_counter`` pair around
the loop replaces the events.

Sizes and bandwidths follow nccl-tests: ``size`` is the total bytes of the collective (for
all_gather the gathered output, for reduce_scatter the input), ``count`` the elements each rank
passes (all_gather: its send count; reduce_scatter: its receive count); algbw = size / time (GB/s,
1e9) and busbw = algbw x 2(n-1)/n (all_reduce), (n-1)/n (all_gather, reduce_scatter), 1
(broadcast). In-place runs use one buffer for input and output (all_gather/reduce_scatter: the
rank's slice of the full buffer, as nccl-tests does). torch.distributed has no out-of-place
all_reduce or broadcast, so their "out-of-place" columns run the same in-place call on a
separate output buffer.

Usage::

    torchrun --nproc_per_node=8 -m traceguard.capture.bench_collectives \\
        --ops all_reduce,all_gather,reduce_scatter,broadcast --min-bytes 8 --max-bytes 1G \\
        --factor 2 --iters 20 --warmup 5 [--cuda-graph] [--dtype float32] [--check] \\
        [--out bench.txt] [--json bench.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

# The options live in bench_options (no torch needed for --help); OPS and parse_size stay importable from here.
from traceguard.capture.bench_options import DTYPE_NAMES, parse_args
from traceguard.capture.bench_options import OPS as OPS
from traceguard.capture.bench_options import parse_size as parse_size

#: name -> (torch dtype, the type name nccl-tests prints); the names are the options' (bench_options).
DTYPES: dict[str, tuple[torch.dtype, str]] = {
    name: (getattr(torch, name), shown) for name, shown in DTYPE_NAMES.items()
}
# torch 2.13 renamed the tensor forms (the old names warn); older torch has only the old names.
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def float_str(value: float, width: int) -> str:
    """nccl-tests' ``getFloatStr``: 2 decimals while they fit in ``width``, then fewer, then e-notation."""
    power, val = 0, 1
    while value >= val:
        power += 1
        val *= 10
    if power < width - 2:
        return f"{value:{width}.2f}"
    if power < width - 1:
        return f"{value:{width}.1f}"
    if power < width + 1:
        return f"{value:{width}.0f}"
    if width >= 7:
        return f"{value:{width}.1e}"
    return f"{value:{width}.0e}"


def bus_factor(op: str, n: int) -> float:
    """busbw / algbw for ``op`` on ``n`` ranks (nccl-tests' PERFORMANCE.md)."""
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1) / n
    return 1.0


class Bench:
    """Buffers and timing for one op and size on this rank."""

    def __init__(self, args: argparse.Namespace, device: torch.device, rank: int, world: int) -> None:
        self.args, self.device, self.rank, self.world = args, device, rank, world
        self.dtype, self.type_name = DTYPES[args.dtype]
        self.elem = torch.tensor([], dtype=self.dtype).element_size()
        self.cuda = device.type == "cuda"

    def layout(self, op: str, size: int) -> tuple[int, int, int]:
        """(printed size in bytes, printed count, total elements) for a requested size."""
        total = size // self.elem
        if op in ("all_gather", "reduce_scatter"):
            per_rank = total // self.world
            return per_rank * self.world * self.elem, per_rank, per_rank * self.world
        return total * self.elem, total, total

    def make_op(self, op: str, total: int, in_place: bool) -> tuple[Callable[[], Any], Callable[[], int]]:
        """The collective as a no-argument callable, and a checker returning the wrong-element count."""
        n, r = self.world, self.rank
        per = total // n
        full = torch.empty(total, dtype=self.dtype, device=self.device)
        if op == "all_reduce":
            buf = full

            def run() -> Any:
                return dist.all_reduce(buf)

            def check() -> int:
                buf.fill_(r + 1)
                run()
                return _wrong(buf, n * (n + 1) / 2)

        elif op == "broadcast":
            buf = full

            def run() -> Any:
                return dist.broadcast(buf, src=0)

            def check() -> int:
                buf.fill_(r + 1)
                run()
                return _wrong(buf, 1)

        elif op == "all_gather":
            out = full
            inp = full.narrow(0, r * per, per) if in_place else torch.empty(per, dtype=self.dtype, device=self.device)

            def run() -> Any:
                return _ALL_GATHER(out, inp)

            def check() -> int:
                out.zero_()
                inp.fill_(r + 1)
                run()
                expected = torch.arange(1, n + 1, device=self.device).repeat_interleave(per).to(self.dtype)
                return int((out != expected).sum().item())

        else:  # reduce_scatter
            inp = full
            out = full.narrow(0, r * per, per) if in_place else torch.empty(per, dtype=self.dtype, device=self.device)

            def run() -> Any:
                return _REDUCE_SCATTER(out, inp)

            def check() -> int:
                inp.fill_(r + 1)
                run()
                return _wrong(out, n * (n + 1) / 2)

        full.fill_(1)
        return run, check

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)
        dist.barrier()
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def time_us(self, run: Callable[[], Any]) -> float:
        """Mean time of one operation in microseconds, averaged over ranks."""
        iters = self.args.iters
        for _ in range(self.args.warmup):
            run()
        if self.cuda:
            graph = None
            if self.args.cuda_graph:
                torch.cuda.synchronize(self.device)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(iters):
                        run()
                graph.replay()  # first replay uploads the graph: keep it out of the timing
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            self.sync()
            start.record()
            if graph is not None:
                graph.replay()
            else:
                for _ in range(iters):
                    run()
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) / 1e3
            del graph
        else:
            self.sync()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            elapsed_s = time.perf_counter() - t0
        mean = torch.tensor([elapsed_s / iters], dtype=torch.float64, device=self.device)
        dist.all_reduce(mean)
        return float(mean.item()) / self.world * 1e6


def _wrong(t: torch.Tensor, expected: float) -> int:
    return int((t.to(torch.float64) != expected).sum().item())


def sizes(args: argparse.Namespace) -> list[int]:
    out, size = [], args.min_bytes
    while size <= args.max_bytes:
        out.append(size)
        size *= args.factor
    return out


def header_lines() -> list[str]:
    """nccl-tests' two-part table header."""
    blank = ("", "", "", "", "")
    return [
        "#",
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}           out-of-place                       in-place          ".format(
            *blank
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}".format(
            "size",
            "count",
            "type",
            "redop",
            "root",
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "time",
            "algbw",
            "busbw",
            "#wrong",
        ),
        "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}".format(
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)", ""
        ),
    ]


def format_row(row: dict[str, Any]) -> str:
    """One result line, byte-for-byte in nccl-tests' layout."""
    text = "{:>12}  {:>12}  {:>8}  {:>6}  {:>6}".format(
        row["size"], row["count"], row["type"], row["redop"], f"{row['root']:6d}"
    )
    for kind in ("out_of_place", "in_place"):
        part = row[kind]
        wrong = "   N/A" if part["wrong"] is None else f"{part['wrong']:6g}"
        text += "  {}  {}  {}  {}".format(
            float_str(part["time_us"], 7), float_str(part["algbw"], 6), float_str(part["busbw"], 6), wrong
        )
    return text


def device_line(rank: int, device: torch.device) -> str:
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        domain, bus_id, dev_id = (getattr(props, k, 0) for k in ("pci_domain_id", "pci_bus_id", "pci_device_id"))
        bus = f"{domain:04x}:{bus_id:02x}:{dev_id:02x}"
        name, index = props.name, device.index
    else:
        bus, name, index = "cpu", "CPU", 0
    host = socket.gethostname()
    return f"#  Rank {rank:2d} Group  0 Pid {os.getpid():6d} on {host:>10} device {index:2d} [{bus}] {name}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and args.backend != "gloo"
    if args.backend == "nccl" and not torch.cuda.is_available():
        print("bench_collectives: --backend nccl needs CUDA GPUs", file=sys.stderr)
        return 2
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda else "gloo")
    if "RANK" in os.environ:
        dist.init_process_group(backend=backend)
    else:  # a single process without torchrun: a world of one
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)
    rank, world = dist.get_rank(), dist.get_world_size()
    bench = Bench(args, device, rank, world)

    lines: list[str] = []
    results: list[dict[str, Any]] = []

    def emit(line: str) -> None:
        if rank == 0:
            print(line, flush=True)
            lines.append(line)

    devices: list[Any] = [None] * world
    dist.all_gather_object(devices, device_line(rank, device))
    nccl_version = ".".join(map(str, torch.cuda.nccl.version())) if cuda and backend == "nccl" else None
    timing = (
        f"CUDA events around {args.iters} back-to-back ops" + (" (one CUDA graph replay)" if args.cuda_graph else "")
        if cuda
        else f"time.perf_counter around {args.iters} back-to-back ops"
    )
    preamble = [
        "# nccl-tests format from traceguard.capture.bench_collectives (torch.distributed)",
        f"# torch {torch.__version__} backend {backend} NCCL {nccl_version or 'N/A'} world_size {world} "
        f"dtype {args.dtype}",
        f"# Timing: {timing}; time averaged over ranks",
    ]
    for op in args.ops:
        emit(f"# Collective test starting: {op}_perf")
        for line in preamble:
            emit(line)
        emit(
            f"# nThread 1 nGpus 1 minBytes {args.min_bytes} maxBytes {args.max_bytes} step: {args.factor}(factor) "
            f"warmup iters: {args.warmup} iters: {args.iters} agg iters: 1 validation: {int(args.check)} "
            f"graph: {int(args.cuda_graph)}"
        )
        emit("#")
        emit("# Using devices")
        for line in devices:
            emit(str(line))
        try:
            probe_run, _ = bench.make_op(op, bench.layout(op, max(args.min_bytes, bench.elem * world))[2], False)
            probe_run()
            if cuda:
                torch.cuda.synchronize(device)
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            emit(f"# skipped {op}: {backend} does not support it ({reason[:160]})")
            emit(f"# Collective test concluded: {op}_perf")
            emit("")
            dist.barrier()
            continue
        for line in header_lines():
            emit(line)
        busbws: list[float] = []
        wrong_total = 0
        for requested in sizes(args):
            size, count, total = bench.layout(op, requested)
            if count == 0:
                continue
            row: dict[str, Any] = {
                "collective": op,
                "size": size,
                "count": count,
                "type": bench.type_name,
                "redop": "sum" if op in ("all_reduce", "reduce_scatter") else "none",
                "root": 0 if op == "broadcast" else -1,
            }
            for kind, in_place in (("out_of_place", False), ("in_place", True)):
                run, check = bench.make_op(op, total, in_place)
                time_us = bench.time_us(run)
                algbw = size / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
                busbw = algbw * bus_factor(op, world)
                wrong = None
                if args.check:
                    wrong_t = torch.tensor([check()], dtype=torch.int64, device=device)
                    dist.all_reduce(wrong_t)
                    wrong = int(wrong_t.item())
                    wrong_total += wrong
                row[kind] = {"time_us": time_us, "algbw": algbw, "busbw": busbw, "wrong": wrong}
                busbws.append(busbw)
                del run, check
            emit(format_row(row))
            results.append(row)
        avg = sum(busbws) / len(busbws) if busbws else 0.0
        emit(f"# {'Out of bounds values':<20} : {wrong_total} {'FAILED' if wrong_total else 'OK'}")
        emit(f"# {'Avg bus bandwidth':<20} : {avg:g} ")
        emit("#")
        emit(f"# Collective test concluded: {op}_perf")
        emit("")

    if rank == 0:
        if args.out:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text("\n".join(lines) + "\n")
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            record = {
                "world_size": world,
                "backend": backend,
                "torch": torch.__version__,
                "nccl": nccl_version,
                "dtype": args.dtype,
                "iters": args.iters,
                "warmup": args.warmup,
                "cuda_graph": args.cuda_graph,
                "timing": timing,
                "devices": devices,
                "rows": results,
            }
            args.json.write_text(json.dumps(record, indent=2))
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
