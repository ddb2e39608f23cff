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

from ._core import _Exercise, _judge
from ._registry import _EXERCISES

# Layout: this file holds the public API; _registry.py the registry, whose entries each
# name the chapter that owns them (the one whose exercises practise that checker, and no
# other). _core.py runs a candidate, compares it with mha and prints the report; each
# topic module holds the cases and mistake models of its exercises (_softmax,
# _attention, _heads, _masks, _multi_head_attention, _inference, _positions, _layers,
# _why, _training, _tiles, and one module per later chapter). An exercise whose
# function mha does not export names its reference (a step mha does inside a larger
# function, such as one decoding step). Like the specification, the package imports
# only NumPy and the top-level names of mha (mha.softmax, ...), never torch or
# matplotlib.

__all__ = ["Verdict", "chapter_of", "check", "names"]

_SEED = 14  # fixed: every run sees the same inputs, so a report can be reproduced

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


def names(chapter: str | None = None) -> list[str]:
    """The names :func:`check` accepts, in the order the book teaches them.

    Parameters
    ----------
    chapter : str, optional
        A chapter's name (``"04_multi_head_attention"``): only the checkers it owns,
        those its own exercises practise. None (the default): every checker.

    Returns
    -------
    list of str
        Each is the name of the ``mha`` function the learner's function must behave
        like (same arguments, same results).
    """
    return [name for name, exercise in _EXERCISES.items()
            if chapter is None or exercise.chapter == chapter]


def chapter_of(name: str) -> str:
    """The chapter whose exercises practise the checker ``name``, e.g.
    ``chapter_of("split_heads") == "04_multi_head_attention"``.

    Raises
    ------
    ValueError
        If ``name`` is not one of :func:`names`.
    """
    return _exercise(name).chapter


def check(name: str, candidate: Callable[..., Any]) -> Verdict:
    """Run ``candidate`` as ``mha.<name>`` would be run and say whether it is right.

    The candidate is called on fixed inputs (a fixed seed) covering the edge cases
    listed in the pass line. Its results are compared with ``mha``'s (float64:
    ``rtol=1e-6, atol=1e-9``; float32: ``rtol=1e-4, atol=1e-5``; masks: exactly, and
    boolean). A float result with fewer bits than ``mha``'s (float32 for float64) is
    wrong, and where an exercise names the type of its result ("a NumPy boolean
    array", "a float") the result must have that type. Any correct implementation
    passes: loops, einsum, another order of operations.

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
