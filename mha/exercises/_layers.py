"""The add_and_norm exercise (chapter 3): the encoder layer's residual, then LayerNorm.

mha's layers are PyTorch modules; the reference here is the NumPy formula of their
``norm1(x + attended)`` (post-norm, as in the paper), tested against ``nn.LayerNorm``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ._core import _Case, _label, _Mistake


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float,
                *, axis: int = -1, ddof: int = 0, eps_outside: bool = False) -> np.ndarray:
    mean = x.mean(axis=axis, keepdims=True)
    var = x.var(axis=axis, keepdims=True, ddof=ddof)
    spread = np.sqrt(var) + eps if eps_outside else np.sqrt(var + eps)
    return gamma * (x - mean) / spread + beta


def _add_and_norm(x: Any, sublayer_out: Any, gamma: Any, beta: Any,
                  eps: float = 1e-5) -> np.ndarray:
    """LayerNorm(x + sublayer_out) over the features, the paper's (post-norm) order."""
    return _layer_norm(np.asarray(x) + np.asarray(sublayer_out), gamma, beta, eps)


def _norm_model(**change: Any) -> Callable[..., np.ndarray]:
    order = change.pop("order", "post")

    def model(x: Any, sublayer_out: Any, gamma: Any, beta: Any, eps: float = 1e-5) -> Any:
        if order == "pre":  # x + LayerNorm(sublayer_out): the norm inside the residual
            return x + _layer_norm(sublayer_out, gamma, beta, eps, **change)
        if order == "none":  # no residual
            return _layer_norm(sublayer_out, gamma, beta, eps, **change)
        if order == "swapped":
            return _layer_norm(x + sublayer_out, beta, gamma, eps, **change)
        if order == "plain":
            return _layer_norm(x + sublayer_out, 1.0, 0.0, eps, **change)
        return _layer_norm(x + sublayer_out, gamma, beta, eps, **change)

    return model


def _norm_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _norm_model(order="pre"),
            "The residual is added after the norm, x + LayerNorm(sublayer_out): the "
            "paper's layer adds first, then normalises, LayerNorm(x + sublayer_out).",
            "Revisit the order in step 3: residual, then LayerNorm ('add & norm').",
        ),
        _Mistake(
            _norm_model(order="none"),
            "No residual: only the sublayer's output is normalised, x is never added.",
            "The residual path carries x around the sublayer: what is added to what?",
        ),
        _Mistake(
            _norm_model(axis=-2),
            "Normalised over the positions (axis -2) instead of over each vector's "
            "features: LayerNorm works on one token at a time.",
            "After the norm, each token's D features have mean 0 (before gamma, beta).",
        ),
        _Mistake(
            _norm_model(ddof=1),
            "The variance is divided by D - 1 (ddof=1, as in torch.var's default); "
            "LayerNorm divides by D.",
            "LayerNorm uses the plain mean of the squared deviations.",
        ),
        _Mistake(
            _norm_model(eps_outside=True),
            "eps is added to the standard deviation; LayerNorm adds it to the variance, "
            "inside the square root.",
            "(x - mean) / sqrt(var + eps).",
        ),
        _Mistake(
            _norm_model(order="swapped"),
            "gamma and beta are swapped: gamma scales, beta shifts.",
            "LayerNorm returns gamma * normalised + beta.",
        ),
        _Mistake(
            _norm_model(order="plain"),
            "gamma and beta are not used: the result is normalised but not scaled and "
            "shifted.",
            "LayerNorm has learned weights: gamma * normalised + beta.",
        ),
    )


def _norm_cases(rng: np.random.Generator) -> list[_Case]:
    def case(shape: tuple[int, ...], tag: str = "", eps: float | None = None,
             dtype: Any = np.float64) -> _Case:
        d_model = shape[-1]
        x = (rng.normal(size=shape) * 2 + 1).astype(dtype)
        sub = (rng.normal(size=shape) * 3).astype(dtype)
        gamma = rng.uniform(0.5, 2.0, size=d_model).astype(dtype)
        beta = rng.normal(size=d_model).astype(dtype)
        kwargs = {} if eps is None else {"eps": eps}
        label = _label(tag, x=x, sublayer_out=sub, gamma=gamma)
        return _Case(label, (x, sub, gamma, beta), kwargs, loose=dtype == np.float32)

    return [
        case((2, 3, 4)),
        case((1, 5, 8)),
        case((3, 2, 6), "eps=0.5", eps=0.5),
        case((2, 4, 16), "float32", dtype=np.float32),
    ]
