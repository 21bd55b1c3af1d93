"""How an analysing process uses memory: the C heap's settings and the garbage collector's pace.

The costs that the analysis of a large capture pays for nothing (measured on the 10 M-kernel
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

- **Polars' freed pages.** Polars allocates through its own jemalloc, which keeps a thread's
  freed pages for ``dirty_decay_ms`` (the CLI sets 2 s) in that thread's arena, where only the
  threads of that arena reuse them. A file of several ranks frees most of what its NVTX table
  and kernel sequences took just as the ranks' read starts; the per-op NVTX shape's process then held
  0.2-0.4 GB of such pages under the read's own peak (1.20-1.29 GB). No Polars API hands them
  back, and jemalloc's ``mallctl`` is a local symbol of Polars' runtime library, so
  :func:`release_polars_heap` finds it in that library's symbol table, checks that the function
  it found is the one mapped (its bytes in memory are the file's) and that it answers as
  jemalloc 5 does, and asks it to purge every arena's unused pages; where any of that fails
  (another build, a stripped library) it does nothing. Handed back where that file's phases
  change (and every 0.3 s while its NVTX table is read: :func:`polars_heap_released_every`),
  the per-op shape's peak is 0.98-1.0 GB. What is handed back and then reused is faulted in
  again (0.51 → 0.77 M page faults, about 0.5 s of system time on two cores), so the one-rank
  shapes, whose peaks are far below 1 GB, do not pay for it.

- **One arena for two cores.** jemalloc gives a process four arenas a core and spreads its
  threads over them; what one thread frees stays in its arena, for the threads of that arena
  only. A file of several ranks is read on five threads or more beside Polars' own (the NVTX
  table, the kernel sequences, the launch join's passes, the shared read, each rank), so each
  arena held its own freed pages under the peak, and what one handed back another faulted in.
  :func:`polars_heap_settings` (the CLI's ``_RJEM_MALLOC_CONF``) asks for one arena for every
  two cores (one on two): the per-op NVTX shape's peak 904-917 MB against 976-990 MB (MiB), its
  page faults 0.50 M against 0.75-0.77 M, 7.7-8.3 s against 7.9-8.5 s in three interleaved
  pairs; every other bench shape 0.1-0.25 M faults fewer, the same time or less. (Asked for
  alone, before the purges, one arena had left the per-op peak at 1.16 GB: the purges and the
  shared arena each take a part of it.)

All of them do nothing where glibc (or Polars' jemalloc) is absent and change no result. The heap
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
import mmap
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

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


#: How long Polars' jemalloc keeps a freed page before handing it back (milliseconds).
POLARS_DIRTY_DECAY_MS = 2000
#: Cores per jemalloc arena of Polars' allocator (module docstring: "One arena for two cores").
CORES_PER_POLARS_ARENA = 2


def polars_heap_settings(cores: int | None = None) -> str:
    """The ``_RJEM_MALLOC_CONF`` a process sets before it imports Polars (module docstring):
    freed pages kept :data:`POLARS_DIRTY_DECAY_MS`, none kept half-returned ("muzzy"), and one
    arena for every :data:`CORES_PER_POLARS_ARENA` of the ``cores`` it may run on (default:
    its CPU affinity), at least one."""
    if cores is None:
        cores = usable_cores()
    arenas = max(1, cores // CORES_PER_POLARS_ARENA)
    return f"dirty_decay_ms:{POLARS_DIRTY_DECAY_MS},muzzy_decay_ms:0,narenas:{arenas}"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity; elsewhere than Linux, the machine's),
    at least one. The standard library only: the CLI asks before Polars is imported."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


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


#: jemalloc's "every arena" index in ``arena.<i>.purge`` (MALLCTL_ARENAS_ALL).
_ALL_ARENAS = 4096
#: The local symbol of Polars' jemalloc (built with the ``_rjem_`` prefix).
_MALLCTL = b"_rjem_mallctl"
_Mallctl = Callable[[bytes, object, object, object, int], int]


def release_polars_heap() -> bool:
    """Hand back the pages Polars' allocator keeps from what it freed (module docstring);
    whether it could."""
    mallctl = _polars_mallctl()
    return mallctl is not None and mallctl(b"arena.%d.purge" % _ALL_ARENAS, None, None, None, 0) == 0


@contextlib.contextmanager
def polars_heap_released_every(seconds: float) -> Iterator[None]:
    """Inside, :func:`release_polars_heap` every ``seconds`` on a thread of its own: for a
    stretch where threads free what others will not reuse faster than jemalloc's decay hands it
    back (the NVTX table's read beside the kernel sequences' of a file of several ranks)."""
    if _polars_mallctl() is None:
        yield
        return
    done = threading.Event()

    def release() -> None:
        while not done.wait(seconds):
            release_polars_heap()

    releaser = threading.Thread(target=release, name="traceguard-release", daemon=True)
    releaser.start()
    try:
        yield
    finally:
        done.set()
        releaser.join()


@cache
def _polars_mallctl() -> _Mallctl | None:
    """jemalloc's ``mallctl`` inside the loaded Polars runtime, checked; None where not found.

    The library's load address is its exported module entry's address (``dlsym``) less that
    entry's address in the file, not read off ``/proc/self/maps``: the file may be mapped again
    elsewhere (a reader's ``mmap`` of it, as a test suite's process held)."""
    if sys.platform != "linux" or sys.byteorder != "little" or struct.calcsize("P") != 8:
        return None
    for path, spans in _mapped_libraries().items():
        if "polars" not in path.name:
            continue
        entry = b"PyInit_" + path.name.split(".")[0].encode()
        try:
            # Loaded already (RTLD_NOLOAD): the same handle, nothing loaded or run.
            library = ctypes.CDLL(str(path), mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
            found = _local_functions(path, (_MALLCTL, entry))
            entry_at = ctypes.cast(getattr(library, entry.decode()), ctypes.c_void_p).value
        except (OSError, AttributeError, ValueError, struct.error):
            continue
        if entry_at is None or _MALLCTL not in found or entry not in found:
            continue
        address, expected = found[_MALLCTL]
        at = entry_at - found[entry][0] + address
        if not any(lo <= at and at + len(expected) <= hi for lo, hi in spans):
            continue  # not inside the library's own mappings: not read, not called
        if ctypes.string_at(at, len(expected)) != expected:
            continue  # not the file's function: do not call it
        mallctl = ctypes.CFUNCTYPE(
            ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t
        )(at)
        version, size = ctypes.c_char_p(), ctypes.c_size_t(ctypes.sizeof(ctypes.c_char_p))
        if mallctl(b"version", ctypes.byref(version), ctypes.byref(size), None, 0) == 0 and (
            version.value or b""
        ).startswith(b"5."):
            return mallctl  # type: ignore[return-value]
    return None


def _mapped_libraries() -> dict[Path, list[tuple[int, int]]]:
    """Each shared library file this process maps, with every address range it is mapped in."""
    spans: dict[Path, list[tuple[int, int]]] = {}
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or ".so" not in fields[5]:
                continue
            lo, hi = (int(value, 16) for value in fields[0].split("-"))
            spans.setdefault(Path(fields[5].strip()), []).append((lo, hi))
    return spans


def _local_functions(path: Path, names: tuple[bytes, ...]) -> dict[bytes, tuple[int, bytes]]:
    """Per function of ``names`` found in the ELF symbol table (``.symtab``, not only the exported
    ``.dynsym``) of ``path``: its address in the library's image and its first 16 bytes in the
    file. Empty when the file is no 64-bit little-endian ELF or has no symbol table."""
    found: dict[bytes, tuple[int, bytes]] = {}
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as elf:
        if elf[:6] != b"\x7fELF\x02\x01":
            return found
        (sections_at,) = struct.unpack_from("<Q", elf, 0x28)
        entry_size, count = struct.unpack_from("<HH", elf, 0x3A)
        # (type, flags, address, offset, size, link, info, align, entry size) per section
        sections = [struct.unpack_from("<IQQQQIIQQ", elf, sections_at + k * entry_size + 4) for k in range(count)]
        symtab = next((section for section in sections if section[0] == 2), None)  # SHT_SYMTAB
        if symtab is None:
            return found
        strtab = sections[symtab[5]]
        wanted: dict[int, bytes] = {}
        for name in names:
            at = elf.find(b"\0" + name + b"\0", strtab[3], strtab[3] + strtab[4])
            if at >= 0:
                wanted[at + 1 - strtab[3]] = name
        for k in range(symtab[4] // symtab[8] if wanted else 0):
            st_name, st_info, _other, st_shndx, st_value, _size = struct.unpack_from(
                "<IBBHQQ", elf, symtab[3] + k * symtab[8]
            )
            if st_name in wanted and st_info & 0xF == 2 and 0 < st_shndx < count:  # STT_FUNC
                section = sections[st_shndx]
                in_file = st_value - section[2] + section[3]
                found[wanted[st_name]] = (st_value, bytes(elf[in_file : in_file + 16]))
                if len(found) == len(wanted):
                    break
    return found


@contextlib.contextmanager
def fewer_collections() -> Iterator[None]:
    """Collect gen 0 every :data:`ANALYSIS_GEN0` allocations inside, then restore the thresholds."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], ANALYSIS_GEN0), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)
