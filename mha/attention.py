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
    as_bias,
    as_bool_mask,
    as_float_array,
    check_divisible,
    check_mask_shape,
    check_ndim,
    check_positive_int,
)

__all__ = [
    "AttentionParams",
    "AttentionSteps",
    "KVCache",
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
    bias: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The five steps of scaled dot-product attention on validated arrays.

    Returns ``(scores, scaled, masked, weights, context)``; shared by
    :func:`scaled_dot_product_attention` and :func:`multi_head_attention_steps` so
    the formula exists exactly once. ``masked`` includes the ``bias``.
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
    biased = scaled if bias is None else scaled + bias.astype(scaled.dtype, copy=False)
    masked = biased if mask is None else np.where(mask, biased, -np.inf)
    # 4. Each query's weights over the keys sum to 1 (or are all 0 if nothing is allowed).
    weights = softmax(masked, axis=-1)
    # 5. Weighted average of the values.
    context = weights @ v  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)
    return scores, scaled, masked, weights, context


def _check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., length, dim), got {x.shape}")
    if not q.ndim == k.ndim == v.ndim:
        raise ValueError(
            f"q, k and v must have the same number of dims, got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must have the same leading (batch, head) dims, got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim Dh (queries are compared with keys by "
            f"dot product), got q {q.shape} and k {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length S (one value per key), got k {k.shape} "
            f"and v {v.shape}"
        )


def scaled_dot_product_attention(
    q: Any, k: Any, v: Any, mask: Any | None = None, bias: Any | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention, ``softmax(q k^T / sqrt(Dh) + bias) v``.

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
        :func:`mha.causal_mask` or ``(B, 1, 1, S)`` from :func:`mha.padding_mask`.
    bias : float array_like, optional
        Added to the scaled scores before the softmax, e.g. ALiBi's
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
        If the shapes of ``q``, ``k``, ``v`` disagree, ``mask`` is not boolean, ``bias``
        is not a finite float array, or either does not broadcast to ``(..., T, S)``.
    """
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    _check_qkv(q, k, v)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, q.shape[:-1] + (k.shape[-2],))
    if bias is not None:
        bias = as_bias(bias, q.shape[:-1] + (k.shape[-2],))
    _, _, _, weights, context = _attention_core(q, k, v, mask, bias)
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


_WEIGHT_NAMES = ("W_q", "W_k", "W_v", "W_o")
_BIAS_NAMES = ("b_q", "b_k", "b_v", "b_o")


@dataclass(eq=False)
class AttentionParams:
    """The weights of one multi-head attention layer.

    Convention: a weight has shape ``(D_in, D_out)`` and a layer computes
    ``y = x @ W + b`` (PyTorch stores ``(out, in)`` and computes ``x @ W.T``;
    :mod:`mha.convert` transposes). Head ``h`` owns columns
    ``h*Dh:(h+1)*Dh`` of ``W_q``, ``W_k``, ``W_v`` and rows ``h*Dh:(h+1)*Dh`` of
    ``W_o``: the heads share these four matrices, they do not add parameters.

    Attributes
    ----------
    W_q : np.ndarray, shape (D, D)
    b_q : np.ndarray, shape (D,), or None
    W_k : np.ndarray, shape (Dk, Dkv)   (``Dk = D`` unless keys have another width)
    b_k : np.ndarray, shape (Dkv,), or None
    W_v : np.ndarray, shape (Dv, Dkv)   (``Dv = D`` unless values have another width)
    b_v : np.ndarray, shape (Dkv,), or None
    W_o : np.ndarray, shape (D, D)
    b_o : np.ndarray, shape (D,), or None
        The biases are either all present or all ``None`` (``bias=False``).

    ``Dkv`` is ``D`` for multi-head attention. Grouped-query attention projects keys
    and values to fewer heads: ``Dkv = num_kv_heads * head_dim``, and each group of
    ``num_heads // num_kv_heads`` query heads shares one key/value head
    (``num_kv_heads = 1`` is multi-query attention).
    """

    W_q: np.ndarray
    b_q: np.ndarray | None
    W_k: np.ndarray
    b_k: np.ndarray | None
    W_v: np.ndarray
    b_v: np.ndarray | None
    W_o: np.ndarray
    b_o: np.ndarray | None

    def __post_init__(self) -> None:
        for name in _WEIGHT_NAMES:
            w = as_float_array(getattr(self, name), name)
            check_ndim(w, 2, name, "(D_in, D_out)")
            setattr(self, name, w)
        d_model, kv_dim = self.W_q.shape[1], self.W_k.shape[1]
        expected = {
            "W_q": (d_model, d_model),
            "W_k": (self.W_k.shape[0], kv_dim),
            "W_v": (self.W_v.shape[0], kv_dim),
            "W_o": (d_model, d_model),
        }
        for name, shape in expected.items():
            if getattr(self, name).shape != shape:
                raise ValueError(
                    f"{name} must have shape {shape} for d_model={d_model} (from W_q "
                    f"{self.W_q.shape}), got {getattr(self, name).shape}"
                )
        present = [getattr(self, name) is not None for name in _BIAS_NAMES]
        if any(present) and not all(present):
            given = zip(_BIAS_NAMES, present, strict=True)
            listing = ", ".join(f"{n}={'array' if p else 'None'}" for n, p in given)
            raise ValueError(f"biases must be all arrays or all None, got {listing}")
        if all(present):
            for name in _BIAS_NAMES:
                b = as_float_array(getattr(self, name), name)
                width = kv_dim if name in ("b_k", "b_v") else d_model
                if b.shape != (width,):
                    raise ValueError(
                        f"{name} must have shape ({width},) for d_model={d_model} and "
                        f"W_k {self.W_k.shape}, got {b.shape}"
                    )
                setattr(self, name, b)

    @property
    def d_model(self) -> int:
        """``D``, the model width."""
        return self.W_q.shape[1]

    @property
    def kv_dim(self) -> int:
        """``Dkv``, the width of the projected keys and values (``D`` unless grouped)."""
        return self.W_k.shape[1]

    @property
    def bias(self) -> bool:
        """Whether the projections have biases."""
        return self.b_q is not None

    def num_kv_heads(self, num_heads: int) -> int:
        """``Hkv``, the key/value heads these weights give ``num_heads`` query heads.

        Raises
        ------
        ValueError
            If ``kv_dim`` is not a multiple of ``head_dim = d_model / num_heads`` whose
            count divides ``num_heads``.
        """
        head_dim = check_divisible(self.d_model, num_heads)
        if self.kv_dim % head_dim != 0 or num_heads % (self.kv_dim // head_dim) != 0:
            raise ValueError(
                f"params.W_k {self.W_k.shape} projects to {self.kv_dim} features: with "
                f"num_heads={num_heads} (head_dim={head_dim}) that must be num_kv_heads * "
                f"{head_dim} with num_kv_heads dividing {num_heads}"
            )
        return self.kv_dim // head_dim

    @property
    def num_parameters(self) -> int:
        """Number of scalars: ``4 D^2 + 4 D`` for self-attention with biases, whatever ``H``."""
        arrays = [getattr(self, n) for n in _WEIGHT_NAMES + _BIAS_NAMES]
        return sum(a.size for a in arrays if a is not None)

    @classmethod
    def init(
        cls,
        d_model: int,
        seed: int = 0,
        dtype: Any = np.float64,
        bias: bool = True,
        kv_dim: int | None = None,
    ) -> AttentionParams:
        """Seeded Xavier-uniform initialisation (Glorot & Bengio, 2010).

        Each of ``W_q, W_k, W_v, W_o`` is drawn, in that order, from
        ``U(-a, a)`` with ``a = sqrt(6 / (D_in + D_out)) = sqrt(3 / D)``, which keeps
        the variance of activations roughly constant through the layer. Biases start
        at zero, as in ``nn.MultiheadAttention``.

        Parameters
        ----------
        d_model : int
            ``D``.
        seed : int
            Seed for ``np.random.default_rng``; same seed, same weights.
        dtype : NumPy floating dtype
        bias : bool
            If False, all biases are ``None``.
        kv_dim : int, optional
            ``Dkv``, the output width of ``W_k`` and ``W_v``: ``num_kv_heads * head_dim``
            for grouped-query attention. Default ``d_model``.
        """
        d_model = check_positive_int(d_model, "d_model")
        kv_dim = d_model if kv_dim is None else check_positive_int(kv_dim, "kv_dim")
        rng = np.random.default_rng(seed)
        widths = (d_model, kv_dim, kv_dim, d_model)  # outputs of W_q, W_k, W_v, W_o
        weights = []
        for width in widths:
            limit = math.sqrt(6.0 / (d_model + width))
            weights.append(rng.uniform(-limit, limit, size=(d_model, width)).astype(dtype))
        biases = [np.zeros(width, dtype=dtype) if bias else None for width in widths]
        w_q, w_k, w_v, w_o = weights
        b_q, b_k, b_v, b_o = biases
        return cls(W_q=w_q, b_q=b_q, W_k=w_k, b_k=b_k, W_v=w_v, b_v=b_v, W_o=w_o, b_o=b_o)


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
    masked : (B, H, T, S)   ``scaled`` plus the bias, with ``-inf`` where the mask
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


@dataclass(eq=False)
class KVCache:
    """The key and value heads one attention layer has computed so far.

    Decoding one token at a time, the keys and values of the earlier positions do not
    change: :func:`multi_head_attention_steps` with a cache projects only the new
    positions, appends their heads here, and lets the new queries attend to all of
    them. With grouped-query attention only the ``Hkv`` shared heads are stored.

    With a ``window`` the cache rolls, for sliding-window attention
    (:func:`mha.sliding_window_mask`): :meth:`append` first cuts the stored entries to
    the last ``window - 1`` (all that a new query may still need besides itself), then
    appends the new ones. Decoding one position at a time, it holds exactly ``window``
    entries once warm, however long the sequence; a block of ``T`` new positions makes
    it hold at most ``window - 1 + T``. The queries of a block must then be masked with
    ``mha.sliding_window_mask(T, window, num_keys=S)``, ``S`` being the number of keys
    after the append (for ``T = 1`` that mask is all True and may be left out).

    Attributes
    ----------
    k_heads, v_heads : np.ndarray, shape (B, Hkv, S, Dh), or None while empty
    window : int, optional
        Positions each query attends to, itself included. Default None: keep
        everything.
    """

    k_heads: np.ndarray | None = None
    v_heads: np.ndarray | None = None
    window: int | None = None

    def __post_init__(self) -> None:
        if self.window is not None:
            self.window = check_positive_int(self.window, "window")

    @property
    def length(self) -> int:
        """``S``, the number of positions cached."""
        return 0 if self.k_heads is None else self.k_heads.shape[2]

    @property
    def kept_length(self) -> int:
        """How many cached positions the next :meth:`append` keeps: all of them, or with
        a window the last ``window - 1``. The keys after the append number this plus
        the new ones."""
        return self.length if self.window is None else min(self.length, self.window - 1)

    def append(self, k_heads: np.ndarray, v_heads: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the heads of new positions after the (kept) cached ones; return all the
        heads now stored, ``(B, Hkv, kept_length + S_new, Dh)`` each."""
        if self.k_heads is not None:
            if k_heads.shape[:2] + k_heads.shape[3:] != self.k_heads.shape[:2] + (
                self.k_heads.shape[3],
            ):
                raise ValueError(
                    f"new key heads {k_heads.shape} do not fit the cached ones "
                    f"{self.k_heads.shape}: (B, Hkv, S, Dh) must agree except S"
                )
            # Start index, not [-kept:]: with kept = 0, [-0:] would keep everything.
            start = self.length - self.kept_length
            k_heads = np.concatenate([self.k_heads[:, :, start:], k_heads], axis=2)  # along S
            v_heads = np.concatenate([self.v_heads[:, :, start:], v_heads], axis=2)
        self.k_heads, self.v_heads = k_heads, v_heads
        return k_heads, v_heads


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w  # (B, L, D_in) @ (D_in, D_out) -> (B, L, D_out)
    return y if b is None else y + b


def multi_head_attention_steps(
    query: Any,
    key: Any,
    value: Any,
    params: AttentionParams,
    num_heads: int,
    mask: Any | None = None,
    cache: KVCache | None = None,
    bias: Any | None = None,
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
    cache : KVCache, optional
        The key and value heads of earlier positions. The heads of ``key`` and
        ``value`` are appended to it, and the queries attend to all of them (with a
        ``window``, to the last ``window - 1`` cached ones and the new ones).
    bias : float array_like, optional
        Added to the scaled scores of every head before the softmax, broadcastable to
        ``(B, H, T, S)`` like ``mask``: ALiBi's ``mha.alibi_bias(H, T, num_keys=S)``
        ``(H, T, S)``. See :func:`scaled_dot_product_attention`.

    Grouped-query attention comes from ``params``: when ``W_k`` and ``W_v`` project to
    ``Dkv = num_kv_heads * head_dim`` features, query head ``h`` uses key/value head
    ``h // (num_heads // num_kv_heads)``.

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
        raise ValueError(f"cache must be a KVCache, got {type(cache).__name__}")
    batch, target_len = query.shape[0], query.shape[1]
    # S: the new keys, after the cached ones that the append keeps (all, or window - 1).
    source_len = key.shape[1] + (0 if cache is None else cache.kept_length)
    if mask is None and target_len > 1 and cache is not None and cache.window is not None:
        raise ValueError(
            f"{target_len} new positions through a rolling cache (window={cache.window}) "
            "need a mask: without one the first would see the later ones; pass "
            f"mha.sliding_window_mask({target_len}, {cache.window}, num_keys={source_len})"
        )
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (batch, num_heads, target_len, source_len))
    if bias is not None:
        bias = as_bias(bias, (batch, num_heads, target_len, source_len))

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
    group = num_heads // num_kv_heads
    k_shared = np.repeat(k_heads, group, axis=1)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
    v_shared = np.repeat(v_heads, group, axis=1)  # (B, Hkv, S, Dh) -> (B, H, S, Dh)
    scores, scaled, masked, weights, context = _attention_core(
        q_heads, k_shared, v_shared, mask, bias
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
    cache: KVCache | None = None,
    bias: Any | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention (Vaswani et al., 2017, section 3.2.2).

    ``MultiHead(Q, K, V) = Concat(head_1, ..., head_H) W_o`` with
    ``head_h = Attention(Q W_q^h, K W_k^h, V W_v^h)``, computed for all heads at once.
    Arguments as in :func:`multi_head_attention_steps`.

    Returns
    -------
    output : np.ndarray, shape (B, T, D)
    weights : np.ndarray, shape (B, H, T, S)
        Per-head attention weights (not averaged over heads).
    """
    steps = multi_head_attention_steps(query, key, value, params, num_heads, mask, cache, bias)
    return steps.output, steps.weights
