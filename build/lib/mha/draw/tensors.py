"""Tensors as labelled grids, and the head split / merge drawn step by step.

A tensor of up to four axes is drawn as its last two axes (a matrix of
cells) repeated over the leading axes (one panel per index). Cells are tinted
by the head they belong to, so the same number keeps the same colour when
``split_heads`` moves it to another place.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from mha.attention import merge_heads, split_heads
from mha.draw.layout import Caption, Grid, Item, compose
from mha.draw.style import (
    cell_texts,
    check_index,
    check_labels,
    check_ndim_one_of,
    head_faces,
    head_text_color,
    neutral_faces,
    set_alt_text,
    to_numpy,
)

_MAX_PANELS = 16
_AUTO_VALUES = 96  # show cell values by default up to this many cells
_PANELS_PER_ROW = 4


def shape_text(names: Sequence[str], shape: Sequence[int]) -> str:
    """``"(B, T, D) = (1, 3, 6)"``."""
    return f"({', '.join(names)}) = ({', '.join(str(int(s)) for s in shape)})"


def head_index(shape: Sequence[int], axis: int, num_heads: int, axis_name: str) -> np.ndarray:
    """For every element of a tensor of ``shape``, the head it belongs to.

    Heads split ``axis`` into ``num_heads`` equal contiguous blocks; on an axis
    of size ``num_heads`` (the H axis) that is simply the index.
    """
    size = shape[axis]
    if num_heads < 1 or size % num_heads:
        raise ValueError(
            f"num_heads={num_heads} must divide axis {axis_name} of size {size} "
            f"(tensor shape {tuple(shape)})"
        )
    heads = np.arange(size) // (size // num_heads)
    view = [1] * len(shape)
    view[axis] = size
    return np.broadcast_to(heads.reshape(view), tuple(shape))


def tensor_panels(
    x: np.ndarray,
    axis_names: Sequence[str],
    *,
    num_heads: int | None = None,
    head_axis: str | None = None,
    tokens: Sequence[str] | None = None,
    token_axis: str | None = None,
    show_values: bool | None = None,
    decimals: int = 2,
) -> list[list[Item]]:
    """The rows of grids that draw ``x`` (see :func:`tensor_grid` for the arguments)."""
    x = to_numpy(x, "x")
    check_ndim_one_of(x, (1, 2, 3, 4), "x", "(n,), (R, C) or up to 4 axes")
    names = [str(n) for n in axis_names]
    if len(names) != x.ndim:
        raise ValueError(
            f"axis_names has {len(names)} names but x has {x.ndim} axes (shape {x.shape})"
        )
    if x.ndim == 1:  # a vector is drawn as one row
        x, names = x[None, :], ["", *names]
    lead = x.shape[:-2]
    if int(np.prod(lead, dtype=int)) > _MAX_PANELS:
        raise ValueError(
            f"x of shape {x.shape} needs {int(np.prod(lead))} panels; "
            f"at most {_MAX_PANELS} fit: slice it first"
        )
    heads = None
    if num_heads is not None:
        if head_axis is None:
            head_axis = "H" if "H" in names else "D"
        if head_axis not in names:
            raise ValueError(f"head_axis {head_axis!r} is not one of axis_names {names}")
        heads = head_index(x.shape, names.index(head_axis), num_heads, head_axis)
    elif head_axis is not None:
        raise ValueError("head_axis needs num_heads")
    tok_axis = None
    if tokens is not None:
        if token_axis is None:
            token_axis = next((n for n in ("T", "S") if n in names), None)
        if token_axis not in names:
            raise ValueError(f"token_axis {token_axis!r} is not one of axis_names {names}")
        tok_axis = names.index(token_axis)
        tokens = check_labels(tokens, x.shape[tok_axis], "tokens", token_axis)
    if show_values is None:
        show_values = x.size <= _AUTO_VALUES
    faces = neutral_faces(x.shape) if heads is None else head_faces(heads)
    texts = cell_texts(x, show_values, decimals)

    def labels(axis: int) -> list[str]:
        if axis == tok_axis and tokens is not None:
            return list(tokens)
        return [str(i) for i in range(x.shape[axis])]

    rows: list[list[Item]] = []
    row: list[Item] = []
    nd = x.ndim
    for index in itertools.product(*(range(n) for n in lead)):
        parts = []
        title_color = "black"
        for axis, i in enumerate(index):
            if lead[axis] == 1:
                continue  # a size-1 axis (a batch of one) needs no panel title
            part = f"{names[axis].lower()} = {i}"
            if axis == tok_axis and tokens is not None:
                part += f" ({tokens[i]})"
            parts.append(part)
            if heads is not None and names[axis] == head_axis:
                title_color = head_text_color(int(heads[(*index, 0, 0)]))
        row.append(
            Grid(
                face=faces[index],
                text=None if texts is None else texts[index],
                row_labels=labels(nd - 2) if names[-2] else None,
                col_labels=labels(nd - 1),
                row_name=f"{names[-2]} = {x.shape[-2]}" if names[-2] else None,
                col_name=f"{names[-1]} = {x.shape[-1]}",
                title=", ".join(parts) or None,
                title_color=title_color,
            )
        )
        # Panels of one leading index side by side, a new row for the next.
        last_axis_done = len(lead) == 0 or index[-1] == lead[-1] - 1
        if last_axis_done or len(row) == _PANELS_PER_ROW:
            rows.append(row)
            row = []
    if row:
        rows.append(row)
    return rows


def tensor_grid(
    x: np.ndarray,
    axis_names: Sequence[str],
    *,
    num_heads: int | None = None,
    head_axis: str | None = None,
    tokens: Sequence[str] | None = None,
    token_axis: str | None = None,
    show_values: bool | None = None,
    decimals: int = 2,
    title: str | None = None,
) -> Figure:
    """Draw a small tensor as a labelled grid of cells.

    The last two axes form the grid (rows, columns); each index of the leading
    axes gets its own panel. Axis names and sizes label the edges ("T = 3",
    "D = 6").

    Parameters
    ----------
    x : array_like, shape (n,), (R, C), (A, R, C) or (A, A2, R, C)
        The tensor (NumPy array or torch tensor). At most 16 panels.
    axis_names : sequence of str, one per axis of ``x``
        E.g. ``("B", "T", "D")``.
    num_heads : int, optional
        Tint cells by head: ``head_axis`` is cut into ``num_heads`` equal blocks
        (a D axis of size H * Dh), or indexed directly (an H axis).
    head_axis : str, optional
        Name of the axis that carries the heads; default "H" if present, else "D".
    tokens : sequence of str, optional
        Labels for the positions along ``token_axis`` (default "T", else "S").
    token_axis : str, optional
    show_values : bool, optional
        Write the rounded values in the cells; default when ``x`` has at most
        96 elements.
    decimals : int
        Rounding of the cell values.
    title : str, optional
        Caption above the grid; the shape is appended.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``axis_names`` or ``tokens`` do not match the shape, ``num_heads``
        does not divide the head axis, or ``x`` needs too many panels.
    """
    names = [str(n) for n in axis_names]
    rows = tensor_panels(x, names, num_heads=num_heads, head_axis=head_axis, tokens=tokens,
                         token_axis=token_axis, show_values=show_values, decimals=decimals)
    shape = to_numpy(x, "x").shape
    caption = shape_text(names, shape)
    if title:
        caption = f"{title}: {caption}"
    fig, _ = compose([Caption(caption), *rows])
    heads = f", cells tinted by head ({num_heads} heads)" if num_heads else ""
    return set_alt_text(fig, f"Grid of the {caption} tensor{heads}.")


def _batch_slice(x: np.ndarray, batch: int, name: str, expected: str, ndim: int) -> np.ndarray:
    check_ndim_one_of(x, (ndim,), name, expected)
    b = check_index(batch, x.shape[0], "batch", "B")
    return x[b : b + 1]


def split_heads_figure(
    x: np.ndarray,
    num_heads: int,
    *,
    tokens: Sequence[str] | None = None,
    batch: int = 0,
    show_values: bool = True,
    decimals: int = 2,
    name: str = "x",
) -> Figure:
    """Draw ``split_heads`` step by step: (B, T, D) -> (B, T, H, Dh) -> (B, H, T, Dh).

    Cells keep their head's colour in all three steps, so the eye can follow
    each number. The last step is drawn from ``mha.split_heads(x, num_heads)``.

    Parameters
    ----------
    x : array_like, shape (B, T, D)
        E.g. the projected queries; one sample (``batch``) is drawn.
    num_heads : int
        H; must divide D.
    tokens : sequence of str, length T, optional
    batch : int
        Which sample of the batch to draw.
    show_values, decimals
        Cell values and their rounding.
    name : str
        What ``x`` is, for the captions, e.g. "Q" when drawing the queries.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not 3-D, H does not divide D, or ``tokens`` has the wrong length.
    """
    x = to_numpy(x, "x")
    check_ndim_one_of(x, (3,), "x", "(B, T, D)")
    full = x.shape
    x = _batch_slice(x, batch, "x", "(B, T, D)", 3)
    _, t, d = x.shape
    head_index(x.shape, 2, num_heads, "D")  # validates num_heads against D
    dh = d // num_heads
    per_token = x.reshape(1, t, num_heads, dh)  # (B, T, D) -> (B, T, H, Dh)
    per_head = to_numpy(split_heads(x, num_heads), "split_heads(x)")  # (B, H, T, Dh)
    if not np.array_equal(per_head, per_token.transpose(0, 2, 1, 3)):
        raise AssertionError("split_heads disagrees with reshape + transpose(1, 2)")
    kw = dict(num_heads=num_heads, tokens=tokens, show_values=show_values, decimals=decimals)
    sample = f" (sample b = {batch} of B = {full[0]})" if full[0] > 1 else ""
    rows: list = [Caption(f"1. {name}: {shape_text('BTD', x.shape)}{sample}")]
    rows += tensor_panels(x, ["B", "T", "D"], head_axis="D", **kw)
    rows.append(Caption(f"2. reshape: {shape_text(['B', 'T', 'H', 'Dh'], per_token.shape)}"
                        f", each token's row cut into H = {num_heads} pieces of Dh = {dh}"))
    rows += tensor_panels(per_token, ["B", "T", "H", "Dh"], head_axis="H", **kw)
    rows.append(Caption(f"3. transpose(1, 2): {shape_text(['B', 'H', 'T', 'Dh'], per_head.shape)}"
                        f" = split_heads({name}, {num_heads})"))
    rows += tensor_panels(per_head, ["B", "H", "T", "Dh"], head_axis="H", **kw)
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"The {t} by {d} tensor {name}, its columns tinted by head, reshaped to {t} panels of "
        f"{num_heads} by {dh} and transposed to {num_heads} panels of {t} by {dh}, one per head.",
    )


def merge_heads_figure(
    x: np.ndarray,
    *,
    tokens: Sequence[str] | None = None,
    batch: int = 0,
    show_values: bool = True,
    decimals: int = 2,
) -> Figure:
    """Draw ``merge_heads`` step by step: (B, H, T, Dh) -> (B, T, H, Dh) -> (B, T, D).

    Parameters
    ----------
    x : array_like, shape (B, H, T, Dh)
        E.g. the per-head context; one sample (``batch``) is drawn.
    tokens : sequence of str, length T, optional
    batch : int
    show_values, decimals
        Cell values and their rounding.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not 4-D or ``tokens`` has the wrong length.
    """
    x = to_numpy(x, "x")
    check_ndim_one_of(x, (4,), "x", "(B, H, T, Dh)")
    full = x.shape
    x = _batch_slice(x, batch, "x", "(B, H, T, Dh)", 4)
    _, h, t, dh = x.shape
    per_token = x.transpose(0, 2, 1, 3)  # (B, H, T, Dh) -> (B, T, H, Dh)
    merged = to_numpy(merge_heads(x), "merge_heads(x)")  # (B, H, T, Dh) -> (B, T, D)
    if not np.array_equal(merged, per_token.reshape(1, t, h * dh)):
        raise AssertionError("merge_heads disagrees with transpose(1, 2) + reshape")
    kw = dict(num_heads=h, tokens=tokens, show_values=show_values, decimals=decimals)
    sample = f" (sample b = {batch} of B = {full[0]})" if full[0] > 1 else ""
    rows: list = [Caption(f"1. per head: {shape_text(['B', 'H', 'T', 'Dh'], x.shape)}{sample}")]
    rows += tensor_panels(x, ["B", "H", "T", "Dh"], head_axis="H", **kw)
    rows.append(Caption(f"2. transpose(1, 2): {shape_text(['B', 'T', 'H', 'Dh'], per_token.shape)}"
                        ", the heads of each token side by side"))
    rows += tensor_panels(per_token, ["B", "T", "H", "Dh"], head_axis="H", **kw)
    rows.append(Caption(f"3. reshape: {shape_text('BTD', merged.shape)} = merge_heads(x),"
                        " the heads concatenated"))
    rows += tensor_panels(merged, ["B", "T", "D"], head_axis="D", **kw)
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"{h} per-head panels of {t} by {dh} transposed to {t} panels of {h} by {dh} and "
        f"reshaped into one {t} by {h * dh} tensor whose column blocks keep their head's colour.",
    )
