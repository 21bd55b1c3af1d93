"""The instrumented DDP training job that traceguard captures.

Runs under ``torchrun`` (one process per rank) and needs only torch, so it runs as-is on GPU
machines that have nothing else installed. Every step is an NVTX range ``Batch N`` with nested
``get batch`` / ``forward`` / ``backward`` / ``optimizer step`` ranges, recorded as torch.profiler
``record_function`` ranges too, so nsys and Kineto captures show the same steps and phases.

Profiled steps sit inside ``cudaProfilerStart``/``Stop`` (nsys ``--capture-range=cudaProfilerApi``)
or a ``torch.profiler`` session; throughput is measured on separate timed steps.

``--slow-rank R:MS`` makes a known late rank: rank R's host sleeps MS ms first thing in every
step's ``get batch`` range (``slow_rank.py``), recorded in the rank's ``config`` and ``slow_rank_sleep_ms``.

Usage (one line per rank is started by torchrun)::

    torchrun --nproc_per_node=2 -m traceguard.capture.ddp_job --out DIR [options]
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import statistics
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from traceguard.capture import slow_rank
from traceguard.capture.slow_rank import SLOW_INPUT_WORKLOADS, slow_input
from traceguard.capture.workload_jobs import COMM_DTYPES, WORKLOADS, Workload, record_of
from traceguard.capture.workload_jobs import build as build_workload

PHASES = ("get batch", "forward", "backward", "optimizer step")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for per-rank outputs")
    p.add_argument("--model", choices=["mlp", "vit_l_32"], default="mlp")
    p.add_argument("--mlp-width", type=int, default=1024)
    p.add_argument("--mlp-depth", type=int, default=4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--warmup", type=int, default=3, help="untimed, unprofiled steps")
    p.add_argument("--timed", type=int, default=5, help="steps timed for throughput (not profiled)")
    p.add_argument("--repeats", type=int, default=1, help="times the timed steps are run (median and spread)")
    p.add_argument("--steps", type=int, default=3, help="profiled steps")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None)
    p.add_argument(
        "--comm",
        choices=["ddp", "cpu-staged", "allreduce", "per-param", "none"],
        default="ddp",
        help="allreduce: one explicit all_reduce (AVG) of the flattened gradients after backward, no DDP; "
        "per-param: the small-collectives anti-pattern, every gradient all-reduced on its own (no bucketing)",
    )
    p.add_argument("--static-graph", action="store_true")
    p.add_argument("--no-bucket-view", dest="bucket_view", action="store_false")
    p.add_argument("--bucket-cap-mb", type=float, default=25.0)
    p.add_argument("--comm-hook", choices=["none", "bf16", "fp16", "powersgd"], default="none")
    p.add_argument("--powersgd-rank", type=int, default=1)
    p.add_argument("--powersgd-start-iter", type=int, default=2)
    p.add_argument("--capture", choices=["nsys", "torch", "none"], default="none")
    p.add_argument("--num-workers", type=int, default=0)
    # Workloads beyond DDP (workload_jobs.py); --comm and the DDP options apply to ddp only.
    p.add_argument("--workload", choices=list(WORKLOADS), default="ddp")
    p.add_argument("--microbatches", type=int, default=4, help="pipeline: microbatches per batch")
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe", help="pipeline schedule")
    p.add_argument("--p2p", choices=["blocking", "batched"], default="blocking", help="pipeline: send/recv calls")
    p.add_argument("--comm-dtype", choices=list(COMM_DTYPES), default="fp32", help="broadcast-reduce payload dtype")
    p.add_argument("--async", dest="async_op", action="store_true", help="broadcast-reduce: async_op=True, then wait")
    p.add_argument(
        "--cuda-graphs",
        action="store_true",
        help="capture forward+backward+gradient all-reduce+optimizer step as one CUDA graph and replay it "
        "every step (needs CUDA; --comm ddp becomes allreduce, which the graph holds)",
    )
    slow_rank.add_option(p)
    args = p.parse_args(argv)
    try:
        args.slow_rank = slow_rank.merge_slow_ranks(args.slow_rank)
    except ValueError as exc:
        p.error(str(exc))
    if args.slow_rank and args.workload not in SLOW_INPUT_WORKLOADS:
        p.error(f"--slow-rank sleeps in the `get batch` range, which --workload {args.workload} does not have")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if beyond := [r for r in args.slow_rank if r >= world]:
        p.error(f"--slow-rank names rank {beyond[0]}, but the job has {world} rank(s) (0..{world - 1})")
    if args.cuda_graphs:
        if not torch.cuda.is_available():
            p.error("--cuda-graphs needs a CUDA GPU: torch.cuda.is_available() is False on this machine")
        if args.workload != "ddp":
            p.error(f"--cuda-graphs captures the ddp workload's step; --workload {args.workload} is not graphed")
        if args.comm in ("cpu-staged", "per-param"):
            p.error(f"--cuda-graphs holds --comm allreduce (or ddp, which becomes it) or none, not {args.comm}")
        if args.comm == "ddp":
            # DDP's reducer hooks are not captured into a graph; an explicit all-reduce is (Megatron-style).
            args.comm = "allreduce"
        if args.num_workers:
            p.error("--cuda-graphs reads batches in the main process: leave --num-workers at 0")
    return args


class _Nvtx:
    """NVTX push/pop through torch on CUDA builds, the ``nvtx`` package otherwise (CPU runs)."""

    def __init__(self) -> None:
        self._push = self._pop = None
        if torch.cuda.is_available():
            self._push, self._pop = torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
        else:
            with contextlib.suppress(ImportError):
                import nvtx  # type: ignore[import-not-found]

                self._push, self._pop = (lambda m: nvtx.push_range(m)), nvtx.pop_range

    @contextlib.contextmanager
    def range(self, name: str) -> Iterator[None]:
        if self._push:
            self._push(name)
        try:
            with torch.profiler.record_function(name):
                yield
        finally:
            if self._pop:
                self._pop()


class SyntheticImages(torch.utils.data.Dataset):
    """Random samples from a small fixed pool: loading costs a collate copy, not an RNG run.

    Generating fresh random images per sample made ``get batch`` CPU-bound (40 ms a step for
    ViT-L inputs), desynchronising ranks so NCCL kernels mostly waited for the slower peer.
    """

    POOL = 16

    def __init__(self, n: int, shape: tuple[int, ...], classes: int) -> None:
        self.n, self.classes = n, classes
        self.pool = torch.randn((self.POOL, *shape), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.pool[i % self.POOL], torch.tensor(i % self.classes)


def build_model(args: argparse.Namespace) -> tuple[nn.Module, tuple[int, ...], int]:
    if args.model == "vit_l_32":
        from torchvision.models import vit_l_32  # random weights: nothing is downloaded

        return vit_l_32(weights=None), (3, 224, 224), 1000
    layers: list[nn.Module] = []
    width = args.mlp_width
    for _ in range(args.mlp_depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers), (width,), 10


def register_hook(ddp: nn.parallel.DistributedDataParallel, args: argparse.Namespace) -> str | None:
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if args.comm_hook == "bf16":
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "powersgd":
        state = powerSGD_hook.PowerSGDState(
            process_group=None,
            matrix_approximation_rank=args.powersgd_rank,
            start_powerSGD_iter=args.powersgd_start_iter,
        )
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        return None
    return args.comm_hook


def cpu_staged_allreduce(model: nn.Module, group: Any, world: int) -> None:
    """The anti-pattern: every gradient to the CPU, all-reduced there, copied back."""
    for p in model.parameters():
        if p.grad is None:
            continue
        staged = p.grad.detach().cpu()
        dist.all_reduce(staged, group=group)
        p.grad.copy_(staged.div_(world).to(p.grad.device, non_blocking=False))


def per_param_allreduce(params: list[nn.Parameter]) -> None:
    """The small-collectives anti-pattern: one all-reduce per gradient, no bucketing (a
    hand-written loop over ``model.parameters()``); each launch pays the collective's fixed cost."""
    nccl = dist.get_backend() == "nccl"
    for p in params:
        if p.grad is None:
            continue
        if nccl:
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        else:
            dist.all_reduce(p.grad)
            p.grad.div_(dist.get_world_size())


def allreduce_gradients(params: list[nn.Parameter]) -> None:
    """Average the gradients over ranks with ONE all-reduce of a flat buffer (op AVG).

    Capturable in a CUDA graph (no host sync, fixed shapes). AVG rather than SUM: on a one-rank
    NCCL communicator an in-place SUM launches nothing at all, while AVG (NCCL's PreMulSum) still
    runs a GPU kernel, so a world-size-1 job shows the collective in its traces. Gloo has no AVG:
    there it is SUM, then a division.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    if dist.get_backend() == "nccl":
        dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    else:
        dist.all_reduce(flat)
        flat.div_(dist.get_world_size())
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


#: Frames of a failed rank's traceback kept in its error file: the innermost ones, where it broke.
ERROR_FRAMES = 8


def write_rank_error(out: Path, rank: int, exc: BaseException) -> Path:
    """``out/rank{rank}.error.json``: this rank's own exception — type, message and the innermost
    ``ERROR_FRAMES`` frames — for the harness to report first. torchrun's launcher log interleaves
    every rank's output and its own traceback; this file is the one rank's, unmixed."""
    frames = traceback.extract_tb(exc.__traceback__)[-ERROR_FRAMES:]
    error = {
        "rank": rank,
        "time": time.time(),  # the first rank to fail is the cause; the others often fail on its absence
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}".removeprefix("builtins."),
        "message": str(exc),
        "frames": [
            {"file": f.filename, "line": f.lineno, "function": f.name, "code": (f.line or "").strip()} for f in frames
        ],
        "traceback": "".join(traceback.format_exception(exc))[-4000:],
    }
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"rank{rank}.error.json"
    path.write_text(json.dumps(error, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    try:
        return _run(args, rank)
    except BaseException as exc:  # a rank's own failure, whatever it is, before it dies
        if not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            with contextlib.suppress(OSError):  # an unwritable folder must not hide the rank's own error
                write_rank_error(args.out, rank, exc)
        raise


def _run(args: argparse.Namespace, rank: int) -> int:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    backend = args.backend or ("nccl" if cuda else "gloo")
    distributed = world > 1 or "RANK" in os.environ
    if distributed:
        dist.init_process_group(backend=backend)
    args.out.mkdir(parents=True, exist_ok=True)
    finished = False
    try:
        record = _train(args, rank=rank, world=world, local_rank=local_rank, device=device, backend=backend)
        (args.out / f"rank{rank}.json").write_text(json.dumps(record, indent=2))
        finished = True
    finally:
        # DDP's reducer and gloo's async work hold the process group and tensors; left to
        # interpreter finalization, gloo's worker threads are torn down without the GIL and the
        # rank aborts ("terminate called without an active exception"). Free them first.
        gc.collect()
        if distributed:
            if finished:
                dist.barrier()  # nobody tears down while a peer still talks to it
            dist.destroy_process_group()
    return 0


def _train(
    args: argparse.Namespace, *, rank: int, world: int, local_rank: int, device: torch.device, backend: str
) -> dict[str, Any]:
    """Build, run and capture the job; returns the rank's record. Every object it makes dies with it."""
    cuda = device.type == "cuda"
    distributed = dist.is_initialized()
    nvtx = _Nvtx()
    torch.manual_seed(0)
    # --slow-rank: this rank's host sleep at the start of every `get batch` (0: none).
    delay_s = args.slow_rank.get(rank, 0.0) / 1000.0
    comm = args.comm if args.workload == "ddp" else "none"  # the other workloads communicate their own way

    model, shape, classes = build_model(args)
    model = model.to(device)
    module: nn.Module = model
    ddp_info: dict[str, Any] = {"enabled": False}
    staged_group = None
    if distributed and comm == "ddp":
        ddp = nn.parallel.DistributedDataParallel(
            model,
            device_ids=[local_rank] if cuda else None,
            static_graph=args.static_graph,
            gradient_as_bucket_view=args.bucket_view,
            bucket_cap_mb=args.bucket_cap_mb,
        )
        hook = register_hook(ddp, args)
        module = ddp
        # What DDP itself reports (its own logging data), not just what was asked of it.
        logged = ddp._get_ddp_logging_data() if hasattr(ddp, "_get_ddp_logging_data") else {}
        ddp_info = {
            "enabled": True,
            "static_graph": bool(logged.get("static_graph", args.static_graph)),
            "gradient_as_bucket_view": bool(logged.get("gradient_as_bucket_view", ddp.gradient_as_bucket_view)),
            "bucket_cap_mb": args.bucket_cap_mb,
            "bucket_cap_bytes": logged.get("bucket_cap_bytes"),
            "comm_hook": hook,
            "registered_comm_hook": logged.get("comm_hook") or None,
            "backend": logged.get("backend_name"),
        }
    elif distributed and comm == "cpu-staged":
        staged_group = dist.new_group(backend="gloo")
    explicit_allreduce = distributed and comm == "allreduce"
    per_param = distributed and comm == "per-param"

    # +2: a graphed job takes one batch for its static buffers and warms up on at least 3 steps.
    total_steps = max(args.warmup, 3) + args.timed * max(args.repeats, 1) + args.steps + 2
    data = SyntheticImages(total_steps * args.batch_size, shape, classes)
    loader = torch.utils.data.DataLoader(
        data, batch_size=args.batch_size, num_workers=args.num_workers, pin_memory=cuda, drop_last=True
    )
    opt = torch.optim.SGD(module.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    batches = iter(loader)
    workload: Workload | None = None
    if args.workload != "ddp":
        workload = build_workload(
            args, model, batches, rank=rank, world=world, device=device, nvtx=nvtx, delay_s=delay_s
        )
        model = workload.module

    def step(index: int) -> None:
        with nvtx.range(f"Batch {index}"):
            with nvtx.range("get batch"):
                slow_input(delay_s)
                x, y = next(batches)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with nvtx.range("forward"):
                loss = loss_fn(module(x), y)
            with nvtx.range("backward"):
                loss.backward()
                if staged_group is not None:
                    cpu_staged_allreduce(model, staged_group, world)
                if explicit_allreduce:
                    allreduce_gradients(list(model.parameters()))
                if per_param:
                    per_param_allreduce(list(model.parameters()))
            with nvtx.range("optimizer step"):
                opt.step()
                opt.zero_grad(set_to_none=True)

    graphed: GraphedStep | None = None
    if args.cuda_graphs:
        graphed = GraphedStep(
            model,
            opt,
            loss_fn,
            batches,
            device,
            nvtx,
            allreduce=explicit_allreduce,
            warmup=max(args.warmup, 3),
            delay_s=delay_s,
        )
        step = graphed.step  # every step from here on replays the graph
    if workload is not None:
        step = workload.step

    capture_pending = graphed is not None

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        if distributed:
            dist.barrier()

    index = 0 if graphed is None else graphed.warmup
    if graphed is not None and args.capture == "none":
        graphed.capture()  # nothing traces this job: capture now, before the timed replays
        capture_pending = False
    for _ in range(args.warmup if graphed is None else 0):
        step(index)
        index += 1
    sync()
    # PowerSGD compresses from its start iteration on: say whether it already did in the timed steps.
    for _, hook_state in getattr(module, "_comm_hooks", []):
        if hasattr(hook_state, "start_powerSGD_iter"):
            ddp_info["powersgd_iter_before_timed"] = hook_state.iter
            ddp_info["powersgd_start_iter"] = hook_state.start_powerSGD_iter
    repeats: list[float] = []  # steps/s of each run of the timed steps
    for _ in range(max(args.repeats, 1) if args.timed and not capture_pending else 0):
        t0 = time.perf_counter()
        for _ in range(args.timed):
            step(index)
            index += 1
        sync()
        repeats.append(args.timed / (time.perf_counter() - t0))
    throughput = statistics.median(repeats) if repeats else None

    trace_path = None
    if args.capture == "torch":
        activities = [torch.profiler.ProfilerActivity.CPU]
        if cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        trace_path = args.out / f"rank{rank}.trace.json"
        # One profiler warm-up step first (as torch recommends); then ``steps`` recorded steps,
        # each a ``ProfilerStep#N`` range around the job's own ``Batch N``.
        schedule = torch.profiler.schedule(wait=0, warmup=1, active=args.steps, repeat=1)
        with torch.profiler.profile(
            activities=activities,
            schedule=schedule,
            # Shapes give the c10d annotations (gloo:send, gloo:broadcast, ...) their payload sizes.
            record_shapes=True,
            on_trace_ready=lambda p: p.export_chrome_trace(str(trace_path)),
        ) as prof:
            if capture_pending:
                # Captured while the profiler runs (its warm-up step, discarded), so the recorded
                # steps are replays only and the graph is instantiated under tracing.
                graphed.capture()
            for profiled in range(args.steps + 1):
                step(index)
                index += 1
                if profiled == 0:
                    sync()  # ranks enter the recorded steps together
                prof.step()
            sync()
    else:
        if cuda and args.capture == "nsys":
            torch.cuda.profiler.start()
            # Each rank's cudaProfilerStart returns when its own nsys collection is up, at
            # different times; without this barrier the first captured step of the earlier rank
            # is mostly NCCL waiting for the later one.
            sync()
        if capture_pending:
            # Inside the capture range, so the capture shows the graph being made (not needed for
            # node-level tracing: compile_node_level in tests/fixtures/cuda_graphs shows nodes of older graphs).
            graphed.capture()
        for _ in range(args.steps):
            step(index)
            index += 1
        sync()
        if cuda and args.capture == "nsys":
            torch.cuda.profiler.stop()
    if capture_pending:
        # Throughput of graph replays, measured after the captured steps (the graph was made inside them).
        t0 = time.perf_counter()
        for _ in range(args.timed):
            step(index)
            index += 1
        sync()
        throughput = args.timed / (time.perf_counter() - t0) if args.timed else None

    record = {
        "rank": rank,
        "world_size": world,
        "local_rank": local_rank,
        "backend": backend if distributed else None,
        "device": str(device),
        "gpu_name": torch.cuda.get_device_name(device) if cuda else None,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())) if cuda else None,
        "python": platform.python_version(),
        "host": platform.node(),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        # --slow-rank as this rank applied it: its host sleep at the start of every `get batch`.
        "slow_rank_sleep_ms": args.slow_rank.get(rank, 0.0),
        "ddp": ddp_info,
        "comm": comm,
        "workload": record_of(workload) if workload is not None else {"name": "ddp"},
        "cuda_graphs": graphed.describe() if graphed is not None else None,
        "parameters": sum(p.numel() for p in model.parameters()),
        "gradient_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "throughput_steps_per_s": throughput,
        "throughput_repeats_steps_per_s": repeats,
        "profiled_steps": args.steps,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "TORCH_", "CUDA_", "GLOO_", "OMP_"))},
        "trace": trace_path.name if trace_path else None,
    }
    return record


class GraphedStep:
    """The training step as one CUDA graph: forward, backward, gradient all-reduce, optimizer step.

    ``torch.cuda.graphs`` whole-network capture: static input buffers, ``warmup`` eager steps on a
    side stream first (cuBLAS workspaces, optimizer state and the NCCL communicator must exist before
    capture), then one capture; each step copies its batch into the static buffers (``get batch``)
    and replays the graph inside a ``graph replay`` range. NVTX ranges recorded during the capture
    are not replayed, so ``forward``/``backward`` exist only around the capture itself.
    """

    def __init__(
        self,
        model: nn.Module,
        opt: torch.optim.Optimizer,
        loss_fn: nn.Module,
        batches: Iterator[tuple[torch.Tensor, torch.Tensor]],
        device: torch.device,
        nvtx: _Nvtx,
        *,
        allreduce: bool,
        warmup: int,
        delay_s: float = 0.0,
    ) -> None:
        self.model, self.opt, self.loss_fn, self.batches = model, opt, loss_fn, batches
        self.device, self.nvtx, self.allreduce, self.warmup = device, nvtx, allreduce, warmup
        self.delay_s = delay_s
        x, y = next(batches)
        self.static_x, self.static_y = x.to(device), y.to(device)
        self.graph: torch.cuda.CUDAGraph | None = None
        side = torch.cuda.Stream(device)
        side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side):
            for index in range(warmup):
                with nvtx.range(f"Batch {index}"):
                    self.opt.zero_grad(set_to_none=True)
                    self._load()
                    self._body()
        torch.cuda.current_stream(device).wait_stream(side)
        torch.cuda.synchronize(device)

    def _load(self) -> None:
        with self.nvtx.range("get batch"):
            slow_input(self.delay_s)
            x, y = next(self.batches)
            self.static_x.copy_(x, non_blocking=True)
            self.static_y.copy_(y, non_blocking=True)

    def _body(self) -> None:
        with self.nvtx.range("forward"):
            loss = self.loss_fn(self.model(self.static_x), self.static_y)
        with self.nvtx.range("backward"):
            loss.backward()
            if self.allreduce:
                allreduce_gradients(list(self.model.parameters()))
        with self.nvtx.range("optimizer step"):
            self.opt.step()

    def capture(self) -> None:
        self.opt.zero_grad(set_to_none=True)  # gradients are then allocated from the graph's pool
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: NCCL's watchdog thread may query events while this thread captures.
        with self.nvtx.range("graph capture"), torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self._body()
        torch.cuda.synchronize(self.device)

    def step(self, index: int) -> None:
        assert self.graph is not None, "capture() first"
        with self.nvtx.range(f"Batch {index}"):
            self._load()
            with self.nvtx.range("graph replay"):
                self.graph.replay()

    def describe(self) -> dict[str, Any]:
        return {"warmup_eager_steps": self.warmup, "allreduce_in_graph": self.allreduce, "captured": bool(self.graph)}


if __name__ == "__main__":
    sys.exit(main())
