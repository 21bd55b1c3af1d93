"""Hand-written step names on real captures (issue 25, docs/steps.md "Conventions").

A DDP loop that wraps each step in an NVTX range ``train_step {i}`` got inferred steps (on GPU
captures) or none (on CPU ones): only ``step N``, ``iteration N``, ``iter N`` and ``batch N`` were
known. Here a real gloo DDP loop on the CPU names its steps each way the generic convention accepts
(``train_step``, ``training step``, ``step``, ``iteration``, ``iter``; any case; ``_``, ``-``,
``#``, ``:`` or a space) and is captured for real, under the machine's Nsight Systems (NVTX ranges
from the ``nvtx`` package, as the harness's CPU jobs make them; ``torch.cuda.nvtx`` needs a CUDA
build) and under torch.profiler (``record_function``). Every named range is a step, with its phases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import nsys_profile
from traceguard.capture import harness
from traceguard.pipeline import analyze

pytestmark = pytest.mark.slow

#: How the loop names its steps, in order; two steps each.
STEP_NAMES = ["train_step {}", "Training Step #{}", "step_{}", "Iteration: {}", "iter-{}", "TRAIN-STEP {}"]
PHASES = ["forward", "backward", "optimizer step"]

LOOP = """
import os, sys
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

mode, names, out = sys.argv[1], sys.argv[2].split("|"), sys.argv[3]
if mode == "nsys":
    import nvtx
    push, pop = nvtx.push_range, nvtx.pop_range
else:
    from torch.profiler import ProfilerActivity, profile, record_function
    stack = []
    def push(name):
        stack.append(record_function(name))
        stack[-1].__enter__()
    def pop():
        stack.pop().__exit__(None, None, None)

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[4])
dist.init_process_group("gloo", rank=0, world_size=1)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

def loop():
    for fmt in names:
        for i in range(2):
            push(fmt.format(i))
            push("forward")
            loss = model(torch.randn(32, 64)).pow(2).mean()
            pop()
            push("backward")
            loss.backward()
            pop()
            push("optimizer step")
            optimizer.step()
            optimizer.zero_grad()
            pop()
            pop()

if mode == "nsys":
    loop()
else:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        loop()
    prof.export_chrome_trace(out)
dist.destroy_process_group()
"""


def _free_port() -> str:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _expected() -> list[str]:
    return [fmt.format(i) for fmt in STEP_NAMES for i in range(2)]


def _check(report: dict) -> None:
    (rank,) = report["ranks"]
    assert (rank["step_source"], rank["step_detail"]) == ("convention", "generic"), rank["step_source"]
    assert [s["name"] for s in rank["steps"]] == _expected()
    assert all(list(s["phases"]) == PHASES for s in rank["steps"]), [list(s["phases"]) for s in rank["steps"]]
    assert all(s["cpu_ns"] and s["cpu_ns"] > 0 for s in rank["steps"])


def test_a_ddp_loop_under_nsys_with_hand_written_step_names(tmp_path: Path) -> None:
    nsys = harness.find_nsys()
    if nsys is None:
        if os.environ.get("CI") or os.environ.get("TRACEGUARD_REQUIRE_NSYS"):
            pytest.fail("nsys is not installed; scripts/setup.sh installs it from Debian non-free")
        pytest.skip("nsys is not installed")
    problem = harness.nvtx_visibility_problem(harness.nsys_version(nsys), harness.package_version("nvtx"))
    assert problem is None, problem
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    profile = [nsys, "profile", "--trace=nvtx,osrt", "--sample=none", "--cpuctxsw=none", "-f", "true"]

    def command() -> list[str]:  # a fresh port for a second run
        job = [sys.executable, str(script), "nsys", "|".join(STEP_NAMES), "-", _free_port()]
        return [*profile, "-o", str(tmp_path / "cap_0"), *job]

    failed = nsys_profile.profile(command, lambda: False, timeout=600, cwd=tmp_path)
    assert len(failed) < 2, "\n".join(failed)
    captures, problems = harness._export_reports(tmp_path, nsys, 1, keep=False)
    assert problems == [] and [c["path"] for c in captures] == ["cap_0.sqlite"]
    _check(analyze([str(tmp_path / "cap_0.sqlite")], profile="ci-cpu", scheduler="serial").report)


def test_a_ddp_loop_under_torch_profiler_with_hand_written_step_names(tmp_path: Path) -> None:
    trace = tmp_path / "rank0.json"
    script = tmp_path / "loop.py"
    script.write_text(LOOP)
    subprocess.run(
        [sys.executable, str(script), "torch", "|".join(STEP_NAMES), str(trace), _free_port()],
        check=True,
        capture_output=True,
        timeout=600,
        cwd=tmp_path,
    )
    names = {e.get("name") for e in json.loads(trace.read_text())["traceEvents"]}
    assert set(_expected()) <= names and not any(str(n).startswith("ProfilerStep#") for n in names)
    _check(analyze([str(trace)], profile="ci-cpu", scheduler="serial").report)
