"""Chapter 6's exercises, why attention works: score_std and attention_entropy.

The references are formulas of the chapter (the spread of a dot product, the entropy of
a row of weights) written here: mha computes neither as a function of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from ._core import _Case, _label, _Mistake, _mixed_mask

# --------------------------------------------------------------------------- score_std


def _score_std(head_dim: int, q_std: float = 1.0, k_std: float = 1.0) -> float:
    """The standard deviation of q . k for independent components of mean 0."""
    return math.sqrt(head_dim) * q_std * k_std


def _std_model(formula: Callable[[int, float, float], float]) -> Callable[..., float]:
    def model(head_dim: int, q_std: float = 1.0, k_std: float = 1.0) -> float:
        return formula(head_dim, q_std, k_std)

    return model


def _std_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _std_model(lambda d, a, b: d * a**2 * b**2),
            "This is the variance, Dh q_std^2 k_std^2: the standard deviation is its "
            "square root.",
            "The divisor that gives unit variance is a standard deviation.",
        ),
        _Mistake(
            _std_model(lambda d, a, b: math.sqrt(d)),
            "q_std and k_std are ignored: sqrt(Dh) is the spread only when both are 1.",
            "Each product q_i k_i has variance q_std^2 k_std^2.",
        ),
        _Mistake(
            _std_model(lambda d, a, b: math.isqrt(d) * a * b),
            "sqrt(Dh) is rounded down to an integer (math.isqrt, int(...) or //): "
            "right only when Dh is a perfect square, such as 64.",
            "The square root of 128 is 11.31..., not 11: keep it a float.",
        ),
        _Mistake(
            _std_model(lambda d, a, b: math.sqrt(d * a * b)),
            "sqrt(Dh q_std k_std): the standard deviations are multiplied like "
            "variances, under the square root.",
            "Var(q_i k_i) = q_std^2 k_std^2: its square root is q_std k_std.",
        ),
        _Mistake(
            _std_model(lambda d, a, b: d * a * b),
            "Dh q_std k_std: the spread grows like sqrt(Dh), not like Dh (the variances "
            "of Dh independent products add up).",
            "Revisit eq-dot-variance: the variance of the sum is Dh times one product's.",
        ),
        _Mistake(
            _std_model(lambda d, a, b: math.sqrt(d) * (a + b)),
            "sqrt(Dh) (q_std + k_std): the spreads of a product multiply, they do not add.",
            "Var(q_i k_i) = Var(q_i) Var(k_i) for independent components of mean 0.",
        ),
    )


def _std_cases(rng: np.random.Generator) -> list[_Case]:
    return [
        _Case("head_dim=128", (128,)),  # not a perfect square: sqrt(128) is no integer
        _Case("head_dim=1024", (1024,)),
        _Case("head_dim=64, q_std=0.5, k_std=0.5", (64,), {"q_std": 0.5, "k_std": 0.5}),
        _Case("head_dim=16, q_std=2, k_std=0.25", (16,), {"q_std": 2.0, "k_std": 0.25}),
        _Case("head_dim=9, q_std=3, k_std=1", (9,), {"q_std": 3.0, "k_std": 1.0}),
    ]


# --------------------------------------------------------------------------- attention_entropy


def _entropy(weights: Any, *, axis: int = -1, log: Callable = np.log, sign: float = -1.0,
             reduce: str = "sum", keepdims: bool = False, guard: bool = True,
             eps: float = 0.0) -> np.ndarray:
    w = np.asarray(weights, dtype=np.float64)
    if eps:  # log(w + eps): no NaN for w = 0, but every positive weight is shifted
        terms = w * log(w + eps)
    elif guard:
        terms = np.where(w > 0, w * log(np.where(w > 0, w, 1.0)), 0.0)  # 0 log 0 = 0
    else:
        terms = w * log(w)
    total = terms.sum(axis=axis, keepdims=keepdims)
    if reduce == "mean":
        total = total / w.shape[axis]
    return sign * total


def _attention_entropy(weights: Any) -> np.ndarray:
    """-sum_s w_s ln w_s over the keys (the last axis), with 0 ln 0 = 0: (..., T)."""
    return _entropy(weights)


def _entropy_model(**change: Any) -> Callable[..., np.ndarray]:
    def model(weights: Any) -> np.ndarray:
        return _entropy(weights, **change)

    return model


def _entropy_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _entropy_model(guard=False),
            "NaN for a blocked key: its weight is 0, and 0 * log(0) computes "
            "0 * -inf = NaN; the entropy counts 0 log 0 as 0.",
            "A weight of exactly 0 adds nothing to the entropy: leave it out of the sum.",
        ),
        *(
            _Mistake(
                _entropy_model(eps=eps),
                "A small number is added inside the logarithm, log(w + eps): every "
                "positive weight's term moves by about eps, and a one-hot row gets "
                "the entropy -log(1 + eps) < 0 instead of 0.",
                "Leave the weights of 0 out of the sum (0 log 0 = 0) and take the "
                "logarithm of the others as they are.",
            )
            # the usual choices: from 1e-10 on, the shift is within the tolerance
            for eps in (1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7, 1e-8, 1e-9)
        ),
        _Mistake(
            _entropy_model(sign=1.0),
            "The sign is wrong: sum w log w is never positive, the entropy -sum w log w "
            "is never negative.",
            "A uniform row over S keys has entropy ln S > 0.",
        ),
        _Mistake(
            _entropy_model(log=np.log2),
            "Bits instead of nats: log2 is used; the chapter measures in nats (ln).",
            "A uniform row over 4 keys has entropy ln 4 = 1.386 nats.",
        ),
        _Mistake(
            _entropy_model(axis=-2),
            "The sum runs over the queries (axis -2) instead of the keys: each row of "
            "weights is one distribution.",
            "Which axis of (..., T, S) sums to 1?",
        ),
        _Mistake(
            _entropy_model(reduce="mean"),
            "The terms are averaged over the keys instead of summed.",
            "The entropy is a sum over the keys: -sum_s w_s ln w_s.",
        ),
        _Mistake(
            _entropy_model(keepdims=True),
            "Shape (..., T, 1): the key axis was kept; the entropy has one number per "
            "query, (..., T).",
            "Reduce the key axis away.",
        ),
    )


def _entropy_cases(rng: np.random.Generator) -> list[_Case]:
    def weights(shape: tuple[int, ...], mask: np.ndarray | None = None,
                scale: float = 1.0) -> np.ndarray:
        scores = rng.normal(size=shape) * scale
        if mask is not None:
            scores = np.where(mask, scores, -np.inf)
        exp = np.exp(scores - scores.max(axis=-1, keepdims=True))
        return exp / exp.sum(axis=-1, keepdims=True)

    one_hot = np.eye(4)[[0, 2, 3]]  # (3, 4): saturated rows
    uniform = np.full((2, 4), 0.25)
    causal = weights((2, 4, 4), np.tril(np.ones((4, 4), dtype=bool)))
    tags = ["", "uniform rows", "", "causal: blocked keys weigh 0", "one-hot rows",
            "a random mask"]
    arrays = [weights((3, 5)), uniform, weights((2, 2, 4, 6), scale=2.0), causal, one_hot,
              weights((3, 6), _mixed_mask(rng, 3, 6))]
    return [_Case(_label(tag, weights=w), (w,)) for tag, w in zip(tags, arrays, strict=True)]
