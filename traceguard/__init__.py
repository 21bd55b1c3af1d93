"""traceguard: is our GPU-to-GPU communication healthy, and if not, why?

From Python: ``traceguard.analyze(paths) -> Analysis`` (results as Polars frames) and
``traceguard.compare(base, head)``; see docs/python.md. They load lazily, so that importing the
package (the CLI, the service) does not import Polars before it has set Polars' allocator options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

__all__ = ["Analysis", "__version__", "analyze", "compare"]

if TYPE_CHECKING:
    from traceguard.notebook import Analysis, analyze, compare


def __getattr__(name: str) -> Any:
    if name in ("Analysis", "analyze", "compare"):
        from traceguard import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'traceguard' has no attribute {name!r}")
