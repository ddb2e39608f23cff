"""The sliding_window_mask and kv_cache_bytes exercises: their cases and usual mistakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake

# --------------------------------------------------------------------------- mistake models


def _band(size: int, window: int, num_keys: int | None, *, width: int, top_left: bool = False,
          causal: bool = True) -> np.ndarray:
    """A band mask built with one thing changed: its width, alignment or causality."""
    keys = size if num_keys is None else num_keys
    offset = 0 if top_left else keys - size
    query = np.arange(size)[:, None] + offset  # (T, 1): each query's position
    distance = query - np.arange(keys)[None, :]  # (T, S)
    if not causal:
        distance = np.abs(distance)
    return (distance >= 0) & (distance < width)


def _window_model(**changes: Any) -> Callable[..., np.ndarray]:
    shift = changes.pop("shift", 0)

    def model(size: int, window: int, num_keys: int | None = None) -> np.ndarray:
        return _band(size, window, num_keys, width=window + shift, **changes)

    return model


def _square(size: int, window: int, num_keys: int | None = None) -> np.ndarray:
    return mha.sliding_window_mask(size, window)


def _bytes_model(
    factor: float = 1.0, *, use_window: str = "min", use_batch: bool = True,
    use_bytes: bool = True,
) -> Callable[..., Any]:
    def model(num_layers: int, num_kv_heads: int, head_dim: int, context_length: int, *,
              batch_size: int = 1, bytes_per_value: int = 2, window: int | None = None) -> Any:
        positions = context_length
        if window is not None and use_window == "min":
            positions = min(context_length, window)
        elif window is not None and use_window == "max":
            positions = max(context_length, window)
        size = 2 * num_layers * num_kv_heads * head_dim * positions
        size *= batch_size if use_batch else 1
        size *= bytes_per_value if use_bytes else 2
        return int(size * factor)

    return model


# --------------------------------------------------------------------------- diagnoses


def _window_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _window_model(shift=1),
            "Off by one: each query sees window + 1 positions, itself and window before.",
            "The window counts the query itself: itself and the window - 1 before it.",
        ),
        _Mistake(
            _window_model(shift=-1),
            "Off by one: each query sees window - 1 positions.",
            "The window counts the query itself: itself and the window - 1 before it.",
        ),
        _Mistake(
            _window_model(causal=False),
            "Not causal: the band reaches into the future as far as into the past.",
            "A decoder's window looks back only: which keys come after query t?",
        ),
        _Mistake(
            _window_model(top_left=True),
            "Aligned to the top left: with num_keys > size, the queries are taken to be "
            "the first positions instead of the last.",
            "The queries are the last T of S positions, as in mha.causal_mask(T, num_keys=S).",
        ),
        _Mistake(
            _square,
            "num_keys is ignored: the mask is (T, T) even when there are more keys.",
            "With a cache the keys outnumber the new queries: the mask is (T, S).",
        ),
        _Mistake(
            lambda size, window, num_keys=None: ~mha.sliding_window_mask(size, window, num_keys),
            "An inverted mask: True marks the blocked positions; in mha, True = may attend.",
            "Revisit mha's mask convention (True = may attend).",
        ),
        _Mistake(
            lambda size, window, num_keys=None: mha.sliding_window_mask(
                size, window, num_keys).astype(np.float64),
            "Right pattern, but not a boolean array: mha's masks are boolean.",
            "A float mask is ambiguous; a boolean one (True = may attend) is not.",
        ),
    )


def _bytes_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _bytes_model(0.5),
            "Half the size: only the keys are counted, not the values.",
            "The cache stores a key and a value for every head, layer and position.",
        ),
        _Mistake(
            _bytes_model(use_window="ignore"),
            "The window is ignored: a rolling cache never holds more than window "
            "positions.",
            "How many positions does a cache with a window keep, for a long context?",
        ),
        _Mistake(
            _bytes_model(use_window="max"),
            "max instead of min: the window makes a short context longer.",
            "A window bounds the cache; a context shorter than it is stored whole.",
        ),
        _Mistake(
            _bytes_model(use_batch=False),
            "batch_size is ignored: every sequence of the batch has its own cache.",
            "Each sequence in a batch keeps its own keys and values.",
        ),
        _Mistake(
            _bytes_model(use_bytes=False),
            "bytes_per_value is ignored: the size assumes 2 bytes (16-bit) per number.",
            "The bytes per number are an argument: 4 for float32, 1 for 8-bit.",
        ),
        _Mistake(
            _bytes_model(8.0),
            "Bits, not bytes: the size is 8 times too large.",
            "bytes_per_value is already in bytes.",
        ),
    )


# --------------------------------------------------------------------------- cases


def _window_cases(rng: np.random.Generator) -> list[_Case]:
    return [
        _Case("size=1, window=1", (1, 1)),
        _Case("size=5, window=2", (5, 2)),
        _Case("size=6, window=3", (6, 3)),
        _Case("size=4, window=9: wider than the sequence", (4, 9)),
        _Case("size=2, window=3, num_keys=7: 2 new after 5 cached", (2, 3), {"num_keys": 7}),
        _Case("size=3, window=1, num_keys=5", (3, 1), {"num_keys": 5}),
    ]


def _bytes_cases(rng: np.random.Generator) -> list[_Case]:
    return [
        _Case("32 layers, 32 heads of 128, 4096 positions", (32, 32, 128, 4096)),
        _Case("2 layers, 1 head of 4, 10 positions, batch 3", (2, 1, 4, 10),
              {"batch_size": 3}),
        _Case("80 layers, 8 heads of 128, 1000 positions, float32", (80, 8, 128, 1000),
              {"bytes_per_value": 4}),
        _Case("32 layers, 8 heads of 128, 32768 positions, window 4096",
              (32, 8, 128, 32768), {"window": 4096}),
        _Case("4 layers, 2 heads of 16, 100 positions, window 512", (4, 2, 16, 100),
              {"window": 512}),
    ]
