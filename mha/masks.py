"""Attention masks and converters between the three conventions in use.

Conventions
-----------
**Ours (everywhere in mha):** a boolean array, ``True`` = *this query may attend to
this key*. The same as the boolean ``attn_mask`` of
``torch.nn.functional.scaled_dot_product_attention``. It must broadcast to the
scores ``(B, H, T, S)``: a causal mask is ``(T, T)``, a padding mask ``(B, 1, 1, S)``.

**nn.MultiheadAttention (boolean):** the *opposite*. Its ``key_padding_mask``
``(B, S)`` and boolean ``attn_mask`` ``(T, S)`` or ``(B*H, T, S)`` say ``True`` =
*blocked* ("ignore this key"). Converting is a logical NOT plus a reshape:
:func:`to_torch_key_padding_mask`, :func:`to_torch_attn_mask` and their inverses.

**Additive (float):** ``0`` where attention is allowed and ``-inf`` (or a large
negative number such as ``-1e9``) where it is blocked; it is *added* to the scaled
scores before the softmax, as in ``nn.Transformer.generate_square_subsequent_mask``:
:func:`to_additive_mask`, :func:`from_additive_mask`.

A query row in which every key is blocked gets zero weights in mha (never NaN).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    check_ndim,
    check_non_negative_int,
    check_positive_int,
    check_queries_and_keys,
)

__all__ = [
    "causal_mask",
    "combine_masks",
    "from_additive_mask",
    "from_torch_attn_mask",
    "from_torch_key_padding_mask",
    "padding_mask",
    "sliding_window_mask",
    "to_additive_mask",
    "to_torch_attn_mask",
    "to_torch_key_padding_mask",
]


def causal_mask(size: int, num_keys: int | None = None) -> np.ndarray:
    """Causal ("look-ahead") mask: position ``t`` may attend to positions ``<= t``.

    Parameters
    ----------
    size : int
        ``T``, the number of queries.
    num_keys : int, optional
        ``S >= T``, the number of keys, when the queries are the *last* ``T`` of ``S``
        positions (decoding with a cache of ``S - T`` earlier positions). Default
        ``T``.

    Returns
    -------
    np.ndarray of bool, shape (T, S)
        Query ``t`` sits at position ``S - T + t`` and may attend to the keys up to
        it: the diagonal is aligned to the bottom right. (PyTorch's
        ``scaled_dot_product_attention(..., is_causal=True)`` aligns it to the top
        left, which is a different mask when ``T != S``.) Broadcasts against
        ``(B, H, T, S)``.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    return np.tril(np.ones((size, num_keys), dtype=bool), k=num_keys - size)


def sliding_window_mask(
    size: int, window: int, num_keys: int | None = None, *, num_sinks: int = 0
) -> np.ndarray:
    """Sliding-window ("local") causal mask: a band of ``window`` keys per query, and
    optionally the first ``num_sinks`` positions too.

    Query ``t`` may attend to its own position and to the ``window - 1`` positions just
    before it, nothing earlier and nothing later. Stacked layers still pass information
    further back, one window per layer, while each layer attends to (and a rolling
    :class:`mha.KVCache` stores) at most ``window`` keys per query.

    Attention sinks (StreamingLLM, Xiao et al., 2024): trained language models put much
    of their attention on the first few tokens whatever they say, a place to leave the
    weight no key deserves. A window that has slid past those tokens takes that place
    away, and the model breaks down; keeping the first ``num_sinks`` positions visible
    to every later query (4 in the paper) keeps it working far past the window.

    Parameters
    ----------
    size : int
        ``T``, the number of queries.
    window : int
        How many positions each query sees, itself included; ``window >= S`` gives
        :func:`causal_mask`, ``window = 1`` only the query's own position.
    num_keys : int, optional
        ``S >= T``, the number of keys, when the queries are the *last* ``T`` of ``S``
        positions (as in :func:`causal_mask`). Default ``T``.
    num_sinks : int
        Keyword only, ``>= 0``: keys ``0 .. num_sinks - 1`` stay visible to every
        query at or after them. Default 0, the plain band.

    Returns
    -------
    np.ndarray of bool, shape (T, S)
        ``True`` where ``0 <= (S - T + t) - s < window``, or where ``s < num_sinks``
        and ``s <= S - T + t``: query ``t`` sits at position ``S - T + t`` and key
        ``s`` is at most ``window - 1`` positions behind it, or is a sink before it. The
        band is aligned to the bottom right. Broadcasts against ``(B, H, T, S)``. With
        sinks, a rolling :class:`mha.KVCache` ``(window, num_sinks)`` keeps the sinks
        and the band: the same mask over its kept keys is the mask over all of them.
    """
    size, num_keys = check_queries_and_keys(size, num_keys)
    window = check_positive_int(window, "window")
    num_sinks = check_non_negative_int(num_sinks, "num_sinks")
    query_pos = np.arange(num_keys - size, num_keys)[:, None]  # (T, 1)
    key_pos = np.arange(num_keys)[None, :]  # (1, S)
    distance = query_pos - key_pos  # (T, 1) - (1, S) -> (T, S): how far back each key is
    return (distance >= 0) & ((distance < window) | (key_pos < num_sinks))


def padding_mask(
    lengths: Any | None = None,
    *,
    tokens: Any | None = None,
    pad_id: int | None = None,
    max_len: int | None = None,
) -> np.ndarray:
    """Key padding mask: no query may attend to a padding position.

    Give either ``lengths`` (the first ``lengths[b]`` positions of sequence ``b`` are
    real) or ``tokens`` together with ``pad_id`` (every position holding ``pad_id``
    is padding).

    Parameters
    ----------
    lengths : int array_like, shape (B,), optional
        Number of real tokens per sequence, each in ``0..S``.
    tokens : int array_like, shape (B, S), optional
        Token ids.
    pad_id : int, optional
        The padding id; required with ``tokens``.
    max_len : int, optional
        ``S`` when using ``lengths``; defaults to ``max(lengths)``. Not allowed with
        ``tokens`` (their width is ``S``).

    Returns
    -------
    np.ndarray of bool, shape (B, 1, 1, S)
        True = real key (may be attended to). The two singleton dims broadcast over
        heads and queries of the scores ``(B, H, T, S)``.
    """
    if (lengths is None) == (tokens is None):
        raise ValueError("padding_mask needs exactly one of lengths or tokens")
    if tokens is not None:
        if pad_id is None:
            raise ValueError("padding_mask(tokens=...) needs pad_id")
        if max_len is not None:
            raise ValueError("max_len is only used with lengths; with tokens, S is tokens.shape[1]")
        tokens = np.asarray(tokens)
        check_ndim(tokens, 2, "tokens", "(B, S)")
        keep = tokens != pad_id  # (B, S)
    else:
        if pad_id is not None:
            raise ValueError("pad_id is only used with tokens")
        lengths = np.asarray(lengths)
        check_ndim(lengths, 1, "lengths", "(B,)")
        if lengths.size and not np.issubdtype(lengths.dtype, np.integer):
            raise ValueError(f"lengths must be integers, got dtype {lengths.dtype}")
        if np.any(lengths < 0):
            raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}")
        longest = int(lengths.max()) if lengths.size else 0
        if max_len is None:
            max_len = longest
        elif check_positive_int(max_len, "max_len") < longest:
            raise ValueError(
                f"max_len={max_len} is shorter than the longest sequence in lengths ({longest})"
            )
        positions = np.arange(max_len)  # (S,)
        keep = positions[None, :] < lengths[:, None]  # (1, S) < (B, 1) -> (B, S)
    return keep[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def combine_masks(*masks: Any | None) -> np.ndarray | None:
    """Combine boolean masks: a key may be attended to only if *every* mask allows it.

    ``None`` entries are skipped; with no mask left the result is ``None`` (no mask).
    Shapes broadcast as in NumPy, e.g. causal ``(T, T)`` and padding ``(B, 1, 1, T)``
    give ``(B, 1, T, T)``.

    Returns
    -------
    np.ndarray of bool, or None
    """
    arrays = [as_bool_mask(m, f"masks[{i}]") for i, m in enumerate(masks) if m is not None]
    if not arrays:
        return None
    try:
        shape = np.broadcast_shapes(*(a.shape for a in arrays))
    except ValueError:
        shapes = ", ".join(str(a.shape) for a in arrays)
        raise ValueError(f"masks do not broadcast together: shapes {shapes}") from None
    result = np.ones(shape, dtype=bool)
    for a in arrays:
        result &= a
    return result


def to_torch_key_padding_mask(mask: Any) -> np.ndarray:
    """Our padding mask ``(B, 1, 1, S)``, True = may attend, to
    ``nn.MultiheadAttention``'s ``key_padding_mask`` ``(B, S)``, True = blocked.
    """
    mask = as_bool_mask(mask)
    if mask.ndim != 4 or mask.shape[1:3] != (1, 1):
        raise ValueError(f"mask must have shape (B, 1, 1, S), got shape {mask.shape}")
    return ~mask[:, 0, 0, :]  # (B, 1, 1, S) -> (B, S), then flip the convention


def from_torch_key_padding_mask(mask: Any) -> np.ndarray:
    """``nn.MultiheadAttention``'s boolean ``key_padding_mask`` ``(B, S)``, True = blocked,
    to ours ``(B, 1, 1, S)``, True = may attend.
    """
    mask = as_bool_mask(np.asarray(mask), "key_padding_mask")
    check_ndim(mask, 2, "key_padding_mask", "(B, S)")
    return ~mask[:, None, None, :]  # (B, S) -> (B, 1, 1, S), then flip the convention


def to_torch_attn_mask(mask: Any, num_heads: int | None = None) -> np.ndarray:
    """Our mask to ``nn.MultiheadAttention``'s boolean ``attn_mask``, True = blocked.

    Parameters
    ----------
    mask : bool array_like, shape (T, S) or (B, H or 1, T, S)
        True = may attend.
    num_heads : int, optional
        Required for a 4-D mask: PyTorch wants a 3-D mask as ``(B*H, T, S)``.

    Returns
    -------
    np.ndarray of bool, shape (T, S) or (B*H, T, S)
    """
    mask = as_bool_mask(mask)
    if mask.ndim == 2:
        return ~mask
    if mask.ndim != 4:
        raise ValueError(f"mask must have shape (T, S) or (B, H, T, S), got shape {mask.shape}")
    if num_heads is None:
        raise ValueError(f"a 4-D mask of shape {mask.shape} needs num_heads to become (B*H, T, S)")
    num_heads = check_positive_int(num_heads, "num_heads")
    batch, heads, target_len, source_len = mask.shape
    if heads not in (1, num_heads):
        raise ValueError(
            f"mask with shape {mask.shape} has {heads} heads, expected 1 or num_heads={num_heads}"
        )
    full = np.broadcast_to(mask, (batch, num_heads, target_len, source_len))
    # (B, H, T, S) -> (B*H, T, S): batch-major, the order nn.MultiheadAttention uses
    return ~full.reshape(batch * num_heads, target_len, source_len)


def from_torch_attn_mask(mask: Any, num_heads: int | None = None) -> np.ndarray:
    """``nn.MultiheadAttention``'s boolean ``attn_mask``, True = blocked, to ours.

    Parameters
    ----------
    mask : bool array_like, shape (T, S) or (B*H, T, S)
    num_heads : int, optional
        Required for a 3-D mask, to unfold ``B*H``.

    Returns
    -------
    np.ndarray of bool, shape (T, S) or (B, H, T, S); True = may attend.
    """
    mask = as_bool_mask(np.asarray(mask), "attn_mask")
    if mask.ndim == 2:
        return ~mask
    if mask.ndim != 3:
        raise ValueError(f"attn_mask must have shape (T, S) or (B*H, T, S), got shape {mask.shape}")
    if num_heads is None:
        raise ValueError(f"a 3-D attn_mask of shape {mask.shape} needs num_heads")
    num_heads = check_positive_int(num_heads, "num_heads")
    if mask.shape[0] % num_heads != 0:
        raise ValueError(
            f"attn_mask first dim {mask.shape[0]} (shape {mask.shape}) is not a multiple "
            f"of num_heads={num_heads}"
        )
    # (B*H, T, S) -> (B, H, T, S)
    return ~mask.reshape(mask.shape[0] // num_heads, num_heads, *mask.shape[1:])


def to_additive_mask(mask: Any, dtype: Any = np.float64, fill: float = -np.inf) -> np.ndarray:
    """Boolean mask (True = may attend) to an additive float mask.

    Parameters
    ----------
    mask : bool array_like, any shape
    dtype : NumPy floating dtype
    fill : float
        Value at blocked positions; must be negative. ``-inf`` blocks exactly;
        ``-1e9`` is a common finite stand-in.

    Returns
    -------
    np.ndarray of ``dtype``, same shape: 0 where allowed, ``fill`` where blocked.
    """
    mask = as_bool_mask(mask)
    if not fill < 0:
        raise ValueError(f"fill must be negative (it blocks attention), got {fill}")
    return np.where(mask, 0.0, fill).astype(dtype)


def from_additive_mask(additive: Any) -> np.ndarray:
    """Additive float mask (0 = allowed, negative = blocked) to a boolean mask.

    Returns
    -------
    np.ndarray of bool, same shape; True where ``additive == 0``.

    Raises
    ------
    ValueError
        If an entry is NaN or positive: then it is a bias, not a mask.
    """
    additive = as_float_array(additive, "additive")
    if np.any(np.isnan(additive)) or np.any(additive > 0):
        raise ValueError(
            f"additive mask (shape {additive.shape}) must hold 0 (allowed) or negative "
            f"values (blocked); it has NaN or positive entries"
        )
    return additive == 0
