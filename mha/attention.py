"""Multi-head attention in NumPy: the readable specification the rest of `mha` is tested against.

The code follows Vaswani et al. (2017), section 3.2, one named step at a time, so
that a chapter can print any intermediate and a test can compare it with PyTorch.
Shapes follow the legend in :mod:`mha`. Masks are boolean with **True = may attend**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    as_score_bias,
    check_divisible,
    check_kv_heads,
    check_mask_shape,
    check_ndim,
    check_positive_int,
    check_qkv,
)
from mha.kv_cache import KVCache
from mha.params import AttentionParams

__all__ = [
    "AttentionSteps",
    "kv_head_index",
    "merge_heads",
    "multi_head_attention",
    "multi_head_attention_steps",
    "scaled_dot_product_attention",
    "softmax",
    "split_heads",
]


def softmax(x: Any, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    Parameters
    ----------
    x : array_like, any shape
        Real numbers; ``-inf`` entries get probability exactly 0.
    axis : int
        The axis that sums to 1; it may have length 0 (attention over no keys).

    Returns
    -------
    np.ndarray, same shape as ``x``
        Probabilities along ``axis``. A slice whose entries are *all* ``-inf`` (a
        query that may attend to nothing) gets all zeros instead of NaN; so does
        every slice of an empty axis, trivially. A slice containing NaN or ``+inf``
        has no defined softmax and becomes all NaN, as in ``torch.softmax``: a NaN is
        never hidden as zeros.

    Notes
    -----
    Subtracting the maximum first leaves the result unchanged (the factor
    ``exp(-max)`` cancels) but keeps ``exp`` from overflowing for large inputs.
    """
    x = as_float_array(x, "x")
    # initial=-inf: an empty axis has maximum -inf, like an all -inf slice. NaN wins.
    x_max = np.max(x, axis=axis, keepdims=True, initial=-np.inf)
    # NaN or +inf in a slice: there is no distribution to compute (+inf - +inf = NaN).
    undefined = np.isnan(x_max) | np.isposinf(x_max)
    # An all -inf slice: nothing to attend to.
    empty = np.isneginf(x_max)
    # Shift those slices by 0 (and zero the undefined ones) so that no inf - inf is ever
    # computed: NumPy would warn, and the result is set below anyway.
    x_max = np.where(undefined | empty, 0.0, x_max)
    exp = np.exp(np.where(undefined, 0.0, x) - x_max)
    total = np.sum(exp, axis=axis, keepdims=True)  # >= 1 except in empty slices
    probs = np.divide(exp, total, out=np.zeros_like(exp), where=~empty)
    return np.where(undefined, np.nan, probs)


def _attention_core(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None,
    score_bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The five steps of scaled dot-product attention on validated arrays.

    Returns ``(scores, scaled, masked, weights, context)``; shared by
    :func:`scaled_dot_product_attention` and :func:`multi_head_attention_steps` so
    the formula exists exactly once. ``masked`` includes the ``score_bias``.
    """
    head_dim = q.shape[-1]
    # 1. Similarity of every query with every key.
    scores = q @ np.swapaxes(k, -1, -2)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)
    # 2. Dot products of Dh random components grow like sqrt(Dh); dividing keeps the
    #    softmax out of its saturated, small-gradient region. A Python float keeps
    #    float32 inputs in float32.
    scaled = scores / math.sqrt(head_dim)
    # 3. An additive bias (ALiBi's distance penalty) shifts the scores before the
    #    softmax, in the scores' dtype; blocked positions then become -inf so that the
    #    softmax gives them exactly 0, whatever their bias.
    biased = scaled if score_bias is None else scaled + score_bias.astype(scaled.dtype, copy=False)
    masked = biased if mask is None else np.where(mask, biased, -np.inf)
    # 4. Each query's weights over the keys sum to 1 (or are all 0 if nothing is allowed).
    weights = softmax(masked, axis=-1)
    # 5. Weighted average of the values.
    context = weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    return scores, scaled, masked, weights, context


def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any | None = None, *, score_bias: Any | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention, ``softmax(q k^T / sqrt(Dh) + score_bias) v``.

    Parameters
    ----------
    q : array_like, shape (..., T, Dh)
        Queries.
    k : array_like, shape (..., S, Dh)
        Keys; same leading dims as ``q``.
    v : array_like, shape (..., S, Dv)
        Values; one per key.
    mask : bool array_like, optional
        **True = may attend.** At least 2 dims, broadcastable to ``(..., T, S)`` without
        enlarging it (each dim 1 or equal, right-aligned), e.g. ``(T, S)`` from
        :func:`mha.causal_mask` or ``(B, 1, 1, S)`` from :func:`mha.padding_mask`. A
        2-D mask is always read as ``(T, S)``, one row per query: a ``(B, S)`` padding
        mask with ``B == T`` passes the shape check and is silently misread.
    score_bias : float array_like, optional
        Keyword only. Added to the scaled scores before the softmax, e.g. ALiBi's
        :func:`mha.alibi_bias` ``(H, T, S)``. Same shape rule as ``mask``; finite
        (cast to the scores' dtype). It never unblocks a key the mask blocks, and a
        row with nothing to attend to keeps zero weights.

    Returns
    -------
    context : np.ndarray, shape (..., T, Dv)
    weights : np.ndarray, shape (..., T, S)
        Each row sums to 1 over its allowed keys; blocked entries are exactly 0. A
        query row with **no** allowed key (and every row when there are no keys,
        ``S = 0``) gets zero weights and zero context — never NaN. A NaN (or ``+inf``)
        score in a row that can attend makes that row NaN, as in PyTorch: it is not
        hidden as zeros. (``nn.MultiheadAttention`` in torch 2.13 returns NaN for a row
        with nothing to attend to when it computes weights, ``need_weights=True``, and
        on its fused fast path, ``need_weights=False`` under ``torch.no_grad()`` in eval
        mode; with ``need_weights=False`` and autograd on it calls
        ``F.scaled_dot_product_attention`` and returns zeros, like mha.)

    Raises
    ------
    ValueError
        If the shapes of ``q``, ``k``, ``v`` disagree, ``mask`` is not boolean, ``score_bias``
        is not a finite float array, or either does not broadcast to ``(..., T, S)``.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    check_qkv(q, k, v)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, q.shape[:-1] + (k.shape[-2],))
    if score_bias is not None:
        score_bias = as_score_bias(score_bias, q.shape[:-1] + (k.shape[-2],))
    _, _, _, weights, context = _attention_core(q, k, v, mask, score_bias)
    return context, weights


def split_heads(x: Any, num_heads: int) -> np.ndarray:
    """Split the feature axis into heads: ``(B, T, D) -> (B, H, T, Dh)``.

    The split is *logical*: head ``h`` gets features ``h*Dh:(h+1)*Dh`` of each
    token; no data is duplicated and no weights are added. Any leading dims are
    kept, so ``(..., T, D) -> (..., H, T, Dh)``.

    Parameters
    ----------
    x : array_like, shape (B, T, D)
    num_heads : int
        ``H``; must divide ``D``.

    Returns
    -------
    np.ndarray, shape (B, H, T, Dh) with ``Dh = D // H``
    """
    x = np.asarray(x)
    if x.ndim < 2:
        raise ValueError(f"x must have shape (B, T, D), got shape {x.shape}")
    *lead, length, d_model = x.shape
    head_dim = check_divisible(d_model, num_heads)
    x = x.reshape(*lead, length, num_heads, head_dim)  # (B, T, D) -> (B, T, H, Dh)
    return np.swapaxes(x, -3, -2)  # (B, T, H, Dh) -> (B, H, T, Dh)


def merge_heads(x: Any) -> np.ndarray:
    """Concatenate the heads again: ``(B, H, T, Dh) -> (B, T, H * Dh)``; inverse of
    :func:`split_heads`.

    Parameters
    ----------
    x : array_like, shape (B, H, T, Dh)

    Returns
    -------
    np.ndarray, shape (B, T, D) with ``D = H * Dh``
    """
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"x must have shape (B, H, T, Dh), got shape {x.shape}")
    *lead, num_heads, length, head_dim = x.shape
    x = np.swapaxes(x, -3, -2)  # (B, H, T, Dh) -> (B, T, H, Dh)
    return x.reshape(*lead, length, num_heads * head_dim)  # (B, T, H, Dh) -> (B, T, D)


@dataclass(frozen=True, eq=False)
class AttentionSteps:
    """Every intermediate of :func:`multi_head_attention`, in the order computed.

    Attributes
    ----------
    q : (B, T, D)         projected queries, ``query @ W_q + b_q``
    k : (B, S_new, Dkv)   projected keys of this call (``Dkv = D`` unless grouped)
    v : (B, S_new, Dkv)   projected values of this call
    q_heads : (B, H, T, Dh)
    k_heads : (B, Hkv, S, Dh)  every key head attended to: with a cache, the cached
                               (kept) ones first (``Hkv = H`` unless grouped)
    v_heads : (B, Hkv, S, Dh)
    scores : (B, H, T, S)   raw ``q_heads @ k_heads^T``
    scaled : (B, H, T, S)   ``scores / sqrt(Dh)``
    masked : (B, H, T, S)   ``scaled`` plus the score bias, with ``-inf`` where the mask
                            blocks (same as ``scaled`` with neither)
    weights : (B, H, T, S)  softmax over S; zero rows where nothing is allowed
    context : (B, H, T, Dh) ``weights @ v_heads``, one result per head
    merged : (B, T, D)      heads concatenated again
    output : (B, T, D)      ``merged @ W_o + b_o``
    """

    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    q_heads: np.ndarray
    k_heads: np.ndarray
    v_heads: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    context: np.ndarray
    merged: np.ndarray
    output: np.ndarray


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w  # (B, L, D_in) @ (D_in, D_out) -> (B, L, D_out)
    return y if b is None else y + b


def kv_head_index(num_heads: int, num_kv_heads: int) -> np.ndarray:
    """Grouped-query attention's head mapping: the key/value head each query head reads.

    Query head ``h`` reads key/value head ``h // (H / Hkv)``: consecutive query heads
    share one (``Hkv = H`` is multi-head attention, ``Hkv = 1`` multi-query attention).

    Returns
    -------
    np.ndarray, shape (H,), int
    """
    num_heads = check_positive_int(num_heads, "num_heads")
    return np.arange(num_heads) // check_kv_heads(num_heads, num_kv_heads)


def multi_head_attention_steps(
    query: Any,
    key: Any,
    value: Any,
    params: AttentionParams,
    num_heads: int,
    mask: Any | None = None,
    *,
    cache: KVCache | None = None,
    score_bias: Any | None = None,
) -> AttentionSteps:
    """Multi-head attention, returning every intermediate (see :class:`AttentionSteps`).

    Parameters
    ----------
    query : array_like, shape (B, T, D)
    key : array_like, shape (B, S, Dk)      (``Dk = D`` for the usual layers)
    value : array_like, shape (B, S, Dv)
        Self-attention passes the same array three times; cross-attention takes
        ``query`` from the decoder and ``key = value`` from the encoder.
    params : AttentionParams
    num_heads : int
        ``H``; must divide ``D``.
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(B, H, T, S)`` as described in
        :func:`scaled_dot_product_attention`; ``S`` counts the cached positions too
        (``mha.causal_mask(T, num_keys=S)`` for the last ``T`` of ``S`` positions); with
        a rolling cache only the kept ones, ``S = cache.kept_length + key.shape[1]``
        (and the mask is ``mha.sliding_window_mask(T, cache.window, num_keys=S)``).
        A 2-D mask is always read as ``(T, S)``, one row per query, the same for every
        sequence: a ``(B, S)`` padding mask with ``B == T`` passes the shape check and
        is silently misread. Padding is ``(B, 1, 1, S)``, as :func:`mha.padding_mask`
        returns it.
    cache : KVCache, optional
        Keyword only, as ``score_bias``. The key and value heads of earlier
        positions: the heads of ``key`` and ``value`` are appended to it, and the
        queries attend to all of them (with a ``window``, to the last ``window - 1``
        cached ones and the new ones).
    score_bias : float array_like, optional
        Added to the scaled scores of every head before the softmax, broadcastable to
        ``(B, H, T, S)`` like ``mask``: ALiBi's ``mha.alibi_bias(H, T, num_keys=S)``
        ``(H, T, S)``. See :func:`scaled_dot_product_attention`.

    Grouped-query attention comes from ``params``: when ``W_k`` and ``W_v`` project to
    ``Dkv = num_kv_heads * head_dim`` features, query head ``h`` uses key/value head
    ``h // (num_heads // num_kv_heads)`` (:func:`kv_head_index`).

    Returns
    -------
    AttentionSteps

    Raises
    ------
    ValueError
        For shape, dtype or mask errors, naming the argument and the shapes.
    """
    if not isinstance(params, AttentionParams):
        raise ValueError(f"params must be an AttentionParams, got {type(params).__name__}")
    query = as_float_array(query, "query")
    key = as_float_array(key, "key")
    value = as_float_array(value, "value")
    check_ndim(query, 3, "query", "(B, T, D)")
    check_ndim(key, 3, "key", "(B, S, D)")
    check_ndim(value, 3, "value", "(B, S, D)")
    if not query.shape[0] == key.shape[0] == value.shape[0]:
        raise ValueError(
            f"query, key and value must have the same batch size B, got query "
            f"{query.shape}, key {key.shape}, value {value.shape}"
        )
    if key.shape[1] != value.shape[1]:
        raise ValueError(
            f"key and value must have the same length S, got key {key.shape} and "
            f"value {value.shape}"
        )
    for name, x, w in (("query", query, "W_q"), ("key", key, "W_k"), ("value", value, "W_v")):
        w_shape = getattr(params, w).shape
        if x.shape[-1] != w_shape[0]:
            raise ValueError(
                f"{name} has {x.shape[-1]} features (shape {x.shape}) but params.{w} "
                f"expects {w_shape[0]} (shape {w_shape})"
            )
    num_kv_heads = params.num_kv_heads(num_heads)  # checks num_heads too
    if cache is not None and not isinstance(cache, KVCache):
        raise ValueError(
            f"cache must be a mha.KVCache, got {type(cache).__module__}."
            f"{type(cache).__qualname__} (mha.kv_cache_torch.KVCache is the torch layers')"
        )
    batch, target_len = query.shape[0], query.shape[1]
    # S: the new keys, after the cached ones that the append keeps (all, or window - 1).
    source_len = key.shape[1] + (0 if cache is None else cache.kept_length)
    if cache is not None:
        cache.check_block(target_len, source_len, has_mask=mask is not None)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (batch, num_heads, target_len, source_len))
    if score_bias is not None:
        score_bias = as_score_bias(score_bias, (batch, num_heads, target_len, source_len))

    # 1. One linear layer per role; all heads at once (the split is only logical).
    q = _linear(query, params.W_q, params.b_q)  # (B, T, D) @ (D, D) -> (B, T, D)
    k = _linear(key, params.W_k, params.b_k)  # (B, S, Dk) @ (Dk, Dkv) -> (B, S, Dkv)
    v = _linear(value, params.W_v, params.b_v)  # (B, S, Dv) @ (Dv, Dkv) -> (B, S, Dkv)
    # 2. Give each head its own Dh-wide slice of the features.
    q_heads = split_heads(q, num_heads)  # (B, T, D) -> (B, H, T, Dh)
    k_heads = split_heads(k, num_kv_heads)  # (B, S, Dkv) -> (B, Hkv, S, Dh)
    v_heads = split_heads(v, num_kv_heads)  # (B, S, Dkv) -> (B, Hkv, S, Dh)
    if cache is not None:  # the earlier positions' heads come first
        k_heads, v_heads = cache.append(k_heads, v_heads)  # (B, Hkv, S_all, Dh)
    # 3. Scaled dot-product attention in every head in parallel; a group of
    #    H / Hkv query heads reads the same key/value head.
    index = kv_head_index(num_heads, num_kv_heads)  # (H,): the key/value head of each
    k_shared = k_heads[:, index]  # (B, Hkv, S, Dh) -> (B, H, S, Dh), a copy
    v_shared = v_heads[:, index]  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
    scores, scaled, masked, weights, context = _attention_core(
        q_heads, k_shared, v_shared, mask, score_bias
    )
    # 4. Concatenate the heads and mix them with the output projection.
    merged = merge_heads(context)  # (B, H, T, Dh) -> (B, T, D)
    output = _linear(merged, params.W_o, params.b_o)  # (B, T, D) @ (D, D) -> (B, T, D)
    return AttentionSteps(
        q=q,
        k=k,
        v=v,
        q_heads=q_heads,
        k_heads=k_heads,
        v_heads=v_heads,
        scores=scores,
        scaled=scaled,
        masked=masked,
        weights=weights,
        context=context,
        merged=merged,
        output=output,
    )


def multi_head_attention(
    query: Any,
    key: Any,
    value: Any,
    params: AttentionParams,
    num_heads: int,
    mask: Any | None = None,
    *,
    cache: KVCache | None = None,
    score_bias: Any | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_o`` with
    ``head_h = Attention(Q W_q^h, K W_k^h, V W_v^h)``, computed for all heads at once.
    Arguments as in :func:`multi_head_attention_steps`; a 2-D ``mask`` is ``(T, S)``
    there too, so padding goes in as :func:`mha.padding_mask`'s ``(B, 1, 1, S)``.

    Returns
    -------
    output : np.ndarray, shape (B, T, D)
    weights : np.ndarray, shape (B, H, T, S)
        Per-head attention weights (not averaged over heads).
    """
    steps = multi_head_attention_steps(
        query, key, value, params, num_heads, mask, cache=cache, score_bias=score_bias
    )
    return steps.output, steps.weights
