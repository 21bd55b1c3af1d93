"""``nsys profile`` as the tests that capture run it: made again once when nsys fails before writing.

Debian's Nsight Systems 2022.4 now and then aborts (exit 134) before it writes anything; the
harness starts it again in that case (:func:`traceguard.capture.harness.nsys_did_not_start`),
and the tests that capture do the same, here, instead of each writing its own loop.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def profile(
    command: Sequence[str | Path] | Callable[[], Sequence[str | Path]], produced: Callable[[], bool], **run: Any
) -> list[str]:
    """Run ``command`` (an ``nsys profile ...`` line, or a function giving one afresh for each
    run: a job that needs a free port) with ``subprocess.run(**run)`` (output captured as text);
    once more when it exits non-zero and ``produced()`` says it wrote nothing.
    What each failed run said: ``[]`` when one run succeeded (or wrote something), two entries
    when both failed, for the caller to fail with."""
    failed: list[str] = []
    for _attempt in (1, 2):
        line = command() if callable(command) else command
        done = subprocess.run([str(part) for part in line], capture_output=True, text=True, check=False, **run)
        if done.returncode == 0 or produced():
            return []
        failed.append(f"nsys exited {done.returncode}: {(done.stdout + done.stderr).strip()[-2000:]}")
    return failed
