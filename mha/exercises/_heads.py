"""The split_heads and merge_heads exercises: their cases, and models of the usual mistakes.

``_HEAD_BLOCK_HINT`` and the split and merge models are reused by the multi-head
attention exercise.
"""

from __future__ import annotations

import numpy as np

import mha

from ._core import _Case, _label, _Mistake

# --------------------------------------------------------------------------- mistake models


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


def _split_list(x: np.ndarray, num_heads: int) -> list[np.ndarray]:
    head_dim = x.shape[-1] // num_heads
    return [x[..., h * head_dim:(h + 1) * head_dim] for h in range(num_heads)]  # H x (B, T, Dh)


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


# --------------------------------------------------------------------------- diagnoses

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
            _split_list,
            "A list of the H heads, one (B, T, Dh) array each: NumPy reads it as one "
            "array (H, B, T, Dh), heads first; mha returns one array (B, H, T, Dh).",
            "np.stack(heads, axis=1) would put the head axis after the batch; a "
            "reshape and a transpose give it without a loop.",
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


# --------------------------------------------------------------------------- cases


def _split_cases(rng: np.random.Generator) -> list[_Case]:
    # the first case has B != H: a list of the heads, read as (H, B, T, Dh), shows in the shape
    shapes = [((1, 4, 6), 3), ((2, 3, 8), 2), ((3, 5, 12), 4), ((2, 3, 6), 1), ((2, 4, 6), 6)]
    return [
        _Case(_label(f"num_heads={h}", x=x), (x, h))
        for x, h in ((rng.normal(size=shape), h) for shape, h in shapes)
    ]


def _merge_cases(rng: np.random.Generator) -> list[_Case]:
    shapes = [(2, 2, 3, 4), (1, 3, 4, 2), (3, 4, 5, 3), (2, 1, 3, 5), (2, 5, 2, 1)]
    arrays = [rng.normal(size=shape) for shape in shapes]
    return [_Case(_label(x=x), (x,)) for x in arrays]
