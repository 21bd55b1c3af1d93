"""A training step whose model runs through ``torch.compile(mode="reduce-overhead")`` (CUDA graph
trees: the forward and the backward are separate graphs, replayed every step; loss and optimizer
stay eager). Six profiled steps, each an NVTX range ``Batch N`` inside ``cudaProfilerStart/Stop``,
so ``nsys --capture-range=cudaProfilerApi`` records only replays (the graphs are recorded during
the warm-up steps, before the capture range). Needs torch and a CUDA GPU only.

    nsys profile --trace=cuda,nvtx --cuda-graph-trace=graph|node --capture-range=cudaProfilerApi \\
        --capture-range-end=stop -o OUT python3 bench/gpu/compile_graphs.py
"""

from __future__ import annotations

import json
import sys

import torch
from torch import nn

WARMUP, STEPS = 10, 6


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda")
    model = nn.Sequential(
        nn.Linear(1024, 2048), nn.GELU(), nn.Linear(2048, 2048), nn.GELU(), nn.Linear(2048, 10)
    ).to(device)
    compiled = torch.compile(model, mode="reduce-overhead")
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    x = torch.randn(128, 1024, device=device)
    y = torch.randint(0, 10, (128,), device=device)

    def step(index: int) -> float:
        torch.cuda.nvtx.range_push(f"Batch {index}")
        torch.compiler.cudagraph_mark_step_begin()
        loss = loss_fn(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.nvtx.range_pop()
        return float(loss.detach())

    for index in range(WARMUP):  # compile, then CUDA graph trees record (they replay from the 3rd call)
        step(index)
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    losses = [step(index) for index in range(WARMUP, WARMUP + STEPS)]
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    json.dump({"torch": torch.__version__, "losses": losses, "warmup": WARMUP, "steps": STEPS}, sys.stdout)
    print()


if __name__ == "__main__":
    main()
