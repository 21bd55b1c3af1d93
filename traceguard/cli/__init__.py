"""The ``traceguard`` command line: a thin typer adapter over :mod:`traceguard.pipeline`.

Exit codes: ``analyze`` 0 whenever it produced a report; ``check`` 0 when no check fails, 1 when
one does; both 2 when no input is usable or the invocation is wrong (with a message saying what).

One module per command group, as ``api/routes`` has: :mod:`.analysis` (analyze, check, profiles),
:mod:`.nccl`, :mod:`.harness` (harness, bench-collectives), :mod:`.service` (serve, token) and
:mod:`.runs` (record, upload); :mod:`.common` holds the app, the consoles and the shared options.
"""

from __future__ import annotations

import os

# Polars' allocator (jemalloc) keeps freed pages for 10 s by default, which a one-shot run
# over a multi-GB capture would count in its peak RSS. Handing them back at once (0 ms) costs
# more: the next allocation faults them in again (~1.4 M page faults, ~5 s of system time at
# 10 M kernels). Two seconds keeps what the next step reuses and returns the rest (measured in
# bench/RESULTS.md). Must be set before polars is first imported.
os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:2000,muzzy_decay_ms:0")
# NumPy's OpenBLAS starts a spinning thread per core; traceguard does no linear algebra, and on
# a small machine those threads take cycles from the reader's two processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys

# Importing the command modules registers their commands on `app`, in the order `--help` lists them.
from traceguard.cli import analysis, harness, nccl, runs, service
from traceguard.cli.common import app

__all__ = ["analysis", "app", "console_main", "harness", "nccl", "runs", "service"]
# compare, export (two runs; a run's timeline) and runs, steps (stored runs), registered after the others.
from traceguard.cli import compare, query

__all__ += ["compare", "query"]


def console_main() -> None:
    """Console entry point: run the command, then exit without interpreter teardown.

    Freeing a multi-GB capture object by object takes ~0.3 s after the report is already out.
    """
    try:
        app()
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, str):
            sys.stderr.write(exc.code + "\n")
            code = 1
        else:
            code = exc.code or 0
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
