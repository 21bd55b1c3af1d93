"""Which GPU work does a world-size-1 NCCL collective launch, eagerly and inside a CUDA graph?

Run under ``torchrun --nproc_per_node=1``; writes JSON (``--out``) mapping each variant to the GPU
kernels/copies torch.profiler saw. Needs torch alone. Why it exists: NCCL short-circuits one-rank
communicators (an in-place SUM all-reduce launches nothing), so a one-GPU CUDA-graph fixture must
use a collective that still runs on the GPU.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist


def gpu_events(fn: Callable[[], None]) -> list[str]:
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    ) as prof:
        fn()
        torch.cuda.synchronize()
    names = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    return sorted(names)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    torch.cuda.set_device(0)
    dist.init_process_group("nccl")
    t = torch.ones(1 << 20, device="cuda")
    out_buf = torch.empty_like(t)
    variants: dict[str, Callable[[], None]] = {
        "all_reduce_sum": lambda: dist.all_reduce(t),
        "all_reduce_avg": lambda: dist.all_reduce(t, op=dist.ReduceOp.AVG),
        "all_to_all_single": lambda: dist.all_to_all_single(out_buf, t),
    }
    result: dict[str, object] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "gpu": torch.cuda.get_device_name(0),
    }
    for name, fn in variants.items():
        fn()  # communicator and any lazy state first
        torch.cuda.synchronize()
        entry: dict[str, object] = {"eager": gpu_events(fn)}
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn()
            entry["graph_replay"] = gpu_events(graph.replay)
        except Exception as error:  # the probe records what failed
            entry["graph_error"] = repr(error)
        result[name] = entry
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
