"""Argument checks: the specification's array checks, and the scalar ones every layer
shares.

The rule in all of :mod:`mha`: a bad argument, whatever is wrong with it (its type, its
dtype, its shape or its value), raises ``ValueError`` with a message that names the
argument and the shapes involved, so a reader who passes the wrong tensor sees *which*
one and *why*, instead of a NumPy broadcasting error from deep inside a matmul (or,
worse, a silent broadcast that produces wrong numbers).

The array checks (``as_float_array``, ``as_bool_mask``, ``check_mask_shape``,
``as_score_bias``, ``check_qkv``) serve the NumPy specification; the torch layers check
their tensors themselves (:mod:`mha.modules`), and share the scalar checks
(``check_positive_int``, ``check_divisible``, ``check_kv_heads``,
``check_queries_and_keys``) with it.
"""

from __future__ import annotations

import numbers

import numpy as np


def as_float_array(x: object, name: str) -> np.ndarray:
    """Return ``x`` as a floating-point array (integers and booleans become float64)."""
    arr = np.asarray(x)
    if arr.dtype == np.bool_ or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{name} must be real, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    return arr


def check_ndim(x: np.ndarray, ndim: int, name: str, layout: str) -> None:
    """Require ``x.ndim == ndim``; ``layout`` (e.g. ``"(B, T, D)"``) goes into the message."""
    if x.ndim != ndim:
        raise ValueError(f"{name} must have shape {layout} ({ndim} dims), got shape {x.shape}")


def check_positive_int(value: object, name: str) -> int:
    """Return ``value`` as an ``int`` if it is a positive integer (``bool`` is rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_queries_and_keys(size: object, num_keys: object) -> tuple[int, int]:
    """``(T, S)`` for a mask or bias of the last ``size`` of ``num_keys`` positions
    (``num_keys`` None: as many keys as queries)."""
    size = check_positive_int(size, "size")
    num_keys = size if num_keys is None else check_positive_int(num_keys, "num_keys")
    if num_keys < size:
        raise ValueError(
            f"num_keys={num_keys} is smaller than size={size}: the queries must be the "
            "last of the key positions"
        )
    return size, num_keys


def check_non_negative_int(value: object, name: str) -> int:
    """Return ``value`` as an ``int`` if it is an integer >= 0 (``bool`` is rejected)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


def check_seq_id(seq_id: object) -> int:
    """A paged cache's sequence id: a non-negative integer (not a bool)."""
    if isinstance(seq_id, bool) or not isinstance(seq_id, numbers.Integral) or seq_id < 0:
        raise ValueError(f"seq_id must be a non-negative integer, got {seq_id!r}")
    return int(seq_id)


# How a quantised cache groups heads (..., S, Dh): the axis a group runs along.
PER = {"token": -1, "channel": -2}


def check_bits(bits: object) -> int:
    bits = check_positive_int(bits, "bits")
    if not 2 <= bits <= 8:
        raise ValueError(f"bits must be between 2 and 8 (8, 4 and 2 are usual), got {bits}")
    return bits


def check_per(per: object, name: str) -> int:
    """'token' or 'channel' (a key in :data:`PER`), as the axis it groups along."""
    if per not in PER:
        raise ValueError(f"{name} must be 'token' or 'channel', got {per!r}")
    return PER[per]


def check_symmetric(symmetric: object) -> bool:
    if not isinstance(symmetric, bool):
        raise ValueError(f"symmetric must be True or False, got {symmetric!r}")
    return symmetric


def check_divisible(d_model: int, num_heads: int) -> int:
    """Return ``head_dim = d_model // num_heads``; reject a remainder."""
    num_heads = check_positive_int(num_heads, "num_heads")
    if d_model % num_heads != 0:
        raise ValueError(
            f"d_model={d_model} is not divisible by num_heads={num_heads}: every head "
            f"gets d_model / num_heads features, which must be a whole number"
        )
    return d_model // num_heads


def check_rope_head_dim(d_model: int, num_heads: int) -> None:
    """RoPE rotates pairs of features: a model using it needs an even ``head_dim``
    (a remainder of ``d_model / num_heads`` is :func:`check_divisible`'s to report)."""
    if d_model % num_heads == 0 and d_model // num_heads % 2:
        raise ValueError(
            f"position_scheme='rope' rotates pairs of dimensions: head_dim = d_model / "
            f"num_heads = {d_model // num_heads} must be even (d_model={d_model}, "
            f"num_heads={num_heads})"
        )


def check_kv_heads(num_heads: int, num_kv_heads: object) -> int:
    """Return the group size ``num_heads // num_kv_heads`` of grouped-query attention:
    ``num_kv_heads`` must be a positive integer that divides ``num_heads``."""
    num_kv_heads = check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads != 0:
        raise ValueError(
            f"num_kv_heads={num_kv_heads} must divide num_heads={num_heads}: each key/value "
            "head serves a group of num_heads / num_kv_heads query heads"
        )
    return num_heads // num_kv_heads


def as_bool_mask(mask: object, name: str = "mask") -> np.ndarray:
    """Return ``mask`` as a boolean array; any other dtype is an error.

    A float or integer "mask" is refused instead of being compared with 0, because
    the two common float conventions (1 = keep vs. 0 = keep, as in additive masks)
    are opposite: guessing would silently invert it.
    """
    arr = np.asarray(mask)
    if arr.dtype != np.bool_:
        raise ValueError(
            f"{name} must be a boolean array (True = may attend), got dtype {arr.dtype} "
            f"with shape {arr.shape}; for an additive float mask use mha.from_additive_mask"
        )
    return arr


def check_mask_shape(mask: np.ndarray, target: tuple[int, ...], name: str = "mask") -> None:
    """Require that ``mask`` broadcasts to exactly ``target`` = ``(..., T, S)``.

    The rule is stricter than NumPy's: the mask may not have more dimensions than
    ``target`` and may not enlarge it, each of its dims must be 1 or equal to the
    matching (right-aligned) dim of ``target``, and it needs at least the two
    trailing ``(T, S)`` dims — a 1-D mask is refused because it cannot say whether
    it runs over queries or keys.
    """
    layout = f"(..., T, S) = {target}"
    if mask.ndim < 2:
        raise ValueError(
            f"{name} must have at least 2 dims (..., T, S), got shape {mask.shape}; "
            f"expected a shape that broadcasts to {layout}"
        )
    if mask.ndim > len(target):
        raise ValueError(
            f"{name} with shape {mask.shape} has more dims than the attention scores {layout}"
        )
    for got, want in zip(mask.shape[::-1], target[::-1], strict=False):
        if got not in (1, want):
            raise ValueError(
                f"{name} with shape {mask.shape} does not broadcast to the attention "
                f"scores {layout}: every dim must be 1 or match"
            )


def as_score_bias(
    score_bias: object, target: tuple[int, ...], name: str = "score_bias"
) -> np.ndarray:
    """Return ``score_bias`` as a float array that broadcasts to the scores ``target``.

    An additive bias (ALiBi's, for instance) must be a finite float array: a boolean
    or integer one would most likely be a mask passed in the wrong place, and ``-inf``
    entries would block keys behind the back of the boolean ``mask``, whose rule for
    rows with nothing to attend to must stay the one place that decides. The shape
    rule is :func:`check_mask_shape`'s.
    """
    arr = np.asarray(score_bias)
    if not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(
            f"{name} must be a float array (added to the scaled scores), got dtype "
            f"{arr.dtype} with shape {arr.shape}; a boolean mask goes in mask="
        )
    check_mask_shape(arr, target, name)
    if not np.all(np.isfinite(arr)):
        raise ValueError(
            f"{name} (shape {arr.shape}) must be finite: block keys with the boolean "
            "mask, not with -inf (mha.from_additive_mask converts an additive mask)"
        )
    return arr


def check_qkv(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """``q (..., T, Dh)``, ``k (..., S, Dh)`` and ``v (..., S, Dv)`` fit together."""
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dims (..., length, dim), got {x.shape}")
    if not q.ndim == k.ndim == v.ndim:
        raise ValueError(
            f"q, k and v must have the same number of dims, got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must have the same leading (batch, head) dims, got q {q.shape}, "
            f"k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same last dim Dh (queries are compared with keys by "
            f"dot product), got q {q.shape} and k {k.shape}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must have the same length S (one value per key), got k {k.shape} "
            f"and v {v.shape}"
        )


def check_real(value: object, name: str, low: float, *, strict: bool = True) -> float:
    """Return ``value`` as a finite ``float > low`` (``>= low`` unless ``strict``); a
    ``bool`` is rejected."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool)
    if ok:
        value = float(value)
        ok = np.isfinite(value) and (value > low if strict else value >= low)
    if not ok:
        relation = ">" if strict else ">="
        raise ValueError(f"{name} must be a finite number {relation} {low:g}, got {value!r}")
    return value


def check_rope_scaling(head_dim: object, base: object, factor: object) -> tuple[int, float, float]:
    """``(head_dim, base, factor)`` of a RoPE stretched past its training length: an even
    rotary width, a base ``> 1`` (the frequencies must fall from pair to pair) and a
    factor ``>= 1`` (1 leaves RoPE as trained; below 1 would shrink the context)."""
    head_dim = check_positive_int(head_dim, "head_dim")
    if head_dim % 2:
        raise ValueError(
            f"head_dim must be even (RoPE rotates pairs of dimensions), got {head_dim}"
        )
    return head_dim, check_real(base, "base", 1.0), check_real(factor, "factor", 1.0, strict=False)


def check_ordered(low: float, low_name: str, high: float, high_name: str) -> None:
    """Require ``low < high``, naming both."""
    if not low < high:
        raise ValueError(
            f"{low_name} must be smaller than {high_name}, got {low_name}={low!r} "
            f"and {high_name}={high!r}"
        )


def check_t5_buckets(
    num_buckets: object, max_distance: object, bidirectional: object
) -> tuple[int, int]:
    """T5's bucket layout: ``(buckets per direction, max_exact)``.

    ``num_buckets`` is split in two halves for a bidirectional model (keys before and
    after the query); within each, ``max_exact = half // 2`` buckets hold one distance
    each and the rest grow logarithmically up to ``max_distance``, so ``max_exact``
    must be at least 1 and ``max_distance`` larger than it.
    """
    if not isinstance(bidirectional, bool):
        raise ValueError(f"bidirectional must be True or False, got {bidirectional!r}")
    num_buckets = check_positive_int(num_buckets, "num_buckets")
    max_distance = check_positive_int(max_distance, "max_distance")
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    if max_exact < 1:
        least = 4 if bidirectional else 2
        raise ValueError(
            f"num_buckets must be at least {least} (bidirectional="
            f"{bidirectional}), got {num_buckets}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance={max_distance} must exceed the {max_exact} exact "
            f"buckets (num_buckets={num_buckets}, bidirectional={bidirectional})"
        )
    return per_direction, max_exact


def check_rope_pair(rope_scaling: object, has_positions: bool) -> tuple[object, float]:
    """``(inv_freq, attention_factor)`` of a RoPE scaling, ``(None, 1.0)`` without one;
    only beside RoPE's positions (``has_positions``). ``inv_freq`` is checked where it
    is used (``apply_rope``)."""
    if rope_scaling is None:
        return None, 1.0
    if not has_positions or not isinstance(rope_scaling, tuple) or len(rope_scaling) != 2:
        raise ValueError(
            "rope_scaling must be a pair (inv_freq, attention_factor), given with "
            f"rope_positions, got {type(rope_scaling).__name__}"
            + ("" if has_positions else " and no rope_positions")
        )
    return rope_scaling[0], check_real(rope_scaling[1], "rope_scaling's attention_factor", 0.0)
