"""One traced run of :func:`mha.flash_attention`, checked against the specification.

:func:`~mha.draw.tiles_figure` and :func:`~mha.draw.online_softmax_figure` draw what
the trace of a real run recorded, never a re-enactment. Both start here: the run, in
float64, with the tiled context checked equal to the specification's attention with
the same mask, to 1e-12.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from mha._checks import as_float_array
from mha.attention import scaled_dot_product_attention
from mha.draw.style import check_ndim_one_of, to_numpy
from mha.masks import causal_mask
from mha.tiled import TileTrace, flash_attention

ATOL = 1e-12  # what the figures' claims are checked to, in float64


def _as_matrix(x: Any, name: str, layout: str) -> np.ndarray:
    arr = to_numpy(x, name)
    check_ndim_one_of(arr, (2,), name, layout)
    return as_float_array(arr, name).astype(np.float64)  # the checks hold to 1e-12 in float64


class TracedRun(NamedTuple):
    """One call of flash_attention with a trace, and the specification beside it."""

    trace: TileTrace
    q: np.ndarray  # (T, Dh) float64
    k: np.ndarray  # (S, Dh)
    v: np.ndarray  # (S, Dv)
    context: np.ndarray  # (T, Dv) from the tiles
    allowed: np.ndarray  # (T, S) bool: mask and causal together
    weights: np.ndarray  # (T, S) the specification's softmax weights


def traced_flash_attention(q: Any, k: Any, v: Any, mask: Any | None, tile_size: int,
                           causal: bool) -> TracedRun:
    """flash_attention with a trace on one head's (T, Dh), (S, Dh), (S, Dv) arrays, in
    float64, checked against the specification's attention with the same mask."""
    q = _as_matrix(q, "q", "(T, Dh)")
    k = _as_matrix(k, "k", "(S, Dh)")
    v = _as_matrix(v, "v", "(S, Dv)")
    trace = TileTrace()
    # flash_attention checks the shapes, the mask, tile_size and causal.
    context, _ = flash_attention(q, k, v, mask, tile_size=tile_size, causal=causal,
                                 trace=trace)
    T, S = q.shape[0], k.shape[0]
    allowed = np.ones((T, S), bool)
    if mask is not None:
        allowed = np.broadcast_to(to_numpy(mask, "mask"), (T, S))
    if causal and T and S:
        allowed = allowed & causal_mask(T, num_keys=S)
    expected, weights = scaled_dot_product_attention(q, k, v, allowed)
    # The claim behind both figures: tile by tile, nothing is lost.
    np.testing.assert_allclose(context, expected, rtol=ATOL, atol=ATOL)
    return TracedRun(trace, q, k, v, context, allowed, weights)
