"""The layers of the Transformer, built on :class:`mha.modules.MultiHeadAttention`.

:class:`FeedForward`, :class:`EncoderLayer` and :class:`DecoderLayer`, post-norm as in
"Attention Is All You Need" or pre-norm. The tests check them against PyTorch's
``nn.TransformerEncoderLayer`` / ``nn.TransformerDecoderLayer`` with copied weights
(see :mod:`mha.convert`). The whole model is :class:`mha.transformer.Transformer`.

Shape legend: B batch, H heads, T target length, S source length, D d_model.
Masks: boolean, ``True`` = may attend.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from mha._checks import check_positive_int
from mha.kv_cache_torch import KVCache
from mha.modules import MultiHeadAttention, check_hidden

__all__ = ["DecoderLayer", "EncoderLayer", "FeedForward"]


class FeedForward(nn.Module):
    """Position-wise feed-forward network ``W_2 relu(W_1 x + b_1) + b_2``.

    Parameters
    ----------
    d_model : int
        Input and output width D.
    d_ff : int
        Hidden width (the paper uses 4 D).
    dropout : float
        Dropout on the hidden activations (as ``nn.TransformerEncoderLayer``).
    bias : bool
        Whether both linear maps have biases.
    """

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        d_model = check_positive_int(d_model, "d_model")
        d_ff = check_positive_int(d_ff, "d_ff")  # nn.Linear(D, True) would be 1 wide
        self.linear1 = nn.Linear(d_model, d_ff, bias=bias)
        self.linear2 = nn.Linear(d_ff, d_model, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(B, L, D) -> (B, L, D)``, each position independently."""
        check_hidden(x, "x", self.linear1.in_features, self.linear1.weight.dtype)
        hidden = F.relu(self.linear1(x))  # (B, L, D) @ (D, d_ff) -> (B, L, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, L, d_ff) @ (d_ff, D) -> (B, L, D)



class EncoderLayer(nn.Module):
    """Transformer encoder layer: self-attention then feed-forward, each with a residual.

    Post-norm (the paper, default): ``x = norm(x + sublayer(x))``.
    Pre-norm (``norm_first=True``): ``x = x + sublayer(norm(x))`` — trains more easily in
    deep stacks; the stack then needs a final LayerNorm (``Transformer`` adds it).

    Parameters
    ----------
    d_model, num_heads, d_ff : int
        Width, heads, feed-forward hidden width.
    dropout : float
        Dropout on attention weights, the FFN hidden layer and each sublayer output.
    norm_first : bool
        Pre-norm instead of post-norm.
    layer_norm_eps : float
        LayerNorm epsilon (PyTorch's default 1e-5).
    bias : bool
        Biases in all linear maps and LayerNorms.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        score_bias: Tensor | None = None,
        rope_positions: Tensor | None = None,
        rope_scaling: tuple[Tensor, float] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Encode ``x``. Everything after ``mask`` is passed by keyword.

        Parameters
        ----------
        x : Tensor
            ``(B, S, D)``.
        mask : Tensor, optional
            bool, True = may attend, broadcastable to ``(B, H, S, S)`` (usually source
            padding ``(B, 1, 1, S)``).
        need_weights : bool
            Return the self-attention weights ``(B, H, S, S)``. Default False (the fast
            path), as everywhere inside a model; only :class:`MultiHeadAttention`
            defaults to True, as ``torch.nn.MultiheadAttention`` does.
        score_bias, rope_positions : Tensor, optional
            Positions inside the self-attention (ALiBi's bias ``(H, S, S)``, RoPE's
            positions ``(S,)``): see :meth:`MultiHeadAttention.forward`.
        rope_scaling : (Tensor, float), optional
            RoPE's frequencies and attention factor past the training length (e.g. a
            :class:`mha.rope_scaling_torch.ScaledRope`): see
            :meth:`MultiHeadAttention.forward`.

        Returns
        -------
        x : Tensor
            ``(B, S, D)``.
        weights : Tensor or None
        """
        # Checked here: pre-norm meets x first in a LayerNorm, whose error names nothing.
        check_hidden(x, "x", self.self_attn.d_model, self.self_attn.W_q.weight.dtype)
        options = {"need_weights": need_weights, "score_bias": score_bias,
                   "rope_positions": rope_positions, "rope_scaling": rope_scaling}  # fmt: skip
        if self.norm_first:
            h = self.norm1(x)
            attended, weights = self.self_attn(h, h, h, mask, **options)
            x = x + self.dropout1(attended)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            attended, weights = self.self_attn(x, x, x, mask, **options)
            x = self.norm1(x + self.dropout1(attended))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x, weights


class DecoderLayer(nn.Module):
    """Transformer decoder layer: masked self-attention, cross-attention, feed-forward.

    Same residual/norm arrangement and parameters as :class:`EncoderLayer`, with a third
    sublayer: cross-attention whose queries come from the decoder and whose keys and
    values are the encoder output (``memory``).
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        d_ff: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
        bias: bool = True,
    ):
        super().__init__()
        self.norm_first = norm_first
        self.self_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.cross_attn = MultiHeadAttention(d_model, num_heads, dropout=dropout, bias=bias)
        self.feed_forward = FeedForward(d_model, d_ff, dropout=dropout, bias=bias)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.norm3 = nn.LayerNorm(d_model, eps=layer_norm_eps, bias=bias)
        self.dropout1 = nn.Dropout(dropout)
        self.dropout2 = nn.Dropout(dropout)
        self.dropout3 = nn.Dropout(dropout)

    def forward(
        self,
        x: Tensor,
        memory: Tensor,
        self_mask: Tensor | None = None,
        cross_mask: Tensor | None = None,
        *,
        need_weights: bool = False,
        cache: tuple[KVCache, KVCache] | None = None,
        self_score_bias: Tensor | None = None,
        rope_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Decode ``x`` while attending to ``memory``. Everything after the masks is
        passed by keyword.

        Parameters
        ----------
        x : Tensor
            ``(B, T, D)`` decoder input.
        memory : Tensor
            ``(B, S, D)`` encoder output.
        self_mask : Tensor, optional
            bool, broadcastable to ``(B, H, T, T)`` (causal AND target padding).
        cross_mask : Tensor, optional
            bool, broadcastable to ``(B, H, T, S)`` (source padding ``(B, 1, 1, S)``).
        need_weights : bool
            Return the attention weights. Default False (the fast path), as everywhere
            inside a model; only :class:`MultiHeadAttention` defaults to True, as
            ``torch.nn.MultiheadAttention`` does.
        cache : (KVCache, KVCache), optional
            The self-attention cache of the earlier positions, and the (fixed) cache
            of the projected memory; ``x`` then holds the new positions only.
        self_score_bias, rope_positions : Tensor, optional
            Positions inside the self-attention only (ALiBi's causal bias ``(H, T,
            S)``, RoPE's positions ``(T,)`` of the new positions): see
            :meth:`MultiHeadAttention.forward`. Cross-attention gets neither.

        Returns
        -------
        x : Tensor
            ``(B, T, D)``.
        self_weights : Tensor or None
            ``(B, H, T, T)``.
        cross_weights : Tensor or None
            ``(B, H, T, S)``.
        """
        dtype = self.self_attn.W_q.weight.dtype  # x meets a LayerNorm first in pre-norm
        check_hidden(x, "x", self.self_attn.d_model, dtype)
        check_hidden(memory, "memory", self.self_attn.d_model, dtype)
        if cache is not None and (not isinstance(cache, tuple | list) or len(cache) != 2):
            raise ValueError(
                "cache must be a pair (self-attention KVCache, cross-attention KVCache), "
                f"one item of Transformer.new_cache(), got {type(cache).__name__}"
            )
        self_cache, cross_cache = (None, None) if cache is None else cache
        self_options = {"need_weights": need_weights, "cache": self_cache,
                        "score_bias": self_score_bias, "rope_positions": rope_positions}
        cross_options = {"need_weights": need_weights, "cache": cross_cache}  # fmt: skip
        if self.norm_first:
            h = self.norm1(x)
            attended, self_weights = self.self_attn(h, h, h, self_mask, **self_options)
            x = x + self.dropout1(attended)
            h = self.norm2(x)
            attended, cross_weights = self.cross_attn(h, memory, memory, cross_mask,
                                                      **cross_options)  # fmt: skip
            x = x + self.dropout2(attended)
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            attended, self_weights = self.self_attn(x, x, x, self_mask, **self_options)
            x = self.norm1(x + self.dropout1(attended))
            attended, cross_weights = self.cross_attn(x, memory, memory, cross_mask,
                                                      **cross_options)  # fmt: skip
            x = self.norm2(x + self.dropout2(attended))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x, self_weights, cross_weights
