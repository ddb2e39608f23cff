"""FlashAttention's online softmax, drawn from a real :class:`mha.TileTrace`.

:func:`online_softmax_figure` runs :func:`mha.flash_attention` on the arrays it is
given, with a trace, and follows one query row through its key tiles: the scores seen
so far, the running maximum ``m``, the terms ``exp(score - m)`` whose sum is ``l``,
and the factor ``exp(m_old - m_new)`` that re-measures the old sum when ``m`` grows;
then the weights ``exp(score - m) / l``, equal to the softmax of the whole row.

The figure checks its own claim on the arrays it draws: the trace's ``m`` and ``l``
are what the scores seen so far make them, and the final weights equal the
specification's softmax and the tiled context its attention, to 1e-12.
"""

from __future__ import annotations

import math
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Rectangle

from mha.draw.style import (
    BLOCKED_FILL,
    HEAD_COLORS,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    check_index,
    format_value,
    set_alt_text,
    tint,
)
from mha.draw.tile_trace import ATOL, traced_flash_attention

# Colours of the online-softmax figure.
CURRENT_COLOR = HEAD_COLORS[0]  # the keys of the tile just processed
EARLIER_COLOR = "#9A9A9A"  # keys of the tiles before it
MAX_COLOR = HEAD_COLORS[5]  # the running maximum m
OLD_MAX_COLOR = "#777777"

_MAX_STEPS = 6  # computed tiles of one row in online_softmax_figure


def _fmt(x: float) -> str:
    """A statistic in the step texts: 2 decimals, ``-inf`` as such, never ``-0.00``."""
    return format_value(x, 2)


def _step_lines(old_m: float, m: float, old_l: float, l_new: float, tile_max: float,
                tile_sum: float) -> list[tuple[str, str]]:
    """What one tile did to ``m`` and ``l``, in numbers: (text, colour) per line."""
    if np.isneginf(m):
        return [("no key allowed yet:", "black"), ("m = -inf, l = 0", "black")]
    if np.isneginf(old_m):  # the first tile with an allowed key: l was 0
        return [(f"m = tile max = {_fmt(m)}", "black"),
                (f"l = sum of the terms = {_fmt(l_new)}", "black")]
    factor = math.exp(old_m - m)  # 1 unless the maximum grew
    rescale = (f"rescale = exp({_fmt(old_m)} - {_fmt(m)}) = {_fmt(factor)}", MAX_COLOR)
    if m == old_m:
        rescale = ("m unchanged: rescale = 1", "black")
    return [
        (f"m = max({_fmt(old_m)}, {_fmt(tile_max)}) = {_fmt(m)}", "black"),
        rescale,
        (f"l = {_fmt(factor)} × {_fmt(old_l)} + {_fmt(tile_sum)} = {_fmt(l_new)}", "black"),
    ]


def _gid(artists: Any, gid: str) -> None:
    """Tag every rectangle of a bar chart, so that tests can find them."""
    for artist in artists:
        artist.set_gid(gid)


def _style(ax: Axes, num_keys: int, max_labels: int) -> None:
    ax.tick_params(labelsize=TICK_PT, length=2, pad=2)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlim(-0.6, num_keys - 0.4)
    ax.set_xticks(np.arange(0, num_keys, math.ceil(num_keys / max_labels)))


def _lines(ax: Axes, lines: list[tuple[str, str]], first_bold: str | None = None) -> None:
    """Lines of text from the top-left corner of an empty axes, one every 13 points."""
    if first_bold:
        lines = [(first_bold, "black"), *lines]
    for j, (text, color) in enumerate(lines):
        note = ax.annotate(text, (0, 1), xycoords="axes fraction", xytext=(0, -13 * j),
                           textcoords="offset points", va="top", fontsize=VALUE_PT,
                           color=color, fontweight="bold" if first_bold and j == 0 else None)
        note.set_gid("step_text")


# Inches: the figure is laid out by hand so that rows line up whatever their contents.
_LEFT, _PANEL, _MIDDLE, _TEXT = 0.62, 2.05, 3.27, 5.52
_TOP, _ROW, _AXES_H, _FINAL_GAP, _FINAL_H, _BOTTOM = 1.08, 1.32, 0.92, 0.2, 1.0, 0.5


def online_softmax_figure(
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None = None,
    *,
    query: int,
    tile_size: int,
    causal: bool = False,
) -> Figure:
    """One query row of :func:`mha.flash_attention`, tile by tile: why rescaling is exact.

    The function runs ``flash_attention`` with a trace and reads the row's running
    maximum ``m`` and running sum ``l`` after each of its key tiles from
    ``trace.row_history(query)``. One row of panels per computed tile:

    * left: the row's scaled scores ``q_t . k_s / sqrt(Dh)`` of the keys seen so far
      (this tile's in blue, earlier ones grey, blocked keys as dark crosses), the
      running maximum ``m`` as a line, and the previous ``m`` dashed when it grew;
    * middle: the terms ``exp(score - m)``, whose sum is ``l``; when ``m`` grew, the
      earlier terms shrank by ``exp(m_old - m_new)``: their old heights are outlined;
    * right: the update in numbers, ``l = exp(m_old - m_new) * l_old + tile sum``.

    The last row shows the weights ``exp(score - m) / l`` from the final ``m`` and
    ``l``, with the softmax of the whole row (the specification's weights) as black
    marks: checked equal to 1e-12, as is the tiled context.

    Parameters
    ----------
    q : array_like, shape (T, Dh)
        One head's queries (NumPy or torch); slice a batch and head out first.
    k : array_like, shape (S, Dh)
    v : array_like, shape (S, Dv)
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(T, S)``.
    query : int
        The row ``t`` to follow, ``0 <= t < T``.
    tile_size : int
        Queries and keys per tile.
    causal : bool
        As in :func:`mha.flash_attention`; tiles skipped for this row are not drawn
        (the heading counts them).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If the arrays are not 2-D or do not fit together, ``mask``, ``tile_size`` or
        ``causal`` is invalid, ``query`` is out of range, the row may attend to no key,
        or it spans more than 6 computed tiles (use a larger ``tile_size``).
    """
    run = traced_flash_attention(q, k, v, mask, tile_size, causal)
    trace, allowed, weights = run.trace, run.allowed, run.weights
    T, S = trace.num_queries, trace.num_keys
    t = check_index(query, T, "query", "T")
    if not allowed[t].any():
        raise ValueError(f"query row {t} may attend to no key: its weights are all 0 and "
                         "there is no softmax to follow")
    history = trace.row_history(t)
    done = ~history.skipped
    key_stop = history.key_stop[done]
    m_run, l_run = history.running_max[done], history.running_sum[done]  # (n,) each
    n = len(key_stop)
    if n > _MAX_STEPS:
        raise ValueError(f"query row {t} spans {n} computed key tiles, more than "
                         f"{_MAX_STEPS} fit on a page: use a larger tile_size than "
                         f"{tile_size}")
    key_start = [s.keys[0] for s in trace.steps  # the first key of each computed tile
                 if s.queries[0] <= t < s.queries[1] and not s.skipped]
    # (S, Dh) @ (Dh,) -> (S,): the row's scores, which the tiles saw piece by piece.
    scores = np.where(allowed[t], run.k @ run.q[t] / math.sqrt(run.q.shape[1]), -np.inf)
    # The trace's m and l are what the scores seen so far say they must be.
    for i, stop in enumerate(key_stop):
        seen = scores[:stop]
        np.testing.assert_allclose(m_run[i], seen.max(), rtol=ATOL, atol=ATOL)
        if np.isfinite(m_run[i]):
            np.testing.assert_allclose(l_run[i], np.exp(seen - m_run[i]).sum(), rtol=ATOL)
    final = np.exp(scores - m_run[-1]) / l_run[-1]  # (S,): the weights from m and l alone
    np.testing.assert_allclose(final, weights[t], rtol=0, atol=ATOL)
    # (S,) @ (S, Dv) -> (Dv,): the tiled context is these weights applied to v.
    np.testing.assert_allclose(run.context[t], final @ run.v, rtol=ATOL, atol=ATOL)

    finite = scores[np.isfinite(scores)]
    pad = 0.15 * float(finite.max() - finite.min()) + 0.1
    ylim = (float(finite.min()) - pad, float(finite.max()) + pad)
    keys = np.arange(S)
    height = _TOP + n * _ROW + _FINAL_GAP + _FINAL_H + _BOTTOM
    fig = plt.figure(figsize=(MAX_WIDTH, height), facecolor="white")

    def axes_at(x: float, y: float, w: float, h: float) -> Axes:
        """Axes ``w`` x ``h`` inches whose top-left corner is (x, y) from the top left."""
        return fig.add_axes((x / MAX_WIDTH, 1 - (y + h) / height, w / MAX_WIDTH, h / height))

    grew_anywhere = False
    old_m, old_l = -np.inf, 0.0
    for i in range(n):
        k0, k1 = key_start[i], int(key_stop[i])
        m, l_new = float(m_run[i]), float(l_run[i])
        top = _TOP + i * _ROW
        ax_s, ax_e = axes_at(_LEFT, top, _PANEL, _AXES_H), axes_at(_MIDDLE, top, _PANEL, _AXES_H)
        seen, now = keys < k1, (keys >= k0) & (keys < k1)
        ok = seen & np.isfinite(scores)
        colors = np.where(now, CURRENT_COLOR, EARLIER_COLOR)
        for ax in (ax_s, ax_e):
            _style(ax, S, 8)
            ax.axvspan(k0 - 0.5, k1 - 0.5, color=tint(CURRENT_COLOR, 0.12), lw=0,
                       gid="tile_span")
        # Left: the scores seen so far and the running maximum.
        if ok.any():
            ax_s.scatter(keys[ok], scores[ok], s=22, c=list(colors[ok]), zorder=3,
                         gid="scores")
        blocked = seen & ~np.isfinite(scores)
        if blocked.any():
            ax_s.scatter(keys[blocked], np.full(int(blocked.sum()), ylim[0] + 0.08 * pad),
                         marker="x", s=22, color=BLOCKED_FILL, zorder=3, gid="blocked")
        grew = bool(np.isfinite(old_m) and m > old_m)
        grew_anywhere |= grew
        if grew:
            ax_s.axhline(old_m, color=OLD_MAX_COLOR, ls="--", lw=1.0, gid="old_max")
        if np.isfinite(m):
            ax_s.axhline(m, color=MAX_COLOR, lw=1.5, gid="running_max")
            ax_s.annotate("m", (1, m), xycoords=("axes fraction", "data"), xytext=(3, 0),
                          textcoords="offset points", color=MAX_COLOR, fontsize=NAME_PT,
                          va="center")
        ax_s.set_ylim(*ylim)
        ax_s.set_ylabel("score", fontsize=NAME_PT)
        # Middle: the terms exp(score - m), whose sum is l. Earlier terms were measured
        # against the old maximum; when m grows they shrink by exp(old_m - m).
        terms = np.exp(scores[ok] - m)
        _gid(ax_e.bar(keys[ok], terms, width=0.7, color=list(colors[ok]), zorder=2), "terms")
        if grew:
            earlier = ok & (keys < k0)
            _gid(ax_e.bar(keys[earlier], np.exp(scores[earlier] - old_m), width=0.7,
                          fill=False, edgecolor=OLD_MAX_COLOR, ls="--", lw=0.9, zorder=3),
                 "old_terms")
        ax_e.set_ylim(0, 1.12)
        ax_e.set_yticks([0, 0.5, 1])
        ax_e.set_ylabel("term", fontsize=NAME_PT)
        # Right: the update in numbers.
        tile = scores[k0:k1][np.isfinite(scores[k0:k1])]
        tile_max = float(tile.max()) if tile.size else -np.inf
        tile_sum = float(np.exp(tile - m).sum()) if np.isfinite(m) else 0.0
        ax_t = axes_at(_TEXT, top, MAX_WIDTH - _TEXT - 0.05, _AXES_H)
        ax_t.axis("off")
        _lines(ax_t, _step_lines(old_m, m, old_l, l_new, tile_max, tile_sum),
               first_bold=f"tile {i + 1}: keys {k0}-{k1 - 1}")
        if i == 0:
            ax_s.set_title("scores seen so far", fontsize=TITLE_PT)
            ax_e.set_title("terms exp(score - m)", fontsize=TITLE_PT)
            ax_t.set_title("update of m and l", fontsize=TITLE_PT, loc="left")
        old_m, old_l = m, l_new

    # Last row: the weights from the final m and l, and the softmax of the whole row.
    top = _TOP + n * _ROW + _FINAL_GAP
    ax_w = axes_at(_LEFT, top, _MIDDLE + _PANEL - _LEFT, _FINAL_H)
    _style(ax_w, S, 16)
    bars = ax_w.bar(keys, final, width=0.7, color=CURRENT_COLOR, zorder=2,
                    label="exp(score - m) / l")
    _gid(bars, "weights")
    marks = ax_w.scatter(keys, weights[t], marker="_", s=150, color="black", lw=1.6, zorder=3,
                         label="softmax of the whole row", gid="softmax")
    ax_w.set_ylim(0, float(final.max()) * 1.15)
    ax_w.set_xlabel("key", fontsize=NAME_PT, labelpad=1)
    ax_w.set_ylabel("weight", fontsize=NAME_PT)
    ax_w.set_title("weights after the last tile", fontsize=TITLE_PT)
    ax_f = axes_at(_TEXT, top, MAX_WIDTH - _TEXT - 0.05, _FINAL_H)
    ax_f.axis("off")
    _lines(ax_f, [(f"m = {_fmt(m_run[-1])}, l = {_fmt(l_run[-1])}", "black"),
                  ("the bars equal the marks", "black"),
                  ("to 1e-12: tiling lost nothing", "black")], first_bold="after the last tile")
    # Below the 4 lines of text (13 points each) of a _FINAL_H inch tall axes.
    legend = ax_f.legend(handles=[bars, marks], loc="upper left",
                         bbox_to_anchor=(-0.03, 1 - 56 / (72 * _FINAL_H)), fontsize=VALUE_PT,
                         frameon=False, handlelength=1.4, borderaxespad=0)
    legend.set_gid("weights_legend")

    skipped = int(history.skipped.sum())
    heading = (f"Online softmax of query {t}: {n} key tile{'s' if n > 1 else ''} of "
               f"tile_size = {tile_size}")
    if skipped:
        heading += f", {skipped} skipped (above the causal diagonal)"
    fig.text(0.08 / MAX_WIDTH, 1 - 0.1 / height, heading, fontsize=TITLE_PT, va="top",
             fontweight="bold")
    keys_legend = [
        Line2D([], [], marker="o", ls="", color=CURRENT_COLOR, label="this tile's keys"),
        Line2D([], [], marker="o", ls="", color=EARLIER_COLOR, label="earlier tiles' keys"),
        Line2D([], [], color=MAX_COLOR, lw=1.5, label="running max m"),
    ]
    if n == 1:
        del keys_legend[1]  # no earlier tiles to tell apart
    if grew_anywhere:
        keys_legend += [
            Line2D([], [], color=OLD_MAX_COLOR, ls="--", lw=1.0, label="m before this tile"),
            Rectangle((0, 0), 1, 1, fill=False, edgecolor=OLD_MAX_COLOR, ls="--",
                      label="term before rescaling"),
        ]
    if np.isneginf(scores).any():
        keys_legend.append(Line2D([], [], marker="x", ls="", color=BLOCKED_FILL,
                                  label="blocked key"))
    fig.legend(handles=keys_legend, loc="upper left", ncol=3, fontsize=VALUE_PT,
               frameon=False, bbox_to_anchor=(0.02 / MAX_WIDTH, 1 - 0.3 / height),
               handlelength=1.6, columnspacing=1.2).set_gid("keys_legend")
    return set_alt_text(
        fig, f"Query row {t}'s online softmax over its {n} computed key tiles of "
        f"{tile_size} keys: for each tile the scores seen so far with the running maximum "
        f"m, the terms exp(score - m) whose sum is l, and the rescaling factor "
        f"exp(m_old - m_new) when m grows; last, the weights exp(score - m) / l, which "
        f"equal the softmax of the whole row of {S} keys."
    )
