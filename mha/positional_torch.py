"""RoPE, ALiBi and T5's bias in PyTorch: the torch twins of the specification's functions.

:func:`apply_rope`, :func:`alibi_slopes`, :func:`alibi_bias`,
:func:`t5_relative_position_bucket` and :func:`t5_relative_bias` compute what the
functions of the same names in :mod:`mha.positional` specify, on tensors and with
autograd, for :class:`mha.modules.MultiHeadAttention` (``rope_positions=`` and
``score_bias=``). Written again here, not imported: the tests compare the two.
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor

from mha._checks import check_positive_int, check_queries_and_keys, check_t5_buckets

__all__ = [
    "alibi_bias",
    "alibi_bias_directional",
    "alibi_slopes",
    "apply_rope",
    "t5_relative_bias",
    "t5_relative_position_bucket",
]


def _frequencies(head_dim: int, base: float, device: torch.device | str | None = None) -> Tensor:
    """``base^(-2i / Dh)`` for ``i = 0 .. Dh/2 - 1``, float64: RoPE's frequencies as
    trained (also the start of every scaling in :mod:`mha.rope_scaling_torch`)."""
    two_i = torch.arange(0, head_dim, 2, dtype=torch.float64, device=device)  # (Dh/2,)
    return torch.exp(two_i * (-math.log(base) / head_dim))  # base^(-2i/Dh)


def apply_rope(
    x: Tensor, positions: Tensor, base: float = 10000.0, *, inv_freq: Tensor | None = None
) -> Tensor:
    """Rotary position embedding: turn pair ``(2i, 2i + 1)`` of the vector at position
    ``m`` by the angle ``m * base^(-2i / Dh)``.

    The same function as ``mha.apply_rope`` (adjacent pairs, as in the RoFormer paper;
    see there for the other convention), on tensors and with autograd.

    Parameters
    ----------
    x : Tensor
        ``(..., L, Dh)`` float, ``Dh`` even: query or key heads, e.g. ``(B, H, L, Dh)``.
    positions : Tensor
        Integer, ``(L,)`` or broadcastable to ``x``'s ``(..., L)`` without enlarging it.
    base : float
        Positive; 10000 in the paper.
    inv_freq : Tensor, optional
        Keyword only: ``(Dh/2,)`` finite, non-negative frequencies in place of
        ``base^(-2i / Dh)`` (from :mod:`mha.rope_scaling_torch`), as in
        ``mha.apply_rope``; ``base`` must then keep its default.

    Returns
    -------
    Tensor
        Same shape and dtype as ``x``; the angles are computed in float64.
    """
    if not isinstance(x, Tensor) or not x.dtype.is_floating_point or x.ndim < 2:
        kind = f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be a float tensor (..., L, Dh), got {kind}")
    head_dim = x.shape[-1]
    if head_dim % 2 != 0:
        raise ValueError(
            f"x's last dim Dh must be even (RoPE rotates pairs of dimensions), got shape "
            f"{tuple(x.shape)}"
        )
    if not isinstance(positions, Tensor) or positions.dtype.is_floating_point or (
        positions.dtype.is_complex or positions.dtype == torch.bool
    ):
        kind = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise ValueError(f"positions must be an integer tensor, got {kind}")
    lead = tuple(x.shape[:-1])
    if not 1 <= positions.ndim <= len(lead) or any(
        got not in (1, want)
        for got, want in zip(positions.shape[::-1], lead[::-1], strict=False)
    ):
        raise ValueError(
            f"positions of shape {tuple(positions.shape)} does not broadcast to x's "
            f"(..., L) = {lead}: it needs the L dim, and every dim must be 1 or match"
        )
    if isinstance(base, bool) or not isinstance(base, numbers.Real) or not 0 < base < math.inf:
        raise ValueError(f"base must be a positive finite number, got {base!r}")
    if inv_freq is None:
        frequencies = _frequencies(head_dim, base, x.device)  # (Dh/2,)
    else:
        frequencies = _check_inv_freq(inv_freq, head_dim, base).to(x.device)  # (Dh/2,)
    angles = positions.to(torch.float64)[..., None] * frequencies  # (..., L, Dh/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, Dh/2): first and second of each pair
    rotated = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1)
    return rotated.flatten(-2)  # (..., L, Dh/2, 2) -> (..., L, Dh)


def _check_inv_freq(inv_freq: Tensor, head_dim: int, base: float) -> Tensor:
    """``inv_freq`` as ``Dh/2`` finite non-negative float64 frequencies, given without a
    ``base`` of its own (the default is the only one accepted)."""
    if base != 10000.0:
        raise ValueError(
            f"base={base!r} is not used with inv_freq: give it to the function that "
            "computes the frequencies (mha.rope_scaling_torch)"
        )
    if not isinstance(inv_freq, Tensor) or not inv_freq.dtype.is_floating_point:
        kind = inv_freq.dtype if isinstance(inv_freq, Tensor) else type(inv_freq).__name__
        raise ValueError(f"inv_freq must be a float tensor, got {kind}")
    if tuple(inv_freq.shape) != (head_dim // 2,):
        raise ValueError(
            f"inv_freq must have shape (Dh/2,) = ({head_dim // 2},), one frequency per pair "
            f"of x's Dh = {head_dim} dimensions, got shape {tuple(inv_freq.shape)}"
        )
    frequencies = inv_freq.to(torch.float64)
    if not bool(torch.all(torch.isfinite(frequencies) & (frequencies >= 0))):
        raise ValueError(f"inv_freq must be finite and >= 0, got {frequencies}")
    return frequencies


def alibi_slopes(
    num_heads: int, *, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """ALiBi's slope per head, as ``mha.alibi_slopes``: ``2^(-8k/H)``, ``k = 1..H``, for
    ``H`` a power of two; otherwise those of the largest power of two ``p < H``, then
    ``2^(-4k/p)`` for odd ``k = 1, 3, ...`` until there are ``H``.

    Returns
    -------
    Tensor
        ``(H,)`` in ``dtype`` (default: torch's default dtype).
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    power = 1 << (num_heads.bit_length() - 1)  # largest power of two <= H
    k = torch.arange(1, power + 1, dtype=torch.float64)
    slopes = torch.pow(2.0, -8.0 * k / power)  # (p,)
    odd = 2 * torch.arange(num_heads - power, dtype=torch.float64) + 1  # (H - p,) 1, 3, ...
    slopes = torch.cat([slopes, torch.pow(2.0, -4.0 * odd / power)])  # (H,)
    return slopes.to(dtype=dtype or torch.get_default_dtype(), device=device)


def alibi_bias(
    num_heads: int,
    size: int,
    num_keys: int | None = None,
    causal: bool = True,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """ALiBi's additive bias ``-slope_h * distance``, as ``mha.alibi_bias``.

    The queries are the last ``size = T`` of ``num_keys = S`` positions. ``causal``:
    ``distance = i - j`` for keys up to the query and 0 for keys after it (the causal
    mask blocks those); otherwise ``|i - j|``.

    Returns
    -------
    Tensor
        ``(H, T, S)``, ``<= 0``, for the ``bias`` of :meth:`MultiHeadAttention.forward`.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    slopes = alibi_slopes(num_heads, dtype=torch.float64, device=device)  # (H,)
    queries = torch.arange(num_keys - size, num_keys, device=device)  # (T,)
    keys = torch.arange(num_keys, device=device)  # (S,)
    offset = keys[None, :] - queries[:, None]  # (1, S) - (T, 1) -> (T, S): j - i
    offset = offset.clamp(max=0) if causal else -offset.abs()  # integers: never -0
    bias = slopes[:, None, None] * offset  # (H, 1, 1) * (T, S) -> (H, T, S)
    return bias.to(dtype or torch.get_default_dtype())


def alibi_bias_directional(
    num_heads: int,
    size: int,
    *,
    dtype: torch.dtype | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """A bidirectional ALiBi that tells left from right, for an encoder.

    The symmetric bias ``-slope_h * |i - j|`` (``alibi_bias(..., causal=False)``) gives a
    key three words to the left the same score as one three words to the right, so an
    encoder using it cannot tell a sentence from its mirror image. Here head ``h``
    lowers keys to its left (``j < i``) with the paper's slope ``s_h`` and keys to its
    right (``j > i``) with the slope of the head at the other end, ``s_{H-1-h}``: the
    first head looks mostly left, the last mostly right, and (for ``H > 1``) no head's
    bias is its own mirror image. For one head the two slopes coincide and this is the
    symmetric bias. (ALiBi's paper defines only the causal bias; this variant is ours.)

    Parameters
    ----------
    num_heads, size : int
        ``H`` and ``T``: queries and keys are the same ``T`` positions.

    Returns
    -------
    Tensor
        ``(H, T, T)``, ``<= 0``, zero on the diagonal.
    """
    size, _ = check_queries_and_keys(size, None)
    left = alibi_slopes(num_heads, dtype=torch.float64, device=device)  # (H,)
    right = left.flip(0)  # (H,): head h gets head H-1-h's slope to the right
    positions = torch.arange(size, device=device)  # (T,)
    offset = positions[None, :] - positions[:, None]  # (1, T) - (T, 1) -> (T, T): j - i
    before = offset.clamp(max=0)  # (T, T): j - i where j < i, else 0
    after = -offset.clamp(min=0)  # (T, T): i - j where j > i, else 0
    bias = left[:, None, None] * before + right[:, None, None] * after  # (H, T, T)
    return bias.to(dtype or torch.get_default_dtype())


def t5_relative_position_bucket(
    relative_position: Tensor,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket of each relative position ``j - i`` (key minus query position), as
    ``mha.t5_relative_position_bucket``: distances ``n < E = N // 2`` get one bucket
    each, longer ones ``E + floor((N - E) ln(n / E) / ln(max_distance / E))``, at most
    ``N - 1``; ``N`` is ``num_buckets``, halved per direction when ``bidirectional``
    (keys after the query then take the upper half), and a causal model counts keys
    after the query as distance 0.

    Returns
    -------
    Tensor
        int64, the shape of ``relative_position``; the logarithm is taken in float64.
    """
    per_direction, max_exact = check_t5_buckets(num_buckets, max_distance, bidirectional)
    if not isinstance(relative_position, Tensor) or (
        relative_position.dtype.is_floating_point
        or relative_position.dtype.is_complex
        or relative_position.dtype == torch.bool
    ):
        kind = (
            relative_position.dtype
            if isinstance(relative_position, Tensor)
            else type(relative_position).__name__
        )
        raise ValueError(f"relative_position must be an integer tensor, got {kind}")
    offset = relative_position.to(torch.int64)
    if bidirectional:
        upper = (offset > 0).to(torch.int64) * per_direction  # keys after: upper half
        distance = offset.abs()
    else:
        upper = torch.zeros_like(offset)
        distance = (-offset).clamp(min=0)  # keys after the query: distance 0
    ratio = distance.clamp(min=max_exact).to(torch.float64) / max_exact  # >= 1: no log(0)
    growth = ratio.log() / math.log(max_distance / max_exact)  # 0 at E, 1 at max_distance
    far = max_exact + torch.floor(growth * (per_direction - max_exact)).to(torch.int64)
    far = far.clamp(max=per_direction - 1)
    return upper + torch.where(distance < max_exact, distance, far)


def t5_relative_bias(
    table: Tensor,
    size: int,
    num_keys: int | None = None,
    *,
    bidirectional: bool = True,
    max_distance: int = 128,
) -> Tensor:
    """T5's relative position bias from its learned ``(num_buckets, H)`` table, as
    ``mha.t5_relative_bias``: ``bias[h, t, s] = table[bucket(s - i_t), h]``, the queries
    the last ``T = size`` of ``S = num_keys`` positions. Differentiable in ``table``.

    T5 adds it to the unscaled scores ``q . k``; :class:`MultiHeadAttention` adds
    ``score_bias`` to ``q . k / sqrt(Dh)``: the same once the queries carry ``sqrt(Dh)``
    (see ``mha.t5_relative_bias``).

    Returns
    -------
    Tensor
        ``(H, T, S)`` in ``table``'s dtype, for ``score_bias``.
    """
    if not isinstance(table, Tensor) or not table.dtype.is_floating_point or table.ndim != 2:
        kind = (
            f"{table.dtype} {tuple(table.shape)}"
            if isinstance(table, Tensor)
            else type(table).__name__
        )
        raise ValueError(f"table must be a float tensor (num_buckets, H), got {kind}")
    size, num_keys = check_queries_and_keys(size, num_keys)
    queries = torch.arange(num_keys - size, num_keys, device=table.device)  # (T,)
    keys = torch.arange(num_keys, device=table.device)  # (S,)
    offset = keys[None, :] - queries[:, None]  # (1, S) - (T, 1) -> (T, S): j - i
    buckets = t5_relative_position_bucket(
        offset, bidirectional=bidirectional, num_buckets=table.shape[0], max_distance=max_distance
    )  # (T, S)
    return table[buckets].permute(2, 0, 1)  # (T, S, H) -> (H, T, S)
