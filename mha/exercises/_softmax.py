"""The softmax exercise: its cases, and models of the usual mistakes.

Each model is ``mha.softmax`` with one step done the usual wrong way.
``_OVERFLOW`` and ``_NAN_EMPTY_ROW`` are reused by the attention exercises, whose
softmax can go wrong the same ways.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import mha

from ._core import _Case, _label, _Mistake

# --------------------------------------------------------------------------- mistake models


def _naive_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x)  # no shift: exp(1000) = inf, exp(-1000) = 0
    return exp / np.sum(exp, axis=axis, keepdims=True)


def _unguarded_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    # Shifted by each slice's maximum, but an all -inf slice computes -inf - (-inf) = NaN.
    exp = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exp / np.sum(exp, axis=axis, keepdims=True)


def _global_max_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x - np.max(x))  # one shift for the whole array, not one per slice
    return exp / np.sum(exp, axis=axis, keepdims=True)


def _global_max_zeros_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    # One shift for the whole array, and 0/0 turned into 0: a row far below another
    # underflows to zeros instead of NaN.
    exp = np.exp(x - np.max(x))
    total = np.sum(exp, axis=axis, keepdims=True)
    return np.divide(exp, total, out=np.zeros_like(exp), where=total != 0)


def _mean_shift_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    # Shifted by each slice's mean: exp(2000 - 667) is still inf in [2000, 0, 1], and a
    # slice holding -inf has the mean -inf.
    exp = np.exp(x - np.mean(x, axis=axis, keepdims=True))
    return exp / np.sum(exp, axis=axis, keepdims=True)


def _whole_array_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return mha.softmax(np.reshape(x, -1)).reshape(np.shape(x))


def _sum_without_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exp / np.sum(exp, axis=axis)  # (T, S) / (T,): broadcasts along the wrong axis


def _no_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x - np.max(x, axis=axis))
    return exp / np.sum(exp, axis=axis)


# --------------------------------------------------------------------------- diagnoses

_OVERFLOW = (
    "NaN or inf on large scores (such as 1000) while small ones are right: "
    "exp overflows (exp(710) is already inf in float64).",
    "Revisit why subtracting a constant from every score of a row leaves the row's "
    "softmax unchanged, and which constant keeps exp in range.",
)
_GLOBAL_MAX = (
    "NaN for a row whose scores are far below another row's (such as -1000 next "
    "to 1000): one constant is subtracted from the whole array.",
    "Which maximum keeps every slice's exp in range: the whole array's, or each "
    "slice's own?",
)
_GLOBAL_MAX_ZEROS = (
    "Zeros for a row whose scores are far below another row's (such as -1000 "
    "next to 1000): the whole array's maximum is subtracted from every slice, "
    "so exp underflows to 0 in that row.",
    _GLOBAL_MAX[1],
)
_MEAN_SHIFT = (
    "NaN for a row whose scores lie far apart (such as 2000, 0 and 1) or hold "
    "-inf: each slice is shifted by its mean, not its maximum, so exp(x - mean) "
    "still overflows for the largest score.",
    "Subtracting any constant leaves the softmax unchanged, but only the "
    "slice's maximum makes every exp at most 1.",
)
_NAN_EMPTY_ROW = (
    "NaN for a row with nothing to attend to (all -inf); mha gives such a row zero "
    "weights (and zero context).",
    "Think about what -inf - (-inf) is, and what a query that may attend to no key should receive.",
)


def _softmax_mistakes() -> tuple[_Mistake, ...]:
    keepdims = (
        "The max or the sum lost its reduced axis, so each entry is shifted or divided "
        "by another slice's value (or the shapes do not fit).",
        "Print the shape of your sum next to the shape of x: each entry must be divided "
        "by the sum of its own slice.",
    )
    return (
        _Mistake(_naive_softmax, *_OVERFLOW),
        _Mistake(_global_max_softmax, *_GLOBAL_MAX),
        _Mistake(_global_max_zeros_softmax, *_GLOBAL_MAX_ZEROS),
        _Mistake(_mean_shift_softmax, *_MEAN_SHIFT),
        _Mistake(_unguarded_softmax, *_NAN_EMPTY_ROW),
        _Mistake(
            lambda x, axis=-1: mha.softmax(x),
            "Normalised along the last axis even when another axis is asked for: the "
            "axis argument is ignored.",
            "Revisit which axis your max and sum run over: it is the one given by axis.",
        ),
        _Mistake(
            lambda x, axis=-1: mha.softmax(x, axis=0),
            "Normalised along the wrong axis, the first one (0), instead of the axis "
            "asked for (by default the last).",
            "Revisit which axis your max and sum run over: it is the one given by axis.",
        ),
        _Mistake(
            _whole_array_softmax,
            "The whole array sums to 1 instead of each slice along axis.",
            "A reduction without an axis runs over every entry of the array.",
        ),
        _Mistake(_sum_without_keepdims, *keepdims),
        _Mistake(_no_keepdims, *keepdims),
    )


# --------------------------------------------------------------------------- cases


def _softmax_cases(rng: np.random.Generator) -> list[_Case]:
    def case(x: np.ndarray, tag: str = "", **kwargs: Any) -> _Case:
        return _Case(_label(tag, x=x), (x,), kwargs, loose=x.dtype == np.float32)

    some_inf = rng.normal(size=(3, 5))
    some_inf[0, 1] = some_inf[2, [0, 3]] = -np.inf
    empty_row = rng.normal(size=(3, 4))
    empty_row[1] = -np.inf
    large = np.array(  # the last row: exp(x - its mean) overflows
        [[1000.0, 999.0, 997.5, 990.0], [-1000.0, -998.0, -1001.0, -1003.0], [0.5, 1.0, -2.0, 3],
         [2000.0, 0.0, 1.0, 3.0]]
    )
    batched = rng.normal(size=(2, 3, 5)) * 2
    return [
        case(rng.normal(size=(3, 5)) * 2),
        case(rng.normal(size=(4, 4)) * 2),
        case(batched),
        case(batched, "axis=0", axis=0),
        case(batched, "axis=1", axis=1),
        case(rng.normal(size=6) * 2, "1-D"),
        case(some_inf, "with some -inf entries"),
        case(large, "large scores such as 1000"),
        case(empty_row, "row 1 all -inf: nothing to attend to"),
        case(batched.astype(np.float32) * 3, "float32"),
    ]
