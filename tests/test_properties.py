"""Properties of attention that hold for every input (hypothesis picks the shapes).

Hypothesis draws the sizes and a seed; the numbers come from a seeded NumPy
generator, so a failure is reproducible from the printed example.
"""

from __future__ import annotations

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha import (
    AttentionParams,
    causal_mask,
    combine_masks,
    convert,
    from_additive_mask,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    merge_heads,
    multi_head_attention,
    padding_mask,
    scaled_dot_product_attention,
    softmax,
    split_heads,
    to_additive_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)

# Fast and side-effect free: no example database written into the repository.
FAST = settings(max_examples=30, deadline=None, database=None)
TOL = 1e-12


@st.composite
def layers(draw, max_len: int = 6):
    """(rng, batch, T, S, num_heads, d_model, params with non-zero biases)."""
    seed = draw(st.integers(0, 2**32 - 1))
    batch = draw(st.integers(1, 3))
    target_len = draw(st.integers(1, max_len))
    source_len = draw(st.integers(1, max_len))
    num_heads = draw(st.integers(1, 4))
    head_dim = draw(st.integers(1, 4))
    d_model = num_heads * head_dim
    rng = np.random.default_rng(seed)
    params = AttentionParams.init(d_model, seed=seed)
    # non-zero biases, so that a bias applied in the wrong place shows up
    params.b_q, params.b_k, params.b_v, params.b_o = (rng.normal(size=d_model) for _ in range(4))
    return rng, batch, target_len, source_len, num_heads, d_model, params


def random_lengths(rng: np.random.Generator, batch: int, size: int) -> np.ndarray:
    return rng.integers(1, size + 1, size=batch)


@FAST
@given(layers(), st.floats(0.0, 1.0))
def test_weight_rows_sum_to_one_and_blocked_weights_are_exactly_zero(layer, keep) -> None:
    rng, batch, T, S, num_heads, _, _ = layer
    head_dim = 3
    q = rng.normal(size=(batch, num_heads, T, head_dim)) * 3
    k = rng.normal(size=(batch, num_heads, S, head_dim)) * 3
    v = rng.normal(size=(batch, num_heads, S, 2))
    mask = rng.random((batch, num_heads, T, S)) < keep  # rows with no allowed key included
    context, weights = scaled_dot_product_attention(q, k, v, mask)

    assert np.all(np.isfinite(weights)) and np.all(np.isfinite(context))
    assert np.all(weights[~mask] == 0.0)
    assert np.all(weights >= 0.0)
    has_key = mask.any(axis=-1)
    np.testing.assert_allclose(weights.sum(axis=-1)[has_key], 1.0, rtol=0, atol=TOL)
    assert np.all(weights[~has_key] == 0.0) and np.all(context[~has_key] == 0.0)


@FAST
@given(layers())
def test_all_true_mask_is_the_same_as_no_mask(layer) -> None:
    rng, batch, T, S, num_heads, d_model, params = layer
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    everything = np.ones((T, S), dtype=bool)
    with_mask = multi_head_attention(query, source, source, params, num_heads, everything)
    without = multi_head_attention(query, source, source, params, num_heads)
    # exact: an all-True mask leaves every score as it is, the rest is the same computation
    np.testing.assert_array_equal(with_mask[0], without[0])
    np.testing.assert_array_equal(with_mask[1], without[1])


@FAST
@given(layers(), st.data())
def test_causal_future_tokens_do_not_change_the_past(layer, data) -> None:
    rng, batch, T, _, num_heads, d_model, params = layer
    t = data.draw(st.integers(0, T - 1), label="t")
    x = rng.normal(size=(batch, T, d_model))
    changed = x.copy()
    changed[:, t + 1 :] = rng.normal(size=changed[:, t + 1 :].shape) * 10
    mask = causal_mask(T)
    before, weights = multi_head_attention(x, x, x, params, num_heads, mask)
    after, _ = multi_head_attention(changed, changed, changed, params, num_heads, mask)
    np.testing.assert_allclose(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=TOL)
    assert np.all(weights[..., ~mask] == 0.0)  # (B, H, T, T)[..., future] is exactly 0


@FAST
@given(layers())
def test_padding_tokens_do_not_change_real_tokens(layer) -> None:
    rng, batch, T, _, num_heads, d_model, params = layer
    lengths = random_lengths(rng, batch, T)
    mask = padding_mask(lengths, max_len=T)
    real = mask[:, 0, 0, :]  # (B, T): True at real tokens
    x = rng.normal(size=(batch, T, d_model))
    changed = np.where(real[..., None], x, rng.normal(size=x.shape) * 10)
    before, _ = multi_head_attention(x, x, x, params, num_heads, mask)
    after, _ = multi_head_attention(changed, changed, changed, params, num_heads, mask)
    np.testing.assert_allclose(after[real], before[real], rtol=0, atol=TOL)


@FAST
@given(layers())
def test_padding_in_the_source_does_not_change_cross_attention(layer) -> None:
    rng, batch, T, S, num_heads, d_model, params = layer
    lengths = random_lengths(rng, batch, S)
    mask = padding_mask(lengths, max_len=S)
    real = mask[:, 0, 0, :]  # (B, S)
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    changed = np.where(real[..., None], source, rng.normal(size=source.shape) * 10)
    before, _ = multi_head_attention(query, source, source, params, num_heads, mask)
    after, _ = multi_head_attention(query, changed, changed, params, num_heads, mask)
    np.testing.assert_allclose(after, before, rtol=0, atol=TOL)


@FAST
@given(layers())
def test_self_attention_without_mask_is_permutation_equivariant(layer) -> None:
    rng, batch, T, _, num_heads, d_model, params = layer
    x = rng.normal(size=(batch, T, d_model))
    perm = rng.permutation(T)
    output, weights = multi_head_attention(x, x, x, params, num_heads)
    shuffled = x[:, perm]
    output_p, weights_p = multi_head_attention(shuffled, shuffled, shuffled, params, num_heads)
    np.testing.assert_allclose(output_p, output[:, perm], rtol=0, atol=TOL)
    np.testing.assert_allclose(weights_p, weights[:, :, perm][:, :, :, perm], rtol=0, atol=TOL)


@FAST
@given(layers())
def test_heads_are_single_head_attentions_on_weight_slices(layer) -> None:
    """The "logical split": head h is ordinary attention with columns h*Dh:(h+1)*Dh
    of W_q, W_k, W_v; concatenating the heads and applying W_o gives the layer."""
    rng, batch, T, S, num_heads, d_model, params = layer
    head_dim = d_model // num_heads
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    mask = padding_mask(random_lengths(rng, batch, S), max_len=S)[:, 0]  # (B, 1, S)

    heads = []
    for h in range(num_heads):
        cols = slice(h * head_dim, (h + 1) * head_dim)
        q = query @ params.W_q[:, cols] + params.b_q[cols]  # (B, T, D) @ (D, Dh) -> (B, T, Dh)
        k = source @ params.W_k[:, cols] + params.b_k[cols]  # (B, S, D) @ (D, Dh) -> (B, S, Dh)
        v = source @ params.W_v[:, cols] + params.b_v[cols]  # (B, S, D) @ (D, Dh) -> (B, S, Dh)
        heads.append(scaled_dot_product_attention(q, k, v, mask)[0])
    concatenated = np.concatenate(heads, axis=-1)  # H x (B, T, Dh) -> (B, T, D)
    expected = concatenated @ params.W_o + params.b_o  # (B, T, D) @ (D, D) -> (B, T, D)

    output, _ = multi_head_attention(query, source, source, params, num_heads, mask[:, None])
    np.testing.assert_allclose(output, expected, rtol=0, atol=TOL)


@FAST
@given(st.integers(1, 24))
def test_parameter_count_does_not_depend_on_num_heads(d_model) -> None:
    params = AttentionParams.init(d_model)
    assert params.num_parameters == 4 * d_model * d_model + 4 * d_model
    for num_heads in (h for h in range(1, d_model + 1) if d_model % h == 0):
        module = convert.params_to_torch(params, num_heads)
        assert sum(p.numel() for p in module.parameters()) == params.num_parameters


@FAST
@given(st.integers(0, 2**32 - 1), st.floats(-1e4, 1e4))
def test_softmax_is_shift_invariant_and_a_distribution(seed, shift) -> None:
    x = np.random.default_rng(seed).normal(size=(3, 5)) * 20
    out = softmax(x)
    np.testing.assert_allclose(softmax(x + shift), out, rtol=0, atol=1e-12)
    np.testing.assert_allclose(out.sum(axis=-1), 1.0, rtol=0, atol=TOL)
    assert np.all(out >= 0)
    # larger score -> no smaller weight (not "larger": rounding can tie two weights)
    by_score = np.take_along_axis(out, np.argsort(x, axis=-1), axis=-1)
    assert np.all(np.diff(by_score, axis=-1) >= 0)


@FAST
@given(layers())
def test_split_heads_and_merge_heads_are_inverse(layer) -> None:
    rng, batch, T, _, num_heads, d_model, _ = layer
    x = rng.normal(size=(batch, T, d_model))
    heads = split_heads(x, num_heads)
    assert heads.shape == (batch, num_heads, T, d_model // num_heads)
    np.testing.assert_array_equal(merge_heads(heads), x)


@FAST
@given(st.integers(0, 2**32 - 1), st.integers(1, 3), st.integers(1, 3), st.integers(1, 4))
def test_mask_converters_round_trip(seed, batch, num_heads, size) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, size + 1, size=batch)
    padding = padding_mask(lengths, max_len=size)
    kpm = to_torch_key_padding_mask(padding)
    np.testing.assert_array_equal(kpm, np.arange(size)[None, :] >= lengths[:, None])
    np.testing.assert_array_equal(from_torch_key_padding_mask(kpm), padding)

    square = rng.random((size, size + 1)) < 0.5
    np.testing.assert_array_equal(from_torch_attn_mask(to_torch_attn_mask(square)), square)
    per_head = rng.random((batch, num_heads, size, size)) < 0.5
    flat = to_torch_attn_mask(per_head, num_heads=num_heads)
    np.testing.assert_array_equal(from_torch_attn_mask(flat, num_heads=num_heads), per_head)
    np.testing.assert_array_equal(from_additive_mask(to_additive_mask(per_head)), per_head)

    both = combine_masks(causal_mask(size), padding)
    expected = causal_mask(size)[None, None] & padding
    np.testing.assert_array_equal(both, expected)


@FAST
@given(layers())
def test_key_padding_mask_agrees_with_nn_multihead_attention(layer) -> None:
    """Our True = may attend, converted, means the same to PyTorch (True = blocked)."""
    rng, batch, T, S, num_heads, d_model, params = layer
    query = rng.normal(size=(batch, T, d_model))
    source = rng.normal(size=(batch, S, d_model))
    mask = padding_mask(random_lengths(rng, batch, S), max_len=S)
    output, weights = multi_head_attention(query, source, source, params, num_heads, mask)
    module = convert.params_to_torch(params, num_heads).eval()
    with torch.no_grad():
        expected, expected_weights = module(
            torch.from_numpy(query),
            torch.from_numpy(source),
            torch.from_numpy(source),
            key_padding_mask=torch.from_numpy(to_torch_key_padding_mask(mask)),
            average_attn_weights=False,
        )
    np.testing.assert_allclose(output, expected.numpy(), rtol=0, atol=1e-10)
    np.testing.assert_allclose(weights, expected_weights.numpy(), rtol=0, atol=1e-10)
    assert np.all(weights[~np.broadcast_to(mask, weights.shape)] == 0.0)
