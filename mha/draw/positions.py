"""Where a token is, drawn: RoPE's rotations and ALiBi's biases.

:func:`rope_figure` takes a real query and key head vector and draws what
:func:`mha.apply_rope` does to them: every pair of dimensions is an arrow that turns
as the position grows, a fast pair a whole radian per position, a slow pair barely;
a query at ``m`` and a key at ``n`` make the same angle whenever ``m - n`` is the
same, so their score depends on the gap only. :func:`alibi_figure` draws the bias
:func:`mha.alibi_bias` adds to each head's scores, one grid per head in the head's
colour, causal and symmetric, and the bias against distance as one line per head.

Both figures check the claim they illustrate on the very arrays they draw (an
``AssertionError`` if the specification ever disagrees with the picture).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.colors import Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle, FancyArrowPatch, Rectangle

from mha.draw.layout import Caption, Grid, Legend, compose, measure
from mha.draw.style import (
    BLOCKED_FILL,
    CELL,
    EDGE_COLOR,
    HEAD_COLORS,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    format_value,
    head_cmap,
    head_color,
    head_text_color,
    set_alt_text,
    text_color_on,
    text_width,
    tint,
    to_numpy,
)
from mha.positional import alibi_bias, alibi_slopes, apply_rope

_GUIDE = "#BBBBBB"  # axes through the origin and the circle a tip travels on
_ARROW_WIDTH = 1.6
_CLOSE = {"rtol": 1e-12, "atol": 1e-12}
VARIANTS = ("causal", "symmetric")


def _check_int(value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]``, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
        low <= value <= high
    ):
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def _head_vector(x: Any, name: str) -> np.ndarray:
    """One head's query or key as a finite float64 vector of shape (Dh,)."""
    arr = to_numpy(x, name)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be a numeric array, got dtype {arr.dtype}")
    if arr.ndim != 1:
        raise ValueError(f"{name} must have shape (Dh,) (one head's vector), got {arr.shape}")
    arr = arr.astype(np.float64)
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


# ------------------------------------------------------------------------- RoPE


def _rotate(pair: np.ndarray, angle: float) -> np.ndarray:
    """``pair`` (2,) turned counter-clockwise by ``angle`` radians: a 2 x 2 rotation."""
    c, s = np.cos(angle), np.sin(angle)
    return np.array([[c, -s], [s, c]]) @ pair  # (2, 2) @ (2,) -> (2,)


def _arrow(ax: Axes, tip: np.ndarray, color: Any, style: str = "-") -> None:
    arrow = FancyArrowPatch((0.0, 0.0), (float(tip[0]), float(tip[1])), arrowstyle="-|>",
                            mutation_scale=11, color=color, lw=_ARROW_WIDTH, linestyle=style,
                            shrinkA=0, shrinkB=0, zorder=3)
    arrow.set_gid("vector")
    ax.add_patch(arrow)


def _arc(ax: Axes, radius: float, start: float, stop: float, color: Any) -> None:
    """An angle mark from ``start`` to ``stop`` radians (counter-clockwise)."""
    low, high = min(start, stop), max(start, stop)
    arc = Arc((0.0, 0.0), 2 * radius, 2 * radius, theta1=float(np.degrees(low)),
              theta2=float(np.degrees(high)), color=color, lw=1.1, zorder=2)
    arc.set_gid("angle")
    ax.add_patch(arc)


def _label(ax: Axes, text: str, where: np.ndarray, color: Any, gid: str,
           size: float = NAME_PT, outward: bool = False) -> None:
    """Text at ``where``; ``outward`` anchors it on its side nearest the origin, so a
    label beside an arrow's tip stays clear of the arrowhead."""
    ha, va = "center", "center"
    if outward:
        direction = where / (float(np.hypot(*where)) or 1.0)
        ha = "left" if direction[0] > 0.35 else "right" if direction[0] < -0.35 else "center"
        va = "bottom" if direction[1] > 0.35 else "top" if direction[1] < -0.35 else "center"
    note = ax.text(float(where[0]), float(where[1]), text, ha=ha, va=va, color=color,
                   fontsize=size, zorder=4)
    note.set_gid(gid)


def _plane(ax: Axes, radius: float, xlabel: str, ylabel: str) -> None:
    """Equal-scale axes around the origin, with the circle of ``radius`` faintly drawn."""
    ax.axhline(0, color=_GUIDE, lw=0.8, zorder=0)
    ax.axvline(0, color=_GUIDE, lw=0.8, zorder=0)
    circle = Circle((0.0, 0.0), radius, fill=False, color=_GUIDE, lw=0.8, ls=":", zorder=1)
    ax.add_patch(circle)
    lim = 1.7 * radius
    ax.set_xlim(-lim, lim)
    ax.set_ylim(-lim, lim)
    ax.set_aspect("equal")
    ax.locator_params(nbins=4)
    ax.tick_params(labelsize=TICK_PT, length=2)
    ax.set_xlabel(xlabel, fontsize=NAME_PT, labelpad=1)
    ax.set_ylabel(ylabel, fontsize=NAME_PT, labelpad=1)


def _tip_groups(angles: np.ndarray, min_gap: float = np.radians(18)) -> list[list[int]]:
    """Runs of consecutive positions whose arrows are too close to label one by one."""
    groups: list[list[int]] = [[0]]
    for m in range(1, len(angles)):
        if abs(angles[m] - angles[groups[-1][0]]) < min_gap:
            groups[-1].append(m)
        else:
            groups.append([m])
    return groups


def _pair_panel(ax: Axes, tips: np.ndarray, pair: int, theta: float, head: int) -> None:
    """Pair ``pair`` of the query at positions 0..P-1: ``tips`` (P, 2), angle marks."""
    num = tips.shape[0]
    radius = float(np.hypot(*tips[0]))
    _plane(ax, radius, f"dim {2 * pair}", f"dim {2 * pair + 1}")
    start = float(np.arctan2(tips[0, 1], tips[0, 0]))
    angles = start + theta * np.arange(num)  # (P,) unwrapped: the m-th arrow's direction
    shades = np.linspace(0.35, 1.0, num)  # later positions darker
    for m in range(num):
        _arrow(ax, tips[m], tint(head_color(head), shades[m]))
    # One mark per step of one position, all the same size, each named when there is
    # room; a slow pair's steps are too small to name, so one more mark spans them all.
    for m in range(1, num):
        _arc(ax, 0.42 * radius, angles[m - 1], angles[m], EDGE_COLOR)
        if theta > np.radians(25):
            mid = angles[m - 1] + theta / 2
            _label(ax, rf"$\theta_{{{pair}}}$", 0.62 * radius * np.array([np.cos(mid),
                   np.sin(mid)]), "black", "angle_label", size=VALUE_PT + 0.5)
    if theta <= np.radians(25):
        _arc(ax, 0.7 * radius, angles[0], angles[-1], EDGE_COLOR)
        beside = angles[0] - np.radians(28)  # clockwise of the bundle of arrows
        total = f"${num - 1}\\theta_{{{pair}}}$ = {np.degrees(angles[-1] - angles[0]):.2g}°"
        _label(ax, total, 0.62 * radius * np.array([np.cos(beside), np.sin(beside)]),
               "black", "angle_label", size=VALUE_PT + 0.5)
    for group in _tip_groups(angles):
        m0, m1 = group[0], group[-1]
        text = f"m={m0}" if m0 == m1 else f"m={m0}…{m1}"
        middle = float(np.mean(angles[group]))
        where = 1.1 * radius * np.array([np.cos(middle), np.sin(middle)])
        _label(ax, text, where, head_text_color(head), "tip_label", size=VALUE_PT,
               outward=True)
    rate = "1 rad" if pair == 0 else f"{theta:.3g} rad"
    ax.set_title(f"q, pair i = {pair} ({'fast' if pair == 0 else 'slow'}):\n"
                 f"{rate} = {np.degrees(theta):.3g}° per position", fontsize=TITLE_PT)


def _gap_panel(ax: Axes, q_dirs: list[np.ndarray], k_dirs: list[np.ndarray],
               pairs_mn: list[tuple[int, int]], head: int) -> list[float]:
    """Pair 0 of q at m and k at n, as unit vectors, for two (m, n) with one gap.

    Returns the angle from k_n to q_m of each, in (-pi, pi].
    """
    _plane(ax, 1.0, "dim 0", "dim 1")
    shades = (0.5, 1.0)
    gaps = []
    for j, ((m, n), qt, kt) in enumerate(zip(pairs_mn, q_dirs, k_dirs, strict=True)):
        color = tint(head_color(head), shades[j])
        _arrow(ax, qt, color, "-")
        _arrow(ax, kt, color, "--")
        aq, ak = float(np.arctan2(qt[1], qt[0])), float(np.arctan2(kt[1], kt[0]))
        gap = (aq - ak + np.pi) % (2 * np.pi) - np.pi  # signed, in (-pi, pi]
        gaps.append(gap)
        r = 0.3 + 0.22 * j
        _arc(ax, r, ak, ak + gap, color)
        mid = ak + gap / 2
        _label(ax, f"{abs(np.degrees(gap)):.0f}°", (r + 0.14) * np.array([np.cos(mid),
               np.sin(mid)]), "black", "angle_label", size=VALUE_PT)
        for tip, name, pos in ((qt, "q", m), (kt, "k", n)):
            _label(ax, f"${name}_{{{pos}}}$", 1.08 * tip, head_text_color(head), "tip_label",
                   outward=True)
    note = ax.text(0.02, 0.02, "pair 0, length 1", transform=ax.transAxes, ha="left",
                   va="bottom", fontsize=VALUE_PT, color=EDGE_COLOR)
    note.set_gid("note")
    gap = pairs_mn[0][0] - pairs_mn[0][1]
    ax.set_title(f"q at m (solid), k at n (dashed):\nm − n = {gap} twice, same angle",
                 fontsize=TITLE_PT)
    return gaps


def _score_grid(ax: Axes, scores: np.ndarray, offset: int, head: int) -> None:
    """Scores (L, L) as cells with their values; the diagonal ``m - n = offset`` framed."""
    size = scores.shape[0]
    norm = Normalize(float(scores.min()), float(scores.max()))
    faces = head_cmap(head)(norm(scores.ravel()))  # (L*L, 4), row-major
    rects = [Rectangle((n, m), 1, 1) for m in range(size) for n in range(size)]
    cells = PatchCollection(rects, facecolors=faces, edgecolors=EDGE_COLOR, linewidths=0.6)
    cells.set_gid("cells")
    cells.set_clip_on(False)
    ax.add_collection(cells)
    for idx, v in enumerate(scores.ravel()):
        m, n = divmod(idx, size)
        value = ax.text(n + 0.5, m + 0.5, format_value(v, 2), ha="center", va="center",
                        fontsize=VALUE_PT, color=text_color_on(faces[idx]))
        value.set_gid("value")
    for m in range(size):
        n = m - offset
        if 0 <= n < size:
            frame = Rectangle((n, m), 1, 1, fill=False, edgecolor="black", lw=1.8, zorder=3,
                              clip_on=False)
            frame.set_gid("gap")
            ax.add_patch(frame)
    ax.set_xlim(0, size)
    ax.set_ylim(size, 0)  # m = 0 at the top, as a matrix is printed
    ax.set_aspect("equal")
    ax.set_xticks(np.arange(size) + 0.5, [str(n) for n in range(size)])
    ax.set_yticks(np.arange(size) + 0.5, [str(m) for m in range(size)])
    ax.tick_params(length=0, labelsize=TICK_PT)
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.set_xlabel("key position n", fontsize=NAME_PT)
    ax.set_ylabel("query position m", fontsize=NAME_PT)
    ax.set_title("scores $q_m \\cdot k_n$ (all pairs):\nequal along every diagonal",
                 fontsize=TITLE_PT)


def _flat_panel(ax: Axes, scores: np.ndarray, gaps: Sequence[int], offset: int,
                head: int) -> None:
    """The score against m for each fixed gap ``m - n`` in ``gaps``: flat lines."""
    size = scores.shape[0]
    markers = "osD^v"
    for j, d in enumerate(gaps):
        m = np.arange(max(0, d), min(size, size + d))  # both m and n = m - d in range
        y = scores[m, m - d]
        color = head_color(head) if d == offset else tint(EDGE_COLOR, 0.55 + 0.15 * (j % 3))
        (line,) = ax.plot(m, y, color=color, marker=markers[j % len(markers)], markersize=4,
                          lw=1.5, label=f"m − n = {d}")
        line.set_gid("series")
    ax.set_xlim(-0.4, size - 0.6)
    ax.set_xticks(np.arange(size))
    ax.tick_params(labelsize=TICK_PT, length=2)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_xlabel("query position m", fontsize=NAME_PT)
    ax.set_ylabel("$q_m \\cdot k_n$", fontsize=NAME_PT)
    ax.legend(fontsize=VALUE_PT, frameon=False, handlelength=1.6, loc="center left",
              bbox_to_anchor=(1.0, 0.5))
    ax.set_title("the score against m,\nfor a fixed gap: flat", fontsize=TITLE_PT)


def rope_figure(
    q: Any,
    k: Any,
    *,
    slow_pair: int = 1,
    num_positions: int = 4,
    size: int = 6,
    offset: int = 1,
    base: float = 10000.0,
    head: int = 0,
) -> Figure:
    """RoPE drawn on a real query and key: pairs of dimensions turning with the position.

    Top row: pair 0 (the fast pair, turned 1 radian per position) and pair
    ``slow_pair`` (``base^(-2i/Dh)`` radians per position) of ``q`` rotated by
    :func:`mha.apply_rope` at positions ``m = 0 .. num_positions - 1``, as arrows
    from the origin with a mark for every step's angle; then pair 0 of ``q`` at
    ``m`` and of ``k`` at ``n`` for two ``(m, n)`` with ``m - n = offset``, whose
    angles are equal. Bottom row: the scores ``q_m . k_n`` (whole vectors) for
    ``m, n < size`` as a grid that is constant along every diagonal (the diagonal
    ``m - n = offset`` framed), and the same scores against ``m`` for fixed gaps,
    flat lines. The figure checks all of this on the arrays it draws: each arrow is
    the pair turned by a 2 x 2 rotation of ``m theta_i``, and every diagonal of the
    score grid holds one value (1e-12).

    Parameters
    ----------
    q, k : array_like, shape (Dh,)
        One head's query and key vectors (NumPy or torch), e.g. ``Q_h[t]`` and
        ``K_h[t]`` of a chapter's running example, before RoPE; ``Dh`` even, >= 4.
    slow_pair : int
        The slow pair ``i`` to draw, in ``[1, Dh/2 - 1]``.
    num_positions : int
        Positions drawn as arrows in the top row, 2 to 6 (pair 0 turns one radian
        per position, so six stay within one turn).
    size : int
        Positions of the score grid, 2 to 8.
    offset : int
        The gap ``m - n`` of the third panel and of the framed diagonal, with
        ``|offset| <= size - 1``.
    base : float
        RoPE's base, as in :func:`mha.apply_rope`.
    head : int
        Which head ``q`` and ``k`` belong to: the figure uses ``head_color(head)``.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``q`` or ``k`` is not a finite vector (Dh,), they differ in shape,
        ``Dh`` is odd or below 4, an integer argument is out of range, or ``base``
        is not a positive number.
    """
    q = _head_vector(q, "q")
    k = _head_vector(k, "k")
    if k.shape != q.shape:
        raise ValueError(f"q and k must have the same shape (Dh,), got {q.shape} and {k.shape}")
    head_dim = q.shape[0]
    if head_dim < 4 or head_dim % 2:
        raise ValueError(
            f"q must have an even Dh >= 4 (a fast and a slow pair of dimensions), got shape "
            f"{q.shape}"
        )
    slow_pair = _check_int(slow_pair, "slow_pair", 1, head_dim // 2 - 1)
    num_positions = _check_int(num_positions, "num_positions", 2, 6)
    size = _check_int(size, "size", 2, 8)
    offset = _check_int(offset, "offset", -(size - 1), size - 1)
    head_color(head)  # a ValueError for a bad head index, before any drawing
    for name, vec in (("q", q), ("k", k)):
        for pair in (0, slow_pair):
            if not np.any(vec[2 * pair : 2 * pair + 2]):
                raise ValueError(
                    f"{name}'s pair {pair} (dims {2 * pair}, {2 * pair + 1}) is zero: there is "
                    f"no direction to turn, got {name} = {vec}"
                )
    first_n = max(0, -offset)
    pairs_mn = [(first_n + offset, first_n), (first_n + offset + 2, first_n + 2)]
    length = max(num_positions, size, first_n + 3, first_n + offset + 3)

    # RoPE on every position at once: row m is q (or k) as it would be at position m.
    positions = np.arange(length)
    q_rot = apply_rope(np.broadcast_to(q, (length, head_dim)), positions, base=base)  # (L, Dh)
    k_rot = apply_rope(np.broadcast_to(k, (length, head_dim)), positions, base=base)  # (L, Dh)
    thetas = float(base) ** (-2.0 * np.arange(head_dim // 2) / head_dim)  # (Dh/2,)

    # The claims, on the arrays drawn: pair i at position m is pair i turned by m theta_i.
    for pair in (0, slow_pair):
        dims = slice(2 * pair, 2 * pair + 2)
        for rot in (q_rot, k_rot):
            start = rot[0, dims]
            turned = np.stack([_rotate(start, m * thetas[pair]) for m in range(length)])
            np.testing.assert_allclose(rot[:, dims], turned, **_CLOSE,
                                       err_msg=f"apply_rope does not turn pair {pair}")
    np.testing.assert_array_equal(q_rot[0], q)  # position 0 leaves the vector alone
    scores = q_rot[:size] @ k_rot[:size].T  # (L, Dh) @ (Dh, L) -> (L, L): [m, n] = q_m . k_n
    scale = float(np.abs(scores).max()) or 1.0
    np.testing.assert_allclose(scores[1:, 1:], scores[:-1, :-1], rtol=0, atol=1e-12 * scale,
                               err_msg="q_m . k_n is not constant along a diagonal")

    fig = plt.figure(figsize=(MAX_WIDTH, 6.6), facecolor="white", layout="constrained")
    top, bottom = fig.add_gridspec(2, 1, height_ratios=(1.0, 1.3))
    fast_ax, slow_ax, gap_ax = (fig.add_subplot(spec) for spec in top.subgridspec(1, 3))
    score_ax, flat_ax = (fig.add_subplot(spec)
                         for spec in bottom.subgridspec(1, 2, width_ratios=(1.35, 1.0)))
    _pair_panel(fast_ax, q_rot[:num_positions, 0:2], 0, float(thetas[0]), head)
    slow_dims = slice(2 * slow_pair, 2 * slow_pair + 2)
    _pair_panel(slow_ax, q_rot[:num_positions, slow_dims], slow_pair,
                float(thetas[slow_pair]), head)
    # Directions only: q's and k's pair 0 may differ a lot in length, and the angle
    # between them is the point.
    q_dirs = [q_rot[m, 0:2] / np.linalg.norm(q_rot[m, 0:2]) for m, _ in pairs_mn]
    k_dirs = [k_rot[n, 0:2] / np.linalg.norm(k_rot[n, 0:2]) for _, n in pairs_mn]
    angles = _gap_panel(gap_ax, q_dirs, k_dirs, pairs_mn, head)
    np.testing.assert_allclose(angles[0], angles[1], **_CLOSE,
                               err_msg="the same gap gives two different angles")
    _score_grid(score_ax, scores, offset, head)
    gaps = sorted({g for g in (offset - 1, offset, offset + 1) if abs(g) <= size - 1})
    _flat_panel(flat_ax, scores, gaps, offset, head)
    return set_alt_text(
        fig, f"RoPE on a query and a key with Dh = {head_dim}: pair 0 of the query turns "
        f"1 radian per position and pair {slow_pair} turns {thetas[slow_pair]:.3g} radians, "
        f"drawn as arrows at positions 0 to {num_positions - 1}; a query at m and a key at n "
        f"make the same angle for (m, n) = {pairs_mn[0]} and {pairs_mn[1]}; the {size} by "
        f"{size} grid of scores q_m . k_n is constant along each diagonal, and the score "
        f"against m for a fixed m - n is a flat line."
    )


# ------------------------------------------------------------------------ ALiBi


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




def _alibi_grid(bias: np.ndarray, blocked: np.ndarray, h: int, slope: float, norm: Normalize,
                texts: bool, decimals: int, queries: np.ndarray, first: bool) -> Grid:
    """Head ``h``'s (T, S) bias: white at 0, the head's colour at the figure's steepest."""
    faces = head_cmap(h)(norm(-bias))  # (T, S, 4): the penalty -bias >= 0 sets the depth
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
                title_color=head_text_color(h))


def _bias_lines(ax: Axes, distances: np.ndarray, lines: np.ndarray,
                slopes: np.ndarray) -> None:
    """One line per head: the bias (H, N) against the distance (N,)."""
    for h, (y, slope) in enumerate(zip(lines, slopes, strict=True)):
        # Past the palette the colours repeat: a dashed line tells those heads apart.
        style = "-" if h < len(HEAD_COLORS) else "--"
        (line,) = ax.plot(distances, y, color=head_color(h), marker="o", markersize=3.5,
                          lw=1.5, linestyle=style, label=f"head {h}, slope {slope_text(slope)}")
        line.set_gid("series")
    ax.axhline(0, color=_GUIDE, lw=0.8, zorder=0)
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
    scores. A cell is white where the bias is 0 and deepens to the head's colour
    at the most negative bias among the grids (one scale for all heads, so a steep
    head looks darker than a gentle one); in the causal grids the keys after the
    query are dark, blocked by the causal mask (the bias there is 0 and unused).
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
        of a variant still fit side by side in one row.
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
    num_heads = _check_int(num_heads, "num_heads", 1, 16)
    size = _check_int(size, "size", 1, 12)
    num_keys = size if num_keys is None else _check_int(num_keys, "num_keys", 1, 12)
    if num_keys < size:
        raise ValueError(
            f"num_keys={num_keys} is smaller than size={size}: the queries are the last "
            "T of the S key positions"
        )
    if isinstance(variants, str) or not len(variants) or len(set(variants)) != len(variants) \
            or not set(variants) <= set(VARIANTS):
        raise ValueError(
            f"variants must be a non-empty sequence of distinct names from {VARIANTS}, got "
            f"{variants!r}"
        )
    if decimals is not None:
        decimals = _check_int(decimals, "decimals", 0, 6)
    if max_distance is not None:
        max_distance = max(_check_int(max_distance, "max_distance", 1, 64), num_keys - 1)

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
    steepest = max(float(-drawn[n][:, ~blocked[n]].min()) for n in variants) or 1.0
    norm = Normalize(0.0, steepest)
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
        heads = [_alibi_grid(drawn[name][h], blocked[name], h, slopes[h], norm, values,
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

    if show_values is None:  # values only if every variant still fits in one row
        show_values = size * num_keys <= 36 and widest_fit(True) == num_heads
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
        f"and variant ({shown}), queries as rows and keys as columns, white at bias 0 and "
        f"deeper in the head's colour as the bias falls"
        + (f", and a line plot of bias against distance 0 to {max_distance}, one line per "
           "head." if max_distance is not None else ".")
    )
