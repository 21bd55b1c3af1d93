"""Mutation fuzzing of every reader, seeded from real captures and logs (see :mod:`tests.fuzz.targets`).

Each test damages the reader's real inputs ``examples`` times (deterministic seeds) and reads every
damaged copy: the reader must return or raise the project's error naming the file. A finding
prints the mutation and the exception; ``python -m tests.fuzz.run READER --examples N --seed S``
reproduces it and keeps the input for ``tests/fixtures/fuzz/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fuzz.targets import READERS, campaign, examples_per_reader

#: CI budget per reader (the fast readers get more); about 40 s for all of them on two cores.
CI_EXAMPLES = {"nsys_sqlite": 120, "nsys_rep": 60, "kineto": 40, "archive": 150, "bundle": 150, "profile": 150}
CI_SEED = 15


@pytest.mark.parametrize("reader", sorted(READERS))
def test_damaged_inputs_end_in_the_projects_error(reader: str, workdir: Path) -> None:
    if not READERS[reader].seeds():
        if os.environ.get("TRACEGUARD_REQUIRE_NSYS") == "1":
            pytest.fail(f"no seed for {reader}: nsys (and the nvtx package) are required here")
        pytest.skip(f"no seed for {reader} on this machine (needs nsys)")
    examples = examples_per_reader(CI_EXAMPLES.get(reader, 200))
    result = campaign(reader, examples, seed=CI_SEED, workdir=workdir)
    report = "\n".join(f"example {f.example} ({f.seed}, {f.mutation}): {f.error}\n{f.trace}" for f in result.findings)
    assert not result.findings, f"{len(result.findings)} of {examples} inputs crashed {reader}:\n{report}"
    assert result.examples == examples
    # The mutations must reach past the first check: some inputs are still read, some refused.
    assert result.outcomes["ok"] + result.outcomes["input_error"] == examples
    assert result.outcomes["ok"] > 0 or reader == "profile", dict(result.outcomes)
