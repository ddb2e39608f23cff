"""Projection weights partitioned by head, and "one matmul equals H small ones".

mha stores a projection as W of shape (D_in, D_out) and computes y = x @ W + b.
Head h owns the columns h*Dh:(h+1)*Dh of W_q, W_k, W_v (its slice of the
output) and the rows h*Dh:(h+1)*Dh of W_o (its slice of the input).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.figure import Figure

from mha.draw.layout import Caption, Grid, Group, Op, compose
from mha.draw.style import (
    cell_texts,
    check_index,
    check_labels,
    check_ndim_one_of,
    head_color,
    head_faces,
    head_text_color,
    neutral_faces,
    set_alt_text,
    to_numpy,
)
from mha.draw.tensors import head_index


def _head_faces(shape: tuple[int, int], axis: int, num_heads: int, name: str) -> np.ndarray:
    return head_faces(head_index(shape, axis, num_heads, name))


def _groups(num_heads: int, size: int) -> list[Group]:
    dh = size // num_heads
    return [Group(h * dh, (h + 1) * dh, f"head {h}", head_color(h)) for h in range(num_heads)]


def weight_matrix_figure(
    W: np.ndarray,
    num_heads: int,
    *,
    name: str = "W_q",
    partition: str = "columns",
    show_values: bool = True,
    decimals: int = 2,
) -> Figure:
    """Draw a projection weight with each head's slice in that head's colour.

    Parameters
    ----------
    W : array_like, shape (D_in, D_out)
        mha's convention: ``y = x @ W + b``.
    num_heads : int
        H; must divide the partitioned axis.
    name : str
        Shown in the title, e.g. "W_q".
    partition : {"columns", "rows"}
        "columns" for W_q, W_k, W_v (head h owns columns h*Dh:(h+1)*Dh);
        "rows" for W_o (head h owns rows h*Dh:(h+1)*Dh).
    show_values, decimals
        Cell values and their rounding.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``W`` is not 2-D, ``partition`` is unknown or H does not divide it.
    """
    W = to_numpy(W, "W")
    check_ndim_one_of(W, (2,), "W", "(D_in, D_out)")
    if partition not in ("columns", "rows"):
        raise ValueError(f"partition must be 'columns' or 'rows', got {partition!r}")
    axis = 1 if partition == "columns" else 0
    axis_name = "D_out" if axis else "D_in"
    faces = _head_faces(W.shape, axis, num_heads, axis_name)
    groups = _groups(num_heads, W.shape[axis])
    dh = W.shape[axis] // num_heads
    grid = Grid(
        face=faces,
        text=cell_texts(W, show_values, decimals),
        row_labels=[str(i) for i in range(W.shape[0])],
        col_labels=[str(i) for i in range(W.shape[1])],
        row_name=f"D_in = {W.shape[0]}",
        col_name=f"D_out = {W.shape[1]}",
        title=name,
        col_groups=groups if axis == 1 else (),
        row_groups=groups if axis == 0 else (),
    )
    what = "columns" if axis == 1 else "rows"
    owners = ", ".join(f"head {h}: {what} {g.start}-{g.stop - 1}" for h, g in enumerate(groups))
    caption = f"{name}: (D_in, D_out) = {W.shape}; {owners}"
    fig, _ = compose([Caption(caption), [grid]])
    return set_alt_text(
        fig,
        f"The {W.shape[0]} by {W.shape[1]} matrix {name} with its {what} in {num_heads} "
        f"coloured blocks of {dh}, one per head.",
    )


def matmul_per_head_figure(
    x: np.ndarray,
    W: np.ndarray,
    num_heads: int,
    *,
    tokens: Sequence[str] | None = None,
    batch: int = 0,
    name: str = "W_q",
    out_name: str = "Q",
    show_values: bool = True,
    decimals: int = 1,
) -> Figure:
    """Draw ``x @ W`` once, then as H products ``x @ W[:, head h's columns]``.

    Each head's small product sits under the columns of the big one it
    reproduces; the figure checks (and raises if not) that the head results
    put side by side equal the single product. The products carry no bias, and
    their titles say so: ``x @ W_q`` is ``Q`` before ``b_q`` is added.

    Parameters
    ----------
    x : array_like, shape (T, D_in) or (B, T, D_in)
        Inputs; for 3-D, sample ``batch`` is drawn.
    W : array_like, shape (D_in, D_out)
    num_heads : int
        H; must divide D_out.
    tokens : sequence of str, length T, optional
    batch : int
    name, out_name : str
        Labels for W and for the layer's result, e.g. "W_q" and "Q"; the captions
        say that the product drawn is ``out_name`` before its bias is added.
    show_values, decimals
        Cell values and their rounding.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        On mismatched shapes, H not dividing D_out, or a wrong number of tokens.
    """
    x = to_numpy(x, "x")
    W = to_numpy(W, "W")
    check_ndim_one_of(x, (2, 3), "x", "(T, D_in) or (B, T, D_in)")
    check_ndim_one_of(W, (2,), "W", "(D_in, D_out)")
    if x.ndim == 3:
        x = x[check_index(batch, x.shape[0], "batch", "B")]
    if x.shape[1] != W.shape[0]:
        raise ValueError(f"x has shape {x.shape} but W has shape {W.shape}: D_in differs")
    t, d_out = x.shape[0], W.shape[1]
    w_faces = _head_faces(W.shape, 1, num_heads, "D_out")
    dh = d_out // num_heads
    rows_tok = check_labels(tokens, t, "tokens", "T") or [str(i) for i in range(t)]
    product = x @ W  # (T, D_in) @ (D_in, D_out) -> (T, D_out)
    y_faces = _head_faces(product.shape, 1, num_heads, "D_out")

    def x_grid(title: str, values: bool) -> Grid:
        return Grid(face=neutral_faces(x.shape), text=cell_texts(x, values, decimals),
                    row_labels=rows_tok, col_labels=[str(i) for i in range(x.shape[1])],
                    row_name=f"T = {t}", col_name=f"D_in = {x.shape[1]}", title=title)

    whole = f"x @ {name}"
    rows: list = [Caption(f"One product: {whole}, ({t}, {x.shape[1]}) @ {W.shape} -> "
                          f"{product.shape}, that is {out_name} before its bias is added")]
    rows.append([
        x_grid("x", show_values),
        Op("@"),
        Grid(face=w_faces, text=cell_texts(W, show_values, decimals), title=name,
             col_labels=[str(i) for i in range(d_out)], col_name=f"D_out = {d_out}",
             col_groups=_groups(num_heads, d_out)),
        Op("="),
        Grid(face=y_faces, text=cell_texts(product, show_values, decimals), title=whole,
             col_labels=[str(i) for i in range(d_out)], col_name=f"D_out = {d_out}",
             col_groups=_groups(num_heads, d_out)),
    ])
    pieces = []
    for h in range(num_heads):
        cols = slice(h * dh, (h + 1) * dh)
        w_h = W[:, cols]  # (D_in, Dh): head h's columns
        y_h = x @ w_h  # (T, D_in) @ (D_in, Dh) -> (T, Dh)
        pieces.append(y_h)
        labels = [str(i) for i in range(h * dh, (h + 1) * dh)]
        part = f"x @ {name}[:, {h * dh}:{(h + 1) * dh}]"
        rows.append(Caption(f"Head {h}: {part}, ({t}, {x.shape[1]}) @ {w_h.shape} -> "
                            f"{y_h.shape}, the same numbers as columns {h * dh}-"
                            f"{(h + 1) * dh - 1} of {whole}"))
        rows.append([
            x_grid("x (as above)", False),  # the same x: its values once are enough
            Op("@"),
            Grid(face=w_faces[:, cols], text=cell_texts(w_h, show_values, decimals),
                 title=f"{name}[:, {h * dh}:{(h + 1) * dh}]", title_color=head_text_color(h),
                 col_labels=labels, col_name=f"Dh = {dh}", indent=h * dh,
                 trail=d_out - (h + 1) * dh),
            Op("="),
            Grid(face=y_faces[:, cols], text=cell_texts(y_h, show_values, decimals),
                 title=part, title_color=head_text_color(h), col_labels=labels,
                 col_name=f"Dh = {dh}", indent=h * dh),
        ])
    # The claim of the picture, checked on the numbers it shows.
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), product, rtol=1e-12, atol=1e-12)
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"x times {name} drawn once as a ({t}, {x.shape[1]}) by {W.shape} product, then as "
        f"{num_heads} products with {dh} columns each, whose results sit under the matching "
        f"coloured columns of the product ({out_name} before its bias).",
    )
