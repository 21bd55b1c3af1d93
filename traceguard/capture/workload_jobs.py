"""The harness's workloads beyond DDP, each a real code path of the instrumented job (``ddp_job.py``).

- ``pipeline``: the MLP split into contiguous stages, one per rank; each batch is cut into
  microbatches whose activations go forward and whose gradients come back through point-to-point
  send/recv, either blocking (``send``/``recv``) or batched (``batch_isend_irecv``), on a GPipe
  schedule (every forward, then every backward) or 1F1B (Megatron's: ``stages - stage - 1``
  warm-up forwards, then one forward and one backward alternately, then the remaining backwards).
- ``broadcast-reduce``: every step rank 0 broadcasts the parameters and every rank reduces its
  gradients to rank 0, which alone steps the optimizer (a parameter-server pattern). The payload
  travels in ``--comm-dtype``; with ``--async`` each collective is issued with ``async_op=True``
  and waited for only when its result is needed (a layer's parameters before its forward; every
  gradient after backward), so communication overlaps computation.
- ``fsdp``: FSDP2 (``torch.distributed.fsdp.fully_shard`` on every Linear and the root): all-gather
  of parameters, reduce-scatter of gradients.
- ``tensor-parallel``: ``torch.distributed.tensor.parallel`` — hidden Linear layers in pairs,
  column-wise then row-wise (an all-reduce in forward and one in backward per pair).

Ranges (NVTX and ``record_function``, like the DDP job): ``Batch N`` with ``get batch`` /
``forward`` / ``backward`` / ``optimizer step``; the pipeline adds ``microbatch M forward`` /
``microbatch M backward`` and one range per transfer; broadcast-reduce one per collective. A
transfer's range names its peer and size, ``send to P (B B)`` / ``recv from P (B B)`` (a batched
call lists all its transfers in one range, ``batch_isend_irecv: send to 2 (4096 B), recv from 2
(4096 B)``); a collective's ``broadcast <what> (B B)`` / ``reduce <what> (B B)``, with ``issue `` in
front when issued with ``async_op=True`` and a separate ``wait <op> <what>`` range where the host
waits for it. ``traceguard.metrics.workloads`` reads these names.

``--slow-rank R:MS`` (a known late rank, ``slow_rank.py``): every workload's step sleeps on the host
at the start of its ``get batch`` range (``slow_input``), before forward.

Needs torch only (runs on GPU machines that have nothing else installed).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from traceguard.capture.slow_rank import slow_input

WORKLOADS = ("ddp", "pipeline", "broadcast-reduce", "fsdp", "tensor-parallel")
COMM_DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass
class Workload:
    """What the job's step loop runs: ``step(index)`` does one ``Batch index`` with its phases."""

    name: str
    #: The parameters this rank holds (a stage's, a shard's or the whole model's).
    module: nn.Module
    step: Callable[[int], None]
    #: What the job saw of the workload (module classes, placements, dtype of the payload, ...).
    info: dict[str, Any] = field(default_factory=dict)
    #: Step index → what this rank sent in it: {"sent_bytes": {peer: bytes}, "received_bytes": {peer: bytes},
    #: "payload_bytes": {collective: bytes}}.
    ledger: dict[int, dict[str, dict[str, int]]] = field(default_factory=dict)


def ledger_entry(ledger: dict[int, dict[str, dict[str, int]]], index: int) -> dict[str, dict[str, int]]:
    return ledger.setdefault(index, {"sent_bytes": {}, "received_bytes": {}, "payload_bytes": {}})


def _count(table: dict[str, int], key: str | int, nbytes: int) -> None:
    table[str(key)] = table.get(str(key), 0) + nbytes


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


# ---------------------------------------------------------------------------------------------
# Pipeline.


def split_stages(layers: list[nn.Module], stages: int) -> list[list[nn.Module]]:
    """Contiguous chunks with the Linear layers spread as evenly as possible (a ReLU follows its Linear)."""
    blocks: list[list[nn.Module]] = []
    for layer in layers:
        if isinstance(layer, nn.Linear) or not blocks:
            blocks.append([layer])
        else:
            blocks[-1].append(layer)
    if len(blocks) < stages:
        raise SystemExit(
            f"--workload pipeline: {len(blocks)} Linear layers cannot fill {stages} stages (raise --mlp-depth)"
        )
    base, extra = divmod(len(blocks), stages)
    out, i = [], 0
    for s in range(stages):
        n = base + (1 if s < extra else 0)
        out.append([m for block in blocks[i : i + n] for m in block])
        i += n
    return out


class _P2P:
    """Point-to-point transfers of one stage, blocking or batched, each in a range naming peer and size."""

    def __init__(self, mode: str, nvtx: Any, ledger: dict[int, dict[str, dict[str, int]]]) -> None:
        self.mode, self.nvtx, self.ledger = mode, nvtx, ledger
        self.index = 0

    def exchange(
        self, sends: list[tuple[torch.Tensor, int]], recvs: list[tuple[torch.Tensor, int]], parity: int
    ) -> None:
        """Send and receive tensors; blocking mode orders them by the stage's parity so that two
        neighbours never both send first (Megatron's rule; NCCL send/recv pair up in order)."""
        entry = ledger_entry(self.ledger, self.index)
        for t, peer in sends:
            _count(entry["sent_bytes"], peer, _nbytes(t))
        for t, peer in recvs:
            _count(entry["received_bytes"], peer, _nbytes(t))
        if self.mode == "batched":
            parts = [f"send to {p} ({_nbytes(t)} B)" for t, p in sends] + [
                f"recv from {p} ({_nbytes(t)} B)" for t, p in recvs
            ]
            ops = [dist.P2POp(dist.isend, t, p) for t, p in sends] + [dist.P2POp(dist.irecv, t, p) for t, p in recvs]
            if ops:
                with self.nvtx.range("batch_isend_irecv: " + ", ".join(parts)):
                    for work in dist.batch_isend_irecv(ops):
                        work.wait()
            return
        calls: list[tuple[str, torch.Tensor, int]] = [("send", t, p) for t, p in sends] + [
            ("recv", t, p) for t, p in recvs
        ]
        if parity % 2:  # odd stages receive first
            calls.sort(key=lambda c: c[0] != "recv")
        for kind, t, p in calls:
            if kind == "send":
                with self.nvtx.range(f"send to {p} ({_nbytes(t)} B)"):
                    dist.send(t, p)
            else:
                with self.nvtx.range(f"recv from {p} ({_nbytes(t)} B)"):
                    dist.recv(t, p)


def build_pipeline(
    args: argparse.Namespace,
    layers: list[nn.Module],
    batches: Iterator[Any],
    *,
    rank: int,
    world: int,
    device: torch.device,
    nvtx: Any,
    delay_s: float = 0.0,
) -> Workload:
    stages = split_stages(layers, world)
    stage = nn.Sequential(*stages[rank]).to(device)
    last, first = rank == world - 1, rank == 0
    m = args.microbatches
    if args.batch_size % m:
        raise SystemExit(f"--batch-size {args.batch_size} is not a multiple of --microbatches {m}")
    micro = args.batch_size // m
    width = args.mlp_width
    opt = torch.optim.SGD(stage.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ledger: dict[int, dict[str, dict[str, int]]] = {}
    p2p = _P2P(args.p2p, nvtx, ledger)
    prev, nxt = rank - 1, rank + 1

    def step(index: int) -> None:
        p2p.index = index
        ledger_entry(ledger, index)
        inputs: dict[int, torch.Tensor] = {}
        outputs: dict[int, torch.Tensor] = {}
        with nvtx.range(f"Batch {index}"):
            with nvtx.range("get batch"):
                slow_input(delay_s)
                x, y = next(batches)
                xs = x.to(device, non_blocking=True).chunk(m)
                ys = y.to(device, non_blocking=True).chunk(m)

            def activation() -> torch.Tensor:
                return torch.empty(micro, width, device=device)

            def forward(i: int, received: torch.Tensor | None) -> torch.Tensor:
                with nvtx.range(f"microbatch {i} forward"):
                    inp = xs[i] if first else received
                    assert inp is not None
                    if not first:
                        inp.requires_grad_(True)
                    out = stage(inp)
                    if last:
                        out = loss_fn(out, ys[i]) / m
                    inputs[i], outputs[i] = inp, out
                    return out

            def backward(i: int, grad: torch.Tensor | None) -> torch.Tensor | None:
                with nvtx.range(f"microbatch {i} backward"):
                    torch.autograd.backward(outputs.pop(i), grad_tensors=None if last else grad)
                    inp = inputs.pop(i)
                    return None if first else inp.grad

            def recv_forward() -> torch.Tensor | None:
                if first:
                    return None
                t = activation()
                p2p.exchange([], [(t, prev)], rank)
                return t

            def send_forward(out: torch.Tensor) -> None:
                if not last:
                    p2p.exchange([(out.detach(), nxt)], [], rank)

            def recv_backward() -> torch.Tensor | None:
                if last:
                    return None
                g = activation()
                p2p.exchange([], [(g, nxt)], rank)
                return g

            def send_backward(grad: torch.Tensor | None) -> None:
                if not first:
                    assert grad is not None
                    p2p.exchange([(grad, prev)], [], rank)

            def send_forward_recv_backward(out: torch.Tensor) -> torch.Tensor | None:
                if last:
                    return None
                g = activation()
                p2p.exchange([(out.detach(), nxt)], [(g, nxt)], rank)
                return g

            def send_backward_recv_forward(grad: torch.Tensor | None) -> torch.Tensor | None:
                if first:
                    return None
                assert grad is not None
                t = activation()
                p2p.exchange([(grad, prev)], [(t, prev)], rank)
                return t

            if args.schedule == "gpipe":
                with nvtx.range("forward"):
                    for i in range(m):
                        send_forward(forward(i, recv_forward()))
                with nvtx.range("backward"):
                    for i in range(m):
                        send_backward(backward(i, recv_backward()))
            else:  # 1F1B (Megatron's non-interleaved schedule)
                warmup = min(world - rank - 1, m)
                remaining = m - warmup
                for i in range(warmup):
                    with nvtx.range("forward"):
                        send_forward(forward(i, recv_forward()))
                received = None
                if remaining:
                    with nvtx.range("forward"):
                        received = recv_forward()
                for j in range(remaining):
                    with nvtx.range("forward"):
                        grad = send_forward_recv_backward(forward(warmup + j, received))
                    with nvtx.range("backward"):
                        dx = backward(j, grad)
                        if j == remaining - 1:
                            send_backward(dx)
                        else:
                            received = send_backward_recv_forward(dx)
                for i in range(remaining, m):
                    with nvtx.range("backward"):
                        send_backward(backward(i, recv_backward()))
            with nvtx.range("optimizer step"):
                opt.step()
                opt.zero_grad(set_to_none=True)

    if dist.is_initialized():
        # NCCL: a batch_isend_irecv that is the group's first collective must involve every rank;
        # a barrier first makes the pairs' transfers never be that.
        dist.barrier()
    info = {
        "stages": world,
        "stage": rank,
        "stage_layers": [type(layer).__name__ for layer in stage],
        "microbatches": m,
        "microbatch_size": micro,
        "schedule": args.schedule,
        "p2p": args.p2p,
        "activation_bytes": micro * width * torch.empty(0).element_size(),
    }
    return Workload("pipeline", stage, step, info, ledger)


# ---------------------------------------------------------------------------------------------
# Broadcast / reduce.


def build_broadcast_reduce(
    args: argparse.Namespace,
    model: nn.Module,
    batches: Iterator[Any],
    *,
    rank: int,
    world: int,
    device: torch.device,
    nvtx: Any,
    delay_s: float = 0.0,
) -> Workload:
    comm_dtype = COMM_DTYPES[args.comm_dtype]
    layers = [layer for layer in model if any(True for _ in layer.parameters(recurse=False))]
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    ledger: dict[int, dict[str, dict[str, int]]] = {}
    seen_dtypes: set[str] = set()
    asynchronous = args.async_op

    def flat(params: list[torch.Tensor]) -> torch.Tensor:
        # The payload in the communication dtype: one buffer per layer (one collective per layer).
        return torch.cat([p.detach().reshape(-1) for p in params]).to(comm_dtype)

    def unflat(buffer: torch.Tensor, params: list[torch.Tensor], scale: float = 1.0) -> None:
        offset = 0
        for p in params:
            n = p.numel()
            p.copy_(buffer[offset : offset + n].view_as(p).to(p.dtype) * scale)
            offset += n

    def broadcast(i: int, layer: nn.Module, entry: dict[str, dict[str, int]]) -> tuple[Any, torch.Tensor]:
        params = list(layer.parameters())
        buffer = flat(params)
        seen_dtypes.add(str(buffer.dtype))
        _count(entry["payload_bytes"], "broadcast", _nbytes(buffer))
        label = f"broadcast layer {i} ({_nbytes(buffer)} B)"
        with nvtx.range(("issue " if asynchronous else "") + label):
            work = dist.broadcast(buffer, src=0, async_op=asynchronous)
        return work, buffer

    def land(i: int, layer: nn.Module, work: Any, buffer: torch.Tensor) -> None:
        if work is not None:
            with nvtx.range(f"wait broadcast layer {i}"):
                work.wait()
        if rank != 0:
            with torch.no_grad():
                unflat(buffer, list(layer.parameters()))

    def step(index: int) -> None:
        entry = ledger_entry(ledger, index)
        with nvtx.range(f"Batch {index}"):
            with nvtx.range("get batch"):
                slow_input(delay_s)
                x, y = next(batches)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            with nvtx.range("forward"):
                # Async: every layer's broadcast is in flight at once, each waited for just
                # before its layer runs — the later layers' parameters arrive behind compute.
                pending = [broadcast(i, layer, entry) for i, layer in enumerate(layers)] if asynchronous else None
                h = x
                li = 0
                for module in model:
                    if any(True for _ in module.parameters(recurse=False)):
                        work, buffer = pending[li] if pending else broadcast(li, module, entry)
                        land(li, module, work, buffer)
                        li += 1
                    h = module(h)
                loss = loss_fn(h, y)
            with nvtx.range("backward"):
                works: list[tuple[int, Any, torch.Tensor, list[torch.Tensor]]] = []
                hooks = []
                if asynchronous:
                    # A layer's gradient is reduced as soon as backward has produced it.
                    remaining = {id(layer): len(list(layer.parameters())) for layer in layers}

                    def ready(i: int, layer: nn.Module) -> Callable[[torch.Tensor], None]:
                        def hook(_p: torch.Tensor) -> None:
                            remaining[id(layer)] -= 1
                            if remaining[id(layer)] == 0:
                                works.append(reduce(i, layer, entry))

                        return hook

                    for i, layer in enumerate(layers):
                        for p in layer.parameters():
                            hooks.append(p.register_post_accumulate_grad_hook(ready(i, layer)))
                loss.backward()
                for h_ in hooks:
                    h_.remove()
                if not asynchronous:
                    works = [reduce(i, layer, entry) for i, layer in enumerate(layers)]
                for i, work, buffer, params in works:
                    if work is not None:
                        with nvtx.range(f"wait reduce layer {i}"):
                            work.wait()
                    if rank == 0:
                        with torch.no_grad():
                            offset = 0
                            for p in params:
                                n = p.numel()
                                p.grad.copy_(buffer[offset : offset + n].view_as(p).to(p.dtype) / world)
                                offset += n
            with nvtx.range("optimizer step"):
                if rank == 0:  # the root alone updates; the others get its parameters next step
                    opt.step()
                opt.zero_grad(set_to_none=True)

    def reduce(
        i: int, layer: nn.Module, entry: dict[str, dict[str, int]]
    ) -> tuple[int, Any, torch.Tensor, list[torch.Tensor]]:
        params = list(layer.parameters())
        buffer = torch.cat([p.grad.reshape(-1) for p in params]).to(comm_dtype)
        seen_dtypes.add(str(buffer.dtype))
        _count(entry["payload_bytes"], "reduce", _nbytes(buffer))
        label = f"reduce layer {i} ({_nbytes(buffer)} B)"
        with nvtx.range(("issue " if asynchronous else "") + label):
            work = dist.reduce(buffer, dst=0, op=dist.ReduceOp.SUM, async_op=asynchronous)
        return i, work, buffer, params

    info = {
        "comm_dtype": args.comm_dtype,
        "payload_dtypes": seen_dtypes,  # filled by the steps; a set, listed in the record
        "async_op": asynchronous,
        "root": 0,
        "layers": len(layers),
        "parameter_bytes_fp32": sum(_nbytes(p) for p in model.parameters()),
    }
    return Workload("broadcast-reduce", model, step, info, ledger)


# ---------------------------------------------------------------------------------------------
# FSDP2 and tensor parallelism: the model is sharded, the step is the plain one.


def tensor_type(param: torch.Tensor) -> str:
    """``DTensor`` for a distributed tensor (tensor parallel, FSDP2), ``Tensor`` for a plain one."""
    return "DTensor" if hasattr(param, "placements") else "Tensor"


def param_groups_by_tensor_type(module: nn.Module) -> list[dict[str, Any]]:
    """The module's parameters, one optimizer group per tensor type.

    The optimizers' foreach kernels take each group's tensors in one call: torch 2.11 refuses a list
    that mixes DTensors with plain tensors (``aten._foreach_add_.List: got mixed torch.Tensor and
    DTensor``), which the tensor-parallel MLP has (its classifier stays replicated, a plain tensor);
    torch 2.13 accepts it. Separate groups step the same parameters with the same settings on both."""
    groups: dict[str, list[torch.Tensor]] = {}
    for param in module.parameters():
        groups.setdefault(tensor_type(param), []).append(param)
    return [{"params": params, "tensor_type": kind} for kind, params in sorted(groups.items())]


def _optimizer_groups(module: nn.Module) -> list[dict[str, Any]]:
    """The record's view of ``param_groups_by_tensor_type``: each group's tensor type and size."""
    return [{"tensor_type": g["tensor_type"], "params": len(g["params"])} for g in param_groups_by_tensor_type(module)]


def _plain_step(
    module: nn.Module, batches: Iterator[Any], device: torch.device, nvtx: Any, delay_s: float = 0.0
) -> Callable[[int], None]:
    opt = torch.optim.SGD(param_groups_by_tensor_type(module), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

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
            with nvtx.range("optimizer step"):
                opt.step()
                opt.zero_grad(set_to_none=True)

    return step


def _placements(module: nn.Module) -> dict[str, str]:
    out = {}
    for name, p in module.named_parameters():
        placements = getattr(p, "placements", None)
        out[name] = ",".join(str(x) for x in placements) if placements is not None else "local"
    return out


def build_fsdp(
    model: nn.Module, batches: Iterator[Any], *, world: int, device: torch.device, nvtx: Any, delay_s: float = 0.0
) -> Workload:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    info = {
        "module": type(model).__name__,
        "sharded_modules": sum(1 for m in model.modules() if type(m).__name__.startswith("FSDP")),
        "placements": _placements(model),
        "mesh": list(mesh.shape),
        "optimizer_groups": _optimizer_groups(model),
    }
    return Workload("fsdp", model, _plain_step(model, batches, device, nvtx, delay_s), info)


def build_tensor_parallel(
    model: nn.Module, batches: Iterator[Any], *, world: int, device: torch.device, nvtx: Any, delay_s: float = 0.0
) -> Workload:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh(device.type, (world,))
    linears = [name for name, layer in model.named_children() if isinstance(layer, nn.Linear)]
    hidden = linears[:-1]  # the classifier stays replicated
    if len(hidden) < 2:
        raise SystemExit("--workload tensor-parallel needs --mlp-depth 2 or more (Linear layers in pairs)")
    plan: dict[str, Any] = {}
    for a, b in zip(hidden[0::2], hidden[1::2], strict=False):
        plan[a], plan[b] = ColwiseParallel(), RowwiseParallel()
    parallelize_module(model, mesh, plan)
    info = {
        "module": type(model).__name__,
        "plan": {k: type(v).__name__ for k, v in plan.items()},
        "placements": _placements(model),
        "mesh": list(mesh.shape),
        "optimizer_groups": _optimizer_groups(model),
    }
    return Workload("tensor-parallel", model, _plain_step(model, batches, device, nvtx, delay_s), info)


def build(
    args: argparse.Namespace,
    model: nn.Module,
    batches: Iterator[Any],
    *,
    rank: int,
    world: int,
    device: torch.device,
    nvtx: Any,
    delay_s: float = 0.0,
) -> Workload:
    """The workload ``args.workload`` (not ddp) on this rank; ``model`` is the whole MLP, on the CPU.
    ``delay_s``: this rank's ``--slow-rank`` sleep at the start of every ``get batch``."""
    if args.workload == "pipeline":
        layers = list(model)
        return build_pipeline(args, layers, batches, rank=rank, world=world, device=device, nvtx=nvtx, delay_s=delay_s)
    model = model.to(device)
    if args.workload == "broadcast-reduce":
        return build_broadcast_reduce(
            args, model, batches, rank=rank, world=world, device=device, nvtx=nvtx, delay_s=delay_s
        )
    if args.workload == "fsdp":
        return build_fsdp(model, batches, world=world, device=device, nvtx=nvtx, delay_s=delay_s)
    if args.workload == "tensor-parallel":
        return build_tensor_parallel(model, batches, world=world, device=device, nvtx=nvtx, delay_s=delay_s)
    raise SystemExit(f"unknown workload {args.workload!r}")


def record_of(workload: Workload) -> dict[str, Any]:
    """The rank record's ``workload`` entry (sets listed, ledger keyed by step name)."""
    info = {k: sorted(v) if isinstance(v, set) else v for k, v in workload.info.items()}
    ledger = {f"Batch {i}": entry for i, entry in sorted(workload.ledger.items())}
    return {"name": workload.name, **info, "per_step": ledger}
