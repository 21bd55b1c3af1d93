"""The compute union built in row slices (:func:`timeline.compute_union`), which the timeline and
the per-collective breakdown share, gives exactly what the whole-array code gave: the same
segments, the same merged lanes (busy time included, ties among gaps included), and the same
covered time of any interval; on random data and on a real capture's analysis window."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest

from tests.conftest import OWN
from traceguard.ingest import read_capture
from traceguard.metrics import collectives, nccl, timeline
from traceguard.metrics.steps import STEP_SOURCES, attribute, find_phases, resolve_steps, step_spans, window_mask


def _reduce_whole(start: np.ndarray, end: np.ndarray, limit: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The lane reduction as it was written before (an array of every segment's length)."""
    busy = end - start
    n = start.size
    if n <= limit:
        return start, end, busy
    gaps = start[1:] - end[:-1]
    closed = np.zeros(n - 1, dtype=bool)
    # Ties: among equal gaps at the cut the earlier stays open (the rule SegmentReducer made
    # deterministic; argpartition picked arbitrarily among them, so these lanes' ties changed).
    closed[np.lexsort((np.arange(n - 1), -gaps))[limit - 1 :]] = True
    heads = np.flatnonzero(np.concatenate([[True], ~closed]))
    tails = np.append(heads[1:] - 1, n - 1)
    return start[heads], end[tails], np.add.reduceat(busy, heads)


def _random_intervals(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    start = np.sort(rng.integers(0, 50 * n, n))
    # Zero-length, negative and long durations: union_intervals takes end as max(end, start).
    end = start + rng.integers(-20, 200, n)
    return start.astype(np.int64), end.astype(np.int64)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("chunk", [1, 2, 5, 64, 10_000])
def test_segment_stream_matches_union_intervals(seed: int, chunk: int) -> None:
    rng = np.random.default_rng(seed)
    start, end = _random_intervals(rng, int(rng.integers(1, 400)))
    stream = timeline.SegmentStream()
    for lo in range(0, start.size, chunk):
        assert stream.feed(start[lo : lo + chunk], end[lo : lo + chunk])
    got = stream.result()
    want = timeline.union_intervals(start, end)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])


def test_segment_stream_refuses_rows_out_of_order() -> None:
    stream = timeline.SegmentStream()
    assert stream.feed(np.array([5, 9]), np.array([6, 10]))
    assert not stream.feed(np.array([7]), np.array([8]))  # before the last start fed
    assert not timeline.SegmentStream().feed(np.array([3, 1]), np.array([4, 2]))
    assert timeline.SegmentStream().result()[0].size == 0


@pytest.mark.parametrize("seed", range(12))
def test_lane_reduction_unchanged(seed: int) -> None:
    """Busy time from the closed gaps equals the sum of the merged segments' lengths; many equal
    gaps (ties at the cut) pick the same segments as before."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 3000))
    start = np.cumsum(rng.integers(1, 5, n) * 10).astype(np.int64)  # gaps of few distinct sizes
    end = start + rng.integers(0, 10, n)
    start, end = timeline.union_intervals(start, end)
    for limit in (1, 2, 7, max(1, start.size // 3), start.size - 1, start.size, start.size + 5):
        s, e, busy, _ = timeline.reduce_segments(start, end, limit)
        ws, we, wbusy = _reduce_whole(start, end, limit)
        assert np.array_equal(s, ws) and np.array_equal(e, we) and np.array_equal(busy, wbusy)


def _ops(rng: np.random.Generator, n: int, devices: int, shuffled: bool) -> pl.DataFrame:
    start, end = _random_intervals(rng, n)
    frame = pl.DataFrame(
        {
            "kind": pl.Series(rng.choice(["kernel", "kernel", "memcpy"], n), dtype=pl.Enum(["kernel", "memcpy"])),
            "is_nccl": rng.random(n) < 0.1,
            "device": pl.Series(rng.integers(0, devices, n), dtype=pl.Int32),
            "start": start,
            "end": end,
        }
    )
    if shuffled:  # one device's kernels out of start order: that device is sorted instead
        frame = frame.sample(fraction=1.0, shuffle=True, seed=int(rng.integers(1 << 30)))
    return frame.with_columns(pl.when(pl.int_range(pl.len()) % 97 == 5).then(None).otherwise(pl.col("device")))


def _union_whole(ops: pl.DataFrame, mask: pl.Series) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    keep = (pl.col("kind") == "kernel") & ~pl.col("is_nccl") & mask.fill_null(False)
    kept = ops.filter(keep).with_columns(pl.col("device").fill_null(-1))
    return {
        int(dev): timeline.union_intervals(
            kept.filter(pl.col("device") == dev)["start"].to_numpy(),
            kept.filter(pl.col("device") == dev)["end"].to_numpy(),
        )
        for dev in sorted(kept["device"].unique().to_list())
    }


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("shuffled", [False, True])
def test_compute_union_matches_whole_arrays(seed: int, shuffled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(timeline, "_SLICE_ROWS", 37)  # many slices
    rng = np.random.default_rng(seed)
    ops = _ops(rng, int(rng.integers(50, 800)), devices=1 + seed % 3, shuffled=shuffled)
    mask = pl.Series(rng.random(ops.height) < 0.8).set(pl.Series(rng.random(ops.height) < 0.05), None)
    got = timeline.compute_union(ops, mask)
    want = _union_whole(ops, mask)
    assert got.keys() == want.keys()
    for dev in want:
        assert np.array_equal(got[dev][0], want[dev][0]) and np.array_equal(got[dev][1], want[dev][1])
    # The breakdown's cover from those segments measures every interval as the kernels did.
    from_kernels = collectives.compute_cover(ops, mask)
    from_union = collectives.compute_cover(ops, mask, got)
    a = rng.integers(0, 50 * ops.height, 300)
    b = a + rng.integers(-10, 3000, 300)
    device = rng.integers(-1, 3, 300)
    assert np.array_equal(from_union.covered(device, a, b), from_kernels.covered(device, a, b))


def test_real_capture_window(unpacked) -> None:
    """A real capture's window: segments, lanes and covered NCCL time as the whole-array code."""
    capture = read_capture(Path(unpacked(OWN / "h200" / "p2p_nsys" / "cap_0.sqlite.gz")))
    resolved = resolve_steps(capture.ranges, capture.gpu_ops, capture.strings, (), STEP_SOURCES)
    phases = find_phases(capture.ranges, resolved.steps)
    ops = attribute(capture.gpu_ops, capture.api_calls, resolved.steps, phases, gpu_timed=resolved.gpu_timed)
    ops = nccl.mark_nccl(ops, capture.strings, collective=False)
    steps = resolved.steps.select(pl.col("range_id").alias("step_id"), "pid")
    mask = window_mask(ops, step_spans(ops), steps)
    got = timeline.compute_union(ops, mask)
    want = _union_whole(ops.filter(ops["start"].is_not_null() & ops["end"].is_not_null()), mask)
    assert got.keys() == want.keys() and len(got)
    for dev, (s, e) in want.items():
        assert s.size > 1000
        assert np.array_equal(got[dev][0], s) and np.array_equal(got[dev][1], e)
        lane = timeline.reduce_segments(s, e, timeline.MAX_SEGMENTS)
        whole = _reduce_whole(s, e, timeline.MAX_SEGMENTS)
        assert all(np.array_equal(x, y) for x, y in zip(lane[:3], whole, strict=True))
    # Queries: the NCCL kernels, and intervals of every length across the window.
    kernels = ops.filter(pl.col("is_nccl") & mask)
    rng = np.random.default_rng(0)
    dev = next(iter(got))
    low, high = int(got[dev][0][0]), int(got[dev][1][-1])
    a = np.concatenate([kernels["start"].to_numpy(), rng.integers(low, high, 500)])
    b = np.concatenate([kernels["end"].to_numpy(), a[kernels.height :] + rng.integers(0, 5_000_000, 500)])
    device = np.concatenate([kernels["device"].to_numpy(), np.full(500, dev)])
    from_union = collectives.compute_cover(ops, mask, got).covered(device, a, b)
    assert np.array_equal(from_union, collectives.compute_cover(ops, mask).covered(device, a, b))
    assert from_union.sum() > 0
