"""Multi-head latent attention (MLA), as DeepSeek-V2 and DeepSeek-V3 define it.

A KV cache of multi-head attention keeps ``2 * H * Dh`` numbers per token and layer.
MLA keeps ``Rkv + Dr``: one small **latent** vector per token (``kv_lora_rank = Rkv``,
512 in both models) from which every head's key and value are rebuilt by two
up-projections, and one **shared RoPE key** (``qk_rope_head_dim = Dr``, 64) that all
heads read. RoPE needs that separate key because a rotation that depends on the
position cannot be moved through the up-projection (see :func:`absorb`); the other
``Dn`` features of each key (``qk_nope_head_dim``) carry no position.

Sources: DeepSeek-AI (2024), *DeepSeek-V2*, section 2.1 (equations 9-19), and
DeepSeek-AI (2024/2025), *DeepSeek-V3 Technical Report*, section 2.1.1.

Two ways to compute the same thing:

* :func:`mla_steps`, the plain form: rebuild per-head keys and values from the cached
  latents, then attend as multi-head attention does (training does this);
* :func:`mla_absorbed_steps`, the inference form: fold ``W_uk`` into the query and
  ``W_uv`` into the output projection (:func:`absorb`), so that the scores are taken
  against the cached latent directly and no per-head key or value is ever built.

Shapes, beyond :mod:`mha`'s legend: ``Rq`` the query latent (``q_lora_rank``), ``Rkv``
the KV latent (``kv_lora_rank``), ``Dn`` the per-head key part without position
(``qk_nope_head_dim``), ``Dr`` the RoPE part (``qk_rope_head_dim``), ``Dv`` the value
head (``v_head_dim``). Weights are ``(D_in, D_out)`` and a layer computes ``x @ W``, as
in :class:`mha.params.AttentionParams`; no biases (DeepSeek's attention has none).
Masks: boolean, True = may attend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    check_mask_shape,
    check_ndim,
    check_non_negative_int,
)
from mha.attention import softmax
from mha.masks import causal_mask
from mha.mla_params import MLAParams, mla_rope, rms_norm

__all__ = [
    "AbsorbedWeights",
    "MLAAbsorbedSteps",
    "MLACache",
    "MLASteps",
    "absorb",
    "mla_absorbed_steps",
    "mla_steps",
    "multi_head_latent_attention",
]

# -------------------------------------------------------------------- the cache


@dataclass(eq=False)
class MLACache:
    """What MLA keeps of earlier tokens: per token one normalised KV latent and one
    rotated RoPE key, shared by every head. No per-head key or value is stored.

    Attributes
    ----------
    latent : np.ndarray, shape (B, S, Rkv), or None while empty
        ``rms_norm(x @ W_dkv)``, the compressed keys and values.
    k_rope : np.ndarray, shape (B, S, Dr), or None while empty
        ``RoPE(x @ W_kr)``, already turned to its position.
    """

    latent: np.ndarray | None = None
    k_rope: np.ndarray | None = None

    @property
    def length(self) -> int:
        """``S``, the number of tokens cached."""
        return 0 if self.latent is None else self.latent.shape[1]

    @property
    def values_per_token(self) -> int:
        """``Rkv + Dr`` numbers per token (0 while empty)."""
        return 0 if self.latent is None else self.latent.shape[2] + self.k_rope.shape[2]

    def append(self, latent: np.ndarray, k_rope: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Store the new tokens' latents and RoPE keys after the cached ones; return all,
        ``(B, S_all, Rkv)`` and ``(B, S_all, Dr)``."""
        if self.latent is not None:
            if (latent.shape[0], latent.shape[2], k_rope.shape[2]) != (
                self.latent.shape[0], self.latent.shape[2], self.k_rope.shape[2]
            ):
                raise ValueError(
                    f"new latent {latent.shape} and k_rope {k_rope.shape} do not fit the "
                    f"cached {self.latent.shape} and {self.k_rope.shape}: B, Rkv and Dr "
                    "must agree"
                )
            latent = np.concatenate([self.latent, latent], axis=1)  # along S
            k_rope = np.concatenate([self.k_rope, k_rope], axis=1)
        self.latent, self.k_rope = latent, k_rope
        return latent, k_rope


# --------------------------------------------------------- the plain forward pass


@dataclass(frozen=True, eq=False)
class MLASteps:
    """Every intermediate of :func:`mla_steps` (the plain form), in order.

    Attributes
    ----------
    q_latent : (B, T, Rq) or None   ``rms_norm(x @ W_dq)``, the query latent
    q_nope : (B, H, T, Dn)     ``q_latent @ W_uq``, split into heads
    q_rope : (B, H, T, Dr)     ``RoPE(q_latent @ W_qr)``, one per head
    latent : (B, S, Rkv)       ``rms_norm(x @ W_dkv)``: the cached latents, then the new
    k_rope : (B, S, Dr)        ``RoPE(x @ W_kr)``: one per token, shared by the heads
    k_nope : (B, H, S, Dn)     ``latent @ W_uk``, split into heads
    v_heads : (B, H, S, Dv)    ``latent @ W_uv``, split into heads
    queries : (B, H, T, Dn+Dr) ``[q_nope | q_rope]``
    keys : (B, H, S, Dn+Dr)    ``[k_nope | k_rope]``, k_rope the same in every head
    scores : (B, H, T, S)      ``queries @ keys^T``
    scaled : (B, H, T, S)      ``scores * softmax_scale``
    masked : (B, H, T, S)      ``-inf`` where the mask blocks
    weights : (B, H, T, S)     softmax over S (zero rows where nothing is allowed)
    context : (B, H, T, Dv)    ``weights @ v_heads``
    merged : (B, T, H*Dv)      heads side by side
    output : (B, T, D)         ``merged @ W_o``
    """

    q_latent: np.ndarray | None
    q_nope: np.ndarray
    q_rope: np.ndarray
    latent: np.ndarray
    k_rope: np.ndarray
    k_nope: np.ndarray
    v_heads: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    context: np.ndarray
    merged: np.ndarray
    output: np.ndarray


def _heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """``(B, L, H*W) -> (B, H, L, W)``."""
    batch, length, width = x.shape
    return x.reshape(batch, length, num_heads, width // num_heads).transpose(0, 2, 1, 3)


def _prepare(
    x: Any, params: MLAParams, positions: Any, mask: Any, causal: bool, cache: MLACache | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None, int]:
    """Check the arguments; return ``x``, positions ``(T,)`` or ``(B, T)``, the mask
    (or None) and ``S``."""
    if not isinstance(params, MLAParams):
        raise ValueError(f"params must be an MLAParams, got {type(params).__name__}")
    x = as_float_array(x, "x")
    check_ndim(x, 3, "x", "(B, T, D)")
    batch, length, d_model = x.shape
    if d_model != params.d_model:
        raise ValueError(f"x has {d_model} features (shape {x.shape}) but params.d_model "
                         f"is {params.d_model}")  # fmt: skip
    if cache is not None and not isinstance(cache, MLACache):
        raise ValueError(f"cache must be an mha.mla.MLACache, got {type(cache).__name__}")
    past = 0 if cache is None else cache.length
    if past and cache.latent.shape[0] != batch:
        raise ValueError(f"x has batch size {batch} but the cache holds "
                         f"{cache.latent.shape[0]} sequences")  # fmt: skip
    if positions is None:
        positions = np.arange(past, past + length)  # (T,): after the cached tokens
    positions = np.asarray(positions)
    if positions.dtype == np.bool_ or not np.issubdtype(positions.dtype, np.integer):
        raise ValueError(f"positions must be integers, got dtype {positions.dtype}")
    if positions.shape not in ((length,), (batch, length), (1, length)):
        raise ValueError(f"positions must have shape (T,) = ({length},) or (B, T) = "
                         f"({batch}, {length}), got {positions.shape}")  # fmt: skip
    check_non_negative_int(int(positions.min(initial=0)), "positions (smallest)")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    num_keys = past + length
    full = causal_mask(length, num_keys=num_keys) if causal and length else None  # (T, S)
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (batch, params.num_heads, length, num_keys))
        full = mask if full is None else full & mask
    return x, positions, full, num_keys


def _project(
    x: np.ndarray, params: MLAParams, positions: np.ndarray, cache: MLACache | None
) -> tuple[np.ndarray | None, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The steps both forms share: the query input, the RoPE query, and the latents and
    RoPE keys of every token (cached ones first)."""
    heads, p = params.num_heads, params
    # RoPE on (B, H, T, Dr) takes positions (T,) as they are and (B, T) as (B, 1, T).
    q_positions = positions if positions.ndim == 1 else positions[:, None, :]
    # 1. Queries: through a normalised latent (DeepSeek-V2/V3) or straight from x.
    q_latent = None if p.W_dq is None else rms_norm(x @ p.W_dq, p.q_norm, p.eps)  # (B, T, Rq)
    q_in = x if q_latent is None else q_latent  # (B, T, Rq or D)
    q_rope = _heads(q_in @ p.W_qr, heads)  # (B, T, H*Dr) -> (B, H, T, Dr)
    q_rope = mla_rope(q_rope, q_positions, p.rope_base, p.rope_layout)
    # 2. What is cached: one latent and one RoPE key per token, for all heads.
    latent = rms_norm(x @ p.W_dkv, p.kv_norm, p.eps)  # (B, T, D) @ (D, Rkv) -> (B, T, Rkv)
    k_rope = mla_rope(x @ p.W_kr, positions, p.rope_base, p.rope_layout)  # (B, T, Dr)
    if cache is not None:
        latent, k_rope = cache.append(latent, k_rope)  # (B, S, Rkv), (B, S, Dr)
    return q_latent, q_in, q_rope, latent, k_rope


def _attend(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    scale: float,
    mask: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Scaled, masked softmax attention; ``keys`` and ``values`` may have one head
    that broadcasts to all. Returns ``(scores, scaled, masked, weights, context)``."""
    scores = queries @ np.swapaxes(keys, -1, -2)  # (B, H, T, Dk) @ (B, H|1, Dk, S) -> (B, H, T, S)
    scaled = scores * scale
    masked = scaled if mask is None else np.where(mask, scaled, -np.inf)
    weights = softmax(masked, axis=-1)  # an all-blocked row: zeros, not NaN
    context = weights @ values  # (B, H, T, S) @ (B, H|1, S, Dv) -> (B, H, T, Dv)
    return scores, scaled, masked, weights, context


def mla_steps(
    x: Any,
    params: MLAParams,
    *,
    positions: Any | None = None,
    mask: Any | None = None,
    causal: bool = True,
    cache: MLACache | None = None,
) -> MLASteps:
    """Multi-head latent attention, the plain form, returning every intermediate.

    Each head's key is ``[latent @ W_uk_h | k_rope]`` and its value ``latent @ W_uv_h``:
    the per-head keys and values are rebuilt from the latents at every call, and the
    shared RoPE key is broadcast to all heads. Self-attention only (MLA is a decoder's).

    Parameters
    ----------
    x : array_like, shape (B, T, D)
        The new tokens.
    params : MLAParams
    positions : int array_like, shape (T,) or (B, T), optional
        The positions RoPE turns to. Default ``cache.length + arange(T)`` (0, 1, ...
        without a cache): the tokens follow the cached ones.
    mask : bool array_like, optional
        True = may attend, broadcastable to ``(B, H, T, S)`` (``S`` = cached + new
        tokens), e.g. padding ``(B, 1, 1, S)``; combined with the causal mask.
    causal : bool
        Default True: the ``T`` new tokens are the last of ``S`` and each sees those up
        to itself (``mha.causal_mask(T, num_keys=S)``).
    cache : MLACache, optional
        The earlier tokens' latents and RoPE keys; the new ones are appended.

    Returns
    -------
    MLASteps
    """
    x, positions, full_mask, _ = _prepare(x, params, positions, mask, causal, cache)
    p, heads = params, params.num_heads
    q_latent, q_in, q_rope, latent, k_rope = _project(x, p, positions, cache)
    q_nope = _heads(q_in @ p.W_uq, heads)  # (B, T, H*Dn) -> (B, H, T, Dn)
    # 3. Rebuild every head's key and value from the latents.
    k_nope = _heads(latent @ p.W_uk, heads)  # (B, S, Rkv) @ (Rkv, H*Dn) -> (B, H, S, Dn)
    v_heads = _heads(latent @ p.W_uv, heads)  # (B, S, Rkv) @ (Rkv, H*Dv) -> (B, H, S, Dv)
    k_rope_heads = np.broadcast_to(k_rope[:, None], k_nope.shape[:3] + (k_rope.shape[-1],))
    keys = np.concatenate([k_nope, k_rope_heads], axis=-1)  # (B, H, S, Dn + Dr)
    queries = np.concatenate([q_nope, q_rope], axis=-1)  # (B, H, T, Dn + Dr)
    # 4. Attention in every head, as in multi-head attention.
    scores, scaled, masked, weights, context = _attend(
        queries, keys, v_heads, p.softmax_scale, full_mask
    )
    batch, _, length, _ = context.shape
    merged = context.transpose(0, 2, 1, 3).reshape(batch, length, -1)  # (B, T, H*Dv)
    output = merged @ p.W_o  # (B, T, H*Dv) @ (H*Dv, D) -> (B, T, D)
    return MLASteps(
        q_latent=q_latent, q_nope=q_nope, q_rope=q_rope, latent=latent, k_rope=k_rope,
        k_nope=k_nope, v_heads=v_heads, queries=queries, keys=keys, scores=scores,
        scaled=scaled, masked=masked, weights=weights, context=context, merged=merged,
        output=output,
    )  # fmt: skip


# ------------------------------------------------------ the absorbed (inference) form


@dataclass(frozen=True, eq=False)
class AbsorbedWeights:
    """The up-projections of MLA folded into their neighbours, one matrix per head.

    Attributes
    ----------
    W_uq_uk : (H, Rq, Rkv)   ``W_uq_h @ W_uk_h^T``: a query latent straight to a query
                             in the KV latent's space (``(H, D, Rkv)`` without a query
                             latent)
    W_uv_o : (H, Rkv, D)     ``W_uv_h @ W_o_h``: a head's context in latent space
                             straight to its share of the output
    """

    W_uq_uk: np.ndarray
    W_uv_o: np.ndarray


def absorb(params: MLAParams) -> AbsorbedWeights:
    """Fold ``W_uk`` into the query projection and ``W_uv`` into the output projection.

    In head ``h`` the position-free part of a score is
    ``q_nope . k_nope = (c_q W_uq_h) (c_kv W_uk_h)^T = (c_q W_uq_h W_uk_h^T) c_kv^T``:
    the query can be moved into the latent's space once, and the score taken against the
    cached latent ``c_kv`` itself. Likewise the output
    ``sum_h (weights_h c_kv W_uv_h) W_o_h = sum_h (weights_h c_kv) (W_uv_h W_o_h)``.
    The RoPE part cannot be folded this way: ``RoPE`` turns the key by an angle that
    depends on its position, a different matrix for every pair of positions, which is
    why the keys have a separate, shared RoPE part.

    Multiplying the matrices out, as here, is the paper's statement; a serving system
    may instead apply ``W_uq_h`` and ``W_uk_h^T`` one after the other (fewer
    multiply-adds when ``Rq`` and ``Rkv`` are much larger than ``Dn``): the same numbers.

    Returns
    -------
    AbsorbedWeights
    """
    if not isinstance(params, MLAParams):
        raise ValueError(f"params must be an MLAParams, got {type(params).__name__}")
    heads, dn, dv = params.num_heads, params.qk_nope_head_dim, params.v_head_dim
    q_in, rkv, d_model = params.W_uq.shape[0], params.kv_lora_rank, params.d_model
    w_uq = params.W_uq.reshape(q_in, heads, dn).transpose(1, 0, 2)  # (H, Rq, Dn)
    w_uk = params.W_uk.reshape(rkv, heads, dn).transpose(1, 0, 2)  # (H, Rkv, Dn)
    w_uv = params.W_uv.reshape(rkv, heads, dv).transpose(1, 0, 2)  # (H, Rkv, Dv)
    w_o = params.W_o.reshape(heads, dv, d_model)  # (H*Dv, D) -> (H, Dv, D)
    w_uq_uk = w_uq @ np.swapaxes(w_uk, 1, 2)  # (H, Rq, Dn) @ (H, Dn, Rkv) -> (H, Rq, Rkv)
    w_uv_o = w_uv @ w_o  # (H, Rkv, Dv) @ (H, Dv, D) -> (H, Rkv, D)
    return AbsorbedWeights(W_uq_uk=w_uq_uk, W_uv_o=w_uv_o)


@dataclass(frozen=True, eq=False)
class MLAAbsorbedSteps:
    """Every intermediate of :func:`mla_absorbed_steps` (the inference form), in order.

    Attributes
    ----------
    q_latent : (B, T, Rq) or None   as in :class:`MLASteps`
    q_absorbed : (B, H, T, Rkv)     ``q_latent @ W_uq_uk_h``: the query in latent space
    q_rope : (B, H, T, Dr)
    latent : (B, S, Rkv)            the cache, as in :class:`MLASteps`
    k_rope : (B, S, Dr)
    queries : (B, H, T, Rkv+Dr)     ``[q_absorbed | q_rope]``
    keys : (B, 1, S, Rkv+Dr)        ``[latent | k_rope]``: one key per token, read by
                                    every head (multi-query attention of width Rkv+Dr)
    scores, scaled, masked, weights : (B, H, T, S)   equal to the plain form's
    context_latent : (B, H, T, Rkv) ``weights @ latent``: the latents are the values
    output : (B, T, D)              ``sum_h context_latent_h @ W_uv_o_h``
    """

    q_latent: np.ndarray | None
    q_absorbed: np.ndarray
    q_rope: np.ndarray
    latent: np.ndarray
    k_rope: np.ndarray
    queries: np.ndarray
    keys: np.ndarray
    scores: np.ndarray
    scaled: np.ndarray
    masked: np.ndarray
    weights: np.ndarray
    context_latent: np.ndarray
    output: np.ndarray


def mla_absorbed_steps(
    x: Any,
    params: MLAParams,
    *,
    positions: Any | None = None,
    mask: Any | None = None,
    causal: bool = True,
    cache: MLACache | None = None,
    absorbed: AbsorbedWeights | None = None,
) -> MLAAbsorbedSteps:
    """Multi-head latent attention in the inference form: scores against the latents.

    The same result as :func:`mla_steps` (same arguments), computed without building
    any per-head key or value: the queries move into the latent's space
    (``W_uk`` folded in, :func:`absorb`), every head attends to the same keys
    ``[latent | k_rope]`` (the cache as it is) and averages the latents themselves,
    and ``W_uv`` is folded into the output projection.

    Parameters
    ----------
    absorbed : AbsorbedWeights, optional
        ``absorb(params)``, computed once and passed at every decoding step; default:
        computed here.

    Returns
    -------
    MLAAbsorbedSteps
    """
    x, positions, full_mask, _ = _prepare(x, params, positions, mask, causal, cache)
    if absorbed is None:
        absorbed = absorb(params)
    elif not isinstance(absorbed, AbsorbedWeights):
        raise ValueError(f"absorbed must be an AbsorbedWeights, got {type(absorbed).__name__}")
    p = params
    q_latent, q_in, q_rope, latent, k_rope = _project(x, p, positions, cache)
    # 3. The position-free query, moved into the latent's space: (B, 1, T, Rq) @ (H, Rq, Rkv)
    q_absorbed = q_in[:, None] @ absorbed.W_uq_uk  # -> (B, H, T, Rkv)
    queries = np.concatenate([q_absorbed, q_rope], axis=-1)  # (B, H, T, Rkv + Dr)
    keys = np.concatenate([latent, k_rope], axis=-1)[:, None]  # (B, 1, S, Rkv + Dr)
    # 4. Every head attends to the same keys and averages the latents.
    scores, scaled, masked, weights, context_latent = _attend(
        queries, keys, latent[:, None], p.softmax_scale, full_mask
    )  # context_latent: (B, H, T, S) @ (B, 1, S, Rkv) -> (B, H, T, Rkv)
    # 5. Each head's latent context straight to the output, summed over heads.
    output = (context_latent @ absorbed.W_uv_o).sum(axis=1)  # (B, H, T, D) -> (B, T, D)
    return MLAAbsorbedSteps(
        q_latent=q_latent, q_absorbed=q_absorbed, q_rope=q_rope, latent=latent,
        k_rope=k_rope, queries=queries, keys=keys, scores=scores, scaled=scaled,
        masked=masked, weights=weights, context_latent=context_latent, output=output,
    )  # fmt: skip


def multi_head_latent_attention(
    x: Any,
    params: MLAParams,
    *,
    positions: Any | None = None,
    mask: Any | None = None,
    causal: bool = True,
    cache: MLACache | None = None,
    absorbed: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head latent attention (DeepSeek-V2, section 2.1).

    Arguments as in :func:`mla_steps`; ``absorbed=True`` computes the inference form
    (:func:`mla_absorbed_steps`), which gives the same numbers.

    Returns
    -------
    output : np.ndarray, shape (B, T, D)
    weights : np.ndarray, shape (B, H, T, S)
    """
    if not isinstance(absorbed, bool):
        raise ValueError(f"absorbed must be True or False, got {absorbed!r}")
    run = mla_absorbed_steps if absorbed else mla_steps
    steps = run(x, params, positions=positions, mask=mask, causal=causal, cache=cache)
    return steps.output, steps.weights
