"""mha.attention against PyTorch's own implementations (the oracles).

- ``scaled_dot_product_attention`` against ``torch.nn.functional.scaled_dot_product_attention``
  (its weights are read off by attending over the identity matrix as values);
- ``multi_head_attention`` against ``nn.MultiheadAttention(batch_first=True)`` called
  with ``average_attn_weights=False``, weights copied with ``AttentionParams.from_torch``.

Exact comparisons here are of values exact by construction (weights copied between
the two sides, reshaped heads, zeros of a row with nothing to attend to and the
``b_o`` it then outputs) or of the same computation repeated; two code paths are
compared with a tolerance (see tests/numerics.py).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numerics import assert_matmul_close
from torch import nn

from mha import (
    AttentionParams,
    AttentionSteps,
    causal_mask,
    combine_masks,
    convert,
    merge_heads,
    multi_head_attention,
    multi_head_attention_steps,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
    split_heads,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)

ATOL64 = 1e-10
ATOL32 = 1e-5


def t(a: np.ndarray) -> torch.Tensor:
    # copy: from_numpy shares memory and warns on read-only (broadcast) arrays
    return torch.from_numpy(np.array(a, order="C"))


def random_lengths(rng: np.random.Generator, batch: int, size: int) -> np.ndarray:
    """Lengths in 1..size, with the last sequence padded whenever size > 1."""
    lengths = rng.integers(1, size + 1, size=batch)
    lengths[-1] = max(1, size - 2)
    return lengths


# --------------------------------------------------------------------------- softmax


def test_softmax_matches_torch() -> None:
    x = np.random.default_rng(0).normal(size=(3, 4, 7)) * 5
    for axis in (-1, 0, 1):
        expected = torch.softmax(t(x), dim=axis).numpy()
        np.testing.assert_allclose(softmax(x, axis=axis), expected, rtol=0, atol=ATOL64)


def test_softmax_is_stable_for_large_inputs() -> None:
    # exp(1000) overflows float64; a naive softmax would return NaN (and warn).
    x = np.array([[1000.0, 1001.0, 1002.0], [-1000.0, -1001.0, -1002.0]])
    expected = softmax(np.array([0.0, 1.0, 2.0]))
    np.testing.assert_allclose(softmax(x)[0], expected, rtol=0, atol=1e-15)
    np.testing.assert_allclose(softmax(x)[1], expected[::-1], rtol=0, atol=1e-15)


def test_softmax_minus_inf_gets_exactly_zero_and_all_minus_inf_row_is_zero() -> None:
    x = np.array([[0.0, -np.inf, 1.0], [-np.inf, -np.inf, -np.inf]])
    out = softmax(x)
    assert out[0, 1] == 0.0
    np.testing.assert_allclose(out[0].sum(), 1.0, rtol=0, atol=1e-15)
    np.testing.assert_array_equal(out[1], np.zeros(3))


def test_softmax_accepts_integers_and_keeps_float32() -> None:
    np.testing.assert_allclose(softmax([0, 0]), [0.5, 0.5])
    assert softmax(np.zeros(3, dtype=np.float32)).dtype == np.float32


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_softmax_nan_and_plus_inf_give_nan_as_in_torch(dtype) -> None:
    """Only an all -inf row (nothing to attend to) becomes zeros; a NaN or +inf in a
    row has no defined softmax and must not be hidden as zeros."""
    inf, nan = np.inf, np.nan
    x = np.array(
        [
            [nan, 1.0, 2.0],
            [inf, 1.0, 2.0],
            [inf, inf, 2.0],
            [nan, -inf, -inf],
            [inf, -inf, 1e4],  # +inf next to a value whose exp would overflow
            [0.0, -inf, 1.0],
            [-inf, -inf, -inf],
        ],
        dtype=dtype,
    )
    out = softmax(x)  # warnings are errors: no "invalid value" on the way
    expected = torch.softmax(t(x), dim=-1).numpy()
    assert out.dtype == dtype
    # NaN exactly where torch has NaN (assert_allclose compares NaN positions)
    np.testing.assert_allclose(out[:-1], expected[:-1], rtol=1e-6, atol=0)
    assert np.isnan(out[:5]).all() and np.isfinite(out[5]).all()
    np.testing.assert_array_equal(out[-1], np.zeros(3))  # torch: NaN; mha: zeros
    # the same along another axis (NumPy may reduce a strided axis in another order)
    np.testing.assert_allclose(softmax(x.T, axis=0), out.T, rtol=4 * np.finfo(dtype).eps, atol=0)


def test_softmax_over_an_empty_axis_is_empty() -> None:
    """No keys at all (S = 0): an empty distribution, not NumPy's reduction error."""
    out = softmax(np.zeros((2, 3, 0)))
    assert out.shape == (2, 3, 0)
    assert softmax(np.zeros((0, 4)), axis=0).shape == (0, 4)


# ----------------------------------------------------- scaled dot-product attention


def sdpa_mask(kind: str, rng: np.random.Generator, lead: tuple[int, ...], T: int, S: int):
    """A boolean mask (True = may attend) of the given kind, or None."""
    if kind == "none":
        return None
    if kind == "causal":
        # generalised to T != S: query i sees keys j <= i + (S - T), every row >= 1 key
        return np.tril(np.ones((T, S), dtype=bool), k=max(S - T, 0))
    if kind == "key_padding":
        keep = np.ones(lead + (1, S), dtype=bool)
        keep[..., 0, S // 2 + 1 :] = False
        return keep
    if kind == "random":
        mask = rng.random(lead + (T, S)) < 0.6
        mask[..., 0] = True  # at least one allowed key per row
        return mask
    raise AssertionError(kind)


@pytest.mark.parametrize("lead", [(), (2,), (2, 3)], ids=["rank2", "rank3", "rank4"])
@pytest.mark.parametrize(("T", "S"), [(4, 4), (3, 6), (6, 2)])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "key_padding", "random"])
@pytest.mark.parametrize("seed", [0, 1])
def test_sdpa_matches_torch_sdpa(lead, T, S, mask_kind, seed) -> None:
    rng = np.random.default_rng(seed)
    head_dim, value_dim = 5, 3
    q = rng.normal(size=lead + (T, head_dim))
    k = rng.normal(size=lead + (S, head_dim))
    v = rng.normal(size=lead + (S, value_dim))
    mask = sdpa_mask(mask_kind, rng, lead, T, S)

    context, weights = scaled_dot_product_attention(q, k, v, mask)

    torch_mask = None if mask is None else t(mask)
    expected = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=torch_mask)
    # With the identity as values, context == weights: PyTorch's weights, exactly.
    eye = np.broadcast_to(np.eye(S), lead + (S, S))
    expected_weights = F.scaled_dot_product_attention(t(q), t(k), t(eye), attn_mask=torch_mask)
    assert context.shape == lead + (T, value_dim)
    assert weights.shape == lead + (T, S)
    np.testing.assert_allclose(context, expected.numpy(), rtol=0, atol=ATOL64)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=ATOL64)


def test_sdpa_float32_matches_torch_and_stays_float32() -> None:
    rng = np.random.default_rng(3)
    q, k, v = (rng.normal(size=(2, 4, 8)).astype(np.float32) for _ in range(3))
    mask = causal_mask(4)
    context, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(mask))
    assert context.dtype == np.float32 and weights.dtype == np.float32
    np.testing.assert_allclose(context, expected.numpy(), rtol=0, atol=ATOL32)


def test_sdpa_scales_by_sqrt_head_dim() -> None:
    # Two keys whose scores differ by exactly sqrt(Dh): weights are softmax([1, 0]).
    head_dim = 16
    q = np.zeros((1, head_dim))
    q[0, 0] = 1.0
    k = np.zeros((2, head_dim))
    k[0, 0] = math.sqrt(head_dim)
    v = np.eye(2)
    _, weights = scaled_dot_product_attention(q, k, v)
    np.testing.assert_allclose(weights[0], softmax(np.array([1.0, 0.0])), rtol=0, atol=1e-15)


def test_sdpa_masked_weights_are_exactly_zero() -> None:
    rng = np.random.default_rng(4)
    q, k, v = (rng.normal(size=(5, 3)) for _ in range(3))
    mask = causal_mask(5)
    _, weights = scaled_dot_product_attention(q, k, v, mask)
    assert np.all(weights[~mask] == 0.0)
    assert np.all(weights[mask] > 0.0)


def test_fully_masked_row_gives_zeros_where_multihead_attention_gives_nan() -> None:
    """Documented difference: a query with no allowed key.

    mha returns zero weights and zero context for that row. ``nn.MultiheadAttention``
    called for its weights returns NaN there (it puts -inf in every score and divides
    0 by 0), and the NaN then spreads through the output projection to the whole token.
    (``F.scaled_dot_product_attention`` in torch 2.13 returns zeros, like mha; the three
    paths of ``nn.MultiheadAttention`` are pinned in test_modules.py.)
    """
    rng = np.random.default_rng(5)
    batch, length, d_model, num_heads = 2, 3, 4, 2
    x = rng.normal(size=(batch, length, d_model))
    params = AttentionParams.init(d_model, seed=0)
    lengths = np.array([3, 0])  # the second sequence has no real token at all
    mask = padding_mask(lengths, max_len=length)

    output, weights = multi_head_attention(x, x, x, params, num_heads, mask)
    assert np.all(np.isfinite(output)) and np.all(np.isfinite(weights))
    np.testing.assert_array_equal(weights[1], 0.0)
    steps = multi_head_attention_steps(x, x, x, params, num_heads, mask)
    np.testing.assert_array_equal(steps.context[1], 0.0)
    # zero context -> the output is just the output bias
    np.testing.assert_array_equal(output[1], np.broadcast_to(params.b_o, (length, d_model)))

    module = convert.params_to_torch(params, num_heads).eval()
    with torch.no_grad():
        torch_out, torch_weights = module(
            t(x), t(x), t(x),
            key_padding_mask=t(to_torch_key_padding_mask(mask)),
            average_attn_weights=False,
        )
    assert torch.isnan(torch_out[1]).all() and torch.isnan(torch_weights[1]).all()
    # the sequence with real keys is unaffected and agrees
    np.testing.assert_allclose(output[0], torch_out[0].numpy(), rtol=0, atol=ATOL64)

    q, k, v = (rng.normal(size=(3, 4)) for _ in range(3))
    row_mask = np.ones((3, 3), dtype=bool)
    row_mask[1] = False
    context, weights = scaled_dot_product_attention(q, k, v, row_mask)
    np.testing.assert_array_equal(weights[1], 0.0)
    np.testing.assert_array_equal(context[1], 0.0)
    expected = F.scaled_dot_product_attention(t(q), t(k), t(v), attn_mask=t(row_mask))
    np.testing.assert_allclose(context, expected.numpy(), rtol=0, atol=ATOL64)


def test_nan_in_a_query_propagates_and_is_not_turned_into_zeros() -> None:
    """A NaN query row has NaN weights, context and output (as in PyTorch); it is not
    mistaken for a row with nothing to attend to (whose output would be the finite b_o)."""
    rng = np.random.default_rng(6)
    batch, T, S, d_model, num_heads = 2, 3, 4, 8, 2
    params = AttentionParams.init(d_model, seed=1)
    params.b_o = rng.normal(size=d_model)
    query = rng.normal(size=(batch, T, d_model))
    query[0, 1, 3] = np.nan  # one feature of one query token
    source = rng.normal(size=(batch, S, d_model))
    mask = np.ones((batch, 1, T, S), dtype=bool)
    mask[:, :, :, 2] = False  # a blocked key in every row
    mask[0, :, 2, :] = False  # and a row with nothing to attend to

    module = convert.params_to_torch(params, num_heads).eval()
    for m in (None, mask):
        output, weights = multi_head_attention(query, source, source, params, num_heads, m)
        assert np.isnan(output[0, 1]).all() and np.isnan(weights[0, :, 1]).all()
        others = np.ones((batch, T), dtype=bool)
        others[0, 1] = False
        assert np.isfinite(output[others]).all()
        kwargs = {} if m is None else {"attn_mask": t(to_torch_attn_mask(m, num_heads))}
        with torch.no_grad():
            expected, _ = module(t(query), t(source), t(source), **kwargs)
        assert torch.isnan(expected[0, 1]).all()
        if m is not None:
            others[0, 2] = False  # nothing to attend to: NaN in torch, b_o in mha
            np.testing.assert_array_equal(output[0, 2], params.b_o)
        np.testing.assert_allclose(output[others], expected.numpy()[others], rtol=0, atol=ATOL64)
    # the row with nothing to attend to is still b_o, NaN query or not
    query[0, 2, 0] = np.nan
    output, weights = multi_head_attention(query, source, source, params, num_heads, mask)
    np.testing.assert_array_equal(output[0, 2], params.b_o)
    np.testing.assert_array_equal(weights[0, :, 2], 0.0)

    # scaled_dot_product_attention on its own, with and without a mask
    q, k, v = (rng.normal(size=(3, 4)) for _ in range(3))
    q[1, 0] = np.nan
    row_mask = np.tril(np.ones((3, 3), dtype=bool))
    for m in (None, row_mask):
        context, weights = scaled_dot_product_attention(q, k, v, m)
        assert np.isnan(context[1]).all() and np.isnan(weights[1]).all()
        assert np.isfinite(context[[0, 2]]).all()
        expected = F.scaled_dot_product_attention(
            t(q), t(k), t(v), attn_mask=None if m is None else t(m)
        )
        np.testing.assert_array_equal(np.isnan(context), torch.isnan(expected).numpy())


def test_no_keys_gives_zero_weights_and_zero_context() -> None:
    """S = 0: every query has nothing to attend to, so the book's rule applies."""
    rng = np.random.default_rng(7)
    q = rng.normal(size=(2, 3, 4))
    k = np.zeros((2, 0, 4))
    v = np.zeros((2, 0, 5))
    for m in (None, np.ones((3, 0), dtype=bool)):
        context, weights = scaled_dot_product_attention(q, k, v, m)
        assert weights.shape == (2, 3, 0)
        np.testing.assert_array_equal(context, np.zeros((2, 3, 5)))

    batch, T, d_model, num_heads = 2, 3, 8, 2
    params = AttentionParams.init(d_model, seed=2)
    params.b_o = rng.normal(size=d_model)
    query = rng.normal(size=(batch, T, d_model))
    source = np.zeros((batch, 0, d_model))
    for m in (None, np.ones((batch, 1, 1, 0), dtype=bool)):  # (B, 1, 1, S) padding mask
        output, weights = multi_head_attention(query, source, source, params, num_heads, m)
        assert weights.shape == (batch, num_heads, T, 0)
        np.testing.assert_array_equal(output, np.broadcast_to(params.b_o, (batch, T, d_model)))
        steps = multi_head_attention_steps(query, source, source, params, num_heads, m)
        assert steps.k_heads.shape == (batch, num_heads, 0, d_model // num_heads)
        np.testing.assert_array_equal(steps.context, np.zeros((batch, num_heads, T, 4)))
        np.testing.assert_array_equal(steps.output, output)
    # nn.MultiheadAttention agrees: its output is b_o as well
    with torch.no_grad():
        expected, expected_weights = convert.params_to_torch(params, num_heads)(
            t(query), t(source), t(source), average_attn_weights=False
        )
    assert expected_weights.shape == (batch, num_heads, T, 0)
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)


# ------------------------------------------------------------------ split / merge


def test_split_heads_gives_head_h_its_own_feature_slice() -> None:
    batch, length, num_heads, head_dim = 2, 3, 4, 5
    x = np.arange(batch * length * num_heads * head_dim, dtype=float)
    x = x.reshape(batch, length, num_heads * head_dim)
    heads = split_heads(x, num_heads)
    assert heads.shape == (batch, num_heads, length, head_dim)
    for h in range(num_heads):
        np.testing.assert_array_equal(heads[:, h], x[:, :, h * head_dim : (h + 1) * head_dim])


def test_merge_heads_inverts_split_heads() -> None:
    x = np.random.default_rng(6).normal(size=(2, 3, 12))
    for num_heads in (1, 2, 3, 4, 6, 12):
        np.testing.assert_array_equal(merge_heads(split_heads(x, num_heads)), x)
    heads = np.random.default_rng(7).normal(size=(2, 4, 3, 5))
    np.testing.assert_array_equal(split_heads(merge_heads(heads), 4), heads)


def test_split_heads_matches_torch_view_transpose() -> None:
    x = np.random.default_rng(8).normal(size=(2, 3, 8))
    expected = t(x).view(2, 3, 4, 2).transpose(1, 2).numpy()
    np.testing.assert_array_equal(split_heads(x, 4), expected)


# ------------------------------------------------------------- AttentionParams


def random_module(
    d_model: int, num_heads: int, seed: int, dtype=torch.float64, **kwargs
) -> nn.MultiheadAttention:
    """An nn.MultiheadAttention with random weights *and* random (non-zero) biases."""
    torch.manual_seed(seed)
    module = nn.MultiheadAttention(d_model, num_heads, batch_first=True, dtype=dtype, **kwargs)
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(-0.5, 0.5)
    return module.eval()


def test_init_is_seeded_xavier_uniform() -> None:
    d_model = 64
    a = AttentionParams.init(d_model, seed=3)
    b = AttentionParams.init(d_model, seed=3)
    c = AttentionParams.init(d_model, seed=4)
    np.testing.assert_array_equal(a.W_q, b.W_q)
    np.testing.assert_array_equal(a.W_o, b.W_o)
    assert not np.array_equal(a.W_q, c.W_q)
    assert not np.array_equal(a.W_q, a.W_k)  # each matrix drawn separately
    limit = math.sqrt(6 / (2 * d_model))
    for w in (a.W_q, a.W_k, a.W_v, a.W_o):
        assert w.shape == (d_model, d_model) and w.dtype == np.float64
        assert np.abs(w).max() <= limit
        # uniform(-a, a) has variance a^2 / 3 = 1 / d_model
        assert abs(w.var() * d_model - 1.0) < 0.1
    for b_ in (a.b_q, a.b_k, a.b_v, a.b_o):
        np.testing.assert_array_equal(b_, np.zeros(d_model))
    assert a.d_model == d_model and a.bias


def test_init_dtype_and_no_bias() -> None:
    p = AttentionParams.init(8, seed=0, dtype=np.float32, bias=False)
    assert p.W_q.dtype == np.float32 and p.W_o.dtype == np.float32
    assert p.b_q is None and p.b_o is None and not p.bias
    assert p.num_parameters == 4 * 8 * 8


def test_num_parameters_matches_torch() -> None:
    for d_model, num_heads in [(8, 2), (12, 3), (16, 16)]:
        module = nn.MultiheadAttention(d_model, num_heads)
        expected = sum(p.numel() for p in module.parameters())
        assert convert.params_from_torch(module).num_parameters == expected
        assert expected == 4 * d_model * d_model + 4 * d_model


def test_from_torch_transposes_and_slices_in_proj_weight() -> None:
    d_model = 6
    module = random_module(d_model, 2, seed=0)
    p = convert.params_from_torch(module)
    w = module.in_proj_weight.detach().numpy()
    b = module.in_proj_bias.detach().numpy()
    np.testing.assert_array_equal(p.W_q, w[:d_model].T)
    np.testing.assert_array_equal(p.W_k, w[d_model : 2 * d_model].T)
    np.testing.assert_array_equal(p.W_v, w[2 * d_model :].T)
    np.testing.assert_array_equal(p.b_v, b[2 * d_model :])
    np.testing.assert_array_equal(p.W_o, module.out_proj.weight.detach().numpy().T)
    np.testing.assert_array_equal(p.b_o, module.out_proj.bias.detach().numpy())
    # a copy, not a view: changing the module later does not change the params
    with torch.no_grad():
        module.in_proj_weight.zero_()
    assert np.any(p.W_q != 0)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("bias", [True, False])
def test_to_torch_round_trip(dtype, bias) -> None:
    rng = np.random.default_rng(9)
    p = AttentionParams.init(8, seed=1, dtype=dtype, bias=bias)
    if bias:
        p.b_q, p.b_k, p.b_v, p.b_o = (rng.normal(size=8).astype(dtype) for _ in range(4))
    module = convert.params_to_torch(p, 4)
    assert isinstance(module, nn.MultiheadAttention)
    assert module.batch_first and module.num_heads == 4
    assert module.in_proj_weight.dtype == torch.from_numpy(np.zeros(0, dtype)).dtype
    back = convert.params_from_torch(module)
    for field in dataclasses.fields(AttentionParams):
        original, copied = getattr(p, field.name), getattr(back, field.name)
        if original is None:
            assert copied is None
        else:
            np.testing.assert_array_equal(copied, original)


def test_from_torch_rejects_features_mha_does_not_have() -> None:
    with pytest.raises(ValueError, match="nn.MultiheadAttention"):
        convert.params_from_torch(nn.Linear(4, 4))
    with pytest.raises(ValueError, match="add_bias_kv"):
        convert.params_from_torch(nn.MultiheadAttention(4, 2, add_bias_kv=True))
    with pytest.raises(ValueError, match="add_zero_attn"):
        convert.params_from_torch(nn.MultiheadAttention(4, 2, add_zero_attn=True))


# --------------------------------------------------- multi-head attention vs PyTorch


def make_mask(kind: str, lengths: np.ndarray, T: int, S: int):
    """Our mask (True = may attend) and the matching nn.MultiheadAttention kwargs."""
    if kind == "none":
        return None, {}
    causal = causal_mask(T) if kind in ("causal", "both") else None
    padding = padding_mask(lengths, max_len=S) if kind in ("key_padding", "both") else None
    kwargs = {}
    if causal is not None:
        kwargs["attn_mask"] = t(to_torch_attn_mask(causal))
    if padding is not None:
        kwargs["key_padding_mask"] = t(to_torch_key_padding_mask(padding))
    return combine_masks(causal, padding), kwargs


CASES = [
    # (batch, T, S, d_model, num_heads, mask kinds): self-attention allows every mask,
    # cross-attention (S != T) has no causal order, so only padding
    (1, 5, 5, 8, 1, ["none", "causal", "key_padding", "both"]),
    (3, 5, 5, 8, 2, ["none", "causal", "key_padding", "both"]),
    (2, 4, 4, 12, 3, ["none", "causal", "key_padding", "both"]),
    (2, 6, 6, 16, 4, ["none", "causal", "key_padding", "both"]),
    (2, 3, 7, 8, 2, ["none", "key_padding"]),
    (3, 6, 2, 12, 4, ["none", "key_padding"]),
    (1, 1, 4, 6, 3, ["none", "key_padding"]),
]
MHA_PARAMS = [
    pytest.param(b, T, S, d, h, kind, id=f"B{b}-T{T}-S{S}-D{d}-H{h}-{kind}")
    for b, T, S, d, h, kinds in CASES
    for kind in kinds
]


@pytest.mark.parametrize(("batch", "T", "S", "d_model", "num_heads", "mask_kind"), MHA_PARAMS)
@pytest.mark.parametrize("seed", [0, 1])
def test_multi_head_attention_matches_nn_multihead_attention(
    batch, T, S, d_model, num_heads, mask_kind, seed
) -> None:
    rng = np.random.default_rng(seed)
    module = random_module(d_model, num_heads, seed)
    params = convert.params_from_torch(module)
    query = rng.normal(size=(batch, T, d_model))
    # self-attention passes one array three times; cross-attention a different source
    key = query if S == T else rng.normal(size=(batch, S, d_model))
    value = key
    mask, kwargs = make_mask(mask_kind, random_lengths(rng, batch, S), T, S)

    output, weights = multi_head_attention(query, key, value, params, num_heads, mask)

    with torch.no_grad():
        expected, expected_weights = module(
            t(query), t(key), t(value), average_attn_weights=False, **kwargs
        )
    assert output.shape == (batch, T, d_model)
    assert weights.shape == (batch, num_heads, T, S)
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=ATOL64)


def test_multi_head_attention_float32_matches_torch() -> None:
    rng = np.random.default_rng(10)
    module = random_module(16, 4, seed=2, dtype=torch.float32)
    params = convert.params_from_torch(module)
    x = rng.normal(size=(2, 5, 16)).astype(np.float32)
    mask, kwargs = make_mask("both", np.array([5, 3]), 5, 5)
    output, weights = multi_head_attention(x, x, x, params, 4, mask)
    with torch.no_grad():
        expected, expected_weights = module(t(x), t(x), t(x), average_attn_weights=False, **kwargs)
    assert output.dtype == np.float32
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL32)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=ATOL32)


def test_from_torch_ignores_batch_first() -> None:
    rng = np.random.default_rng(11)
    module = random_module(8, 2, seed=3)
    seq_first = nn.MultiheadAttention(8, 2, batch_first=False, dtype=torch.float64).eval()
    seq_first.load_state_dict(module.state_dict())
    params = convert.params_from_torch(seq_first)
    x = rng.normal(size=(2, 4, 8))
    with torch.no_grad():
        # (B, T, D) -> (T, B, D) for the sequence-first module, and back
        expected = seq_first(*(t(x).transpose(0, 1),) * 3)[0].transpose(0, 1)
    output, _ = multi_head_attention(x, x, x, params, 2)
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)


def test_kdim_vdim_and_no_bias_match_torch() -> None:
    rng = np.random.default_rng(12)
    module = random_module(8, 2, seed=4, kdim=5, vdim=3, bias=False)
    params = convert.params_from_torch(module)
    assert params.W_k.shape == (5, 8) and params.W_v.shape == (3, 8) and params.b_q is None
    query = rng.normal(size=(2, 4, 8))
    key = rng.normal(size=(2, 6, 5))
    value = rng.normal(size=(2, 6, 3))
    output, weights = multi_head_attention(query, key, value, params, 2)
    with torch.no_grad():
        expected, expected_weights = module(
            t(query), t(key), t(value), average_attn_weights=False
        )
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=ATOL64)
    # and back: to_torch rebuilds the separate projections
    again = convert.params_to_torch(params, 2).eval()
    assert again.kdim == 5 and again.vdim == 3 and again.in_proj_weight is None
    with torch.no_grad():
        np.testing.assert_array_equal(again(t(query), t(key), t(value))[0], expected)


def test_to_torch_module_reproduces_numpy() -> None:
    rng = np.random.default_rng(13)
    params = AttentionParams.init(12, seed=5)
    params.b_q, params.b_k, params.b_v, params.b_o = (rng.normal(size=12) for _ in range(4))
    x = rng.normal(size=(2, 4, 12))
    output, weights = multi_head_attention(x, x, x, params, 3)
    with torch.no_grad():
        expected, expected_weights = convert.params_to_torch(params, 3)(
            t(x), t(x), t(x), average_attn_weights=False
        )
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=ATOL64)


def test_multi_head_attention_matches_sdpa_based_computation() -> None:
    """Project and split with torch, attend with F.scaled_dot_product_attention."""
    rng = np.random.default_rng(14)
    batch, T, S, d_model, num_heads = 2, 3, 5, 8, 4
    head_dim = d_model // num_heads
    params = AttentionParams.init(d_model, seed=6)
    params.b_k = rng.normal(size=d_model)
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    mask = padding_mask([5, 2])

    def heads(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> torch.Tensor:
        y = t(x) @ t(w) + t(b)  # (B, L, D) @ (D, D) -> (B, L, D)
        return y.view(batch, -1, num_heads, head_dim).transpose(1, 2)  # -> (B, H, L, Dh)

    context = F.scaled_dot_product_attention(
        heads(query, params.W_q, params.b_q),
        heads(source, params.W_k, params.b_k),
        heads(source, params.W_v, params.b_v),
        attn_mask=t(mask),
    )
    merged = context.transpose(1, 2).reshape(batch, T, d_model)  # (B, H, T, Dh) -> (B, T, D)
    expected = merged @ t(params.W_o) + t(params.b_o)
    output, _ = multi_head_attention(query, source, source, params, num_heads, mask)
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=ATOL64)


# ---------------------------------------------------------------- every intermediate


def test_steps_fields_in_documented_order() -> None:
    names = [f.name for f in dataclasses.fields(AttentionSteps)]
    assert names == [
        "q", "k", "v", "q_heads", "k_heads", "v_heads", "scores", "scaled", "masked",
        "weights", "context", "merged", "output",
    ]  # fmt: skip


def test_steps_are_consistent_and_frozen() -> None:
    rng = np.random.default_rng(15)
    batch, T, S, d_model, num_heads = 2, 4, 6, 8, 2
    head_dim = d_model // num_heads
    params = AttentionParams.init(d_model, seed=7)
    params.b_q, params.b_k, params.b_v, params.b_o = (rng.normal(size=d_model) for _ in range(4))
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    mask = padding_mask([6, 3])
    s = multi_head_attention_steps(query, source, source, params, num_heads, mask)

    # Each step is checked against its formula. Exact where the formula is evaluated
    # the same way as in mha (same operands, same shapes); a tolerance where mha
    # computes it on another layout.
    np.testing.assert_array_equal(s.q, query @ params.W_q + params.b_q)
    np.testing.assert_array_equal(s.k, source @ params.W_k + params.b_k)
    np.testing.assert_array_equal(s.v, source @ params.W_v + params.b_v)
    assert s.q_heads.shape == (batch, num_heads, T, head_dim)
    assert s.k_heads.shape == s.v_heads.shape == (batch, num_heads, S, head_dim)
    np.testing.assert_array_equal(s.k_heads[:, 1], s.k[:, :, head_dim:])
    np.testing.assert_allclose(
        s.scores, np.einsum("bhtd,bhsd->bhts", s.q_heads, s.k_heads), rtol=0, atol=ATOL64
    )
    np.testing.assert_array_equal(s.scaled, s.scores / math.sqrt(head_dim))
    full_mask = np.broadcast_to(mask, s.scores.shape)
    assert np.all(np.isneginf(s.masked[~full_mask]))
    np.testing.assert_array_equal(s.masked[full_mask], s.scaled[full_mask])
    np.testing.assert_array_equal(s.weights, softmax(s.masked))
    # mha multiplies a contiguous copy of the value heads (np.repeat), not this view
    assert_matmul_close(s.context, s.weights, s.v_heads)
    np.testing.assert_array_equal(s.merged[:, :, :head_dim], s.context[:, 0])
    np.testing.assert_array_equal(s.output, s.merged @ params.W_o + params.b_o)

    output, weights = multi_head_attention(query, source, source, params, num_heads, mask)
    np.testing.assert_array_equal(output, s.output)  # the same computation, repeated
    np.testing.assert_array_equal(weights, s.weights)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.output = output  # type: ignore[misc]


def test_steps_without_mask_leave_scaled_unchanged() -> None:
    x = np.random.default_rng(16).normal(size=(1, 3, 4))
    s = multi_head_attention_steps(x, x, x, AttentionParams.init(4), 2)
    np.testing.assert_array_equal(s.masked, s.scaled)
