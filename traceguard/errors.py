"""One error hierarchy for the whole package.

Every error carries a stable ``code`` (for JSON consumers), a message that says what was
wrong and what to do, and the process exit code the CLI uses. The CLI and the API map these
once; nothing else catches them.
"""

from __future__ import annotations

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
