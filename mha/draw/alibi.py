"""ALiBi drawn per head: the bias each head adds to its scores, in the head's colour.

:func:`alibi_figure` draws the bias :func:`mha.alibi_bias` adds to each head's
scores, one grid per head in the head's colour, causal and symmetric, and the bias
against distance as one line per head.

The biases drawn are computed here from the slopes and the distances and checked
equal to :func:`mha.alibi_bias`'s (an ``AssertionError`` if the specification ever
disagrees with the picture).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure

from mha._checks import check_queries_and_keys
from mha.draw.layout import Caption, Grid, Legend, compose, measure
from mha.draw.style import (
    BLOCKED_FILL,
    CELL,
    GUIDE_COLOR,
    HEAD_COLORS,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    check_int_in_range,
    format_value,
    head_cmap,
    head_color,
    head_text_color,
    set_alt_text,
    text_width,
)
from mha.positional import alibi_bias, alibi_slopes

VARIANTS = ("causal", "symmetric")


def slope_text(slope: float) -> str:
    """``"1/4"`` for a power-of-two slope ``2^-k``, else three significant digits."""
    exponent = -np.log2(slope)
    if abs(exponent - round(exponent)) < 1e-12:
        return f"1/{2 ** round(exponent)}"
    return f"{slope:.3g}"


def _auto_decimals(bias: np.ndarray) -> int:
    """Fewest decimals (2 to 4) that keep every non-zero bias from reading as zero."""
    nonzero = np.abs(bias[bias != 0])
    for decimals in (2, 3, 4):
        if nonzero.size == 0 or nonzero.min() >= 0.5 * 10.0**-decimals:
            return decimals
    return 4



def _alibi_grid(bias: np.ndarray, blocked: np.ndarray, h: int, slope: float,
                texts: bool, decimals: int, queries: np.ndarray, first: bool) -> Grid:
    """Head ``h``'s (T, S) bias on its own colour scale, with its colour bar.

    As in the book's other heatmaps, the darker cell holds the larger number: the
    head's colour where the bias is 0 (the score is left as it is), fading to white
    at the head's most negative bias in the grid. Each head has its own scale, so a
    gentle head (slope 1/256) shows its pattern as clearly as a steep one; its colour
    bar, from that bias to 0, says how small the numbers are."""
    lowest = float(bias[~blocked].min()) if (~blocked).any() else 0.0
    if lowest == 0.0:  # one key at distance 0: nothing to compare, the scale of 1 step
        lowest = -slope
    norm = Normalize(lowest, 0.0)
    faces = head_cmap(h)(norm(bias))  # (T, S, 4): white at the lowest bias, colour at 0
    faces[blocked] = to_rgba(BLOCKED_FILL)
    text = None
    if texts:
        text = np.empty(bias.shape, dtype=object)
        for idx in np.ndindex(bias.shape):
            text[idx] = "" if blocked[idx] else format_value(bias[idx], decimals)
    return Grid(face=faces, text=text, row_labels=[str(i) for i in queries],
                col_labels=[str(j) for j in range(bias.shape[1])],
                row_name="query i" if first else None, col_name="key j",
                title=f"head {h}, slope {slope_text(slope)}",
                title_color=head_text_color(h), cmap=head_cmap(h), norm=norm,
                colorbar=True, colorbar_ticks=[lowest, 0.0],
                colorbar_labels=[format_value(lowest, decimals), "0"])


def _bias_lines(ax: Axes, distances: np.ndarray, lines: np.ndarray,
                slopes: np.ndarray) -> None:
    """One line per head: the bias (H, N) against the distance (N,)."""
    for h, (y, slope) in enumerate(zip(lines, slopes, strict=True)):
        # Past the palette the colours repeat: a dashed line tells those heads apart.
        style = "-" if h < len(HEAD_COLORS) else "--"
        (line,) = ax.plot(distances, y, color=head_color(h), marker="o", markersize=3.5,
                          lw=1.5, linestyle=style, label=f"head {h}, slope {slope_text(slope)}")
        line.set_gid("series")
    ax.axhline(0, color=GUIDE_COLOR, lw=0.8, zorder=0)
    ax.set_xticks(distances[:: max(1, len(distances) // 8)])
    ax.tick_params(labelsize=TICK_PT, length=2)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlabel("distance from the query (causal: i − j, symmetric: |i − j|)",
                  fontsize=NAME_PT)
    ax.set_ylabel("bias", fontsize=NAME_PT)
    ax.set_title("bias = −slope × distance, one line per head", fontsize=TITLE_PT)
    ax.legend(fontsize=VALUE_PT, frameon=False, loc="center left", bbox_to_anchor=(1.02, 0.5),
              handlelength=1.6, ncols=1 + (len(slopes) > 8), borderaxespad=0)


def alibi_figure(
    num_heads: int = 4,
    size: int = 3,
    *,
    num_keys: int | None = None,
    variants: Sequence[str] = VARIANTS,
    show_values: bool | None = None,
    decimals: int | None = None,
    max_distance: int | None = 8,
) -> Figure:
    """ALiBi's bias per head: a (T, S) grid for every head in its colour, with its slope.

    Each head ``h`` adds ``-slope_h * distance`` (:func:`mha.alibi_bias`) to its
    scores. As in the book's other heatmaps, darker means larger: a cell is the
    head's colour where the bias is 0 and fades to white at the head's most negative
    bias in the grid. Every grid has its own scale, read from its colour bar (from
    that bias to 0), so that a gentle head's pattern shows as clearly as a steep
    one's; the values written in the cells, and the line plot, compare the heads.
    In the causal grids the keys after the query are dark grey, blocked by the
    causal mask (the bias there is 0 and unused).
    Below, the bias against the distance for distances ``0 .. max_distance``, one
    line per head. The figure checks that the values it draws, computed here from
    the slopes and the distances, equal :func:`mha.alibi_bias` exactly.

    Parameters
    ----------
    num_heads : int
        ``H``, 1 to 16; the slopes are :func:`mha.alibi_slopes` ``(H)``.
    size : int
        ``T``, the number of queries, 1 to 12.
    num_keys : int, optional
        ``S``, ``T <= S <= 12``: the queries are the last ``T`` of ``S`` positions,
        as when decoding with a cache. Default ``T``.
    variants : sequence of "causal" and/or "symmetric"
        Which biases to draw, one row of grids each: causal (a decoder, distance
        ``i - j``) and symmetric (an encoder, distance ``|i - j|``).
    show_values : bool, optional
        Write the bias in the cells. Default: when ``T * S <= 36`` and the grids
        with values need no more rows than without.
    decimals : int, optional
        Rounding of the written values, 0 to 6; default the fewest (at least 2)
        that keep every non-zero bias from reading as 0.
    max_distance : int or None
        The line plot's distances run from 0 to ``max(max_distance, S - 1)``
        (at most 64); None draws no line plot.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If an integer argument is out of range, ``num_keys < size``, or
        ``variants`` is empty, repeats a name or names something else.
    """
    num_heads = check_int_in_range(num_heads, "num_heads", 1, 16)
    size = check_int_in_range(size, "size", 1, 12)
    if num_keys is not None:
        check_int_in_range(num_keys, "num_keys", 1, 12)
    size, num_keys = check_queries_and_keys(size, num_keys)
    if isinstance(variants, str) or not len(variants) or len(set(variants)) != len(variants) \
            or not set(variants) <= set(VARIANTS):
        raise ValueError(
            f"variants must be a non-empty sequence of distinct names from {VARIANTS}, got "
            f"{variants!r}"
        )
    if decimals is not None:
        decimals = check_int_in_range(decimals, "decimals", 0, 6)
    if max_distance is not None:
        max_distance = max(check_int_in_range(max_distance, "max_distance", 1, 64),
                           num_keys - 1)

    slopes = alibi_slopes(num_heads)  # (H,)
    queries = np.arange(num_keys - size, num_keys)  # (T,) the last T positions
    keys = np.arange(num_keys)  # (S,)
    behind = queries[:, None] - keys[None, :]  # (T, 1) - (1, S) -> (T, S): i - j
    drawn: dict[str, np.ndarray] = {}
    blocked: dict[str, np.ndarray] = {}
    for name in variants:
        causal = name == "causal"
        distance = np.maximum(behind, 0) if causal else np.abs(behind)  # (T, S)
        values = slopes[:, None, None] * -distance  # (H, 1, 1) * (T, S) -> (H, T, S)
        # The claim: these are the numbers the specification adds to the scores.
        np.testing.assert_array_equal(values, alibi_bias(num_heads, size, num_keys,
                                                         causal=causal))
        drawn[name] = values
        blocked[name] = behind < 0 if causal else np.zeros(behind.shape, dtype=bool)
    if decimals is None:
        decimals = _auto_decimals(np.concatenate([drawn[n][:, ~blocked[n]].ravel()
                                                  for n in variants]))
    formulas = {
        "causal": "causal (a decoder): bias = −slope × (i − j) for keys j ≤ i; "
                  "the mask blocks later keys",
        "symmetric": "symmetric (an encoder): bias = −slope × |i − j|",
    }

    def grids(name: str, per_row: int, values: bool) -> list[list[Grid]]:
        """The rows of head grids of one variant, ``per_row`` heads a row."""
        heads = [_alibi_grid(drawn[name][h], blocked[name], h, slopes[h], values,
                             decimals, queries, h % per_row == 0) for h in range(num_heads)]
        return [heads[i : i + per_row] for i in range(0, num_heads, per_row)]

    def rows(per_row: int, values: bool, spacer: Grid | None = None) -> list:
        out: list = []
        if "causal" in variants:
            out.append(Legend([("blocked by the causal mask", BLOCKED_FILL)]))
        for name in variants:
            out.append(Caption(formulas[name]))
            out += grids(name, per_row, values)
        if spacer is not None:
            out.append([spacer])
        return out

    def width(per_row: int, values: bool) -> float:
        """Width of the figure with ``per_row`` heads a row (its first row of each
        variant is its widest; captions wrap to the width anyway)."""
        inches, _ = measure([grids(name, per_row, values)[0] for name in variants],
                            cell=CELL if values else 0.3)
        return inches

    def widest_fit(values: bool) -> int:
        """The most heads per row that fit ``MAX_WIDTH``."""
        full = width(num_heads, values)
        if full <= MAX_WIDTH + 1e-9:
            return num_heads
        # Guess from the width of one head, then step down until it fits.
        per_row = max(1, min(num_heads - 1, int(num_heads * MAX_WIDTH / full)))
        while per_row > 1 and width(per_row, values) > MAX_WIDTH + 1e-9:
            per_row -= 1
        return per_row

    if show_values is None:  # values where they fit the cells and cost no extra row
        show_values = size * num_keys <= 36 and (
            math.ceil(num_heads / widest_fit(True)) <= math.ceil(num_heads / widest_fit(False)))
    rows_needed = math.ceil(num_heads / widest_fit(show_values))
    per_row = math.ceil(num_heads / rows_needed)  # rows as even as they can be: 8 -> 4 + 4
    cell = CELL if show_values else 0.3  # colour alone needs smaller cells
    fig, axes = compose(rows(per_row, show_values), cell=cell)
    if max_distance is not None:
        distances = np.arange(max_distance + 1)  # (N,) 0 .. max_distance
        # Read from the specification: one query at the end of N keys sees key N - 1 - d
        # at distance d, in either variant.
        lines = alibi_bias(num_heads, 1, max_distance + 1,
                           causal=variants[0] == "causal")[:, 0, ::-1]  # (H, 1, N) -> (H, N)
        np.testing.assert_array_equal(lines, slopes[:, None] * -distances)
        cell = axes[0].get_position().width * fig.get_size_inches()[0] / num_keys
        plt.close(fig)
        # An empty, invisible grid reserves the room; the line plot then takes its place,
        # with its legend (one or two columns of "head h, slope s") on its right.
        columns = 1 + (num_heads > 8)
        widest = max(text_width(f"head {h}, slope {slope_text(s)}", VALUE_PT)
                     for h, s in enumerate(slopes))
        legend_w = columns * (widest + 0.5) + 0.1
        height = 2.3 + 0.16 * max(0, num_heads / columns - 6)
        room_w = min(MAX_WIDTH - 0.3, 4.4 + legend_w)
        spacer = Grid(face=np.zeros((max(1, round(height / cell)), max(1, int(room_w / cell)),
                                     4)), edge="none")
        fig, axes = compose(rows(per_row, show_values, spacer), cell=cell)
        room = axes.pop()
        box = room.get_position()
        room.remove()
        fig_w, fig_h = fig.get_size_inches()
        left, bottom, top, right = 0.55 / fig_w, 0.5 / fig_h, 0.3 / fig_h, legend_w / fig_w
        plot_ax = fig.add_axes((box.x0 + left, box.y0 + bottom, box.width - left - right,
                                box.height - bottom - top))
        _bias_lines(plot_ax, distances, lines, slopes)
    shown = " and ".join(variants)
    return set_alt_text(
        fig, f"ALiBi biases for {num_heads} heads with slopes "
        f"{', '.join(slope_text(s) for s in slopes)}: one {size} by {num_keys} grid per head "
        f"and variant ({shown}), queries as rows and keys as columns, each on its own "
        f"scale with a colour bar: the head's colour at bias 0, fading to white at the "
        f"head's most negative bias"
        + (f", and a line plot of bias against distance 0 to {max_distance}, one line per "
           "head." if max_distance is not None else ".")
    )
