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


def test_damaged_pages_reach_the_c_reader_and_end_in_input_errors(tmp_path: Path) -> None:
    """Pages of a real export overwritten with random bytes, read without the upload's quick_check:
    the C integer reader (``_int_scan.c``) and ADBC meet the damage mid-query, and their SQLite
    errors must still be InputErrors naming the file."""
    import gzip
    import random
    import sqlite3

    from tests.conftest import public_nsys
    from traceguard.errors import InputError
    from traceguard.ingest import nsys_sqlite, read_capture

    if nsys_sqlite._int_scan is None:
        if os.environ.get("TRACEGUARD_REQUIRE_NATIVE") == "1":
            pytest.fail("the C reader is not built")
        pytest.skip("the C reader is not built")
    data = gzip.decompress(public_nsys("8fa9ec2").read_bytes())
    source = tmp_path / "source.sqlite"
    source.write_bytes(data)
    with sqlite3.connect(source) as conn:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
    pages = len(data) // page_size
    messages = []
    for trial in range(examples_per_reader(40)):
        rng = random.Random(trial)
        damaged = bytearray(data)
        start = rng.randrange(2, pages) * page_size + 8
        damaged[start : start + page_size - 8] = rng.randbytes(page_size - 8)
        path = tmp_path / f"damaged{trial}.sqlite"
        path.write_bytes(damaged)
        try:
            read_capture(path)
        except InputError as exc:
            assert path.name in exc.message, exc.message
            messages.append(exc.message)
        path.unlink()
    assert any("cannot read the query's rows" in m for m in messages), messages  # the C reader's own error
