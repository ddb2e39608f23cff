"""The merge_tiles exercise (chapter 9): the online softmax, two tiles at a time.

Two walks over different keys of the same queries each end with the running
quantities of chapter 9: the maximum ``m``, the sum ``l`` of ``exp(z - m)`` and the
unnormalised context ``a``. Merging them is one update of the online softmax; it is
how FlashAttention's tiles of one row (and split-key decoding) are combined. ``mha`` does
this inside ``flash_attention``; the reference is written here and tested against it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake


def _rescale(m: np.ndarray, new_m: np.ndarray) -> np.ndarray:
    """exp(m - new_m), 0 where m is -inf (a tile with nothing allowed, or both)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isneginf(m), 0.0, np.exp(m - new_m))


def _merge_tiles(m_a: Any, l_a: Any, a_a: Any, m_b: Any, l_b: Any, a_b: Any) -> tuple:
    """m, l: (..., T); a: (..., T, Dv). Returns the (m, l, a) of both tiles' keys."""
    m = np.maximum(m_a, m_b)  # (..., T)
    scale_a, scale_b = _rescale(m_a, m), _rescale(m_b, m)  # (..., T)
    l = scale_a * l_a + scale_b * l_b  # noqa: E741 - the chapter's name
    a = scale_a[..., None] * a_a + scale_b[..., None] * a_b  # (..., T, Dv)
    return m, l, a


def _merge_model(*, rescale: str = "right", a_scaled: bool = True, guard: bool = True,
                 keep: str = "both", expand: bool = True) -> Callable[..., Any]:
    def model(m_a: Any, l_a: Any, a_a: Any, m_b: Any, l_b: Any, a_b: Any) -> Any:
        if keep == "larger":  # the tile with the larger maximum only
            first = m_a >= m_b
            return (np.where(first, m_a, m_b), np.where(first, l_a, l_b),
                    np.where(first[..., None], a_a, a_b))
        m = np.maximum(m_a, m_b)
        if rescale == "none":
            scale_a = scale_b = np.ones_like(m)
        elif rescale == "inverted":
            scale_a, scale_b = np.exp(m - m_a), np.exp(m - m_b)
        elif guard:
            scale_a, scale_b = _rescale(m_a, m), _rescale(m_b, m)
        else:
            scale_a, scale_b = np.exp(m_a - m), np.exp(m_b - m)
        l = scale_a * l_a + scale_b * l_b  # noqa: E741
        if not a_scaled:
            return m, l, a_a + a_b
        if not expand:  # (..., T) * (..., T, Dv): lines up T with Dv
            return m, l, scale_a * a_a + scale_b * a_b
        return m, l, scale_a[..., None] * a_a + scale_b[..., None] * a_b

    return model


def _merge_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _merge_model(rescale="none"),
            "No rescaling: l and a of the two tiles are added as they are, but each was "
            "measured against its own maximum.",
            "Both tiles must be measured against the common maximum m' = max(m_a, "
            "m_b): multiply each by exp(m - m').",
        ),
        _Mistake(
            _merge_model(rescale="inverted"),
            "The rescaling is inverted: exp(m' - m) instead of exp(m - m'), so the "
            "tile with the smaller maximum is inflated instead of shrunk.",
            "Write e^(z - m') as e^(z - m) times a factor: which one?",
        ),
        _Mistake(
            _merge_model(a_scaled=False),
            "Only l is rescaled: the unnormalised contexts a are added without their "
            "factors exp(m - m').",
            "a is a sum of e^(z - m) v_s: it needs the same factor as l.",
        ),
        _Mistake(
            _merge_model(guard=False),
            "NaN for a row that no key of either tile may attend to: both maxima are "
            "-inf, and exp(-inf - (-inf)) is NaN.",
            "A tile with nothing allowed contributes nothing (l = 0, a = 0): its "
            "factor should be 0, as mha gives such a row zeros.",
        ),
        _Mistake(
            _merge_model(keep="larger"),
            "Only the tile with the larger maximum is kept; the other tile's keys "
            "still carry weight.",
            "The merged row covers the keys of both tiles: both sums contribute.",
        ),
        _Mistake(
            _merge_model(expand=False),
            "The factors (..., T) multiply a (..., T, Dv) without a new last axis, so "
            "they line up with the Dv features instead of the T queries.",
            "Give the factors a trailing axis of size 1, (..., T, 1), before "
            "multiplying a.",
        ),
    )


def _tile_stats(z: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, ...]:
    """(m, l, a) of scores z (..., T, S), blocked = -inf, and values v (..., S, Dv)."""
    m = z.max(axis=-1, initial=-np.inf)  # (..., T)
    shifted = np.where(np.isneginf(z), 0.0, np.exp(z - np.where(np.isneginf(m), 0.0,
                                                                   m)[..., None]))
    return m, shifted.sum(axis=-1), shifted @ v


def _merge_cases(rng: np.random.Generator) -> list[_Case]:
    def case(lead: tuple[int, ...], target: int, keys: tuple[int, int], value_dim: int,
             tag: str, scale: float = 1.0, blocked: Callable | None = None) -> _Case:
        s_a, s_b = keys
        z = rng.normal(size=(*lead, target, s_a + s_b)) * scale
        if blocked is not None:
            z = np.where(blocked(z.shape), z, -np.inf)
        v = rng.normal(size=(*lead, s_a + s_b, value_dim))
        stats_a = _tile_stats(z[..., :s_a], v[..., :s_a, :])
        stats_b = _tile_stats(z[..., s_a:], v[..., s_a:, :])
        label = f"m {stats_a[0].shape}, a {stats_a[2].shape}, {tag}"
        return _Case(label, (*stats_a, *stats_b))

    def first_tile_empty(shape: tuple[int, ...]) -> np.ndarray:
        allowed = np.ones(shape, dtype=bool)
        allowed[..., 0, :3] = False  # row 0: nothing allowed in tile a (its 3 keys)
        return allowed

    def row_empty(shape: tuple[int, ...]) -> np.ndarray:
        allowed = mha.causal_mask(shape[-2], num_keys=shape[-1]).copy()
        allowed[..., 1, :] = False  # row 1: nothing allowed anywhere
        return np.broadcast_to(allowed, shape)

    return [
        case((), 4, (3, 5), 4, "keys 0-2 and 3-7"),
        case((2, 3), 3, (4, 4), 5, "batch and heads"),
        case((2,), 5, (3, 6), 3, "tile a empty in row 0", blocked=first_tile_empty),
        case((1,), 4, (3, 3), 2, "row 1 empty in both tiles", blocked=row_empty),
        case((2,), 3, (2, 4), 4, "large scores such as 1000", scale=400.0),
    ]
