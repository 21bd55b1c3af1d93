"""The chunked NumPy interval union agrees with the plain Polars one, chunk boundaries, kept-row
masks and negative durations included."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from traceguard.metrics import intervals


def _polars_union(frame: pl.DataFrame, by: list[str]) -> dict[tuple, int]:
    out = intervals._union_ns_polars(frame, by).collect()
    return {tuple(r[:-1]): r[-1] for r in out.select([*by, "union_ns"]).iter_rows()}


@pytest.mark.parametrize("chunk", [1, 3, 7, 1 << 21])
@pytest.mark.parametrize("seed", range(12))
def test_union_sorted_np_matches_polars(seed: int, chunk: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intervals, "_CHUNK", chunk)
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 300))
    start = rng.integers(-1_000, 5_000, n)
    # Some negative durations: a segment is its largest end minus its first start.
    end = start + rng.integers(-50 if seed % 2 else 0, 400, n)
    group = rng.integers(0, 1 + seed % 4, n)
    keep = rng.random(n) < (0.6 if seed % 3 else 1.0)
    frame = pl.DataFrame({"g": group, "start": start, "end": end}).sort(["g", "start"])
    g = frame["g"].to_numpy()
    s = frame["start"].to_numpy()
    e = frame["end"].to_numpy()
    frame = frame.with_columns(pl.Series("keep", keep))
    for mask in (None, frame["keep"].to_numpy()):
        firsts, totals = intervals.union_sorted_np(g, s, e, mask)
        kept = frame if mask is None else frame.filter(pl.col("keep"))
        want = _polars_union(kept, ["g"])
        got = {(int(g[f]),): int(t) for f, t in zip(firsts, totals, strict=True)}
        assert got == want
        # The same rows shuffled, taken through ``order``.
        perm = rng.permutation(len(s))
        inverse = np.argsort(perm)
        shuffled_mask = None if mask is None else mask[perm]
        firsts2, totals2 = intervals.union_sorted_np(g[perm], s[perm], e[perm], shuffled_mask, order=inverse)
        assert totals2.tolist() == totals.tolist()
        assert perm[inverse[firsts2]].tolist() == firsts.tolist()
        if len(set(g.tolist())) == 1:
            _, single = intervals.union_sorted_np(None, s, e, mask)
            assert single.tolist() == list(want.values())


@pytest.mark.parametrize("seed", range(6))
def test_union_ns_groups_match_polars(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(intervals, "_CHUNK", 5)
    rng = np.random.default_rng(100 + seed)
    n = 200
    start = rng.integers(0, 3_000, n)
    frame = pl.DataFrame(
        {
            "a": rng.integers(0, 4, n),
            "b": rng.integers(-2, 2, n),
            "start": start,
            "end": start + rng.integers(-20, 300, n),
        }
    )
    fast = intervals.union_ns(frame, ["a", "b"]).collect().sort(["a", "b"])
    slow = intervals._union_ns_polars(frame, ["a", "b"]).collect().sort(["a", "b"])
    assert fast.equals(slow.select(fast.columns))


@pytest.mark.parametrize("seed", range(16))
def test_exposed_time_paths_agree(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceguard import model
    from traceguard.metrics import nccl

    monkeypatch.setattr(intervals, "_CHUNK", 4)
    monkeypatch.setattr(nccl, "STREAM_ROWS", 3)
    rng = np.random.default_rng(seed)
    n = 120
    start = rng.integers(0, 2_000, n)
    if seed % 2:
        start = np.sort(start)  # the streamed path needs start order
    ops = pl.DataFrame(
        {
            "kind": pl.Series(rng.choice(["kernel", "memcpy"], n, p=[0.8, 0.2]), dtype=model.OpKind),
            "device": pl.Series(rng.integers(0, 1 + (seed % 3 == 0), n), dtype=pl.Int32),
            "start": start,
            "end": start + rng.integers(-10, 200, n),
            "is_nccl": rng.random(n) < 0.3,
        }
    )
    mask = pl.Series("in_window", rng.random(n) < (0.8 if seed % 4 else 1.0))
    kernels = ops.filter(mask & (pl.col("kind") == "kernel")).select("device", "start", "end", "is_nccl")
    want = nccl._exposed_time_polars(kernels)
    assert nccl.exposed_time(ops, mask) == want
    assert nccl.exposed_time(ops.lazy().filter(mask)) == want


@pytest.mark.parametrize("batch", [1, 7, 50, 10_000])
def test_union_ns_batched(batch: int) -> None:
    rng = np.random.default_rng(batch)
    n = 300
    start = rng.integers(0, 3_000, n)
    frame = pl.DataFrame(
        {
            "a": pl.Series(rng.integers(0, 20, n)).set(pl.Series(rng.random(n) < 0.05), None),
            "b": rng.integers(0, 3, n),
            "start": start,
            "end": start + rng.integers(-5, 300, n),
        }
    )
    got = intervals.union_ns_batched(frame, ["a", "b"], batch).collect().sort(["a", "b"], nulls_last=True)
    want = intervals._union_ns_polars(frame, ["a", "b"]).collect().sort(["a", "b"], nulls_last=True)
    assert got.equals(want.select(got.columns))
