"""How an analysing process uses memory: the C heap's settings and the garbage collector's pace.

Three costs that the analysis of a large capture pays for nothing (measured on the 10 M-kernel
shapes of ``bench/RESULTS.md``, 2 cores):

- **Fresh pages.** glibc hands every block of more than its dynamic threshold (at first 128 kB,
  rising only to the largest block freed so far) straight to ``mmap`` and unmaps it when freed.
  A sliced analysis allocates the same 4-16 MB arrays for every slice of a million ops, so each
  slice's arrays were new pages, faulted in one by one: 0.74 M page faults and 2.8 s of system
  time on the copy-heavy shape. :func:`tune_heap` keeps blocks up to 16 MiB in the heap and lets
  64 MiB of freed heap stay mapped: 0.41-0.48 M faults, about 1 s of system time less. (32 MiB
  and 256 MiB took no less time and held 0.15 GB more on the per-op NVTX shape.)
  The heap then keeps what an earlier pass freed, so :func:`release_heap` hands it back between
  passes, where the next pass would otherwise stack its peak on top (copy-heavy: 0.77-0.82 GB
  peak, as before, instead of 0.93 GB).
- **A heap per thread.** glibc gives each thread that allocates its own arena (up to eight per
  core), and each keeps its own free memory. A file of several ranks is analysed on about eight
  threads (the read, each rank, their spill writers and read-ahead), so what one thread freed
  was not there for another: :func:`tune_heap` lets them share :data:`HEAP_ARENAS`. The per-op
  NVTX shape's peak: 1,303-1,313 MB to 1,202-1,235 MB (MiB, as ``bench/RESULTS.md`` counts), in
  no more time (one arena: the same).
- **Collections.** With the default thresholds (700, 10, 10) the collector walks every live
  container each time gen 0 fills; building 68 k step rows of dicts (the CUDA-graph shape) paid
  1,076 collections, 0.49 s. :func:`fewer_collections` raises gen 0's threshold for the analysis
  (5 collections, 0.07 s); the analysis builds no reference cycles worth collecting early.

All three do nothing where glibc is absent (the heap calls) and change no result. The heap
settings are the process's own and stay: :func:`traceguard.mapreduce.map_input` sets them in
every process that maps an input (pool and Dask workers, the service's analysis child, and the
caller's own process under the ``serial`` scheduler or a run small enough to map in place), as
``MALLOC_MMAP_THRESHOLD_=16777216 MALLOC_TRIM_THRESHOLD_=67108864 MALLOC_ARENA_MAX=2`` in its
environment would.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import gc
from collections.abc import Iterator
from functools import cache

#: ``mallopt`` parameters (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: Blocks up to this size come from the heap, not from ``mmap`` (glibc's maximum is 32 MiB).
HEAP_BLOCKS_UP_TO = 16 << 20
#: Free memory at the heap's top kept mapped instead of being returned at each ``free``.
HEAP_KEEPS = 64 << 20
#: The heaps (glibc arenas) the threads share.
HEAP_ARENAS = 2
_M_ARENA_MAX = -8
#: Gen 0's threshold while analysing (the default is 700).
ANALYSIS_GEN0 = 100_000


@cache
def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 - glibc only: musl and macOS lack them
    except (OSError, AttributeError):
        return None
    return libc


@cache
def tune_heap() -> bool:
    """Set this process's heap as the module docstring says, once; whether it could be."""
    libc = _libc()
    if libc is None:
        return False
    return (
        bool(libc.mallopt(_M_MMAP_THRESHOLD, HEAP_BLOCKS_UP_TO))
        and bool(libc.mallopt(_M_TRIM_THRESHOLD, HEAP_KEEPS))
        and bool(libc.mallopt(_M_ARENA_MAX, HEAP_ARENAS))
    )


def release_heap() -> None:
    """Return the heap's free pages to the system (between passes: module docstring)."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect gen 0 every :data:`ANALYSIS_GEN0` allocations inside, then restore the thresholds."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], ANALYSIS_GEN0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
