"""Checkers for the book's code exercises: run a learner's function and name the mistake.

``check(name, candidate)`` calls ``candidate`` exactly as ``mha.<name>`` is called, on
fixed random and edge-case inputs (T != S, batches and heads, masks, a query row with
nothing to attend to, scores such as 1000 that overflow a naive ``exp``, float32),
compares every result with ``mha``'s, prints one line for a pass, or the first
failing case and a diagnosis, and returns True or False. :func:`names` lists what
can be checked.

The diagnosis judges behaviour, never source text. For every common mistake there is
a private *mistake model*: ``mha``'s own correct steps with that one step done wrong.
When the learner's outputs match a model on the same inputs (raising where it
raises), its diagnosis and a hint are printed; the hint says which idea to revisit,
not the code that fixes it. The reference output itself is never printed.

Examples
--------
>>> from mha import exercises
>>> exercises.check("softmax", my_softmax)  # doctest: +SKIP
softmax: correct on 10 cases (any axis, -inf entries, an all -inf row, large
  scores, float32).
True
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

import mha

__all__ = ["check", "names"]

_SEED = 14  # fixed: every run sees the same inputs, so a report can be reproduced
_WIDTH = 76  # the book's code boxes
_TOLERANCE = {False: (1e-6, 1e-9), True: (1e-4, 1e-5)}  # (rtol, atol): float64, float32


# --------------------------------------------------------------------------- records


@dataclass(frozen=True)
class _Case:
    """One call: ``candidate(*args, **kwargs)``, described by ``label`` in a report."""

    label: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any] = field(default_factory=dict)
    loose: bool = False  # float32 inputs: compare with the looser tolerance


@dataclass(frozen=True)
class _Mistake:
    """A wrong implementation (``model``), what its output shows, and what to revisit."""

    model: Callable[..., Any]
    what: str
    hint: str


@dataclass(frozen=True)
class _Exercise:
    cases: Callable[[np.random.Generator], list[_Case]]
    outputs: tuple[str, ...]  # names of the returned arrays, in mha's order
    covers: str  # what the cases exercise, for the pass line
    mistakes: tuple[_Mistake, ...]
    generic_hint: str
    exact: bool = False  # masks: equal entries and a boolean dtype


@dataclass(frozen=True)
class _Outcome:
    """What one call did: returned arrays, raised, returned something else, or wrote
    into an argument."""

    value: tuple[np.ndarray, ...] | None = None
    error: Exception | None = None
    problem: str | None = None
    changed: str | None = None


# --------------------------------------------------------------------------- mistake models
# Each model is mha's computation with one step done the usual wrong way. The correct
# steps come from mha itself (softmax, split_heads, merge_heads, causal_mask, ...).


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


def _whole_array_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    return mha.softmax(np.reshape(x, -1)).reshape(np.shape(x))


def _sum_without_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exp / np.sum(exp, axis=axis)  # (T, S) / (T,): broadcasts along the wrong axis


def _no_keepdims(x: np.ndarray, axis: int = -1) -> np.ndarray:
    exp = np.exp(x - np.max(x, axis=axis))
    return exp / np.sum(exp, axis=axis)


def _softmax(x: np.ndarray) -> np.ndarray:
    return mha.softmax(x)  # looked up when called, not when this module is imported


def _split(x: np.ndarray, num_heads: int) -> np.ndarray:
    return mha.split_heads(x, num_heads)


def _merge(x: np.ndarray) -> np.ndarray:
    return mha.merge_heads(x)


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


def _split_reshape_only(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, length, d_model = x.shape
    return x.reshape(batch, num_heads, length, d_model // num_heads)  # whole tokens per head


def _split_interleaved(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, length, d_model = x.shape
    x = x.reshape(batch, length, d_model // num_heads, num_heads)  # (B, T, Dh, H)
    return x.transpose(0, 3, 1, 2)  # (B, T, Dh, H) -> (B, H, T, Dh): head h gets h, h+H, ...


def _split_no_transpose(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, length, d_model = x.shape
    return x.reshape(batch, length, num_heads, d_model // num_heads)  # (B, T, H, Dh)


def _split_last_two_swapped(x: np.ndarray, num_heads: int) -> np.ndarray:
    return np.swapaxes(mha.split_heads(x, num_heads), -1, -2)  # (B, H, Dh, T)


def _split_sizes_confused(x: np.ndarray, num_heads: int) -> np.ndarray:
    batch, length, d_model = x.shape
    x = x.reshape(batch, length, d_model // num_heads, num_heads)  # H read as Dh
    return x.transpose(0, 2, 1, 3)  # (B, Dh, T, H)


def _merge_reshape_only(x: np.ndarray) -> np.ndarray:
    batch, heads, length, head_dim = x.shape
    return x.reshape(batch, length, heads * head_dim)  # head axis never moved


def _merge_interleaved(x: np.ndarray) -> np.ndarray:
    batch, heads, length, head_dim = x.shape
    x = x.transpose(0, 2, 3, 1)  # (B, H, T, Dh) -> (B, T, Dh, H)
    return x.reshape(batch, length, head_dim * heads)


def _merge_no_reshape(x: np.ndarray) -> np.ndarray:
    return np.swapaxes(x, 1, 2)  # (B, T, H, Dh): moved but not concatenated


def _merge_sum(x: np.ndarray) -> np.ndarray:
    return x.sum(axis=1)  # (B, T, Dh)


def _merge_mean(x: np.ndarray) -> np.ndarray:
    return x.mean(axis=1)  # (B, T, Dh)


def _linear(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = x @ w  # (B, L, D_in) @ (D_in, D_out) -> (B, L, D_out)
    return y if b is None else y + b


def _multi_head(
    query: np.ndarray,
    key: np.ndarray,
    value: np.ndarray,
    params: mha.AttentionParams,
    num_heads: int,
    mask: np.ndarray | None = None,
    *,
    attend: Callable[..., tuple[np.ndarray, np.ndarray]] = _attend,
    split: Callable[[np.ndarray, int], np.ndarray] = _split,
    merge: Callable[[np.ndarray], np.ndarray] = _merge,
    project_output: bool = True,
    average_weights: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head attention with each step replaceable; defaults are correct."""
    q = split(_linear(query, params.W_q, params.b_q), num_heads)  # (B, H, T, Dh)
    k = split(_linear(key, params.W_k, params.b_k), num_heads)  # (B, H, S, Dh)
    v = split(_linear(value, params.W_v, params.b_v), num_heads)  # (B, H, S, Dh)
    context, weights = attend(q, k, v, mask)  # (B, H, T, Dh), (B, H, T, S)
    merged = merge(context)  # (B, H, T, Dh) -> (B, T, D)
    output = _linear(merged, params.W_o, params.b_o) if project_output else merged
    return output, weights.mean(axis=1) if average_weights else weights


def _with_params(change: Callable[[mha.AttentionParams], dict[str, Any]]) -> Callable:
    """A model that runs correct multi-head attention on changed weights."""

    def model(
        query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
    ) -> tuple[np.ndarray, np.ndarray]:
        changed = dataclasses.replace(params, **change(params))
        return _multi_head(query, key, value, changed, num_heads, mask)

    return model


def _one_head(
    query: Any, key: Any, value: Any, params: Any, num_heads: int, mask: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    return _multi_head(query, key, value, params, 1, mask)


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

_OVERFLOW = (
    "NaN or inf on large scores (such as 1000) while small ones are right: "
    "exp overflows (exp(710) is already inf in float64).",
    "Revisit why subtracting a constant from every score of a row leaves the row's "
    "softmax unchanged, and which constant keeps exp in range.",
)
_NAN_EMPTY_ROW = (
    "NaN for a row with nothing to attend to (all -inf); mha gives such a row zero "
    "weights (and zero context).",
    "Think about what -inf - (-inf) is, and what a query that may attend to no key should receive.",
)


def _attention_mistakes(multi_head: bool) -> tuple[_Mistake, ...]:
    """Mistakes inside scaled dot-product attention; ``multi_head`` wraps each model in
    correct multi-head attention."""
    where = " in each head" if multi_head else ""

    def attend(**steps: Any) -> Callable[..., Any]:
        inner = partial(_attend, **steps)
        return partial(_multi_head, attend=inner) if multi_head else inner

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
            attend(block=lambda s, m: s),
            "The mask has no effect: blocked keys still get weight.",
            "Revisit how a blocked key is made to get exactly zero weight from the softmax.",
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
    ]
    if multi_head:
        # `.T` of the 4-D heads raises on every input: nothing to tell it apart by.
        # In its place, the scale that only multi-head attention can get wrong.
        mistakes[1] = _Mistake(
            attend(scale=_scaled_by(lambda q, k, v: math.sqrt(q.shape[-3] * q.shape[-1]))),
            scale_note("sqrt(d_model)"),
            scale_hint,
        )
    return tuple(mistakes)


def _softmax_mistakes() -> tuple[_Mistake, ...]:
    keepdims = (
        "The max or the sum lost its reduced axis, so each entry is shifted or divided "
        "by another slice's value (or the shapes do not fit).",
        "Print the shape of your sum next to the shape of x: each entry must be divided "
        "by the sum of its own slice.",
    )
    return (
        _Mistake(_naive_softmax, *_OVERFLOW),
        _Mistake(
            _global_max_softmax,
            "NaN for a row whose scores are far below another row's (such as -1000 next "
            "to 1000): one constant is subtracted from the whole array.",
            "Which maximum keeps every slice's exp in range: the whole array's, or each "
            "slice's own?",
        ),
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
    return _attention_mistakes(multi_head=False) + _attention_output_mistakes(
        outputs, lambda *args, **kwargs: _attend(*args, **kwargs)
    )


_HEAD_BLOCK_HINT = (
    "Head h owns the contiguous block of features h*Dh:(h+1)*Dh of every token; revisit "
    "which numbers a reshape groups together."
)


def _split_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _split_no_transpose,
            "Shape (B, T, H, Dh): the features are split, but the head axis was not moved "
            "in front of T (split_heads without the transpose).",
            "Each head must see a (T, Dh) matrix of its own: where must H sit?",
        ),
        _Mistake(
            _split_reshape_only,
            "Right shape, wrong contents: (B, T, D) was reshaped straight to (B, H, T, Dh), "
            "so head 0 gets whole tokens instead of the first Dh features of every token.",
            _HEAD_BLOCK_HINT,
        ),
        _Mistake(
            _split_interleaved,
            "Right shape, but the heads are interleaved: head h gets features h, h+H, "
            "h+2H, ... instead of the block h*Dh:(h+1)*Dh.",
            "When the feature axis D is split into two axes, which of the two counts the "
            "heads: the outer one or the inner one?",
        ),
        _Mistake(
            _split_last_two_swapped,
            "Shape (B, H, Dh, T): the last two axes are swapped.",
            "Each head holds one Dh-wide row per token: (T, Dh), as q, k and v have.",
        ),
        _Mistake(
            _split_sizes_confused,
            "num_heads and head_dim are confused: the features are cut into groups of "
            "num_heads, giving shape (B, Dh, T, H).",
            "num_heads counts the groups; head_dim = D // num_heads is the size of each.",
        ),
    )


def _merge_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _merge_reshape_only,
            "Heads merged in the wrong order: (B, H, T, Dh) was reshaped straight to "
            "(B, T, D) without moving the head axis, so a token gets numbers of other "
            "tokens.",
            "Before concatenating, the H heads of one token must sit next to each other: "
            "which axes must be neighbours?",
        ),
        _Mistake(
            _merge_interleaved,
            "Heads merged in the wrong order: the features are interleaved, (Dh, H) "
            "instead of head 0's Dh features, then head 1's, ...",
            "merge_heads must undo split_heads exactly: head h goes back to features "
            "h*Dh:(h+1)*Dh.",
        ),
        _Mistake(
            _merge_no_reshape,
            "Shape (B, T, H, Dh): the heads were moved but not concatenated into one "
            "D-wide vector.",
            "The result is one vector of H * Dh features per token.",
        ),
        _Mistake(
            _merge_sum,
            "The heads are added together instead of concatenated (shape (B, T, Dh)).",
            "Concatenating keeps every head's features side by side: D = H * Dh.",
        ),
        _Mistake(
            _merge_mean,
            "The heads are averaged instead of concatenated (shape (B, T, Dh)).",
            "Concatenating keeps every head's features side by side: D = H * Dh.",
        ),
    )


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


def _mha_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            partial(_multi_head, project_output=False),
            "W_o forgotten: the output is the merged heads, without the output "
            "projection (merged @ W_o + b_o).",
            "Revisit MultiHead = Concat(head_1, ..., head_H) W_o: what mixes the heads?",
        ),
        _Mistake(
            _with_params(lambda p: {n: None for n in ("b_q", "b_k", "b_v", "b_o")}),
            "The biases b_q, b_k, b_v, b_o are not added.",
            "Each projection is a linear layer, x @ W + b.",
        ),
        _Mistake(
            _with_params(lambda p: {n: getattr(p, n).T for n in ("W_q", "W_k", "W_v", "W_o")}),
            "The weight matrices are used transposed (x @ W.T, PyTorch's layout).",
            "Revisit AttentionParams' convention: W has shape (D_in, D_out) and a layer "
            "computes x @ W + b.",
        ),
        _Mistake(
            _with_params(lambda p: {"W_k": p.W_q, "b_k": p.b_q, "W_v": p.W_q, "b_v": p.b_q}),
            "Keys and values are projected with W_q (and b_q) too.",
            "Queries, keys and values each have their own projection.",
        ),
        _Mistake(
            partial(_multi_head, split=_split_reshape_only),
            "split_heads without the transpose: (B, T, D) reshaped straight to "
            "(B, H, T, Dh), so each head gets whole tokens.",
            _HEAD_BLOCK_HINT,
        ),
        _Mistake(
            partial(_multi_head, split=_split_interleaved, merge=_merge_interleaved),
            "The heads are interleaved: head h gets features h, h+H, h+2H, ... instead "
            "of the block h*Dh:(h+1)*Dh.",
            _HEAD_BLOCK_HINT,
        ),
        _Mistake(
            partial(_multi_head, merge=_merge_reshape_only),
            "Heads merged in the wrong order: the context (B, H, T, Dh) was reshaped "
            "straight to (B, T, D) without moving the head axis.",
            "Before concatenating, the H heads of one token must sit next to each other.",
        ),
        _Mistake(
            partial(_multi_head, merge=_merge_interleaved),
            "Heads merged in the wrong order: the features are interleaved, (Dh, H) "
            "instead of head 0's Dh features, then head 1's, ...",
            "Merging must undo the split exactly: head h goes back to features h*Dh:(h+1)*Dh.",
        ),
        _Mistake(
            _one_head,
            "num_heads is ignored: one head of width D attends instead of H heads of width D / H.",
            "Each head computes its own attention weights over its own Dh features.",
        ),
        _Mistake(
            partial(_multi_head, average_weights=True),
            "The weights are averaged over the heads, (B, T, S); mha returns every head's "
            "weights, (B, H, T, S).",
            "The weights of each head are part of the result (a chapter draws them).",
        ),
        *_attention_mistakes(multi_head=True),
        *_attention_output_mistakes(("output", "weights"), _multi_head),
    )


# --------------------------------------------------------------------------- cases


def _label(tag: str = "", **arrays: Any) -> str:
    parts = [f"{name} {tuple(np.shape(a))}" for name, a in arrays.items()]
    return ", ".join(parts + ([tag] if tag else []))


def _mixed_mask(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """A random mask in which every row has an allowed and a blocked key."""
    mask = rng.random(shape) < 0.5
    rows = np.arange(shape[-2])
    mask[..., rows, rows % shape[-1]] = True
    mask[..., rows, (rows + 1) % shape[-1]] = False
    return mask


def _softmax_cases(rng: np.random.Generator) -> list[_Case]:
    def case(x: np.ndarray, tag: str = "", **kwargs: Any) -> _Case:
        return _Case(_label(tag, x=x), (x,), kwargs, loose=x.dtype == np.float32)

    some_inf = rng.normal(size=(3, 5))
    some_inf[0, 1] = some_inf[2, [0, 3]] = -np.inf
    empty_row = rng.normal(size=(3, 4))
    empty_row[1] = -np.inf
    large = np.array(
        [[1000.0, 999.0, 997.5, 990.0], [-1000.0, -998.0, -1001.0, -1003.0], [0.5, 1.0, -2.0, 3]]
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
        _sdpa_case(rng, (2,), (3, 4, 5, 2), tag="large scores such as 1000", query_scale=1e3),
        _sdpa_case(rng, (2,), (4, 3, 2, 3), empty, tag="a row with nothing to attend to"),
        _sdpa_case(
            rng, (1, 2), (3, 4, 6, 5), mha.padding_mask([3], max_len=4), "float32", 1, np.float32
        ),
    ]


def _split_cases(rng: np.random.Generator) -> list[_Case]:
    shapes = [((2, 3, 8), 2), ((1, 4, 6), 3), ((3, 5, 12), 4), ((2, 3, 6), 1), ((2, 4, 6), 6)]
    return [
        _Case(_label(f"num_heads={h}", x=x), (x, h))
        for x, h in ((rng.normal(size=shape), h) for shape, h in shapes)
    ]


def _merge_cases(rng: np.random.Generator) -> list[_Case]:
    shapes = [(2, 2, 3, 4), (1, 3, 4, 2), (3, 4, 5, 3), (2, 1, 3, 5), (2, 5, 2, 1)]
    arrays = [rng.normal(size=shape) for shape in shapes]
    return [_Case(_label(x=x), (x,)) for x in arrays]


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


def _params(rng: np.random.Generator, d_model: int, dtype: Any = np.float64) -> Any:
    """Seeded weights with non-zero biases (init's are zero, which would hide bias bugs)."""
    params = mha.AttentionParams.init(d_model, seed=int(rng.integers(1000)), dtype=dtype)
    biases = {
        name: (rng.normal(size=d_model) * 0.5).astype(dtype)
        for name in ("b_q", "b_k", "b_v", "b_o")
    }
    return dataclasses.replace(params, **biases)


def _mha_case(
    rng: np.random.Generator,
    sizes: tuple[int, int, int],
    num_heads: int,
    mask: np.ndarray | None = None,
    tag: str = "",
    scale: float = 1.0,
    dtype: Any = np.float64,
) -> _Case:
    batch, target_len, source_len = sizes
    d_model = 12
    query = (rng.normal(size=(batch, target_len, d_model)) * scale).astype(dtype)
    if source_len:
        key = (rng.normal(size=(batch, source_len, d_model)) * scale).astype(dtype)
        value = rng.normal(size=(batch, source_len, d_model)).astype(dtype)
    else:  # self-attention: the same array three times
        key = value = query
    kwargs = {} if mask is None else {"mask": mask}
    parts = [_label(query=query, key=key, value=value), f"num_heads={num_heads}", _label(**kwargs)]
    label = ", ".join(filter(None, [*parts, tag]))
    args = (query, key, value, _params(rng, d_model, dtype), num_heads)
    return _Case(label, args, kwargs, loose=dtype == np.float32)


def _mha_cases(rng: np.random.Generator) -> list[_Case]:
    empty = mha.causal_mask(4) & _mixed_mask(rng, 2, 1, 4, 4)
    empty[1, 0, 2] = False
    return [
        # S == head_dim == 4: a missing transpose still runs, and gives wrong numbers
        _mha_case(rng, (2, 3, 4), 3),
        _mha_case(rng, (2, 5, 0), 4),
        _mha_case(rng, (2, 5, 0), 3, mha.causal_mask(5), "causal"),
        _mha_case(rng, (2, 3, 6), 3, mha.padding_mask([6, 4]), "padding"),
        _mha_case(rng, (2, 3, 5), 3, tag="large scores such as 1000", scale=40.0),
        _mha_case(rng, (2, 4, 0), 2, empty, "a row with nothing to attend to"),
        _mha_case(rng, (1, 4, 0), 3, mha.causal_mask(4), "float32", dtype=np.float32),
    ]


_SHAPE_HINT = (
    "Print the shape of every intermediate on this input and compare with the shape "
    "comments in the chapter."
)

_EXERCISES: dict[str, _Exercise] = {
    "softmax": _Exercise(
        _softmax_cases,
        ("the result",),
        "any axis, -inf entries, an all -inf row, large scores, float32",
        _softmax_mistakes(),
        "Check on a small input, by hand, that each slice along axis sums to 1.",
    ),
    "scaled_dot_product_attention": _Exercise(
        _sdpa_cases,
        ("context", "weights"),
        "T != S, batches and heads, masks, a row with nothing to attend to, large scores, float32",
        _sdpa_mistakes(),
        "Compare your scores, weights and context with the formula "
        "softmax(q k^T / sqrt(Dh)) v, one step at a time, on this input.",
    ),
    "split_heads": _Exercise(
        _split_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 6 heads",
        _split_mistakes(),
        _SHAPE_HINT,
    ),
    "merge_heads": _Exercise(
        _merge_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 5 heads",
        _merge_mistakes(),
        "merge_heads must undo split_heads: check that merging a split gives back the input.",
    ),
    "causal_mask": _Exercise(
        _causal_cases,
        ("the mask",),
        "sizes 1 to 7",
        _causal_mistakes(),
        "Draw the mask for size 3 by hand: rows are queries, columns are keys.",
        exact=True,
    ),
    "padding_mask": _Exercise(
        _padding_cases,
        ("the mask",),
        "lengths, max_len, an empty sequence, tokens",
        _padding_mistakes(),
        "Write the mask for this input by hand: which positions are real tokens?",
        exact=True,
    ),
    "multi_head_attention": _Exercise(
        _mha_cases,
        ("output", "weights"),
        "T != S, 2 to 4 heads, masks, a row with nothing to attend to, large scores, float32",
        _mha_mistakes(),
        "Compare each intermediate with mha.multi_head_attention_steps on this input "
        "(q, q_heads, scores, ..., merged, output).",
    ),
}


# --------------------------------------------------------------------------- running


def _copy(arg: Any) -> Any:
    if isinstance(arg, np.ndarray):
        return arg.copy()
    if isinstance(arg, mha.AttentionParams):
        fields = dataclasses.fields(arg)
        return dataclasses.replace(arg, **{f.name: _copy(getattr(arg, f.name)) for f in fields})
    return arg


def _first_changed(names: list[str], before: list[Any], after: list[Any]) -> str | None:
    """The name of the first argument whose contents differ from the original's."""
    for name, old, new in zip(names, before, after, strict=True):
        if isinstance(old, mha.AttentionParams):
            fields = [f.name for f in dataclasses.fields(old)]
            olds = [getattr(old, f) for f in fields]
            news = [getattr(new, f) for f in fields]
            changed = _first_changed([f"{name}.{f}" for f in fields], olds, news)
            if changed:
                return changed
        elif isinstance(old, np.ndarray) and not (
            old.shape == np.shape(new) and np.array_equal(old, new, equal_nan=True)
        ):
            return name
    return None


def _as_arrays(result: Any, count: int) -> tuple[tuple[np.ndarray, ...] | None, str | None]:
    """The returned arrays, or a sentence saying why the result is not arrays."""
    if result is None:
        return None, "returned None (is a return statement missing?)"
    several = isinstance(result, tuple) or (count > 1 and isinstance(result, list))
    arrays = []
    for item in result if several else (result,):
        try:
            array = np.asarray(item)
        except Exception:  # e.g. a ragged list
            array = np.asarray(None)
        if array.dtype.kind not in "biuf":
            what = "None" if item is None else type(item).__name__
            return None, f"returned {what} where an array of numbers was expected"
        arrays.append(array)
    return tuple(arrays), None


def _run(
    func: Callable[..., Any], case: _Case, count: int, signature: inspect.Signature
) -> _Outcome:
    """Call ``func`` on copies of the case's arguments; never lets a warning escape."""
    args = [_copy(a) for a in case.args]
    kwargs = {name: _copy(a) for name, a in case.kwargs.items()}
    try:
        with np.errstate(all="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = func(*args, **kwargs)
    except Exception as error:
        return _Outcome(error=error)
    before = signature.bind(*case.args, **case.kwargs).arguments
    after = signature.bind(*args, **kwargs).arguments
    changed = _first_changed(list(before), list(before.values()), list(after.values()))
    value, problem = _as_arrays(result, count)
    return _Outcome(value=value, problem=problem, changed=changed)


def _agree(
    got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], exact: bool, loose: bool
) -> bool:
    if len(got) != len(want):
        return False
    rtol, atol = _TOLERANCE[loose]
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return False
        if exact:
            if (g.dtype == np.bool_) != (w.dtype == np.bool_) or not np.array_equal(g, w):
                return False
        elif not np.allclose(g.astype(np.float64), w, rtol=rtol, atol=atol, equal_nan=True):
            return False
    return True


def _same_behaviour(
    got: list[_Outcome], model: list[_Outcome], exercise: _Exercise, cases: list[_Case]
) -> bool:
    """Whether ``got`` raises where ``model`` raises and agrees with it everywhere else."""
    compared = False
    for g, m, case in zip(got, model, cases, strict=True):
        if g.error is not None or m.error is not None:
            if g.error is None or m.error is None:
                return False
        elif g.value is None or not _agree(g.value, m.value, exercise.exact, case.loose):
            return False
        else:
            compared = True
    return compared


def _index(mask: np.ndarray) -> str:
    return str(tuple(int(i) for i in np.argwhere(mask)[0]))


def _difference(
    got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], case: _Case, ex: _Exercise
) -> str:
    """How the first wrong output differs from mha's, without showing mha's values."""
    if len(got) != len(want):
        expected = "one array" if len(want) == 1 else f"({', '.join(ex.outputs)})"
        returned = "one array" if len(got) == 1 else f"{len(got)} arrays"
        return f"returned {returned} where mha returns {expected}"
    for name, g, w in zip(ex.outputs, got, want, strict=True):
        if _agree((g,), (w,), ex.exact, case.loose):
            continue
        if g.shape != w.shape:
            return f"{name} has shape {g.shape}, expected {w.shape}"
        if ex.exact:
            if g.dtype != np.bool_:
                return f"{name} has dtype {g.dtype}, expected a boolean mask"
            wrong = g != w
            return (
                f"{name} differs from mha's in {int(wrong.sum())} of {w.size} entries "
                f"(first at index {_index(wrong)})"
            )
        g = g.astype(np.float64)
        unexpected = ~np.isfinite(g) & np.isfinite(w)
        if unexpected.any():
            value = g[tuple(np.argwhere(unexpected)[0])]
            word = "NaN" if np.isnan(value) else f"{value}"
            return f"{name} has {word} where a number was expected (at {_index(unexpected)})"
        deviation = np.where(np.isfinite(w), np.abs(g - w), 0.0)
        where = _index(deviation == deviation.max())
        return f"{name} differs from mha's by up to {deviation.max():.2g} (at {where})"
    raise AssertionError("called with outputs that agree")  # pragma: no cover


def _say(*lines: str) -> None:
    for line in lines:
        print(textwrap.fill(line, _WIDTH, subsequent_indent="  ", break_on_hyphens=False))


def _exercise(name: str) -> _Exercise:
    if name not in _EXERCISES:
        raise ValueError(f"unknown exercise {name!r}; known: {', '.join(_EXERCISES)}")
    return _EXERCISES[name]


def names() -> list[str]:
    """The names :func:`check` accepts, in the order the book teaches them.

    Returns
    -------
    list of str
        Each is the name of the ``mha`` function the learner's function must behave
        like (same arguments, same results).
    """
    return list(_EXERCISES)


def check(name: str, candidate: Callable[..., Any]) -> bool:
    """Run ``candidate`` as ``mha.<name>`` would be run and say whether it is right.

    The candidate is called on fixed inputs (a fixed seed) covering the edge cases
    listed in the pass line. Its results are compared with ``mha``'s (float64:
    ``rtol=1e-6, atol=1e-9``; float32: ``rtol=1e-4, atol=1e-5``; masks: exactly, and
    boolean). Any correct implementation passes: loops, einsum, another order of
    operations.

    Prints one line for a pass; otherwise the first failing case (its input shapes,
    and the shape, NaN or largest deviation that is wrong, or the exception raised)
    followed, when the candidate behaves like a known mistake, by that diagnosis and
    a hint. A candidate that raises ``NotImplementedError`` is "not implemented yet".
    Inputs are passed as copies; changing one in place is reported as a mistake.

    Parameters
    ----------
    name : str
        One of :func:`names`, e.g. ``"softmax"`` or ``"multi_head_attention"``.
    candidate : callable
        The learner's function, with the signature of ``mha.<name>``.

    Returns
    -------
    bool
        True if every case agrees with ``mha``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :func:`names`.
    TypeError
        If ``candidate`` is not callable.
    """
    exercise = _exercise(name)
    if not callable(candidate):
        raise TypeError(f"candidate must be a function, got {type(candidate).__name__}")
    reference = getattr(mha, name)
    signature = inspect.signature(reference)
    count = len(exercise.outputs)
    cases = exercise.cases(np.random.default_rng(_SEED))
    run = partial(_run, count=count, signature=signature)

    first = run(candidate, cases[0])
    if isinstance(first.error, NotImplementedError):
        _say(f"{name}: not implemented yet.")
        return False
    got = [first] + [run(candidate, case) for case in cases[1:]]
    want = [run(reference, case) for case in cases]
    broken = next((w.error for w in want if w.value is None), None)
    if broken is not None:  # a bug in this module's cases, not in the candidate
        raise RuntimeError(f"mha.{name} failed on a checker case: {broken!r}")
    failing = [
        i
        for i, (g, w, case) in enumerate(zip(got, want, cases, strict=True))
        if g.value is None
        or g.changed is not None
        or not _agree(g.value, w.value, exercise.exact, case.loose)
    ]
    if not failing:
        _say(f"{name}: correct on {len(cases)} cases ({exercise.covers}).")
        return True

    i = failing[0]
    g, w, case = got[i], want[i], cases[i]
    where = f"{name}: case {i + 1} of {len(cases)} ({case.label})"
    if isinstance(g.error, NotImplementedError):
        _say(f"{where} is not implemented yet (NotImplementedError).")
        return False
    if g.changed is not None:
        _say(
            f"{where}: your function changed its argument {g.changed} in place.",
            "Hint: the caller still needs its array; an in-place operation (such as -=, "
            "/= or out=) on an argument writes into the caller's data.",
        )
        return False
    if g.error is not None:
        message = (str(g.error).strip().splitlines() or [""])[0][:160]
        failure = f"raised {type(g.error).__name__}: {message}"
    else:
        failure = g.problem or _difference(g.value, w.value, case, exercise)
    models = [[run(m.model, c) for c in cases] for m in exercise.mistakes]
    matched = next(
        (
            m
            for m, outs in zip(exercise.mistakes, models, strict=True)
            if _same_behaviour(got, outs, exercise, cases)
        ),
        None,
    )
    if matched is None and g.value is not None:  # several mistakes: name the one seen here
        matched = next(
            (
                m
                for m, outs in zip(exercise.mistakes, models, strict=True)
                if outs[i].value is not None
                and _agree(g.value, outs[i].value, exercise.exact, case.loose)
            ),
            None,
        )
    if matched is None:
        _say(f"{where}: {failure}.", f"Hint: {exercise.generic_hint}")
    else:
        _say(f"{where}: {failure}.", f"Likely mistake: {matched.what}", f"Hint: {matched.hint}")
    return False
