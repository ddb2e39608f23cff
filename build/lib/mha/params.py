"""The weights of one multi-head attention layer, in the specification's convention.

``y = x @ W + b`` with ``W`` of shape ``(D_in, D_out)``; :mod:`mha.convert` moves them
to and from PyTorch, which stores ``(out, in)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from mha._checks import as_float_array, check_divisible, check_ndim, check_positive_int

__all__ = ["AttentionParams"]


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
