"""The backward pass of attention, by hand: each forward function's gradient beside it.

Training needs, for every input and weight of a layer, how a small change moves the loss.
Given ``d_output = dL/d output`` (same shape as the output), the chain rule walks the
forward's steps in reverse, one vector-Jacobian product per step:

* :func:`mha.softmax`: :func:`softmax_backward`;
* :func:`mha.scaled_dot_product_attention`: :func:`attention_backward` (and
  :func:`attention_backward_steps`, every intermediate of it, for the figures);
* :func:`mha.split_heads` and :func:`mha.merge_heads`: :func:`split_heads_backward` and
  :func:`merge_heads_backward` (each is the other's forward);
* :func:`mha.multi_head_attention`: :func:`multi_head_attention_backward`;
* :func:`mha.flash_attention`: :func:`flash_attention_backward`, tile by tile (a
  :class:`BackwardTileTrace` records what each tile added).

For one head, with ``c = 1 / sqrt(Dh)``, ``P`` the weights and ``O = P V`` the context::

    dV = P^T dO                      (S, T) @ (T, Dv)
    dP = dO V^T                      (T, Dv) @ (Dv, S)
    dZ = P * (dP - rowsum(dP * P))   the softmax's backward, elementwise
    dQ = c * dZ K                    (T, S) @ (S, Dh)
    dK = c * dZ^T Q                  (S, T) @ (T, Dh)

``dZ`` is the gradient of the scaled, biased scores (the softmax's input), hence also of
an additive ``score_bias``. Where the mask blocks a key, ``P = 0`` exactly, so ``dZ = 0``
exactly there: a blocked key receives no gradient through that query. A query row with
nothing to attend to has ``P = 0`` in every entry, so its whole gradient is zero, never
NaN (the forward gave it zero weights and zero context; its output does not depend on
``q``, ``k`` or ``v``).

Shapes follow the legend in :mod:`mha`; masks are boolean with **True = may attend**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    as_score_bias,
    check_mask_shape,
    check_ndim,
    check_positive_int,
    check_qkv,
)
from mha.attention import (
    AttentionSteps,
    _attention_core,
    kv_head_index,
    merge_heads,
    multi_head_attention_steps,
    scaled_dot_product_attention,
    split_heads,
)
from mha.params import AttentionParams

__all__ = [
    "AttentionBackwardSteps",
    "AttentionGradients",
    "BackwardTileStep",
    "BackwardTileTrace",
    "attention_backward",
    "attention_backward_steps",
    "flash_attention_backward",
    "merge_heads_backward",
    "multi_head_attention_backward",
    "softmax_backward",
    "split_heads_backward",
]


def _check_same_shape(grad: np.ndarray, name: str, shape: tuple[int, ...], of: str) -> None:
    """A gradient has the shape of the forward value it belongs to."""
    if grad.shape != shape:
        raise ValueError(
            f"{name} must have the shape of {of} {shape} (a gradient has the shape of "
            f"what it is the gradient of), got {grad.shape}"
        )


def _sum_to_shape(grad: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The backward of broadcasting: sum ``grad`` over the dims that broadcasting
    ``shape`` to ``grad.shape`` created or stretched, giving an array of ``shape``."""
    extra = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(extra)))  # dims that were added in front
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True)


# ---------------------------------------------------------------------------- softmax


def softmax_backward(weights: Any, d_weights: Any, axis: int = -1) -> np.ndarray:
    """The gradient of :func:`mha.softmax`'s input, given its output and the output's
    gradient: ``dz = p * (dp - sum(dp * p, axis))``.

    Derivation. For one slice ``p = softmax(z)``, ``p_i = exp(z_i) / sum_k exp(z_k)``, so
    ``dp_i / dz_j = p_i (delta_ij - p_j)``: the Jacobian is ``J = diag(p) - p p^T``.
    It is symmetric, so the vector-Jacobian product is
    ``dz = J^T dp = J dp = p * dp - p (p . dp) = p * (dp - p . dp)``: the diagonal term
    ``p * dp`` alone would forget that raising one score lowers every other weight.
    ``J`` itself, ``L x L`` per slice, is never formed.

    Parameters
    ----------
    weights : array_like, any shape
        The softmax's output ``p`` (what the forward returned).
    d_weights : array_like, same shape as ``weights``
        ``dL/dp``.
    axis : int
        The axis the forward's softmax ran along.

    Returns
    -------
    np.ndarray, same shape as ``weights``
        ``dL/dz``. Where ``p = 0`` (a blocked entry, a row with nothing to attend to,
        an empty axis), it is exactly 0; a NaN in ``weights`` or ``d_weights``
        propagates to its slice.

    Raises
    ------
    ValueError
        If the two shapes differ or ``axis`` is out of range.
    """
    weights = as_float_array(weights, "weights")
    d_weights = as_float_array(d_weights, "d_weights")
    _check_same_shape(d_weights, "d_weights", weights.shape, "weights")
    if not -weights.ndim <= axis < weights.ndim:
        raise ValueError(f"axis={axis} is out of range for weights of shape {weights.shape}")
    return _softmax_vjp(weights, d_weights, axis)[1]


def _softmax_vjp(
    weights: np.ndarray, d_weights: np.ndarray, axis: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`softmax_backward` on validated arrays: ``(p . dp, dz)``, the first with
    the softmax's axis kept as a dim of size 1."""
    # p . dp along the axis: how much the weighted average of dp moves (..., 1)
    dot = np.sum(d_weights * weights, axis=axis, keepdims=True)
    return dot, weights * (d_weights - dot)


# --------------------------------------------------------------------------- one head


def _attention_core_backward(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, weights: np.ndarray, d_context: np.ndarray
) -> tuple[np.ndarray, ...]:
    """The backward of ``_attention_core`` on validated arrays:
    ``(dq, dk, dv, d_masked, d_weights, row_dot)``, ``d_masked`` being the gradient of
    the scaled, biased scores (the softmax's input), ``d_weights`` the weights' and
    ``row_dot`` each row's ``rowsum(d_weights * weights)`` (..., T, 1). Shared by
    :func:`attention_backward`, :func:`attention_backward_steps` and
    :func:`multi_head_attention_backward`, so the formulas exist once."""
    head_dim = q.shape[-1]
    # 5. context = weights @ v: the product rule of a matmul, both ways.
    dv = np.swapaxes(weights, -1, -2) @ d_context  # (..., S, T) @ (..., T, Dv) -> (..., S, Dv)
    d_weights = d_context @ np.swapaxes(v, -1, -2)  # (..., T, Dv) @ (..., Dv, S) -> (..., T, S)
    # 4. The softmax. Its formula gives exactly 0 wherever the weight is 0, so the -inf
    #    of blocked entries (3.) never enters: masking needs no backward of its own.
    row_dot, d_masked = _softmax_vjp(weights, d_weights, -1)  # (..., T, 1), (..., T, S)
    # 3.-2. The bias is added, so it passes d_masked on unchanged; the scaling by c.
    d_scores = d_masked / math.sqrt(head_dim)  # (..., T, S)
    # 1. scores = q @ k^T.
    dq = d_scores @ k  # (..., T, S) @ (..., S, Dh) -> (..., T, Dh)
    dk = np.swapaxes(d_scores, -1, -2) @ q  # (..., S, T) @ (..., T, Dh) -> (..., S, Dh)
    return dq, dk, dv, d_masked, d_weights, row_dot


def attention_backward(
    q: Any,
    k: Any,
    v: Any,
    d_context: Any,
    mask: Any | None = None,
    *,
    score_bias: Any | None = None,
    weights: Any | None = None,
) -> tuple[np.ndarray, ...]:
    """Gradients of :func:`mha.scaled_dot_product_attention`'s inputs, given
    ``d_context = dL/d context``.

    ``dv = P^T dO``, ``dP = dO v^T``, ``dZ = softmax_backward(P, dP)``,
    ``dq = dZ k / sqrt(Dh)``, ``dk = dZ^T q / sqrt(Dh)`` (``P`` the weights, ``dO`` the
    context's gradient; the scale is in both ``dq`` and ``dk``, as ``q`` and ``k`` both
    enter the scaled scores).

    Parameters
    ----------
    q, k, v, mask, score_bias
        As given to :func:`mha.scaled_dot_product_attention`: ``q (..., T, Dh)``,
        ``k (..., S, Dh)``, ``v (..., S, Dv)``, same leading dims (the forward does not
        share key/value heads; :func:`multi_head_attention_backward` handles grouped-query
        heads).
    d_context : array_like, shape (..., T, Dv)
        The gradient of the forward's ``context``.
    weights : array_like, shape (..., T, S), optional
        Keyword only. The forward's weights, saved to skip recomputing them; by default
        they are recomputed from ``q``, ``k``, ``mask`` and ``score_bias``. Only the
        weights enter the backward of the mask: blocked entries must be 0 in them, as
        the forward makes them.

    Returns
    -------
    dq : np.ndarray, shape (..., T, Dh)
    dk : np.ndarray, shape (..., S, Dh)
    dv : np.ndarray, shape (..., S, Dv)
    d_score_bias : np.ndarray, shape of ``score_bias``
        Only if ``score_bias`` is given (then the result has four entries): the gradient
        of the scaled, biased scores, summed over the dims the bias was broadcast along.
        Exactly 0 where the mask blocks. A boolean ``mask`` has no gradient.

    A query row with nothing to attend to gets ``dq = 0`` and sends nothing to ``dk`` and
    ``dv``, exactly (its weights are all 0), never NaN; a key that no query may see gets
    ``dk = dv = 0`` exactly.

    Raises
    ------
    ValueError
        As the forward, and if ``d_context`` or ``weights`` has the wrong shape.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    check_qkv(q, k, v)
    d_context = as_float_array(d_context, "d_context")
    context_shape = q.shape[:-1] + v.shape[-1:]  # (..., T, Dv)
    _check_same_shape(d_context, "d_context", context_shape, "the context (..., T, Dv)")
    scores_shape = q.shape[:-1] + (k.shape[-2],)  # (..., T, S)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, scores_shape)
    if score_bias is not None:
        score_bias = as_score_bias(score_bias, scores_shape)
    if weights is None:  # the forward once more, for its weights
        _, weights = scaled_dot_product_attention(q, k, v, mask, score_bias=score_bias)
    else:
        weights = as_float_array(weights, "weights")
        _check_same_shape(weights, "weights", scores_shape, "the scores (..., T, S)")
    dq, dk, dv, d_masked, _, _ = _attention_core_backward(q, k, v, weights, d_context)
    if score_bias is None:
        return dq, dk, dv
    return dq, dk, dv, _sum_to_shape(d_masked, score_bias.shape)


@dataclass(frozen=True, eq=False)
class AttentionBackwardSteps:
    """Every intermediate of one head's forward and backward, as
    :func:`attention_backward_steps` computed them (the forward's names as in
    :class:`mha.AttentionSteps`; ``c = 1 / sqrt(Dh)``).

    Attributes
    ----------
    masked : (..., T, S)     ``Z``: the scaled (and biased) scores the softmax read,
                             ``-inf`` where the mask blocks
    weights : (..., T, S)    ``P = softmax(Z)``, exactly 0 where blocked
    context : (..., T, Dv)   ``O = P v``
    d_context : (..., T, Dv) ``dO``, the gradient the backward was given
    d_weights : (..., T, S)  ``dP = dO v^T``; not 0 where blocked, but multiplied by
                             ``P = 0`` there
    row_dot : (..., T)       ``rowsum(dP * P)``, what the softmax's backward subtracts
    d_masked : (..., T, S)   ``dZ = P * (dP - row_dot)``, exactly 0 where blocked
    dq : (..., T, Dh)        ``c dZ k``
    dk : (..., S, Dh)        ``c dZ^T q``
    dv : (..., S, Dv)        ``P^T dO``
    """

    masked: np.ndarray
    weights: np.ndarray
    context: np.ndarray
    d_context: np.ndarray
    d_weights: np.ndarray
    row_dot: np.ndarray
    d_masked: np.ndarray
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


def attention_backward_steps(
    q: Any,
    k: Any,
    v: Any,
    d_context: Any,
    mask: Any | None = None,
    *,
    score_bias: Any | None = None,
) -> AttentionBackwardSteps:
    """:func:`attention_backward` with every intermediate kept: the forward's scores,
    weights and context, then ``dP``, the softmax's row sums, ``dZ`` and the three
    gradients (the same code, so the same numbers as :func:`attention_backward`).

    Parameters
    ----------
    q, k, v, d_context, mask, score_bias
        As for :func:`attention_backward`.

    Returns
    -------
    AttentionBackwardSteps

    Raises
    ------
    ValueError
        As :func:`attention_backward`.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    check_qkv(q, k, v)
    d_context = as_float_array(d_context, "d_context")
    context_shape = q.shape[:-1] + v.shape[-1:]  # (..., T, Dv)
    _check_same_shape(d_context, "d_context", context_shape, "the context (..., T, Dv)")
    scores_shape = q.shape[:-1] + (k.shape[-2],)  # (..., T, S)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, scores_shape)
    if score_bias is not None:
        score_bias = as_score_bias(score_bias, scores_shape)
    _, _, masked, weights, context = _attention_core(q, k, v, mask, score_bias)
    dq, dk, dv, d_masked, d_weights, row_dot = _attention_core_backward(q, k, v, weights, d_context)
    return AttentionBackwardSteps(
        masked=masked, weights=weights, context=context, d_context=d_context,
        d_weights=d_weights, row_dot=row_dot[..., 0], d_masked=d_masked, dq=dq, dk=dk, dv=dv,
    )  # fmt: skip


# ----------------------------------------------------------------------------- heads


def split_heads_backward(d_heads: Any) -> np.ndarray:
    """The gradient of :func:`mha.split_heads`' input: ``(B, H, T, Dh) -> (B, T, D)``.

    Splitting only moves numbers (a reshape and a transpose), so its backward moves the
    gradients back to where the numbers came from: it *is* :func:`mha.merge_heads`.
    """
    return merge_heads(d_heads)  # (B, H, T, Dh) -> (B, T, D)


def merge_heads_backward(d_merged: Any, num_heads: int) -> np.ndarray:
    """The gradient of :func:`mha.merge_heads`' input: ``(B, T, D) -> (B, H, T, Dh)``.

    The reverse reshape, as for :func:`split_heads_backward`: it *is*
    :func:`mha.split_heads` (``num_heads`` says how the forward's input was split).
    """
    return split_heads(d_merged, num_heads)  # (B, T, D) -> (B, H, T, Dh)


def _sum_over_groups(d_shared: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """The backward of ``k_heads[:, kv_head_index(H, Hkv)]``: a key/value head read by a
    group of query heads gets the sum of their gradients. :func:`mha.kv_head_index` gives
    query heads ``g*G .. g*G + G - 1`` (``G = H / Hkv``) the head ``g``, so after this
    reshape the group is axis 2."""
    batch, num_heads, length, head_dim = d_shared.shape
    group = num_heads // num_kv_heads
    # (B, H, S, Dh) -> (B, Hkv, G, S, Dh) -> (B, Hkv, S, Dh)
    return d_shared.reshape(batch, num_kv_heads, group, length, head_dim).sum(axis=2)


# ----------------------------------------------------------------------------- layer


@dataclass(frozen=True, eq=False)
class AttentionGradients:
    """Gradients of every input, weight and bias of :func:`mha.multi_head_attention`,
    named as the forward names them (the weights as in :class:`mha.AttentionParams`).

    Self-attention passes one ``x`` as query, key and value: its gradient is
    ``query + key + value``. Cross-attention's ``memory`` (key = value): ``key + value``.

    Attributes
    ----------
    query : (B, T, D)
    key : (B, S, Dk)
    value : (B, S, Dv)
    W_q, W_k, W_v, W_o : the shapes of the weights
    b_q, b_k, b_v, b_o : the shapes of the biases, or None for a layer without biases
    score_bias : the shape of the forward's ``score_bias``, or None if it had none
    """

    query: np.ndarray
    key: np.ndarray
    value: np.ndarray
    W_q: np.ndarray
    b_q: np.ndarray | None
    W_k: np.ndarray
    b_k: np.ndarray | None
    W_v: np.ndarray
    b_v: np.ndarray | None
    W_o: np.ndarray
    b_o: np.ndarray | None
    score_bias: np.ndarray | None = None

    @property
    def params(self) -> AttentionParams:
        """The weight and bias gradients as an :class:`mha.AttentionParams` (the shape of
        the weights: one step of gradient descent is ``W - lr * grads.params.W``)."""
        names = ("W_q", "b_q", "W_k", "b_k", "W_v", "b_v", "W_o", "b_o")
        return AttentionParams(**{name: getattr(self, name) for name in names})


def _linear_backward(
    x: np.ndarray, w: np.ndarray, d_y: np.ndarray, bias: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """The backward of ``y = x @ w + b`` over a (B, L) batch: ``(dx, dw, db)``."""
    dx = d_y @ w.T  # (B, L, D_out) @ (D_out, D_in) -> (B, L, D_in)
    # every position's x^T d_y, summed: (D_in, B*L) @ (B*L, D_out) -> (D_in, D_out)
    dw = x.reshape(-1, x.shape[-1]).T @ d_y.reshape(-1, d_y.shape[-1])
    db = d_y.sum(axis=(0, 1)) if bias else None  # (D_out,)
    return dx, dw, db


def _check_steps(steps: object, query: np.ndarray, key: np.ndarray, num_heads: int) -> None:
    """Saved steps fit these inputs and come from a forward without a cache."""
    if not isinstance(steps, AttentionSteps):
        raise ValueError(f"steps must be mha.AttentionSteps, got {type(steps).__name__}")
    batch, target_len = query.shape[:2]
    source_len = key.shape[1]
    if steps.weights.shape != (batch, num_heads, target_len, source_len):
        raise ValueError(
            f"steps.weights {steps.weights.shape} do not fit query {query.shape}, key "
            f"{key.shape} and num_heads={num_heads}: expected "
            f"{(batch, num_heads, target_len, source_len)} (a forward with a cache "
            "attends to more keys than it was given: its steps cannot be used)"
        )


def multi_head_attention_backward(
    query: Any,
    key: Any,
    value: Any,
    params: AttentionParams,
    num_heads: int,
    d_output: Any,
    mask: Any | None = None,
    *,
    score_bias: Any | None = None,
    steps: AttentionSteps | None = None,
) -> AttentionGradients:
    """Gradients of :func:`mha.multi_head_attention` with respect to its inputs, its four
    weights and their biases (and ``score_bias``), given ``d_output = dL/d output``.

    The forward's steps in reverse: the output projection, the merge of the heads, the
    attention in every head (:func:`attention_backward`'s formulas), the split, the three
    input projections. With grouped-query heads a key/value head collects the gradients of
    every query head that read it.

    Parameters
    ----------
    query, key, value, params, num_heads, mask, score_bias
        As given to :func:`mha.multi_head_attention` (without a ``cache``: decoding
        with a cache is inference, and the cached keys came from earlier calls).
    d_output : array_like, shape (B, T, D)
        The gradient of the forward's ``output``.
    steps : AttentionSteps, optional
        Keyword only. What :func:`mha.multi_head_attention_steps` returned for these
        arguments, to reuse its projections and weights instead of recomputing them.

    Returns
    -------
    AttentionGradients

    Raises
    ------
    ValueError
        As the forward, and if ``d_output`` or ``steps`` does not fit.
    """
    if steps is None:
        steps = multi_head_attention_steps(
            query, key, value, params, num_heads, mask, score_bias=score_bias
        )  # checks every argument
    else:
        if not isinstance(params, AttentionParams):
            raise ValueError(f"params must be an AttentionParams, got {type(params).__name__}")
        num_heads = check_positive_int(num_heads, "num_heads")
    query = as_float_array(query, "query")
    key = as_float_array(key, "key")
    value = as_float_array(value, "value")
    check_ndim(query, 3, "query", "(B, T, D)")
    check_ndim(key, 3, "key", "(B, S, D)")
    check_ndim(value, 3, "value", "(B, S, D)")
    _check_steps(steps, query, key, num_heads)
    if mask is not None:  # the saved weights already hold it; checked all the same
        check_mask_shape(as_bool_mask(mask), steps.weights.shape)
    if score_bias is not None:
        score_bias = as_score_bias(score_bias, steps.weights.shape)
    d_output = as_float_array(d_output, "d_output")
    _check_same_shape(d_output, "d_output", steps.output.shape, "the output (B, T, D)")
    num_kv_heads = params.num_kv_heads(num_heads)

    # 4. output = merged @ W_o + b_o, merged = merge_heads(context).
    d_merged, d_w_o, d_b_o = _linear_backward(steps.merged, params.W_o, d_output, params.bias)
    d_context = merge_heads_backward(d_merged, num_heads)  # (B, T, D) -> (B, H, T, Dh)
    # 3. Attention in every head, against the key/value head each query head read.
    index = kv_head_index(num_heads, num_kv_heads)  # (H,): the key/value head of each
    k_shared = steps.k_heads[:, index]  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
    v_shared = steps.v_heads[:, index]  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
    dq_heads, dk_shared, dv_shared, d_masked, _, _ = _attention_core_backward(
        steps.q_heads, k_shared, v_shared, steps.weights, d_context
    )
    dk_heads = _sum_over_groups(dk_shared, num_kv_heads)  # (B, H, S, Dh) -> (B, Hkv, S, Dh)
    dv_heads = _sum_over_groups(dv_shared, num_kv_heads)  # (B, H, S, Dh) -> (B, Hkv, S, Dh)
    # 2. The split into heads.
    dq = split_heads_backward(dq_heads)  # (B, H, T, Dh) -> (B, T, D)
    dk = split_heads_backward(dk_heads)  # (B, Hkv, S, Dh) -> (B, S, Dkv)
    dv = split_heads_backward(dv_heads)  # (B, Hkv, S, Dh) -> (B, S, Dkv)
    # 1. The input projections.
    d_query, d_w_q, d_b_q = _linear_backward(query, params.W_q, dq, params.bias)
    d_key, d_w_k, d_b_k = _linear_backward(key, params.W_k, dk, params.bias)
    d_value, d_w_v, d_b_v = _linear_backward(value, params.W_v, dv, params.bias)
    return AttentionGradients(
        query=d_query,
        key=d_key,
        value=d_value,
        W_q=d_w_q,
        b_q=d_b_q,
        W_k=d_w_k,
        b_k=d_b_k,
        W_v=d_w_v,
        b_v=d_b_v,
        W_o=d_w_o,
        b_o=d_b_o,
        score_bias=None if score_bias is None else _sum_to_shape(d_masked, score_bias.shape),
    )


# ------------------------------------------------------------------------------ tiled


@dataclass(frozen=True, eq=False)
class BackwardTileStep:
    """One tile of :func:`flash_attention_backward`: up to ``tile_size`` queries against
    up to ``tile_size`` keys, and what it added to the three gradients.

    Attributes
    ----------
    queries : (start, stop)  the query rows of the tile
    keys : (start, stop)     the keys of the tile
    skipped : bool           True if causal masking blocks every pair, so the tile was
                             not computed (its additions are zeros)
    dq : np.ndarray, shape (..., stop - start, Dh)
        What the tile added to ``dq[..., queries[0]:queries[1], :]``: ``c dZ k_tile``.
    dk : np.ndarray, shape (..., stop - start, Dh)
        What it added to ``dk[..., keys[0]:keys[1], :]``: ``c dZ^T q_tile``.
    dv : np.ndarray, shape (..., stop - start, Dv)
        What it added to ``dv[..., keys[0]:keys[1], :]``: ``P^T dO_tile``.
    """

    queries: tuple[int, int]
    keys: tuple[int, int]
    skipped: bool
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


@dataclass(eq=False)
class BackwardTileTrace:
    """What :func:`flash_attention_backward` did, tile by tile; pass one as ``trace=``.

    Each call clears it and then appends a :class:`BackwardTileStep` per tile in the
    order visited: the columns of tiles (keys) left to right and, within one, its tiles
    top to bottom (queries), the order of Dao et al. (2022), Algorithm 4: a column's
    ``dk`` and ``dv`` are finished when the column is, ``dq`` gathers from every column.
    """

    tile_size: int = 0
    num_queries: int = 0  # T
    num_keys: int = 0  # S
    lead: tuple[int, ...] = ()  # the leading (batch, head) dims
    head_dim: int = 0  # Dh
    value_dim: int = 0  # Dv
    steps: list[BackwardTileStep] = field(default_factory=list)

    @property
    def num_computed(self) -> int:
        """Tiles whose weights were rebuilt and whose gradients were added."""
        return sum(not step.skipped for step in self.steps)

    @property
    def num_skipped(self) -> int:
        """Tiles left out because causal masking blocks all of them."""
        return sum(step.skipped for step in self.steps)

    def accumulated(
        self, num_steps: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dq, dk, dv)`` as the first ``num_steps`` tiles (all by default) left them:
        zeros, then each tile's additions added at its rows, in the order visited."""
        n = len(self.steps) if num_steps is None else num_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self.steps):
            raise ValueError(f"num_steps must be an int in [0, {len(self.steps)}], got {n!r}")
        dtype = np.result_type(*(s.dq for s in self.steps)) if self.steps else np.float64
        dq = np.zeros((*self.lead, self.num_queries, self.head_dim), dtype)
        dk = np.zeros((*self.lead, self.num_keys, self.head_dim), dtype)
        dv = np.zeros((*self.lead, self.num_keys, self.value_dim), dtype)
        for step in self.steps[:n]:
            (q0, q1), (k0, k1) = step.queries, step.keys
            dq[..., q0:q1, :] += step.dq
            dk[..., k0:k1, :] += step.dk
            dv[..., k0:k1, :] += step.dv
        return dq, dk, dv


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    context: Any,
    logsumexp: Any,
    d_context: Any,
    mask: Any | None = None,
    *,
    tile_size: int = 64,
    causal: bool = False,
    trace: BackwardTileTrace | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`mha.flash_attention`'s ``q``, ``k``, ``v``, tile by tile, never
    holding a ``(T, S)`` array: the backward pass of Dao et al. (2022), Algorithm 4, with
    one log-sum-exp per row in place of its separate maximum and sum (as FlashAttention-2,
    Dao 2023, keeps it).

    Besides ``q``, ``k`` and ``v``, the forward kept only the context ``O`` and each row's
    log-sum-exp ``lse``. That is enough to rebuild any tile of weights, up to rounding:
    ``P = exp(scaled score - lse)``. The
    softmax's ``rowsum(dP * P)`` is a per-row number too, and equals
    ``D = rowsum(dO * O)`` (``sum_s P_ts dO_t . v_s = dO_t . O_t``), computed once
    before the loop. Then, for each tile of ``tile_size`` keys (outer loop) and
    ``tile_size`` queries (inner loop)::

        P   = exp(q_tile k_tile^T / sqrt(Dh) - lse_tile)      recomputed, (t, s)
        dv_tile += P^T dO_tile
        dP  = dO_tile v_tile^T
        dZ  = P * (dP - D_tile)
        dq_tile += dZ k_tile / sqrt(Dh)
        dk_tile += dZ^T q_tile / sqrt(Dh)

    The price of the memory saved is recomputing the scores: one more ``(t, Dh) @ (Dh, s)``
    product per tile (:func:`mha.cost.attention_backward_macs`).

    Parameters
    ----------
    q, k, v, mask, causal
        As given to :func:`mha.flash_attention` (the tiles it skipped under ``causal``
        are skipped here too).
    context : array_like, shape (..., T, Dv)
    logsumexp : array_like, shape (..., T)
        What :func:`mha.flash_attention` returned: ``-inf`` marks a row with nothing to
        attend to.
    d_context : array_like, shape (..., T, Dv)
        The gradient of ``context``.
    tile_size : int
        Queries and keys per tile; it need not be the forward's (the log-sum-exp is
        one number per row, whatever the tiles).
    trace : BackwardTileTrace, optional
        Cleared, then filled with one :class:`BackwardTileStep` per tile, in the order
        visited: what each tile added to ``dq``, ``dk`` and ``dv``.

    Returns
    -------
    dq : np.ndarray, shape (..., T, Dh)
    dk : np.ndarray, shape (..., S, Dh)
    dv : np.ndarray, shape (..., S, Dv)
        Equal to :func:`attention_backward`'s up to rounding. A row with nothing to
        attend to gets ``dq = 0`` and adds nothing to ``dk``, ``dv``; never NaN.

    Raises
    ------
    ValueError
        As the forward, and if ``context``, ``logsumexp`` or ``d_context`` has the wrong
        shape.
    """
    q, k, v = as_float_array(q, "q"), as_float_array(k, "k"), as_float_array(v, "v")
    check_qkv(q, k, v)
    tile_size = check_positive_int(tile_size, "tile_size")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if trace is not None and not isinstance(trace, BackwardTileTrace):
        raise ValueError(f"trace must be a BackwardTileTrace, got {type(trace).__name__}")
    *lead, T, head_dim = q.shape
    S, Dv = v.shape[-2:]
    context = as_float_array(context, "context")
    _check_same_shape(context, "context", (*lead, T, Dv), "the forward's context (..., T, Dv)")
    logsumexp = as_float_array(logsumexp, "logsumexp")
    _check_same_shape(logsumexp, "logsumexp", (*lead, T), "the queries (..., T)")
    d_context = as_float_array(d_context, "d_context")
    _check_same_shape(d_context, "d_context", context.shape, "context")
    if causal and S < T:
        raise ValueError(
            f"causal=True needs at least as many keys as queries (the queries are the "
            f"last T of S positions), got q {q.shape} and k {k.shape}"
        )
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (*lead, T, S))
        mask = np.broadcast_to(mask, (*lead, T, S))  # a view: nothing of size T x S is copied

    dtype = np.result_type(q, k, v, context, logsumexp, d_context)
    scale = 1 / math.sqrt(head_dim)
    # D = rowsum(dO * O) = rowsum(dP * P), one number per query: (..., T)
    row_dot = np.einsum("...td,...td->...t", d_context, context)
    # A row with nothing to attend to has lse = -inf and only -inf scores: shift it by 0,
    # so that exp(-inf - 0) = 0 and no -inf - (-inf) = NaN is computed.
    shift = np.where(np.isneginf(logsumexp), 0.0, logsumexp)  # (..., T)
    dq = np.zeros((*lead, T, head_dim), dtype)
    dk = np.zeros((*lead, S, head_dim), dtype)
    dv = np.zeros((*lead, S, Dv), dtype)
    if trace is not None:
        trace.tile_size, trace.num_queries, trace.num_keys = tile_size, T, S
        trace.lead, trace.head_dim, trace.value_dim = tuple(lead), head_dim, Dv
        trace.steps.clear()
    for k0 in range(0, S, tile_size):  # a column of tiles: keys k0..k1-1
        k1 = min(k0 + tile_size, S)
        k_tile, v_tile = k[..., k0:k1, :], v[..., k0:k1, :]  # (..., s, Dh), (..., s, Dv)
        for q0 in range(0, T, tile_size):  # its tiles, top to bottom: queries q0..q1-1
            q1 = min(q0 + tile_size, T)
            if causal and k0 > q1 - 1 + S - T:  # every pair blocked: skipped, as forward
                if trace is not None:  # it adds nothing
                    nothing_q = np.zeros((*lead, q1 - q0, head_dim), dtype)  # (..., t, Dh)
                    nothing_k = np.zeros((*lead, k1 - k0, head_dim), dtype)  # (..., s, Dh)
                    nothing_v = np.zeros((*lead, k1 - k0, Dv), dtype)  # (..., s, Dv)
                    step = BackwardTileStep((q0, q1), (k0, k1), True, nothing_q, nothing_k,
                                            nothing_v)  # fmt: skip
                    trace.steps.append(step)
                continue
            q_tile, d_out = q[..., q0:q1, :], d_context[..., q0:q1, :]  # (..., t, Dh|Dv)
            # 1. The tile's weights, rebuilt from the saved log-sum-exp.
            scores = q_tile @ np.swapaxes(k_tile, -1, -2) * scale  # (..., t, s)
            allowed = None if mask is None else mask[..., q0:q1, k0:k1]
            if causal:
                # (s,) <= (t, 1) -> (t, s): key j is at or below query i's diagonal
                below = np.arange(k0, k1) <= np.arange(q0, q1)[:, None] + S - T
                allowed = below if allowed is None else allowed & below
            if allowed is not None:
                scores = np.where(allowed, scores, -np.inf)
            p = np.exp(scores - shift[..., q0:q1, None])  # (..., t, s), 0 where blocked
            # 2. context = P v.
            add_v = np.swapaxes(p, -1, -2) @ d_out  # (..., s, t) @ (..., t, Dv)
            d_p = d_out @ np.swapaxes(v_tile, -1, -2)  # (..., t, Dv) @ (..., Dv, s)
            # 3. The softmax, with the row's D in place of rowsum(dP * P).
            d_z = p * (d_p - row_dot[..., q0:q1, None])  # (..., t, s), 0 where p = 0
            # 4. The scaled scores q k^T / sqrt(Dh).
            add_q = d_z @ k_tile * scale  # (..., t, s) @ (..., s, Dh)
            add_k = np.swapaxes(d_z, -1, -2) @ q_tile * scale  # (..., s, t) @ (..., t, Dh)
            dq[..., q0:q1, :] += add_q
            dk[..., k0:k1, :] += add_k
            dv[..., k0:k1, :] += add_v
            if trace is not None:
                trace.steps.append(BackwardTileStep((q0, q1), (k0, k1), False, add_q, add_k,
                                                    add_v))  # fmt: skip
    return dq, dk, dv
