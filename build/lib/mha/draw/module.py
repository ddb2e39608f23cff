"""The whole multi-head attention layer on one page: project, split, attend, merge, W_o.

Every grid is one array of ``multi_head_attention_steps`` for one sample, drawn
at its true shape: cells tinted by the head that owns them (neutral where no
head does), the attention weights shaded by their value in the head's colour.
Captions name each step and its shape; cell values are left out, since the
chapters print the numbers and the figure is about where they go.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from mha.attention import multi_head_attention_steps
from mha.draw.layout import Caption, Grid, Group, Op, compose
from mha.draw.style import (
    check_index,
    check_labels,
    check_ndim_one_of,
    head_cmap,
    head_color,
    head_faces,
    head_fill,
    head_text_color,
    neutral_faces,
    set_alt_text,
    to_numpy,
)
from mha.draw.tensors import head_index, shape_text
from mha.params import AttentionParams


def _plain(x: np.ndarray, title: str, col_name: str, tokens: list[str] | None = None,
           row_name: str | None = None) -> Grid:
    """A grid that belongs to no head (the input, the output)."""
    return Grid(face=neutral_faces(x.shape), title=title, col_name=col_name,
                row_labels=tokens, row_name=row_name)


def _by_column(x: np.ndarray, num_heads: int, title: str, tokens: list[str] | None = None,
               row_name: str | None = None) -> Grid:
    """A (T, D) grid whose columns are tinted by the head that owns them."""
    faces = head_faces(head_index(x.shape, 1, num_heads, "D"))
    return Grid(face=faces, title=title, col_name=f"D = {x.shape[1]}", row_labels=tokens,
                row_name=row_name)


def _one_head(x: np.ndarray, h: int, title: str, col_name: str,
              tokens: list[str] | None = None, row_name: str | None = None) -> Grid:
    """A (T, Dh) slice of head ``h``, all cells in its tint."""
    face = np.broadcast_to(np.array(head_fill(h)), (*x.shape, 4)).copy()
    return Grid(face=face, title=title, title_color=head_text_color(h), col_name=col_name,
                row_labels=tokens, row_name=row_name)


def multi_head_attention_figure(
    x: Any,
    params: AttentionParams,
    num_heads: int,
    *,
    mask: Any | None = None,
    batch: int = 0,
    tokens: Sequence[str] | None = None,
) -> Figure:
    """Draw one self-attention layer end to end, from the arrays it computes.

    Four rows: (1) the input ``x`` and its three projections Q, K, V; (2) the
    split into heads; (3) each head's attention weights and context; (4) the
    merged heads times ``W_o`` (rows tinted by head) giving the output. The
    arrays come from
    :func:`mha.multi_head_attention_steps` on ``x`` (query = key = value).

    Parameters
    ----------
    x : array_like, shape (B, T, D)
        The layer's input; sample ``batch`` is drawn.
    params : AttentionParams
        The layer's weights.
    num_heads : int
        H; must divide D.
    mask : bool array_like, optional
        True = may attend, as in :func:`mha.multi_head_attention`.
    batch : int
        Which sample b to draw.
    tokens : sequence of str, length T, optional
        Labels of the rows (the first grid of each row is labelled).

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``x`` is not 3-D, the arguments do not fit together (as in
        :func:`mha.multi_head_attention`), ``batch`` is out of range or ``tokens``
        has the wrong length.
    """
    x = to_numpy(x, "x")
    check_ndim_one_of(x, (3,), "x", "(B, T, D)")
    b = check_index(batch, x.shape[0], "batch", "B")
    steps = multi_head_attention_steps(x, x, x, params, num_heads, mask=mask)
    t, d = x.shape[1], x.shape[2]
    dh = d // num_heads
    tok = check_labels(tokens, t, "tokens", "T")
    first = dict(tokens=tok, row_name=f"T = {t}")
    # The picture's last claim, checked on the arrays it shows.
    np.testing.assert_allclose(steps.merged[b] @ params.W_o + (
        0.0 if params.b_o is None else params.b_o), steps.output[b], rtol=1e-12, atol=1e-12)

    def plus(role: str) -> str:
        return "" if params.b_q is None else f" + b_{role}"

    rows: list = [
        Caption(f"1. project: Q = x @ W_q{plus('q')}, and K, V alike, one product each "
                f"for all heads: x {shape_text('BTD', (1, t, d))} -> Q, K, V of that shape"),
        [
            _plain(x[b], "x", f"D = {d}", **first),
            Op("→"),
            _by_column(steps.q[b], num_heads, "Q"),
            _by_column(steps.k[b], num_heads, "K"),
            _by_column(steps.v[b], num_heads, "V"),
        ],
        Caption(f"2. split_heads: head h takes columns h*Dh:(h+1)*Dh, "
                f"(B, T, D) -> {shape_text(['B', 'H', 'T', 'Dh'], (1, num_heads, t, dh))}"),
    ]
    split: list = []
    for name in ("q", "k", "v"):
        arr = getattr(steps, f"{name}_heads")[b]  # (H, T, Dh)
        for h in range(num_heads):
            kw = first if not split else {}
            split.append(_one_head(arr[h], h, f"{name.upper()}_{h}", f"Dh = {dh}", **kw))
    rows.append(split)
    s = steps.weights.shape[-1]
    rows.append(Caption(
        f"3. attend in every head: weights = softmax(Q_h K_h^T / sqrt({dh}), masked), "
        f"(B, H, T, S) = (1, {num_heads}, {t}, {s}); context = weights @ V_h, "
        f"(B, H, T, Dh) = (1, {num_heads}, {t}, {dh})"))
    attend: list = []
    for h in range(num_heads):
        kw = first if not attend else {}
        attend.append(Grid(face=None, values=steps.weights[b, h], cmap=head_cmap(h),
                           norm=Normalize(0.0, 1.0), title=f"weights_{h}",
                           title_color=head_text_color(h), col_name=f"S = {s}",
                           row_labels=kw.get("tokens"), row_name=kw.get("row_name")))
    attend.append(Op("→"))
    for h in range(num_heads):
        attend.append(_one_head(steps.context[b, h], h, f"context_{h}", f"Dh = {dh}"))
    rows.append(attend)
    groups = [Group(h * dh, (h + 1) * dh, f"head {h}", head_color(h)) for h in range(num_heads)]
    rows.append(Caption(
        f"4. merge_heads: the contexts side by side, (B, T, D) = (1, {t}, {d}); "
        f"5. output = merged @ W_o{plus('o')}, which mixes the heads: (1, {t}, {d})"))
    rows.append([
        _by_column(steps.merged[b], num_heads, "merged", **first),
        Op("@"),
        Grid(face=head_faces(head_index((d, d), 0, num_heads, "D_in")), title="W_o",
             col_name=f"D = {d}", row_groups=groups),
        Op("="),
        _plain(steps.output[b], "output", f"D = {d}"),
    ])
    fig, _ = compose(rows)
    return set_alt_text(
        fig,
        f"Multi-head attention on {t} tokens with D = {d} and {num_heads} heads of {dh}: "
        f"x projected to Q, K and V of {t} by {d}, each split into {num_heads} slices of "
        f"{t} by {dh}, {num_heads} weight grids of {t} by {s} and contexts of {t} by {dh}, "
        f"merged back to {t} by {d} and multiplied by the {d} by {d} W_o into the output.",
    )
