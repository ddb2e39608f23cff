"""Line plots of computed numbers and 2-D vectors as arrows, in the book's style.

Most figures of the book draw tensors as grids; a few show how a number moves
with another (a loss per step, a score per head size) or how vectors point in
the plane. :func:`curves_figure` and :func:`vectors_figure` draw those with the
book's palette, font sizes and width, so that chapters never call raw
matplotlib for them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import FancyArrowPatch
from matplotlib.transforms import offset_copy

from mha.draw.style import (
    EDGE_COLOR,
    GUIDE_COLOR,
    HEAD_COLORS,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    check_figure_size,
    set_alt_text,
    to_numpy,
)

_LINE_WIDTH = 1.5


class Series(NamedTuple):
    """One line (or set of points) of a :class:`CurvePanel`.

    ``x`` and ``y`` are 1-D and of equal length N. ``linestyle=""`` draws the
    points only (give a ``marker``). ``color`` defaults to the book's palette,
    in the order of the panel's series. With ``annotate`` the label is written
    beside the last point instead of in the legend. ``secondary`` plots the
    series against a second y axis on the right of the panel.
    """

    x: Any
    y: Any
    label: str | None = None
    marker: str | None = None
    linestyle: str = "-"
    color: str | None = None
    annotate: bool = False
    secondary: bool = False


class RefLine(NamedTuple):
    """A horizontal reference line at height ``y``, in the legend when labelled."""

    y: float
    label: str | None = None
    linestyle: str = "--"
    color: str = EDGE_COLOR


class CurvePanel(NamedTuple):
    """One panel of :func:`curves_figure`: its series, axes and reference lines.

    ``logx`` / ``logy`` use a logarithmic axis of base ``log_base``. ``xlim``
    and ``ylim`` are ``(low, high)`` with ``None`` for "automatic".
    ``ylabel2`` names the secondary y axis (used only when a series has
    ``secondary=True``). ``legend`` is a matplotlib location such as
    ``"best"`` or ``"upper center"``, or None for no legend.
    """

    series: Sequence[Series]
    title: str | None = None
    xlabel: str | None = None
    ylabel: str | None = None
    ylabel2: str | None = None
    logx: bool = False
    logy: bool = False
    log_base: float = 10
    xlim: tuple[float | None, float | None] | None = None
    ylim: tuple[float | None, float | None] | None = None
    xticks: Sequence[float] | None = None
    hlines: Sequence[RefLine] = ()
    legend: str | None = "best"
    legend_columns: int = 1


def _xy(series: Series, where: str) -> tuple[np.ndarray, np.ndarray]:
    """The series' x and y as 1-D float arrays of equal length N >= 1."""
    x = to_numpy(series.x, f"{where}.x").astype(float)
    y = to_numpy(series.y, f"{where}.y").astype(float)
    if x.ndim != 1 or y.ndim != 1 or x.shape != y.shape or x.size == 0:
        raise ValueError(
            f"{where}.x and {where}.y must be 1-D of the same length N >= 1, "
            f"got shapes {x.shape} and {y.shape}"
        )
    return x, y


def _check_panel(panel: Any, where: str) -> list[tuple[Series, np.ndarray, np.ndarray]]:
    if not isinstance(panel, CurvePanel):
        raise ValueError(f"{where} must be a draw.CurvePanel, got {type(panel).__name__}")
    if isinstance(panel.series, Series) or not len(panel.series):
        raise ValueError(f"{where}.series must be a non-empty sequence of draw.Series")
    checked = []
    for i, s in enumerate(panel.series):
        if not isinstance(s, Series):
            raise ValueError(f"{where}.series[{i}] must be a draw.Series, got {type(s).__name__}")
        x, y = _xy(s, f"{where}.series[{i}]")
        if panel.logx and np.any(x <= 0):
            raise ValueError(f"{where}.series[{i}].x must be positive on a log x axis")
        if panel.logy and not s.secondary and np.any(y <= 0):
            raise ValueError(f"{where}.series[{i}].y must be positive on a log y axis")
        checked.append((s, x, y))
    for i, line in enumerate(panel.hlines):
        if not isinstance(line, RefLine):
            raise ValueError(f"{where}.hlines[{i}] must be a draw.RefLine")
    return checked


def _style_axes(ax: Axes) -> None:
    ax.tick_params(labelsize=TICK_PT)
    ax.spines[["top"]].set_visible(False)


def _draw_panel(ax: Axes, panel: CurvePanel,
                checked: list[tuple[Series, np.ndarray, np.ndarray]]) -> None:
    _style_axes(ax)
    ax.spines[["right"]].set_visible(False)
    twin: Axes | None = None
    twin_colors: list[str] = []
    handles = []
    for i, (s, x, y) in enumerate(checked):
        color = s.color or HEAD_COLORS[i % len(HEAD_COLORS)]
        target = ax
        if s.secondary:
            if twin is None:
                twin = ax.twinx()
                _style_axes(twin)
            target = twin
            twin_colors.append(color)
        (line,) = target.plot(x, y, color=color, marker=s.marker or "",
                              linestyle=s.linestyle or "none", lw=_LINE_WIDTH,
                              markersize=5, label=s.label or "")
        line.set_gid("series")
        if s.label and s.annotate:
            note = target.annotate(s.label, (x[-1], y[-1]), xytext=(5, 3),
                                   textcoords="offset points", color=color,
                                   fontsize=VALUE_PT)
            note.set_gid("point_label")
        elif s.label:
            handles.append(line)
    for ref in panel.hlines:
        line = ax.axhline(ref.y, color=ref.color, linestyle=ref.linestyle, lw=1,
                          label=ref.label or "", zorder=1)
        line.set_gid("hline")
        if ref.label:
            handles.append(line)
    base = panel.log_base
    if panel.logx:
        ax.set_xscale("log", base=base)
    if panel.logy:
        ax.set_yscale("log", base=base)
    if panel.xticks is not None:
        ax.set_xticks(list(panel.xticks))
    if panel.xlim is not None:
        ax.set_xlim(*panel.xlim)
    if panel.ylim is not None:
        ax.set_ylim(*panel.ylim)
    if panel.title:
        ax.set_title(panel.title, fontsize=TITLE_PT)
    if panel.xlabel:
        ax.set_xlabel(panel.xlabel, fontsize=NAME_PT)
    if panel.ylabel:
        ax.set_ylabel(panel.ylabel, fontsize=NAME_PT)
    if twin is not None and panel.ylabel2:
        # One series on the right axis: colour its label so it reads as that line's axis.
        color = twin_colors[0] if len(twin_colors) == 1 else "black"
        twin.set_ylabel(panel.ylabel2, fontsize=NAME_PT, color=color)
    if handles and panel.legend:
        # The legend lives on the top axes so that secondary lines do not hide it.
        (twin or ax).legend(handles=handles, loc=panel.legend, ncol=panel.legend_columns,
                            fontsize=VALUE_PT, frameon=False, handlelength=1.6,
                            columnspacing=0.8)


def curves_figure(
    panels: CurvePanel | Sequence[CurvePanel],
    *,
    width: float = MAX_WIDTH,
    height: float = 3.2,
    width_ratios: Sequence[float] | None = None,
) -> Figure:
    """Line plots: one or more panels side by side, each with labelled series.

    Parameters
    ----------
    panels : CurvePanel or sequence of P CurvePanel
        Each panel holds its :class:`Series` (``x`` and ``y`` of shape (N,),
        N may differ between series), axis labels, a title, optional log axes,
        horizontal :class:`RefLine` s and series on a secondary y axis.
    width, height : float
        Figure size in inches; ``width`` at most 8 (the book's text width).
    width_ratios : sequence of P float, optional
        Relative panel widths; equal by default.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If there are no panels, a series' ``x`` and ``y`` are not 1-D of one
        length, a value is not positive on a log axis, ``width_ratios`` does
        not have one entry per panel or the size is out of range.
    """
    if isinstance(panels, CurvePanel):
        panels = [panels]
    if not len(panels):
        raise ValueError("panels must be a non-empty sequence of draw.CurvePanel")
    checked = [_check_panel(p, f"panels[{i}]") for i, p in enumerate(panels)]
    check_figure_size(width, height)
    if width_ratios is not None and len(width_ratios) != len(panels):
        raise ValueError(
            f"width_ratios has {len(width_ratios)} entries but there are {len(panels)} panels"
        )
    fig, axes = plt.subplots(1, len(panels), figsize=(width, height), squeeze=False,
                             facecolor="white", gridspec_kw={"width_ratios": width_ratios})
    for ax, panel, data in zip(axes[0], panels, checked, strict=True):
        _draw_panel(ax, panel, data)
    fig.tight_layout()
    described = "; ".join(
        f"{p.title or f'panel {i}'}: {len(p.series)} series against "
        f"{p.xlabel or 'x'}" + (" (log x)" if p.logx else "") + (" (log y)" if p.logy else "")
        for i, p in enumerate(panels)
    )
    count = "A line plot" if len(panels) == 1 else f"{len(panels)} line plots side by side"
    return set_alt_text(fig, f"{count} - {described}.")


# How far apart (in points) arrows that point the same way are drawn, centre to centre.
_SIDE_BY_SIDE_PT = 4.0


def _side_by_side(tips: Sequence[np.ndarray]) -> list[tuple[float, float]]:
    """A sideways shift in points for each arrow from the origin to ``tips[i]``: zero,
    except for arrows pointing the same way (within half a degree) as another, which
    are spread evenly across that direction, ``_SIDE_BY_SIDE_PT`` apart."""
    angles = [float(np.degrees(np.arctan2(t[1], t[0]))) if np.any(t) else None for t in tips]
    shifts = [(0.0, 0.0)] * len(tips)
    done: set[int] = set()
    for i, a in enumerate(angles):
        if a is None or i in done:
            continue
        group = [j for j, b in enumerate(angles) if b is not None and j not in done
                 and abs((a - b + 180.0) % 360.0 - 180.0) < 0.5]
        done.update(group)
        if len(group) < 2:
            continue
        side = np.array([-np.sin(np.radians(a)), np.cos(np.radians(a))])  # +90 degrees
        for k, j in enumerate(group):
            dx, dy = (k - (len(group) - 1) / 2) * _SIDE_BY_SIDE_PT * side
            shifts[j] = (float(dx), float(dy))
    return shifts


def vectors_figure(
    vectors: np.ndarray,
    query: np.ndarray | None = None,
    *,
    labels: Sequence[str] | None = None,
    query_label: str = "q",
    colors: Sequence[str] | None = None,
    title: str | None = None,
    width: float = 3.6,
    height: float = 3.6,
) -> Figure:
    """2-D vectors as labelled arrows from the origin, on axes of equal scale.

    Arrows that point the same way (a key and a longer key, a key and the query) are
    drawn side by side, a few points apart across their direction, so that none hides
    under another.

    Parameters
    ----------
    vectors : array_like, shape (N, 2)
        One vector per row (NumPy or torch), e.g. N keys with Dh = 2.
    query : array_like, shape (2,), optional
        Drawn as a black dashed arrow, to compare the others with.
    labels : sequence of N str, optional
        Written beside each arrow's tip; default "v0", "v1", ...
    query_label : str
        Label of the query arrow.
    colors : sequence of N colours, optional
        Default: the book's palette in order (``head_color(i)`` for row i).
    title : str, optional
    width, height : float
        Figure size in inches; ``width`` at most 8.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``vectors`` is not (N, 2) with N >= 1, ``query`` is not (2,),
        a value is not finite, or ``labels`` / ``colors`` do not have N entries.
    """
    v = to_numpy(vectors, "vectors").astype(float)
    if v.ndim != 2 or v.shape[1] != 2 or v.shape[0] == 0:
        raise ValueError(f"vectors must have shape (N, 2) with N >= 1, got shape {v.shape}")
    n = v.shape[0]
    q = None
    if query is not None:
        q = to_numpy(query, "query").astype(float)
        if q.shape != (2,):
            raise ValueError(f"query must have shape (2,), got shape {q.shape}")
    points = v if q is None else np.vstack([v, q[None]])  # (N, 2) -> (N + 1, 2)
    if not np.all(np.isfinite(points)):
        raise ValueError("vectors and query must be finite")
    for name, given in (("labels", labels), ("colors", colors)):
        if given is not None and (isinstance(given, str) or len(given) != n):
            raise ValueError(f"{name} must have one entry per vector (N = {n}), got {given!r}")
    labels = [str(t) for t in labels] if labels is not None else [f"v{i}" for i in range(n)]
    colors = list(colors) if colors is not None else [
        HEAD_COLORS[i % len(HEAD_COLORS)] for i in range(n)
    ]
    check_figure_size(width, height)

    fig, ax = plt.subplots(figsize=(width, height), facecolor="white")
    _style_axes(ax)
    ax.spines[["right"]].set_visible(False)
    ax.axhline(0, color=GUIDE_COLOR, lw=0.8, zorder=0)
    ax.axvline(0, color=GUIDE_COLOR, lw=0.8, zorder=0)
    arrows = [(p, c, t, "-") for p, c, t in zip(v, colors, labels, strict=True)]
    if q is not None:
        arrows.append((q, "black", query_label, "--"))
    shifts = _side_by_side([tip for tip, *_ in arrows])
    for (tip, color, text, style), shift in zip(arrows, shifts, strict=True):
        # Arrows along one direction are moved apart sideways by a few points (the
        # data stay as they are), so that a short one is not hidden under a long one.
        moved = offset_copy(ax.transData, fig=fig, x=shift[0], y=shift[1], units="points")
        arrow = FancyArrowPatch((0.0, 0.0), tuple(tip), arrowstyle="-|>", mutation_scale=12,
                                color=color, lw=_LINE_WIDTH, linestyle=style,
                                shrinkA=0, shrinkB=0, zorder=3, transform=moved)
        arrow.set_gid("vector")
        ax.add_patch(arrow)
        # Put the label beside the tip, to the arrow's left: a longer vector in the
        # same direction would run through a label placed straight ahead.
        norm = float(np.hypot(*tip))
        along = tip / norm if norm > 0 else np.array([0.7071, 0.7071])
        side = np.array([-along[1], along[0]])  # along turned by +90 degrees
        if float(np.dot(shift, side)) < 0:  # moved to the right: its label goes right too
            side = -side
        offset = 9 * side + 3 * along  # in points
        note = ax.annotate(text, tuple(tip), xycoords=moved, xytext=tuple(offset),
                           textcoords="offset points",
                           ha="center", va="center", color=color, fontsize=NAME_PT)
        note.set_gid("vector_label")
    # Limits: every tip and the origin, plus a margin for the labels.
    low = np.minimum(points.min(axis=0), 0.0)
    high = np.maximum(points.max(axis=0), 0.0)
    margin = 0.18 * float(np.max(high - low)) or 1.0
    ax.set_xlim(low[0] - margin, high[0] + margin)
    ax.set_ylim(low[1] - margin, high[1] + margin)
    ax.set_aspect("equal")
    if title:
        ax.set_title(title, fontsize=TITLE_PT)
    fig.tight_layout()
    extra = f" and a dashed black query arrow {query_label}" if q is not None else ""
    return set_alt_text(
        fig, f"{n} two-dimensional vectors drawn as coloured arrows from the origin, "
        f"labelled {', '.join(labels)}{extra}, on axes of equal scale."
    )
