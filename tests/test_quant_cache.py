"""The quantised KV cache, in the specification and in torch: the round trip's exact
properties, which tokens stay in full precision, the error measured per pairing and
bits, per-channel keys against outlier channels, and the two layers agreeing."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

import mha
from mha import convert
from mha import quant_cache_torch as qt
from mha.quant_cache import (
    QuantizedKVCache,
    dequantize,
    quantization_error,
    quantize,
    relative_error,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")
# numpy against torch, or a cache against the full-precision one: float64 sums in other
# orders, magnitudes about 1.
CLOSE = {"rtol": 1e-12, "atol": 1e-12}
PAIRINGS = list(itertools.product(["channel", "token"], repeat=2))  # (keys, values)


def per_element(q, values):
    """A per-group array (``scale`` or ``zero``) repeated over its group: the input's shape."""
    return np.repeat(values, q.group_size, axis=q.axis)


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(("axis", "group_size"), [(-1, None), (-1, 4), (-2, 3), (0, 2)])
def test_every_element_is_within_half_a_step(bits, symmetric, axis, group_size):
    x = np.random.default_rng(bits).normal(size=(2, 3, 6, 8))
    q = quantize(x, bits, axis=axis, group_size=group_size, symmetric=symmetric)
    back = dequantize(q)
    step = per_element(q, q.scale)
    # half a step, plus the rounding of x / scale and of code * scale (+ zero): a few ulps
    assert np.all(np.abs(back - x) <= step / 2 + 4 * np.spacing(np.abs(x) + step))
    low, high = (-(2 ** (bits - 1)) + 1, 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    assert q.codes.min() >= low and q.codes.max() <= high
    assert q.codes.min() == low or q.codes.max() == high  # each scale is set by an extreme
    assert q.codes.shape == x.shape and q.scale.shape[q.axis] == x.shape[q.axis] // q.group_size


@pytest.mark.parametrize("bits", [8, 4, 2])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("per", ["channel", "token"])
def test_grid_points_come_back_exactly(bits, symmetric, per):
    """Values ``code * 2**-3 (+ zero)`` whose every group reaches both ends of the code
    range: the scale is 2**-3 exactly, so every step is exact (exact by construction)."""
    rng = np.random.default_rng(bits)
    axis, group = mha.quant_cache.PER[per], 4
    low, high = (-(2 ** (bits - 1)) + 1, 2 ** (bits - 1) - 1) if symmetric else (0, 2**bits - 1)
    codes = rng.integers(low, high + 1, size=(2, 3, 8, 8))
    ends = np.moveaxis(codes, axis, -1)  # a view: the first two entries of every group
    ends[..., ::group] = high
    ends[..., 1::group] = low
    zero = 0.0 if symmetric else 0.375 * rng.integers(-4, 5, size=(2, 3, 1, 1))
    x = codes * 0.125 + zero
    q = quantize(x, bits, axis=axis, group_size=group, symmetric=symmetric)
    assert np.array_equal(dequantize(q), x)
    assert np.all(q.scale == 0.125) and np.array_equal(q.codes, codes)
    t = qt.quantize(torch.from_numpy(x), bits, axis=axis, group_size=group, symmetric=symmetric)
    assert torch.equal(qt.dequantize(t), torch.from_numpy(x))


@pytest.mark.parametrize("symmetric", [True, False])
def test_a_group_without_spread_comes_back_exactly(symmetric):
    x = np.array([[0.0, 0.0, 1.5, -2.0], [3.0, 3.0, 3.0, 3.0]])
    q = quantize(x, 2, axis=-1, group_size=2, symmetric=symmetric)
    back = dequantize(q)
    assert back[0, 0] == back[0, 1] == 0.0 and np.all(back[1] == 3.0)  # exact, no spread
    assert q.scale[0, 0] == 1.0 and not q.codes[0, :2].any()  # a scale of 1, codes 0
    assert not np.isnan(back).any()


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize(("axis", "group_size"), [(-1, 2), (-2, 4), (1, None)])
def test_numpy_and_torch_quantise_alike(symmetric, axis, group_size):
    x = np.random.default_rng(9).normal(size=(2, 3, 8, 4))
    for bits in (8, 4, 2):
        q = quantize(x, bits, axis=axis, group_size=group_size, symmetric=symmetric)
        t = qt.quantize(
            torch.from_numpy(x), bits, axis=axis, group_size=group_size, symmetric=symmetric
        )
        # The same elementwise operations (abs, max, min, divide, round), each correctly
        # rounded in IEEE arithmetic: the codes and scales are identical.
        assert np.array_equal(t.codes.numpy(), q.codes)
        assert q.codes.dtype == (np.int8 if symmetric else np.uint8)
        assert t.codes.dtype == (torch.int8 if symmetric else torch.uint8)
        assert np.array_equal(t.scale.numpy(), q.scale)
        assert (t.zero is None) == (q.zero is None)
        np.testing.assert_allclose(qt.dequantize(t).numpy(), dequantize(q), **CLOSE)


def test_which_tokens_stay_in_full_precision():
    """Per-channel keys quantise whole groups of G = 3 tokens that leave ``residual``
    tokens behind; per-token values quantise all but the ``residual`` newest."""
    rng = np.random.default_rng(10)
    for residual, expected in ((0, [(0, 2), (3, 5), (6, 7)]), (2, [(0, 0), (3, 3), (3, 5)])):
        cache = QuantizedKVCache(bits=4, group_size=3, residual=residual)
        twin = qt.QuantizedKVCache(bits=4, group_size=3, residual=residual)
        added, seen = [], []
        for size in (2, 3, 2):  # 2, 5, 7 tokens cached
            k, v = rng.normal(size=(2, 1, 2, size, 3))
            added.append((k, v))
            cache.append(k, v)
            twin.append(torch.from_numpy(k), torch.from_numpy(v))
            seen.append((cache.keys.quantized_length, cache.values.quantized_length))
            assert (twin.keys.quantized_length, twin.values.quantized_length) == seen[-1]
        assert seen == expected
        k_all = np.concatenate([k for k, _ in added], axis=2)  # (1, 2, 7, 3)
        v_all = np.concatenate([v for _, v in added], axis=2)
        n_k, n_v = seen[-1]
        # The chunks hold whole groups: quantised piece by piece or at once, the same
        # numbers through the same operations (exact), and the recent tokens as they came.
        once = quantize(k_all[:, :, :n_k], 4, axis=-2, group_size=3, symmetric=False)
        assert np.array_equal(cache.k_heads[:, :, :n_k], dequantize(once))
        assert np.array_equal(cache.k_heads[:, :, n_k:], k_all[:, :, n_k:])
        assert np.array_equal(cache.v_heads[:, :, n_v:], v_all[:, :, n_v:])
        assert not np.array_equal(cache.v_heads[:, :, :n_v], v_all[:, :, :n_v])
        assert cache.length == twin.length == 7
        np.testing.assert_allclose(twin.k_heads.numpy(), cache.k_heads, **CLOSE)
        np.testing.assert_allclose(twin.v_heads.numpy(), cache.v_heads, **CLOSE)


def test_stored_bits_count_codes_scales_zeros_and_recent_tokens():
    cache = QuantizedKVCache(bits=2, group_size=4, residual=1)
    cache.append(np.ones((1, 1, 6, 4)), np.ones((1, 1, 6, 4)))
    # keys: 4 tokens x 4 channels of 2 bits, 4 groups of (scale, zero); 2 recent tokens.
    # values: 5 tokens x 4 of 2 bits, 5 groups of (scale, zero); 1 recent token.
    keys = 16 * 2 + 4 * 2 * 16 + 2 * 4 * 16
    values = 20 * 2 + 5 * 2 * 16 + 1 * 4 * 16
    assert cache.stored_bits() == keys + values
    twin = qt.QuantizedKVCache(bits=2, group_size=4, residual=1)
    twin.append(
        torch.ones(1, 1, 6, 4, dtype=torch.float64), torch.ones(1, 1, 6, 4, dtype=torch.float64)
    )
    assert twin.stored_bits() == keys + values


def qkv(seed, outliers=False):
    rng = np.random.default_rng(seed)
    q = rng.normal(size=(1, 4, 3, 8))  # (B, H, T, Dh)
    k = rng.normal(size=(1, 2, 16, 8))  # (B, Hkv, S, Dh)
    v = rng.normal(size=(1, 2, 16, 8))
    if outliers:  # two channels far from 0 in every key, as KIVI observes in real models
        k[..., 1] += 12
        k[..., 6] -= 9
    return q, k, v


@pytest.mark.parametrize(("key_per", "value_per"), PAIRINGS)
@pytest.mark.parametrize("symmetric", [True, False])
def test_errors_shrink_as_bits_grow(key_per, value_per, symmetric):
    q, k, v = qkv(11)
    errors = [
        quantization_error(
            q,
            k,
            v,
            bits=bits,
            key_per=key_per,
            value_per=value_per,
            group_size=4,
            symmetric=symmetric,
        )
        for bits in (2, 4, 8)
    ]
    for field in ("keys", "values", "weights", "output"):
        e2, e4, e8 = (getattr(e, field) for e in errors)
        # each halving of the step (one bit) about halves the error: 2 bits more, 4x
        assert e2 > 2 * e4 > 4 * e8 > 0, (field, e2, e4, e8)
    assert errors[-1].output < 0.01


def test_per_channel_beats_per_token_on_keys_with_outlier_channels():
    """Asymmetric, groups of 4 either way: per-token, each token's range spans the
    outliers and the small channels round to a few levels; per-channel, each channel's
    group only spans its own tokens. (Symmetric quantisation cannot use the offset: there
    per-channel gains little; the chapter's figure shows that.)"""
    q, k, v = qkv(12, outliers=True)
    for bits in (2, 4, 8):
        channel = quantization_error(q, k, v, bits=bits, key_per="channel", group_size=4)
        token = quantization_error(q, k, v, bits=bits, key_per="token", group_size=4)
        assert token.keys > 2 * channel.keys and token.weights > 2 * channel.weights
        assert token.output > 1.5 * channel.output
        assert channel.values == token.values  # the same value quantisation: same numbers
    q, k, v = qkv(12)  # without outliers the advantage is gone
    channel = quantization_error(q, k, v, bits=4, key_per="channel", group_size=4)
    token = quantization_error(q, k, v, bits=4, key_per="token", group_size=4)
    assert token.keys < 1.5 * channel.keys


def test_numpy_and_torch_measure_the_same_errors():
    q, k, v = qkv(13, outliers=True)
    for key_per, value_per in PAIRINGS:
        kwargs = dict(bits=4, key_per=key_per, value_per=value_per, group_size=4, residual=3)
        ours = quantization_error(q, k, v, **kwargs)
        theirs = qt.quantization_error(*map(torch.from_numpy, (q, k, v)), **kwargs)
        for field in ("keys", "values", "weights", "output"):
            assert getattr(theirs, field) == pytest.approx(getattr(ours, field), rel=1e-9)


def test_the_cache_plugs_into_multi_head_attention_in_both_layers():
    """Decoding through a quantised cache: the specification and the torch module agree
    with each other, differ from the full-precision cache by the measured error, and a
    residual that holds everything is the full-precision cache itself."""
    params = mha.AttentionParams.init(16, seed=14, kv_dim=8)  # H = 4, Hkv = 2, Dh = 4
    module = convert.params_to_module(params, num_heads=4).eval()
    x = np.random.default_rng(14).normal(size=(2, 9, 16))
    caches = {
        "plain": mha.KVCache(),
        "quantised": QuantizedKVCache(bits=4, group_size=4),
        "all recent": QuantizedKVCache(bits=2, group_size=4, residual=9),
    }
    twin = qt.QuantizedKVCache(bits=4, group_size=4)
    outputs = {name: [] for name in caches}
    torch_outputs = []
    for part in (slice(0, 4), slice(4, 5), slice(5, 6), slice(6, 9)):
        new = x[:, part]
        mask = mha.causal_mask(new.shape[1], num_keys=part.stop)
        for name, cache in caches.items():
            outputs[name].append(
                mha.multi_head_attention(new, new, new, params, 4, mask, cache=cache)[0]
            )
        with torch.no_grad():
            t_new = torch.from_numpy(new)
            out, _ = module(t_new, t_new, t_new, torch.from_numpy(mask), cache=twin)
        torch_outputs.append(out.numpy())
    got = {name: np.concatenate(parts, axis=1) for name, parts in outputs.items()}
    np.testing.assert_allclose(np.concatenate(torch_outputs, axis=1), got["quantised"], **CLOSE)
    # every key and value the same numbers through the same code: exact
    assert np.array_equal(got["all recent"], got["plain"])
    error = relative_error(got["plain"], got["quantised"])
    assert 1e-4 < error < 0.1
    assert caches["quantised"].keys.quantized_length == 8  # the 9th key waits for its group


@pytest.mark.parametrize("layer", ["numpy", "torch"])
def test_bad_arguments(layer):
    if layer == "numpy":
        lib, x, zeros = mha.quant_cache, np.zeros((2, 4)), np.zeros
    else:
        lib, x, zeros = qt, torch.zeros(2, 4, dtype=torch.float64), torch.zeros
    for bits in (1, 9, 4.0, True):
        with pytest.raises(ValueError, match="bits"):
            lib.quantize(x, bits)
    with pytest.raises(ValueError, match="axis"):
        lib.quantize(x, 4, axis=2)
    with pytest.raises(ValueError, match="group_size=3 must divide the length 4"):
        lib.quantize(x, 4, group_size=3)
    with pytest.raises(ValueError, match="group_size"):
        lib.quantize(x, 4, group_size=0)
    with pytest.raises(ValueError, match="symmetric"):
        lib.quantize(x, 4, symmetric="yes")
    with pytest.raises(ValueError, match="x must be"):
        lib.quantize(np.array(["a"]) if layer == "numpy" else torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match="q must be"):
        lib.dequantize(x)
    with pytest.raises(ValueError, match="key_per must be 'token' or 'channel'"):
        lib.QuantizedKVCache(key_per="row")
    with pytest.raises(ValueError, match="value_per"):
        lib.QuantizedKVCache(value_per="head")
    with pytest.raises(ValueError, match="residual"):
        lib.QuantizedKVCache(residual=-1)
    with pytest.raises(ValueError, match="bits"):
        lib.QuantizedKVCache(bits=1)
    cache = lib.QuantizedKVCache(group_size=3)
    with pytest.raises(ValueError, match="group_size=3 must divide Dh=4"):
        cache.append(zeros((1, 2, 1, 4)), zeros((1, 2, 1, 4)))  # values per token
    cache = lib.QuantizedKVCache(group_size=2)
    cache.append(zeros((1, 2, 1, 4)), zeros((1, 2, 1, 4)))
    with pytest.raises(ValueError, match=r"must agree except S"):
        cache.append(zeros((1, 3, 1, 4)), zeros((1, 3, 1, 4)))
    with pytest.raises(ValueError, match="one shape"):
        cache.append(zeros((1, 2, 1, 4)), zeros((1, 2, 2, 4)))
    with pytest.raises(ValueError, match="exact .* and approx .* must have one shape"):
        lib.relative_error(zeros((2, 3)), zeros((3, 2)))
    with pytest.raises(ValueError, match="q_heads"):
        lib.quantization_error(zeros((4, 3, 8)), zeros((1, 2, 4, 8)), zeros((1, 2, 4, 8)), bits=4)
    if layer == "numpy":
        with pytest.raises(ValueError, match="does not roll"):
            QuantizedKVCache(window=4)
