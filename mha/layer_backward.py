"""The backward pass of the whole multi-head layer: its inputs, weights and biases.

:func:`multi_head_attention_backward` walks :func:`mha.multi_head_attention`'s steps in
reverse: the output projection (``dM = dY W_o^T``, ``dW_o = M^T dY``, ``db_o`` the sum
of ``dY`` over batch and positions), the merge (a split, :func:`mha.split_heads`),
each head's attention (:func:`mha.attention_backward`), grouped-query heads (a
key/value head gets the sum of its group's gradients) and the three input projections.
:class:`AttentionGradients` names every gradient as the forward names its value.

Shapes follow the legend in :mod:`mha`; masks are boolean with **True = may attend**.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    as_score_bias,
    check_mask_shape,
    check_ndim,
    check_positive_int,
)
from mha.attention import (
    AttentionSteps,
    kv_head_index,
    multi_head_attention_steps,
)
from mha.backward import (
    _attention_core_backward,
    _check_same_shape,
    _sum_to_shape,
    merge_heads_backward,
    split_heads_backward,
)
from mha.params import AttentionParams

__all__ = ["AttentionGradients", "multi_head_attention_backward"]


def _sum_over_groups(d_shared: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """The backward of ``k_heads[:, kv_head_index(H, Hkv)]``: a key/value head read by a
    group of query heads gets the sum of their gradients. :func:`mha.kv_head_index` gives
    query heads ``g*G .. g*G + G - 1`` (``G = H / Hkv``) the head ``g``, so after this
    reshape the group is axis 2."""
    batch, num_heads, length, head_dim = d_shared.shape
    group = num_heads // num_kv_heads
    # (B, H, S, Dh) -> (B, Hkv, G, S, Dh) -> (B, Hkv, S, Dh)
    return d_shared.reshape(batch, num_kv_heads, group, length, head_dim).sum(axis=2)


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
