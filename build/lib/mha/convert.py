"""Weights between the three forms of one attention layer, and PyTorch's layers into ours.

The three forms:

* :class:`mha.AttentionParams`: the NumPy specification's weights, ``(D_in, D_out)``
  matrices used as ``y = x @ W + b``;
* :class:`mha.modules.MultiHeadAttention`: our PyTorch module, four ``nn.Linear``
  storing ``(D_out, D_in)`` and computing ``x @ W.T + b``;
* ``torch.nn.MultiheadAttention``: PyTorch's own, with ``W_q, W_k, W_v`` stacked in
  one ``(3D, D)`` ``in_proj_weight`` (or kept apart when keys or values have another
  width).

This module sits above both the specification and the modules, which do not know
each other: that independence is what makes the equivalence tests mean something.
There is one conversion per pair: the NumPy weights to and from each PyTorch form
(``params_*``), and between the two PyTorch forms through the NumPy weights
(``module_*``), so every copy of a weight goes through the same two transposes.
(Turning a multi-head module into a grouped-query one changes the attention, so it is
not a conversion: see :mod:`mha.gqa_pooling`.)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mha._checks import check_divisible
from mha.layers import DecoderLayer, EncoderLayer
from mha.modules import MultiHeadAttention
from mha.params import AttentionParams

__all__ = [
    "decoder_layer_from_torch",
    "encoder_layer_from_torch",
    "module_from_torch",
    "module_to_torch",
    "params_from_module",
    "params_from_torch",
    "params_to_module",
    "params_to_torch",
]


def _numpy(t: torch.Tensor | None) -> np.ndarray | None:
    """A NumPy copy of a tensor (detached, on the CPU), or None."""
    return None if t is None else t.detach().cpu().numpy().copy()


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A fresh, writable, contiguous tensor (``from_numpy`` warns on read-only arrays)."""
    return torch.from_numpy(np.array(a, order="C"))


def _torch_dtype(a: np.ndarray) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=a.dtype)).dtype


# ------------------------------------------------------------ NumPy <-> nn.MultiheadAttention


def params_from_torch(module: nn.MultiheadAttention) -> AttentionParams:
    """The weights of an ``nn.MultiheadAttention`` (any ``batch_first``) as NumPy arrays.

    PyTorch keeps ``W_q, W_k, W_v`` as the row blocks of ``in_proj_weight`` ``(3D, D)``
    (or apart, as ``q/k/v_proj_weight``, when ``kdim``/``vdim`` differ from ``D``) in
    its ``(out, in)`` layout; each is transposed into ours. Dropout is a training-time
    operation, not a weight, and is not part of the result.

    Raises
    ------
    ValueError
        If ``module`` is not an ``nn.MultiheadAttention``, or if it uses
        ``add_bias_kv`` or ``add_zero_attn``, which change the attention itself and
        have no counterpart in :mod:`mha`.
    """
    if not isinstance(module, nn.MultiheadAttention):
        raise ValueError(f"module must be an nn.MultiheadAttention, got {type(module).__name__}")
    if module.bias_k is not None or module.add_zero_attn:
        raise ValueError("module uses add_bias_kv or add_zero_attn, which mha does not implement")
    d_model = module.embed_dim
    if module.in_proj_weight is not None:
        w_in = _numpy(module.in_proj_weight)  # (3D, D), rows = outputs
        w_q, w_k, w_v = (w_in[i * d_model : (i + 1) * d_model].T for i in range(3))
    else:
        w_q, w_k, w_v = (
            _numpy(w).T for w in (module.q_proj_weight, module.k_proj_weight, module.v_proj_weight)
        )
    b_in = _numpy(module.in_proj_bias)
    b_q, b_k, b_v = (
        (None, None, None)
        if b_in is None
        else (b_in[i * d_model : (i + 1) * d_model] for i in range(3))
    )
    return AttentionParams(
        W_q=np.ascontiguousarray(w_q),
        b_q=b_q,
        W_k=np.ascontiguousarray(w_k),
        b_k=b_k,
        W_v=np.ascontiguousarray(w_v),
        b_v=b_v,
        W_o=np.ascontiguousarray(_numpy(module.out_proj.weight).T),
        b_o=_numpy(module.out_proj.bias),
    )


def params_to_torch(
    params: AttentionParams, num_heads: int, dropout: float = 0.0
) -> nn.MultiheadAttention:
    """A new ``nn.MultiheadAttention(batch_first=True)`` holding copies of ``params``.

    Its dtype is that of ``params.W_q``; keys and values may have other widths
    (``kdim``, ``vdim``). Call it with ``average_attn_weights=False`` to get per-head
    weights ``(B, H, T, S)``.
    """
    _check_params(params)
    check_divisible(params.d_model, num_heads)  # nn.MultiheadAttention would only assert
    if params.kv_dim != params.d_model:
        raise ValueError(
            f"nn.MultiheadAttention has no grouped-query attention: params project keys "
            f"and values to {params.kv_dim} features, not d_model={params.d_model}"
        )
    module = nn.MultiheadAttention(
        params.d_model,
        num_heads,
        dropout=dropout,
        bias=params.bias,
        batch_first=True,
        kdim=params.W_k.shape[0],
        vdim=params.W_v.shape[0],
        dtype=_torch_dtype(params.W_q),
    )
    with torch.no_grad():
        if module.in_proj_weight is not None:
            # (D, D) x 3 -> (3D, D), PyTorch's (out, in) layout
            packed = np.concatenate([params.W_q.T, params.W_k.T, params.W_v.T], axis=0)
            module.in_proj_weight.copy_(_tensor(packed))
        else:
            module.q_proj_weight.copy_(_tensor(params.W_q.T))
            module.k_proj_weight.copy_(_tensor(params.W_k.T))
            module.v_proj_weight.copy_(_tensor(params.W_v.T))
        module.out_proj.weight.copy_(_tensor(params.W_o.T))
        if params.bias:
            biases = np.concatenate([params.b_q, params.b_k, params.b_v])
            module.in_proj_bias.copy_(_tensor(biases))
            module.out_proj.bias.copy_(_tensor(params.b_o))
    return module


# ------------------------------------------------------------ NumPy <-> our MultiHeadAttention


def params_from_module(module: MultiHeadAttention) -> AttentionParams:
    """The weights of our module as NumPy arrays (same dtype), ``(out, in)`` transposed."""
    if not isinstance(module, MultiHeadAttention):
        raise ValueError(f"module must be an mha MultiHeadAttention, got {type(module).__name__}")

    def weight(linear: nn.Linear) -> np.ndarray:
        return _numpy(linear.weight).T.copy()  # (out, in) -> (D_in, D_out)

    return AttentionParams(
        W_q=weight(module.W_q),
        b_q=_numpy(module.W_q.bias),
        W_k=weight(module.W_k),
        b_k=_numpy(module.W_k.bias),
        W_v=weight(module.W_v),
        b_v=_numpy(module.W_v.bias),
        W_o=weight(module.W_o),
        b_o=_numpy(module.W_o.bias),
    )


def params_to_module(
    params: AttentionParams, num_heads: int, dropout: float = 0.0
) -> MultiHeadAttention:
    """A new :class:`~mha.modules.MultiHeadAttention` holding copies of ``params``.

    It keeps their dtype, and their grouped key/value heads if ``W_k`` and ``W_v``
    project to fewer features than ``d_model``. Our module reads keys and values of
    width ``D``, so ``params`` for other input widths are refused.
    """
    _check_params(params)
    num_kv_heads = params.num_kv_heads(num_heads)
    ours = MultiHeadAttention(
        params.d_model, num_heads, dropout=dropout, bias=params.bias, num_kv_heads=num_kv_heads
    )
    ours.to(dtype=_torch_dtype(params.W_q))
    with torch.no_grad():
        for name in ("q", "k", "v", "o"):
            linear: nn.Linear = getattr(ours, f"W_{name}")
            w = getattr(params, f"W_{name}")
            if w.shape[::-1] != tuple(linear.weight.shape):
                raise ValueError(
                    f"params.W_{name} must have shape {tuple(linear.weight.shape)[::-1]} "
                    f"for MultiHeadAttention({params.d_model}, {num_heads}), got {w.shape}"
                )
            linear.weight.copy_(_tensor(w.T))  # (D_in, D_out) -> (out, in)
            if params.bias:
                linear.bias.copy_(_tensor(getattr(params, f"b_{name}")))
    return ours


def _check_params(params: Any) -> None:
    if not isinstance(params, AttentionParams):
        raise ValueError(f"params must be an AttentionParams, got {type(params).__name__}")


# ------------------------------------------------------- our module <-> nn.MultiheadAttention


def module_from_torch(module: nn.MultiheadAttention) -> MultiHeadAttention:
    """Our module with the weights, dropout and train/eval mode of ``module``.

    Our module is always batch-first; the weights do not depend on ``batch_first``.
    """
    ours = params_to_module(params_from_torch(module), module.num_heads, module.dropout)
    return ours.train(module.training)


def module_to_torch(module: MultiHeadAttention) -> nn.MultiheadAttention:
    """An ``nn.MultiheadAttention(batch_first=True)`` with the weights, dropout and
    train/eval mode of our ``module``."""
    theirs = params_to_torch(params_from_module(module), module.num_heads, module.dropout)
    return theirs.train(module.training)


# ----------------------------------------------------------------- PyTorch's layers -> ours


def encoder_layer_from_torch(layer: nn.TransformerEncoderLayer) -> EncoderLayer:
    """Our :class:`~mha.layers.EncoderLayer` with the weights of
    ``nn.TransformerEncoderLayer(batch_first=True, activation='relu')``."""
    if not isinstance(layer, nn.TransformerEncoderLayer):
        raise ValueError(f"layer must be nn.TransformerEncoderLayer, got {type(layer).__name__}")
    _check_torch_layer(layer, (layer.self_attn,))
    ours = EncoderLayer(**_layer_args(layer))
    ours.self_attn = module_from_torch(layer.self_attn)
    _copy_feed_forward_and_norms(ours, layer, ("norm1", "norm2"))
    return ours.train(layer.training)


def decoder_layer_from_torch(layer: nn.TransformerDecoderLayer) -> DecoderLayer:
    """Our :class:`~mha.layers.DecoderLayer` with the weights of
    ``nn.TransformerDecoderLayer(batch_first=True, activation='relu')``."""
    if not isinstance(layer, nn.TransformerDecoderLayer):
        raise ValueError(f"layer must be nn.TransformerDecoderLayer, got {type(layer).__name__}")
    _check_torch_layer(layer, (layer.self_attn, layer.multihead_attn))
    ours = DecoderLayer(**_layer_args(layer))
    ours.self_attn = module_from_torch(layer.self_attn)
    ours.cross_attn = module_from_torch(layer.multihead_attn)
    _copy_feed_forward_and_norms(ours, layer, ("norm1", "norm2", "norm3"))
    return ours.train(layer.training)


def _layer_args(layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer) -> dict:
    return {
        "d_model": layer.self_attn.embed_dim,
        "num_heads": layer.self_attn.num_heads,
        "d_ff": layer.linear1.out_features,
        "dropout": layer.dropout.p,
        "norm_first": layer.norm_first,
        "layer_norm_eps": layer.norm1.eps,
        "bias": layer.linear1.bias is not None,
    }


def _check_torch_layer(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
    attentions: tuple[nn.MultiheadAttention, ...],
) -> None:
    relu = layer.activation is F.relu or isinstance(layer.activation, nn.ReLU)
    if not relu:
        raise ValueError(f"only activation='relu' is supported, got {layer.activation}")
    if not all(attn.batch_first for attn in attentions):
        raise ValueError("layer must be built with batch_first=True (ours is batch-first)")


def _copy_feed_forward_and_norms(ours: nn.Module, layer: nn.Module, norms: tuple[str, ...]) -> None:
    """Copy the feed-forward and LayerNorm weights of a PyTorch Transformer layer."""
    dtype = layer.linear1.weight.dtype
    ours.to(dtype=dtype)
    ours.feed_forward.linear1.load_state_dict(layer.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(layer.linear2.state_dict())
    for name in norms:
        getattr(ours, name).load_state_dict(getattr(layer, name).state_dict())
