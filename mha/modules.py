"""Multi-head attention as a PyTorch module, checked against the NumPy specification.

:class:`MultiHeadAttention` computes what :func:`mha.multi_head_attention` specifies,
with autograd and PyTorch's fused kernels. It does not import the specification: the
tests (through :mod:`mha.convert`) prove the two equal, and equal to PyTorch's own
``nn.MultiheadAttention``. Positions inside attention (RoPE for ``rope_positions=``,
ALiBi's ``score_bias=``) come from :mod:`mha.positional_torch`. The encoder and
decoder layers built from it live in :mod:`mha.layers`.

Shape legend: B batch, H heads, T target (query) length, S source (key) length,
D d_model, Dh head_dim = D / H.

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

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from mha._checks import check_divisible, check_kv_heads, check_positive_int, check_rope_pair
from mha.kv_cache_torch import KVCache
from mha.positional_torch import apply_rope

__all__ = ["MultiHeadAttention", "check_hidden", "kv_head_index"]


def kv_head_index(num_heads: int, num_kv_heads: int) -> Tensor:
    """Grouped-query attention's head mapping: ``(H,)``, the key/value head each query
    head reads. Query head ``h`` reads ``h // (H / Hkv)``, so consecutive query heads
    share one (as ``F.scaled_dot_product_attention(enable_gqa=True)`` does).

    The torch twin of ``mha.kv_head_index``: written again here, not imported.
    """
    group = check_kv_heads(num_heads, num_kv_heads)
    return torch.arange(num_heads) // group  # (H,)


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
    num_kv_heads : int, optional
        Grouped-query attention: ``W_k`` and ``W_v`` project to ``num_kv_heads *
        head_dim`` features, and each group of ``num_heads // num_kv_heads`` query heads
        shares one key/value head (``1``: multi-query attention). Default
        ``num_heads``: multi-head attention.

    Notes
    -----
    Three separate ``nn.Linear`` for ``W_q``, ``W_k``, ``W_v`` rather than one fused
    ``(3D, D)`` projection: they map one-to-one onto the paper and onto
    :class:`mha.params.AttentionParams`, cross-attention needs no weight slicing, and
    on this course's CPU three ``(D, D)`` matmuls measured no slower than one ``(3D, D)``
    matmul followed by a split (see ``python -m mha.bench``).
    The parameter count, ``4 D^2 + 4 D``, does not depend on ``num_heads``: the heads are a
    reshape of the same projections, not extra weights.
    """

    def __init__(
        self,
        d_model: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        num_kv_heads: int | None = None,
    ):
        super().__init__()
        # As in the NumPy core: 2.0 or True heads are refused, not used as 2 or 1.
        d_model = check_positive_int(d_model, "d_model")
        num_heads = check_positive_int(num_heads, "num_heads")
        head_dim = check_divisible(d_model, num_heads)
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        num_kv_heads = num_heads // check_kv_heads(num_heads, num_kv_heads)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.d_model = d_model
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads
        self.head_dim = head_dim
        self.dropout = dropout
        kv_dim = num_kv_heads * self.head_dim
        self.W_q = nn.Linear(d_model, d_model, bias=bias)
        self.W_k = nn.Linear(d_model, kv_dim, bias=bias)
        self.W_v = nn.Linear(d_model, kv_dim, bias=bias)
        self.W_o = nn.Linear(d_model, d_model, bias=bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform weights, ``U(-a, a)`` with ``a = sqrt(6 / (D + D))`` for each of
        the four ``(D, D)`` matrices (as :meth:`mha.params.AttentionParams.init`), and
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
        kv = "" if self.num_kv_heads == self.num_heads else f", num_kv_heads={self.num_kv_heads}"
        return f"d_model={self.d_model}, num_heads={self.num_heads}{kv}, dropout={self.dropout}"

    # ---------------------------------------------------------------- validation

    def _check_inputs(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None, cached: int
    ) -> None:
        for name, x in (("query", query), ("key", key), ("value", value)):
            check_hidden(x, name, self.d_model, self.W_q.weight.dtype)
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
        self._check_fits_scores("mask", mask, query, key, cached)

    @staticmethod
    def _check_cache_type(cache: object) -> None:
        """A torch :class:`KVCache` or None: not the specification's, not a dict."""
        if cache is not None and not isinstance(cache, KVCache):
            kind = f"{type(cache).__module__}.{type(cache).__qualname__}"
            raise ValueError(
                f"cache must be a mha.kv_cache_torch.KVCache (one per attention layer), "
                f"got {kind}; mha.KVCache is the NumPy specification's, which holds arrays"
            )

    def _check_cache_heads(self, cache: KVCache, query: Tensor) -> None:
        """The heads a cache holds, if any, are this layer's: its dtype, ``B``, ``Hkv``
        and ``Dh``."""
        if cache.k_heads is None:
            return
        stored, dtype = cache.k_heads, self.W_q.weight.dtype
        if stored.dtype != dtype:
            raise ValueError(
                f"cache holds {stored.dtype} key/value heads, but this layer computes in "
                f"{dtype}: a cache must come from a layer of the same dtype"
            )
        want = (query.shape[0], self.num_kv_heads, self.head_dim)
        if (stored.shape[0], stored.shape[1], stored.shape[3]) != want:
            raise ValueError(
                f"cache holds key heads of shape {tuple(stored.shape)}, but this layer "
                f"needs (B, Hkv, S, Dh) with (B, Hkv, Dh) = {want} (query "
                f"{tuple(query.shape)})"
            )

    def _check_fits_scores(
        self, name: str, t: Tensor, query: Tensor, key: Tensor, cached: int
    ) -> None:
        """One shape rule for the mask and the score bias: see :func:`_fits_scores`."""
        B, T, S = query.shape[0], query.shape[1], key.shape[1] + cached
        target = (B, self.num_heads, T, S)
        if not _fits_scores(t, target):
            raise ValueError(
                f"{name} of shape {tuple(t.shape)} does not broadcast to (B, H, T, S) = "
                f"{target} (query {tuple(query.shape)}, key {tuple(key.shape)})"
            )

    def _check_score_bias_and_rope(
        self,
        query: Tensor,
        key: Tensor,
        cached: int,
        reuse: bool,
        score_bias: Tensor | None,
        rope_positions: Tensor | None,
    ) -> Tensor | None:
        """Validate the position inputs before anything is computed or cached; return
        the bias in the weights' dtype (a float64 bias would otherwise turn float32
        scores into float64)."""
        if rope_positions is not None and (reuse or key.shape[1] != query.shape[1]):
            raise ValueError(
                "rope_positions are the positions of the queries and of the new keys, so "
                f"they need self-attention: got query {tuple(query.shape)}, key "
                f"{tuple(key.shape)}{' and a filled fixed cache' if reuse else ''}"
            )
        if rope_positions is not None and self.head_dim % 2 != 0:
            raise ValueError(
                f"rope_positions need an even head_dim (RoPE rotates pairs of dimensions), "
                f"got head_dim={self.head_dim} (d_model={self.d_model}, "
                f"num_heads={self.num_heads})"
            )
        if score_bias is None:
            return None
        if not isinstance(score_bias, Tensor) or not score_bias.dtype.is_floating_point:
            kind = score_bias.dtype if isinstance(score_bias, Tensor) else type(score_bias).__name__
            raise ValueError(
                f"score_bias must be a float tensor (added to the scaled scores), got "
                f"{kind}; a bool mask goes in mask="
            )
        self._check_fits_scores("score_bias", score_bias, query, key, cached)
        if not bool(torch.isfinite(score_bias).all()):
            raise ValueError(
                f"score_bias (shape {tuple(score_bias.shape)}) must be finite: block keys "
                "with the bool mask, not with -inf"
            )
        return score_bias.to(self.W_q.weight.dtype)

    # ------------------------------------------------------------------- forward

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        *,
        need_weights: bool = True,
        cache: KVCache | None = None,
        score_bias: Tensor | None = None,
        rope_positions: Tensor | None = None,
        rope_scaling: tuple[Tensor, float] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from ``query`` to ``key``/``value``.

        Everything after ``mask`` is passed by keyword.

        Parameters
        ----------
        query : Tensor
            ``(B, T, D)``, in the module's dtype (that of its weights).
        key, value : Tensor
            ``(B, S, D)`` (``key is value is query`` for self-attention), the same dtype.
        mask : Tensor, optional
            bool, True = may attend, broadcastable to ``(B, H, T, S)`` — e.g. ``(T, S)``
            causal, ``(B, 1, 1, S)`` key padding, ``(B, 1, T, S)`` both. A 2-D mask is
            always read as ``(T, S)``, one row per query: a ``(B, S)`` padding mask with
            ``B == T`` passes the shape check and is silently misread. Padding is
            ``(B, 1, 1, S)``, as :func:`mha.padding_mask` and its torch twin
            :func:`mha.masks_torch.source_mask` return it.
        need_weights : bool
            Default True, as in ``torch.nn.MultiheadAttention``, which this module
            mirrors (the layers and the Transformer default to False: see there).
            True: the explicit path, which computes and returns the weights. False:
            the fast path, ``F.scaled_dot_product_attention``, which never builds the
            ``(B, H, T, S)`` weights and returns None for them. Projected queries or
            keys holding NaN or inf take the explicit path, so that NaN propagates on
            both paths alike.
        cache : mha.kv_cache_torch.KVCache, optional
            Not the specification's ``mha.KVCache``; the heads it holds, if any, are
            this module's (its dtype, ``B``, ``Hkv``, ``Dh``). Keys and values of
            earlier positions: those of ``key``/``value`` are appended (or, for a
            ``fixed`` cache already filled, not projected at all) and the queries
            attend to everything cached. ``S`` in the mask counts the cached
            positions; ``mha.causal_mask(T, num_keys=S)`` is the causal mask of the last
            ``T`` of ``S`` positions. With a rolling cache (``window``), ``S`` counts
            only the kept ones, ``cache.kept_length + key.shape[1]``, and the mask is
            ``mha.sliding_window_mask(T, window, num_keys=S)``.
        score_bias : Tensor, optional
            float, finite, broadcastable to ``(B, H, T, S)`` like ``mask``: added to the
            scaled scores before the softmax (ALiBi's
            :func:`mha.positional_torch.alibi_bias`, ``(H, T, S)``). Beside the mask, not
            instead of it: a blocked key stays blocked, and a row with nothing to attend
            to keeps zero weights.
        rope_positions : Tensor, optional
            RoPE (:func:`mha.positional_torch.apply_rope`): the integer positions ``(T,)``
            (or broadcastable to ``(B, H, T)``) of the queries, which are also those of
            the new keys, so self-attention only. The query heads and the new key heads
            are rotated after the projection, and the keys *before* they are cached: a
            cache holds rotated keys, and each new query is rotated at its own absolute
            position.
        rope_scaling : (Tensor, float), optional
            With ``rope_positions``: ``(inv_freq, attention_factor)``, e.g. a
            :class:`mha.rope_scaling_torch.ScaledRope`: queries and keys rotated with
            these ``(Dh/2,)`` frequencies, and the scores multiplied by the factor
            squared (YaRN's factor on queries and keys, put on the queries alone).

        Returns
        -------
        output : Tensor
            ``(B, T, D)``.
        weights : Tensor or None
            ``(B, H, T, S)`` attention weights (before dropout; rows sum to 1, or are all
            zero for a query row with nothing to attend to).
        """
        self._check_cache_type(cache)
        reuse = cache is not None and cache.fixed and cache.k_heads is not None
        # The cached keys the queries see: a reused memory is `key` itself (S in all);
        # otherwise those the append keeps (all, or the last window - 1).
        cached = (
            0 if cache is None else (cache.length - key.shape[1] if reuse else cache.kept_length)
        )
        self._check_inputs(query, key, value, mask, cached)
        if cache is not None:
            self._check_cache_heads(cache, query)
            cache.check_block(query.shape[1], cached + key.shape[1], has_mask=mask is not None)
        score_bias = self._check_score_bias_and_rope(
            query, key, cached, reuse, score_bias, rope_positions
        )
        inv_freq, factor = check_rope_pair(rope_scaling, rope_positions is not None)
        # 1. Project, all heads at once (one matmul each), 2. split the heads.
        q = self._split_heads(self.W_q(query), self.num_heads)  # (B, T, D) -> (B, H, T, Dh)
        if rope_positions is not None:  # the angle of each query's own position
            q = apply_rope(q, rope_positions, inv_freq=inv_freq)  # (B, H, T, Dh)
            if factor != 1.0:  # f on q and f on k is f^2 on q: the cached keys stay as trained
                q = q * factor**2
        if reuse:  # cross-attention: the encoder memory was projected at the first step
            k, v = cache.k_heads, cache.v_heads  # (B, Hkv, S, Dh)
        else:
            k = self._split_heads(self.W_k(key), self.num_kv_heads)  # -> (B, Hkv, S, Dh)
            v = self._split_heads(self.W_v(value), self.num_kv_heads)  # -> (B, Hkv, S, Dh)
            if rope_positions is not None:  # rotated once, before caching
                k = apply_rope(k, rope_positions, inv_freq=inv_freq)  # (B, Hkv, S, Dh)
            if cache is not None:
                k, v = cache.append(k, v)  # the earlier positions first: (B, Hkv, S_all, Dh)

        # A query that may attend to nothing gets zero weights and a zero context (the
        # softmax of an all -inf row is 0/0 = NaN): these rows, whichever path runs.
        empty = None if mask is None else _rows_with_nothing_to_attend(mask)

        # 3-5. Scale, mask, softmax, weigh the values: explicitly, or in one fused call.
        if need_weights or not _all_finite(q, k):
            context, weights = self._attend_explicit(q, k, v, mask, empty, score_bias)
            weights = weights if need_weights else None
        else:
            context, weights = self._attend_fused(q, k, v, mask, empty, score_bias), None

        # 6. Merge the heads back side by side, then mix them with W_o.
        output = self.W_o(self._merge_heads(context))  # (B, H, T, Dh) -> (B, T, D)
        return output, weights

    def _split_heads(self, x: Tensor, num_heads: int) -> Tensor:
        """Head h gets features h*Dh:(h+1)*Dh of every position (a view, no copy)."""
        B, L, _ = x.shape
        return x.view(B, L, num_heads, self.head_dim).transpose(1, 2)  # -> (B, H, L, Dh)

    def _merge_heads(self, x: Tensor) -> Tensor:
        """The heads' outputs side by side again: the inverse of :meth:`_split_heads`."""
        B, _, L, _ = x.shape
        return x.transpose(1, 2).reshape(B, L, self.d_model)  # (B, H, L, Dh) -> (B, L, D)

    def _attend_explicit(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        empty: Tensor | None,
        score_bias: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        """``softmax(q k^T / sqrt(Dh)) v`` step by step; returns (context, weights)."""
        # Grouped-query attention: each query head reads its shared key/value head.
        if self.num_kv_heads != self.num_heads:
            index = kv_head_index(self.num_heads, self.num_kv_heads).to(k.device)
            k = k.index_select(1, index)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
            v = v.index_select(1, index)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
        # 3. Scores, scaled by 1/sqrt(Dh): scaling q (T*Dh numbers) instead of the
        #    scores (T*S numbers) is the same product and a cheaper pass.
        scores = (q * self.head_dim**-0.5) @ k.transpose(-2, -1)  # (B,H,T,Dh) @ (B,H,Dh,S)
        if score_bias is not None:  # ALiBi: shift the scaled scores, before the mask
            scores.add_(score_bias)  # (B, H, T, S) + (..., T, S)
        # 4. Blocked positions get -inf, so the softmax gives them exactly 0. In place:
        #    `scores` is a fresh tensor, and the matmul's backward does not need it.
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))  # (B, H, T, S)
        # 5. Softmax over the keys (zeros for the empty rows, before they meet v, so
        #    that no NaN reaches the context or the gradients), then dropout.
        if torch.is_grad_enabled():
            weights = torch.softmax(scores, dim=-1)  # (B, H, T, S)
        else:  # inference: reuse the scores' memory (autograd does not allow out=)
            weights = torch.softmax(scores, dim=-1, out=scores)  # (B, H, T, S)
        if empty is not None:
            weights = weights.masked_fill(empty, 0.0)
        train = self.training and self.dropout > 0
        dropped = F.dropout(weights, p=self.dropout) if train else weights
        context = dropped @ v  # (B, H, T, S) @ (B, H, S, Dh) -> (B, H, T, Dh)
        return context, weights

    def _attend_fused(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None,
        empty: Tensor | None,
        score_bias: Tensor | None = None,
    ) -> Tensor:
        """Steps 3-5 in one call: PyTorch picks a kernel that never builds (B, H, T, S)."""
        dropout_p = self.dropout if self.training else 0.0
        attn_mask = mask
        if score_bias is not None:  # SDPA takes one float attn_mask: -inf where blocked
            attn_mask = score_bias if mask is None else torch.where(
                mask, score_bias, float("-inf")
            )
        context = F.scaled_dot_product_attention(
            q, k, v, attn_mask=attn_mask, dropout_p=dropout_p,
            enable_gqa=self.num_kv_heads != self.num_heads,
        )  # (B, H, T, Dh)
        # Some SDPA kernels give NaN for an empty row: the rule above, applied here too.
        return context if empty is None else context.masked_fill(empty, 0.0)


def check_hidden(x: object, name: str, d_model: int, dtype: torch.dtype) -> None:
    """A layer's input of hidden states: a ``(B, L, d_model)`` tensor in the layer's
    ``dtype``. A float32 input to a float64 layer is refused here, by name, instead of
    by a matmul or a LayerNorm deep inside. (Shared by :mod:`mha.layers`.)"""
    if not isinstance(x, Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 3 or x.shape[-1] != d_model:
        raise ValueError(f"{name} must have shape (B, L, d_model={d_model}), got {tuple(x.shape)}")
    if x.dtype != dtype:
        raise ValueError(
            f"{name} has dtype {x.dtype}, but the layer's weights are {dtype}: convert "
            f"the input ({name}.to({dtype})) or the model (.to({x.dtype}))"
        )


def _fits_scores(t: Tensor, target: tuple[int, int, int, int]) -> bool:
    """Whether a mask or score bias fits the scores ``(B, H, T, S)``, as in the NumPy core: at
    least ``(T, S)`` (a 1-D mask could mean queries or keys), and every dim 1 or equal
    to the scores' dim (no silent enlarging)."""
    if not 2 <= t.ndim <= 4:
        return False
    try:
        return torch.broadcast_shapes(t.shape, target) == target
    except RuntimeError:
        return False


def _rows_with_nothing_to_attend(mask: Tensor) -> Tensor | None:
    """``(..., T, 1)``, True for each query whose mask row blocks every key; None when
    there is none (the usual case, which then costs nothing more)."""
    empty = ~mask.any(dim=-1, keepdim=True)  # (..., T, S) -> (..., T, 1)
    return empty if bool(empty.any()) else None


def _all_finite(*tensors: Tensor) -> bool:
    """Whether no tensor holds NaN or inf. The fused kernel is not trusted with them:
    for a query row holding NaN, torch 2.13's CPU kernel returns zeros, not NaN.

    One sum per tensor, in at least float32, instead of ``isfinite(t).all()``: NaN and
    inf reach the sum (``inf - inf`` is NaN), and the sum neither allocates a mask nor
    costs more than a read (``isfinite`` cost 4% of a forward on the bench's sizes). A
    sum that overflows says "not finite" for finite inputs: they then take the
    explicit path, which gives the same result.
    """
    total = sum(t.sum(dtype=torch.promote_types(t.dtype, torch.float32)) for t in tensors)
    return bool(torch.isfinite(total))
