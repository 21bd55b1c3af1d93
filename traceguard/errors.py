"""One error hierarchy for the whole package.

Every error carries a stable ``code`` (for JSON consumers), a message that says what was
wrong and what to do, and the process exit code the CLI uses. The CLI and the API map these
once; nothing else catches them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class TraceguardError(Exception):
    """Base class: ``code`` is stable, ``message`` is for people, ``exit_code`` for the CLI."""

    code = "error"
    exit_code = 2

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message} ({self.hint})"

    def to_dict(self) -> dict[str, Any]:
        body: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            body["hint"] = self.hint
        return {"error": body}


def naming(exc: TraceguardError, source: object) -> TraceguardError:
    """``exc`` with ``source`` (a file) at the start of its message, unless the message names it already."""
    name = str(source)
    if name not in exc.message and getattr(source, "name", name) not in exc.message:
        exc.message = f"{name}: {exc.message}"
    return exc


class InputError(TraceguardError):
    """A capture or log that cannot be read as what it claims to be."""

    code = "invalid_input"


class UnsupportedFormatError(InputError):
    """A file whose content matches no format traceguard reads."""

    code = "unsupported_format"


class ToolNotFoundError(TraceguardError):
    """An external tool (``nsys``) is needed and is not installed."""

    code = "tool_not_found"


class ProfileError(TraceguardError):
    """A checklist profile that is missing or malformed."""

    code = "invalid_profile"


class NoUsableInputError(TraceguardError):
    """Every input failed: there is nothing to analyse."""

    code = "no_usable_input"


class NativePanic(RuntimeError):
    """A native library (Polars, through PyO3) panicked: a bug, in traceguard or in the library,
    raised as an ordinary exception so that it is handled as one.

    PyO3 raises a panic as ``pyo3_runtime.PanicException``, a ``BaseException`` (so that bare
    ``except Exception`` blocks do not swallow it): it slipped past every handler that reports a bug
    in one line (the CLI's exit code 3, the service's job error), and its class, from a module that
    cannot be imported, does not cross a process pool's pickling."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def is_native_panic(exc: BaseException) -> bool:
    """``exc`` is a Rust panic that PyO3 turned into a Python exception."""
    return type(exc).__name__ == "PanicException" and type(exc).__module__ == "pyo3_runtime"


def as_native_panic(exc: BaseException) -> NativePanic:
    text = " ".join(str(exc).split())[:300] or "no message"
    return NativePanic(f"a native library panicked ({type(exc).__module__}.{type(exc).__name__}: {text})")


@contextmanager
def native_panics() -> Iterator[None]:
    """Re-raise a native panic inside the block as :class:`NativePanic` (its traceback kept as the cause)."""
    try:
        yield
    except BaseException as exc:
        if is_native_panic(exc):
            raise as_native_panic(exc) from exc
        raise
