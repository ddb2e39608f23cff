"""Lay grids of cells out on a figure, measured in inches.

Every tensor picture in the book is a few grids in rows, with operators
("@", "=") or arrows between them and a caption above each row. Placing the
axes by hand in inches, with text widths measured from the font, keeps every
cell the same size in every panel of a figure (so a 3 x 3 head really looks
like half of the 3 x 6 tensor it came from) and keeps labels from colliding.

Cells are drawn as one ``PatchCollection`` of rectangles per grid (vector
output, byte-stable SVG) whose gid is ``"cells"``; cell values are text
artists centred in their cells, in row-major order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.axes import Axes
from matplotlib.cm import ScalarMappable
from matplotlib.collections import PatchCollection
from matplotlib.colors import Colormap, Normalize, to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from mha.draw.style import (
    CAPTION_PT,
    CELL,
    EDGE_COLOR,
    MAX_WIDTH,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    text_color_on,
    text_width,
)

_MARGIN = 0.08  # around the whole sheet
_GAP = 0.14  # between neighbouring items of a row
# Between a grid (or its column bands) and its title, in points: clear of the
# descenders of "padding" or "query", which touched the grid at 3 points.
_TITLE_PAD = 7.0
_ROW_GAP = 0.12  # between rows
_OP_PT = 14.0  # operators between grids
_GROUP_BAR = 0.26  # height of a column-group band above a grid


@dataclass
class Group:
    """A run of columns (or rows) that belongs together, e.g. one head's slice."""

    start: int
    stop: int
    label: str
    color: str


@dataclass
class Grid:
    """One rectangular grid of cells and its labels.

    ``face`` is an (R, C, 4) RGBA array, or ``None`` when ``values`` are mapped
    through ``cmap``/``norm`` (heatmaps). ``text`` is an (R, C) array of
    strings; empty strings draw nothing.
    """

    face: np.ndarray | None
    text: np.ndarray | None = None
    row_labels: Sequence[str] | None = None
    col_labels: Sequence[str] | None = None
    row_name: str | None = None
    col_name: str | None = None
    title: str | None = None
    title_color: str | tuple[float, float, float, float] = "black"
    values: np.ndarray | None = None
    cmap: Colormap | None = None
    norm: Normalize | None = None
    colorbar: bool = False
    # The colour bar's ticks and their labels; default matplotlib's, labelled as "0.00".
    colorbar_ticks: Sequence[float] | None = None
    colorbar_labels: Sequence[str] | None = None
    col_groups: Sequence[Group] = ()
    row_groups: Sequence[Group] = ()
    indent: int = 0  # empty cells left of the grid, to line it up under another
    trail: int = 0  # empty cells right of the grid, for the same reason
    edge: str | np.ndarray = EDGE_COLOR

    @property
    def shape(self) -> tuple[int, int]:
        arr = self.face if self.face is not None else self.values
        assert arr is not None, "a Grid needs face colours or values"
        return int(arr.shape[0]), int(arr.shape[1])


@dataclass
class Op:
    """An operator or arrow drawn between two grids of a row ("@", "=", "→")."""

    symbol: str


@dataclass
class Caption:
    """A left-aligned line of text across the sheet, above the next row."""

    text: str


@dataclass
class Legend:
    """A line of colour swatches with labels, e.g. what True and False look like."""

    entries: Sequence[tuple[str, str]]  # (label, fill colour)


Item = Grid | Op
Line = Caption | Legend
_SWATCH = 0.16  # edge of a legend swatch, inches


def _legend_width(lg: Legend) -> float:
    return sum(_SWATCH + 0.06 + text_width(label, TICK_PT) + 0.25 for label, _ in lg.entries)


@dataclass
class _Box:
    """Where one grid goes, in inches from the sheet's top-left corner."""

    grid: Grid
    x: float
    y: float
    cell: float
    rotate_cols: bool


@dataclass
class _Metrics:
    left: float  # from the item's left edge to the grid's left edge
    right: float  # from the grid's right edge to the item's right edge
    top: float
    bottom: float
    rotate_cols: bool


def _line(size: float) -> float:
    """Height in inches of one line of text at ``size`` points."""
    return size / 72.0 * 1.35


def _title_weight(g: Grid) -> str:
    """A head's title is bold in its colour (a second cue besides the cell tint); it is
    measured as drawn, so that bold titles of narrow grids do not overlap."""
    return "normal" if g.title_color == "black" else "bold"


def _metrics(g: Grid, cell: float) -> _Metrics:
    nrows, ncols = g.shape
    gw = ncols * cell
    left = 0.04
    if g.row_labels:
        left += max(text_width(s, TICK_PT) for s in g.row_labels) + 0.06
    if g.row_name:
        left += _line(NAME_PT) + 0.08
    left += g.indent * cell
    rotate = False
    bottom = 0.04
    if g.col_labels:
        widest = max(text_width(s, TICK_PT) for s in g.col_labels)
        rotate = widest > 0.92 * cell
        if rotate:
            # 45 degree labels anchored at their right end under the cell.
            bottom += (widest + _line(TICK_PT) * 0.5) * 0.72 + 0.06
            left += max(0.0, widest * 0.72 - cell / 2 - left)
        else:
            bottom += _line(TICK_PT) + 0.04
    if g.col_name:
        bottom += _line(NAME_PT) + 0.02
    top = 0.05
    if g.col_groups:
        top += _GROUP_BAR
    if g.title:
        top += _line(TITLE_PT) + 0.06 + (_TITLE_PAD - 3) / 72
    right = 0.04 + g.trail * cell
    if g.row_groups:
        right += max(text_width(gr.label, TICK_PT) for gr in g.row_groups) + 0.16
    if g.colorbar:
        labels = g.colorbar_labels or ["0.00"]
        right += 0.1 + 0.12 + max(text_width(s, TICK_PT) for s in labels) + 0.1
    # A title wider than its grid spills over both sides; make room for it.
    if g.title:
        spill = (text_width(g.title, TITLE_PT, _title_weight(g)) - gw) / 2
        left += max(0.0, spill - left)
        right = max(right, spill)
    return _Metrics(left, right, top, bottom, rotate)


def _row_size(row: Sequence[Item], cell: float) -> tuple[float, float]:
    width, height = 0.0, 0.0
    for i, item in enumerate(row):
        if i:
            width += _GAP
        if isinstance(item, Op):
            width += text_width(item.symbol, _OP_PT) + 0.06
            continue
        m = _metrics(item, cell)
        nrows, ncols = item.shape
        width += m.left + ncols * cell + m.right
        height = max(height, m.top + nrows * cell + m.bottom)
    return width, height


def _wrap(text: str, width: float) -> list[str]:
    """Break a caption into lines no wider than ``width`` inches, at spaces."""
    lines: list[str] = []
    for word in text.split(" "):
        if lines and text_width(f"{lines[-1]} {word}", CAPTION_PT) <= width:
            lines[-1] = f"{lines[-1]} {word}"
        else:
            lines.append(word)
    return lines


def _min_cell(rows: Sequence[Sequence[Item] | Line]) -> float:
    """Smallest cell edge that still fits the widest value text."""
    widest = 0.0
    for row in rows:
        if isinstance(row, Caption | Legend):
            continue
        for item in row:
            if isinstance(item, Grid) and item.text is not None:
                for s in item.text.ravel():
                    widest = max(widest, text_width(str(s), VALUE_PT))
    return max(0.24, widest + 0.08)


@dataclass
class _Plan:
    """Where everything of a :func:`compose` sheet goes, before anything is drawn."""

    boxes: list[_Box]
    ops: list[tuple[str, float, float]]
    captions: list[tuple[str, float]]
    legends: list[tuple[Legend, float]]
    fig_w: float
    fig_h: float


def measure(rows: Sequence[Sequence[Item] | Line], cell: float = CELL, *,
            align: Sequence[Sequence[int]] = ()) -> tuple[float, float]:
    """The ``(width, height)`` in inches that :func:`compose` would give these rows,
    without drawing them (cheap: no figure, no axes)."""
    plan = _plan(rows, cell, align)
    return plan.fig_w, plan.fig_h


def compose(rows: Sequence[Sequence[Item] | Line], cell: float = CELL, *,
            align: Sequence[Sequence[int]] = ()) -> tuple[Figure, list[Axes]]:
    """Draw rows of grids on a new figure at most ``MAX_WIDTH`` inches wide.

    The cell edge starts at ``cell`` inches and shrinks (never below what the
    cell values need) until the widest row fits. Returns the figure and the
    axes of every grid, in reading order.

    ``align`` lists groups of indices into ``rows`` (rows of items) laid out in common
    columns: item ``j`` of each row of a group sits in column ``j``, as wide as the
    widest, so a grid stands exactly under the grid above it (operators centred).
    Rows may differ in length; at each position they hold the same kind of item.
    """
    plan = _plan(rows, cell, align)
    fig_w, fig_h = plan.fig_w, plan.fig_h
    fig = plt.figure(figsize=(fig_w, fig_h), facecolor="white")
    axes = [_draw_grid(fig, b, fig_w, fig_h) for b in plan.boxes]
    for symbol, ox, oy in plan.ops:
        fig.text(ox / fig_w, 1 - oy / fig_h, symbol, ha="center", va="center", fontsize=_OP_PT)
    for text, cy in plan.captions:
        fig.text(_MARGIN / fig_w, 1 - cy / fig_h, text, ha="left", va="baseline",
                 fontsize=CAPTION_PT)
    for lg, cy in plan.legends:
        _draw_legend(fig, lg, cy, fig_w, fig_h)
    return fig, axes


def _check_align(rows: Sequence[Sequence[Item] | Line],
                 align: Sequence[Sequence[int]]) -> dict[int, list[int]]:
    """Each aligned row's group (the indices of its rows), after checking the groups."""
    group_of: dict[int, list[int]] = {}
    for group in align:
        group = [int(i) for i in group]
        if not group:
            continue
        for i in group:
            if not 0 <= i < len(rows) or isinstance(rows[i], Caption | Legend):
                raise ValueError(f"align names row {i}, which is not a row of items")
            if i in group_of:
                raise ValueError(f"align names row {i} in two groups")
            group_of[i] = group
        for j in range(max(len(rows[i]) for i in group)):
            kinds = {isinstance(rows[i][j], Op) for i in group if j < len(rows[i])}
            if len(kinds) > 1:
                raise ValueError(f"align: item {j} of rows {group} is not of one kind")
    return group_of


def _columns(group: Sequence[Sequence[Item]], cell: float) -> list[tuple[float, float]]:
    """``(left, width)`` of each column of aligned rows (``left``: to the grids' edge)."""
    columns = []
    for j in range(max(len(row) for row in group)):
        items = [row[j] for row in group if j < len(row)]
        if isinstance(items[0], Op):
            columns.append((0.0, max(text_width(it.symbol, _OP_PT) + 0.06 for it in items)))
            continue
        metrics = [(_metrics(it, cell), it.shape[1]) for it in items]
        left = max(m.left for m, _ in metrics)
        columns.append((left, left + max(n * cell + m.right for m, n in metrics)))
    return columns


def _row_width(rows: Sequence[Sequence[Item] | Line], i: int, group_of: dict[int, list[int]],
               cell: float) -> float:
    if i not in group_of:
        return _row_size(rows[i], cell)[0]
    columns = _columns([rows[g] for g in group_of[i]], cell)  # type: ignore[misc]
    return sum(width for _, width in columns) + _GAP * (len(columns) - 1)


def _plan(rows: Sequence[Sequence[Item] | Line], cell: float,
          align: Sequence[Sequence[int]] = ()) -> _Plan:
    group_of = _check_align(rows, align)
    floor = _min_cell(rows)
    cell = max(cell, floor)
    for _ in range(4):  # titles spill non-linearly: a few rounds settle it
        widest = max(_row_width(rows, i, group_of, cell) for i, r in enumerate(rows)
                     if not isinstance(r, Caption | Legend))
        if widest + 2 * _MARGIN <= MAX_WIDTH or cell <= floor:
            break
        ncells = max(
            sum(it.shape[1] + it.indent + it.trail for it in r if isinstance(it, Grid))
            for r in rows
            if not isinstance(r, Caption | Legend)
        )
        cell = max(floor, cell - (widest + 2 * _MARGIN - MAX_WIDTH) / ncells - 1e-3)

    boxes: list[_Box] = []
    ops: list[tuple[str, float, float]] = []
    captions: list[tuple[str, float]] = []
    legends: list[tuple[Legend, float]] = []
    y = _MARGIN
    width = 0.0
    for index, row in enumerate(rows):
        if isinstance(row, Legend):
            legends.append((row, y + _line(TICK_PT) * 0.5 + 0.02))
            y += max(_line(TICK_PT), _SWATCH) + 0.1
            width = max(width, _legend_width(row))
            continue
        if isinstance(row, Caption):
            for line in _wrap(row.text, MAX_WIDTH - 2 * _MARGIN):
                captions.append((line, y + _line(CAPTION_PT) * 0.8))
                y += _line(CAPTION_PT)
                width = max(width, text_width(line, CAPTION_PT))
            y += 0.06
            continue
        row_w, row_h = _row_size(row, cell)
        grid_metrics = [_metrics(it, cell) for it in row if isinstance(it, Grid)]
        top = max(m.top for m in grid_metrics)
        smallest = min(it.shape[0] for it in row if isinstance(it, Grid))
        columns = None
        if index in group_of:
            columns = _columns([rows[g] for g in group_of[index]], cell)  # type: ignore[misc]
            row_w = _row_width(rows, index, group_of, cell)
        x = _MARGIN
        for i, item in enumerate(row):
            if i:
                x += _GAP
            if isinstance(item, Op):
                w = text_width(item.symbol, _OP_PT) + 0.06 if columns is None else columns[i][1]
                ops.append((item.symbol, x + w / 2, y + top + smallest * cell / 2))
                x += w
                continue
            m = _metrics(item, cell)
            if columns is None:
                boxes.append(_Box(item, x + m.left, y + top, cell, m.rotate_cols))
                x += m.left + item.shape[1] * cell + m.right
            else:
                boxes.append(_Box(item, x + columns[i][0], y + top, cell, m.rotate_cols))
                x += columns[i][1]
        width = max(width, row_w)
        y += row_h + _ROW_GAP
    fig_w = width + 2 * _MARGIN
    fig_h = y - _ROW_GAP + _MARGIN
    return _Plan(boxes, ops, captions, legends, fig_w, fig_h)


def _draw_legend(fig: Figure, lg: Legend, cy: float, fig_w: float, fig_h: float) -> None:
    """Swatches and labels on one line centred at ``cy`` inches from the top."""
    x = _MARGIN
    for label, color in lg.entries:
        swatch = Rectangle((x / fig_w, 1 - (cy + _SWATCH / 2) / fig_h), _SWATCH / fig_w,
                           _SWATCH / fig_h, transform=fig.transFigure, facecolor=color,
                           edgecolor=EDGE_COLOR, linewidth=0.8)
        swatch.set_gid("legend")
        fig.add_artist(swatch)
        x += _SWATCH + 0.06
        fig.text(x / fig_w, 1 - cy / fig_h, label, ha="left", va="center", fontsize=TICK_PT)
        x += text_width(label, TICK_PT) + 0.25


def _draw_grid(fig: Figure, box: _Box, fig_w: float, fig_h: float) -> Axes:
    g, cell = box.grid, box.cell
    nrows, ncols = g.shape
    gw, gh = ncols * cell, nrows * cell
    ax = fig.add_axes((box.x / fig_w, 1 - (box.y + gh) / fig_h, gw / fig_w, gh / fig_h))
    ax.set_xlim(0, ncols)
    ax.set_ylim(nrows, 0)  # row 0 at the top, as when printing a matrix
    for spine in ax.spines.values():
        spine.set_visible(False)
    rects = [Rectangle((c, r), 1, 1) for r in range(nrows) for c in range(ncols)]
    if g.face is not None:
        faces = np.asarray(g.face, dtype=float).reshape(-1, 4)
        cells = PatchCollection(rects, facecolors=faces, edgecolors=g.edge, linewidths=0.8)
    else:
        assert g.values is not None and g.cmap is not None and g.norm is not None
        cells = PatchCollection(rects, cmap=g.cmap, norm=g.norm, edgecolors=g.edge,
                                linewidths=0.8)
        cells.set_array(np.asarray(g.values, dtype=float).ravel())
        faces = g.cmap(g.norm(np.asarray(g.values, dtype=float).ravel()))
    cells.set_gid("cells")
    cells.set_clip_on(False)  # inside the axes anyway; saves a clip-path per cell in SVG
    ax.add_collection(cells)
    if g.text is not None:
        for k, s in enumerate(np.asarray(g.text).ravel()):
            if s:
                r, c = divmod(k, ncols)
                value = ax.text(c + 0.5, r + 0.5, str(s), ha="center", va="center",
                                fontsize=VALUE_PT, color=text_color_on(faces[k]))
                value.set_gid("value")
    ax.tick_params(length=0, labelsize=TICK_PT, pad=3)
    if g.col_labels:
        ax.set_xticks(np.arange(ncols) + 0.5, list(g.col_labels))
        if box.rotate_cols:
            plt.setp(ax.get_xticklabels(), rotation=45, ha="right", rotation_mode="anchor")
    else:
        ax.set_xticks([])
    if g.row_labels:
        ax.set_yticks(np.arange(nrows) + 0.5, list(g.row_labels))
    else:
        ax.set_yticks([])
    if g.col_name:
        ax.set_xlabel(g.col_name, fontsize=NAME_PT, labelpad=2)
    if g.row_name:
        ax.set_ylabel(g.row_name, fontsize=NAME_PT, labelpad=4)
    if g.title:
        pad = _GROUP_BAR * 72 + _TITLE_PAD if g.col_groups else _TITLE_PAD
        ax.set_title(g.title, fontsize=TITLE_PT, color=g.title_color, pad=pad,
                     fontweight=_title_weight(g))
    for gr in g.col_groups:
        _column_band(ax, gr, cell)
    for gr in g.row_groups:
        _row_band(ax, gr, ncols)
    if g.colorbar:
        bar = fig.add_axes(((box.x + gw + 0.12) / fig_w, 1 - (box.y + gh) / fig_h,
                            0.12 / fig_w, gh / fig_h))
        # 32 steps instead of the colour map's 256 keep the SVG small; a colour bar
        # with more steps than that would also be rasterised into an embedded PNG.
        steps = ScalarMappable(norm=g.norm, cmap=g.cmap.resampled(32))
        cb = fig.colorbar(steps, cax=bar)
        cb.ax.tick_params(labelsize=TICK_PT, length=2)
        cb.outline.set_linewidth(0.6)
        cb.solids.set_edgecolor("face")  # no hairline seams between the steps
        if g.colorbar_ticks is not None:
            cb.set_ticks(list(g.colorbar_ticks), labels=g.colorbar_labels)
    return ax


def _column_band(ax: Axes, gr: Group, cell: float) -> None:
    """A coloured bar with a label above columns ``start:stop``."""
    # Band in axes-fraction y (above the grid), data x: drawn outside the axes.
    height = (_GROUP_BAR - 0.06) / (ax.get_ylim()[0] * cell)
    band = Rectangle((gr.start + 0.04, 1.02), gr.stop - gr.start - 0.08, height,
                     transform=ax.get_xaxis_transform(), clip_on=False,
                     facecolor=to_rgba(gr.color, 0.95), edgecolor="none")
    band.set_gid("group")
    ax.add_patch(band)
    label = ax.text((gr.start + gr.stop) / 2, 1.02 + height / 2, gr.label, ha="center",
                    va="center", transform=ax.get_xaxis_transform(), fontsize=TICK_PT,
                    color=text_color_on(gr.color), clip_on=False)
    label.set_gid("group")


def _row_band(ax: Axes, gr: Group, ncols: int) -> None:
    """A coloured bar with a label right of rows ``start:stop``."""
    band = Rectangle((ncols + 0.08, gr.start + 0.04), 0.12, gr.stop - gr.start - 0.08,
                     facecolor=gr.color, edgecolor="none", clip_on=False)
    band.set_gid("group")
    ax.add_patch(band)
    label = ax.text(ncols + 0.3, (gr.start + gr.stop) / 2, gr.label, ha="left", va="center",
                    fontsize=TICK_PT, color="black", clip_on=False)
    label.set_gid("group")
