"""``.nsys-rep`` reports: recognise them and turn them into SQLite with the user's own ``nsys``.

The report format is private to Nsight Systems, so we never parse it: ``nsys export --type
sqlite`` does, once per report content (the export is cached by the report's sha256).
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from pathlib import Path

from traceguard.errors import InputError, ToolNotFoundError
from traceguard.ingest.cache import cache_dir, sha256_file
from traceguard.tools import find_nsys

#: Every report starts with this line, followed by the writing build (``1.`` for 2022.4,
#: ``2026@4@1@191-...`` for recent releases).
NSYS_REP_MAGIC = b"NVIDIA Tegra Profiler Report "

#: Where distributions put the CLI when it is not on PATH (Debian's split layout, NVIDIA's
#: installers, the copy bundled with Nsight Compute).

EXPORT_TIMEOUT_S = 1800
_PROGRESS = re.compile(r"\[[= ]*\d+%[= ]*\]")


def is_nsys_rep(path: Path) -> bool:
    """True when the file starts with the Nsight Systems report magic (whatever its name)."""
    try:
        with Path(path).open("rb") as handle:
            return handle.read(len(NSYS_REP_MAGIC)) == NSYS_REP_MAGIC
    except OSError:
        return False


def _export_command(path: Path) -> str:
    stem = path.name.removesuffix(".nsys-rep").removesuffix(".qdrep")
    return f"nsys export --type sqlite -o {stem}.sqlite {path.name}"


def export_to_sqlite(path: Path) -> Path:
    """Export ``path`` (a .nsys-rep) to SQLite in the cache and return the SQLite file.

    Cached by the report's sha256, so a second call does not run nsys. Raises ToolNotFoundError
    naming the command to run elsewhere when no nsys is installed, and InputError (with nsys's
    own last words) when the export fails.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file.")
    if not is_nsys_rep(path):
        raise InputError(
            f"{path} is not an Nsight Systems report (it lacks the report header).",
            hint="pass a .nsys-rep written by `nsys profile`, or its SQLite export",
        )
    try:
        key = sha256_file(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read the file: {exc.strerror or exc}") from exc
    root = cache_dir() / "nsys-export"
    root.mkdir(parents=True, exist_ok=True)
    target = root / f"{key}.sqlite"
    if target.exists():
        return target
    nsys = find_nsys()
    if nsys is None:
        raise ToolNotFoundError(
            f"{path} is an Nsight Systems report and reading it needs the `nsys` CLI, which is "
            f"not installed here. Export it where nsys is installed and pass the SQLite file "
            f"instead: `{_export_command(path)}`",
            hint="or install Nsight Systems (Debian: the nsight-systems package in non-free)",
        )
    with tempfile.TemporaryDirectory(dir=root, prefix=f".{key}.") as work:
        out = Path(work) / "export.sqlite"
        command = [nsys, "export", "--type", "sqlite", "--force-overwrite", "true"]
        command += ["--output", str(out), str(path)]
        try:
            result = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=EXPORT_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise InputError(
                f"`nsys export` did not finish within {EXPORT_TIMEOUT_S} s for {path}.",
                hint=f"run it yourself and pass the SQLite file: `{_export_command(path)}`",
            ) from exc
        except OSError as exc:
            raise ToolNotFoundError(
                f"cannot run {nsys}: {exc.strerror or exc}. Export elsewhere with "
                f"`{_export_command(path)}` and pass the SQLite file."
            ) from exc
        if result.returncode != 0 or not out.is_file() or out.stat().st_size == 0:
            tail = _tail(result.stderr) or _tail(result.stdout) or "(no output)"
            raise InputError(
                f"`nsys export` failed for {path} (exit {result.returncode}): {tail}",
                hint=f"the report may be damaged, or written by a newer Nsight Systems than {nsys}; "
                f"export it with the version that wrote it: `{_export_command(path)}`",
            )
        os.replace(out, target)
    return target


def _tail(text: str | None, lines: int = 5) -> str:
    """Last few meaningful lines of a tool's output (progress bars dropped)."""
    if not text:
        return ""
    kept = [
        line.strip() for line in text.replace("\r", "\n").splitlines() if line.strip() and not _PROGRESS.search(line)
    ]
    return " | ".join(kept[-lines:])[-800:]
