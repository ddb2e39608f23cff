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

from collections.abc import Callable
from typing import Any

import numpy as np

from ._attention import _sdpa_cases, _sdpa_mistakes
from ._core import _Exercise, _judge
from ._heads import _merge_cases, _merge_mistakes, _split_cases, _split_mistakes
from ._inference import _bytes_cases, _bytes_mistakes, _window_cases, _window_mistakes
from ._masks import _causal_cases, _causal_mistakes, _padding_cases, _padding_mistakes
from ._multi_head_attention import _mha_cases, _mha_mistakes
from ._positions import _rope_cases, _rope_mistakes, _slopes_cases, _slopes_mistakes
from ._softmax import _softmax_cases, _softmax_mistakes

# Layout: this file holds the public API and the registry. _core.py runs a candidate,
# compares it with mha and prints the report; each topic module holds the cases and
# mistake models of its exercises (_softmax, _attention, _heads, _masks,
# _multi_head_attention, _inference, _positions). Like the specification, the package
# imports only NumPy and the top-level names of mha (mha.softmax, ...), never torch or
# matplotlib.

__all__ = ["Verdict", "check", "names"]

_SEED = 14  # fixed: every run sees the same inputs, so a report can be reproduced


# --------------------------------------------------------------------------- registry

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
    "sliding_window_mask": _Exercise(
        _window_cases,
        ("the mask",),
        "windows of 1 to 9, a window wider than the sequence, more keys than queries",
        _window_mistakes(),
        "Draw the mask for size 5, window 2 by hand: rows are queries, columns keys.",
        exact=True,
    ),
    "kv_cache_bytes": _Exercise(
        _bytes_cases,
        ("the size",),
        "published shapes, batches, float32, windows shorter and longer than the context",
        _bytes_mistakes(),
        "Count by hand for 1 layer, 1 head of 1, 1 position: what is stored, how big?",
    ),
    "apply_rope": _Exercise(
        _rope_cases,
        ("the rotated x",),
        "one pair, batches and heads, positions after a cache, another base, float32",
        _rope_mistakes(),
        "Rotate x (1, 1, 2) = [[[1, 0]]] at position 1 by hand: the result is "
        "(cos 1, sin 1).",
    ),
    "alibi_slopes": _Exercise(
        _slopes_cases,
        ("the slopes",),
        "powers of two from 1 to 16 heads, and 3, 6 and 12 heads",
        _slopes_mistakes(),
        "Write the slopes for 8 heads by hand, then for 4, then fill in 6.",
    ),
}


# --------------------------------------------------------------------------- public API


class Verdict:
    """What :func:`check` found: true when every case agreed with ``mha``.

    Use it as a bool (``if exercises.check(...)``, ``assert exercises.check(...)``).
    A notebook shows nothing for it when ``check`` is the last line of a cell: the
    report is already printed, and a bare ``True`` under it would only repeat it.
    """

    def __init__(self, passed: bool):
        self.passed = bool(passed)

    def __bool__(self) -> bool:
        return self.passed

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Verdict | bool):
            return self.passed == bool(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # equal to True/False, so not hashable

    def __repr__(self) -> str:
        return f"Verdict(passed={self.passed})"

    def _ipython_display_(self) -> None:
        """IPython calls this instead of showing the repr: show nothing."""


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


def check(name: str, candidate: Callable[..., Any]) -> Verdict:
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
    Verdict
        True (as a bool) if every case agrees with ``mha``; a notebook displays
        nothing for it, since the report above says it all.

    Raises
    ------
    ValueError
        If ``name`` is not one of :func:`names`, or ``candidate`` is not callable.
    """
    exercise = _exercise(name)
    if not callable(candidate):
        raise ValueError(f"candidate must be a function, got {type(candidate).__name__}")
    cases = exercise.cases(np.random.default_rng(_SEED))
    return Verdict(_judge(name, candidate, exercise, cases))
