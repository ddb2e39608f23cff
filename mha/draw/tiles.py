"""FlashAttention's tiles, drawn from a real :class:`mha.TileTrace`.

:func:`tiles_figure` runs :func:`mha.flash_attention` on the arrays it is given, with
a trace, and draws what the trace recorded: the ``(T, S)`` score matrix cut into
``tile_size`` tiles, each tile coloured by what happened to it (computed; computed
with some pairs then set to ``-inf``; skipped above the causal diagonal) and numbered
in the order it was computed. The tiled context is checked equal to the
specification's, to 1e-12.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mha.draw.layout import Caption, Grid, Legend, compose
from mha.draw.style import (
    BLOCKED_FILL,
    EDGE_COLOR,
    HEAD_COLORS,
    MAX_WIDTH,
    VALUE_PT,
    set_alt_text,
    tint,
)
from mha.draw.tile_trace import traced_flash_attention
from mha.tiled import TileTrace

# What happened to a tile (and to the pairs inside it).
COMPUTED_FILL = tint(HEAD_COLORS[0], 0.45)  # every pair of the tile computed and allowed
PARTIAL_FILL = tint(HEAD_COLORS[1], 0.55)  # computed; the tile's other pairs are blocked
SKIPPED_FILL = "#F4F4F4"  # never computed: causal masking blocks the whole tile
TILE_EDGE = "black"
_CELL_EDGE = "#BBBBBB"  # thin lines between the pairs of a tile

_MAX_TILE_PANELS = 4


def _tile_faces(trace: TileTrace, allowed: np.ndarray) -> tuple[np.ndarray, list[str]]:
    """RGBA fill per pair (T, S, 4) and the kind of every tile, in trace order."""
    face = np.empty((*allowed.shape, 4))
    kinds = []
    for step in trace.steps:
        (q0, q1), (k0, k1) = step.queries, step.keys
        tile = allowed[q0:q1, k0:k1]
        if step.skipped:
            # The figure would lie if a skipped tile held a pair that may attend.
            assert not tile.any(), f"tile {step.queries} x {step.keys} skipped but allowed"
            face[q0:q1, k0:k1] = to_rgba(SKIPPED_FILL)
            kinds.append("skipped")
        elif tile.all():
            face[q0:q1, k0:k1] = to_rgba(COMPUTED_FILL)
            kinds.append("computed")
        else:
            face[q0:q1, k0:k1] = np.where(tile[..., None], to_rgba(PARTIAL_FILL),
                                          to_rgba(BLOCKED_FILL))
            kinds.append("partial")
    return face, kinds


def _draw_tiles(ax: Axes, trace: TileTrace) -> None:
    """A thick outline round every tile; the computed ones numbered 1, 2, ... in order."""
    order = 0
    for step in trace.steps:
        (q0, q1), (k0, k1) = step.queries, step.keys
        outline = Rectangle((k0, q0), k1 - k0, q1 - q0, fill=False, edgecolor=TILE_EDGE,
                            linewidth=1.8, clip_on=False)
        outline.set_gid("tile")
        ax.add_patch(outline)
        if step.skipped:
            continue
        order += 1
        label = ax.text((k0 + k1) / 2, (q0 + q1) / 2, str(order), ha="center", va="center",
                        fontsize=VALUE_PT, color="black",
                        bbox={"boxstyle": "circle,pad=0.18", "facecolor": "white",
                              "edgecolor": EDGE_COLOR, "linewidth": 0.6})
        label.set_gid("tile_order")


def tiles_figure(
    q: Any,
    k: Any,
    v: Any,
    mask: Any | None = None,
    *,
    tile_size: int,
    causal: bool | Sequence[bool] = (False, True),
) -> Figure:
    """The score matrix in tiles, as :func:`mha.flash_attention` walked it.

    The function runs ``flash_attention(q, k, v, mask, tile_size=tile_size,
    causal=c, trace=...)`` once per value ``c`` of ``causal`` and draws one panel for
    each, side by side: the ``(T, S)`` pairs (queries as rows, keys as columns) with a
    thick outline round every tile. A tile is

    * blue when it was computed and every pair in it may attend;
    * orange with dark pairs when it was computed but some of its pairs are blocked
      (by ``mask`` or the causal diagonal): those scores were set to ``-inf``;
    * pale grey, without a number, when it was skipped: causal masking blocks all of it.

    Computed tiles carry their number in the order they were computed (the rows of
    tiles top to bottom, within one its tiles left to right). The caption gives the
    counts of computed and skipped tiles from the trace.

    Parameters
    ----------
    q : array_like, shape (T, Dh)
        One head's queries (NumPy or torch); slice a batch and head out first.
    k : array_like, shape (S, Dh)
    v : array_like, shape (S, Dv)
    mask : bool array_like, optional
        **True = may attend**, broadcastable to ``(T, S)``; the same in every panel.
    tile_size : int
        Queries and keys per tile.
    causal : bool or sequence of bool
        One panel per value; by default without and with causal masking.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``q``, ``k``, ``v`` are not 2-D or do not fit together, ``mask`` is not
        boolean or does not broadcast to ``(T, S)``, ``tile_size`` is not a positive
        integer, ``causal`` holds something other than True / False (or more than 4
        values), ``causal=True`` meets ``S < T``, or the matrix is too large to draw
        8 inches wide.
    """
    panels = [causal] if isinstance(causal, bool) else list(causal)
    if not 0 < len(panels) <= _MAX_TILE_PANELS or not all(isinstance(c, bool) for c in panels):
        raise ValueError(
            f"causal must be True, False or a sequence of 1 to {_MAX_TILE_PANELS} of them, "
            f"got {causal!r}"
        )
    runs = [traced_flash_attention(q, k, v, mask, tile_size, c) for c in panels]
    T, S, b = runs[0].trace.num_queries, runs[0].trace.num_keys, runs[0].trace.tile_size
    if T == 0 or S == 0:
        raise ValueError(f"q and k need at least one query and one key, got T = {T}, S = {S}")
    nq, nk = math.ceil(T / b), math.ceil(S / b)
    grids, counts, seen_kinds = [], [], set()
    for c, run in zip(panels, runs, strict=True):
        trace = run.trace
        assert len(trace.steps) == nq * nk == trace.num_computed + trace.num_skipped
        face, kinds = _tile_faces(trace, run.allowed)
        seen_kinds.update(kinds)
        counts.append(f"causal={c}: {trace.num_computed} of {nq * nk} tiles computed "
                      f"({kinds.count('partial')} with blocked pairs), "
                      f"{trace.num_skipped} skipped")
        grids.append(Grid(face=face, row_labels=[str(t) for t in range(T)],
                          col_labels=[str(s) for s in range(S)], row_name="query",
                          col_name="key", title=f"causal={c}", edge=_CELL_EDGE))
    per_row = len(grids) if len(grids) * S <= 24 else 1
    # The legend names only what the figure shows; four entries take two lines.
    legend = [entry for kind, entry in (
        ("computed", ("computed", COMPUTED_FILL)),
        ("partial", ("computed, with blocked pairs", PARTIAL_FILL)),
        ("partial", ("blocked pair: score set to -inf", BLOCKED_FILL)),
        ("skipped", ("skipped: never computed", SKIPPED_FILL)),
    ) if kind in seen_kinds]
    per_line = 2 if len(legend) == 4 else 3
    rows: list = [
        Caption(f"T = {T} queries, S = {S} keys, tile_size = {b}: {nq} x {nk} tiles, "
                "numbered in the order flash_attention computed them"),
        *[Legend(legend[i : i + per_line]) for i in range(0, len(legend), per_line)],
        *[grids[i : i + per_row] for i in range(0, len(grids), per_row)],
        *[Caption(line) for line in counts],
    ]
    fig, axes = compose(rows)
    if fig.get_size_inches()[0] > MAX_WIDTH + 1e-9:
        plt.close(fig)
        raise ValueError(
            f"a ({T}, {S}) score matrix does not fit {MAX_WIDTH} inches wide; draw fewer "
            "queries or keys"
        )
    for ax, run in zip(axes, runs, strict=True):
        _draw_tiles(ax, run.trace)
    described = ", ".join(
        f"{'with' if c else 'without'} causal masking {run.trace.num_computed} computed "
        f"and {run.trace.num_skipped} skipped" for c, run in zip(panels, runs, strict=True)
    )
    return set_alt_text(
        fig, f"The {T} by {S} score matrix of flash_attention cut into {nq} by {nk} tiles of "
        f"{b} queries and {b} keys, each tile coloured by whether it was computed, computed "
        f"with some pairs blocked, or skipped, the computed ones numbered in order: "
        f"{described}."
    )
