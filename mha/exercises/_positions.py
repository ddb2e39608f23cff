"""The apply_rope and alibi_slopes exercises: their cases and models of the usual mistakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake

# --------------------------------------------------------------------------- mistake models


def _rope(*, half_split: bool = False, exponent: float = 2.0, sign: float = 1.0,
          ignore_positions: bool = False) -> Callable[..., np.ndarray]:
    """RoPE with one thing changed: the pairing, the frequencies, the direction, or the
    positions used."""

    def model(x: Any, positions: Any, base: float = 10000.0) -> np.ndarray:
        x = np.asarray(x)
        head_dim = x.shape[-1]
        pos = np.arange(x.shape[-2]) if ignore_positions else np.asarray(positions)
        frequencies = base ** (-exponent * np.arange(head_dim // 2) / head_dim)
        angles = pos[..., None] * frequencies  # (..., L, Dh/2)
        cos, sin = np.cos(angles), sign * np.sin(angles)
        if half_split:
            first, second = x[..., : head_dim // 2], x[..., head_dim // 2:]
            out = np.concatenate([first * cos - second * sin, first * sin + second * cos],
                                 axis=-1)
        else:
            even, odd = x[..., 0::2], x[..., 1::2]
            out = np.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
        return out.reshape(x.shape).astype(x.dtype)

    return model


def _slopes_first_at_one(num_heads: int) -> np.ndarray:
    return 2.0 ** (-8.0 * np.arange(num_heads) / num_heads)


def _slopes_any_count(num_heads: int) -> np.ndarray:
    return 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)


def _slopes_halving(num_heads: int) -> np.ndarray:
    return 2.0 ** -np.arange(1.0, num_heads + 1)


def _powers(count: int) -> np.ndarray:
    return 2.0 ** (-8.0 * np.arange(1, count + 1) / count)


def _largest_power_of_two(num_heads: int) -> int:
    return 2 ** int(np.floor(np.log2(num_heads)))


def _slopes_even_powers(num_heads: int) -> np.ndarray:
    closest = _largest_power_of_two(num_heads)
    extra = _powers(2 * closest)[1::2][: num_heads - closest]  # repeats of the first ones
    return np.concatenate([_powers(closest), extra])


def _slopes_sorted(num_heads: int) -> np.ndarray:
    return np.sort(mha.alibi_slopes(num_heads))[::-1].copy()


def _slopes_reversed(num_heads: int) -> np.ndarray:
    return mha.alibi_slopes(num_heads)[::-1].copy()


def _sinusoid(*, swap: bool = False, per_pair: bool = False, per_column: bool = False,
              halves: bool = False, start: int = 0,
              multiply: bool = False) -> Callable[..., np.ndarray]:
    """The sinusoidal table with one thing changed."""

    def model(max_len: int, d_model: int, dtype: Any = np.float64) -> np.ndarray:
        pos = np.arange(start, start + max_len)[:, None]  # (L, 1)
        i = np.arange(d_model // 2)
        exponent = (i if per_pair else 2 * i) / d_model  # (D/2,): one per pair
        angles = pos * 10000.0**exponent if multiply else pos / 10000.0**exponent
        first, second = (np.cos, np.sin) if swap else (np.sin, np.cos)
        if halves:
            return np.concatenate([first(angles), second(angles)], axis=-1)
        table = np.empty((max_len, d_model))
        table[:, 0::2], table[:, 1::2] = first(angles), second(angles)
        if per_column:  # column j at 10000^(-j/D): the cosine of pair i at (2i + 1)/D
            table[:, 1::2] = second(pos / 10000.0 ** ((2 * i + 1) / d_model))
        return table

    return model


# --------------------------------------------------------------------------- diagnoses


def _sinusoid_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _sinusoid(swap=True),
            "sin and cos are swapped: the even columns 2i hold the cosines.",
            "Row 0 (position 0) is (sin 0, cos 0, sin 0, ...) = (0, 1, 0, 1, ...).",
        ),
        _Mistake(
            _sinusoid(per_column=True),
            "Each column gets its own frequency, 10000^(-j/D) for column j: the "
            "cosine in column 2i + 1 must share its pair's 10000^(-2i/D) with the "
            "sine in column 2i.",
            "A sine and a cosine of the same angle make one pair: a rotation.",
        ),
        _Mistake(
            _sinusoid(per_pair=True),
            "Pair i turns at 10000^(-i/D) instead of 10000^(-2i/D): the exponent "
            "counts the pairs where the formula counts the columns, 2i, so the "
            "frequencies fall half as fast.",
            "In the formula, 2i is the column of pair i's sine: for D = 4, pair 1 "
            "turns at 10000^(-2/4) = 0.01.",
        ),
        _Mistake(
            _sinusoid(halves=True),
            "All sines first, then all cosines: the formula interleaves them, sine in "
            "column 2i and cosine in column 2i + 1.",
            "Write out the first four columns of row 1 for D = 4 from the formula.",
        ),
        _Mistake(
            _sinusoid(start=1),
            "The positions start at 1: row 0 is position 0.",
            "Row 0 of the table should be (0, 1, 0, 1, ...).",
        ),
        _Mistake(
            _sinusoid(multiply=True),
            "The positions are multiplied by 10000^(2i/D) instead of divided: the "
            "wavelengths shrink instead of growing.",
            "Pair 0 turns fastest (one radian per position); the last pairs turn "
            "slowest.",
        ),
    )



def _rope_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _rope(half_split=True),
            "Dimension i is paired with i + Dh/2 (the 'rotate half' layout of many "
            "codebases); mha pairs neighbours, (0, 1), (2, 3), ...",
            "Both layouts are RoPE, up to a fixed permutation of the dimensions, but the "
            "exercise asks for mha's: pair 2i with 2i + 1.",
        ),
        _Mistake(
            _rope(exponent=1.0),
            "The frequencies are base^(-i/Dh): pair i should turn at base^(-2i/Dh), the "
            "frequencies of the sinusoidal encoding.",
            "Write out the frequency of the last pair for Dh = 4: it should be 1/base^(1/2).",
        ),
        _Mistake(
            _rope(sign=-1.0),
            "Each pair turns clockwise: the sines have the wrong sign.",
            "A rotation by a: (x, y) -> (x cos a - y sin a, x sin a + y cos a).",
        ),
        _Mistake(
            lambda x, positions, base=10000.0: _rope()(x, positions),
            "base is ignored: the frequencies always use 10000, whatever base is given.",
            "base is an argument: pair i turns at base^(-2i/Dh).",
        ),
        _Mistake(
            _rope(ignore_positions=True),
            "positions is ignored: the vectors are rotated as if at 0, 1, ..., L - 1.",
            "With a KV cache the new vectors sit at later positions: use the ones given.",
        ),
    )


def _slopes_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _slopes_first_at_one,
            "Off by one: the first slope is 1; the paper's sequence starts at 2^(-8/n).",
            "For 8 heads the slopes are 1/2, 1/4, ..., 1/256: which exponent gives 1/2?",
        ),
        _Mistake(
            _slopes_any_count,
            "The power-of-two formula is used for every head count; for other counts the "
            "paper takes the slopes of the nearest smaller power of two, then fills in "
            "slopes from between them.",
            "Try 6 heads: start from the 4 slopes of 4 heads, then add slopes of 8 heads.",
        ),
        _Mistake(
            _slopes_halving,
            "The slopes halve from head to head whatever the number of heads; the ratio "
            "is 2^(-8/n), so the last slope is 2^-8 for every power of two n.",
            "For 16 heads the first slope is 2^(-1/2), not 1/2.",
        ),
        _Mistake(
            _slopes_even_powers,
            "The filled-in slopes are the even powers of the 2n sequence, which repeat "
            "slopes that are already there; they should be the odd ones (2^(-8k/2n) "
            "for odd k), which lie between them.",
            "For 6 heads: the 4 slopes of 4 heads, then the slopes of 8 heads that "
            "4 heads do not have.",
        ),
        _Mistake(
            _slopes_sorted,
            "Right slopes, wrong order for a head count that is not a power of two: "
            "they are sorted from steepest to gentlest, but the paper puts the p slopes "
            "of the largest power of two p below n first, then the filled-in ones.",
            "For 6 heads: first the 4 slopes of 4 heads, in their order, then the 2 new "
            "ones.",
        ),
        _Mistake(
            _slopes_reversed,
            "The slopes are in reverse order: head 0 should have the steepest slope.",
            "The sequence starts at its largest value and shrinks.",
        ),
    )


# --------------------------------------------------------------------------- cases


def _sinusoid_cases(rng: np.random.Generator) -> list[_Case]:
    return [
        _Case(f"max_len={n}, d_model={d}", (n, d))
        for n, d in ((4, 2), (6, 4), (10, 8), (1, 6), (50, 32))
    ]


def _rope_cases(rng: np.random.Generator) -> list[_Case]:
    return [
        _Case("x (1, 4, 2): one pair, positions 0..3", (rng.normal(size=(1, 4, 2)),
                                                          np.arange(4))),
        _Case("x (2, 5, 8), positions 0..4", (rng.normal(size=(2, 5, 8)), np.arange(5))),
        _Case("x (1, 2, 3, 6), positions 7..9: after a cache of 7",
              (rng.normal(size=(1, 2, 3, 6)), np.arange(7, 10))),
        _Case("x (3, 8), positions [0, 5, 2], base=100", (rng.normal(size=(3, 8)),
                                                         np.array([0, 5, 2])),
              {"base": 100.0}),
        _Case("x (2, 3, 4), positions as a list [3, 1, 4]",
              (rng.normal(size=(2, 3, 4)), [3, 1, 4])),
        _Case("x (2, 4, 4) float32, positions 0..3",
              (rng.normal(size=(2, 4, 4)).astype(np.float32), np.arange(4)), loose=True),
    ]


def _slopes_cases(rng: np.random.Generator) -> list[_Case]:
    return [_Case(f"num_heads={n}", (n,)) for n in (1, 2, 4, 8, 16, 3, 6, 12)]
