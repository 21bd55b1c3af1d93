"""traceguard.memory: the heap settings take on glibc, and the collector's thresholds come back."""

from __future__ import annotations

import gc
import os
import platform
import sys
import time
from pathlib import Path

import pytest

from traceguard import memory


def test_fewer_collections_raises_gen0_then_restores() -> None:
    before = gc.get_threshold()
    with memory.fewer_collections():
        inside = gc.get_threshold()
    assert inside[0] == max(before[0], memory.ANALYSIS_GEN0)
    assert inside[1:] == before[1:]
    assert gc.get_threshold() == before


def test_fewer_collections_restores_after_an_error() -> None:
    before = gc.get_threshold()
    with pytest.raises(ValueError), memory.fewer_collections():
        raise ValueError("boom")
    assert gc.get_threshold() == before


def test_fewer_collections_as_decorator_is_reentrant() -> None:
    seen: list[int] = []

    @memory.fewer_collections()
    def nested(depth: int) -> None:
        seen.append(gc.get_threshold()[0])
        if depth:
            nested(depth - 1)

    before = gc.get_threshold()
    nested(2)
    assert seen == [max(before[0], memory.ANALYSIS_GEN0)] * 3
    assert gc.get_threshold() == before


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_heap_is_tuned_on_glibc_and_release_runs() -> None:
    assert memory.tune_heap() is True
    blocks = [bytearray(8 << 20) for _ in range(4)]  # heap blocks now, not mmaps
    del blocks
    memory.release_heap()


def _resident_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.skipif(sys.platform != "linux", reason="Polars' jemalloc is found through /proc/self/maps")
def test_polars_freed_pages_are_handed_back() -> None:
    import polars as pl

    # jemalloc keeps what Polars frees (10 s by default, 2 s under the CLI): a frame of 400 MB
    # made and dropped leaves its pages resident until they are purged.
    frame = pl.select(pl.int_range(50_000_000, dtype=pl.Int64).alias("x"))
    assert frame.height == 50_000_000
    del frame
    before = _resident_mb()
    assert memory.release_polars_heap() is True
    assert _resident_mb() < before - 200


def test_the_purge_runs_on_a_thread_while_inside_then_stops() -> None:
    import threading

    with memory.polars_heap_released_every(0.01):
        time.sleep(0.05)
        assert any(thread.name == "traceguard-release" for thread in threading.enumerate())
    assert not any(thread.name == "traceguard-release" for thread in threading.enumerate())


def test_a_library_without_the_symbol_or_not_elf_is_not_used(tmp_path: Path) -> None:
    not_elf = tmp_path / "libnot.so"
    not_elf.write_bytes(b"not an ELF file at all" * 10)
    assert memory._local_functions(not_elf, (b"_rjem_mallctl",)) == {}
    libc = next(path for path in memory._mapped_libraries() if path.name.startswith("libc.so"))
    assert memory._local_functions(libc, (b"_rjem_mallctl_no_such_function",)) == {}


@pytest.mark.skipif(sys.platform != "linux", reason="Polars' jemalloc is found through /proc/self/maps")
def test_the_allocator_is_found_where_its_library_is_mapped_again_elsewhere() -> None:
    """A reader's own ``mmap`` of the library's file (a test suite's process held one) is a
    second mapping of it from offset 0: the function is still found where the loader put it."""
    import mmap

    import polars  # noqa: F401 - the runtime loaded

    (runtime,) = [path for path in memory._mapped_libraries() if "polars" in path.name]
    with open(runtime, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as again:
        assert again[:4] == b"\x7fELF"
        memory._polars_mallctl.cache_clear()
        try:
            assert memory.release_polars_heap() is True
        finally:
            memory._polars_mallctl.cache_clear()


@pytest.mark.parametrize(("cores", "arenas"), [(1, 1), (2, 1), (3, 1), (4, 2), (64, 32)])
def test_polars_heap_settings_give_an_arena_to_two_cores(cores: int, arenas: int) -> None:
    settings = dict(option.split(":") for option in memory.polars_heap_settings(cores).split(","))
    assert settings == {
        "dirty_decay_ms": str(memory.POLARS_DIRTY_DECAY_MS),
        "muzzy_decay_ms": "0",
        "narenas": str(arenas),
    }


_JEMALLOC_OPTIONS = """
import ctypes, json
import traceguard.cli  # sets the allocator's options, then imports Polars
from traceguard import memory

mallctl = memory._polars_mallctl()
arenas, decay = ctypes.c_uint(), ctypes.c_ssize_t()
size = ctypes.c_size_t(ctypes.sizeof(arenas))
assert mallctl(b"opt.narenas", ctypes.byref(arenas), ctypes.byref(size), None, 0) == 0
size = ctypes.c_size_t(ctypes.sizeof(decay))
assert mallctl(b"opt.dirty_decay_ms", ctypes.byref(decay), ctypes.byref(size), None, 0) == 0
print(json.dumps({"narenas": arenas.value, "dirty_decay_ms": decay.value, "cores": memory.usable_cores()}))
"""


@pytest.mark.skipif(sys.platform != "linux", reason="Polars' jemalloc is found through /proc/self/maps")
def test_the_cli_gives_polars_allocator_its_options_before_polars_loads() -> None:
    """What jemalloc itself took (its ``opt.*``), in a fresh process that imports the CLI as the
    console script does; the variable unset, so that the CLI's default is the one read."""
    import json
    import subprocess

    env = {key: value for key, value in os.environ.items() if key != "_RJEM_MALLOC_CONF"}
    done = subprocess.run(
        [sys.executable, "-c", _JEMALLOC_OPTIONS], env=env, capture_output=True, text=True, check=True, timeout=120
    )
    taken = json.loads(done.stdout.strip().splitlines()[-1])
    assert taken["dirty_decay_ms"] == memory.POLARS_DIRTY_DECAY_MS
    assert taken["narenas"] == max(1, taken["cores"] // memory.CORES_PER_POLARS_ARENA)
