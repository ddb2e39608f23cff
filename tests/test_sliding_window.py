"""Sliding-window attention: the band mask, and a rolling KV cache that keeps only the
keys a window can still reach. Decoding through the rolling cache, one position or one
block at a time, must equal one full pass with the band mask, in the specification and
in the torch module, for multi-head and grouped-query attention; PyTorch's
``F.scaled_dot_product_attention`` with the same band mask is the oracle."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import mha
from mha import convert
from mha.kv_cache_torch import KVCache
from mha.modules import MultiHeadAttention

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}
LENGTH = 40


def band_by_definition(size: int, window: int, num_keys: int) -> np.ndarray:
    """The band mask entry by entry: query t is at position num_keys - size + t and sees
    the keys from window - 1 positions back up to itself."""
    mask = np.zeros((size, num_keys), dtype=bool)
    for t in range(size):
        position = num_keys - size + t
        for s in range(num_keys):
            mask[t, s] = position - window < s <= position
    return mask


def blocks(length: int, sizes: list[int]) -> list[slice]:
    """Consecutive slices of the given sizes, repeated until ``length`` is covered; the
    last one is cut short."""
    out, start, i = [], 0, 0
    while start < length:
        stop = min(start + sizes[i % len(sizes)], length)
        out.append(slice(start, stop))
        start, i = stop, i + 1
    return out


def module(d_model=12, num_heads=4, num_kv_heads=None, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads).double().eval()


WINDOWS = [5, 1, LENGTH + 3]
# one at a time; blocks that do not divide 40; blocks longer than the window; one block
SIZES = [[1], [3], [7], [2, 5, 1, 6], [LENGTH]]


# ------------------------------------------------------------------------ the band mask


@pytest.mark.parametrize("window", [1, 2, 3, 6, 9])
@pytest.mark.parametrize(("size", "num_keys"), [(1, 1), (1, 7), (4, 4), (3, 8), (7, 7)])
def test_band_mask_is_its_definition(size, num_keys, window):
    got = mha.sliding_window_mask(size, window, num_keys=num_keys)
    assert got.dtype == np.bool_ and got.shape == (size, num_keys)
    np.testing.assert_array_equal(got, band_by_definition(size, window, num_keys))


@pytest.mark.parametrize(("size", "num_keys"), [(5, None), (2, 6), (6, 6)])
def test_a_window_as_wide_as_the_keys_is_the_causal_mask(size, num_keys):
    keys = size if num_keys is None else num_keys
    causal = mha.causal_mask(size, num_keys=num_keys)
    for window in (keys, keys + 1, 100):
        np.testing.assert_array_equal(mha.sliding_window_mask(size, window, num_keys), causal)
    # One narrower, and the earliest key drops out of the last query's view.
    narrower = mha.sliding_window_mask(size, keys - 1, num_keys)
    assert causal[-1, 0] and not narrower[-1, 0]


def test_every_query_sees_at_most_window_keys_ending_at_itself():
    mask = mha.sliding_window_mask(6, 3, num_keys=10)
    for t, row in enumerate(mask):
        seen = np.flatnonzero(row)
        assert seen[-1] == 10 - 6 + t  # itself, at the bottom-right diagonal
        assert len(seen) == 3 and np.array_equal(seen, np.arange(seen[0], seen[-1] + 1))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 3), "size must be a positive integer"),
        ((3, 0), "window must be a positive integer"),
        ((3, True), "window must be a positive integer"),
        ((3, 2.0), "window must be a positive integer"),
        ((3, 2, 0), "num_keys must be a positive integer"),
        ((3, 2, 2), "num_keys=2 is smaller than size=3"),
    ],
)
def test_band_mask_refuses_bad_arguments(args, message):
    with pytest.raises(ValueError, match=message):
        mha.sliding_window_mask(*args)


@pytest.mark.parametrize(("size", "num_keys", "window"), [(6, 6, 2), (3, 9, 4), (5, 5, 1)])
def test_band_mask_means_the_same_to_pytorch_sdpa(size, num_keys, window):
    """The specification's attention with the band mask equals PyTorch's SDPA with it."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(2, 3, n, 4)) for n in (size, num_keys, num_keys))
    mask = mha.sliding_window_mask(size, window, num_keys=num_keys)
    context, weights = mha.scaled_dot_product_attention(q, k, v, mask=mask)
    expected = F.scaled_dot_product_attention(
        *(torch.from_numpy(a) for a in (q, k, v)), attn_mask=torch.from_numpy(mask)
    )
    np.testing.assert_allclose(context, expected.numpy(), **CLOSE)
    assert np.all(weights[..., ~mask] == 0)


# ------------------------------------------------------ the rolling cache, specification


def spec_full_pass(x, params, num_heads, window):
    mask = mha.sliding_window_mask(x.shape[1], window)
    return mha.multi_head_attention(x, x, x, params, num_heads, mask=mask)


def spec_rolling(x, params, num_heads, window, sizes):
    """Decode through a rolling cache; yield (slice, keys' first position, output,
    weights, cache length) per block."""
    cache = mha.KVCache(window=window)
    for part in blocks(x.shape[1], sizes):
        new = x[:, part]
        num_keys = cache.kept_length + new.shape[1]
        mask = mha.sliding_window_mask(new.shape[1], window, num_keys=num_keys)
        out, w = mha.multi_head_attention(new, new, new, params, num_heads, mask=mask,
                                          cache=cache)  # fmt: skip
        yield part, part.stop - num_keys, out, w, cache


def check_against_full_pass(part, first, out, w, full, full_w):
    np.testing.assert_allclose(out, full[:, part], **CLOSE)
    # The weights on the keys still cached equal the full pass's; the keys cut from the
    # cache had weight exactly 0 there, as the window lies past them.
    np.testing.assert_allclose(w, full_w[:, :, part, first : part.stop], **CLOSE)
    assert not np.any(full_w[:, :, part, :first])


@pytest.mark.parametrize("kv_dim", [12, 3])  # 4 heads of 3; or 1 shared key/value head
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("window", WINDOWS)
def test_specification_rolling_cache_equals_one_band_pass(window, sizes, kv_dim):
    params = mha.AttentionParams.init(12, seed=1, kv_dim=kv_dim)
    x = np.random.default_rng(2).normal(size=(2, LENGTH, 12))
    full, full_w = spec_full_pass(x, params, 4, window)
    for part, first, out, w, cache in spec_rolling(x, params, 4, window, sizes):
        check_against_full_pass(part, first, out, w, full, full_w)
        new = part.stop - part.start
        assert cache.length == min(part.start, window - 1) + new <= window - 1 + new
        assert cache.k_heads.shape == cache.v_heads.shape == (2, kv_dim // 3, cache.length, 3)
        if sizes == [1] and part.stop >= window:  # warm, one position at a time
            assert cache.length == window


def test_a_rolling_cache_keeps_the_latest_positions():
    """What is stored is the last window - 1 old heads followed by the new ones."""
    cache = mha.KVCache(window=3)
    heads = np.arange(7.0).reshape(1, 1, 7, 1)  # (B, Hkv, S, Dh); head value = position
    cache.append(heads[:, :, :4], heads[:, :, :4])
    assert cache.length == 4 and cache.kept_length == 2
    k, v = cache.append(heads[:, :, 4:5], -heads[:, :, 4:5])
    assert k.ravel().tolist() == [2.0, 3.0, 4.0] and v.ravel().tolist() == [2.0, 3.0, -4.0]
    k, _ = cache.append(heads[:, :, 5:7], heads[:, :, 5:7])
    assert k.ravel().tolist() == [3.0, 4.0, 5.0, 6.0]
    assert mha.KVCache(window=1).kept_length == 0


def test_specification_mask_shape_counts_only_the_kept_keys():
    params = mha.AttentionParams.init(12, seed=3)
    x = np.random.default_rng(4).normal(size=(1, 6, 12))
    cache = mha.KVCache(window=3)
    mha.multi_head_attention(x[:, :4], x[:, :4], x[:, :4], params, 4,
                             mask=mha.sliding_window_mask(4, 3), cache=cache)  # fmt: skip
    new = x[:, 4:6]
    too_long = mha.sliding_window_mask(2, 3, num_keys=6)  # all cached keys: wrong S
    with pytest.raises(ValueError, match=r"\(\.\.\., T, S\) = \(1, 4, 2, 4\)"):
        mha.multi_head_attention(new, new, new, params, 4, mask=too_long, cache=cache)
    assert cache.length == 4  # the refused call did not touch the cache


@pytest.mark.parametrize("window", [0, -2, True, 2.5, "3"])
def test_specification_cache_refuses_a_bad_window(window):
    with pytest.raises(ValueError, match="window must be a positive integer"):
        mha.KVCache(window=window)


# ------------------------------------------------------------ the rolling cache, module


def module_rolling(m, x, window, sizes, need_weights=True):
    """Decode through a rolling cache; yield (slice, keys' first position, output,
    weights, cache) per block."""
    cache = KVCache(window=window)
    for part in blocks(x.shape[1], sizes):
        new = x[:, part]
        num_keys = cache.kept_length + new.shape[1]
        mask = torch.from_numpy(mha.sliding_window_mask(new.shape[1], window, num_keys))
        out, w = m(new, new, new, mask=mask, need_weights=need_weights, cache=cache)
        yield part, part.stop - num_keys, out, w, cache


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("sizes", SIZES)
@pytest.mark.parametrize("window", WINDOWS)
def test_module_rolling_cache_equals_one_band_pass(window, sizes, num_kv_heads, need_weights):
    m = module(num_kv_heads=num_kv_heads)
    x = torch.randn(2, LENGTH, 12, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(5))  # fmt: skip
    with torch.no_grad():
        full, full_w = m(x, x, x, mask=torch.from_numpy(mha.sliding_window_mask(LENGTH, window)))
        for part, first, out, w, cache in module_rolling(m, x, window, sizes, need_weights):
            torch.testing.assert_close(out, full[:, part], **CLOSE)
            if need_weights:
                torch.testing.assert_close(w, full_w[:, :, part, first : part.stop], **CLOSE)
                assert not full_w[:, :, part, :first].any()
            else:
                assert w is None
            new = part.stop - part.start
            assert cache.length == min(part.start, window - 1) + new <= window - 1 + new
            assert cache.k_heads.shape == cache.v_heads.shape == (2, num_kv_heads, cache.length, 3)
            if sizes == [1] and part.stop >= window:
                assert cache.length == window


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("need_weights", [True, False])
def test_module_band_pass_equals_pytorch_sdpa(need_weights, num_kv_heads):
    """The oracle: project with the module's own layers, attend with PyTorch's SDPA and
    the band mask, project out; decoding through the rolling cache gives the same."""
    m = module(num_kv_heads=num_kv_heads)
    x = torch.randn(3, 17, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    band = torch.from_numpy(mha.sliding_window_mask(17, 4))
    with torch.no_grad():
        q = m.W_q(x).view(3, 17, 4, 3).transpose(1, 2)  # (B, T, D) -> (B, H, T, Dh)
        k = m.W_k(x).view(3, 17, num_kv_heads, 3).transpose(1, 2)  # -> (B, Hkv, S, Dh)
        v = m.W_v(x).view(3, 17, num_kv_heads, 3).transpose(1, 2)
        context = F.scaled_dot_product_attention(q, k, v, attn_mask=band,
                                                 enable_gqa=num_kv_heads != 4)  # fmt: skip
        expected = m.W_o(context.transpose(1, 2).reshape(3, 17, 12))  # (B, H, T, Dh) -> (B, T, D)
        steps = [out for _, _, out, _, _ in module_rolling(m, x, 4, [1, 3, 2], need_weights)]
    torch.testing.assert_close(torch.cat(steps, dim=1), expected, **CLOSE)


@pytest.mark.parametrize("kv_dim", [12, 6])
@pytest.mark.parametrize("sizes", [[1], [3, 2]])
def test_module_equals_the_specification_step_by_step(sizes, kv_dim):
    params = mha.AttentionParams.init(12, seed=7, kv_dim=kv_dim)
    m = convert.params_to_module(params, num_heads=4).eval()
    x = np.random.default_rng(8).normal(size=(2, 15, 12))
    with torch.no_grad():
        for need_weights in (True, False):
            ours = module_rolling(m, torch.from_numpy(x), 4, sizes, need_weights)
            for (part, _, out, w, cache), (t_part, _, t_out, t_w, t_cache) in zip(
                spec_rolling(x, params, 4, 4, sizes), ours, strict=True
            ):
                assert part == t_part
                np.testing.assert_allclose(t_out.numpy(), out, **CLOSE)
                if need_weights:
                    np.testing.assert_allclose(t_w.numpy(), w, **CLOSE)
                np.testing.assert_allclose(t_cache.k_heads.numpy(), cache.k_heads, **CLOSE)
                np.testing.assert_allclose(t_cache.v_heads.numpy(), cache.v_heads, **CLOSE)
    back = convert.params_from_module(m)
    assert np.array_equal(back.W_k, params.W_k) and back.kv_dim == kv_dim


@pytest.mark.parametrize("sizes", [[1], [3], [2, 5]])
@pytest.mark.parametrize("need_weights", [True, False])
def test_module_rolling_cache_with_a_padded_batch(need_weights, sizes):
    """Left padding: the key padding mask is cut like the cache, to the keys it keeps.
    A pad query sees no real key within its window: zero context on both sides."""
    m = module(num_kv_heads=2)
    window, length = 3, 11
    x = torch.randn(3, length, 12, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(9))  # fmt: skip
    keep = torch.ones(3, length, dtype=torch.bool)  # (B, S): True = real token
    keep[1, :2] = False
    keep[2, :5] = False
    band = torch.from_numpy(mha.sliding_window_mask(length, window))
    with torch.no_grad():
        full, full_w = m(x, x, x, mask=band & keep[:, None, None, :])  # (B, 1, T, S)
        cache, outs = KVCache(window=window), []
        for part in blocks(length, sizes):
            new = x[:, part]
            num_keys = cache.kept_length + new.shape[1]
            first = part.stop - num_keys
            band = torch.from_numpy(mha.sliding_window_mask(new.shape[1], window, num_keys))
            mask = band & keep[:, None, None, first : part.stop]  # (B, 1, T_new, S_kept)
            out, w = m(new, new, new, mask=mask, need_weights=need_weights, cache=cache)
            outs.append(out)
            if need_weights:
                torch.testing.assert_close(w, full_w[:, :, part, first : part.stop], **CLOSE)
    got = torch.cat(outs, dim=1)
    torch.testing.assert_close(got, full, **CLOSE)
    # Row 2's first three pads have no real key in their windows: output = b_o = 0.
    assert not got[2, :5].any()


def test_module_mask_shape_counts_only_the_kept_keys():
    m = module()
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    cache = KVCache(window=3)
    m(x[:, :4], x[:, :4], x[:, :4], mask=torch.from_numpy(mha.sliding_window_mask(4, 3)),
      cache=cache)  # fmt: skip
    too_long = torch.from_numpy(mha.sliding_window_mask(2, 3, num_keys=6))
    new = x[:, 4:6]
    with pytest.raises(ValueError, match=r"\(B, H, T, S\) = \(1, 4, 2, 4\)"):
        m(new, new, new, mask=too_long, cache=cache)
    assert cache.length == 4


@pytest.mark.parametrize("window", [0, -1, True, 2.0, None])
def test_module_cache_refuses_a_bad_window_or_a_fixed_one(window):
    if window is None:  # any valid window with a fixed cache
        with pytest.raises(ValueError, match="window=4 needs a cache that grows"):
            KVCache(fixed=True, window=4)
        assert KVCache(fixed=True).window is None
    else:
        with pytest.raises(ValueError, match="window must be a positive integer"):
            KVCache(window=window)


def test_without_a_window_the_cache_keeps_everything():
    """The default is unchanged: every position stays, in both caches."""
    spec, ours = mha.KVCache(), KVCache()
    for t in range(6):
        spec.append(np.zeros((1, 2, 1, 3)), np.zeros((1, 2, 1, 3)))
        ours.append(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3))
        assert spec.length == spec.kept_length == ours.length == ours.kept_length == t + 1


def test_a_block_through_a_rolling_cache_without_a_mask_is_refused():
    """Unmasked, the first of several new queries would see the later ones: refused in
    the spec and the module alike; a single new position needs no mask."""
    rng = np.random.default_rng(9)
    x = rng.normal(size=(1, 5, 8))
    params = mha.AttentionParams.init(8, seed=3)
    spec = mha.KVCache(window=3)
    with pytest.raises(ValueError, match=r"sliding_window_mask\(2, 3, num_keys=2\)"):
        mha.multi_head_attention(x[:, :2], x[:, :2], x[:, :2], params, 4, cache=spec)
    assert spec.length == 0
    mha.multi_head_attention(x[:, :1], x[:, :1], x[:, :1], params, 4, cache=spec)
    m = convert.params_to_module(params, num_heads=4)
    ours = KVCache(window=3)
    xt = torch.from_numpy(x)
    m(xt[:, :1], xt[:, :1], xt[:, :1], cache=ours)
    with pytest.raises(ValueError, match=r"sliding_window_mask\(3, 3, num_keys=4\)"):
        m(xt[:, 1:4], xt[:, 1:4], xt[:, 1:4], cache=ours)
    assert ours.length == 1


@pytest.mark.parametrize("size", [2, 3, 5])
@pytest.mark.parametrize("window", [2, 3])
def test_every_block_of_two_or_more_needs_a_mask(size, window):
    """The smallest block that needs a mask is 2 (its first query must not see its
    second), whatever the window: a check loosened to blocks of more than 2 is caught
    here, in the module and the spec. The same block with its band mask goes through."""
    x = np.random.default_rng(1).normal(size=(1, size + 1, 8))
    params = mha.AttentionParams.init(8, seed=3)
    num_keys = min(1, window - 1) + size  # the kept cached position and the block
    band = mha.sliding_window_mask(size, window, num_keys=num_keys)
    needs = rf"sliding_window_mask\({size}, {window}, num_keys={num_keys}\)"

    spec = mha.KVCache(window=window)
    mha.multi_head_attention(x[:, :1], x[:, :1], x[:, :1], params, 4, cache=spec)
    new = x[:, 1:]
    with pytest.raises(ValueError, match=needs):
        mha.multi_head_attention(new, new, new, params, 4, cache=spec)
    assert spec.length == 1  # nothing appended
    mha.multi_head_attention(new, new, new, params, 4, mask=band, cache=spec)
    assert spec.length == num_keys

    m = convert.params_to_module(params, num_heads=4)
    ours, xt = KVCache(window=window), torch.from_numpy(x)
    m(xt[:, :1], xt[:, :1], xt[:, :1], cache=ours)
    new = xt[:, 1:]
    with pytest.raises(ValueError, match=needs):
        m(new, new, new, cache=ours)
    assert ours.length == 1
    m(new, new, new, mask=torch.from_numpy(band), cache=ours)
    assert ours.length == num_keys
