"""The sliding_window_mask and kv_cache_bytes exercises: their cases and usual mistakes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mha

from ._core import _Case, _Mistake
from ._softmax import (
    _GLOBAL_MAX,
    _GLOBAL_MAX_ZEROS,
    _MEAN_SHIFT,
    _global_max_softmax,
    _global_max_zeros_softmax,
    _mean_shift_softmax,
)

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
    use_bytes: bool = True, window_shift: int = 0,
) -> Callable[..., Any]:
    def model(num_layers: int, num_kv_heads: int, head_dim: int, context_length: int, *,
              batch_size: int = 1, bytes_per_value: int = 2, window: int | None = None) -> Any:
        positions = context_length
        if window is not None and use_window == "min":
            positions = min(context_length, window + window_shift)
        elif window is not None and use_window == "max":
            positions = max(context_length, window)
        elif window is not None and use_window == "always":
            positions = window
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
            _bytes_model(window_shift=-1),
            "Off by one: a window of w keeps w - 1 earlier positions here; the "
            "rolling cache keeps w positions, the newest included.",
            "With a window of w, how many keys does the last query attend to, itself "
            "included? The cache holds each of them.",
        ),
        _Mistake(
            _bytes_model(use_window="always"),
            "The window replaces the context length: a context shorter than the window "
            "is counted as window positions, though the cache holds only the ones seen.",
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


# --------------------------------------------------------------------------- grouped heads
# repeat_kv_heads and decode_step are steps that mha does inside multi_head_attention
# (kv_head_index, KVCache): their references are written here from mha's pieces.


def _repeat_kv_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    """(B, Hkv, S, Dh) -> (B, H, S, Dh): query head h reads key/value head h // (H/Hkv)."""
    return x[:, mha.kv_head_index(num_heads, x.shape[1])]


def _tiled_heads(x: np.ndarray, num_heads: int) -> np.ndarray:
    return np.tile(x, (1, num_heads // x.shape[1], 1, 1))  # heads 0, 1, 0, 1


def _repeated_positions(x: np.ndarray, num_heads: int) -> np.ndarray:
    return np.repeat(x, num_heads // x.shape[1], axis=2)  # (B, Hkv, S * group, Dh)


def _repeated_features(x: np.ndarray, num_heads: int) -> np.ndarray:
    return np.repeat(x, num_heads // x.shape[1], axis=-1)  # (B, Hkv, S, Dh * group)


def _repeated_num_heads_times(x: np.ndarray, num_heads: int) -> np.ndarray:
    return np.repeat(x, num_heads, axis=1)  # (B, Hkv * H, S, Dh)


def _reversed_groups(x: np.ndarray, num_heads: int) -> np.ndarray:
    return _repeat_kv_heads(x, num_heads)[:, ::-1].copy()


def _repeat_mistakes() -> tuple[_Mistake, ...]:
    group_hint = (
        "Query heads 0 .. H/Hkv - 1 form the first group and all read key/value head 0; "
        "write the head each query head reads for H = 4, Hkv = 2."
    )
    return (
        _Mistake(
            _tiled_heads,
            "Tiled instead of repeated: the key/value heads come back in turns "
            "(0, 1, 0, 1), so query head 1 reads key/value head 1 instead of 0.",
            group_hint,
        ),
        _Mistake(
            _repeated_positions,
            "Repeated along the positions (axis 2) instead of the heads: the result "
            "has S * H/Hkv positions and still Hkv heads.",
            "Which axis of (B, Hkv, S, Dh) counts the heads?",
        ),
        _Mistake(
            _repeated_features,
            "Repeated along the features (the last axis) instead of the heads: the "
            "result has Dh * H/Hkv features per head and still Hkv heads.",
            "Which axis of (B, Hkv, S, Dh) counts the heads?",
        ),
        _Mistake(
            _repeated_num_heads_times,
            "Each key/value head is copied num_heads times instead of num_heads / Hkv "
            "times: the result has Hkv * H heads.",
            "A group holds H / Hkv query heads: that is how many copies each "
            "key/value head needs.",
        ),
        _Mistake(
            lambda x, num_heads: np.repeat(x, num_heads // x.shape[1]),
            "np.repeat without an axis: the array is flattened to one long row before "
            "the copies are made.",
            "np.repeat(x, n) flattens x first; name the axis that counts the heads.",
        ),
        _Mistake(
            _reversed_groups,
            "The groups are in reverse order: the last query heads read key/value "
            "head 0.",
            group_hint,
        ),
    )


def _repeat_cases(rng: np.random.Generator) -> list[_Case]:
    def case(batch: int, kv_heads: int, length: int, head_dim: int, heads: int,
             tag: str = "", dtype: Any = np.float64) -> _Case:
        x = rng.normal(size=(batch, kv_heads, length, head_dim)).astype(dtype)
        label = ", ".join(filter(None, [f"x {x.shape}, num_heads={heads}", tag]))
        return _Case(label, (x, heads), loose=dtype == np.float32)

    return [
        case(1, 2, 3, 2, 4, "2 groups of 2"),
        case(2, 2, 4, 3, 6, "2 groups of 3"),
        case(2, 3, 2, 2, 6, "3 groups of 2"),
        case(1, 1, 5, 4, 4, "multi-query: one key/value head"),
        case(2, 4, 3, 2, 4, "multi-head: as many key/value heads as query heads"),
        case(1, 2, 0, 2, 4, "an empty cache: no positions yet"),
        case(2, 2, 3, 4, 8, "float32", np.float32),
    ]


# --------------------------------------------------------------------------- one decoding step


def _decode_step(q: Any, k_cache: Any, v_cache: Any, k_new: Any, v_new: Any) -> tuple:
    """Append the new position's key and value to the caches, then let q attend to all."""
    keys = np.concatenate([k_cache, k_new], axis=-2)  # (B, H, S + 1, Dh)
    values = np.concatenate([v_cache, v_new], axis=-2)  # (B, H, S + 1, Dh)
    context, _ = mha.scaled_dot_product_attention(q, keys, values)  # (B, H, 1, Dh)
    return context, keys, values


def _decode_model(
    *, axis: int = -2, prepend: bool = False, naive: bool = False, attend_new: bool = True,
    attend_cache: bool = True, update: bool = True, scale: bool = True,
    softmax_axis: int = -1, swap_kv: bool = False, context_only: bool = False,
    top_left: bool = False, normalise: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Callable[..., Any]:
    def model(q: Any, k_cache: Any, v_cache: Any, k_new: Any, v_new: Any) -> Any:
        if swap_kv:
            k_new, v_new = v_new, k_new
        keys = np.concatenate([k_new, k_cache] if prepend else [k_cache, k_new], axis=axis)
        values = np.concatenate([v_new, v_cache] if prepend else [v_cache, v_new], axis=axis)
        read_k, read_v = (keys, values)
        if not attend_new:
            read_k, read_v = k_cache, v_cache
        elif not attend_cache:
            read_k, read_v = k_new, v_new
        scores = q @ np.swapaxes(read_k, -1, -2)  # (B, H, 1, S')
        if scale:
            scores = scores / np.sqrt(q.shape[-1])
        if top_left:  # np.tril(ones((1, S + 1))): the one query sees key 0 only
            first = np.tril(np.ones(scores.shape[-2:], dtype=bool))  # (1, S + 1)
            scores = np.where(first, scores, -np.inf)
        if naive:  # exp without the shift by the maximum
            exp = np.exp(scores)
            weights = exp / exp.sum(axis=softmax_axis, keepdims=True)
        elif normalise is not None:  # a softmax shifted another way
            weights = normalise(scores)
        else:
            weights = mha.softmax(scores, axis=softmax_axis)
        context = weights @ read_v  # (B, H, 1, Dh)
        if context_only:
            return context
        return (context, keys, values) if update else (context, k_cache, v_cache)

    return model


def _decode_mistakes() -> tuple[_Mistake, ...]:
    axis_hint = "The positions are axis 2 of (B, H, S, Dh): the cache grows to S + 1 there."
    return (
        _Mistake(
            _decode_model(attend_new=False),
            "The new position is forgotten: the query attends only to the cached keys "
            "and values, not to the ones it just appended.",
            "A decoding step's query may see every earlier position and its own: "
            "attend after appending.",
        ),
        _Mistake(
            _decode_model(attend_cache=False),
            "The cache is not read: the query attends only to the new position, so "
            "every weight is 1 on itself.",
            "The cache holds the keys and values of the earlier positions: the new "
            "query must see them too.",
        ),
        _Mistake(
            _decode_model(axis=1),
            "Appended along the heads (axis 1) instead of the positions: the caches "
            "gain heads, not a position (the shapes only fit when S == 1, and then "
            "the query reads a head that does not exist).",
            axis_hint,
        ),
        _Mistake(
            _decode_model(prepend=True),
            "The new position is put first: the caches must keep the positions in "
            "order, the new one after the cached ones.",
            "Position S comes after positions 0 .. S - 1: which order does the "
            "concatenation take?",
        ),
        _Mistake(
            _decode_model(update=False),
            "The caches are returned as they came in: the new key and value are not "
            "kept for the next step.",
            "The next step needs this position's key and value: return the grown "
            "caches.",
        ),
        _Mistake(
            _decode_model(swap_kv=True),
            "k_new and v_new are swapped: the new key went into the value cache and "
            "the new value into the key cache.",
            "Keys are compared with the query; values are averaged.",
        ),
        _Mistake(
            _decode_model(scale=False),
            "No 1/sqrt(head_dim) scaling: the scores are not divided by sqrt(Dh).",
            "The cached step computes the same attention as a full pass: "
            "softmax(q k^T / sqrt(Dh)) v.",
        ),
        _Mistake(
            _decode_model(naive=True),
            "NaN or inf on large scores (such as 1000) while small ones are right: exp "
            "overflows (exp(710) is already inf in float64).",
            "Subtracting each row's maximum score before exp leaves the softmax "
            "unchanged and keeps exp in range.",
        ),
        _Mistake(_decode_model(normalise=_global_max_softmax), *_GLOBAL_MAX),
        _Mistake(_decode_model(normalise=_global_max_zeros_softmax), *_GLOBAL_MAX_ZEROS),
        _Mistake(_decode_model(normalise=_mean_shift_softmax), *_MEAN_SHIFT),
        _Mistake(
            _decode_model(softmax_axis=-2),
            "The softmax runs over the single query (axis -2): every weight is 1, so "
            "the context is the sum of the values, not their average.",
            "The weights of one query are spread over the keys: which axis of "
            "(B, H, 1, S + 1) counts them?",
        ),
        _Mistake(
            _decode_model(top_left=True),
            "Only the first position is read: a causal mask aligned to the top left, "
            "np.tril of a (1, S + 1) array, lets the one query see key 0 alone; the "
            "new query is the last position, S.",
            "No mask is needed: the new query comes after every cached position. A "
            "causal mask for it is aligned to the bottom right, as "
            "mha.causal_mask(1, num_keys=S + 1).",
        ),
        _Mistake(
            _decode_model(context_only=True),
            "Only the context is returned; decode_step returns (context, k_cache, "
            "v_cache) with the grown caches.",
            "The caller keeps the returned caches for the next step.",
        ),
    )


# Appending along the features (or along the heads, with more than one cached position)
# raises on every case: only the error tells it apart. NumPy's and PyTorch's messages.
_WRONG_AXIS_ERRORS = ("except for the concatenation axis", "must match except in dimension")


def _decode_raised() -> tuple[tuple[tuple[str, ...], _Mistake], ...]:
    return (
        (
            _WRONG_AXIS_ERRORS,
            _Mistake(
                _decode_model(axis=-1),
                "Appended along the wrong axis: the cache and the new position are joined "
                "along another axis than the positions, so their sizes on the positions "
                "axis (S and 1) clash.",
                "The positions are axis 2 of (B, H, S, Dh): the caches grow to S + 1 "
                "there, the other axes stay.",
            ),
        ),
    )


def _decode_cases(rng: np.random.Generator) -> list[_Case]:
    def case(batch: int, heads: int, cached: int, head_dim: int, tag: str = "",
             scale: float = 1.0, dtype: Any = np.float64) -> _Case:
        def normal(length: int, factor: float = 1.0) -> np.ndarray:
            return (rng.normal(size=(batch, heads, length, head_dim)) * factor).astype(dtype)

        q, k_cache, v_cache = normal(1, scale), normal(cached), normal(cached)
        k_new, v_new = normal(1), normal(1)
        if scale > 1:  # head 0's scores all near 2000 / sqrt(Dh), close together: only
            # an unshifted exp overflows there (a shift by the mean or the maximum does not)
            aligned = q[:, 0] * 2000 / (q[:, 0] ** 2).sum(axis=-1, keepdims=True)  # q.k = 2000
            k_cache[:, 0] = aligned + normal(cached)[:, 0] / 1000
            k_new[:, 0] = aligned
        label = ", ".join(filter(None, [f"q {q.shape}, caches {k_cache.shape}", tag]))
        return _Case(label, (q, k_cache, v_cache, k_new, v_new), loose=dtype == np.float32)

    return [
        case(2, 3, 4, 5, "4 cached positions"),
        case(1, 1, 1, 3, "1 cached position, one head"),
        case(2, 2, 0, 4, "an empty cache: the first step"),
        case(1, 4, 6, 2, "large scores such as 1000", scale=500.0),
        case(2, 1, 3, 8, "float32", dtype=np.float32),
    ]
