"""Where a token is: three ways to tell attention about positions.

* :func:`sinusoidal_positional_encoding`: a fixed sine/cosine signal added to the token
  embeddings (Vaswani et al., 2017, section 3.5);
* :func:`apply_rope`: rotary position embedding, RoPE (Su et al., 2021), which rotates
  the query and key heads so that their dot product depends only on how far apart they
  are (:func:`rope_permutation` relates its two pairing conventions);
* :func:`alibi_slopes` and :func:`alibi_bias`: attention with linear biases, ALiBi
  (Press et al., 2022), which adds ``-slope * distance`` to the scaled scores, one slope
  per head (``mha.scaled_dot_product_attention(..., score_bias=)``).

All three use the same kind of numbers: the RoPE angles are those of the sinusoidal
table, and ALiBi needs no table at all.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from mha._checks import as_float_array, check_positive_int, check_queries_and_keys

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "rope_permutation",
    "sinusoidal_positional_encoding",
]


def _frequencies(width: int, base: float) -> np.ndarray:
    """``base^(-2i / width)`` for ``i = 0, 1, ..., ceil(width / 2) - 1``: one frequency per
    pair of dimensions, from 1 down to almost ``1 / base``."""
    two_i = np.arange(0, width, 2, dtype=np.float64)  # (ceil(width/2),) = 0, 2, 4, ...
    return np.exp(-np.log(base) * two_i / width)  # base^(-2i/width) via exp/log


def sinusoidal_positional_encoding(
    max_len: int, d_model: int, dtype: Any = np.float64
) -> np.ndarray:
    """The fixed sine/cosine position signal added to the token embeddings.

    ``PE[pos, 2i] = sin(pos / 10000^(2i / D))`` and
    ``PE[pos, 2i + 1] = cos(pos / 10000^(2i / D))``: dimension pair ``i`` is a
    rotation at its own frequency, from one cycle per ``2*pi`` positions (``i = 0``)
    down to one per ``10000 * 2*pi``, so ``PE[pos + k]`` is a linear function of
    ``PE[pos]`` for every fixed offset ``k``.

    Parameters
    ----------
    max_len : int
        Number of positions, ``0 .. max_len - 1``.
    d_model : int
        ``D``. An odd ``D`` is allowed: the last (even-indexed) column is a sine
        whose cosine partner would fall outside the array and is dropped.
    dtype : NumPy floating dtype
        Computed in float64, then cast.

    Returns
    -------
    np.ndarray, shape (max_len, D)
    """
    max_len = check_positive_int(max_len, "max_len")
    d_model = check_positive_int(d_model, "d_model")
    positions = np.arange(max_len, dtype=np.float64)[:, None]  # (max_len, 1)
    frequencies = _frequencies(d_model, 10000.0)  # (ceil(D/2),)
    # (max_len, 1) * (1, ceil(D/2)) -> (max_len, ceil(D/2))
    angles = positions * frequencies[None, :]
    encoding = np.empty((max_len, d_model), dtype=np.float64)
    encoding[:, 0::2] = np.sin(angles)
    encoding[:, 1::2] = np.cos(angles[:, : d_model // 2])  # odd D: no partner for the last sine
    return encoding.astype(dtype)


# ------------------------------------------------------------------------- RoPE


def _check_positions(positions: Any, lead: tuple[int, ...]) -> np.ndarray:
    """``positions`` as an integer array that broadcasts to ``lead = (..., L)`` without
    enlarging it (each dim 1 or equal, right-aligned; at least the ``L`` dim)."""
    arr = np.asarray(positions)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(
            f"positions must be integers (token positions 0, 1, 2, ...), got dtype "
            f"{arr.dtype} with shape {arr.shape}"
        )
    fits = 1 <= arr.ndim <= len(lead) and all(
        got in (1, want) for got, want in zip(arr.shape[::-1], lead[::-1], strict=False)
    )
    if not fits:
        raise ValueError(
            f"positions with shape {arr.shape} does not broadcast to x's (..., L) = {lead}: "
            "it needs the L dim, and every dim must be 1 or match"
        )
    return arr


def apply_rope(x: Any, positions: Any, base: float = 10000.0) -> np.ndarray:
    """Rotary position embedding (RoPE, Su et al., 2021): rotate pairs of dimensions by
    an angle proportional to the position.

    Pair ``i`` of the vector at position ``m`` is turned by the angle ``m * theta_i``
    with ``theta_i = base^(-2i / Dh)``, the frequencies of
    :func:`sinusoidal_positional_encoding` (for ``D = Dh``):

    ``y[2i]     = x[2i] cos(m theta_i) - x[2i+1] sin(m theta_i)``
    ``y[2i + 1] = x[2i] sin(m theta_i) + x[2i+1] cos(m theta_i)``.

    Applied to the query and the key heads, it makes every score depend on the two
    positions only through their difference: rotating ``q`` by ``m theta`` and ``k`` by
    ``n theta`` leaves ``q . k`` turned by ``(m - n) theta``. Rotations keep lengths,
    and position 0 leaves the vector unchanged.

    Pairing: **adjacent dimensions** ``(2i, 2i + 1)``, as in the RoFormer paper and as
    the sine/cosine columns of :func:`sinusoidal_positional_encoding`, so that pair
    ``i`` here turns by exactly the angle that pair ``i`` of that table stores. Many
    current codebases (GPT-NeoX, the LLaMA models in Hugging Face ``transformers``)
    pair dimension ``i`` with ``i + Dh/2`` instead, which rotates two contiguous
    halves; that is the same computation on reordered dimensions, and
    :func:`rope_permutation` gives the reordering (weights trained with one convention
    serve the other once the columns of each head of ``W_q`` and ``W_k`` are permuted).

    Parameters
    ----------
    x : array_like, shape (..., L, Dh)
        Query or key heads, e.g. ``(B, H, L, Dh)``; ``Dh`` must be even.
    positions : int array_like, shape (L,) or broadcastable to x's (..., L)
        The position of each of the ``L`` vectors, e.g. ``np.arange(L)``, or
        ``np.arange(S - T, S)`` for the last ``T`` of ``S`` positions when decoding
        with a cache. At least the ``L`` dim; each dim 1 or equal to x's.
    base : float
        ``> 0``; 10000 in the paper.

    Returns
    -------
    np.ndarray, same shape and dtype as ``x`` (integers become float64)
        Angles are computed in float64, then the cosines and sines are cast.

    Raises
    ------
    ValueError
        If ``Dh`` is odd, ``x`` has fewer than 2 dims, ``positions`` is not integer or
        does not broadcast, or ``base`` is not a positive number.
    """
    x = as_float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., L, Dh), got shape {x.shape}")
    head_dim = x.shape[-1]
    if head_dim % 2 != 0:
        raise ValueError(
            f"x's last dim Dh must be even (RoPE rotates pairs of dimensions), got shape "
            f"{x.shape}"
        )
    positions = _check_positions(positions, x.shape[:-1])
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not 0 < base < np.inf:
        raise ValueError(f"base must be a positive finite number, got {base!r}")
    frequencies = _frequencies(head_dim, float(base))  # (Dh/2,)
    # (..., L, 1) * (Dh/2,) -> (..., L, Dh/2): one angle per position and pair
    angles = positions.astype(np.float64)[..., None] * frequencies
    cos, sin = np.cos(angles).astype(x.dtype), np.sin(angles).astype(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, Dh/2) each: the two halves of a pair
    rotated = np.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
    return rotated.reshape(x.shape)  # (..., L, Dh/2, 2) -> (..., L, Dh): pairs side by side


def rope_permutation(head_dim: int) -> np.ndarray:
    """The reordering between the two RoPE pairing conventions.

    In the "half-split" convention dimension ``i`` is rotated together with
    ``i + Dh/2``; :func:`apply_rope` rotates ``2i`` with ``2i + 1``. With
    ``perm = rope_permutation(Dh)`` (``[0, Dh/2, 1, Dh/2 + 1, ...]``),

    ``half_split_rope(x, m)[..., perm] == apply_rope(x[..., perm], m)``,

    and since the same reordering of ``q`` and ``k`` leaves ``q . k`` unchanged, both
    conventions give the same scores. ``np.argsort(perm)`` goes back.

    Parameters
    ----------
    head_dim : int
        ``Dh``, even.

    Returns
    -------
    np.ndarray of int, shape (Dh,)
    """
    head_dim = check_positive_int(head_dim, "head_dim")
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim must be even (RoPE rotates pairs), got {head_dim}")
    half = head_dim // 2
    # (2, Dh/2) -> (Dh/2, 2) -> (Dh,): i and i + Dh/2 side by side, pair after pair
    return np.stack([np.arange(half), np.arange(half, head_dim)], axis=-1).reshape(head_dim)


# ------------------------------------------------------------------------ ALiBi


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The ALiBi slope of each head (Press et al., 2022, section 3).

    For ``n`` heads, ``n`` a power of two, the slopes are the geometric sequence that
    starts at ``2^(-8/n)`` with that same ratio: ``2^(-8/n), 2^(-16/n), ..., 2^-8``
    (``1/2, 1/4, ..., 1/256`` for 8 heads). For other ``n``, the rule the authors
    published with the paper: the slopes of the largest power of two ``p < n``, then
    the first ``n - p`` of the slopes of ``2p`` heads that fall between those
    (``2^(-4/p), 2^(-12/p), ...``). Steep slopes make a head look at its neighbours,
    gentle ones let it see far.

    Parameters
    ----------
    num_heads : int
        ``H``.

    Returns
    -------
    np.ndarray, shape (H,), float64
        Each in ``[2^-8, 1)``; decreasing when ``H`` is a power of two.
    """
    num_heads = check_positive_int(num_heads, "num_heads")

    def geometric(n: int) -> np.ndarray:  # n a power of two
        return 2.0 ** (-8.0 * np.arange(1, n + 1) / n)  # (n,) 2^(-8k/n), k = 1..n

    power = 1 << (num_heads.bit_length() - 1)  # largest power of two <= H
    slopes = geometric(power)
    if power < num_heads:
        between = geometric(2 * power)[0::2]  # (p,) odd k: between the slopes above
        slopes = np.concatenate([slopes, between[: num_heads - power]])
    return slopes


def alibi_bias(
    num_heads: int,
    size: int,
    num_keys: int | None = None,
    causal: bool = True,
    dtype: Any = np.float64,
) -> np.ndarray:
    """ALiBi's additive bias ``-slope_h * distance``, to add to the scaled scores.

    ALiBi adds no position signal to the embeddings; instead each head ``h`` lowers
    the score of a key in proportion to its distance from the query, with its own
    :func:`alibi_slopes` ``slope_h``. Pass the result as ``bias`` to
    :func:`mha.scaled_dot_product_attention` or :func:`mha.multi_head_attention`.

    Parameters
    ----------
    num_heads : int
        ``H``.
    size : int
        ``T``, the number of queries.
    num_keys : int, optional
        ``S >= T``: the queries are the *last* ``T`` of ``S`` positions, as in
        :func:`mha.causal_mask` (decoding with a cache). Default ``T``.
    causal : bool
        True (a decoder): ``distance = i - j`` for query position ``i`` and key
        position ``j <= i``; keys after the query get 0. The bias blocks nothing: a
        causal model still needs :func:`mha.causal_mask`, which blocks those keys
        (the formula would give them a *positive* bias, a reward for looking ahead,
        should the mask ever be forgotten). False (an encoder, symmetric):
        ``distance = |i - j|``.
    dtype : NumPy floating dtype

    Returns
    -------
    np.ndarray, shape (H, T, S)
        Zero on the query's own position, ``<= 0`` everywhere; broadcasts against the
        scores ``(B, H, T, S)``.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    slopes = alibi_slopes(num_heads)  # (H,)
    queries = np.arange(num_keys - size, num_keys)  # (T,) positions of the last T
    keys = np.arange(num_keys)  # (S,)
    offset = keys[None, :] - queries[:, None]  # (1, S) - (T, 1) -> (T, S): j - i
    # Integers until the product: -|j - i| is never -0, so no "-0." gets printed.
    offset = np.minimum(offset, 0) if causal else -np.abs(offset)  # (T, S), <= 0
    bias = slopes[:, None, None] * offset  # (H, 1, 1) * (T, S) -> (H, T, S)
    return bias.astype(dtype)
