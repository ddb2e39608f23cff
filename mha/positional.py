"""Where a token is: four ways to tell attention about positions.

* :func:`sinusoidal_positional_encoding`: a fixed sine/cosine signal added to the token
  embeddings (Vaswani et al., 2017, section 3.5);
* :func:`apply_rope`: rotary position embedding, RoPE (Su et al., 2021), which rotates
  the query and key heads so that their dot product depends only on how far apart they
  are (:func:`rope_permutation` relates its two pairing conventions);
* :func:`alibi_slopes` and :func:`alibi_bias`: attention with linear biases, ALiBi
  (Press et al., 2022), which adds ``-slope * distance`` to the scaled scores, one slope
  per head (``mha.scaled_dot_product_attention(..., score_bias=)``);
* :func:`t5_relative_position_bucket` and :func:`t5_relative_bias`: T5's relative
  position bias (Raffel et al., 2020), a learned bias per head and per *bucket* of
  distances, exact for near keys and logarithmically coarser for far ones, added to the
  scores like ALiBi's.

The first three use the same kind of numbers: the RoPE angles are those of the
sinusoidal table, and ALiBi needs no table at all. T5 learns its table. RoPE stretched
past the length it was trained on lives in :mod:`mha.rope_scaling`.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from mha._checks import (
    as_float_array,
    check_ndim,
    check_positive_int,
    check_queries_and_keys,
    check_t5_buckets,
)

__all__ = [
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "rope_permutation",
    "sinusoidal_positional_encoding",
    "t5_relative_bias",
    "t5_relative_position_bucket",
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


def _check_inv_freq(inv_freq: Any, head_dim: int, base: float) -> np.ndarray:
    """``inv_freq`` as ``Dh/2`` finite non-negative float64 frequencies, given without a
    ``base`` of its own (the default is the only one accepted)."""
    if base != 10000.0:
        raise ValueError(
            f"base={base!r} is not used with inv_freq: give it to the function that "
            "computes the frequencies (mha.rope_scaling)"
        )
    frequencies = as_float_array(inv_freq, "inv_freq").astype(np.float64)
    if frequencies.shape != (head_dim // 2,):
        raise ValueError(
            f"inv_freq must have shape (Dh/2,) = ({head_dim // 2},), one frequency per pair "
            f"of x's Dh = {head_dim} dimensions, got shape {frequencies.shape}"
        )
    if not np.all(np.isfinite(frequencies) & (frequencies >= 0)):
        raise ValueError(f"inv_freq must be finite and >= 0, got {frequencies}")
    return frequencies


def apply_rope(
    x: Any, positions: Any, base: float = 10000.0, *, inv_freq: Any | None = None
) -> np.ndarray:
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
    inv_freq : float array_like, shape (Dh/2,), optional
        Keyword only: the frequencies ``theta_i`` themselves, pair ``i`` turning by
        ``m * inv_freq[i]``, in place of ``base^(-2i / Dh)``; finite and ``>= 0``. For
        RoPE stretched past its training length, :mod:`mha.rope_scaling` computes them
        (and the ``attention_factor`` to multiply the rotated queries and keys by).
        ``base`` must then keep its default: it made the frequencies already.

    Returns
    -------
    np.ndarray, same shape and dtype as ``x`` (integers become float64)
        Angles are computed in float64, then the cosines and sines are cast.

    Raises
    ------
    ValueError
        If ``Dh`` is odd, ``x`` has fewer than 2 dims, ``positions`` is not integer or
        does not broadcast, ``base`` is not a positive number, or ``inv_freq`` is not
        ``Dh/2`` finite non-negative numbers (or comes with a ``base``).
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
    if inv_freq is None:
        frequencies = _frequencies(head_dim, float(base))  # (Dh/2,)
    else:
        frequencies = _check_inv_freq(inv_freq, head_dim, base)  # (Dh/2,)
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


# ----------------------------------------------------------- T5's relative bias


def t5_relative_position_bucket(
    relative_position: Any,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> np.ndarray:
    """T5's bucket for each relative position ``j - i`` of a key ``j`` seen from a query
    ``i`` (Raffel et al., 2020, section 2.1; the rule of their Mesh TensorFlow code).

    Distances ``n`` are sorted into ``N`` buckets (``N = num_buckets``, or half of it
    in each direction when ``bidirectional``), with ``E = N // 2`` exact ones:

    * ``n < E``: bucket ``n``, one per distance;
    * ``n >= E``: bucket ``E + floor((N - E) * ln(n / E) / ln(max_distance / E))``,
      at most ``N - 1``: buckets whose width grows geometrically, so that every
      distance from about ``max_distance`` on shares the last one.

    That last bucket is what lets T5 run on sequences longer than it was trained on:
    beyond ``max_distance`` every key looks equally far, so no distance is new.

    ``bidirectional`` (an encoder): ``n = |j - i|``, and keys after the query
    (``j > i``) take the upper ``N`` buckets, ``N .. 2N - 1``. Causal (a decoder):
    ``n = max(i - j, 0)``, keys after the query falling in bucket 0 with the query
    itself (the causal mask blocks them).

    Parameters
    ----------
    relative_position : int array_like, any shape
        ``j - i``: key position minus query position.
    bidirectional : bool
        Keyword only. True for T5's encoder, False for its decoder.
    num_buckets : int
        ``>= 4`` bidirectional, ``>= 2`` causal; 32 in T5.
    max_distance : int
        ``> E``; 128 in T5.

    Returns
    -------
    np.ndarray of int64, same shape
        Each in ``0 .. num_buckets - 1`` (``0 .. 2 * (num_buckets // 2) - 1`` when
        bidirectional).
    """
    per_direction, max_exact = check_t5_buckets(num_buckets, max_distance, bidirectional)
    offset = np.asarray(relative_position)
    if offset.dtype == np.bool_ or not np.issubdtype(offset.dtype, np.integer):
        raise ValueError(
            f"relative_position must be integers (key minus query position), got dtype "
            f"{offset.dtype} with shape {offset.shape}"
        )
    offset = offset.astype(np.int64)
    if bidirectional:
        upper = np.where(offset > 0, per_direction, 0)  # keys after the query: upper half
        distance = np.abs(offset)
    else:
        upper = np.zeros_like(offset)
        distance = np.maximum(-offset, 0)  # keys after the query count as distance 0
    # The logarithmic buckets, for every entry (the exact ones are picked below);
    # max(n, E) keeps log away from 0 where the result is not used.
    ratio = np.maximum(distance, max_exact) / max_exact
    growth = np.log(ratio) / np.log(max_distance / max_exact)  # 0 at n = E, 1 at max_distance
    far = max_exact + np.floor(growth * (per_direction - max_exact)).astype(np.int64)
    far = np.minimum(far, per_direction - 1)
    return upper + np.where(distance < max_exact, distance, far)


def t5_relative_bias(
    table: Any,
    size: int,
    num_keys: int | None = None,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> np.ndarray:
    """T5's relative position bias: each head's learned value for the bucket of each
    (query, key) distance, to add to the scores.

    ``bias[h, t, s] = table[bucket(s - i_t), h]``, ``bucket`` being
    :func:`t5_relative_position_bucket` and ``i_t`` query ``t``'s position. T5 shares
    one table among the layers of its encoder (and one among those of its decoder).

    Scaling: T5 adds the bias to the *unscaled* scores ``q . k`` (its initialisation of
    ``W_q`` carries the ``1 / sqrt(Dh)`` instead). :func:`mha.scaled_dot_product_attention`
    adds ``score_bias`` to ``q . k / sqrt(Dh)``; with the queries multiplied by
    ``sqrt(Dh)`` (or ``W_q`` and ``b_q``, for :func:`mha.multi_head_attention`) the two
    agree, this bias passed unchanged: ``softmax(q . k + bias)`` is
    ``softmax((sqrt(Dh) q) . k / sqrt(Dh) + bias)``. Trained from scratch with the
    book's scaled scores, the table simply learns values on that scale.

    Parameters
    ----------
    table : float array_like, shape (num_buckets, H)
        The learned bias of each bucket in each head (T5's ``relative_attention_bias``
        embedding weight); finite.
    size : int
        ``T``, the number of queries.
    num_keys : int, optional
        ``S >= T``: the queries are the *last* ``T`` of ``S`` positions (decoding with a
        cache), as in :func:`mha.causal_mask`. Default ``T``.
    bidirectional : bool
        Keyword only. True (an encoder) or False (a decoder, which still needs
        :func:`mha.causal_mask`: this bias blocks nothing).
    max_distance : int
        See :func:`t5_relative_position_bucket`; 128 in T5.

    Returns
    -------
    np.ndarray, shape (H, T, S), the table's dtype
        Broadcasts against the scores ``(B, H, T, S)``: pass it as ``score_bias``.
    """
    table = as_float_array(table, "table")
    check_ndim(table, 2, "table", "(num_buckets, H)")
    if not np.all(np.isfinite(table)):
        raise ValueError(f"table (shape {table.shape}) must be finite")
    size, num_keys = check_queries_and_keys(size, num_keys)
    queries = np.arange(num_keys - size, num_keys)  # (T,) positions of the last T
    keys = np.arange(num_keys)  # (S,)
    offset = keys[None, :] - queries[:, None]  # (1, S) - (T, 1) -> (T, S): j - i
    buckets = t5_relative_position_bucket(
        offset, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )  # (T, S)
    return table[buckets].transpose(2, 0, 1)  # (T, S, H) -> (H, T, S)
