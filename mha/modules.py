"""PyTorch modules for multi-head attention and the encoder-decoder Transformer.

The NumPy functions in :mod:`mha.functional` are the specification; these modules
compute the same thing with autograd, and the tests check them against both the NumPy
code and PyTorch's own ``nn.MultiheadAttention`` / ``nn.TransformerEncoderLayer`` /
``nn.TransformerDecoderLayer``.

Shape legend: B batch, H heads, T target (query) length, S source (key) length,
D d_model, Dh head_dim = D / H, V vocabulary size.

Mask convention (the same everywhere in :mod:`mha`): a boolean tensor, ``True`` = may
attend, broadcastable to ``(B, H, T, S)``. A query row with nothing to attend to gets
zero weights and a zero context vector, never NaN, on both paths of
:class:`MultiHeadAttention`; NaN in the input propagates as in PyTorch.
``nn.MultiheadAttention``'s boolean masks mean the opposite (``True`` = blocked), and
its answer for a row with nothing to attend to depends on the path it takes (torch 2.13):

- ``need_weights=True``: NaN (weights and output);
- ``need_weights=False`` under ``torch.no_grad()`` in eval mode: NaN. This is the fused
  fast path, which is taken only for self-attention (one tensor as query, key and
  value), ``batch_first=True`` and an even number of heads;
- ``need_weights=False`` with autograd on (or in training mode, or off the fast path):
  zeros, because that path calls ``F.scaled_dot_product_attention``, whose softmax
  gives such a row zero weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mha._checks import check_non_negative_int, check_positive_int
from mha.functional import AttentionParams
from mha.positional import sinusoidal_positional_encoding

__all__ = [
    "AttentionMaps",
    "DecoderLayer",
    "EncoderLayer",
    "FeedForward",
    "MultiHeadAttention",
    "Transformer",
    "source_mask",
    "target_mask",
]


# --------------------------------------------------------------------------- masks
# Torch versions of mha.masks for token-id batches, so a model builds its masks on the
# tokens' device without a NumPy round trip. Same convention: True = may attend.


def source_mask(src: Tensor, pad_id: int) -> Tensor:
    """Key-padding mask from token ids: real tokens may be attended to, padding may not.

    Parameters
    ----------
    src : Tensor
        ``(B, S)`` integer token ids.
    pad_id : int
        The id used for padding.

    Returns
    -------
    Tensor
        ``(B, 1, 1, S)`` bool, True where ``src != pad_id``; broadcasts against
        ``(B, H, T, S)``. Equals ``mha.masks.padding_mask(tokens=src, pad_id=pad_id)``.
    """
    _check_tokens(src, "src")
    return (src != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def target_mask(tgt_in: Tensor, pad_id: int) -> Tensor:
    """Decoder self-attention mask: causal AND target padding.

    Parameters
    ----------
    tgt_in : Tensor
        ``(B, T)`` integer decoder input ids.
    pad_id : int
        The id used for padding.

    Returns
    -------
    Tensor
        ``(B, 1, T, T)`` bool: query ``t`` may attend to key ``u`` iff ``u <= t`` and
        ``tgt_in[:, u] != pad_id``. Equals ``mha.masks.combine_masks(causal_mask(T),
        padding_mask(tokens=tgt_in, pad_id=pad_id))``.
    """
    _check_tokens(tgt_in, "tgt_in")
    size = tgt_in.shape[1]
    causal = torch.ones(size, size, dtype=torch.bool, device=tgt_in.device).tril()  # (T, T)
    padding = (tgt_in != pad_id)[:, None, None, :]  # (B, T) -> (B, 1, 1, T)
    return padding & causal  # (B, 1, 1, T) & (T, T) -> (B, 1, T, T)


def _check_tokens(tokens: Tensor, name: str) -> None:
    if not isinstance(tokens, Tensor) or tokens.ndim != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"{name} must be a (B, L) tensor of token ids, got shape {shape}")
    if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise ValueError(f"{name} must hold integer token ids, got dtype {tokens.dtype}")


# ------------------------------------------------------------------ multi-head attention


class MultiHeadAttention(nn.Module):
    """Multi-head attention, ``softmax(Q K^T / sqrt(Dh)) V`` in H heads, then ``W_o``.

    Parameters
    ----------
    d_model : int
        Model width D; must be divisible by ``num_heads``.
    num_heads : int
        Number of heads H; each head works in ``head_dim = d_model // num_heads`` dims.
    dropout : float
        Dropout on the attention weights (training mode only).
    bias : bool
        Whether the four projections have biases.

    Notes
    -----
    Three separate ``nn.Linear`` for ``W_q``, ``W_k``, ``W_v`` rather than one fused
    ``(3D, D)`` projection: they map one-to-one onto the paper and onto
    :class:`mha.functional.AttentionParams`, cross-attention needs no weight slicing, and
    on this course's CPU three ``(D, D)`` matmuls measured no slower than one ``(3D, D)``
    matmul followed by a split (see ``python -m mha.bench``).
    The parameter count, ``4 D^2 + 4 D``, does not depend on ``num_heads``: the heads are a
    reshape of the same projections, not extra weights.
    """

    def __init__(self, d_model: int, num_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        # As in the NumPy core: 2.0 or True heads are refused, not used as 2 or 1.
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        if d_model % num_heads != 0:
            raise ValueError(
                f"d_model must be a positive multiple of num_heads, got d_model={d_model}, "
                f"num_heads={num_heads}"
            )
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.head_dim = d_model // num_heads
        self.dropout = dropout
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, d_model, bias=bias)
        self.W_v = nn.Linear(d_model, d_model, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, ``U(-a, a)`` with ``a = sqrt(6 / (D + D))`` for each of
        the four ``(D, D)`` matrices (as :meth:`mha.functional.AttentionParams.init`), and
        zero biases.

        Xavier keeps the variance of ``q . k`` roughly independent of D at initialisation,
        so the softmax starts neither saturated nor flat. ``nn.MultiheadAttention`` also
        zeroes its biases, but draws ``W_q, W_k, W_v`` as one ``(3D, D)`` Xavier matrix
        (bound ``sqrt(6 / 4D)``) and leaves ``W_o`` at ``nn.Linear``'s default.
        """
        for linear in (self.W_q, self.W_k, self.W_v, self.W_o):
            nn.init.xavier_uniform_(linear.weight)
            if linear.bias is not None:
                nn.init.zeros_(linear.bias)

    @property
    def bias(self) -> bool:
        """Whether the projections have biases."""
        return self.W_q.bias is not None

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, num_heads={self.num_heads}, dropout={self.dropout}"

    # ---------------------------------------------------------------- validation

    def _check_inputs(self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            if not isinstance(x, Tensor):
                raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
            if x.ndim != 3 or x.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must have shape (B, L, d_model={self.d_model}), got {tuple(x.shape)}"
                )
        if not query.shape[0] == key.shape[0] == value.shape[0]:
            raise ValueError(
                "query, key and value must have the same batch size, got shapes "
                f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                "key and value must have the same length S, got shapes "
                f"key {tuple(key.shape)}, value {tuple(value.shape)}"
            )
        if mask is None:
            return
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool:
            kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
            raise ValueError(
                f"mask must be a bool tensor (True = may attend), got {kind}; "
                "convert additive float masks with mha.masks.from_additive_mask"
            )
        B, T, S = query.shape[0], query.shape[1], key.shape[1]
        target = (B, self.num_heads, T, S)
        # As in the NumPy core: at least (T, S) — a 1-D mask could mean queries or keys —
        # and every dim 1 or equal to the scores' dim (no silent enlarging).
        ok = 2 <= mask.ndim <= 4
        if ok:
            try:
                ok = torch.broadcast_shapes(mask.shape, target) == target
            except RuntimeError:
                ok = False
        if not ok:
            raise ValueError(
                f"mask of shape {tuple(mask.shape)} does not broadcast to (B, H, T, S) = "
                f"{target} (query {tuple(query.shape)}, key {tuple(key.shape)})"
            )

    # ------------------------------------------------------------------- forward

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        need_weights: bool = True,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Parameters
        ----------
        query : Tensor
            ``(B, T, D)``.
        key, value : Tensor
            ``(B, S, D)`` (``key is value is query`` for self-attention).
        mask : Tensor, optional
            bool, True = may attend, broadcastable to ``(B, H, T, S)`` — e.g. ``(T, S)``
            causal, ``(B, 1, 1, S)`` key padding, ``(B, 1, T, S)`` both.
        need_weights : bool
            True: explicit softmax, returns the weights. False: fast path through
            ``F.scaled_dot_product_attention``, returns None for the weights (inputs
            whose projected queries or keys hold NaN or inf take the explicit path, so
            that NaN propagates on both paths alike).

        Returns
        -------
        output : Tensor
            ``(B, T, D)``.
        weights : Tensor or None
            ``(B, H, T, S)`` attention weights (before dropout; rows sum to 1, or are all
            zero for a query row with nothing to attend to).
        """
        self._check_inputs(query, key, value, mask)
        B, T, _ = query.shape
        S = key.shape[1]
        H, Dh = self.num_heads, self.head_dim
        dropout_p = self.dropout if self.training else 0.0

        # 1. Project: one (D, D) matmul each, all heads at once.
        q = self.W_q(query)  # (B, T, D) @ (D, D) -> (B, T, D)
        k = self.W_k(key)  # (B, S, D) @ (D, D) -> (B, S, D)
        v = self.W_v(value)  # (B, S, D) @ (D, D) -> (B, S, D)

        # 2. Split heads: head h owns features h*Dh:(h+1)*Dh (a view, no copy).
        q = q.view(B, T, H, Dh).transpose(1, 2)  # (B, T, D) -> (B, T, H, Dh) -> (B, H, T, Dh)
        k = k.view(B, S, H, Dh).transpose(1, 2)  # (B, S, D) -> (B, S, H, Dh) -> (B, H, S, Dh)
        v = v.view(B, S, H, Dh).transpose(1, 2)  # (B, S, D) -> (B, S, H, Dh) -> (B, H, S, Dh)

        # Rows that may attend to nothing; only these need the zero-not-NaN fix-up.
        empty_rows = None
        if mask is not None:
            empty_rows = ~mask.any(dim=-1, keepdim=True)  # (..., T, S) -> (..., T, 1)
            if not bool(empty_rows.any()):
                empty_rows = None

        # The fused kernel is only trusted with finite queries and keys: for a query row
        # holding NaN, torch 2.13's CPU kernel returns zeros instead of NaN (and with a
        # mask, a NaN in a blocked key spreads to every row). The explicit path handles
        # NaN and inf as the NumPy specification does.
        fused = not need_weights and bool(torch.isfinite(q).all() & torch.isfinite(k).all())

        if not fused:
            # 3. Scores, scaled by 1/sqrt(Dh). Scaling q (T*Dh numbers) instead of the
            #    scores (T*S numbers) is the same product and a cheaper pass.
            scores = (q * Dh**-0.5) @ k.transpose(-2, -1)  # (B,H,T,Dh) @ (B,H,Dh,S) -> (B,H,T,S)
            # 4. Blocked positions get -inf, so softmax gives them exactly 0.
            if mask is not None:
                scores.masked_fill_(~mask, float("-inf"))  # in place: a fresh tensor
            if scores.requires_grad:
                weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
            else:
                # Inference: overwrite the scores instead of allocating (and page-faulting)
                # a second (B, H, T, S) tensor; nn.MultiheadAttention does the same.
                weights = torch.softmax(scores, dim=-1, out=scores)  # (B, H, T, S)
            # 5. An all -inf row softmaxes to NaN (0/0): define it as zero weights.
            if empty_rows is not None:
                weights = weights.masked_fill(empty_rows, 0.0)
            attn = F.dropout(weights, p=dropout_p) if dropout_p > 0 else weights
            context = attn @ v  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
            if not need_weights:
                weights = None
        else:
            weights = None
            # 3-5 fused: PyTorch picks a kernel that never materialises (B, H, T, S).
            context = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout_p
            )  # (B, H, T, Dh)
            if empty_rows is not None:
                # Some SDPA backends return NaN for a row with nothing to attend to.
                context = context.masked_fill(empty_rows, 0.0)  # (B, H, T, Dh)

        # 6. Merge heads back side by side, then mix them with W_o.
        context = context.transpose(1, 2).reshape(B, T, self.d_model)  # (B,H,T,Dh) -> (B,T,D)
        output = self.W_o(context)  # (B, T, D) @ (D, D) -> (B, T, D)
        return output, weights

    # ---------------------------------------------------------------- conversion

    @classmethod
    def from_torch(cls, module: nn.MultiheadAttention) -> MultiHeadAttention:
        """Copy the weights of an ``nn.MultiheadAttention`` (same dtype and device).

        Our module is always batch-first; the weights do not depend on ``batch_first``.
        """
        if not isinstance(module, nn.MultiheadAttention):
            raise TypeError(f"module must be nn.MultiheadAttention, got {type(module).__name__}")
        if not module._qkv_same_embed_dim or module.bias_k is not None or module.add_zero_attn:
            raise ValueError(
                "module must use kdim == vdim == embed_dim, no add_bias_kv and no add_zero_attn"
            )
        D = module.embed_dim
        bias = module.in_proj_bias is not None
        weight = module.in_proj_weight
        ours = cls(D, module.num_heads, dropout=module.dropout, bias=bias)
        ours.to(device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            # nn.MultiheadAttention stacks [W_q; W_k; W_v] as one (3D, D) matrix.
            for i, linear in enumerate((ours.W_q, ours.W_k, ours.W_v)):
                linear.weight.copy_(weight[i * D : (i + 1) * D])  # (3D, D) -> (D, D)
                if bias:
                    linear.bias.copy_(module.in_proj_bias[i * D : (i + 1) * D])
            ours.W_o.weight.copy_(module.out_proj.weight)
            if bias:
                ours.W_o.bias.copy_(module.out_proj.bias)
        return ours.train(module.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """An ``nn.MultiheadAttention(batch_first=True)`` with these weights."""
        weight = self.W_q.weight
        module = nn.MultiheadAttention(
            self.d_model,
            self.num_heads,
            dropout=self.dropout,
            bias=self.bias,
            batch_first=True,
            device=weight.device,
            dtype=weight.dtype,
        )
        with torch.no_grad():
            # (D, D) x 3 -> (3D, D)
            module.in_proj_weight.copy_(
                torch.cat([self.W_q.weight, self.W_k.weight, self.W_v.weight])
            )
            module.out_proj.weight.copy_(self.W_o.weight)
            if self.bias:
                module.in_proj_bias.copy_(torch.cat([self.W_q.bias, self.W_k.bias, self.W_v.bias]))
                module.out_proj.bias.copy_(self.W_o.bias)
        return module.train(self.training)

    @classmethod
    def from_params(
        cls, params: AttentionParams, num_heads: int, dropout: float = 0.0
    ) -> MultiHeadAttention:
        """Build from NumPy :class:`~mha.functional.AttentionParams` (keeps their dtype).

        ``AttentionParams`` stores ``W`` as ``(D_in, D_out)`` for ``x @ W``; ``nn.Linear``
        stores ``(D_out, D_in)`` for ``x @ W.T``: every matrix is transposed on the way.
        """
        if not isinstance(params, AttentionParams):
            raise ValueError(f"params must be an AttentionParams, got {type(params).__name__}")
        W_q = params.W_q  # (D, D): AttentionParams has checked the shapes against each other
        biases = (params.b_q, params.b_k, params.b_v, params.b_o)
        bias = all(b is not None for b in biases)
        ours = cls(W_q.shape[0], num_heads, dropout=dropout, bias=bias)
        ours.to(dtype=torch.as_tensor(W_q).dtype)
        with torch.no_grad():
            for name, b in zip(("q", "k", "v", "o"), biases, strict=True):
                linear: nn.Linear = getattr(ours, f"W_{name}")
                W = np.asarray(getattr(params, f"W_{name}"))
                if W.shape != linear.weight.shape:
                    raise ValueError(
                        f"params.W_{name} must have shape {tuple(linear.weight.shape)}, "
                        f"got {W.shape}"
                    )
                linear.weight.copy_(torch.from_numpy(W.T.copy()))  # (D_in, D_out) -> (out, in)
                if bias:
                    linear.bias.copy_(torch.from_numpy(np.array(b, copy=True)))
        return ours

    def to_params(self) -> AttentionParams:
        """These weights as NumPy :class:`~mha.functional.AttentionParams` (same dtype)."""

        def weight(linear: nn.Linear) -> np.ndarray:
            return linear.weight.detach().cpu().numpy().T.copy()  # (out, in) -> (D_in, D_out)

        def bias(linear: nn.Linear) -> np.ndarray | None:
            return None if linear.bias is None else linear.bias.detach().cpu().numpy().copy()

        return AttentionParams(
            W_q=weight(self.W_q),
            b_q=bias(self.W_q),
            W_k=weight(self.W_k),
            b_k=bias(self.W_k),
            W_v=weight(self.W_v),
            b_v=bias(self.W_v),
            W_o=weight(self.W_o),
            b_o=bias(self.W_o),
        )


# ------------------------------------------------------------------------ layers


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
        hidden = F.relu(self.linear1(x))  # (B, L, D) @ (D, d_ff) -> (B, L, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, L, d_ff) @ (d_ff, D) -> (B, L, D)


def _check_torch_layer(
    layer: nn.TransformerEncoderLayer | nn.TransformerDecoderLayer,
    attentions: tuple[nn.MultiheadAttention, ...],
) -> None:
    relu = layer.activation is F.relu or isinstance(layer.activation, nn.ReLU)
    if not relu:
        raise ValueError(f"only activation='relu' is supported, got {layer.activation}")
    if not all(attn.batch_first for attn in attentions):
        raise ValueError("layer must be built with batch_first=True (ours is batch-first)")


def _copy_linear_and_norms(ours: nn.Module, layer: nn.Module, norms: tuple[str, ...]) -> None:
    """Copy FFN and LayerNorm weights from a torch Transformer layer."""
    ours.feed_forward.linear1.load_state_dict(layer.linear1.state_dict())
    ours.feed_forward.linear2.load_state_dict(layer.linear2.state_dict())
    for name in norms:
        getattr(ours, name).load_state_dict(getattr(layer, name).state_dict())


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
        self, x: Tensor, mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Encode ``x``.

        Parameters
        ----------
        x : Tensor
            ``(B, S, D)``.
        mask : Tensor, optional
            bool, True = may attend, broadcastable to ``(B, H, S, S)`` (usually source
            padding ``(B, 1, 1, S)``).
        need_weights : bool
            Return the self-attention weights ``(B, H, S, S)``.

        Returns
        -------
        x : Tensor
            ``(B, S, D)``.
        weights : Tensor or None
        """
        if self.norm_first:
            h = self.norm1(x)
            attended, weights = self.self_attn(h, h, h, mask, need_weights)
            x = x + self.dropout1(attended)
            x = x + self.dropout2(self.feed_forward(self.norm2(x)))
        else:
            attended, weights = self.self_attn(x, x, x, mask, need_weights)
            x = self.norm1(x + self.dropout1(attended))
            x = self.norm2(x + self.dropout2(self.feed_forward(x)))
        return x, weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerEncoderLayer) -> EncoderLayer:
        """Copy an ``nn.TransformerEncoderLayer(batch_first=True, activation='relu')``."""
        if not isinstance(layer, nn.TransformerEncoderLayer):
            raise TypeError(f"layer must be nn.TransformerEncoderLayer, got {type(layer).__name__}")
        _check_torch_layer(layer, (layer.self_attn,))
        attn = MultiHeadAttention.from_torch(layer.self_attn)
        ours = cls(
            attn.d_model,
            attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
            layer_norm_eps=layer.norm1.eps,
            bias=layer.linear1.bias is not None,
        ).to(device=attn.W_q.weight.device, dtype=attn.W_q.weight.dtype)
        ours.self_attn = attn
        _copy_linear_and_norms(ours, layer, ("norm1", "norm2"))
        return ours.train(layer.training)


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
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None, Tensor | None]:
        """Decode ``x`` while attending to ``memory``.

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
            Return the attention weights.

        Returns
        -------
        x : Tensor
            ``(B, T, D)``.
        self_weights : Tensor or None
            ``(B, H, T, T)``.
        cross_weights : Tensor or None
            ``(B, H, T, S)``.
        """
        if self.norm_first:
            h = self.norm1(x)
            attended, self_weights = self.self_attn(h, h, h, self_mask, need_weights)
            x = x + self.dropout1(attended)
            h = self.norm2(x)
            attended, cross_weights = self.cross_attn(h, memory, memory, cross_mask, need_weights)
            x = x + self.dropout2(attended)
            x = x + self.dropout3(self.feed_forward(self.norm3(x)))
        else:
            attended, self_weights = self.self_attn(x, x, x, self_mask, need_weights)
            x = self.norm1(x + self.dropout1(attended))
            attended, cross_weights = self.cross_attn(x, memory, memory, cross_mask, need_weights)
            x = self.norm2(x + self.dropout2(attended))
            x = self.norm3(x + self.dropout3(self.feed_forward(x)))
        return x, self_weights, cross_weights

    @classmethod
    def from_torch(cls, layer: nn.TransformerDecoderLayer) -> DecoderLayer:
        """Copy an ``nn.TransformerDecoderLayer(batch_first=True, activation='relu')``."""
        if not isinstance(layer, nn.TransformerDecoderLayer):
            raise TypeError(f"layer must be nn.TransformerDecoderLayer, got {type(layer).__name__}")
        _check_torch_layer(layer, (layer.self_attn, layer.multihead_attn))
        self_attn = MultiHeadAttention.from_torch(layer.self_attn)
        ours = cls(
            self_attn.d_model,
            self_attn.num_heads,
            layer.linear1.out_features,
            dropout=layer.dropout.p,
            norm_first=layer.norm_first,
            layer_norm_eps=layer.norm1.eps,
            bias=layer.linear1.bias is not None,
        ).to(device=self_attn.W_q.weight.device, dtype=self_attn.W_q.weight.dtype)
        ours.self_attn = self_attn
        ours.cross_attn = MultiHeadAttention.from_torch(layer.multihead_attn)
        _copy_linear_and_norms(ours, layer, ("norm1", "norm2", "norm3"))
        return ours.train(layer.training)


# -------------------------------------------------------------------- transformer


@dataclass
class AttentionMaps:
    """Attention weights of every layer of a :class:`Transformer`, one tensor per layer.

    Attributes
    ----------
    encoder : list of Tensor
        ``(B, H, S, S)`` encoder self-attention.
    decoder_self : list of Tensor
        ``(B, H, T, T)`` masked decoder self-attention.
    cross : list of Tensor
        ``(B, H, T, S)`` decoder-to-encoder attention.
    """

    encoder: list[Tensor]
    decoder_self: list[Tensor]
    cross: list[Tensor]


class Transformer(nn.Module):
    """The encoder-decoder Transformer of "Attention Is All You Need", small by default.

    Parameters
    ----------
    src_vocab_size, tgt_vocab_size : int
        Vocabulary sizes of the source and target languages.
    d_model, num_heads, d_ff : int
        Width, heads per attention, feed-forward hidden width.
    num_encoder_layers, num_decoder_layers : int
        Depth of each stack.
    dropout : float
        Dropout after the embeddings and inside every layer.
    max_len : int
        Longest source or target sequence (size of the positional-encoding table).
    pad_id : int
        Padding token id in both vocabularies; masks are derived from it.
    norm_first : bool
        Pre-norm layers (plus a final LayerNorm after each stack).
    layer_norm_eps : float
        LayerNorm epsilon.

    Attributes
    ----------
    config : dict
        The constructor arguments above, by name, exactly as this model was built with
        them: ``Transformer(**model.config)`` builds the same architecture, and a
        checkpoint stores this dict (see :func:`mha.translate.save_checkpoint`).

    Notes
    -----
    Embeddings are multiplied by ``sqrt(d_model)`` (as in the paper) and initialised with
    standard deviation ``d_model**-0.5``, so the scaled embedding has entries of size ~1,
    like the sinusoidal encoding they are added to. Initialised at N(0, 1), the scaled
    embedding would be ``sqrt(d_model)`` times larger and drown the position signal.
    """

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 32,
        num_heads: int = 2,
        num_encoder_layers: int = 1,
        num_decoder_layers: int = 1,
        d_ff: int = 64,
        dropout: float = 0.0,
        max_len: int = 64,
        pad_id: int = 0,
        norm_first: bool = False,
        layer_norm_eps: float = 1e-5,
    ):
        super().__init__()
        # Refuse floats and bools (True would silently mean one layer, or a vocabulary
        # of one word) before they reach nn.Embedding, range() or nn.Linear.
        src_vocab_size = check_positive_int(src_vocab_size, "src_vocab_size")
        tgt_vocab_size = check_positive_int(tgt_vocab_size, "tgt_vocab_size")
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        num_encoder_layers = check_non_negative_int(num_encoder_layers, "num_encoder_layers")
        num_decoder_layers = check_non_negative_int(num_decoder_layers, "num_decoder_layers")
        d_ff = check_positive_int(d_ff, "d_ff")
        max_len = check_positive_int(max_len, "max_len")
        pad_id = check_non_negative_int(pad_id, "pad_id")
        # The architecture is recorded as given, not read back from the submodules later
        # (which once forgot layer_norm_eps). Plain Python types: it goes into JSON.
        self.config: dict[str, object] = {
            "src_vocab_size": src_vocab_size,
            "tgt_vocab_size": tgt_vocab_size,
            "d_model": d_model,
            "num_heads": num_heads,
            "num_encoder_layers": num_encoder_layers,
            "num_decoder_layers": num_decoder_layers,
            "d_ff": d_ff,
            "dropout": float(dropout),
            "max_len": max_len,
            "pad_id": pad_id,
            "norm_first": bool(norm_first),
            "layer_norm_eps": float(layer_norm_eps),
        }
        self.d_model = d_model
        self.num_heads = num_heads
        self.max_len = max_len
        self.pad_id = pad_id
        self.src_embedding = nn.Embedding(src_vocab_size, d_model)
        self.tgt_embedding = nn.Embedding(tgt_vocab_size, d_model)
        for embedding in (self.src_embedding, self.tgt_embedding):
            nn.init.normal_(embedding.weight, mean=0.0, std=d_model**-0.5)
        # A function of (max_len, d_model) only: a buffer (moves with .to()), not a
        # parameter, and not saved in checkpoints.
        encoding = torch.from_numpy(sinusoidal_positional_encoding(max_len, d_model))
        self.register_buffer(
            "positional_encoding", encoding.to(torch.get_default_dtype()), persistent=False
        )
        self.embedding_dropout = nn.Dropout(dropout)
        layer_args = (d_model, num_heads, d_ff, dropout, norm_first, layer_norm_eps)
        self.encoder_layers = nn.ModuleList(
            EncoderLayer(*layer_args) for _ in range(num_encoder_layers)
        )
        self.decoder_layers = nn.ModuleList(
            DecoderLayer(*layer_args) for _ in range(num_decoder_layers)
        )
        # Pre-norm leaves the residual stream un-normalised: normalise once at the end.
        # (Post-norm layers already end in a LayerNorm, as in the paper.)
        if norm_first:
            self.encoder_norm: nn.Module = nn.LayerNorm(d_model, eps=layer_norm_eps)
            self.decoder_norm: nn.Module = nn.LayerNorm(d_model, eps=layer_norm_eps)
        else:
            self.encoder_norm = nn.Identity()
            self.decoder_norm = nn.Identity()
        self.output = nn.Linear(d_model, tgt_vocab_size)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, name: str) -> Tensor:
        _check_tokens(tokens, name)
        length = tokens.shape[1]
        if length > self.max_len:
            raise ValueError(
                f"{name} has length {length} > max_len={self.max_len} (shape {tuple(tokens.shape)})"
            )
        # (B, L) -> (B, L, D), plus (L, D) broadcast over the batch
        x = embedding(tokens) * math.sqrt(self.d_model) + self.positional_encoding[:length]
        return self.embedding_dropout(x)

    def encode(self, src: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Run the encoder.

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source token ids (``pad_id`` for padding).
        need_weights : bool
            Collect each layer's self-attention weights.

        Returns
        -------
        memory : Tensor
            ``(B, S, D)``.
        enc_weights : list of Tensor
            One ``(B, H, S, S)`` per layer, or empty when ``need_weights`` is False.
        """
        x = self._embed(src, self.src_embedding, "src")
        mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        enc_weights = []
        for layer in self.encoder_layers:
            x, weights = layer(x, mask, need_weights)
            if need_weights:
                enc_weights.append(weights)
        return self.encoder_norm(x), enc_weights

    def decode(
        self, tgt_in: Tensor, memory: Tensor, src: Tensor, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
        """Run the decoder and the output projection.

        Parameters
        ----------
        tgt_in : Tensor
            ``(B, T)`` decoder input ids (target shifted right, starting with BOS).
        memory : Tensor
            ``(B, S, D)`` from :meth:`encode`.
        src : Tensor
            ``(B, S)`` the source ids, for the cross-attention padding mask.
        need_weights : bool
            Collect each layer's attention weights.

        Returns
        -------
        logits : Tensor
            ``(B, T, V)`` unnormalised next-token scores.
        self_weights : list of Tensor
            One ``(B, H, T, T)`` per layer (empty unless ``need_weights``).
        cross_weights : list of Tensor
            One ``(B, H, T, S)`` per layer (empty unless ``need_weights``).
        """
        _check_tokens(src, "src")
        if memory.ndim != 3 or memory.shape[:2] != src.shape or memory.shape[2] != self.d_model:
            raise ValueError(
                f"memory must have shape (B, S, d_model) = {(*src.shape, self.d_model)} to "
                f"match src {tuple(src.shape)}, got {tuple(memory.shape)}"
            )
        _check_tokens(tgt_in, "tgt_in")
        if tgt_in.shape[0] != src.shape[0]:
            raise ValueError(
                f"tgt_in and src must have the same batch size, got shapes "
                f"tgt_in {tuple(tgt_in.shape)}, src {tuple(src.shape)}"
            )
        x = self._embed(tgt_in, self.tgt_embedding, "tgt_in")
        self_mask = target_mask(tgt_in, self.pad_id)  # (B, 1, T, T)
        cross_mask = source_mask(src, self.pad_id)  # (B, 1, 1, S)
        self_weights, cross_weights = [], []
        for layer in self.decoder_layers:
            x, sw, cw = layer(x, memory, self_mask, cross_mask, need_weights)
            if need_weights:
                self_weights.append(sw)
                cross_weights.append(cw)
        logits = self.output(self.decoder_norm(x))  # (B, T, D) @ (D, V) -> (B, T, V)
        return logits, self_weights, cross_weights

    def forward(
        self, src: Tensor, tgt_in: Tensor, need_weights: bool = False
    ) -> Tensor | tuple[Tensor, AttentionMaps]:
        """Encode ``src`` and decode ``tgt_in`` (teacher forcing).

        Parameters
        ----------
        src : Tensor
            ``(B, S)`` source ids.
        tgt_in : Tensor
            ``(B, T)`` decoder input ids.
        need_weights : bool
            Also return every layer's attention weights.

        Returns
        -------
        logits : Tensor
            ``(B, T, V)``; with ``need_weights``, ``(logits, AttentionMaps)``.
        """
        memory, enc_weights = self.encode(src, need_weights)
        logits, self_weights, cross_weights = self.decode(tgt_in, memory, src, need_weights)
        if need_weights:
            return logits, AttentionMaps(enc_weights, self_weights, cross_weights)
        return logits
