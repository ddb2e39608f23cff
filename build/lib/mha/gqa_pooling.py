"""Grouped-query attention from a trained multi-head module, by mean-pooling heads.

An experiment, not a conversion: :func:`mean_pool_kv_heads` turns a multi-head
:class:`mha.modules.MultiHeadAttention` into a grouped-query one (as the GQA paper does
before uptraining), :func:`mean_pool_all_kv_heads` does it for every attention of a
model, and :func:`relative_output_change` measures how far that moves the output.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from mha._checks import check_positive_int
from mha.modules import MultiHeadAttention

__all__ = ["mean_pool_all_kv_heads", "mean_pool_kv_heads", "relative_output_change"]


def mean_pool_kv_heads(module: MultiHeadAttention, num_kv_heads: int) -> MultiHeadAttention:
    """A grouped-query copy of ``module`` whose key/value heads are group means.

    Grouped-query attention lets each group of ``G = H / num_kv_heads`` query heads share
    one key head and one value head. Ainslie et al. (2023, "GQA") turn a trained
    multi-head checkpoint into a grouped one by mean-pooling, for each group, the key and
    value projections of its heads, and then train a little more ("uptraining"); this
    function does the pooling, not the training. Group ``g`` holds query heads
    ``g*G .. (g+1)*G - 1``, and query head ``h`` reads key/value head ``h // G``
    (:func:`mha.modules.kv_head_index`). The rows of ``W_k`` and ``W_v`` (and their
    biases) belonging to the heads of a group are averaged; ``W_q`` and ``W_o`` are copied.

    A module that is grouped already can be pooled further, to any ``num_kv_heads``
    dividing its own: its key/value heads each serve the same number of query heads, so
    their plain mean is the mean over the query heads of the new group.

    Parameters
    ----------
    module : MultiHeadAttention
        Not modified.
    num_kv_heads : int
        ``Hkv`` of the result; must divide ``module.num_kv_heads`` (``module.num_heads``
        for a multi-head module). Equal to it: an exact copy.

    Returns
    -------
    MultiHeadAttention
        Same ``d_model``, heads, dropout, bias, dtype, device and train/eval mode.
        Where all heads of a group had the same key and value weights, its outputs
        equal those of ``module``; otherwise see :func:`relative_output_change`.

    Raises
    ------
    ValueError
        If ``module`` is not an mha ``MultiHeadAttention``, or ``num_kv_heads`` is not
        a positive integer dividing ``module.num_kv_heads``.
    """
    if not isinstance(module, MultiHeadAttention):
        raise ValueError(f"module must be an mha MultiHeadAttention, got {type(module).__name__}")
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
    if module.num_kv_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} must divide the module's {module.num_kv_heads} "
            f"key/value heads (num_heads={module.num_heads}): each new head is the mean of "
            "a whole number of old ones"
        )
    pooled = module.num_kv_heads // num_kv_heads  # old key/value heads per new one
    head_dim, d_model = module.head_dim, module.d_model
    weight = module.W_q.weight
    grouped = MultiHeadAttention(
        d_model, module.num_heads, dropout=module.dropout, bias=module.bias,
        num_kv_heads=num_kv_heads,
    ).to(dtype=weight.dtype, device=weight.device)  # fmt: skip
    with torch.no_grad():
        for name in ("W_q", "W_o"):
            getattr(grouped, name).load_state_dict(getattr(module, name).state_dict())
        for name in ("W_k", "W_v"):
            old, new = getattr(module, name), getattr(grouped, name)
            # (Hkv_old Dh, D) rows, head by head -> (Hkv, pooled, Dh, D) -> mean -> (Hkv Dh, D)
            w = old.weight.reshape(num_kv_heads, pooled, head_dim, d_model)
            new.weight.copy_(w.mean(dim=1).reshape(num_kv_heads * head_dim, d_model))
            if old.bias is not None:
                b = old.bias.reshape(num_kv_heads, pooled, head_dim)  # (Hkv_old Dh,) split
                new.bias.copy_(b.mean(dim=1).reshape(num_kv_heads * head_dim))
    return grouped.train(module.training)


def mean_pool_all_kv_heads(model: nn.Module, num_kv_heads: int) -> nn.Module:
    """A copy of ``model`` in which every :class:`~mha.modules.MultiHeadAttention` is
    replaced by :func:`mean_pool_kv_heads` of it (e.g. all the self- and cross-attentions
    of a :class:`~mha.transformer.Transformer`). ``model`` itself is not modified.

    The copy is for inference and measurement: a Transformer's ``config`` does not record
    key/value heads, so :func:`mha.translator.save_checkpoint` cannot save it.

    Raises
    ------
    ValueError
        If ``model`` contains no ``MultiHeadAttention``, or ``num_kv_heads`` does not suit
        one of them (see :func:`mean_pool_kv_heads`).
    """
    if isinstance(model, MultiHeadAttention):
        return mean_pool_kv_heads(model, num_kv_heads)
    copied = copy.deepcopy(model)
    found = [
        (parent, name, child)
        for parent in copied.modules()
        for name, child in parent.named_children()
        if isinstance(child, MultiHeadAttention)
    ]
    if not found:
        raise ValueError(f"model ({type(model).__name__}) contains no MultiHeadAttention")
    for parent, name, child in found:
        setattr(parent, name, mean_pool_kv_heads(child, num_kv_heads))
    return copied


def relative_output_change(
    before: MultiHeadAttention,
    after: MultiHeadAttention,
    query: torch.Tensor,
    key: torch.Tensor | None = None,
    value: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> float:
    """How far ``after`` moves the output of ``before``: ``||y_after - y_before|| /
    ||y_before||`` (Frobenius norms over the whole ``(B, T, D)`` output).

    Both modules run in their current train/eval mode without autograd, on the same
    inputs (``key`` and ``value`` default to ``query``: self-attention). 0 means the same
    output; 0.1 means a change a tenth the size of the output.
    """
    key = query if key is None else key
    value = key if value is None else value
    with torch.no_grad():
        reference, _ = before(query, key, value, mask=mask, need_weights=False)
        changed, _ = after(query, key, value, mask=mask, need_weights=False)
    change = torch.linalg.vector_norm(changed - reference)  # over all of (B, T, D)
    return float(change / torch.linalg.vector_norm(reference))
