"""Chapter 10's exercises (10_compressed_cache): absorbed_query and quantize_per_channel.

absorbed_query is a step mha does inside mha.mla.absorb and mla_absorbed_steps;
quantize_per_channel is mha.quant_cache.quantize then dequantize with one choice of
arguments. Their references are written here from those pieces.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import mha

from ._core import _Case, _label, _Mistake

# --------------------------------------------------------------------------- absorbed_query


def _per_head(w: np.ndarray, num_heads: int, *, tiled: bool = False) -> np.ndarray:
    """``(R, H*W) -> (H, R, W)``: head h's columns ``h*W .. (h+1)*W`` (or, ``tiled``,
    the wrong split ``h, h + H, ...``)."""
    rows, cols = w.shape
    if tiled:
        return w.reshape(rows, cols // num_heads, num_heads).transpose(2, 0, 1)
    return w.reshape(rows, num_heads, cols // num_heads).transpose(1, 0, 2)


def _absorbed_query(q_in: Any, W_uq: Any, W_uk: Any, num_heads: int) -> np.ndarray:
    """(B, T, Rq) -> (B, H, T, Rkv): ``q_in @ W_uq_h @ W_uk_h^T`` for every head."""
    q_in, W_uq, W_uk = (np.asarray(a) for a in (q_in, W_uq, W_uk))
    folded = _per_head(W_uq, num_heads) @ np.swapaxes(
        _per_head(W_uk, num_heads), 1, 2)  # (H, Rq, Dn) @ (H, Dn, Rkv) -> (H, Rq, Rkv)
    return q_in[:, None] @ folded  # (B, 1, T, Rq) @ (H, Rq, Rkv) -> (B, H, T, Rkv)


def _absorbed_tiled(q_in: Any, W_uq: Any, W_uk: Any, num_heads: int) -> np.ndarray:
    folded = _per_head(np.asarray(W_uq), num_heads, tiled=True) @ np.swapaxes(
        _per_head(np.asarray(W_uk), num_heads, tiled=True), 1, 2)
    return np.asarray(q_in)[:, None] @ folded


def _absorbed_summed(q_in: Any, W_uq: Any, W_uk: Any, num_heads: int) -> np.ndarray:
    one = np.asarray(q_in) @ np.asarray(W_uq) @ np.asarray(W_uk).T  # (B, T, Rkv)
    return np.repeat(one[:, None], num_heads, axis=1)


def _absorbed_not_folded(q_in: Any, W_uq: Any, W_uk: Any, num_heads: int) -> np.ndarray:
    q = np.asarray(q_in)[:, None] @ _per_head(np.asarray(W_uq), num_heads)
    return q  # (B, H, T, Dn): the position-free query, W_uk left out


def _absorbed_query_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _absorbed_tiled,
            "The heads are split as a tile: head h got columns h, h + H, h + 2H, ... of "
            "W_uq and W_uk instead of its own block of Dn columns.",
            "Head h's columns are h*Dn .. (h+1)*Dn: reshape (R, H*Dn) as (R, H, Dn).",
        ),
        _Mistake(
            _absorbed_summed,
            "Every head got the same query: W_uq @ W_uk.T over all heads at once sums "
            "the heads' products instead of keeping one per head.",
            "A score is taken in each head: fold W_uq_h and W_uk_h of the same head h.",
        ),
        _Mistake(
            _absorbed_not_folded,
            "The result is the position-free query (B, H, T, Dn): W_uk was not folded "
            "in, so it cannot be scored against the latent.",
            "q_nope . k_nope = (q W_uq_h)(c W_uk_h)^T: move W_uk_h^T onto the query side.",
        ),
    )


def _absorbed_query_cases(rng: np.random.Generator) -> list[_Case]:
    cases = []
    for batch, length, rq, heads, dn, rkv, f32 in (
        (1, 1, 6, 2, 3, 4, False),  # one decoding step
        (2, 5, 8, 4, 2, 6, False),
        (1, 3, 5, 1, 4, 3, False),  # one head
        (3, 2, 7, 3, 5, 2, True),  # float32, Rkv < Dn
    ):
        dtype = np.float32 if f32 else np.float64
        q_in = rng.normal(size=(batch, length, rq)).astype(dtype)
        w_uq = rng.normal(size=(rq, heads * dn)).astype(dtype)
        w_uk = rng.normal(size=(rkv, heads * dn)).astype(dtype)
        cases.append(_Case(
            _label(f"H={heads}, Dn={dn}", q_in=q_in, W_uq=w_uq, W_uk=w_uk),
            (q_in, w_uq, w_uk, heads), loose=f32))
    return cases


def _absorbed_query_matches_mha() -> bool:
    """The reference agrees with mha.mla.absorb (used by the tests)."""
    p = mha.MLAParams.init(6, 2, kv_lora_rank=4, qk_nope_head_dim=3, qk_rope_head_dim=2,
                       v_head_dim=3, q_lora_rank=5)
    q_in = np.random.default_rng(0).normal(size=(1, 3, 5))
    return bool(np.allclose(_absorbed_query(q_in, p.W_uq, p.W_uk, 2),
                            q_in[:, None] @ mha.absorb(p).W_uq_uk))


# --------------------------------------------------------------------------- quantize_per_channel


def _quantize_per_channel(k: Any, bits: int) -> np.ndarray:
    """Symmetric quantisation with one scale per channel over all S tokens, dequantised:
    (..., S, Dh) -> (..., S, Dh)."""
    return mha.dequantize(mha.quantize(k, bits, axis=-2, symmetric=True))


def _model(*, axis: int = -2, top: str = "symmetric", rounding: Any = np.round,
           guard: bool = True) -> Any:
    def model(k: Any, bits: int) -> np.ndarray:
        k = np.asarray(k)
        levels = {"symmetric": 2 ** (bits - 1) - 1, "one_more": 2 ** (bits - 1),
                  "unsigned": 2**bits - 1}[top]
        spread = np.max(np.abs(k), axis=axis, keepdims=True)
        scale = spread / levels
        if guard:
            scale = np.where(spread > 0, scale, 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (rounding(k / scale) * scale).astype(k.dtype)

    return model


def _quantize_per_channel_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _model(axis=-1),
            "Per token: each token got one scale over its channels, so an outlier "
            "channel sets the scale of every token.",
            "Per channel: the statistics run over the tokens, axis -2 of (..., S, Dh).",
        ),
        _Mistake(
            _model(axis=None),
            "One scale for the whole array (per tensor), not one per channel.",
            "Reduce over the token axis only, keeping one scale for each channel.",
        ),
        _Mistake(
            _model(top="one_more"),
            "The largest code is 2**(bits - 1): one more than a signed code of this "
            "many bits holds symmetrically (127 for 8 bits, 7 for 4, 1 for 2).",
            "Symmetric codes run from -(2**(bits-1) - 1) to 2**(bits-1) - 1.",
        ),
        _Mistake(
            _model(top="unsigned"),
            "The scale divides by 2**bits - 1, the unsigned range, though the codes are "
            "signed: half the codes a symmetric scheme has are used twice over.",
            "With a sign, bits - 1 bits are left for the magnitude.",
        ),
        _Mistake(
            _model(rounding=np.trunc),
            "Codes truncated toward zero instead of rounded to the nearest.",
            "The nearest code is np.round(k / scale): the error stays within scale / 2.",
        ),
        _Mistake(
            _model(guard=False),
            "A channel that is zero in every token gives NaN: its scale is 0 and 0 / 0 "
            "is not a number.",
            "A channel with no spread comes back as it is: give it any non-zero scale.",
        ),
    )


def _quantize_per_channel_cases(rng: np.random.Generator) -> list[_Case]:
    keys = rng.normal(size=(2, 2, 16, 8))  # (B, Hkv, S, Dh)
    keys[..., 3] *= 15  # an outlier channel, as KIVI found in keys
    zero = rng.normal(size=(1, 12, 4))
    zero[..., 1] = 0.0  # a channel that is zero in every token
    small = rng.normal(size=(5, 3)).astype(np.float32)
    return [
        _Case(_label("8 bits, an outlier channel", k=keys), (keys, 8)),
        _Case(_label("4 bits, an outlier channel", k=keys), (keys, 4)),
        _Case(_label("2 bits", k=keys[0, 0]), (keys[0, 0], 2)),
        _Case(_label("3 bits, a channel of zeros", k=zero), (zero, 3)),
        _Case(_label("4 bits, float32", k=small), (small, 4), loose=True),
    ]
