"""Chapter 12's exercises (12_how_attention_learns): softmax_backward, head_backward and
tile_backward.

softmax_backward is mha.softmax_backward itself. head_backward is
mha.attention_backward given the forward's saved weights, with another signature;
tile_backward is the body of mha.flash_attention_backward's loop for one tile with no
blocked pair. Their references are written here from those pieces.

Each mistake model is the correct computation with one step done wrong, as a learner
writes it: the Jacobian's diagonal term alone, a sign, the factor p dropped (a blocked
entry then leaks gradient), the row sums taken along the wrong axis or without their
axis kept, a missing transpose, the scale 1/sqrt(Dh) forgotten in dq or dk (or put on
dv, or taken as 1/Dh), a tile's weights normalised over the tile, the tile's own row
sums in place of delta, exp(z) / exp(lse) overflowing.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

import mha

from ._core import _Case, _label, _Mistake

# --------------------------------------------------------------------------- softmax_backward


def _weights(rng: np.random.Generator, shape: tuple[int, ...], axis: int = -1,
             blocked: float = 0.3, spread: float = 2.0) -> np.ndarray:
    """Softmax weights along ``axis``, with about ``blocked`` of the entries 0 (-inf
    scores): mha.softmax gives a slice with nothing allowed all zeros."""
    scores = rng.normal(size=shape) * spread
    scores[rng.random(shape) < blocked] = -np.inf
    return mha.softmax(scores, axis=axis)


def _sm(axis_of_dot: Any = "axis", *, factor: bool = True, sign: float = -1.0,
        keepdims: bool = True, mean: bool = False, diagonal: bool = False) -> Any:
    """A softmax backward, ``p * (dp - p . dp)``, with one step changed."""
    def model(weights: Any, d_weights: Any, axis: int = -1) -> np.ndarray:
        p, dp = np.asarray(weights), np.asarray(d_weights)
        if diagonal:
            return p * dp
        where = axis if axis_of_dot == "axis" else axis_of_dot
        if mean:
            dot = dp.mean(axis=where, keepdims=keepdims)
        else:
            dot = np.sum(p * dp, axis=where, keepdims=keepdims)
        inner = dp + sign * dot
        return p * inner if factor else inner

    return model


def _softmax_backward_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _sm(diagonal=True),
            "Only the Jacobian's diagonal: dz = p * dp forgets that raising one score "
            "lowers every other weight (the - p p^T part of J = diag(p) - p p^T).",
            "Multiply J = diag(p) - p p^T by dp for a row of two weights by hand.",
        ),
        _Mistake(
            _sm(sign=+1.0),
            "The correction is added: dz = p * (dp + p . dp) instead of p * (dp - p . dp).",
            "J = diag(p) - p p^T: the outer product is subtracted.",
        ),
        _Mistake(
            _sm(factor=False),
            "The factor p is missing: dz = dp - p . dp, so a blocked entry (p = 0) and a "
            "row with nothing to attend to get gradient.",
            "Every entry of J = diag(p) - p p^T in row i carries p_i: where p_i = 0, "
            "dz_i = 0.",
        ),
        _Mistake(
            _sm(mean=True),
            "The plain mean of dp replaces its weighted mean p . dp, as if every weight "
            "were equal.",
            "The correction is sum_j p_j dp_j: weight each dp_j by its p_j.",
        ),
        _Mistake(
            _sm(axis_of_dot=-1),
            "The dot product p . dp runs along the last axis whatever axis says.",
            "Sum along the axis the softmax ran along: the argument axis.",
        ),
        _Mistake(
            _sm(axis_of_dot=0),
            "p . dp is summed along axis 0, across the slices, instead of along the "
            "softmax's axis.",
            "Each slice along axis is one softmax: its own dot product, summed along axis.",
        ),
        _Mistake(
            _sm(axis_of_dot=None),
            "p . dp is summed over the whole array: every slice got the same correction.",
            "One dot product per slice along axis: np.sum(..., axis=axis, keepdims=True).",
        ),
        _Mistake(
            _sm(keepdims=False),
            "The row sums lost their axis (no keepdims), so they broadcast along another "
            "axis: right only by luck, or a shape error.",
            "Keep the summed axis with size 1 (keepdims=True) so it lines up with p.",
        ),
    )


def _softmax_backward_cases(rng: np.random.Generator) -> list[_Case]:
    row = mha.softmax(np.where(np.arange(5) == 2, -np.inf, rng.normal(size=5)))
    cases = []
    for p, axis, tag in (
        (row, -1, "one row, a blocked entry"),
        (_weights(rng, (2, 2, 3, 4)), -1, "batch and heads, T != S, a row with nothing "
                                          "allowed"),
        (_weights(rng, (4, 4)), -1, "square"),
        (_weights(rng, (4, 5), 0), 0, "axis=0"),
        (_weights(rng, (2, 4, 3), 1), 1, "axis=1 of three"),
    ):
        if p.ndim == 4:
            p[0, 1, 2] = 0.0  # nothing to attend to
        dp = rng.normal(size=p.shape)
        cases.append(_Case(_label(tag, weights=p, d_weights=dp), (p, dp), {"axis": axis}))
    one_hot = np.eye(4)[[1, 3, 0]]  # (3, 4): saturated rows, one weight 1 each
    dp = rng.normal(size=(3, 4))
    cases.append(_Case(_label("one-hot rows", weights=one_hot), (one_hot, dp)))
    p32 = _weights(rng, (2, 3, 5)).astype(np.float32)
    dp32 = rng.normal(size=(2, 3, 5)).astype(np.float32)
    cases.append(_Case(_label("float32", weights=p32), (p32, dp32), loose=True))
    return cases


# --------------------------------------------------------------------------- head_backward


def _head_backward(q: Any, k: Any, v: Any, weights: Any, d_context: Any) -> tuple[np.ndarray, ...]:
    """One head's (dq, dk, dv) from the saved weights: mha.attention_backward's."""
    return mha.attention_backward(q, k, v, d_context, weights=weights)


def _head(*, dv_t: bool = True, dk_t: bool = True, diagonal: bool = False,
          factor: bool = True, sum_axis: int = -1, scale_q: str = "sqrt",
          scale_k: str = "sqrt", scale_v: bool = False) -> Any:
    """The correct head backward with one step changed. ``scale_*``: "sqrt" (1/sqrt(Dh)),
    "none" or "dh" (1/Dh)."""
    def scale(kind: str, head_dim: int) -> float:
        return {"sqrt": 1 / math.sqrt(head_dim), "none": 1.0, "dh": 1 / head_dim}[kind]

    def model(q: Any, k: Any, v: Any, weights: Any, d_context: Any) -> tuple[np.ndarray, ...]:
        q, k, v, p, d_o = (np.asarray(a) for a in (q, k, v, weights, d_context))
        head_dim = q.shape[-1]
        dv = (np.swapaxes(p, -1, -2) if dv_t else p) @ d_o
        if scale_v:
            dv = dv / math.sqrt(head_dim)
        dp = d_o @ np.swapaxes(v, -1, -2)
        if diagonal:
            dz = p * dp
        else:
            inner = dp - np.sum(p * dp, axis=sum_axis, keepdims=True)
            dz = p * inner if factor else inner
        dq = scale(scale_q, head_dim) * dz @ k
        dk = scale(scale_k, head_dim) * (np.swapaxes(dz, -1, -2) if dk_t else dz) @ q
        return dq, dk, dv

    return model


def _head_backward_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _head(dv_t=False),
            "dv = P dO: the weights are not transposed (a missing transpose; dV = P^T dO).",
            "dV must have the shape (..., S, Dv) of v: (S, T) @ (T, Dv).",
        ),
        _Mistake(
            _head(dk_t=False),
            "dk = c dZ q: dZ is not transposed (a missing transpose; dK = c dZ^T Q).",
            "dK must have the shape (..., S, Dh) of k: (S, T) @ (T, Dh).",
        ),
        _Mistake(
            _head(diagonal=True),
            "Only the Jacobian's diagonal: dZ = P * dP forgets that raising one score "
            "lowers every other weight of its row.",
            "dZ = P * (dP - rowsum(P * dP)): subtract each row's weighted mean of dP.",
        ),
        _Mistake(
            _head(factor=False),
            "A blocked key leaks gradient: dZ = dP - rowsum(P * dP) lacks the factor P, "
            "so entries with weight 0 (and rows with nothing to attend to) pass gradient "
            "to q and k.",
            "dZ = P * (...): where a weight is 0, its score gets no gradient.",
        ),
        _Mistake(
            _head(sum_axis=-2),
            "rowsum(P * dP) is summed over the queries (axis -2) instead of over the keys "
            "of each row (axis -1).",
            "The softmax ran along the keys: each query row has its own sum.",
        ),
        _Mistake(
            _head(scale_q="none"),
            "The scale 1/sqrt(Dh) is forgotten in dq (dk has it).",
            "Q and K both enter the scaled scores c Q K^T: both gradients carry c.",
        ),
        _Mistake(
            _head(scale_k="none"),
            "The scale 1/sqrt(Dh) is forgotten in dk (dq has it).",
            "Q and K both enter the scaled scores c Q K^T: both gradients carry c.",
        ),
        _Mistake(
            _head(scale_q="dh", scale_k="dh"),
            "dq and dk are scaled by 1/Dh instead of 1/sqrt(Dh).",
            "The forward divides the scores by sqrt(Dh): the backward multiplies by the "
            "same factor.",
        ),
        _Mistake(
            _head(scale_v=True),
            "dv is scaled by 1/sqrt(Dh) too, though the values never enter the scores.",
            "The scale sits on the scores only: dV = P^T dO.",
        ),
    )


def _attention_inputs(rng: np.random.Generator, lead: tuple[int, ...], T: int, S: int,
                      Dh: int, Dv: int, mask: Any = None, spread: float = 1.0
                      ) -> tuple[np.ndarray, ...]:
    """q, k, v, the forward's weights and a d_context."""
    q = rng.normal(size=(*lead, T, Dh)) * spread
    k = rng.normal(size=(*lead, S, Dh))
    v = rng.normal(size=(*lead, S, Dv))
    _, weights = mha.scaled_dot_product_attention(q, k, v, mask)
    d_context = rng.normal(size=(*lead, T, Dv))
    return q, k, v, weights, d_context


def _head_backward_cases(rng: np.random.Generator) -> list[_Case]:
    pad = np.ones((2, 1, 2, 5), bool)
    pad[1, ..., 3:] = False  # the second sequence has 3 keys
    pad[0, 0, 1] = False  # a query with nothing to attend to
    specs = (
        ((), 3, 3, 4, 4, mha.causal_mask(3), "T = S, causal"),
        ((2, 2), 2, 5, 3, 4, pad, "batch and heads, T != S, padding, a row with "
                                  "nothing allowed"),
        ((3,), 4, 4, 2, 2, None, "no mask"),
        ((1, 2), 5, 3, 3, 2, None, "T > S, Dv != Dh"),
    )
    cases = []
    for lead, T, S, Dh, Dv, mask, tag in specs:
        args = _attention_inputs(rng, lead, T, S, Dh, Dv, mask)
        cases.append(_Case(_label(tag, q=args[0], k=args[1], v=args[2]), args))
    args = tuple(a.astype(np.float32) for a in _attention_inputs(rng, (2,), 3, 2, 4, 4))
    cases.append(_Case(_label("float32", q=args[0], k=args[1]), args, loose=True))
    return cases


# --------------------------------------------------------------------------- tile_backward


def _tile_backward(q_tile: Any, k_tile: Any, v_tile: Any, d_out: Any, logsumexp: Any,
                   row_dot: Any) -> tuple[np.ndarray, ...]:
    """What one tile adds to (dq, dk, dv): the loop body of mha.flash_attention_backward
    for a tile with no blocked pair."""
    return _tile()(q_tile, k_tile, v_tile, d_out, logsumexp, row_dot)


def _tile(*, renormalise: bool = False, tile_sums: bool = False, scale_scores: bool = True,
          scale_grads: bool = True, divide: bool = False, dk_t: bool = True) -> Any:
    """The tile's backward with one step changed."""
    def model(q_tile: Any, k_tile: Any, v_tile: Any, d_out: Any, logsumexp: Any,
              row_dot: Any) -> tuple[np.ndarray, ...]:
        q, k, v, d_o, lse, d_row = (np.asarray(a) for a in
                                    (q_tile, k_tile, v_tile, d_out, logsumexp, row_dot))
        c = 1 / math.sqrt(q.shape[-1])
        z = q @ np.swapaxes(k, -1, -2)  # (..., t, s)
        if scale_scores:
            z = c * z
        if renormalise:
            p = mha.softmax(z)  # over the tile's keys only
        elif divide:
            p = np.exp(z) / np.exp(lse)[..., None]
        else:
            p = np.exp(z - lse[..., None])
        dv = np.swapaxes(p, -1, -2) @ d_o  # (..., s, Dv)
        dp = d_o @ np.swapaxes(v, -1, -2)  # (..., t, s)
        d = np.sum(p * dp, axis=-1) if tile_sums else d_row
        dz = p * (dp - d[..., None])
        g = c if scale_grads else 1.0
        dq = g * dz @ k
        dk = g * (np.swapaxes(dz, -1, -2) if dk_t else dz) @ q
        return dq, dk, dv

    return model


def _tile_backward_mistakes() -> tuple[_Mistake, ...]:
    return (
        _Mistake(
            _tile(renormalise=True),
            "The tile's weights are a softmax over the tile's keys: they sum to 1 in the "
            "tile, but a tile holds only part of each row.",
            "A weight is exp(score - logsumexp) with the whole row's log-sum-exp.",
        ),
        _Mistake(
            _tile(tile_sums=True),
            "rowsum(P * dP) over the tile's keys replaces delta: the softmax's "
            "backward subtracts the sum over the whole row, which the tile does not hold.",
            "delta = rowsum(dO * O) is that whole-row sum, given as row_dot.",
        ),
        _Mistake(
            _tile(scale_scores=False),
            "The tile's scores are not scaled by 1/sqrt(Dh) before the log-sum-exp is "
            "subtracted, though the forward took it over scaled scores.",
            "Rebuild exactly the softmax's input: q k^T / sqrt(Dh).",
        ),
        _Mistake(
            _tile(scale_grads=False),
            "dq and dk lack the factor 1/sqrt(Dh) of the scaled scores.",
            "dQ = c dZ K and dK = c dZ^T Q, as in the plain backward.",
        ),
        _Mistake(
            _tile(divide=True),
            "exp(score) / exp(logsumexp) overflows for large scores (inf / inf is NaN): "
            "subtract first, then exponentiate.",
            "exp(z - lse) is at most 1, whatever the scores.",
        ),
        _Mistake(
            _tile(dk_t=False),
            "dk = c dZ q: dZ is not transposed (a missing transpose).",
            "The tile's dK has the shape (..., s, Dh) of k_tile: (s, t) @ (t, Dh).",
        ),
    )


def _tile_case(rng: np.random.Generator, lead: tuple[int, ...], T: int, S: int, Dh: int,
               Dv: int, rows: slice, cols: slice, spread: float = 1.0,
               dtype: Any = np.float64) -> tuple[np.ndarray, ...]:
    """A real tile: the forward's log-sum-exp and D of the whole rows, sliced."""
    q = rng.normal(size=(*lead, T, Dh)) * spread
    k = rng.normal(size=(*lead, S, Dh))
    v = rng.normal(size=(*lead, S, Dv))
    d_o = rng.normal(size=(*lead, T, Dv))
    out, lse = mha.flash_attention(q, k, v, tile_size=4)
    row_dot = np.sum(d_o * out, axis=-1)  # (..., T): D = rowsum(dO * O)
    parts = (q[..., rows, :], k[..., cols, :], v[..., cols, :], d_o[..., rows, :],
             lse[..., rows], row_dot[..., rows])
    return tuple(np.ascontiguousarray(a, dtype=dtype) for a in parts)


def _tile_backward_cases(rng: np.random.Generator) -> list[_Case]:
    specs = (
        ((), 6, 8, 4, 4, slice(2, 5), slice(0, 4), 1.0, "a 3 x 4 tile of 6 x 8"),
        ((2, 2), 8, 8, 3, 5, slice(4, 8), slice(0, 4), 1.0, "batch and heads, 4 x 4"),
        ((3,), 5, 9, 4, 2, slice(0, 2), slice(6, 9), 1.0, "a 2 x 3 tile, Dv != Dh"),
        ((1,), 4, 6, 4, 4, slice(0, 4), slice(2, 5), 1000.0, "scores in the thousands"),
    )
    cases = []
    for lead, T, S, Dh, Dv, rows, cols, spread, tag in specs:
        args = _tile_case(rng, lead, T, S, Dh, Dv, rows, cols, spread)
        cases.append(_Case(_label(tag, q_tile=args[0], k_tile=args[1]), args))
    args = _tile_case(rng, (2,), 6, 6, 4, 4, slice(3, 6), slice(0, 3), dtype=np.float32)
    cases.append(_Case(_label("float32", q_tile=args[0], k_tile=args[1]), args, loose=True))
    return cases
