"""The checkers' machinery: records, running a candidate, comparing, reporting.

Shared by every exercise. A topic module (``_softmax``, ``_attention``, ``_heads``,
``_masks``, ``_multi_head_attention``) supplies its cases and mistake models as the
records below; :func:`_judge` runs them and prints the verdict. Nothing here is for
learners: they call :func:`mha.exercises.check`.
"""

from __future__ import annotations

import dataclasses
import inspect
import textwrap
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

import mha

_WIDTH = 66  # fits the output box inside a collapsed solution (about 69 characters)
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
class _Returns:
    """The type an exercise's text asks the result to have ("Return a NumPy boolean
    array", "as a float"): any other type is a mistake even when its numbers are right."""

    types: tuple[type, ...]
    words: str  # what the exercise asks for, e.g. "a NumPy boolean array"
    hint: str


@dataclass(frozen=True)
class _Exercise:
    cases: Callable[[np.random.Generator], list[_Case]]
    outputs: tuple[str, ...]  # names of the returned arrays, in mha's order
    covers: str  # what the cases exercise, for the pass line
    mistakes: tuple[_Mistake, ...]
    generic_hint: str
    exact: bool = False  # masks: equal entries and a boolean dtype
    # the correct function, when mha has none of this name (a step mha does inside a
    # larger function, such as one decoding step); None: mha.<name>
    reference: Callable[..., Any] | None = None
    # mistakes that raise on every case, told by the error they raise: (fragments of
    # the message, any of which names it; the diagnosis). Judged after the models.
    raised: tuple[tuple[tuple[str, ...], _Mistake], ...] = ()
    # the type the exercise's text asks for; None: any array-like of numbers
    returns: _Returns | None = None
    # a float result must be as precise as mha's (float32 for float64 is a mistake);
    # False where the exercise allows any float ("a Python or NumPy float")
    precise: bool = True
    # the chapter whose exercises this checker checks (``04_multi_head_attention``): a
    # checker is practised by its own chapter only (tests/test_workbook.py)
    chapter: str = field(kw_only=True)


@dataclass(frozen=True)
class _Outcome:
    """What one call did: returned arrays, raised, returned something else, or wrote
    into an argument."""

    value: tuple[np.ndarray, ...] | None = None
    error: Exception | None = None
    problem: str | None = None
    changed: str | None = None


# --------------------------------------------------------------------------- wording


def _plural(name: str) -> bool:
    """Whether an output's name is plural ("weights", "the slopes"; not "the loss")."""
    return name.endswith("s") and not name.endswith("ss")


def _has(name: str) -> str:
    return f"{name} {'have' if _plural(name) else 'has'}"


def _differs(name: str) -> str:
    return f"{name} {'differ' if _plural(name) else 'differs'}"


# A result in a float type with fewer bits than mha's (float32 where mha's is float64).
_LOWER_PRECISION = (
    "The result comes back in a smaller float type than mha's (float32 instead of "
    "float64, say): it keeps about 7 significant digits instead of 16.",
    "Keep the input's dtype, or the one the exercise asks for: look for a "
    "dtype=np.float32 or an .astype(...) that lowers it.",
)


def _lower_precision(got: np.ndarray, want: np.ndarray) -> bool:
    """Whether ``got`` is a float with fewer bits than mha's float ``want``."""
    return (got.dtype.kind == "f" and want.dtype.kind == "f"
            and got.dtype.itemsize < want.dtype.itemsize)


# --------------------------------------------------------------------------- case helpers


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
    func: Callable[..., Any], case: _Case, count: int, signature: inspect.Signature,
    returns: _Returns | None = None,
) -> _Outcome:
    """Call ``func`` on copies of the case's arguments; never lets a warning escape.

    A result of another type than ``returns`` asks for keeps its arrays (so that its
    numbers can still be judged) and gets a ``problem`` naming its type."""
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
    if problem is None and returns is not None and not isinstance(result, returns.types):
        problem = f"returned {type(result).__name__} where the exercise asks for {returns.words}"
    return _Outcome(value=value, problem=problem, changed=changed)


def _agree(
    got: tuple[np.ndarray, ...], want: tuple[np.ndarray, ...], exact: bool, loose: bool,
    precise: bool = False,
) -> bool:
    """Same shapes and values (masks: equal and boolean); ``precise``: and no float
    of fewer bits than ``want``'s."""
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
        elif precise and _lower_precision(g, w):
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
            if ex.precise and _lower_precision(g, w):
                verb = "have" if _plural(name) else "has"
                return f"{name} {verb} dtype {g.dtype} where mha's {verb} {w.dtype}"
            continue
        if g.shape != w.shape:
            return f"{_has(name)} shape {g.shape}, expected {w.shape}"
        if ex.exact:
            if g.dtype != np.bool_:
                return f"{_has(name)} dtype {g.dtype}, expected a boolean mask"
            wrong = g != w
            return (
                f"{_differs(name)} from mha's in {int(wrong.sum())} of {w.size} entries "
                f"(first at index {_index(wrong)})"
            )
        g = g.astype(np.float64)
        unexpected = ~np.isfinite(g) & np.isfinite(w)
        if unexpected.any():
            value = g[tuple(np.argwhere(unexpected)[0])]
            word = "NaN" if np.isnan(value) else f"{value}"
            return f"{_has(name)} {word} where a number was expected (at {_index(unexpected)})"
        deviation = np.where(np.isfinite(w), np.abs(g - w), 0.0)
        where = _index(deviation == deviation.max())
        return f"{_differs(name)} from mha's by up to {deviation.max():.2g} (at {where})"
    raise AssertionError("called with outputs that agree")  # pragma: no cover


def _say(*lines: str) -> None:
    for line in lines:
        print(textwrap.fill(line, _WIDTH, subsequent_indent="  ", break_on_hyphens=False))


# --------------------------------------------------------------------------- judging


def _judge(
    name: str, candidate: Callable[..., Any], exercise: _Exercise, cases: list[_Case]
) -> bool:
    """Run ``candidate`` and ``mha.<name>`` on ``cases``; print the verdict and return it.

    The work of :func:`mha.exercises.check` once the name and the candidate are valid.
    """
    reference = exercise.reference or getattr(mha, name)
    signature = inspect.signature(reference)
    count = len(exercise.outputs)
    run = partial(_run, count=count, signature=signature, returns=exercise.returns)

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
        or g.problem is not None
        or g.changed is not None
        or not _agree(g.value, w.value, exercise.exact, case.loose, exercise.precise)
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
                # a model right on this case does not explain a failure here (a dtype)
                and not _agree(outs[i].value, w.value, exercise.exact, case.loose)
            ),
            None,
        )
    if matched is None and g.error is not None:
        text = str(g.error)
        matched = next(
            (m for fragments, m in exercise.raised if any(f in text for f in fragments)), None
        )
    if matched is None and g.value is not None and g.problem is not None:
        returns = exercise.returns  # a type the exercise does not ask for
        assert returns is not None
        matched = _Mistake(candidate, f"The result is not {returns.words}, which the "
                           "exercise asks for and a caller may rely on.", returns.hint)
    elif matched is None and g.value is not None and g.error is None:
        if _agree(g.value, w.value, exercise.exact, case.loose):  # only the dtype is wrong
            matched = _Mistake(candidate, *_LOWER_PRECISION)
    if matched is None:
        _say(f"{where}: {failure}.", f"Hint: {exercise.generic_hint}")
    else:
        _say(f"{where}: {failure}.", f"Likely mistake: {matched.what}", f"Hint: {matched.hint}")
    return False
