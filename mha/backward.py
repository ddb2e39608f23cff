"""The backward pass of attention, by hand: each forward function's gradient beside it.

Training needs, for every input and weight of a layer, how a small change moves the loss.
Given ``d_output = dL/d output`` (same shape as the output), the chain rule walks the
forward's steps in reverse, one vector-Jacobian product per step:

* :func:`mha.softmax`: :func:`softmax_backward`;
* :func:`mha.scaled_dot_product_attention`: :func:`attention_backward` (and
  :func:`attention_backward_steps`, every intermediate of it, for the figures);
* :func:`mha.split_heads` and :func:`mha.merge_heads`: :func:`split_heads_backward` and
  :func:`merge_heads_backward` (each is the other's forward);
* :func:`mha.multi_head_attention`: :func:`mha.layer_backward.multi_head_attention_backward`;
* :func:`mha.flash_attention`: :func:`mha.tiled_backward.flash_attention_backward`, tile by
  tile (a :class:`mha.tiled_backward.BackwardTileTrace` records what each tile added).

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
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    as_score_bias,
    check_mask_shape,
    check_qkv,
)
from mha.attention import (
    _attention_core,
    merge_heads,
    scaled_dot_product_attention,
    split_heads,
)

__all__ = [
    "AttentionBackwardSteps",
    "attention_backward",
    "attention_backward_steps",
    "merge_heads_backward",
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
