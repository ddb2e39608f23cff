"""The scaled dot-product attention exercise: its cases, and models of the usual mistakes.

:func:`_attend` is ``mha``'s attention with each step replaceable; a mistake model
replaces one step. The same mistakes, made inside every head, are reused by the
multi-head attention exercise (see :func:`_attention_mistakes`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

import mha

from ._core import _Case, _label, _Mistake, _mixed_mask
from ._softmax import (
    _GLOBAL_MAX,
    _GLOBAL_MAX_ZEROS,
    _MEAN_SHIFT,
    _NAN_EMPTY_ROW,
    _OVERFLOW,
    _global_max_softmax,
    _global_max_zeros_softmax,
    _mean_shift_softmax,
    _naive_softmax,
    _unguarded_softmax,
)

# --------------------------------------------------------------------------- mistake models
# Each model is mha's computation with one step done the usual wrong way. The correct
# steps come from mha itself.


def _softmax(x: np.ndarray) -> np.ndarray:
    return mha.softmax(x)  # looked up when called, not when this module is imported


def _scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    return q @ np.swapaxes(k, -1, -2)  # (..., T, Dh) @ (..., Dh, S) -> (..., T, S)


def _scale(scores: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
    return scores / math.sqrt(q.shape[-1])


def _block(scaled: np.ndarray, mask: np.ndarray) -> np.ndarray:
    return np.where(mask, scaled, -np.inf)


def _attend(
    q: np.ndarray,
    k: np.ndarray,
    v: np.ndarray,
    mask: np.ndarray | None = None,
    *,
    scores: Callable[..., np.ndarray] = _scores,
    scale: Callable[..., np.ndarray] = _scale,
    block: Callable[..., np.ndarray] = _block,
    normalise: Callable[..., np.ndarray] = _softmax,
    after: Callable[..., np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention with each step replaceable; defaults are correct."""
    scaled = scale(scores(q, k), q, k, v)  # (..., T, S)
    masked = scaled if mask is None else block(scaled, mask)
    weights = normalise(masked)
    if after is not None and mask is not None:
        weights = after(weights, mask)
    return weights @ v, weights  # (..., T, S) @ (..., S, Dv) -> (..., T, Dv)


def _scaled_by(divisor: Callable[[np.ndarray, np.ndarray, np.ndarray], float]) -> Callable:
    def scale(scores: np.ndarray, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        return scores / divisor(q, k, v)

    return scale


def _swap_outputs(func: Callable[..., tuple[Any, Any]]) -> Callable[..., tuple[Any, Any]]:
    def swapped(*args: Any, **kwargs: Any) -> tuple[Any, Any]:
        first, second = func(*args, **kwargs)
        return second, first

    return swapped


def _first_output(func: Callable[..., tuple[Any, Any]]) -> Callable[..., Any]:
    def first(*args: Any, **kwargs: Any) -> Any:
        return func(*args, **kwargs)[0]

    return first


# --------------------------------------------------------------------------- diagnoses


def _attention_mistakes(
    multi_head: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None,
) -> tuple[_Mistake, ...]:
    """Mistakes inside scaled dot-product attention. ``multi_head``, a correct multi-head
    attention taking the attention as ``attend=``, wraps each model so that the mistake
    is made in every head; None leaves the models as they are."""
    where = "" if multi_head is None else " in each head"

    def attend(**steps: Any) -> Callable[..., Any]:
        inner = partial(_attend, **steps)
        return inner if multi_head is None else partial(multi_head, attend=inner)

    def scale_note(quantity: str) -> str:
        return (
            f"The scores are divided by {quantity} instead of sqrt(head_dim){where}, "
            f"the width of the vectors in each dot product."
        )

    scale_hint = (
        "The scale comes from how long the vectors in one dot product are (their "
        "variance grows with head_dim), not from how many queries, keys or features "
        "there are."
    )
    mistakes = [
        _Mistake(
            attend(scores=lambda q, k: q @ k),
            f"A missing transpose: the scores look like q @ k{where}, so queries are "
            "multiplied with the columns of k instead of compared with each key (the "
            "shapes only fit when head_dim == S).",
            "Revisit what scores[t, s] is: the dot product of query t with key s, so "
            "the Dh axis of both must be the one summed over.",
        ),
        _Mistake(
            attend(scores=lambda q, k: q @ k.T),
            "Right on 2-D inputs, but batched inputs fail: `.T` of a 3-D or 4-D array "
            "reverses all its axes, batch and heads included (a missing transpose of "
            "the last two axes only).",
            "Only the last two axes of k (S and Dh) should swap; the batch and head "
            "axes must stay where they are.",
        ),
        _Mistake(
            attend(scale=lambda s, q, k, v: s),
            f"No 1/sqrt(head_dim) scaling: the scores are not divided by sqrt(head_dim){where}.",
            "Revisit why dot products of Dh random components grow like sqrt(Dh), and "
            "what large scores do to the softmax.",
        ),
        _Mistake(
            attend(scale=_scaled_by(lambda q, k, v: math.sqrt(q.shape[-2]))),
            scale_note("sqrt(T), the number of queries,"),
            scale_hint,
        ),
        _Mistake(
            attend(scale=_scaled_by(lambda q, k, v: math.sqrt(k.shape[-2]))),
            scale_note("sqrt(S), the number of keys,"),
            scale_hint,
        ),
        _Mistake(
            attend(scale=_scaled_by(lambda q, k, v: q.shape[-1])),
            f"The scores are divided by head_dim instead of by sqrt(head_dim){where}: "
            "1/d instead of 1/sqrt(d).",
            scale_hint,
        ),
        _Mistake(
            attend(scale=lambda s, q, k, v: s * math.sqrt(q.shape[-1])),
            f"The scores are multiplied by sqrt(head_dim) instead of divided{where}.",
            scale_hint,
        ),
        _Mistake(
            attend(block=lambda s, m: np.where(m, -np.inf, s)),
            "An inverted mask: keys where the mask is True are blocked. In mha, True = may attend.",
            "Revisit the mask convention in mha's docstring; it is that of PyTorch's "
            "scaled_dot_product_attention, the opposite of nn.MultiheadAttention's.",
        ),
        _Mistake(
            attend(block=lambda s, m: np.where(np.swapaxes(m, -1, -2), s, -np.inf)),
            "The mask is applied along the queries (transposed): its rows are used as "
            "keys, so a padding mask blocks the rows of the pads instead of their "
            "columns, and a causal mask lets each query see the future.",
            "Rows are queries and columns are keys, in the mask as in the scores "
            "(..., T, S): a padding mask of shape (B, 1, 1, S) already has its keys last.",
        ),
        _Mistake(
            attend(block=lambda s, m: s),
            "The mask has no effect: blocked keys still get weight.",
            "Revisit how a blocked key is made to get exactly zero weight from the softmax.",
        ),
        _Mistake(
            attend(block=lambda s, m: np.where(m, s, 0.0)),
            "Blocked scores are set to 0 instead of -inf: exp(0) = 1, so a blocked key "
            "still gets as much weight as an allowed key whose score is 0.",
            "A score of 0 is an ordinary score; which score does the softmax turn into "
            "a weight of exactly 0?",
        ),
        _Mistake(
            attend(block=lambda s, m: s, after=lambda w, m: w * m),
            "The mask is applied after the softmax: blocked keys get 0, but the "
            "remaining weights of a row no longer sum to 1.",
            "The softmax must already know which keys are blocked, so that the allowed "
            "keys share the whole weight of 1.",
        ),
        _Mistake(
            attend(block=lambda s, m: np.where(m, s, -1e9)),
            "A row with nothing to attend to gets equal weights on every key instead of "
            "zeros: blocked scores seem set to a large finite number, not -inf.",
            "When every key of a row is blocked with the same finite number, the softmax "
            "spreads the weight evenly; mha gives such a row zero weights.",
        ),
        _Mistake(
            attend(normalise=lambda s: mha.softmax(s, axis=-2)),
            f"The softmax runs over the wrong axis, the queries (axis -2){where}: each "
            "column of the weights sums to 1 instead of each row.",
            "Each query spreads its attention over the keys: which axis of the scores "
            "(..., T, S) counts the keys?",
        ),
        _Mistake(attend(normalise=_naive_softmax), *_OVERFLOW),
        _Mistake(attend(normalise=_unguarded_softmax), *_NAN_EMPTY_ROW),
        _Mistake(attend(normalise=_global_max_softmax), *_GLOBAL_MAX),
        _Mistake(attend(normalise=_global_max_zeros_softmax), *_GLOBAL_MAX_ZEROS),
        _Mistake(attend(normalise=_mean_shift_softmax), *_MEAN_SHIFT),
    ]
    if multi_head is not None:
        # `.T` of the 4-D heads raises on every input: nothing to tell it apart by.
        # In its place, the scale that only multi-head attention can get wrong.
        mistakes[1] = _Mistake(
            attend(scale=_scaled_by(lambda q, k, v: math.sqrt(q.shape[-3] * q.shape[-1]))),
            scale_note("sqrt(d_model)"),
            scale_hint,
        )
    return tuple(mistakes)


def _attention_output_mistakes(
    outputs: tuple[str, str], reference: Callable[..., Any]
) -> tuple[_Mistake, ...]:
    first, second = outputs
    return (
        _Mistake(
            _first_output(reference),
            f"Only the {first} is returned; mha returns the pair ({first}, {second}).",
            f"The {second} are part of the result: a chapter draws them.",
        ),
        _Mistake(
            _swap_outputs(reference),
            f"The two results come in the wrong order: ({second}, {first}); mha returns "
            f"({first}, {second}).",
            "Keep the order of mha's signature, so that callers can unpack the pair.",
        ),
    )


def _sdpa_mistakes() -> tuple[_Mistake, ...]:
    outputs = ("context", "weights")
    return _attention_mistakes() + _attention_output_mistakes(
        outputs, lambda *args, **kwargs: _attend(*args, **kwargs)
    )


# --------------------------------------------------------------------------- cases


def _sdpa_case(
    rng: np.random.Generator,
    lead: tuple[int, ...],
    sizes: tuple[int, int, int, int],
    mask: np.ndarray | None = None,
    tag: str = "",
    query_scale: float = 1.0,
    dtype: Any = np.float64,
) -> _Case:
    target_len, source_len, head_dim, value_dim = sizes
    q = (rng.normal(size=(*lead, target_len, head_dim)) * query_scale).astype(dtype)
    k = rng.normal(size=(*lead, source_len, head_dim)).astype(dtype)
    v = rng.normal(size=(*lead, source_len, value_dim)).astype(dtype)
    kwargs = {} if mask is None else {"mask": mask}
    label = _label(tag, q=q, k=k, v=v, **kwargs)
    return _Case(label, (q, k, v), kwargs, loose=dtype == np.float32)


def _sdpa_cases(rng: np.random.Generator) -> list[_Case]:
    empty = _mixed_mask(rng, 2, 4, 3)
    empty[0, 2] = False
    return [
        # head_dim == S: a missing transpose still runs, and gives wrong numbers
        _sdpa_case(rng, (), (3, 4, 4, 2)),
        _sdpa_case(rng, (2,), (3, 5, 4, 6)),
        _sdpa_case(rng, (2, 3), (4, 6, 5, 2), tag="batch and heads"),
        _sdpa_case(rng, (), (4, 5, 3, 2), _mixed_mask(rng, 4, 5)),
        _sdpa_case(rng, (2, 2), (5, 5, 3, 4), mha.causal_mask(5), tag="causal"),
        _sdpa_case(rng, (2, 2), (3, 5, 3, 4), mha.padding_mask([5, 2]), tag="padding"),
        _sdpa_case(rng, (2, 2), (4, 4, 3, 2), mha.padding_mask([4, 2]), tag="padding, T == S"),
        _sdpa_case(rng, (2,), (3, 4, 5, 2), tag="large scores such as 1000", query_scale=1e3),
        _sdpa_case(rng, (2,), (4, 3, 2, 3), empty, tag="a row with nothing to attend to"),
        _sdpa_case(
            rng, (1, 2), (3, 4, 6, 5), mha.padding_mask([3], max_len=4), "float32", 1, np.float32
        ),
    ]
