"""Attention sinks (StreamingLLM): the sliding window that keeps the first positions
(:func:`mha.sliding_window_mask` with ``num_sinks``, and its torch twin), and the KV
cache that keeps them while it evicts the middle (:class:`mha.KVCache` with
``num_sinks``). Decoding through the cache, one position or a block at a time, must
equal one full pass under the sink mask."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import mha
from mha import masks_torch

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}
LENGTH = 30


def sinks_by_definition(size: int, window: int, num_keys: int, num_sinks: int) -> np.ndarray:
    """Entry by entry: query t is at position num_keys - size + t; it sees the keys up
    to itself that are within the window or among the first num_sinks."""
    mask = np.zeros((size, num_keys), dtype=bool)
    for t in range(size):
        position = num_keys - size + t
        for s in range(num_keys):
            mask[t, s] = s <= position and (position - s < window or s < num_sinks)
    return mask


# ------------------------------------------------------------------------------ the mask


def test_sink_mask_by_hand():
    """Six positions, a window of 2, two sinks: the first two columns stay open below
    the diagonal, and the band of two runs along it."""
    expected = np.array(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 1, 1, 0],
            [1, 1, 0, 0, 1, 1],
        ],
        dtype=bool,
    )
    np.testing.assert_array_equal(mha.sliding_window_mask(6, 2, num_sinks=2), expected)
    # The last two queries of the same six positions (decoding with a cache).
    np.testing.assert_array_equal(
        mha.sliding_window_mask(2, 2, num_keys=6, num_sinks=2), expected[4:]
    )
    # One sink, a window of 1: each query sees position 0 and itself.
    np.testing.assert_array_equal(
        mha.sliding_window_mask(4, 1, num_sinks=1),
        np.array([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 0, 1]], dtype=bool),
    )


@pytest.mark.parametrize("num_sinks", [0, 1, 3, 12])
@pytest.mark.parametrize("window", [1, 2, 5])
@pytest.mark.parametrize(("size", "num_keys"), [(1, 1), (1, 9), (4, 4), (3, 10), (9, 9)])
def test_sink_mask_is_its_definition_in_both_twins(size, num_keys, window, num_sinks):
    expected = sinks_by_definition(size, window, num_keys, num_sinks)
    got = mha.sliding_window_mask(size, window, num_keys=num_keys, num_sinks=num_sinks)
    np.testing.assert_array_equal(got, expected)
    twin = masks_torch.sliding_window_mask(size, window, num_keys, num_sinks=num_sinks)
    assert twin.dtype == torch.bool
    np.testing.assert_array_equal(twin.numpy(), expected)


def test_no_sinks_is_the_plain_band():
    np.testing.assert_array_equal(
        mha.sliding_window_mask(7, 3, num_keys=10, num_sinks=0),
        mha.sliding_window_mask(7, 3, num_keys=10),
    )


@pytest.mark.parametrize("num_sinks", [-1, 1.5, True, "2"])
def test_sink_mask_refuses_a_bad_num_sinks(num_sinks):
    with pytest.raises(ValueError, match="num_sinks must be a non-negative integer"):
        mha.sliding_window_mask(3, 2, num_sinks=num_sinks)
    with pytest.raises(ValueError, match="num_sinks must be a non-negative integer"):
        masks_torch.sliding_window_mask(3, 2, num_sinks=num_sinks)


# ----------------------------------------------------------------------------- the cache


def blocks(length: int, sizes: list[int]) -> list[slice]:
    """Consecutive slices of the given sizes, repeated until ``length`` is covered."""
    out, start, i = [], 0, 0
    while start < length:
        stop = min(start + sizes[i % len(sizes)], length)
        out.append(slice(start, stop))
        start, i = stop, i + 1
    return out


def kept_positions(stop: int, window: int, num_sinks: int, new: int) -> np.ndarray:
    """The positions a sink cache holds after appending positions ``stop - new .. stop - 1``:
    the first sinks, then the last window - 1 before the block, then the block."""
    before = stop - new
    old = [p for p in range(before) if p < num_sinks or p >= before - (window - 1)]
    return np.array(old + list(range(before, stop)))


@pytest.mark.parametrize("kv_dim", [12, 3])  # 4 heads of 3; or 1 shared key/value head
@pytest.mark.parametrize("sizes", [[1], [3], [2, 5, 1, 6]])
@pytest.mark.parametrize(("window", "num_sinks"), [(4, 2), (1, 1), (6, 4), (3, 40)])
def test_sink_cache_equals_full_attention_under_the_sink_mask(window, num_sinks, sizes, kv_dim):
    """Block by block through the cache with the sink mask over the kept keys: the
    outputs of the full pass, the same weights on the keys kept, and exactly zero
    weight in the full pass on every key the cache evicted."""
    params = mha.AttentionParams.init(12, seed=1, kv_dim=kv_dim)
    x = np.random.default_rng(2).normal(size=(2, LENGTH, 12))
    full_mask = mha.sliding_window_mask(LENGTH, window, num_sinks=num_sinks)
    full, full_w = mha.multi_head_attention(x, x, x, params, 4, mask=full_mask)
    cache = mha.KVCache(window=window, num_sinks=num_sinks)
    for part in blocks(LENGTH, sizes):
        new = x[:, part]
        num_keys = cache.kept_length + new.shape[1]
        mask = mha.sliding_window_mask(new.shape[1], window, num_keys=num_keys, num_sinks=num_sinks)
        out, w = mha.multi_head_attention(new, new, new, params, 4, mask=mask, cache=cache)
        np.testing.assert_allclose(out, full[:, part], **CLOSE)
        kept = kept_positions(part.stop, window, num_sinks, new.shape[1])
        assert cache.length == len(kept) == num_keys
        np.testing.assert_allclose(w, full_w[:, :, part][..., kept], **CLOSE)
        evicted = np.setdiff1d(np.arange(part.stop), kept)
        assert not np.any(full_w[:, :, part][..., evicted])
        if sizes == [1] and part.stop > num_sinks + window:  # warm, one at a time
            assert cache.length == num_sinks + window


def test_sink_cache_keeps_the_first_and_the_latest_positions():
    """Head value = position: what is stored is the sinks, the last window - 1 old
    positions, then the new ones."""
    cache = mha.KVCache(window=3, num_sinks=2)
    heads = np.arange(9.0).reshape(1, 1, 9, 1)  # (B, Hkv, S, Dh)
    k, _ = cache.append(heads[:, :, :4], heads[:, :, :4])
    assert k.ravel().tolist() == [0, 1, 2, 3] and cache.kept_length == 4
    k, v = cache.append(heads[:, :, 4:5], -heads[:, :, 4:5])
    assert k.ravel().tolist() == [0, 1, 2, 3, 4] and v.ravel().tolist() == [0, 1, 2, 3, -4]
    k, _ = cache.append(heads[:, :, 5:6], heads[:, :, 5:6])
    assert k.ravel().tolist() == [0, 1, 3, 4, 5]
    k, _ = cache.append(heads[:, :, 6:9], heads[:, :, 6:9])
    assert k.ravel().tolist() == [0, 1, 4, 5, 6, 7, 8]
    cache = mha.KVCache(window=1, num_sinks=1)
    cache.append(heads[:, :, :3], heads[:, :, :3])
    k, _ = cache.append(heads[:, :, 3:4], heads[:, :, 3:4])
    assert k.ravel().tolist() == [0, 3]


def test_one_new_position_needs_no_mask():
    """The keys a sink cache keeps for one new query are exactly those it may see, so
    decoding one position at a time unmasked equals the full pass under the sink mask."""
    params = mha.AttentionParams.init(8, seed=5)
    x = np.random.default_rng(6).normal(size=(1, 15, 8))
    mask = mha.sliding_window_mask(15, 3, num_sinks=2)
    full, _ = mha.multi_head_attention(x, x, x, params, 2, mask=mask)
    cache = mha.KVCache(window=3, num_sinks=2)
    for t in range(15):
        step = x[:, t : t + 1]
        out, _ = mha.multi_head_attention(step, step, step, params, 2, cache=cache)
        np.testing.assert_allclose(out, full[:, t : t + 1], **CLOSE)


def test_a_block_through_a_sink_cache_without_a_mask_is_refused():
    x = np.random.default_rng(7).normal(size=(1, 4, 8))
    params = mha.AttentionParams.init(8, seed=3)
    cache = mha.KVCache(window=3, num_sinks=2)
    needed = r"sliding_window_mask\(4, 3, num_keys=4, num_sinks=2\)"
    with pytest.raises(ValueError, match=needed):
        mha.multi_head_attention(x, x, x, params, 2, cache=cache)
    assert cache.length == 0


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"window": 3, "num_sinks": -1}, "num_sinks must be a non-negative integer"),
        ({"window": 3, "num_sinks": 2.0}, "num_sinks must be a non-negative integer"),
        ({"num_sinks": 2}, "num_sinks=2 needs a window"),
    ],
)
def test_sink_cache_refuses_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        mha.KVCache(**kwargs)
