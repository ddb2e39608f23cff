"""FlashAttention's backward, tile by tile (Dao et al., 2022, Algorithm 4).

:func:`mha.flash_attention` saves, per query, the context and the log-sum-exp of its
scores; :func:`flash_attention_backward` rebuilds each tile's weights from them,
``P = exp(c q k^T - lse)``, takes ``delta = rowsum(dO * O)`` once per query, and adds
each tile's share to ``dQ``, ``dK`` and ``dV``: it never holds the ``T x S`` weights.
Walked key tile by key tile (outer) and query tile by query tile (inner); a tile the
causal mask blocks entirely is skipped, as in the forward. :class:`BackwardTileTrace`
records what each tile added. The plain backward it equals is :mod:`mha.backward`'s.

Shapes follow the legend in :mod:`mha`; masks are boolean with **True = may attend**.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mha._checks import (
    as_bool_mask,
    as_float_array,
    check_mask_shape,
    check_positive_int,
    check_qkv,
)
from mha.backward import _check_same_shape

__all__ = ["BackwardTileStep", "BackwardTileTrace", "flash_attention_backward"]


@dataclass(frozen=True, eq=False)
class BackwardTileStep:
    """One tile of :func:`flash_attention_backward`: up to ``tile_size`` queries against
    up to ``tile_size`` keys, and what it added to the three gradients.

    Attributes
    ----------
    queries : (start, stop)  the query rows of the tile
    keys : (start, stop)     the keys of the tile
    skipped : bool           True if causal masking blocks every pair, so the tile was
                             not computed (its additions are zeros)
    dq : np.ndarray, shape (..., stop - start, Dh)
        What the tile added to ``dq[..., queries[0]:queries[1], :]``: ``c dZ k_tile``.
    dk : np.ndarray, shape (..., stop - start, Dh)
        What it added to ``dk[..., keys[0]:keys[1], :]``: ``c dZ^T q_tile``.
    dv : np.ndarray, shape (..., stop - start, Dv)
        What it added to ``dv[..., keys[0]:keys[1], :]``: ``P^T dO_tile``.
    """

    queries: tuple[int, int]
    keys: tuple[int, int]
    skipped: bool
    dq: np.ndarray
    dk: np.ndarray
    dv: np.ndarray


@dataclass(eq=False)
class BackwardTileTrace:
    """What :func:`flash_attention_backward` did, tile by tile; pass one as ``trace=``.

    Each call clears it and then appends a :class:`BackwardTileStep` per tile in the
    order visited: the columns of tiles (keys) left to right and, within one, its tiles
    top to bottom (queries), the order of Dao et al. (2022), Algorithm 4: a column's
    ``dk`` and ``dv`` are finished when the column is, ``dq`` gathers from every column.
    """

    tile_size: int = 0
    num_queries: int = 0  # T
    num_keys: int = 0  # S
    lead: tuple[int, ...] = ()  # the leading (batch, head) dims
    head_dim: int = 0  # Dh
    value_dim: int = 0  # Dv
    steps: list[BackwardTileStep] = field(default_factory=list)

    @property
    def num_computed(self) -> int:
        """Tiles whose weights were rebuilt and whose gradients were added."""
        return sum(not step.skipped for step in self.steps)

    @property
    def num_skipped(self) -> int:
        """Tiles left out because causal masking blocks all of them."""
        return sum(step.skipped for step in self.steps)

    def accumulated(
        self, num_steps: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(dq, dk, dv)`` as the first ``num_steps`` tiles (all by default) left them:
        zeros, then each tile's additions added at its rows, in the order visited."""
        n = len(self.steps) if num_steps is None else num_steps
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= len(self.steps):
            raise ValueError(f"num_steps must be an int in [0, {len(self.steps)}], got {n!r}")
        dtype = np.result_type(*(s.dq for s in self.steps)) if self.steps else np.float64
        dq = np.zeros((*self.lead, self.num_queries, self.head_dim), dtype)
        dk = np.zeros((*self.lead, self.num_keys, self.head_dim), dtype)
        dv = np.zeros((*self.lead, self.num_keys, self.value_dim), dtype)
        for step in self.steps[:n]:
            (q0, q1), (k0, k1) = step.queries, step.keys
            dq[..., q0:q1, :] += step.dq
            dk[..., k0:k1, :] += step.dk
            dv[..., k0:k1, :] += step.dv
        return dq, dk, dv


def flash_attention_backward(
    q: Any,
    k: Any,
    v: Any,
    context: Any,
    logsumexp: Any,
    d_context: Any,
    mask: Any | None = None,
    *,
    tile_size: int = 64,
    causal: bool = False,
    trace: BackwardTileTrace | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gradients of :func:`mha.flash_attention`'s ``q``, ``k``, ``v``, tile by tile, never
    holding a ``(T, S)`` array: the backward pass of Dao et al. (2022), Algorithm 4, with
    one log-sum-exp per row in place of its separate maximum and sum (as FlashAttention-2,
    Dao 2023, keeps it).

    Besides ``q``, ``k`` and ``v``, the forward kept only the context ``O`` and each row's
    log-sum-exp ``lse``. That is enough to rebuild any tile of weights, up to rounding:
    ``P = exp(scaled score - lse)``. The
    softmax's ``rowsum(dP * P)`` is a per-row number too, and equals
    ``D = rowsum(dO * O)`` (``sum_s P_ts dO_t . v_s = dO_t . O_t``), computed once
    before the loop. Then, for each tile of ``tile_size`` keys (outer loop) and
    ``tile_size`` queries (inner loop)::

        P   = exp(q_tile k_tile^T / sqrt(Dh) - lse_tile)      recomputed, (t, s)
        dv_tile += P^T dO_tile
        dP  = dO_tile v_tile^T
        dZ  = P * (dP - D_tile)
        dq_tile += dZ k_tile / sqrt(Dh)
        dk_tile += dZ^T q_tile / sqrt(Dh)

    The price of the memory saved is recomputing the scores: one more ``(t, Dh) @ (Dh, s)``
    product per tile (:func:`mha.cost.attention_backward_macs`).

    Parameters
    ----------
    q, k, v, mask, causal
        As given to :func:`mha.flash_attention` (the tiles it skipped under ``causal``
        are skipped here too).
    context : array_like, shape (..., T, Dv)
    logsumexp : array_like, shape (..., T)
        What :func:`mha.flash_attention` returned: ``-inf`` marks a row with nothing to
        attend to.
    d_context : array_like, shape (..., T, Dv)
        The gradient of ``context``.
    tile_size : int
        Queries and keys per tile; it need not be the forward's (the log-sum-exp is
        one number per row, whatever the tiles).
    trace : BackwardTileTrace, optional
        Cleared, then filled with one :class:`BackwardTileStep` per tile, in the order
        visited: what each tile added to ``dq``, ``dk`` and ``dv``.

    Returns
    -------
    dq : np.ndarray, shape (..., T, Dh)
    dk : np.ndarray, shape (..., S, Dh)
    dv : np.ndarray, shape (..., S, Dv)
        Equal to :func:`attention_backward`'s up to rounding. A row with nothing to
        attend to gets ``dq = 0`` and adds nothing to ``dk``, ``dv``; never NaN.

    Raises
    ------
    ValueError
        As the forward, and if ``context``, ``logsumexp`` or ``d_context`` has the wrong
        shape.
    """
    q, k, v = as_float_array(q, "q"), as_float_array(k, "k"), as_float_array(v, "v")
    check_qkv(q, k, v)
    tile_size = check_positive_int(tile_size, "tile_size")
    if not isinstance(causal, bool):
        raise ValueError(f"causal must be True or False, got {causal!r}")
    if trace is not None and not isinstance(trace, BackwardTileTrace):
        raise ValueError(f"trace must be a BackwardTileTrace, got {type(trace).__name__}")
    *lead, T, head_dim = q.shape
    S, Dv = v.shape[-2:]
    context = as_float_array(context, "context")
    _check_same_shape(context, "context", (*lead, T, Dv), "the forward's context (..., T, Dv)")
    logsumexp = as_float_array(logsumexp, "logsumexp")
    _check_same_shape(logsumexp, "logsumexp", (*lead, T), "the queries (..., T)")
    d_context = as_float_array(d_context, "d_context")
    _check_same_shape(d_context, "d_context", context.shape, "context")
    if causal and S < T:
        raise ValueError(
            f"causal=True needs at least as many keys as queries (the queries are the "
            f"last T of S positions), got q {q.shape} and k {k.shape}"
        )
    if mask is not None:
        mask = as_bool_mask(mask)
        check_mask_shape(mask, (*lead, T, S))
        mask = np.broadcast_to(mask, (*lead, T, S))  # a view: nothing of size T x S is copied

    dtype = np.result_type(q, k, v, context, logsumexp, d_context)
    scale = 1 / math.sqrt(head_dim)
    # D = rowsum(dO * O) = rowsum(dP * P), one number per query: (..., T)
    row_dot = np.einsum("...td,...td->...t", d_context, context)
    # A row with nothing to attend to has lse = -inf and only -inf scores: shift it by 0,
    # so that exp(-inf - 0) = 0 and no -inf - (-inf) = NaN is computed.
    shift = np.where(np.isneginf(logsumexp), 0.0, logsumexp)  # (..., T)
    dq = np.zeros((*lead, T, head_dim), dtype)
    dk = np.zeros((*lead, S, head_dim), dtype)
    dv = np.zeros((*lead, S, Dv), dtype)
    if trace is not None:
        trace.tile_size, trace.num_queries, trace.num_keys = tile_size, T, S
        trace.lead, trace.head_dim, trace.value_dim = tuple(lead), head_dim, Dv
        trace.steps.clear()
    for k0 in range(0, S, tile_size):  # a column of tiles: keys k0..k1-1
        k1 = min(k0 + tile_size, S)
        k_tile, v_tile = k[..., k0:k1, :], v[..., k0:k1, :]  # (..., s, Dh), (..., s, Dv)
        for q0 in range(0, T, tile_size):  # its tiles, top to bottom: queries q0..q1-1
            q1 = min(q0 + tile_size, T)
            if causal and k0 > q1 - 1 + S - T:  # every pair blocked: skipped, as forward
                if trace is not None:  # it adds nothing
                    nothing_q = np.zeros((*lead, q1 - q0, head_dim), dtype)  # (..., t, Dh)
                    nothing_k = np.zeros((*lead, k1 - k0, head_dim), dtype)  # (..., s, Dh)
                    nothing_v = np.zeros((*lead, k1 - k0, Dv), dtype)  # (..., s, Dv)
                    step = BackwardTileStep((q0, q1), (k0, k1), True, nothing_q, nothing_k,
                                            nothing_v)  # fmt: skip
                    trace.steps.append(step)
                continue
            q_tile, d_out = q[..., q0:q1, :], d_context[..., q0:q1, :]  # (..., t, Dh|Dv)
            # 1. The tile's weights, rebuilt from the saved log-sum-exp.
            scores = q_tile @ np.swapaxes(k_tile, -1, -2) * scale  # (..., t, s)
            allowed = None if mask is None else mask[..., q0:q1, k0:k1]
            if causal:
                # (s,) <= (t, 1) -> (t, s): key j is at or below query i's diagonal
                below = np.arange(k0, k1) <= np.arange(q0, q1)[:, None] + S - T
                allowed = below if allowed is None else allowed & below
            if allowed is not None:
                scores = np.where(allowed, scores, -np.inf)
            p = np.exp(scores - shift[..., q0:q1, None])  # (..., t, s), 0 where blocked
            # 2. context = P v.
            add_v = np.swapaxes(p, -1, -2) @ d_out  # (..., s, t) @ (..., t, Dv)
            d_p = d_out @ np.swapaxes(v_tile, -1, -2)  # (..., t, Dv) @ (..., Dv, s)
            # 3. The softmax, with the row's D in place of rowsum(dP * P).
            d_z = p * (d_p - row_dot[..., q0:q1, None])  # (..., t, s), 0 where p = 0
            # 4. The scaled scores q k^T / sqrt(Dh).
            add_q = d_z @ k_tile * scale  # (..., t, s) @ (..., s, Dh)
            add_k = np.swapaxes(d_z, -1, -2) @ q_tile * scale  # (..., s, t) @ (..., t, Dh)
            dq[..., q0:q1, :] += add_q
            dk[..., k0:k1, :] += add_k
            dv[..., k0:k1, :] += add_v
            if trace is not None:
                trace.steps.append(BackwardTileStep((q0, q1), (k0, k1), False, add_q, add_k,
                                                    add_v))  # fmt: skip
    return dq, dk, dv
