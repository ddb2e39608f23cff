"""Attention's backward pass, drawn beside its forward, and FlashAttention's backward tile
by tile.

:func:`attention_backward_figure` draws one head's forward in three stages (scores,
softmax, context) and under each its backward, every gradient under the forward value it
belongs to (the same shape, the arrows reversed). :func:`tiled_backward_figure` follows
:func:`mha.tiled_backward.flash_attention_backward` tile by tile from a
:class:`mha.BackwardTileTrace`. Every number drawn comes from :mod:`mha.backward`, and
each figure checks its claim on the arrays before drawing them: the gradients equal
another code path's (the tiled backward, or the plain one) to 1e-12, and blocked pairs
get exactly zero gradient.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import LinearSegmentedColormap, Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mha._checks import as_bool_mask
from mha.backward import AttentionBackwardSteps, attention_backward, attention_backward_steps
from mha.draw.layout import Caption, Grid, Legend, Op, compose, measure
from mha.draw.style import (
    ALLOWED_FILL,
    BLOCKED_FILL,
    HEAD_COLORS,
    MAX_WIDTH,
    cell_texts,
    check_int_in_range,
    check_labels,
    head_cmap,
    head_fill,
    head_text_color,
    neutral_faces,
    set_alt_text,
    tint,
    to_numpy,
)
from mha.draw.tile_trace import ATOL, _as_matrix
from mha.draw.tiles import COMPUTED_FILL, PARTIAL_FILL, SKIPPED_FILL, _draw_tiles
from mha.masks import causal_mask
from mha.tiled import flash_attention
from mha.tiled_backward import BackwardTileTrace, flash_attention_backward

# Gradients on a diverging scale centred on zero: vermillion below, bluish green above
# (two of the Okabe-Ito colours, told apart under the common colour-blindnesses, and
# neither the blue of head 0, in which the forward is drawn).
NEGATIVE_COLOR = HEAD_COLORS[5]
POSITIVE_COLOR = HEAD_COLORS[2]
# An odd number of steps, so that 0 falls on the middle one: white exactly.
GRADIENT_CMAP = LinearSegmentedColormap.from_list(
    "gradient", [NEGATIVE_COLOR, "#FFFFFF", POSITIVE_COLOR], N=255
)
DONE_FILL = tint(HEAD_COLORS[0], 0.15)  # a tile visited before the current one
ROWS_EDGE = "black"  # outline of the rows the current tile added to
_MAX_STEPS = 6  # computed tiles in tiled_backward_figure
_HEAD = 0  # the forward is drawn in head 0's colours


def _labels(n: int) -> list[str]:
    return [str(i) for i in range(n)]


def _fixed(x: np.ndarray, title: str, rows: list[str], cols: list[str], row_name: str,
           col_name: str, decimals: int) -> Grid:
    """A forward input or output (Q, K^T, V, O), in head 0's tint."""
    face = np.broadcast_to(np.array(head_fill(_HEAD)), (*x.shape, 4)).copy()
    return Grid(face=face, text=cell_texts(x, True, decimals), row_labels=rows,
                col_labels=cols, row_name=row_name, col_name=col_name, title=title,
                title_color=head_text_color(_HEAD))


def gradient_faces(x: np.ndarray, top: float) -> np.ndarray:
    """RGBA fills ``(*x.shape, 4)`` of gradients on the diverging scale from ``-top`` to
    ``+top``: white at 0, the colour's strength growing with the square root of the
    magnitude, so that gradients ten times smaller than the largest still show."""
    strength = np.sqrt(np.minimum(np.abs(x) / top, 1.0))
    return GRADIENT_CMAP(0.5 + 0.5 * np.sign(x) * strength)


def _gradient(x: np.ndarray, top: float, title: str, rows: list[str],
              cols: list[str] | None, row_name: str, col_name: str | None, decimals: int,
              blocked: np.ndarray | None = None) -> Grid:
    """A gradient on the diverging scale; ``blocked`` cells dark."""
    face = gradient_faces(x, top)
    if blocked is not None:
        face[blocked] = to_rgba(BLOCKED_FILL)
    return Grid(face=face, text=cell_texts(x, True, decimals), row_labels=rows,
                col_labels=cols, row_name=row_name, col_name=col_name, title=title)


def _scale(*arrays: np.ndarray) -> float:
    """The largest magnitude of every gradient of a figure (1 if all are 0): one scale
    for all of them, so that colours compare."""
    top = max(float(np.max(np.abs(a), initial=0.0)) for a in arrays)
    return top if top > 0 else 1.0


def _scale_entries(top: float, decimals: int) -> list[tuple[str, str]]:
    bound = f"{top:.{decimals}f}"
    return [(f"gradient -{bound}", NEGATIVE_COLOR), ("0", "#FFFFFF"),
            (f"+{bound}", POSITIVE_COLOR)]


def _too_wide(rows: list, align: list[list[int]], what: str) -> None:
    width, _ = measure(rows, align=align)
    if width > MAX_WIDTH + 1e-9:
        raise ValueError(f"{what} does not fit {MAX_WIDTH} inches wide; draw fewer "
                         "queries, keys or dims")


def _check_claims(q: np.ndarray, k: np.ndarray, v: np.ndarray, d_context: np.ndarray,
                  mask: np.ndarray | None, steps: AttentionBackwardSteps,
                  allowed: np.ndarray) -> None:
    """What attention_backward_figure says, checked on the arrays it draws."""
    grads = (steps.dq, steps.dk, steps.dv)
    scale = max(1.0, *(float(np.max(np.abs(g), initial=0.0)) for g in grads))
    # The steps are attention_backward's numbers ...
    for got, want in zip(grads, attention_backward(q, k, v, d_context, mask), strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL * scale)
    # ... and another route gives them too: the tiled backward, which never forms P or
    # dZ whole but rebuilds them tile by tile from the saved log-sum-exp.
    context, lse = flash_attention(q, k, v, mask, tile_size=2)
    np.testing.assert_allclose(context, steps.context, rtol=0, atol=ATOL)
    tiled = flash_attention_backward(q, k, v, context, lse, d_context, mask, tile_size=2)
    for got, want in zip(grads, tiled, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL * scale)
    # Blocked pairs: weight exactly 0, hence dZ exactly 0 (no gradient flows through).
    assert np.all(steps.weights[~allowed] == 0) and np.all(steps.d_masked[~allowed] == 0)
    # Raising a whole row of scores by the same amount changes no weight: dZ's rows sum
    # to 0.
    np.testing.assert_allclose(steps.d_masked.sum(axis=-1), 0.0, rtol=0,
                               atol=ATOL * max(1.0, float(np.abs(steps.d_masked).max())))


def attention_backward_figure(
    q: Any,
    k: Any,
    v: Any,
    d_context: Any,
    mask: Any | None = None,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    decimals: int = 2,
) -> Figure:
    """One head's forward and, under it, its backward: each gradient under its twin.

    Runs :func:`mha.backward.attention_backward_steps` on the arrays and draws three
    stages, each a forward row with its backward row underneath, aligned column by
    column (a gradient has the shape of what it is the gradient of):

    1. ``Q @ K^T = Z`` (scaled by ``c = 1/sqrt(Dh)``, ``-inf`` where blocked) over
       ``dQ = c dZ K``, ``dK^T = c Q^T dZ`` and ``dZ``;
    2. ``Z -> P = softmax(Z)`` over ``dZ <- dP`` and the row sums
       ``delta = rowsum(dP * P)`` that ``dZ = P * (dP - delta)`` subtracts;
    3. ``P @ V = O`` over ``dP = dO V^T``, ``dV = P^T dO`` and the given ``dO``.

    The forward reads left to right, top down; the backward right to left, bottom up,
    from ``dO``. The forward is tinted in head 0's colour (the weights darker where
    larger); gradients are on one diverging scale centred on 0 (vermillion negative,
    green positive), blocked pairs dark (``-inf`` in Z, 0 in P and dZ).

    Before drawing, the figure checks its claims: the gradients equal
    :func:`mha.backward.attention_backward`'s and those of the tiled
    :func:`mha.tiled_backward.flash_attention_backward` to 1e-12 (times their magnitude),
    P and dZ are exactly 0 where the mask blocks, and every row of dZ sums to 0.

    Parameters
    ----------
    q : array_like, shape (T, Dh)
        One head's queries (NumPy or torch); slice a batch and head out first.
    k : array_like, shape (S, Dh)
    v : array_like, shape (S, Dv)
    d_context : array_like, shape (T, Dv)
        ``dO``, the gradient of the context.
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(T, S)``.
    query_tokens : sequence of str, length T, optional
    key_tokens : sequence of str, length S, optional
    decimals : int
        Decimals of the values written in the cells (0 to 6).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If the arrays are not 2-D or do not fit together, ``mask`` is not boolean or does
        not broadcast to ``(T, S)``, a token list has the wrong length, ``decimals`` is
        out of range, there is no query or no key, or the figure would be wider than
        the text.
    """
    q = _as_matrix(q, "q", "(T, Dh)")
    k = _as_matrix(k, "k", "(S, Dh)")
    v = _as_matrix(v, "v", "(S, Dv)")
    d_context = _as_matrix(d_context, "d_context", "(T, Dv)")
    decimals = check_int_in_range(decimals, "decimals", 0, 6)
    if mask is not None:
        mask = as_bool_mask(to_numpy(mask, "mask"))
    # Checks the shapes of the four arrays and the mask.
    steps = attention_backward_steps(q, k, v, d_context, mask)
    t, s, dh, dv = q.shape[0], k.shape[0], q.shape[1], v.shape[1]
    if t == 0 or s == 0:
        raise ValueError(f"q and k need at least one query and one key, got T = {t}, S = {s}")
    allowed = np.ones((t, s), bool) if mask is None else np.broadcast_to(mask, (t, s))
    _check_claims(q, k, v, d_context, mask, steps, allowed)
    qt = check_labels(query_tokens, t, "query_tokens", "T") or _labels(t)
    kt = check_labels(key_tokens, s, "key_tokens", "S") or _labels(s)
    hd, vd = _labels(dh), _labels(dv)
    blocked = ~allowed
    top = _scale(steps.dq, steps.dk, steps.d_masked, steps.d_weights, steps.row_dot,
                 steps.dv, steps.d_context)
    c = 1 / math.sqrt(dh)

    z_face = neutral_faces((t, s))
    z_face[blocked] = to_rgba(BLOCKED_FILL)  # -inf, as in attention_pipeline_figure
    z = Grid(face=z_face, text=cell_texts(steps.masked, True, decimals), row_labels=qt,
             col_labels=kt, row_name="query", col_name="key", title="Z = c Q Kᵀ")
    p_face = head_cmap(_HEAD)(Normalize(0.0, 1.0)(steps.weights))
    p_face[blocked] = to_rgba(BLOCKED_FILL)
    p = Grid(face=p_face, text=cell_texts(steps.weights, True, decimals), row_labels=qt,
             col_labels=kt, row_name="query", col_name="key", title="P = softmax(Z)",
             title_color=head_text_color(_HEAD))

    def grad(x: np.ndarray, title: str, rows: list[str], cols: list[str] | None,
             row_name: str, col_name: str | None, dark: np.ndarray | None = None) -> Grid:
        return _gradient(x, top, title, rows, cols, row_name, col_name, decimals, dark)

    d_z = grad(steps.d_masked, "dZ = P ∘ (dP − δ)", qt, kt, "query", "key", blocked)
    d_p = grad(steps.d_weights, "dP = dO Vᵀ", qt, kt, "query", "key")
    rows: list = [
        Caption(f"One head: T = {t} queries, S = {s} keys, Dh = {dh}, Dv = {dv}, "
                f"c = 1/√{dh} = {c:.2f}"),
        Caption("Upper row of each pair: the forward. Under it: the backward, arrows "
                "reversed, each gradient under what it is the gradient of, starting "
                "from dO, bottom right."),
        Legend(_scale_entries(top, decimals) + (
            [("blocked: -inf in Z, 0 in P and dZ", BLOCKED_FILL)] if blocked.any() else [])),
        Caption(f"forward 1: Z = c Q Kᵀ, ({t}, {dh}) @ ({dh}, {s}) → ({t}, {s}). "
                f"backward 3: dQ = c dZ K → ({t}, {dh}), dKᵀ = c Qᵀ dZ → ({dh}, {s})"),
        [_fixed(q, "Q", qt, hd, "query", f"Dh = {dh}", decimals), Op("@"),
         _fixed(k.T, "Kᵀ", hd, kt, f"Dh = {dh}", "key", decimals),  # (S, Dh) -> (Dh, S)
         Op("="), z],
        [grad(steps.dq, "dQ = c dZ K", qt, hd, "query", f"Dh = {dh}"), Op(""),
         grad(steps.dk.T, "dKᵀ = c Qᵀ dZ", hd, kt, f"Dh = {dh}", "key"),  # (S, Dh) -> (Dh, S)
         Op("←"), d_z],
        Caption("forward 2: P = softmax(Z), row by row. backward 2: dZ = P ∘ (dP − δ), "
                "δ = rowsum(dP ∘ P): every row of dZ sums to 0"),
        [z, Op("→"), p],
        [d_z, Op("←"), d_p, Op(""),
         grad(steps.row_dot[:, None], "δ", qt, None, "query", None)],  # (T,) -> (T, 1)
        Caption(f"forward 3: O = P V, ({t}, {s}) @ ({s}, {dv}) → ({t}, {dv}). "
                f"backward 1: dV = Pᵀ dO → ({s}, {dv}), dP = dO Vᵀ → ({t}, {s})"),
        [p, Op("@"), _fixed(v, "V", kt, vd, "key", f"Dv = {dv}", decimals), Op("="),
         _fixed(steps.context, "O = P V", qt, vd, "query", f"Dv = {dv}", decimals)],
        [d_p, Op(""), grad(steps.dv, "dV = Pᵀ dO", kt, vd, "key", f"Dv = {dv}"), Op("←"),
         grad(steps.d_context, "dO (given)", qt, vd, "query", f"Dv = {dv}")],
    ]
    align = [[4, 5], [7, 8], [10, 11]]
    _too_wide(rows, align, f"attention with T = {t}, S = {s}, Dh = {dh}, Dv = {dv}")
    fig, _ = compose(rows, align=align)
    n_blocked = int(blocked.sum())
    return set_alt_text(
        fig,
        f"One head's attention on {t} queries and {s} keys, in three stages, each with its "
        f"backward underneath: Q times K transposed gives the scaled scores Z "
        f"({n_blocked} pairs blocked), over dQ, dK transposed and dZ; the softmax gives "
        f"the weights P, over dZ, dP and the row sums delta; P times V gives the context "
        f"O, over dP, dV and the given dO. Gradients are coloured on one scale centred "
        f"on zero, blocked pairs dark with zero gradient.",
    )


# ------------------------------------------------------------------------------ tiled


def _map_faces(trace: BackwardTileTrace, allowed: np.ndarray, current: int) -> np.ndarray:
    """RGBA fill per pair (T, S, 4) when step ``current`` of the trace is being done."""
    face = np.broadcast_to(np.array(to_rgba(ALLOWED_FILL)), (*allowed.shape, 4)).copy()
    for i, step in enumerate(trace.steps):
        (q0, q1), (k0, k1) = step.queries, step.keys
        if step.skipped:
            face[q0:q1, k0:k1] = to_rgba(SKIPPED_FILL)
            continue
        if i < current:
            face[q0:q1, k0:k1] = to_rgba(DONE_FILL)
        elif i == current:
            tile = allowed[q0:q1, k0:k1]
            face[q0:q1, k0:k1] = to_rgba(COMPUTED_FILL if tile.all() else PARTIAL_FILL)
        face[q0:q1, k0:k1][~allowed[q0:q1, k0:k1]] = to_rgba(BLOCKED_FILL)
    return face


def _outline_rows(ax: Axes, start: int, stop: int, ncols: int) -> None:
    """A thick outline round rows ``start:stop`` of a gradient: what the tile added to."""
    box = Rectangle((0, start), ncols, stop - start, fill=False, edgecolor=ROWS_EDGE,
                    linewidth=2.2, clip_on=False)
    box.set_gid("tile_rows")
    ax.add_patch(box)


def _so_far(x: np.ndarray, touched: np.ndarray, top: float, decimals: int,
            rows: list[str], cols: list[str], row_name: str, col_name: str,
            title: str | None) -> Grid:
    """A gradient so far: rows no tile has added to yet are blank."""
    face = gradient_faces(x, top)
    face[~touched] = to_rgba(ALLOWED_FILL)
    text = cell_texts(x, True, decimals)
    text[~touched] = ""
    return Grid(face=face, text=text, row_labels=rows, col_labels=cols, row_name=row_name,
                col_name=col_name, title=title)


def _span(start: int, stop: int) -> str:
    return str(start) if stop - start == 1 else f"{start}-{stop - 1}"


def tiled_backward_figure(
    q: Any,
    k: Any,
    v: Any,
    *,
    tile_size: int,
    causal: bool = False,
    mask: Any | None = None,
    d_context: Any | None = None,
    decimals: int = 2,
) -> Figure:
    """FlashAttention's backward, tile by tile, as
    :func:`mha.tiled_backward.flash_attention_backward` walked it.

    The function runs :func:`mha.flash_attention` (for the context and the log-sum-exp
    the backward needs), then ``flash_attention_backward`` with a
    :class:`mha.BackwardTileTrace`, and draws one row per computed tile, in the order
    visited: the columns of key tiles left to right, within one its query tiles top to
    bottom. Each row shows

    * the ``(T, S)`` pairs cut into tiles, numbered in the order visited: the current
      tile blue (orange when some of its pairs are blocked, those dark), the tiles
      visited before it pale blue, the skipped ones (above the causal diagonal) grey;
    * ``dQ``, ``dK`` and ``dV`` as the tiles so far left them (the trace's additions
      summed), on one diverging scale centred on 0, rows no tile has reached yet
      blank, and the rows this tile added to outlined: ``c dZ K`` to its query rows
      of ``dQ``, ``c dZ^T Q`` and ``P^T dO`` to its key rows of ``dK`` and ``dV``.

    A column's ``dK`` and ``dV`` rows are final once its tiles are done; ``dQ`` gathers
    from every column. Before drawing, the figure checks that the trace's additions sum
    to the gradients ``flash_attention_backward`` returned and to the plain
    :func:`mha.backward.attention_backward`'s with the same mask, to 1e-12 (times their
    magnitude), and that skipped tiles hold no pair that may attend.

    Parameters
    ----------
    q : array_like, shape (T, Dh)
        One head's queries (NumPy or torch); slice a batch and head out first.
    k : array_like, shape (S, Dh)
    v : array_like, shape (S, Dv)
    tile_size : int
        Queries and keys per tile.
    causal : bool
        As in :func:`mha.flash_attention`.
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(T, S)``.
    d_context : array_like, shape (T, Dv), optional
        ``dO``; by default all ones (the gradient of the sum of the context).
    decimals : int
        Decimals of the values written in the cells (0 to 6).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If the arrays are not 2-D or do not fit together, ``mask``, ``tile_size`` or
        ``causal`` is invalid (as for :func:`mha.flash_attention`), ``decimals`` is out of
        range, there is no query or no key, more than 6 tiles are computed (use a larger
        ``tile_size``), or the figure would be wider than the text.
    """
    q = _as_matrix(q, "q", "(T, Dh)")
    k = _as_matrix(k, "k", "(S, Dh)")
    v = _as_matrix(v, "v", "(S, Dv)")
    decimals = check_int_in_range(decimals, "decimals", 0, 6)
    t, s, dh, dv = q.shape[0], k.shape[0], q.shape[1], v.shape[1]
    if d_context is None:
        d_context = np.ones((t, dv))
    d_context = _as_matrix(d_context, "d_context", "(T, Dv)")
    if mask is not None:
        mask = as_bool_mask(to_numpy(mask, "mask"))
    # flash_attention checks q, k, v, the mask, tile_size and causal.
    context, lse = flash_attention(q, k, v, mask, tile_size=tile_size, causal=causal)
    if t == 0 or s == 0:
        raise ValueError(f"q and k need at least one query and one key, got T = {t}, S = {s}")
    trace = BackwardTileTrace()
    # It checks d_context's shape.
    grads = flash_attention_backward(q, k, v, context, lse, d_context, mask,
                                     tile_size=tile_size, causal=causal, trace=trace)
    allowed = np.ones((t, s), bool) if mask is None else np.broadcast_to(mask, (t, s))
    if causal:
        allowed = allowed & causal_mask(t, num_keys=s)
    # The claims: the tiles' additions are the gradients, those of the whole (T, S) at once.
    summed = trace.accumulated()
    plain = attention_backward(q, k, v, d_context, allowed)
    for got, returned, want in zip(summed, grads, plain, strict=True):
        # Exact: the same additions, in the same order, as flash_attention_backward's.
        assert np.array_equal(got, returned)
        scale = max(1.0, float(np.abs(want).max(initial=0.0)))
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL * scale)
    for step in trace.steps:
        (q0, q1), (k0, k1) = step.queries, step.keys
        if step.skipped:  # the figure would lie if a skipped tile held an allowed pair
            assert not allowed[q0:q1, k0:k1].any(), f"tile {step.queries} x {step.keys}"
    computed = [i for i, step in enumerate(trace.steps) if not step.skipped]
    if len(computed) > _MAX_STEPS:
        raise ValueError(f"{len(computed)} tiles are computed, more than {_MAX_STEPS} fit on "
                         f"a page: use a larger tile_size than {tile_size}")

    b = trace.tile_size
    nq, nk = math.ceil(t / b), math.ceil(s / b)
    snapshots = [trace.accumulated(i + 1) for i in computed]
    top = _scale(*(g for snap in snapshots for g in snap))
    qt, kt, hd, vd = _labels(t), _labels(s), _labels(dh), _labels(dv)
    touched_q, touched_k = np.zeros(t, bool), np.zeros(s, bool)
    kinds = {"partial" if not allowed[q0:q1, k0:k1].all() else "full"
             for st in trace.steps if not st.skipped
             for (q0, q1), (k0, k1) in [(st.queries, st.keys)]}
    tile_legend = [entry for show, entry in (
        ("full" in kinds, ("this tile", COMPUTED_FILL)),
        ("partial" in kinds, ("this tile, with blocked pairs", PARTIAL_FILL)),
        (len(computed) > 1, ("visited before", DONE_FILL)),
        (bool(trace.num_skipped), ("skipped", SKIPPED_FILL)),
        (not allowed.all(), ("blocked pair", BLOCKED_FILL)),
    ) if show]
    skipped = (f", {trace.num_skipped} skipped (above the causal diagonal)"
               if trace.num_skipped else "")
    rows: list = [
        Caption(f"T = {t} queries, S = {s} keys, tile_size = {b}: {nq} x {nk} tiles, "
                f"{trace.num_computed} computed{skipped}, numbered in the order "
                "flash_attention_backward visits them: a column of keys at a time, its "
                "query tiles top to bottom. Outlined: the rows a tile adds to."),
        Legend(tile_legend),
        Legend(_scale_entries(top, decimals)),
    ]
    align, tiles_at = [], []
    for n, (i, (dq, dk, dvv)) in enumerate(zip(computed, snapshots, strict=True)):
        step = trace.steps[i]
        (q0, q1), (k0, k1) = step.queries, step.keys
        touched_q[q0:q1], touched_k[k0:k1] = True, True
        later = [trace.steps[j] for j in computed[n + 1:]]
        done = not any(st.keys == step.keys for st in later)
        note = f"; dK, dV rows {_span(k0, k1)} are final" if done else ""
        rows.append(Caption(f"tile {n + 1}: queries {_span(q0, q1)}, keys {_span(k0, k1)}: "
                            f"adds c dZ K to dQ rows {_span(q0, q1)}, c dZᵀ Q to dK and "
                            f"Pᵀ dO to dV rows {_span(k0, k1)}{note}"))
        first = n == 0
        face = _map_faces(trace, allowed, i)
        align.append(len(rows))
        tiles_at.append((q0, q1, k0, k1))
        rows.append([
            Grid(face=face, row_labels=qt, col_labels=kt, row_name="query", col_name="key",
                 title="tiles" if first else None, edge="#BBBBBB"),
            _so_far(dq, touched_q[:, None] & np.ones(dh, bool), top, decimals, qt, hd,
                    "query", f"Dh = {dh}", "dQ so far" if first else None),
            _so_far(dk, touched_k[:, None] & np.ones(dh, bool), top, decimals, kt, hd,
                    "key", f"Dh = {dh}", "dK so far" if first else None),
            _so_far(dvv, touched_k[:, None] & np.ones(dv, bool), top, decimals, kt, vd,
                    "key", f"Dv = {dv}", "dV so far" if first else None),
        ])
    rows.append(Caption(f"after the last tile: dQ, dK, dV equal attention_backward's, "
                        f"computed on the whole ({t}, {s}) at once, to 1e-12"))
    _too_wide(rows, [align], f"T = {t}, S = {s}, Dh = {dh}, Dv = {dv}")
    fig, axes = compose(rows, align=[align])
    for r, (q0, q1, k0, k1) in enumerate(tiles_at):
        tiles_ax, dq_ax, dk_ax, dv_ax = axes[4 * r:4 * r + 4]
        _draw_tiles(tiles_ax, trace)  # outlines, computed tiles numbered in trace order
        _outline_rows(dq_ax, q0, q1, dh)
        _outline_rows(dk_ax, k0, k1, dh)
        _outline_rows(dv_ax, k0, k1, dv)
    return set_alt_text(
        fig,
        f"FlashAttention's backward on {t} queries and {s} keys in tiles of {b}: the "
        f"{nq} by {nk} tiles visited a column of keys at a time, top to bottom within it "
        f"({trace.num_computed} computed, {trace.num_skipped} skipped), one row per computed tile "
        f"with dQ, dK and dV as the tiles so far left them and the rows the tile added "
        f"to outlined; after the last tile they equal the plain backward's gradients.",
    )

