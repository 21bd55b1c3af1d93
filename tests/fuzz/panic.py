"""A real panic of a native library, for the tests of what a panic becomes (issue 25).

Polars panics in Rust (``PyObject pointer is null``, raised by PyO3 as
``pyo3_runtime.PanicException``, a ``BaseException``) when a string column holds bytes that are
not UTF-8 and its rows are turned into Python objects: the crash issue 25 found in
``to_dicts()`` of the GPU→CPU offenders table. The readers no longer let such bytes in, so the
tests make one on purpose, where a bug would."""

from __future__ import annotations

from typing import Any, NoReturn


def native_panic(*_args: Any, **_kwargs: Any) -> NoReturn:
    import polars as pl
    import pyarrow as pa

    offsets = pa.py_buffer((0).to_bytes(4, "little") + (2).to_bytes(4, "little"))
    column = pa.Array.from_buffers(pa.string(), 1, [None, offsets, pa.py_buffer(b"\x00\xff")])
    pl.DataFrame({"name": pl.from_arrow(column)}).to_dicts()
    raise AssertionError("Polars took bytes that are not UTF-8 without a panic: make the tests' panic another way")


#: Python code that makes ``traceguard.metrics.rank``'s offenders table panic, in any process that
#: runs it at start (a ``sitecustomize`` on PYTHONPATH): the service's analysis child, its pool.
SITECUSTOMIZE = '''
import traceguard.metrics.rank as _rank
from tests.fuzz.panic import native_panic as _panic
_rank._offenders = _panic
'''
