"""traceguard.memory: the heap settings take on glibc, and the collector's thresholds come back."""

from __future__ import annotations

import gc
import platform

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
