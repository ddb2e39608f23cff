"""Attention one tile at a time, with an online softmax: the idea behind FlashAttention.

:func:`mha.scaled_dot_product_attention` builds the whole ``(T, S)`` matrix of scores
before its softmax, so its memory grows with ``T * S``. FlashAttention (Dao et al.,
2022) never holds that matrix. It walks it tile by tile (a tile: ``tile_size`` queries
by ``tile_size`` keys), one row of tiles at a time and left to right within a row, and
keeps three running quantities per query over the keys seen so far (the "online
softmax" of Milakov and Gimelshein, 2018):

* ``m``, the largest scaled score,
* ``l``, the sum of ``exp(score - m)``,
* ``acc``, the sum of ``exp(score - m) * value``: the context before dividing by ``l``.

When a new tile raises the maximum from ``m`` to ``m'``, everything summed so far was
measured against the old maximum; multiplying ``l`` and ``acc`` by ``exp(m - m')``
re-measures it against the new one. After the row's last tile, ``context = acc / l``, and
``m + log(l)`` is the row's log-sum-exp, ``log sum_s exp(score_s)``: all a backward
pass needs to rebuild the weights, so the weights are never stored either.

Shapes follow the legend in :mod:`mha`; masks are boolean with **True = may attend**.
"""

from __future__ import annotations

import math
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    check_mask_shape,
    check_positive_int,
    check_qkv,
)

__all__ = ["RowHistory", "TileStep", "TileTrace", "flash_attention", "peak_memory_bytes"]


@dataclass(frozen=True, eq=False)
class TileStep:
    """One tile of :func:`flash_attention`: up to ``tile_size`` queries against up to
    ``tile_size`` keys.

    Attributes
    ----------
    queries : (start, stop)  the query rows of the tile
    keys : (start, stop)     the keys of the tile
    skipped : bool           True if causal masking blocks every pair, so the tile was
                             not computed
    running_max : np.ndarray, shape (..., stop - start)
        ``m`` of the tile's query rows after this tile: the largest scaled score seen so
        far (``-inf`` while nothing was allowed).
    running_sum : np.ndarray, shape (..., stop - start)
        ``l`` of those rows after this tile: the sum of ``exp(score - m)`` so far.
    """

    queries: tuple[int, int]
    keys: tuple[int, int]
    skipped: bool
    running_max: np.ndarray
    running_sum: np.ndarray


class RowHistory(NamedTuple):
    """The running statistics of one query row, tile by tile (one entry per tile of
    its row of tiles, in the order processed). Ready to plot against ``key_stop``."""

    key_stop: np.ndarray  # (n,) keys 0..key_stop-1 have been seen after the tile
    skipped: np.ndarray  # (n,) bool
    running_max: np.ndarray  # (n, ...) leading (batch, head) dims of the input last
    running_sum: np.ndarray  # (n, ...)


@dataclass(eq=False)
class TileTrace:
    """What :func:`flash_attention` did, tile by tile; pass one as ``trace=``.

    Each call clears it and then appends a :class:`TileStep` per tile: the rows of tiles
    top to bottom and, within one, its tiles left to right.
    """

    tile_size: int = 0
    num_queries: int = 0  # T
    num_keys: int = 0  # S
    steps: list[TileStep] = field(default_factory=list)

    @property
    def num_computed(self) -> int:
        """Tiles whose scores were computed."""
        return sum(not step.skipped for step in self.steps)

    @property
    def num_skipped(self) -> int:
        """Tiles left out because causal masking blocks all of them."""
        return sum(step.skipped for step in self.steps)

    def row_history(self, query: int) -> RowHistory:
        """The running maximum and sum of query row ``query`` after each of its tiles."""
        if not 0 <= query < self.num_queries:
            raise ValueError(f"query must be in 0..{self.num_queries - 1}, got {query!r}")
        steps = [s for s in self.steps if s.queries[0] <= query < s.queries[1]]
        return RowHistory(
            key_stop=np.array([s.keys[1] for s in steps]),
            skipped=np.array([s.skipped for s in steps]),
            running_max=np.stack([s.running_max[..., query - s.queries[0]] for s in steps]),
            running_sum=np.stack([s.running_sum[..., query - s.queries[0]] for s in steps]),
        )


def flash_attention(
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None = None,
    *,
    tile_size: int = 64,
    causal: bool = False,
    trace: TileTrace | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Scaled dot-product attention computed tile by tile, never holding ``(T, S)`` scores.

    Equal to ``mha.scaled_dot_product_attention(q, k, v, mask)[0]`` up to rounding for
    finite inputs, but at most a ``(tile_size, tile_size)`` tile of scores exists at
    any time.

    Parameters
    ----------
    q : array_like, shape (..., T, Dh)
    k : array_like, shape (..., S, Dh)
    v : array_like, shape (..., S, Dv)
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(..., T, S)`` as in
        :func:`mha.scaled_dot_product_attention`; each tile reads its own slice.
    tile_size : int
        Queries and keys per tile (the last row and column of tiles may be smaller).
    causal : bool
        Query ``t`` may attend to keys ``0..t + S - T`` only: the diagonal aligned to the
        bottom right, as in ``mha.causal_mask(T, num_keys=S)`` (needs ``S >= T``).
        Combined with ``mask`` if both are given. Tiles entirely above the diagonal
        are skipped, not computed.
    trace : TileTrace, optional
        Cleared, then filled with one :class:`TileStep` per tile.

    Returns
    -------
    context : np.ndarray, shape (..., T, Dv)
    logsumexp : np.ndarray, shape (..., T)
        ``log(sum_s exp(scaled score_s))`` over the allowed keys of each row. A row
        with nothing to attend to gets zero context and ``logsumexp = -inf``.

    Raises
    ------
    ValueError
        If ``tile_size`` is not a positive integer, the shapes of ``q``, ``k``, ``v``
        disagree, ``mask`` is not boolean or does not broadcast to ``(..., T, S)``, or
        ``causal`` is set with ``S < T``.

    Notes
    -----
    NaN and infinity with ``causal=True``: the tiles the causal mask skips are never
    read. A NaN or an infinity in ``v`` at key position ``j`` reaches the rows that may
    see ``j`` (as NaN or inf), and of the rows that may not, only those whose computed
    tiles include ``j``: which rows those are depends on ``tile_size``.
    ``mha.scaled_dot_product_attention`` and PyTorch's ``scaled_dot_product_attention``
    multiply every value by its weight, 0 for a blocked key, and ``0 * nan`` and
    ``0 * inf`` are NaN: from them every row that may not see ``j`` is NaN. For finite
    inputs the two agree up to rounding. With ``mask`` alone (``causal=False``) every
    tile is computed, and the rows that hold NaN are the same as theirs.
    """
    q, k, v = as_float_array(q, "q"), as_float_array(k, "k"), as_float_array(v, "v")
    check_qkv(q, k, v)
    tile_size = check_positive_int(tile_size, "tile_size")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if trace is not None and not isinstance(trace, TileTrace):
        raise ValueError(f"trace must be a TileTrace, got {type(trace).__name__}")
    *lead, T, head_dim = q.shape
    S, Dv = v.shape[-2:]
    if causal and S < T:
        raise ValueError(
            f"causal=True needs at least as many keys as queries (the queries are the "
            f"last T of S positions), got q {q.shape} and k {k.shape}"
        )
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (*lead, T, S))
        mask = np.broadcast_to(mask, (*lead, T, S))  # a view: nothing of size T x S is copied
    if trace is not None:
        trace.tile_size, trace.num_queries, trace.num_keys = tile_size, T, S
        trace.steps.clear()

    dtype = np.result_type(q, k, v)
    context = np.empty((*lead, T, Dv), dtype)
    logsumexp = np.empty((*lead, T), dtype)
    for q0 in range(0, T, tile_size):  # one row of tiles: queries q0..q1-1
        q1 = min(q0 + tile_size, T)
        q_tile = q[..., q0:q1, :]  # (..., t, Dh): t <= tile_size queries
        row_max = np.full((*lead, q1 - q0), -np.inf, dtype)  # m
        row_sum = np.zeros((*lead, q1 - q0), dtype)  # l
        acc = np.zeros((*lead, q1 - q0, Dv), dtype)  # unnormalised context
        for k0 in range(0, S, tile_size):  # its tiles, left to right: keys k0..k1-1
            k1 = min(k0 + tile_size, S)
            # Causal: even the row's last query (q1 - 1) sees only keys up to
            # q1 - 1 + S - T. A tile whose keys start after that is masked entirely.
            skipped = causal and k0 > q1 - 1 + S - T
            if not skipped:
                # 1. Scores of this tile only.
                k_tile = np.swapaxes(k[..., k0:k1, :], -1, -2)  # (..., Dh, s): s keys
                scores = q_tile @ k_tile / math.sqrt(head_dim)  # (..., t, s)
                # 2. Blocked pairs get -inf, hence weight exp(-inf) = 0.
                allowed = None if mask is None else mask[..., q0:q1, k0:k1]
                if causal:
                    # (s,) <= (t, 1) -> (t, s): key j is at or below query i's diagonal
                    below = np.arange(k0, k1) <= np.arange(q0, q1)[:, None] + S - T
                    allowed = below if allowed is None else allowed & below
                if allowed is not None:
                    scores = np.where(allowed, scores, -np.inf)
                # 3. The new running maximum. Rows that have allowed nothing yet keep
                #    -inf; they are shifted by 0 instead, so no inf - inf is computed.
                new_max = np.maximum(row_max, scores.max(axis=-1))  # (..., t)
                shift = np.where(np.isneginf(new_max), 0.0, new_max)
                # 4. Re-measure the old sums against the new maximum, then add this tile.
                rescale = np.exp(row_max - shift)  # (..., t), 1 if the max did not grow
                p = np.exp(scores - shift[..., None])  # (..., t, s)
                row_sum = rescale * row_sum + p.sum(axis=-1)
                # (..., t, s) @ (..., s, Dv) -> (..., t, Dv)
                acc = rescale[..., None] * acc + p @ v[..., k0:k1, :]
                row_max = new_max
            if trace is not None:
                trace.steps.append(
                    TileStep((q0, q1), (k0, k1), skipped, row_max.copy(), row_sum.copy())
                )
        # 5. Normalise. A row that allowed nothing has acc = 0, l = 0 and m = -inf:
        #    dividing by 1 instead leaves context 0 and logsumexp -inf.
        divisor = np.where(row_sum > 0, row_sum, 1.0)  # a NaN row stays NaN via acc
        context[..., q0:q1, :] = acc / divisor[..., None]
        logsumexp[..., q0:q1] = row_max + np.log(divisor)
    return context, logsumexp


def peak_memory_bytes(fn: Callable[..., object], /, *args: Any, **kwargs: Any) -> int:
    """Peak memory allocated while ``fn(*args, **kwargs)`` runs, above what was allocated
    before it, in bytes, measured with :mod:`tracemalloc` (which sees NumPy's arrays).

    The result of ``fn`` counts (it exists when ``fn`` returns); the arguments, made
    before the call, do not. Only what Python and NumPy allocate is seen, not memory
    that other libraries manage themselves (BLAS work buffers, torch tensors). A
    running :mod:`tracemalloc` is left running; otherwise it is stopped again.
    """
    started_here = not tracemalloc.is_tracing()
    if started_here:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn(*args, **kwargs)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if started_here:
            tracemalloc.stop()
    return peak - before
