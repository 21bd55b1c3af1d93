"""The ``traceguard`` command line: a thin typer adapter over :mod:`traceguard.pipeline`.

Exit codes, the same for every command:

- 0: done (``analyze`` whenever it produced a report; ``check`` when no check fails);
- 1: a check failed or regressed (``check``, ``compare``, ``record``, ``upload``): the one code a CI gate
  should read as a regression;
- 2: unusable input or a wrong invocation: a capture, log or profile that cannot be read, no usable
  input, a bad option; one message naming the file and what is wrong, never a traceback;
- 3: an internal error, a bug in traceguard: one line "this is a bug in traceguard: <type>: <message>";
  ``traceguard --debug ...`` (or ``TRACEGUARD_DEBUG=1``) prints the traceback as well;
- 130: interrupted (Ctrl-C).

One module per command group, as ``api/routes`` has: :mod:`.analysis` (analyze, check, profiles),
:mod:`.nccl`, :mod:`.harness` (harness, bench-collectives), :mod:`.service` (serve, token) and
:mod:`.runs` (record, upload); :mod:`.common` holds the app, the consoles and the shared options.
"""

from __future__ import annotations

import os

from traceguard.memory import polars_heap_settings  # the standard library only: no Polars yet

# Polars' allocator (jemalloc) keeps freed pages for 10 s by default, which a one-shot run
# over a multi-GB capture would count in its peak RSS. Handing them back at once (0 ms) costs
# more: the next allocation faults them in again (~1.4 M page faults, ~5 s of system time at
# 10 M kernels). Two seconds keeps what the next step reuses and returns the rest, and threads
# share an arena for two cores instead of four arenas a core (traceguard.memory; measured in
# bench/RESULTS.md). Must be set before polars is first imported.
os.environ.setdefault("_RJEM_MALLOC_CONF", polars_heap_settings())
# NumPy's OpenBLAS starts a spinning thread per core; traceguard does no linear algebra, and on
# a small machine those threads take cycles from the reader's two processes.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import sys
import traceback

from rich.markup import escape

# Importing the command modules registers their commands on `app`, in the order `--help` lists them.
from traceguard.cli import analysis, common, harness, nccl, runs, service
from traceguard.cli.common import app, debugging
from traceguard.errors import TraceguardError, as_native_panic, is_native_panic

__all__ = ["EXIT_BUG", "EXIT_CHECK_FAILED", "EXIT_INPUT", "analysis", "app", "console_main", "harness", "nccl"]
__all__ += ["runs", "service"]
# compare, export (two runs; a run's timeline) and runs, steps (stored runs), registered after the others.
from traceguard.cli import compare, query

__all__ += ["compare", "query"]

EXIT_CHECK_FAILED = 1
EXIT_INPUT = 2
EXIT_BUG = 3


def bug_message(exc: BaseException) -> str:
    """The one line an internal error gets (no traceback unless asked)."""
    text = " ".join(str(exc).split())[:300] or "(no message)"
    return f"error: this is a bug in traceguard: {type(exc).__name__}: {text} — rerun with --debug for the traceback"


def run(argv: list[str] | None = None) -> int:
    """Run the command line and return its exit code (see the module docstring); nothing escapes."""
    try:
        app(args=argv, prog_name="traceguard")
        return 0
    except SystemExit as exc:
        if isinstance(exc.code, str):  # sys.exit("message"): a refusal of the invocation
            sys.stderr.write(exc.code + "\n")
            return EXIT_INPUT
        return exc.code or 0
    except KeyboardInterrupt:
        return 130
    except TraceguardError as exc:  # a command that left the project's own error to us
        common.show_error(exc)
        return exc.exit_code
    except OSError as exc:
        if exc.errno is None or exc.filename is None:  # not the machine's answer about a named file: a bug
            return _bug(exc)
        if debugging():
            traceback.print_exc()
        name = f"{exc.filename} -> {exc.filename2}" if exc.filename2 else str(exc.filename)
        common.err.print(f"[bold red]error[/]: {escape(name)}: {escape(exc.strerror or str(exc))}")
        return EXIT_INPUT
    except Exception as exc:
        return _bug(exc)
    except BaseException as exc:  # a native library's panic (PyO3 raises it as a BaseException)
        if is_native_panic(exc):
            return _bug(exc)
        raise


def _bug(exc: BaseException) -> int:
    """A bug: one line and its own exit code (the traceback under ``--debug``). A native
    library's panic is one too, named as such."""
    if debugging():
        traceback.print_exception(exc)
    shown = as_native_panic(exc) if is_native_panic(exc) else exc
    sys.stderr.write(bug_message(shown) + "\n")
    return EXIT_BUG


def console_main() -> None:
    """Console entry point: run the command, then exit without interpreter teardown.

    Freeing a multi-GB capture object by object takes ~0.3 s after the report is already out;
    the analysis is held until then (:func:`traceguard.cli.common.keep_until_exit`).
    """
    common.EXITS_WITHOUT_TEARDOWN = True
    code = run()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
