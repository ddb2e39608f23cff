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
from ._ch10_compressed_cache import (
    _absorbed_query,
    _absorbed_query_cases,
    _absorbed_query_mistakes,
    _quantize_per_channel,
    _quantize_per_channel_cases,
    _quantize_per_channel_mistakes,
)
from ._ch12_how_attention_learns import (
    _head_backward,
    _head_backward_cases,
    _head_backward_mistakes,
    _softmax_backward_cases,
    _softmax_backward_mistakes,
    _tile_backward,
    _tile_backward_cases,
    _tile_backward_mistakes,
)
from ._core import _Exercise, _judge, _Returns
from ._heads import _merge_cases, _merge_mistakes, _split_cases, _split_mistakes
from ._inference import (
    _bytes_cases,
    _bytes_mistakes,
    _decode_cases,
    _decode_mistakes,
    _decode_raised,
    _decode_step,
    _repeat_cases,
    _repeat_kv_heads,
    _repeat_mistakes,
    _window_cases,
    _window_mistakes,
)
from ._layers import _add_and_norm, _norm_cases, _norm_mistakes
from ._masks import (
    _causal_cases,
    _causal_mistakes,
    _padding_cases,
    _padding_mistakes,
    _target_cases,
    _target_mask,
    _target_mistakes,
    _torch_mask_cases,
    _torch_mask_mistakes,
)
from ._multi_head_attention import (
    _cross_attention,
    _cross_cases,
    _cross_mistakes,
    _mha_cases,
    _mha_mistakes,
    _mha_raised,
)
from ._positions import (
    _rope_cases,
    _rope_mistakes,
    _sinusoid_cases,
    _sinusoid_mistakes,
    _slopes_cases,
    _slopes_mistakes,
)
from ._softmax import _softmax_cases, _softmax_mistakes
from ._tiles import _merge_cases as _tile_cases
from ._tiles import _merge_mistakes as _tile_mistakes
from ._tiles import _merge_tiles
from ._training import _loss_cases, _loss_mistakes, _sequence_loss
from ._why import (
    _attention_entropy,
    _entropy_cases,
    _entropy_mistakes,
    _score_std,
    _std_cases,
    _std_mistakes,
)

# Layout: this file holds the public API and the registry, whose entries each name the
# chapter that owns them (the one whose exercises practise that checker, and no other).
# _core.py runs a candidate, compares it with mha and prints the report; each topic
# module holds the cases and mistake models of its exercises (_softmax, _attention,
# _heads, _masks, _multi_head_attention, _inference, _positions, _layers, _why,
# _training, _tiles). An exercise whose function mha does not export names its
# reference (a step mha does inside a larger function, such as one decoding step). Like
# the specification, the package imports only NumPy and the top-level names of mha
# (mha.softmax, ...), never torch or matplotlib.

__all__ = ["Verdict", "chapter_of", "check", "names"]

_SEED = 14  # fixed: every run sees the same inputs, so a report can be reproduced


# --------------------------------------------------------------------------- registry

_SHAPE_HINT = (
    "Print the shape of every intermediate on this input and compare with the shape "
    "comments in the chapter."
)

# The types the exercises' texts ask for ("Return a NumPy boolean array", "as a float").
_NUMPY_FLOAT64 = _Returns(
    (np.ndarray,),
    "a NumPy float64 array",
    "np.array(values, dtype=np.float64) turns a list (or a tensor) into one.",
)

_EXERCISES: dict[str, _Exercise] = {
    "causal_mask": _Exercise(
        _causal_cases,
        ("the mask",),
        "sizes 1 to 7",
        _causal_mistakes(),
        "Draw the mask for size 3 by hand: rows are queries, columns are keys.",
        exact=True,
        chapter="01_notation",
    ),
    "padding_mask": _Exercise(
        _padding_cases,
        ("the mask",),
        "lengths as an array or a list, max_len, an empty sequence, tokens",
        _padding_mistakes(),
        "Write the mask for this input by hand: which positions are real tokens?",
        exact=True,
        chapter="01_notation",
    ),
    "softmax": _Exercise(
        _softmax_cases,
        ("the result",),
        "any axis, -inf entries, an all -inf row, large scores, float32",
        _softmax_mistakes(),
        "Check on a small input, by hand, that each slice along axis sums to 1.",
        chapter="02_overview",
    ),
    "scaled_dot_product_attention": _Exercise(
        _sdpa_cases,
        ("context", "weights"),
        "T != S, batches and heads, masks, a row with nothing to attend to, large scores, float32",
        _sdpa_mistakes(),
        "Compare your scores, weights and context with the formula "
        "softmax(q k^T / sqrt(Dh)) v, one step at a time, on this input.",
        chapter="02_overview",
    ),
    "sinusoidal_positional_encoding": _Exercise(
        _sinusoid_cases,
        ("the table",),
        "1 to 50 positions, D from 2 to 32",
        _sinusoid_mistakes(),
        "Write row 1 for D = 4 by hand: (sin 1, cos 1, sin 0.01, cos 0.01).",
        returns=_NUMPY_FLOAT64,
        chapter="03_step_by_step",
    ),
    "add_and_norm": _Exercise(
        _norm_cases,
        ("the result",),
        "batches, D from 4 to 16, another eps, float32",
        _norm_mistakes(),
        "Compute one token by hand: add, subtract the mean of its D features, divide "
        "by sqrt(variance + eps), then gamma * ... + beta.",
        reference=_add_and_norm,
        chapter="03_step_by_step",
    ),
    "split_heads": _Exercise(
        _split_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 6 heads",
        _split_mistakes(),
        _SHAPE_HINT,
        chapter="04_multi_head_attention",
    ),
    "merge_heads": _Exercise(
        _merge_cases,
        ("the result",),
        "1 to 3 sequences, 1 to 5 heads",
        _merge_mistakes(),
        "merge_heads must undo split_heads: check that merging a split gives back the input.",
        chapter="04_multi_head_attention",
    ),
    "multi_head_attention": _Exercise(
        _mha_cases,
        ("output", "weights"),
        "T != S, 2 to 4 heads, masks, biases None, a row with nothing to attend to, large "
        "scores, float32",
        _mha_mistakes(),
        "Compare each intermediate with mha.multi_head_attention_steps on this input "
        "(q, q_heads, scores, ..., merged, output).",
        raised=_mha_raised(),
        chapter="04_multi_head_attention",
    ),
    "cross_attention": _Exercise(
        _cross_cases,
        ("output", "weights"),
        "a memory narrower, as wide as and wider than x, T != S, source padding, "
        "biases None, float32",
        _cross_mistakes(),
        "Print the shape of q, k, v and the scores on this input: queries (B, T, D) "
        "from x, keys and values (B, S, D) from memory.",
        reference=_cross_attention,
        chapter="05_three_attentions",
    ),
    "to_torch_attn_mask": _Exercise(
        _torch_mask_cases,
        ("the attn_mask",),
        "(T, S) masks, a mask per head, a mask shared by the heads",
        _torch_mask_mistakes(),
        "Convert a (1, 2, 2, 3) mask by hand: which (T, S) slice is entry b*H + h?",
        exact=True,
        returns=_Returns(
            (np.ndarray,),
            "a NumPy boolean array",
            "Build the mask with NumPy from NumPy arrays; torch.from_numpy turns it into "
            "the tensor nn.MultiheadAttention takes when it is needed.",
        ),
        chapter="05_three_attentions",
    ),
    "score_std": _Exercise(
        _std_cases,
        ("the standard deviation",),
        "head_dim from 9 to 1024, equal and unequal q_std and k_std",
        _std_mistakes(),
        "Find the variance of one product q_i k_i, then of the sum of Dh of them.",
        reference=_score_std,
        returns=_Returns(
            (float, np.floating),
            "a Python or NumPy float",
            "float(x) turns a 0-d array or a one-element tensor into a Python float.",
        ),
        precise=False,  # "a Python or NumPy float": np.float32 too
        chapter="06_why_attention",
    ),
    "attention_entropy": _Exercise(
        _entropy_cases,
        ("the entropy",),
        "batches and heads, uniform and one-hot rows, blocked keys of weight 0",
        _entropy_mistakes(),
        "Compute a uniform row of 4 keys by hand: its entropy is ln 4.",
        reference=_attention_entropy,
        chapter="06_why_attention",
    ),
    "sequence_loss": _Exercise(
        _loss_cases,
        ("the loss",),
        "padded and unpadded batches, another pad_id, label smoothing, large logits",
        _loss_mistakes(),
        "Compute the loss of one position by hand: -log softmax(logits)[target].",
        reference=_sequence_loss,
        returns=_Returns(
            (float, np.floating),
            "a float",
            "float(x) turns a NumPy scalar, a 0-d array or a one-element tensor into a "
            "Python float.",
        ),
        chapter="07_tiny_translator",
    ),
    "target_mask": _Exercise(
        _target_cases,
        ("the mask",),
        "padded sentences, another pad_id, one token, no padding",
        _target_mistakes(),
        "Draw the mask of a sentence of 4 tokens whose last one is a pad.",
        exact=True,
        reference=_target_mask,
        chapter="07_tiny_translator",
    ),
    "decode_step": _Exercise(
        _decode_cases,
        ("context", "k_cache", "v_cache"),
        "an empty cache, 1 to 6 cached positions, 1 to 4 heads, large scores, float32",
        _decode_mistakes(),
        "Print the shapes of the grown caches, (B, H, S + 1, Dh), and compare the "
        "context with a full pass over all S + 1 positions.",
        reference=_decode_step,
        raised=_decode_raised(),
        chapter="08_inference",
    ),
    "repeat_kv_heads": _Exercise(
        _repeat_cases,
        ("the result",),
        "groups of 2 and 3, multi-query, multi-head, an empty cache, float32",
        _repeat_mistakes(),
        "Write which key/value head each query head reads for H = 6, Hkv = 2.",
        reference=_repeat_kv_heads,
        chapter="08_inference",
    ),
    "sliding_window_mask": _Exercise(
        _window_cases,
        ("the mask",),
        "windows of 1 to 9, a window wider than the sequence, more keys than queries",
        _window_mistakes(),
        "Draw the mask for size 5, window 2 by hand: rows are queries, columns keys.",
        exact=True,
        chapter="08_inference",
    ),
    "kv_cache_bytes": _Exercise(
        _bytes_cases,
        ("the size",),
        "published shapes, batches, float32, windows shorter and longer than the context",
        _bytes_mistakes(),
        "Count by hand for 1 layer, 1 head of 1, 1 position: what is stored, how big?",
        chapter="08_inference",
    ),
    "apply_rope": _Exercise(
        _rope_cases,
        ("the rotated x",),
        "one pair, batches and heads, positions after a cache, positions as a list, "
        "another base, float32",
        _rope_mistakes(),
        "Rotate x (1, 1, 2) = [[[1, 0]]] at position 1 by hand: the result is "
        "(cos 1, sin 1).",
        chapter="09_positions_and_tiles",
    ),
    "alibi_slopes": _Exercise(
        _slopes_cases,
        ("the slopes",),
        "powers of two from 1 to 16 heads, and 3, 6 and 12 heads",
        _slopes_mistakes(),
        "Write the slopes for 8 heads by hand, then for 4, then fill in 6.",
        returns=_NUMPY_FLOAT64,
        chapter="09_positions_and_tiles",
    ),
    "merge_tiles": _Exercise(
        _tile_cases,
        ("m", "l", "a"),
        "batches and heads, an empty tile, a row with nothing to attend to, large scores",
        _tile_mistakes(),
        "Merge by hand two tiles of one key each, scores 1 and 3: m' = 3, and "
        "l' = e^(1 - 3) + 1.",
        reference=_merge_tiles,
        chapter="09_positions_and_tiles",
    ),
    "absorbed_query": _Exercise(
        _absorbed_query_cases,
        ("the absorbed query",),
        "one decoding step, a batch, one head, Rkv smaller than Dn, float32",
        _absorbed_query_mistakes(),
        "For one head, compare (q_in @ W_uq_h) @ (latent @ W_uk_h).T with your "
        "query @ latent.T on a small random latent.",
        reference=_absorbed_query,
        chapter="10_compressed_cache",
    ),
    "quantize_per_channel": _Exercise(
        _quantize_per_channel_cases,
        ("the dequantised keys",),
        "8, 4, 3 and 2 bits, an outlier channel, a channel of zeros, float32",
        _quantize_per_channel_mistakes(),
        "Quantise one channel of 3 tokens, [1, -2, 0.5], to 2 bits by hand: scale 2, "
        "codes 0, -1, 0.",
        reference=_quantize_per_channel,
        chapter="10_compressed_cache",
    ),
    "softmax_backward": _Exercise(
        _softmax_backward_cases,
        ("dz",),
        "any axis, blocked entries, a row with nothing allowed, one-hot rows, float32",
        _softmax_backward_mistakes(),
        "Compute dz for one row of two weights by hand: build J = diag(p) - p p^T and "
        "multiply it by dp.",
        chapter="12_how_attention_learns",
    ),
    "head_backward": _Exercise(
        _head_backward_cases,
        ("dq", "dk", "dv"),
        "T = S and T != S, batches and heads, causal and padding weights, a row with "
        "nothing allowed, Dv != Dh, float32",
        _head_backward_mistakes(),
        "Print the shape of each intermediate (dv, dp, dz, dq, dk) on this input and "
        "compare with the shapes in the chapter's formulas.",
        reference=_head_backward,
        chapter="12_how_attention_learns",
    ),
    "tile_backward": _Exercise(
        _tile_backward_cases,
        ("dq", "dk", "dv"),
        "tiles of part of a row, batches and heads, Dv != Dh, scores in the thousands, "
        "float32",
        _tile_backward_mistakes(),
        "Rebuild the tile's weights and compare them with the plain weights' tile, "
        "softmax(q k^T / sqrt(Dh)) sliced to the same rows and keys.",
        reference=_tile_backward,
        chapter="12_how_attention_learns",
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
