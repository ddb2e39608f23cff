"""The causal_mask and padding_mask exercises: their cases, and models of the usual mistakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake

# --------------------------------------------------------------------------- mistake models


def _causal_shifted(offset: int) -> Callable[[int], np.ndarray]:
    def model(size: int) -> np.ndarray:
        return np.tril(np.ones((size, size), dtype=bool), k=offset)

    return model


def _padding_changed(
    lengths_mode: Callable[..., np.ndarray] | None = None,
    tokens_mode: Callable[..., np.ndarray] | None = None,
) -> Callable[..., np.ndarray]:
    """A padding_mask model: correct except in the mode(s) given."""

    def model(
        lengths: Any = None, *, tokens: Any = None, pad_id: Any = None, max_len: Any = None
    ) -> np.ndarray:
        if tokens is None and lengths_mode is not None:
            return lengths_mode(np.asarray(lengths), max_len)
        if tokens is not None and tokens_mode is not None:
            return tokens_mode(np.asarray(tokens), pad_id)
        return mha.padding_mask(lengths, tokens=tokens, pad_id=pad_id, max_len=max_len)

    return model


def _padding_transformed(transform: Callable[[np.ndarray], np.ndarray]) -> Callable:
    def model(lengths: Any = None, **kwargs: Any) -> np.ndarray:
        return transform(mha.padding_mask(lengths, **kwargs))

    return model


def _lengths_one_too_many(lengths: np.ndarray, max_len: int | None) -> np.ndarray:
    width = int(lengths.max()) if max_len is None else max_len
    keep = np.arange(width)[None, :] <= lengths[:, None]  # (1, S) <= (B, 1) -> (B, S)
    return keep[:, None, None, :]


def _lengths_without_max_len(lengths: np.ndarray, max_len: int | None) -> np.ndarray:
    return mha.padding_mask(lengths)


def _tokens_pad_zero(tokens: np.ndarray, pad_id: int) -> np.ndarray:
    return (tokens != 0)[:, None, None, :]


# --------------------------------------------------------------------------- diagnoses

_BOOL_MASK = (
    "Right pattern, but not a boolean array: mha's masks are boolean (True = may "
    "attend), and mha refuses masks of any other dtype.",
    "A float mask is ambiguous (1 = keep, or 0 = keep as in additive masks); a boolean one is not.",
)


def _causal_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _causal_shifted(-1),
            "Off by one: the diagonal is False, so a token cannot see itself.",
            "The mask hides the future only: is position t in its own past or future?",
        ),
        _Mistake(
            _causal_shifted(1),
            "Off by one: token t may also see token t + 1, one step ahead.",
            "The mask hides the future only: which keys may query t see?",
        ),
        _Mistake(
            lambda size: ~mha.causal_mask(size),
            "An inverted mask: True marks the blocked (future) positions; in mha, "
            "True = may attend.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            lambda size: mha.causal_mask(size).T,
            "The mask is transposed: token t may see itself and the future, not the past.",
            "Rows are queries and columns are keys: which keys may query t see?",
        ),
        _Mistake(lambda size: mha.causal_mask(size).astype(np.float64), *_BOOL_MASK),
        _Mistake(
            lambda size: mha.to_additive_mask(mha.causal_mask(size)),
            "An additive mask (0 and -inf); mha's masks are boolean, True = may attend.",
            "mha converts with to_additive_mask when an additive mask is needed; the "
            "mask itself is boolean.",
        ),
    )


def _padding_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _padding_transformed(np.logical_not),
            "An inverted mask: True marks the padding; in mha, True = a real token that "
            "may be attended to.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            _padding_transformed(lambda m: m[:, 0, 0, :]),
            "Shape (B, S): mha's padding mask is (B, 1, 1, S), so that it broadcasts over "
            "the heads and queries of the scores (B, H, T, S).",
            "Revisit how NumPy aligns a (B, S) array with (B, H, T, S): from the right.",
        ),
        _Mistake(
            _padding_changed(lengths_mode=_lengths_one_too_many),
            "Off by one: position lengths[b] is marked as real, one pad too many.",
            "A sequence of length n has real positions 0 .. n - 1.",
        ),
        _Mistake(
            _padding_changed(lengths_mode=_lengths_without_max_len),
            "max_len is ignored: the mask is only as wide as the longest sequence.",
            "The mask must be as wide as the padded batch, S = max_len when it is given.",
        ),
        _Mistake(
            _padding_changed(tokens_mode=_tokens_pad_zero),
            "Padding is recognised by the id 0, whatever pad_id says.",
            "The padding id is an argument: compare the tokens with it.",
        ),
        _Mistake(_padding_transformed(lambda m: m.astype(np.float64)), *_BOOL_MASK),
    )


# --------------------------------------------------------------------------- cases


def _causal_cases(rng: np.random.Generator) -> list[_Case]:
    return [_Case(f"size={size}", (size,)) for size in (1, 2, 4, 7)]


def _padding_cases(rng: np.random.Generator) -> list[_Case]:
    tokens = np.array([[5, 7, 2, 0, 0], [3, 0, 0, 0, 0], [1, 2, 3, 4, 6]])
    other_pad = np.array([[4, 1, 6, 1], [1, 1, 2, 3]])
    return [
        _Case("lengths [3, 1, 4]", (np.array([3, 1, 4]),)),
        _Case("lengths [2, 5], max_len=7", (np.array([2, 5]),), {"max_len": 7}),
        _Case(
            "lengths [0, 3], max_len=3: a sequence with nothing to attend to",
            (np.array([0, 3]),),
            {"max_len": 3},
        ),
        _Case("tokens (3, 5), pad_id=0", (), {"tokens": tokens, "pad_id": 0}),
        _Case("tokens (2, 4), pad_id=1", (), {"tokens": other_pad, "pad_id": 1}),
    ]
