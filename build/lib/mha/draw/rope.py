"""RoPE drawn on a real query and key: pairs of dimensions turning with the position.

:func:`rope_figure` takes one head's query and key vectors and draws what
:func:`mha.apply_rope` does to them: every pair of dimensions is an arrow that turns
as the position grows, a fast pair a whole radian per position, a slow pair barely;
a query at ``m`` and a key at ``n`` make the same angle whenever ``m - n`` is the
same, so their score depends on the gap only.

The figure checks its claim on the very arrays it draws: every arrow is its pair
turned by a 2 x 2 rotation, and the scores are constant along each diagonal (an
``AssertionError`` if :func:`mha.apply_rope` ever disagrees with the picture).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.collections import PatchCollection
from matplotlib.colors import Normalize
from matplotlib.figure import Figure
from matplotlib.patches import Arc, Circle, FancyArrowPatch, Rectangle

from mha._checks import as_float_array
from mha.draw.style import (
    EDGE_COLOR,
    GUIDE_COLOR,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    check_int_in_range,
    check_ndim_one_of,
    format_value,
    head_cmap,
    head_color,
    head_text_color,
    set_alt_text,
    text_color_on,
    tint,
    to_numpy,
)
from mha.positional import apply_rope

_ARROW_WIDTH = 1.6
_CLOSE = {"rtol": 1e-12, "atol": 1e-12}


def _head_vector(x: Any, name: str) -> np.ndarray:
    """One head's query or key as a finite float64 vector of shape (Dh,)."""
    arr = as_float_array(to_numpy(x, name), name).astype(np.float64)
    check_ndim_one_of(arr, (1,), name, "(Dh,) (one head's vector)")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


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
    ax.axhline(0, color=GUIDE_COLOR, lw=0.8, zorder=0)
    ax.axvline(0, color=GUIDE_COLOR, lw=0.8, zorder=0)
    circle = Circle((0.0, 0.0), radius, fill=False, color=GUIDE_COLOR, lw=0.8, ls=":",
                    zorder=1)
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
    slow_pair = check_int_in_range(slow_pair, "slow_pair", 1, head_dim // 2 - 1)
    num_positions = check_int_in_range(num_positions, "num_positions", 2, 6)
    size = check_int_in_range(size, "size", 2, 8)
    offset = check_int_in_range(offset, "offset", -(size - 1), size - 1)
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
