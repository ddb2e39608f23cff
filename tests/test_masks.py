"""mha.masks: the masks themselves, and that the converters mean what PyTorch means.

Masks are booleans and additive masks hold only 0 and the fill value (-inf, -1e9):
exact comparisons throughout. Attention outputs of the two implementations are
compared with a tolerance (``assert_same``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from mha import (
    AttentionParams,
    causal_mask,
    combine_masks,
    convert,
    from_additive_mask,
    from_torch_attn_mask,
    from_torch_key_padding_mask,
    multi_head_attention,
    padding_mask,
    to_additive_mask,
    to_torch_attn_mask,
    to_torch_key_padding_mask,
)

# Outputs of magnitude <= 4 in float64 (one ulp: 9e-16) agree to about 1e-15; a mask
# misread moves them by far more. 1e-10 lies well between the two.
ATOL64 = 1e-10


def t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.array(a, order="C"))


def test_causal_mask() -> None:
    expected = np.array(
        [
            [True, False, False],
            [True, True, False],
            [True, True, True],
        ]
    )
    np.testing.assert_array_equal(causal_mask(3), expected)
    assert causal_mask(1).tolist() == [[True]]
    assert causal_mask(5).dtype == np.bool_


@pytest.mark.parametrize(("size", "num_keys"), [(1, 1), (1, 4), (3, 3), (2, 5), (4, 7), (5, 6)])
def test_causal_mask_with_more_keys_is_aligned_to_the_bottom_right(
    size: int, num_keys: int
) -> None:
    """The queries are the last T of S positions (after a KV cache of S - T): query t
    sits at position S - T + t and may attend to keys 0 .. S - T + t, no later one. The
    top-left alignment of PyTorch's ``is_causal`` would hide keys a query must see."""
    mask = causal_mask(size, num_keys=num_keys)
    offset = num_keys - size  # positions already cached before the first query
    expected = np.array(
        [[key <= offset + query for key in range(num_keys)] for query in range(size)]
    )  # (T, S), by the definition
    assert mask.shape == (size, num_keys) and mask.dtype == np.bool_
    np.testing.assert_array_equal(mask, expected)
    # The same rows as the whole sequence's mask: its last T.
    np.testing.assert_array_equal(mask, causal_mask(num_keys)[offset:])
    assert mask[-1].all()  # the newest query sees every key, itself included


def test_causal_mask_is_the_inverse_of_torch_square_subsequent_mask() -> None:
    # PyTorch's helper gives an additive mask: 0 on/below the diagonal, -inf above.
    additive = nn.Transformer.generate_square_subsequent_mask(6, dtype=torch.float64)
    np.testing.assert_array_equal(from_additive_mask(additive.numpy()), causal_mask(6))
    np.testing.assert_array_equal(to_additive_mask(causal_mask(6)), additive.numpy())


def test_padding_mask_from_lengths() -> None:
    mask = padding_mask([3, 1, 0], max_len=4)
    assert mask.shape == (3, 1, 1, 4) and mask.dtype == np.bool_
    np.testing.assert_array_equal(
        mask[:, 0, 0],
        [[True, True, True, False], [True, False, False, False], [False] * 4],
    )
    # max_len defaults to the longest sequence
    assert padding_mask(np.array([2, 5])).shape == (2, 1, 1, 5)


def test_padding_mask_from_tokens_agrees_with_lengths() -> None:
    tokens = np.array([[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [1, 2, 3, 4, 9]])
    mask = padding_mask(tokens=tokens, pad_id=0)
    np.testing.assert_array_equal(mask, padding_mask([3, 1, 5]))
    # pad_id is a value, not always 0
    np.testing.assert_array_equal(
        padding_mask(tokens=np.array([[4, 4, 9]]), pad_id=9)[0, 0, 0], [True, True, False]
    )


def test_padding_mask_broadcasts_over_heads_and_queries() -> None:
    scores = np.zeros((2, 4, 3, 5))  # (B, H, T, S)
    mask = np.broadcast_to(padding_mask([5, 2]), scores.shape)
    assert mask[1, 3, 2].tolist() == [True, True, False, False, False]
    assert mask[0].all()


def test_combine_masks_is_logical_and_with_broadcasting() -> None:
    causal = causal_mask(4)
    padding = padding_mask([4, 2])
    both = combine_masks(causal, None, padding)
    assert both.shape == (2, 1, 4, 4)
    np.testing.assert_array_equal(both[0, 0], causal)
    np.testing.assert_array_equal(both[1, 0], causal & np.array([True, True, False, False]))
    assert combine_masks() is None and combine_masks(None, None) is None
    np.testing.assert_array_equal(combine_masks(causal), causal)
    # the inputs are not modified in place
    np.testing.assert_array_equal(causal, causal_mask(4))


def test_key_padding_converters_round_trip_and_flip() -> None:
    ours = padding_mask([3, 1], max_len=4)
    theirs = to_torch_key_padding_mask(ours)
    assert theirs.shape == (2, 4)
    np.testing.assert_array_equal(theirs, [[False, False, False, True], [False, True, True, True]])
    np.testing.assert_array_equal(from_torch_key_padding_mask(theirs), ours)
    # accepts a torch tensor too
    np.testing.assert_array_equal(from_torch_key_padding_mask(torch.from_numpy(theirs)), ours)


def test_attn_mask_converters_round_trip() -> None:
    causal = causal_mask(4)
    np.testing.assert_array_equal(to_torch_attn_mask(causal), ~causal)
    np.testing.assert_array_equal(from_torch_attn_mask(to_torch_attn_mask(causal)), causal)
    rng = np.random.default_rng(0)
    per_head = rng.random((2, 3, 4, 5)) < 0.5
    flat = to_torch_attn_mask(per_head, num_heads=3)
    assert flat.shape == (6, 4, 5)
    np.testing.assert_array_equal(flat[1 * 3 + 2], ~per_head[1, 2])  # batch-major order
    np.testing.assert_array_equal(from_torch_attn_mask(flat, num_heads=3), per_head)
    # a mask shared by all heads is repeated for each
    combined = combine_masks(causal, padding_mask([4, 2]))  # (2, 1, 4, 4)
    np.testing.assert_array_equal(to_torch_attn_mask(combined, num_heads=2)[3], ~combined[1, 0])


def test_additive_converters_round_trip() -> None:
    mask = np.random.default_rng(1).random((2, 3, 4)) < 0.5
    additive = to_additive_mask(mask)
    assert additive.dtype == np.float64
    assert np.all(additive[mask] == 0) and np.all(np.isneginf(additive[~mask]))
    np.testing.assert_array_equal(from_additive_mask(additive), mask)
    finite = to_additive_mask(mask, dtype=np.float32, fill=-1e9)
    assert finite.dtype == np.float32 and finite.min() == np.float32(-1e9)
    np.testing.assert_array_equal(from_additive_mask(finite), mask)
    # any negative entry blocks, -0.0 counts as 0 (allowed)
    np.testing.assert_array_equal(
        from_additive_mask(np.array([0.0, -0.0, -0.5, -1e9, -np.inf])),
        [True, True, False, False, False],
    )


# ---------------------------------------- the converters agree with nn.MultiheadAttention


@pytest.fixture
def setup():
    rng = np.random.default_rng(2)
    batch, length, d_model, num_heads = 3, 5, 8, 2
    params = AttentionParams.init(d_model, seed=1)
    params.b_q, params.b_k, params.b_v, params.b_o = (rng.normal(size=d_model) for _ in range(4))
    module = convert.params_to_torch(params, num_heads).eval()
    x = rng.normal(size=(batch, length, d_model))
    return params, module, x, num_heads


def run_torch(module: nn.MultiheadAttention, x: np.ndarray, **kwargs):
    with torch.no_grad():
        out, weights = module(t(x), t(x), t(x), average_attn_weights=False, **kwargs)
    return out.numpy(), weights.numpy()


def assert_same(ours, theirs) -> None:
    for a, b in zip(ours, theirs, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=ATOL64)


def test_key_padding_mask_means_the_same_in_torch(setup) -> None:
    params, module, x, num_heads = setup
    mask = padding_mask([5, 2, 4])
    ours = multi_head_attention(x, x, x, params, num_heads, mask)
    theirs = run_torch(module, x, key_padding_mask=t(to_torch_key_padding_mask(mask)))
    assert_same(ours, theirs)
    # torch also blocks the padded keys: exp(-inf) is exactly 0
    assert np.all(theirs[1][1, :, :, 2:] == 0)
    # and the inverse: a torch key_padding_mask read back gives the same result
    kpm = np.array([[False] * 5, [False, False, True, True, True], [False] * 4 + [True]])
    ours = multi_head_attention(x, x, x, params, num_heads, from_torch_key_padding_mask(kpm))
    assert_same(ours, run_torch(module, x, key_padding_mask=t(kpm)))


def test_attn_mask_means_the_same_in_torch(setup) -> None:
    params, module, x, num_heads = setup
    causal = causal_mask(5)
    ours = multi_head_attention(x, x, x, params, num_heads, causal)
    assert_same(ours, run_torch(module, x, attn_mask=t(to_torch_attn_mask(causal))))
    # additive float attn_mask: same result as the boolean one
    assert_same(ours, run_torch(module, x, attn_mask=t(to_additive_mask(causal))))


def test_per_head_mask_means_the_same_in_torch(setup) -> None:
    params, module, x, num_heads = setup
    rng = np.random.default_rng(3)
    mask = rng.random((3, num_heads, 5, 5)) < 0.6
    mask[..., 0] = True  # no fully-masked rows: torch would give NaN there
    ours = multi_head_attention(x, x, x, params, num_heads, mask)
    theirs = run_torch(module, x, attn_mask=t(to_torch_attn_mask(mask, num_heads=num_heads)))
    assert_same(ours, theirs)


def test_combined_mask_means_the_same_in_torch(setup) -> None:
    params, module, x, num_heads = setup
    causal, padding = causal_mask(5), padding_mask([5, 3, 1])
    ours = multi_head_attention(x, x, x, params, num_heads, combine_masks(causal, padding))
    theirs = run_torch(
        module,
        x,
        attn_mask=t(to_torch_attn_mask(causal)),
        key_padding_mask=t(to_torch_key_padding_mask(padding)),
    )
    assert_same(ours, theirs)
    # the same combination passed to torch as one (B*H, T, S) mask
    merged = to_torch_attn_mask(combine_masks(causal, padding), num_heads=num_heads)
    assert_same(ours, run_torch(module, x, attn_mask=t(merged)))
