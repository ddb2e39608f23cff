"""The weights of multi-head latent attention (:mod:`mha.mla`) and the pieces they feed.

:class:`MLAParams` holds one layer's weights and settings, named as in the DeepSeek-V2
paper; :func:`rms_norm` normalises the two latents; :func:`mla_rope` turns the
decoupled RoPE part in DeepSeek's or Llama's pairing; :func:`mla_softmax_scale` is the
factor the scores are multiplied by, YaRN's included.

Shapes as in :mod:`mha.mla`: ``Rq`` the query latent, ``Rkv`` the KV latent, ``Dn`` a
head's part without position, ``Dr`` the RoPE part, ``Dv`` a value head. Weights are
``(D_in, D_out)`` and a layer computes ``x @ W``, as in :class:`mha.params.AttentionParams`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import (
    as_float_array,
    check_ndim,
    check_positive_int,
    check_real,
)
from mha.positional import apply_rope, rope_permutation
from mha.rope_scaling import yarn_mscale

__all__ = ["ROPE_LAYOUTS", "MLAParams", "mla_rope", "mla_softmax_scale", "rms_norm"]

ROPE_LAYOUTS = ("interleaved", "rotate_half")


def mla_softmax_scale(
    qk_nope_head_dim: int,
    qk_rope_head_dim: int,
    *,
    yarn_factor: float = 1.0,
    mscale_all_dim: float = 0.0,
) -> float:
    """The factor DeepSeek multiplies ``q . k`` by before the softmax.

    ``1 / sqrt(Dn + Dr)``: a query and a key have ``Dn + Dr`` features (the part
    without position and the RoPE part), the ``Dh`` of :func:`mha.scaled_dot_product_attention`.
    DeepSeek-V3 extends its context with YaRN (Peng et al., 2023), which sharpens
    attention at long range by ``mscale = 0.1 * mscale_all_dim * ln(yarn_factor) + 1``
    on queries and keys alike; both are multiplied in, so the scale gains
    ``mscale**2`` (DeepSeek-V3's published configuration: factor 40,
    ``mscale_all_dim`` 1, so ``mscale = 1.3689`` and the scale grows by 1.874).
    A factor ``<= 1`` or ``mscale_all_dim = 0`` leaves the plain scale.

    Only the scale: YaRN's change of the rotary frequencies is not modelled here.

    Parameters
    ----------
    qk_nope_head_dim, qk_rope_head_dim : int
        ``Dn`` and ``Dr``.
    yarn_factor : float
        ``> 0``; YaRN's context-extension factor (``rope_scaling["factor"]``).
    mscale_all_dim : float
        ``>= 0``; ``rope_scaling["mscale_all_dim"]``.

    Returns
    -------
    float
    """
    head = check_positive_int(qk_nope_head_dim, "qk_nope_head_dim") + check_positive_int(
        qk_rope_head_dim, "qk_rope_head_dim"
    )
    factor = check_real(yarn_factor, "yarn_factor", 0.0)
    mscale_all_dim = check_real(mscale_all_dim, "mscale_all_dim", 0.0, strict=False)
    scale = 1.0 / math.sqrt(head)
    if factor > 1.0 and mscale_all_dim > 0.0:
        mscale = yarn_mscale(factor, mscale_all_dim)
        scale = scale * mscale * mscale
    return scale


def rms_norm(x: Any, weight: Any, eps: float = 1e-6) -> np.ndarray:
    """RMSNorm (Zhang & Sennrich, 2019): ``x / sqrt(mean(x**2) + eps) * weight``.

    Divides each vector by its root mean square (no mean is subtracted, unlike
    LayerNorm), then scales each feature by its learned weight. MLA applies one to
    each latent.

    Parameters
    ----------
    x : array_like, shape (..., R)
    weight : array_like, shape (R,)
    eps : float
        ``> 0``, keeps a zero vector from dividing by zero.

    Returns
    -------
    np.ndarray, shape (..., R)
    """
    x = as_float_array(x, "x")
    weight = as_float_array(weight, "weight")
    if weight.ndim != 1 or x.ndim < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(
            f"weight must have shape (R,) matching x's last dim, got x {x.shape} and "
            f"weight {weight.shape}"
        )
    eps = check_real(eps, "eps", 0.0)
    mean_square = np.mean(x * x, axis=-1, keepdims=True)  # (..., 1)
    return x / np.sqrt(mean_square + eps) * weight


def mla_rope(
    x: Any, positions: Any, base: float = 10000.0, layout: str = "interleaved"
) -> np.ndarray:
    """RoPE on the ``Dr`` features of MLA's RoPE part, in either pairing.

    ``"interleaved"`` turns adjacent features ``(2i, 2i + 1)`` (DeepSeek's own code, and
    :func:`mha.apply_rope`); ``"rotate_half"`` turns ``i`` with ``i + Dr/2`` (Llama's
    layout in Hugging Face). Both rotate pair ``i`` by ``m * base^(-2i / Dr)`` at
    position ``m``: the same computation on reordered features
    (:func:`mha.rope_permutation`), so scores agree once the weights are reordered.

    Parameters
    ----------
    x : array_like, shape (..., L, Dr)
    positions : int array_like, broadcastable to x's ``(..., L)``
    base : float
    layout : "interleaved" or "rotate_half"

    Returns
    -------
    np.ndarray, same shape as ``x``
    """
    if layout not in ROPE_LAYOUTS:
        raise ValueError(f"layout must be one of {ROPE_LAYOUTS}, got {layout!r}")
    if layout == "interleaved":
        return apply_rope(x, positions, base)
    x = as_float_array(x, "x")
    perm = rope_permutation(x.shape[-1])  # [0, Dr/2, 1, Dr/2 + 1, ...]
    # Gather i and i + Dr/2 side by side, turn adjacent pairs, put them back.
    return apply_rope(x[..., perm], positions, base)[..., np.argsort(perm)]


# ------------------------------------------------------------------ the weights


_MATRICES = ("W_dq", "W_uq", "W_qr", "W_dkv", "W_kr", "W_uk", "W_uv", "W_o")
_NORMS = ("q_norm", "kv_norm")
_WEIGHT_NAMES = ("W_dq", "q_norm", "W_uq", "W_qr", "W_dkv", "kv_norm", "W_kr", "W_uk",
                "W_uv", "W_o")  # fmt: skip


@dataclass(eq=False)
class MLAParams:
    """The weights and settings of one multi-head latent attention layer.

    The names are the DeepSeek-V2 paper's (``W^{DQ}``, ``W^{UQ}``, ...): D for a
    down-projection into a latent, U for an up-projection out of one, R for the RoPE
    part. Hugging Face fuses some of them (``kv_a_proj_with_mqa = [W_dkv | W_kr]``,
    ``kv_b_proj`` = ``W_uk`` and ``W_uv`` interleaved per head, ``q_b_proj`` =
    ``W_uq`` and ``W_qr`` interleaved per head); ``tests/test_hf_oracles.py`` splits them.

    Attributes
    ----------
    num_heads : int
        ``H``.
    qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
        ``Dn``, ``Dr`` (even) and ``Dv``.
    W_dq : (D, Rq) or None       query down-projection (None: no query latent)
    q_norm : (Rq,) or None       RMSNorm weight of the query latent
    W_uq : (Rq, H*Dn)            query up-projection, position-free part
                                 (``(D, H*Dn)`` without a query latent)
    W_qr : (Rq, H*Dr)            query up-projection, RoPE part (``(D, H*Dr)`` without)
    W_dkv : (D, Rkv)             KV down-projection: the latent that is cached
    kv_norm : (Rkv,)             RMSNorm weight of the KV latent
    W_kr : (D, Dr)               the shared RoPE key (one for all heads, cached)
    W_uk : (Rkv, H*Dn)           key up-projection, latent -> per-head keys
    W_uv : (Rkv, H*Dv)           value up-projection, latent -> per-head values
    W_o : (H*Dv, D)              output projection
    rope_base : float
    rope_layout : "interleaved" or "rotate_half"
        Pairing of the RoPE features (:func:`mla_rope`).
    eps : float
        The RMSNorms' epsilon (1e-6 in both models).
    softmax_scale : float, optional
        Default :func:`mla_softmax_scale` ``(Dn, Dr)``, ``1 / sqrt(Dn + Dr)``.
    """

    num_heads: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    W_dq: np.ndarray | None
    q_norm: np.ndarray | None
    W_uq: np.ndarray
    W_qr: np.ndarray
    W_dkv: np.ndarray
    kv_norm: np.ndarray
    W_kr: np.ndarray
    W_uk: np.ndarray
    W_uv: np.ndarray
    W_o: np.ndarray
    rope_base: float = 10000.0
    rope_layout: str = "interleaved"
    eps: float = 1e-6
    softmax_scale: float | None = None

    def __post_init__(self) -> None:
        heads = self.num_heads = check_positive_int(self.num_heads, "num_heads")
        dn = self.qk_nope_head_dim = check_positive_int(self.qk_nope_head_dim, "qk_nope_head_dim")
        dr = self.qk_rope_head_dim = check_positive_int(self.qk_rope_head_dim, "qk_rope_head_dim")
        dv = self.v_head_dim = check_positive_int(self.v_head_dim, "v_head_dim")
        if dr % 2:
            raise ValueError(f"qk_rope_head_dim must be even (RoPE turns pairs), got {dr}")
        if self.rope_layout not in ROPE_LAYOUTS:
            raise ValueError(f"rope_layout must be one of {ROPE_LAYOUTS}, got {self.rope_layout!r}")
        self.rope_base = check_real(self.rope_base, "rope_base", 0.0)
        self.eps = check_real(self.eps, "eps", 0.0)
        if self.softmax_scale is None:
            self.softmax_scale = mla_softmax_scale(dn, dr)
        self.softmax_scale = check_real(self.softmax_scale, "softmax_scale", 0.0)
        if (self.W_dq is None) != (self.q_norm is None):
            raise ValueError("W_dq and q_norm must both be arrays (a query latent) or both None")
        for name in _WEIGHT_NAMES:
            if getattr(self, name) is not None:
                w = as_float_array(getattr(self, name), name)
                check_ndim(w, 1 if name in _NORMS else 2, name, "(R,)" if name in _NORMS
                           else "(D_in, D_out)")  # fmt: skip
                setattr(self, name, w)
        d_model, rkv = self.W_dkv.shape
        q_in = d_model if self.W_dq is None else self.W_dq.shape[1]  # Rq, or D
        expected = {
            "W_dq": (d_model, q_in), "q_norm": (q_in,), "W_uq": (q_in, heads * dn),
            "W_qr": (q_in, heads * dr), "W_dkv": (d_model, rkv), "kv_norm": (rkv,),
            "W_kr": (d_model, dr), "W_uk": (rkv, heads * dn), "W_uv": (rkv, heads * dv),
            "W_o": (heads * dv, d_model),
        }  # fmt: skip
        for name, shape in expected.items():
            w = getattr(self, name)
            if w is not None and w.shape != shape:
                raise ValueError(
                    f"{name} must have shape {shape} for d_model={d_model}, kv_lora_rank={rkv} "
                    f"(from W_dkv {self.W_dkv.shape}), q_lora_rank={self.q_lora_rank}, "
                    f"num_heads={heads}, Dn={dn}, Dr={dr}, Dv={dv}; got {w.shape}"
                )

    @property
    def d_model(self) -> int:
        """``D``."""
        return self.W_dkv.shape[0]

    @property
    def q_lora_rank(self) -> int | None:
        """``Rq``, the width of the query latent, or None (queries straight from ``x``)."""
        return None if self.W_dq is None else self.W_dq.shape[1]

    @property
    def kv_lora_rank(self) -> int:
        """``Rkv``, the width of the cached KV latent."""
        return self.W_dkv.shape[1]

    @property
    def qk_head_dim(self) -> int:
        """``Dn + Dr``, the width of a query or key head."""
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def cached_values_per_token(self) -> int:
        """``Rkv + Dr``: the numbers one token leaves in the cache (576 in DeepSeek-V2/V3)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def num_parameters(self) -> int:
        """Number of scalars in the weights and the norms."""
        return sum(getattr(self, n).size for n in _WEIGHT_NAMES if getattr(self, n) is not None)

    def weights(self) -> dict[str, np.ndarray | None]:
        """The arrays, by name (``None`` for an absent query latent), ``(D_in, D_out)``."""
        return {name: getattr(self, name) for name in _WEIGHT_NAMES}

    def config(self) -> dict[str, Any]:
        """The sizes and settings, as :class:`mha.mla_torch.MultiHeadLatentAttention`
        takes them."""
        return {
            "d_model": self.d_model, "num_heads": self.num_heads,
            "q_lora_rank": self.q_lora_rank, "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim, "v_head_dim": self.v_head_dim,
            "rope_base": self.rope_base, "rope_layout": self.rope_layout, "eps": self.eps,
            "softmax_scale": self.softmax_scale,
        }  # fmt: skip

    @classmethod
    def init(
        cls,
        d_model: int,
        num_heads: int,
        *,
        kv_lora_rank: int,
        qk_nope_head_dim: int,
        qk_rope_head_dim: int,
        v_head_dim: int,
        q_lora_rank: int | None = None,
        rope_base: float = 10000.0,
        rope_layout: str = "interleaved",
        eps: float = 1e-6,
        softmax_scale: float | None = None,
        seed: int = 0,
        dtype: Any = np.float64,
    ) -> MLAParams:
        """Seeded random weights: each matrix Xavier-uniform, ``U(-a, a)`` with
        ``a = sqrt(6 / (D_in + D_out))``, drawn in the order ``W_dq, W_uq, W_qr, W_dkv,
        W_kr, W_uk, W_uv, W_o``; then the norm weights from ``U(0.5, 1.5)`` (around 1,
        not all 1 as at a model's initialisation, so that a norm weight left out shows).

        Parameters
        ----------
        d_model, num_heads : int
            ``D`` and ``H``; ``D`` need not be ``H`` times anything.
        kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim : int
            ``Rkv``, ``Dn``, ``Dr`` (even), ``Dv``.
        q_lora_rank : int, optional
            ``Rq``; None: the queries are projected from ``x`` directly (DeepSeek-V2-Lite).
        rope_base, rope_layout, eps, softmax_scale
            As the attributes.
        seed : int
        dtype : NumPy floating dtype
        """
        d_model = check_positive_int(d_model, "d_model")
        heads = check_positive_int(num_heads, "num_heads")
        rkv = check_positive_int(kv_lora_rank, "kv_lora_rank")
        dn = check_positive_int(qk_nope_head_dim, "qk_nope_head_dim")
        dr = check_positive_int(qk_rope_head_dim, "qk_rope_head_dim")
        dv = check_positive_int(v_head_dim, "v_head_dim")
        rq = None if q_lora_rank is None else check_positive_int(q_lora_rank, "q_lora_rank")
        q_in = d_model if rq is None else rq
        shapes = {
            "W_dq": None if rq is None else (d_model, rq), "W_uq": (q_in, heads * dn),
            "W_qr": (q_in, heads * dr), "W_dkv": (d_model, rkv), "W_kr": (d_model, dr),
            "W_uk": (rkv, heads * dn), "W_uv": (rkv, heads * dv), "W_o": (heads * dv, d_model),
        }  # fmt: skip
        rng = np.random.default_rng(seed)
        weights: dict[str, np.ndarray | None] = {}
        for name in _MATRICES:
            shape = shapes[name]
            if shape is None:
                weights[name] = None
                continue
            limit = math.sqrt(6.0 / sum(shape))
            weights[name] = rng.uniform(-limit, limit, size=shape).astype(dtype)
        weights["q_norm"] = None if rq is None else rng.uniform(0.5, 1.5, rq).astype(dtype)
        weights["kv_norm"] = rng.uniform(0.5, 1.5, rkv).astype(dtype)
        return cls(
            num_heads=heads, qk_nope_head_dim=dn, qk_rope_head_dim=dr, v_head_dim=dv,
            rope_base=rope_base, rope_layout=rope_layout, eps=eps,
            softmax_scale=softmax_scale, **weights,
        )  # fmt: skip
