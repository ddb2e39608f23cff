"""Chapter 10's exercises (10_compressed_cache): compressed_cache_row_sums and compressed_cache_scale.

SCAFFOLD: these two checkers came with the chapter's scaffold (make chapter). Replace
them with the checkers of this chapter's own exercises: for each, its cases (inputs on
which every mistake looks different), its mistake models (the correct steps with one
step done wrong) and its reference when mha has no function of that name; register
them in mha/exercises/__init__.py under this chapter's name, and test them in
tests/test_exercises_chapters.py.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._core import _Case, _label, _Mistake

# --------------------------------------------------------------------------- compressed_cache_row_sums


def _compressed_cache_row_sums(weights: Any) -> np.ndarray:
    """The weights of each query added up over the keys: (..., T, S) -> (..., T)."""
    return np.sum(weights, axis=-1)


def _compressed_cache_row_sums_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            lambda weights: np.sum(weights, axis=-2),
            "The sum runs over the queries (axis -2) instead of the keys.",
            "Which axis of (..., T, S) holds one query's weights?",
        ),
        _Mistake(
            lambda weights: np.sum(weights, axis=-1, keepdims=True),
            "Shape (..., T, 1): the key axis was kept.",
            "One number per query: reduce the key axis away.",
        ),
    )


def _compressed_cache_row_sums_cases(rng: np.random.Generator) -> list[_Case]:
    arrays = [rng.random((3, 5)), rng.random((2, 4, 3)), rng.random((2, 2, 3, 6))]
    return [_Case(_label(weights=w), (w,)) for w in arrays]


# --------------------------------------------------------------------------- compressed_cache_scale


def _compressed_cache_scale(scores: Any, head_dim: int) -> np.ndarray:
    """Raw scores q . k divided by sqrt(head_dim)."""
    return np.asarray(scores) / np.sqrt(head_dim)


def _compressed_cache_scale_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            lambda scores, head_dim: np.asarray(scores) / head_dim,
            "Divided by head_dim instead of its square root.",
            "The spread of q . k grows like sqrt(head_dim).",
        ),
        _Mistake(
            lambda scores, head_dim: np.asarray(scores) * np.sqrt(head_dim),
            "Multiplied by sqrt(head_dim) instead of divided by it.",
            "Scaling must shrink scores that grow with head_dim.",
        ),
    )


def _compressed_cache_scale_cases(rng: np.random.Generator) -> list[_Case]:
    cases = []
    for head_dim, shape in [(4, (3, 5)), (9, (2, 4, 3)), (64, (2, 2, 3, 6))]:
        scores = rng.normal(size=shape) * np.sqrt(head_dim)
        cases.append(_Case(_label(f"head_dim={head_dim}", scores=scores),
                           (scores, head_dim)))
    return cases
