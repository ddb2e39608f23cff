"""RoPE and ALiBi: the specification, its torch twins, the additive ``bias`` of attention,
and the Transformer's ``position_scheme`` option (with the KV cache, checkpoints, training).

Oracles: the formulas written out with ``math`` entry by entry, the sinusoidal table
(RoPE's angles are its angles), the half-split RoPE convention written here (equal up to
a fixed permutation), ALiBi's reference formulation ``slope * j`` (equal after the
softmax), and ``F.scaled_dot_product_attention`` with a float ``attn_mask``.
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from numerics import EPS64, assert_same_greedy_tokens

import mha
from mha import convert
from mha.kv_cache_torch import KVCache
from mha.modules import MultiHeadAttention
from mha.positional_torch import alibi_bias as torch_alibi_bias
from mha.positional_torch import alibi_bias_directional
from mha.positional_torch import alibi_slopes as torch_alibi_slopes
from mha.positional_torch import apply_rope as torch_apply_rope
from mha.transformer import POSITION_SCHEMES, Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
CLOSE = {"rtol": 1e-12, "atol": 1e-12}


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def half_split_rope(x: np.ndarray, positions: np.ndarray, base: float = 10000.0) -> np.ndarray:
    """The other convention, written here: dimension i turns together with i + Dh/2."""
    half = x.shape[-1] // 2
    theta = base ** (-2.0 * np.arange(half) / x.shape[-1])  # (Dh/2,)
    angle = positions[:, None] * theta  # (L, Dh/2)
    first, second = x[..., :half], x[..., half:]
    return np.concatenate(
        [first * np.cos(angle) - second * np.sin(angle),
         first * np.sin(angle) + second * np.cos(angle)], axis=-1,
    )  # fmt: skip


# ============================================================== RoPE, specification


@pytest.mark.parametrize("base", [10000.0, 100.0])
def test_rope_matches_the_formula_entry_by_entry(base):
    x = rng(1).normal(size=(2, 5, 6))  # (B, L, Dh)
    positions = np.array([0, 1, 2, 7, 30])
    got = mha.apply_rope(x, positions, base=base)
    for b in range(2):
        for t, m in enumerate(positions):
            for i in range(3):
                angle = m * base ** (-2 * i / 6)
                a, c = x[b, t, 2 * i], x[b, t, 2 * i + 1]
                assert got[b, t, 2 * i] == pytest.approx(
                    a * math.cos(angle) - c * math.sin(angle), abs=1e-12
                )
                assert got[b, t, 2 * i + 1] == pytest.approx(
                    a * math.sin(angle) + c * math.cos(angle), abs=1e-12
                )


@pytest.mark.parametrize("head_dim", [2, 8, 16])
def test_rope_angles_are_those_of_the_sinusoidal_table(head_dim):
    """Turning (1, 0) in every pair gives (cos, sin) of each pair's angle: the table's
    (sin, cos) columns, swapped."""
    length = 40
    unit = np.tile([1.0, 0.0], head_dim // 2)  # (Dh,)
    rotated = mha.apply_rope(np.broadcast_to(unit, (length, head_dim)), np.arange(length))
    table = mha.sinusoidal_positional_encoding(length, head_dim)
    np.testing.assert_allclose(rotated[:, 0::2], table[:, 1::2], **CLOSE)  # cos
    np.testing.assert_allclose(rotated[:, 1::2], table[:, 0::2], **CLOSE)  # sin


def test_rope_scores_depend_only_on_the_offset():
    """q at position m, k at position n: the score is that of q at m - n and k at 0."""
    q, k = rng(2).normal(size=(2, 16))
    pairs = [(m, n) for m in range(0, 60, 7) for n in range(0, 60, 5)]
    for m, n in pairs:
        score = mha.apply_rope(q[None], [m]) @ mha.apply_rope(k[None], [n]).T
        relative = mha.apply_rope(q[None], [m - n]) @ k
        shifted = mha.apply_rope(q[None], [m + 100]) @ mha.apply_rope(k[None], [n + 100]).T
        np.testing.assert_allclose(score.item(), relative.item(), **CLOSE)
        np.testing.assert_allclose(score.item(), shifted.item(), **CLOSE)
    # ...and it does depend on the offset: otherwise RoPE would say nothing.
    assert abs((mha.apply_rope(q[None], [3]) @ k).item() - (q @ k)) > 1e-3


def test_rope_keeps_norms_and_position_zero_is_the_identity():
    x = rng(3).normal(size=(3, 4, 9, 8))  # (B, H, L, Dh)
    rotated = mha.apply_rope(x, np.arange(0, 900, 100))
    np.testing.assert_allclose(
        np.linalg.norm(rotated, axis=-1), np.linalg.norm(x, axis=-1), **CLOSE
    )
    # exact: at position 0, cos = 1 and sin = 0 leave every component as it is
    np.testing.assert_array_equal(mha.apply_rope(x, np.zeros(9, dtype=int)), x)
    assert not np.allclose(rotated[..., 1:, :], x[..., 1:, :])


def test_rope_positions_broadcast_and_one_position_at_a_time():
    x = rng(4).normal(size=(2, 3, 6, 4))  # (B, H, L, Dh)
    whole = mha.apply_rope(x, np.arange(6))
    # The same angles, but NumPy's sin and cos (each within a few ulps) may take
    # another SIMD path for a slice than for the whole array.
    close = {"rtol": 0, "atol": 16 * EPS64 * np.abs(x).max()}
    for t in range(6):  # decoding: the new position alone, at its absolute position
        one = mha.apply_rope(x[:, :, t : t + 1], [t])  # (B, H, 1, Dh)
        np.testing.assert_allclose(one, whole[:, :, t : t + 1], **close)
    per_row = np.array([[[0, 1, 2, 3, 4, 5]], [[3, 4, 5, 6, 7, 8]]])  # (B, 1, L)
    got = mha.apply_rope(x, per_row)
    np.testing.assert_allclose(got[0], whole[0], **close)
    np.testing.assert_allclose(got[1], mha.apply_rope(x[1], np.arange(3, 9)), **close)


def test_rope_keeps_the_dtype():
    x = rng(5).normal(size=(3, 4)).astype(np.float32)
    assert mha.apply_rope(x, np.arange(3)).dtype == np.float32
    assert mha.apply_rope(np.ones((2, 2), dtype=int), [0, 1]).dtype == np.float64


def test_half_split_convention_is_the_same_up_to_a_permutation():
    """Pairing i with i + Dh/2 (GPT-NeoX, LLaMA in transformers) is RoPE on reordered
    dimensions: the same rotations, and since q and k are reordered alike, the same
    scores."""
    head_dim, length = 8, 7
    perm = mha.rope_permutation(head_dim)
    q, k = rng(6).normal(size=(2, 2, length, head_dim))  # (B=2, L, Dh) each
    positions = np.arange(length)
    np.testing.assert_allclose(
        half_split_rope(q, positions)[..., perm], mha.apply_rope(q[..., perm], positions), **CLOSE
    )
    theirs = half_split_rope(q, positions) @ np.swapaxes(half_split_rope(k, positions), -1, -2)
    ours = mha.apply_rope(q[..., perm], positions) @ np.swapaxes(
        mha.apply_rope(k[..., perm], positions), -1, -2
    )
    np.testing.assert_allclose(ours, theirs, **CLOSE)
    # Without the reordering the two conventions disagree.
    plain = mha.apply_rope(q, positions) @ np.swapaxes(mha.apply_rope(k, positions), -1, -2)
    assert np.abs(plain - theirs).max() > 1e-3


def test_rope_permutation():
    np.testing.assert_array_equal(mha.rope_permutation(6), [0, 3, 1, 4, 2, 5])
    np.testing.assert_array_equal(mha.rope_permutation(2), [0, 1])
    perm = mha.rope_permutation(10)
    assert sorted(perm) == list(range(10))
    with pytest.raises(ValueError, match="head_dim must be even .* got 5"):
        mha.rope_permutation(5)
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        mha.rope_permutation(0)


@pytest.mark.parametrize(
    ("x_shape", "positions", "kwargs", "match"),
    [
        ((4, 5), np.arange(4), {}, r"Dh must be even .* \(4, 5\)"),
        ((6,), np.arange(1), {}, r"x must have shape \(\.\.\., L, Dh\), got shape \(6,\)"),
        ((4, 6), np.arange(4.0), {}, "positions must be integers .* float64"),
        ((4, 6), np.ones(4, dtype=bool), {}, "positions must be integers .* bool"),
        ((4, 6), np.arange(5), {}, r"positions with shape \(5,\) does not broadcast .* \(4,\)"),
        ((4, 6), np.int64(3), {}, r"positions with shape \(\) does not broadcast"),
        ((4, 6), np.zeros((2, 4), dtype=int), {}, r"shape \(2, 4\) does not broadcast"),
        ((4, 6), np.arange(4), {"base": 0.0}, "base must be a positive finite number"),
        ((4, 6), np.arange(4), {"base": True}, "base must be a positive finite number"),
        ((4, 6), np.arange(4), {"base": math.inf}, "base must be a positive finite number"),
    ],
)
def test_rope_bad_arguments(x_shape, positions, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mha.apply_rope(np.zeros(x_shape), positions, **kwargs)
    if x_shape[-1] % 2 == 0 and len(x_shape) >= 2:  # the torch twin refuses the same
        with pytest.raises(ValueError):
            torch_apply_rope(
                torch.zeros(x_shape, dtype=torch.float64), torch.from_numpy(np.asarray(positions)),
                **kwargs,
            )


# ================================================================ RoPE, torch twin


@pytest.mark.parametrize(
    ("x_shape", "positions"),
    [((5, 2), np.arange(5)), ((2, 3, 7, 8), np.arange(10, 17)),
     ((2, 3, 7, 8), np.arange(14).reshape(2, 1, 7)), ((1, 4, 16), np.array([5]))],
)  # fmt: skip
def test_torch_rope_equals_the_specification(x_shape, positions):
    x = rng(7).normal(size=x_shape)
    got = torch_apply_rope(torch.from_numpy(x), torch.from_numpy(positions))
    np.testing.assert_allclose(got.numpy(), mha.apply_rope(x, positions), **CLOSE)
    assert got.dtype == torch.float64
    half = torch_apply_rope(torch.from_numpy(x).float(), torch.from_numpy(positions))
    assert half.dtype == torch.float32


def test_torch_rope_gradient_is_the_transposed_rotation():
    """|R x|^2 = |x|^2, so its gradient is 2 x: the rotation is orthogonal."""
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    torch_apply_rope(x, torch.tensor([1, 20, 300])).pow(2).sum().backward()
    torch.testing.assert_close(x.grad, 2 * x.detach(), **CLOSE)


def test_torch_rope_refuses_non_tensors():
    with pytest.raises(ValueError, match="x must be a float tensor"):
        torch_apply_rope(np.zeros((2, 2)), torch.arange(2))
    with pytest.raises(ValueError, match="x must be a float tensor"):
        torch_apply_rope(torch.zeros(2, 2, dtype=torch.long), torch.arange(2))
    with pytest.raises(ValueError, match="positions must be an integer tensor, got ndarray"):
        torch_apply_rope(torch.zeros(2, 2), np.arange(2))


# ============================================================= ALiBi, specification


def test_alibi_slopes_for_powers_of_two_are_the_papers():
    # "For models with 8 heads, the slopes ... are 1/2^1, 1/2^2, ..., 1/2^8"; for 16
    # heads the sequence starts at and steps by 2^-0.5 (Press et al., 2022, section 3).
    # NumPy's power may run a SIMD kernel accurate to an ulp, not Python's pow.
    np.testing.assert_allclose(mha.alibi_slopes(8), [2.0**-k for k in range(1, 9)],
                               rtol=2 * EPS64, atol=0)  # fmt: skip
    np.testing.assert_allclose(mha.alibi_slopes(16), [2.0 ** (-k / 2) for k in range(1, 17)],
                               rtol=1e-15)  # fmt: skip
    for n in (1, 2, 4, 32):
        slopes = mha.alibi_slopes(n)
        start = 2.0 ** (-8 / n)
        np.testing.assert_allclose(slopes, start ** np.arange(1, n + 1), rtol=1e-14)
        assert abs(slopes[-1] / 2.0**-8 - 1) <= 2 * EPS64


@pytest.mark.parametrize("num_heads", [3, 5, 6, 7, 12, 20])
def test_alibi_slopes_for_other_head_counts(num_heads):
    """The largest power of two p < n keeps its slopes; the rest are the slopes of 2p
    heads that lie between them (2^(-4/p), 2^(-12/p), ...)."""
    p = 2 ** int(math.log2(num_heads))
    slopes = mha.alibi_slopes(num_heads)
    assert slopes.shape == (num_heads,)
    np.testing.assert_array_equal(slopes[:p], mha.alibi_slopes(p))  # the same computation
    np.testing.assert_allclose(
        slopes[p:], [2.0 ** (-4 * k / p) for k in range(1, 2 * (num_heads - p), 2)], rtol=1e-14
    )
    assert len(set(slopes.tolist())) == num_heads
    assert set(slopes[p:].tolist()) <= set(mha.alibi_slopes(2 * p).tolist())


def test_alibi_slopes_of_twelve_heads_by_hand():
    exponents = [-1, -2, -3, -4, -5, -6, -7, -8, -0.5, -1.5, -2.5, -3.5]
    np.testing.assert_allclose(mha.alibi_slopes(12), 2.0 ** np.array(exponents), rtol=1e-15)


def test_alibi_bias_is_minus_slope_times_distance():
    H, T, S = 3, 4, 6
    slopes = mha.alibi_slopes(H)
    causal = mha.alibi_bias(H, T, num_keys=S)
    symmetric = mha.alibi_bias(H, T, num_keys=S, causal=False)
    assert causal.shape == symmetric.shape == (H, T, S) and causal.dtype == np.float64
    # exact: one IEEE multiplication of the same operands is rounded the same everywhere
    for h in range(H):
        for t in range(T):
            i = S - T + t  # the queries are the last T of the S positions
            for j in range(S):
                assert symmetric[h, t, j] == -slopes[h] * abs(i - j)
                assert causal[h, t, j] == (-slopes[h] * (i - j) if j <= i else 0.0)
    assert not np.any(np.signbit(causal[causal == 0]))  # no -0.0 to print
    assert mha.alibi_bias(2, 3, dtype=np.float32).dtype == np.float32


def test_alibi_bias_of_the_last_queries_is_a_slice_of_the_full_one():
    for causal in (True, False):
        full = mha.alibi_bias(4, 7, causal=causal)
        for T in (1, 3, 7):  # exact: the same products, elementwise
            np.testing.assert_array_equal(
                mha.alibi_bias(4, T, num_keys=7, causal=causal), full[:, 7 - T :]
            )


def test_alibi_equals_the_reference_formulation_after_the_softmax():
    """ALiBi's reference code adds ``slope * j`` (the key position only) under a causal
    mask: a constant per query row away from ``-slope * (i - j)``, which the softmax
    does not see."""
    H, T, S, Dh = 4, 5, 8, 6
    q, k, v = (rng(8).normal(size=(2, H, L, Dh)) for L in (T, S, S))
    mask = mha.causal_mask(T, num_keys=S)
    reference = mha.alibi_slopes(H)[:, None, None] * np.arange(S)  # (H, 1, 1) * (S,) -> (H, 1, S)
    ours, w_ours = mha.scaled_dot_product_attention(
        q, k, v, mask, score_bias=mha.alibi_bias(H, T, num_keys=S)
    )
    theirs, w_theirs = mha.scaled_dot_product_attention(q, k, v, mask, score_bias=reference)
    np.testing.assert_allclose(ours, theirs, **CLOSE)
    np.testing.assert_allclose(w_ours, w_theirs, **CLOSE)
    plain, _ = mha.scaled_dot_product_attention(q, k, v, mask)
    assert np.abs(plain - ours).max() > 1e-3


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: mha.alibi_slopes(0), "num_heads must be a positive integer"),
        (lambda: mha.alibi_slopes(True), "num_heads must be a positive integer"),
        (lambda: mha.alibi_bias(2, 0), "size must be a positive integer"),
        (lambda: mha.alibi_bias(2, 3, num_keys=2), "num_keys=2 is smaller than size=3"),
        (lambda: mha.alibi_bias(2.0, 3), "num_heads must be a positive integer"),
        (lambda: torch_alibi_slopes(0), "num_heads must be a positive integer"),
        (lambda: torch_alibi_bias(2, 3, num_keys=2), "num_keys=2 is smaller than size=3"),
        (lambda: torch_alibi_bias(2, 3.0), "size must be a positive integer"),
    ],
)
def test_alibi_bad_arguments(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ================================================================ ALiBi, torch twin


@pytest.mark.parametrize("num_heads", [1, 2, 3, 6, 8, 12, 16])
def test_torch_alibi_equals_the_specification(num_heads):
    np.testing.assert_allclose(
        torch_alibi_slopes(num_heads, dtype=torch.float64).numpy(), mha.alibi_slopes(num_heads),
        rtol=1e-15,
    )
    for causal in (True, False):
        for T, S in ((5, 5), (2, 7), (1, 1)):
            got = torch_alibi_bias(num_heads, T, num_keys=S, causal=causal, dtype=torch.float64)
            want = mha.alibi_bias(num_heads, T, num_keys=S, causal=causal)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-15, atol=0)
    assert torch_alibi_bias(num_heads, 3).dtype == torch.get_default_dtype()


@pytest.mark.parametrize("num_heads", [1, 2, 3, 4])
def test_directional_alibi_has_a_slope_per_side(num_heads):
    """Head h: the paper's slope s_h to the left, s_{H-1-h} to the right (a loop over
    every pair); the mirror of head h is head H-1-h, so only a middle head (odd H)
    is its own mirror image, with the symmetric bias."""
    slopes = mha.alibi_slopes(num_heads)
    got = alibi_bias_directional(num_heads, 5, dtype=torch.float64).numpy()
    assert got.shape == (num_heads, 5, 5)
    for h in range(num_heads):
        for i in range(5):
            for j in range(5):
                slope = slopes[h] if j <= i else slopes[num_heads - 1 - h]
                np.testing.assert_allclose(got[h, i, j], -slope * abs(i - j), rtol=1e-15)
    mirrored = got[::-1].transpose(0, 2, 1)  # head H-1-h, keys and queries swapped
    np.testing.assert_allclose(mirrored, got, rtol=1e-15, atol=0)
    symmetric = mha.alibi_bias(num_heads, 5, causal=False)
    for h in range(num_heads):
        if 2 * h == num_heads - 1:  # the middle head
            np.testing.assert_allclose(got[h], symmetric[h], rtol=1e-15)
        else:
            assert np.abs(got[h] - got[h].T).max() > 1e-3


# ===================================================== bias in attention: the spec


def sdpa_float_mask(q, k, v, mask, bias):
    """PyTorch's SDPA with one float attn_mask: the bias, -inf where the mask blocks."""
    bias = torch.from_numpy(np.asarray(bias, dtype=np.float64))
    if mask is not None:
        bias = torch.where(torch.from_numpy(mask), bias, float("-inf"))
    q, k, v = (torch.from_numpy(a) for a in (q, k, v))
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias).numpy()


@pytest.mark.parametrize("bias_shape", [(5, 7), (3, 5, 7), (2, 1, 5, 7), (1, 7)])
@pytest.mark.parametrize("mask_kind", ["none", "causal", "padding"])
def test_sdpa_bias_equals_torch_with_a_float_attn_mask(bias_shape, mask_kind):
    B, H, T, S, Dh = 2, 3, 5, 7, 4
    r = rng(9)
    q, k, v = (r.normal(size=(B, H, L, Dh)) for L in (T, S, S))
    bias = r.normal(scale=2.0, size=bias_shape)
    mask = {
        "none": None,
        "causal": mha.causal_mask(T, num_keys=S),
        "padding": mha.padding_mask(lengths=[7, 4], max_len=S),
    }[mask_kind]
    context, weights = mha.scaled_dot_product_attention(q, k, v, mask, score_bias=bias)
    np.testing.assert_allclose(context, sdpa_float_mask(q, k, v, mask, bias), **CLOSE)
    # the bias enters before the softmax: the weights are softmax(scaled + bias)
    scaled = q @ np.swapaxes(k, -1, -2) / math.sqrt(Dh) + bias
    expected = mha.softmax(scaled if mask is None else np.where(mask, scaled, -np.inf))
    np.testing.assert_allclose(weights, expected, **CLOSE)


def test_bias_never_unblocks_and_empty_rows_stay_zero():
    q, k, v = rng(10).normal(size=(3, 1, 4, 2))  # (B=1, T=S=4, Dh=2) each
    mask = mha.causal_mask(4)
    mask[2] = False  # query 2 may attend to nothing
    bias = np.full((4, 4), 50.0)  # a large bonus everywhere, blocked keys included
    context, weights = mha.scaled_dot_product_attention(q, k, v, mask, score_bias=bias)
    assert np.all(weights[..., ~mask] == 0.0)
    assert np.all(weights[..., 2, :] == 0.0) and np.all(context[..., 2, :] == 0.0)
    assert not np.isnan(context).any()
    np.testing.assert_allclose(weights.sum(-1)[..., [0, 1, 3]], 1.0, **CLOSE)


def test_zero_bias_changes_nothing_and_keeps_float32():
    q, k, v = rng(11).normal(size=(3, 2, 4, 3)).astype(np.float32)
    plain = mha.scaled_dot_product_attention(q, k, v)
    zero = mha.scaled_dot_product_attention(q, k, v, score_bias=np.zeros((4, 4)))
    # exact: adding 0.0 leaves each score as it is; the rest is the same computation
    np.testing.assert_array_equal(zero[0], plain[0])
    np.testing.assert_array_equal(zero[1], plain[1])
    assert zero[0].dtype == np.float32  # a float64 bias does not promote the result


@pytest.mark.parametrize(
    ("bias", "match"),
    [
        (np.zeros((4, 5), dtype=bool), "bias must be a float array .* bool"),
        (np.zeros((4, 5), dtype=int), "bias must be a float array .* int64"),
        (np.zeros(5), r"bias must have at least 2 dims"),
        (np.zeros((4, 6)), r"bias with shape \(4, 6\) does not broadcast"),
        (np.zeros((3, 2, 4, 5)), r"bias with shape \(3, 2, 4, 5\) does not broadcast"),
        (np.zeros((1, 1, 2, 4, 5)), r"bias with shape \(1, 1, 2, 4, 5\) has more dims"),
        (np.full((4, 5), -np.inf), "bias .* must be finite: block keys with the boolean mask"),
        (np.full((4, 5), np.nan), "bias .* must be finite"),
    ],
)
def test_spec_bias_errors(bias, match):
    q, k = np.zeros((1, 2, 4, 3)), np.zeros((1, 2, 5, 3))
    with pytest.raises(ValueError, match=match):
        mha.scaled_dot_product_attention(q, k, k, score_bias=bias)
    params = mha.AttentionParams.init(6)
    with pytest.raises(ValueError, match=match):
        mha.multi_head_attention(np.zeros((1, 4, 6)), np.zeros((1, 5, 6)), np.zeros((1, 5, 6)),
                                 params, 2, score_bias=bias)  # fmt: skip


def test_multi_head_attention_bias_goes_into_every_head():
    params = mha.AttentionParams.init(12, seed=1)
    x = rng(12).normal(size=(2, 5, 12))
    bias = mha.alibi_bias(4, 5)
    mask = mha.causal_mask(5)
    steps = mha.multi_head_attention_steps(x, x, x, params, 4, mask=mask, score_bias=bias)
    expected = np.where(mask, steps.scaled + bias, -np.inf)
    np.testing.assert_array_equal(steps.masked, expected)  # the same elementwise sum
    context, weights = mha.scaled_dot_product_attention(
        steps.q_heads, steps.k_heads, steps.v_heads, mask, score_bias=bias
    )
    np.testing.assert_allclose(steps.weights, weights, **CLOSE)
    np.testing.assert_allclose(steps.context, context, **CLOSE)


# ================================================ bias and RoPE in the torch module


def module(d_model=16, num_heads=4, num_kv_heads=None, seed=0) -> MultiHeadAttention:
    torch.manual_seed(seed)
    m = MultiHeadAttention(d_model, num_heads, num_kv_heads=num_kv_heads).double().eval()
    with torch.no_grad():  # random biases too, so that a bias bug shows
        for linear in (m.W_q, m.W_k, m.W_v, m.W_o):
            linear.bias.normal_()
    return m


@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("grad", [True, False])
def test_module_bias_equals_the_specification(num_kv_heads, need_weights, grad):
    m = module(num_kv_heads=num_kv_heads)
    params = convert.params_from_module(m)
    x = rng(13).normal(size=(2, 6, 16))
    mask = mha.combine_masks(mha.causal_mask(6), mha.padding_mask(lengths=[6, 4]))
    bias = rng(14).normal(size=(4, 6, 6))
    want, want_w = mha.multi_head_attention(x, x, x, params, 4, mask=mask, score_bias=bias)
    t = torch.from_numpy(x)
    with torch.set_grad_enabled(grad):
        out, w = m(t, t, t, mask=torch.from_numpy(mask), score_bias=torch.from_numpy(bias),
                   need_weights=need_weights)  # fmt: skip
    np.testing.assert_allclose(out.detach().numpy(), want, **CLOSE)
    if need_weights:
        np.testing.assert_allclose(w.detach().numpy(), want_w, **CLOSE)


@pytest.mark.parametrize("need_weights", [True, False])
def test_module_bias_keeps_empty_rows_zero_on_both_paths(need_weights):
    m = module()
    x = torch.randn(1, 4, 16, dtype=torch.float64)
    mask = torch.ones(4, 4, dtype=torch.bool).tril()
    mask[1] = False
    with torch.no_grad():
        out, _ = m(x, x, x, mask=mask, score_bias=torch.full((4, 4), 30.0, dtype=torch.float64),
                   need_weights=need_weights)  # fmt: skip
        # A row with nothing to attend to gives W_o applied to a zero context: b_o.
        torch.testing.assert_close(out[0, 1], m.W_o.bias, rtol=0, atol=0)
    assert not out.isnan().any()


@pytest.mark.parametrize("need_weights", [True, False])
def test_module_casts_the_bias_to_its_dtype(need_weights):
    m = MultiHeadAttention(8, 2)  # float32
    x = torch.randn(1, 3, 8)
    bias = torch_alibi_bias(2, 3, dtype=torch.float64)
    out, _ = m(x, x, x, score_bias=bias, need_weights=need_weights)
    want, _ = m(x, x, x, score_bias=bias.float(), need_weights=need_weights)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.parametrize(
    ("bias", "match"),
    [
        (torch.zeros(5, 4, dtype=torch.bool), "bias must be a float tensor .* torch.bool"),
        (torch.zeros(5, 4, dtype=torch.long), "bias must be a float tensor .* torch.int64"),
        (np.zeros((5, 4)), "bias must be a float tensor .* ndarray"),
        (torch.zeros(4), r"bias of shape \(4,\) does not broadcast"),
        (torch.zeros(5, 5), r"bias of shape \(5, 5\) does not broadcast to .* \(2, 2, 5, 4\)"),
        (torch.zeros(3, 5, 4), r"bias of shape \(3, 5, 4\) does not broadcast"),
        (torch.full((5, 4), float("-inf")), "must be finite: block keys with the bool mask"),
    ],
)
@pytest.mark.parametrize("need_weights", [True, False])
def test_module_bias_errors(bias, match, need_weights):
    m = MultiHeadAttention(8, 2)
    q, k = torch.randn(2, 5, 8), torch.randn(2, 4, 8)
    with pytest.raises(ValueError, match=match):
        m(q, k, k, score_bias=bias, need_weights=need_weights)


def spec_rope_attention(params, x, num_heads, mask, positions):
    """RoPE attention assembled from specification pieces: project, split, rotate q and
    k, attend (each group of query heads reading its shared key/value head), merge."""
    q = mha.split_heads(x @ params.W_q + params.b_q, num_heads)  # (B, H, T, Dh)
    hkv = params.num_kv_heads(num_heads)
    k = mha.split_heads(x @ params.W_k + params.b_k, hkv)  # (B, Hkv, S, Dh)
    v = mha.split_heads(x @ params.W_v + params.b_v, hkv)
    q, k = mha.apply_rope(q, positions), mha.apply_rope(k, positions)
    k, v = (np.repeat(a, num_heads // hkv, axis=1) for a in (k, v))  # (B, H, S, Dh)
    context, _ = mha.scaled_dot_product_attention(q, k, v, mask)
    return mha.merge_heads(context) @ params.W_o + params.b_o


@pytest.mark.parametrize("num_kv_heads", [4, 1])
@pytest.mark.parametrize("need_weights", [True, False])
def test_module_rope_equals_the_specification(num_kv_heads, need_weights):
    m = module(num_kv_heads=num_kv_heads)
    params = convert.params_from_module(m)
    x = rng(15).normal(size=(2, 6, 16))
    mask = mha.causal_mask(6)
    positions = np.arange(3, 9)
    want = spec_rope_attention(params, x, 4, mask, positions)
    t = torch.from_numpy(x)
    out, _ = m(t, t, t, mask=torch.from_numpy(mask), need_weights=need_weights,
               rope_positions=torch.from_numpy(positions))  # fmt: skip
    np.testing.assert_allclose(out.detach().numpy(), want, **CLOSE)


def chunks(length: int, sizes: list[int]) -> list[slice]:
    out, start = [], 0
    for size in sizes:
        if start < length:
            out.append(slice(start, min(start + size, length)))
        start += size
    return out


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
@pytest.mark.parametrize("num_kv_heads", [4, 2])
@pytest.mark.parametrize("sizes", [[1] * 7, [3, 1, 3], [7]])
@pytest.mark.parametrize("need_weights", [True, False])
def test_module_cached_decoding_equals_one_causal_pass(scheme, num_kv_heads, sizes, need_weights):
    """RoPE: the keys are rotated before they are cached, each new query at its own
    absolute position. ALiBi: the bias of the last T of S positions."""
    m = module(num_kv_heads=num_kv_heads)
    x = torch.randn(3, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def extra(part: slice) -> dict:
        if scheme == "rope":
            return {"rope_positions": torch.arange(part.start, part.stop)}
        size = part.stop - part.start
        return {"score_bias": torch_alibi_bias(4, size, num_keys=part.stop, dtype=torch.float64)}

    whole = slice(0, 7)
    full, full_w = m(x, x, x, mask=torch.from_numpy(mha.causal_mask(7)), **extra(whole))
    cache, outs = KVCache(), []
    for part in chunks(7, sizes):
        new = x[:, part]
        mask = torch.from_numpy(mha.causal_mask(new.shape[1], num_keys=part.stop))
        out, w = m(new, new, new, mask=mask, need_weights=need_weights, cache=cache, **extra(part))
        outs.append(out)
        if need_weights:
            torch.testing.assert_close(w, full_w[:, :, part, : part.stop], **CLOSE)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **CLOSE)


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_module_rolling_cache_with_rope_or_alibi(scheme):
    """With a rolling cache (sliding-window attention) the positions stay absolute:
    RoPE's keys were rotated before they were cached, and ALiBi's bias is that of the
    last T of the S kept keys."""
    m = module(num_kv_heads=2)
    length, window = 9, 3
    x = torch.randn(2, length, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    band = torch.from_numpy(mha.sliding_window_mask(length, window))
    if scheme == "rope":
        full, _ = m(x, x, x, mask=band, rope_positions=torch.arange(length))
    else:
        full, _ = m(x, x, x, mask=band, score_bias=torch_alibi_bias(4, length, dtype=torch.float64))
    cache, outs = KVCache(window=window), []
    for t in range(length):
        new = x[:, t : t + 1]
        if scheme == "rope":
            out, _ = m(new, new, new, cache=cache, rope_positions=torch.tensor([t]))
        else:
            kept = cache.kept_length + 1
            bias = torch_alibi_bias(4, 1, num_keys=kept, dtype=torch.float64)
            out, _ = m(new, new, new, cache=cache, score_bias=bias)
        outs.append(out)
        assert cache.length == min(t + 1, window)
    torch.testing.assert_close(torch.cat(outs, dim=1), full, **CLOSE)


def test_rope_positions_need_self_attention():
    m = module()
    q = torch.randn(1, 2, 16, dtype=torch.float64)
    memory = torch.randn(1, 5, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="rope_positions .* need self-attention"):
        m(q, memory, memory, rope_positions=torch.arange(2))
    cache = KVCache(fixed=True)
    m(q, memory, memory, cache=cache)
    with pytest.raises(ValueError, match="and a filled fixed cache"):
        m(q, memory, memory, cache=cache, rope_positions=torch.arange(2))
    with pytest.raises(ValueError, match="positions must be an integer tensor"):
        m(q, q, q, rope_positions=torch.arange(2.0))
    odd = MultiHeadAttention(12, 4)
    x = torch.randn(1, 2, 12)
    with pytest.raises(ValueError, match=r"rope_positions need an even head_dim .* got head_dim=3"):
        odd(x, x, x, rope_positions=torch.arange(2))
    grows = KVCache()
    with pytest.raises(ValueError, match=r"positions of shape \(3,\) does not broadcast"):
        m(q, q, q, rope_positions=torch.arange(3), cache=grows)
    assert grows.length == 0  # refused before anything was cached


# ======================================================= the Transformer's option


def make_transformer(scheme: str, norm_first: bool = False, seed: int = 7) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(11, 13, d_model=12, num_heads=3, num_encoder_layers=2,
                       num_decoder_layers=2, d_ff=24, max_len=10, norm_first=norm_first,
                       position_scheme=scheme).double().eval()  # fmt: skip


SRC = torch.tensor([[3, 4, 5, 6], [7, 8, 0, 0]])  # pad_id 0
TGT = torch.tensor([[1, 5, 6, 7, 2], [1, 9, 2, 0, 0]])


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("need_weights", [False, True])
def test_transformer_decodes_the_same_with_a_cache(scheme, norm_first, need_weights):
    model = make_transformer(scheme, norm_first)
    memory, _ = model.encode(SRC)
    full, full_self, _ = model.decode(TGT, memory, SRC, need_weights=True)
    cache = model.new_cache()
    steps = []
    for t in range(5):
        logits, self_w, _ = model.decode(TGT[:, : t + 1], memory, SRC,
                                         need_weights=need_weights, cache=cache)
        steps.append(logits)
        if need_weights:
            torch.testing.assert_close(self_w[0], full_self[0][:, :, t : t + 1, : t + 1], **CLOSE)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, **CLOSE)


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_decoding_no_new_position_gives_no_logits(scheme):
    model = make_transformer(scheme)
    memory, _ = model.encode(SRC)
    cache = model.new_cache()
    model.decode(TGT, memory, SRC, cache=cache)
    assert model.decode(TGT, memory, SRC, cache=cache)[0].shape == (2, 0, 13)


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_the_schemes_are_wired_into_self_attention_only(scheme):
    """What each attention module receives: the encoder ALiBi's symmetric bias or RoPE's
    positions 0..S-1, the decoder the causal ones of its new positions (absolute, with a
    cache), the cross-attention nothing."""
    model = make_transformer(scheme)
    seen: dict[str, list] = {}

    def record(name):
        def hook(_module, _args, kwargs):
            inputs = (kwargs.get("score_bias"), kwargs.get("rope_positions"))
            seen.setdefault(name, []).append(inputs)

        return hook

    for i, layer in enumerate(model.encoder_layers):
        layer.self_attn.register_forward_pre_hook(record(f"enc{i}"), with_kwargs=True)
    for i, layer in enumerate(model.decoder_layers):
        layer.self_attn.register_forward_pre_hook(record(f"self{i}"), with_kwargs=True)
        layer.cross_attn.register_forward_pre_hook(record(f"cross{i}"), with_kwargs=True)
    memory, _ = model.encode(SRC)
    cache = model.new_cache()
    model.decode(TGT[:, :3], memory, SRC, cache=cache)  # positions 0, 1, 2
    model.decode(TGT[:, :5], memory, SRC, cache=cache)  # positions 3, 4
    for i in range(2):
        ((enc_bias, enc_rope),) = seen[f"enc{i}"]
        (b1, r1), (b2, r2) = seen[f"self{i}"]
        assert len(seen[f"cross{i}"]) == 2
        assert all(b is None and r is None for b, r in seen[f"cross{i}"])
        if scheme.startswith("alibi"):
            # torch.pow against NumPy's power: slopes within an ulp or two of each other
            # (exact for 3 heads, powers of two, but not for every head count)
            close = {"rtol": 4 * EPS64, "atol": 0}
            encoder = (mha.alibi_bias(3, 4, causal=False) if scheme == "alibi" else
                       alibi_bias_directional(3, 4, dtype=torch.float64).numpy())  # fmt: skip
            np.testing.assert_allclose(enc_bias.numpy(), encoder, **close)
            np.testing.assert_allclose(b1.numpy(), mha.alibi_bias(3, 3), **close)
            np.testing.assert_allclose(b2.numpy(), mha.alibi_bias(3, 2, num_keys=5), **close)
            assert enc_rope is None and r1 is None and r2 is None
        elif scheme == "rope":
            assert enc_rope.tolist() == [0, 1, 2, 3]
            assert r1.tolist() == [0, 1, 2] and r2.tolist() == [3, 4]
            assert enc_bias is None and b1 is None and b2 is None
        elif scheme == "t5":  # each stack's own table, the same in every layer
            encoder = model.relative_bias_bidirectional.detach().numpy()
            decoder = model.relative_bias_causal.detach().numpy()
            np.testing.assert_array_equal(enc_bias.detach().numpy(),
                                          mha.t5_relative_bias(encoder, 4))  # a lookup: exact
            np.testing.assert_array_equal(b1.detach().numpy(),
                                          mha.t5_relative_bias(decoder, 3, bidirectional=False))
            np.testing.assert_array_equal(
                b2.detach().numpy(), mha.t5_relative_bias(decoder, 2, 5, bidirectional=False))
            assert enc_rope is None and r1 is None and r2 is None
        else:
            assert all(a is None for a in (enc_bias, enc_rope, b1, r1, b2, r2))


@pytest.mark.parametrize("scheme", ["none", "rope", "alibi", "alibi_directional"])
def test_no_table_is_added_with_rope_or_alibi(scheme):
    model = make_transformer(scheme)
    assert model.positional_encoding is None
    assert "positional_encoding" not in dict(model.named_buffers())
    tokens = torch.tensor([[3, 3, 3, 3]])
    embedded = model._embed(tokens, model.src_embedding, "src")
    expected = model.src_embedding(tokens) * math.sqrt(12)
    torch.testing.assert_close(embedded, expected, rtol=0, atol=0)
    sinusoidal = make_transformer("sinusoidal")
    assert sinusoidal.positional_encoding.shape == (10, 12)


def test_alibi_encoder_is_symmetric_and_the_others_are_not():
    """With the symmetric bias only |i - j| matters: reversing an unpadded source
    reverses the encoder's output; without positions (NoPE) the encoder sees a set, and
    any reordering reorders its output. RoPE's scores depend on the signed offset, the
    sinusoidal table on absolute positions, and the directional ALiBi has different
    slopes to the left and to the right."""
    src = torch.tensor([[3, 4, 5, 6, 7, 8]])
    for scheme in POSITION_SCHEMES:
        model = make_transformer(scheme)
        forward, _ = model.encode(src)
        backward, _ = model.encode(src.flip(1))
        gap = (backward.flip(1) - forward).abs().max().item()
        if scheme in ("alibi", "none"):
            assert gap < 1e-12
        else:
            assert gap > 1e-3


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_cross_attention_sees_no_positions(scheme):
    """Reordering the memory (and its padding) changes nothing in the decoder: the
    cross-attention has no position information under any scheme."""
    model = make_transformer(scheme)
    memory, _ = model.encode(SRC)
    perm = torch.tensor([2, 0, 3, 1])
    logits, _, _ = model.decode(TGT, memory, SRC)
    shuffled, _, _ = model.decode(TGT, memory[:, perm], SRC[:, perm])
    torch.testing.assert_close(shuffled, logits, **CLOSE)


def test_transformer_position_scheme_errors_and_config():
    with pytest.raises(ValueError, match=r"scheme must be one of \('none', 'sinusoidal', "):
        Transformer(5, 5, position_scheme="learned")
    with pytest.raises(ValueError, match="head_dim = d_model / num_heads = 3 must be even"):
        Transformer(5, 5, d_model=6, num_heads=2, position_scheme="rope")
    alibi = Transformer(5, 5, d_model=6, num_heads=2, position_scheme="alibi")  # any head_dim
    assert alibi.config["position_scheme"] == "alibi"
    model = Transformer(5, 5, d_model=8, num_heads=2)
    assert model.config["position_scheme"] == "sinusoidal" and model.position_scheme == "sinusoidal"
    rebuilt = Transformer(**make_transformer("rope").config)
    assert rebuilt.config == make_transformer("rope").config


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_only_the_table_limits_the_length(scheme):
    """max_len is the sinusoidal table's rows: with the table a longer input is refused,
    naming it; the other schemes take any length."""
    model = make_transformer(scheme)  # max_len=10
    long_src = torch.arange(3, 15)[None] % 9 + 1  # (1, 12)
    long_tgt = torch.arange(1, 12)[None] % 9 + 1  # (1, 11)
    if scheme == "sinusoidal":
        with pytest.raises(ValueError, match=r"src has length 12 > max_len=10"):
            model.encode(long_src)
        memory, _ = model.encode(long_src[:, :10])
        with pytest.raises(ValueError, match=r"tgt_in has length 11 > max_len=10"):
            model.decode(long_tgt, memory, long_src[:, :10])
    else:
        memory, _ = model.encode(long_src)
        logits, _, _ = model.decode(long_tgt, memory, long_src)
        assert logits.shape == (1, 11, 13) and torch.isfinite(logits).all()


# ================================================= checkpoints and the translator


@pytest.mark.parametrize("scheme", POSITION_SCHEMES)
def test_checkpoint_round_trips_the_scheme(tmp_path, scheme):
    from mha.translator import Translator, Vocab, load_checkpoint, read_metadata, save_checkpoint

    torch.manual_seed(0)
    model = Transformer(7, 9, d_model=8, num_heads=2, max_len=12, position_scheme=scheme).eval()
    path = tmp_path / "model.npz"
    save_checkpoint(path, Translator(model, Vocab(["a", "b", "c"]), Vocab(["x", "y", "z"])))
    assert read_metadata(path)["model"]["position_scheme"] == scheme
    loaded = load_checkpoint(path).model
    assert loaded.config == model.config and loaded.position_scheme == scheme
    src, tgt_in = torch.tensor([[4, 5, 6, 3]]), torch.tensor([[1, 4, 5, 6]])
    torch.testing.assert_close(loaded(src, tgt_in), model(src, tgt_in), rtol=0, atol=0)
    if scheme != "sinusoidal":  # the option matters: the other schemes differ
        other = Transformer(**model.config | {"position_scheme": "sinusoidal"}).eval()
        other.load_state_dict(model.state_dict(), strict=scheme != "t5")  # T5's own tables
        assert (other(src, tgt_in) - model(src, tgt_in)).abs().max() > 1e-3


@pytest.mark.parametrize("scheme", ["rope", "alibi"])
def test_training_runs_with_each_scheme(scheme):
    """A tiny smoke run: the loss falls, and greedy decoding with and without the
    cache gives the same tokens."""
    from mha.translator import TrainConfig, generate_corpus, train

    corpus = generate_corpus(0, num_train=300, num_heldout=20, num_compositional=20)
    config = TrainConfig(num_train=300, num_heldout=20, num_compositional=20, steps=30,
                         batch_size=16, position_scheme=scheme)  # fmt: skip
    result = train(config, corpus=corpus)
    model = result.translator.model
    assert model.config["position_scheme"] == scheme and model.positional_encoding is None
    assert all(math.isfinite(loss) for loss in result.losses)
    assert np.mean(result.losses[-5:]) < np.mean(result.losses[:5]) - 0.5
    src = result.translator.source_ids([list(e.source) for e in corpus.heldout])
    vocab = result.translator.tgt_vocab
    # After 30 steps some choices are close (margins of about 0.01), and the trained
    # weights differ from CPU to CPU: compare in float64, where the paths differ by
    # about 1e-15 (logits of magnitude <= 4).
    model64 = copy.deepcopy(model).double()
    assert_same_greedy_tokens(model64, src, vocab.bos_id, vocab.eos_id, atol=1e-12)
