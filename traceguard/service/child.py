"""``python -m traceguard.service.child SPEC OUT``: one analysis, in its own process.

SPEC (JSON): inputs [[path, rank|null]], side {kind: [paths]}, profile, cache_dir, max_rows,
step_patterns [regex], scheduler (null|"local"|"serial"|"tcp://..."), jobs (null|int), progress
(a path: ``DONE TOTAL`` lines are appended to it as each capture's per-rank map finishes).
OUT receives ``{"report": ...}`` or ``{"error": {"code", "message"[, "hint"]}}``; the parent
(:mod:`traceguard.service.analysis`) enforces the time limit and stores the outcome.

The child ends itself when its parent dies (a worker killed with SIGKILL): its job's lease runs
out and another worker analyses it again, so this result would never be read.

The message is what the run's owner reads on the failed job: the project's own errors say which
file is wrong and how; an internal error (a bug) says so in words, with the exception's type and
text, and the hint names the line of traceguard it came from, for the bug report.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson


def _origin(exc: BaseException) -> str | None:
    """``traceguard/<module>.py:<line> in <function>`` of the innermost frame in traceguard's own code."""
    package = Path(__file__).resolve().parents[1]
    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        path = Path(frame.filename)
        if path.is_relative_to(package):
            found = f"{path.relative_to(package.parent)}:{frame.lineno} in {frame.name}"
    return found


def internal_error(exc: BaseException) -> dict[str, Any]:
    """The job's error for an exception that is not the project's own: a bug, said as one (a
    native library's panic named as such); the traceback goes to the server's log, not here."""
    from traceguard.errors import as_native_panic, is_native_panic

    origin = _origin(exc)
    if is_native_panic(exc):
        exc = as_native_panic(exc)
    text = " ".join(str(exc).split())[:300] or "no message"
    return {
        "error": {
            "code": "analysis_error",
            "message": f"the analysis stopped on an internal error, a bug in traceguard ({type(exc).__name__}: {text})",
            "hint": "the uploaded files were kept; report the run to the service's operators"
            + (f" (raised at {origin})" if origin else ""),
        }
    }


def _progress_writer(path: str | None) -> Callable[[int, int], None] | None:
    """``on_ranks(done, total)`` appending one whole line per call (the parent reads whole lines)."""
    if not path:
        return None
    lock = threading.Lock()  # the map may report from several threads

    def on_ranks(done: int, total: int) -> None:
        with lock, open(path, "a", encoding="ascii") as handle:
            handle.write(f"{done} {total}\n")

    return on_ranks


def _end_with_parent(interval: float = 0.5) -> None:
    """Exit as soon as the process that started us is gone (we were re-parented), and take the
    map's pool processes with us: the parent starts us as the leader of our own process group."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                if os.getpgid(0) == os.getpid():
                    os.killpg(os.getpid(), signal.SIGKILL)
                os._exit(3)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run(spec: dict[str, Any]) -> dict[str, Any]:
    os.environ["TRACEGUARD_CACHE_DIR"] = spec["cache_dir"]
    os.environ["TRACEGUARD_MAX_ROWS"] = str(spec["max_rows"])
    from traceguard.errors import TraceguardError
    from traceguard.ingest import InputSpec
    from traceguard.ingest.sides import SideFiles
    from traceguard.pipeline import analyze

    try:
        side = SideFiles(**{kind: [Path(p) for p in paths] for kind, paths in spec["side"].items()})
        inputs = [
            InputSpec(Path(path), rank, "argument" if rank is not None else None) for path, rank in spec["inputs"]
        ]
        patterns = spec.get("step_patterns") or []
        analysis = analyze(
            inputs,
            profile=spec["profile"],
            side_files=side,
            step_patterns=patterns,
            scheduler=spec.get("scheduler"),
            jobs=spec.get("jobs"),
            on_ranks=_progress_writer(spec.get("progress")),
            detail_default_dir=Path(spec["detail_dir"]) if spec.get("detail_dir") else None,
        )
        return {"report": analysis.report}
    except TraceguardError as exc:
        return exc.to_dict()
    except MemoryError:
        return {"error": {"code": "out_of_memory", "message": "the analysis ran out of memory"}}
    except Exception as exc:  # recorded on the job, never lost; the traceback, on stderr, goes to the server log
        traceback.print_exc()
        return internal_error(exc)
    except BaseException as exc:  # a native library's panic: PyO3 raises it as a BaseException
        from traceguard.errors import is_native_panic

        if not is_native_panic(exc):
            raise
        traceback.print_exc()
        return internal_error(exc)


def main(argv: list[str]) -> int:
    spec_path, out = argv
    _end_with_parent()
    payload = run(orjson.loads(Path(spec_path).read_bytes()))
    Path(out).write_bytes(orjson.dumps(payload, option=orjson.OPT_SERIALIZE_NUMPY))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
