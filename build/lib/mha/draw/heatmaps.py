"""Attention weights as heatmaps: queries as rows, keys as columns, one panel per head.

Each head is shaded from white (weight 0) to its own colour (weight 1) on the
same fixed 0..1 scale, so panels compare directly and head h looks like head h
everywhere in the book. Cells are vector rectangles, not an image, which keeps
the SVG small and byte-stable.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from mha.draw.layout import Caption, Grid, compose
from mha.draw.style import (
    cell_texts,
    check_index,
    check_labels,
    check_ndim_one_of,
    head_cmap,
    head_text_color,
    set_alt_text,
    to_numpy,
)

_AUTO_VALUES = 36  # write the weights in the cells up to this many per panel


def _per_head(weights: np.ndarray, batch: int, name: str) -> np.ndarray:
    """(B, H, T, S) or (H, T, S) -> (H, T, S) for sample ``batch``."""
    w = to_numpy(weights, name)
    check_ndim_one_of(w, (3, 4), name, "(B, H, T, S) or (H, T, S)")
    if w.ndim == 4:
        w = w[check_index(batch, w.shape[0], "batch", "B")]
    return w


def _head_panels(w: np.ndarray, qt: list[str], kt: list[str], show_values: bool,
                 decimals: int, colorbar: bool) -> list[Grid]:
    norm = Normalize(0.0, 1.0)
    return [
        Grid(face=None, values=w[h], cmap=head_cmap(h), norm=norm,
             text=cell_texts(w[h], show_values, decimals), row_labels=qt, col_labels=kt,
             row_name="query", col_name="key", title=f"head {h}",
             title_color=head_text_color(h), colorbar=colorbar)
        for h in range(w.shape[0])
    ]


def attention_heatmaps(
    weights: np.ndarray,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch: int = 0,
    title: str | None = None,
    show_values: bool | None = None,
    decimals: int = 2,
    colorbar: bool = True,
) -> Figure:
    """One heatmap per head of attention weights.

    Parameters
    ----------
    weights : array_like, shape (B, H, T, S) or (H, T, S)
        Softmax weights in [0, 1] (NumPy or torch), e.g. ``AttentionSteps.weights``.
    query_tokens : sequence of str, length T, optional
        Row labels.
    key_tokens : sequence of str, length S, optional
        Column labels.
    batch : int
        Which sample of a 4-D ``weights`` to draw.
    title : str, optional
        Caption above the panels.
    show_values : bool, optional
        Write the weights in the cells; default when T * S <= 36.
    decimals : int
    colorbar : bool
        A 0..1 colour bar beside each panel.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        On a wrong number of axes, ``batch`` out of range or a token list that
        does not match T or S.
    """
    w = _per_head(weights, batch, "weights")
    h, t, s = w.shape
    qt = check_labels(query_tokens, t, "query_tokens", "T") or [str(i) for i in range(t)]
    kt = check_labels(key_tokens, s, "key_tokens", "S") or [str(i) for i in range(s)]
    if show_values is None:
        show_values = t * s <= _AUTO_VALUES
    rows: list = [Caption(title)] if title else []
    rows.append(_head_panels(w, qt, kt, show_values, decimals, colorbar))
    fig, _ = compose(rows)
    return set_alt_text(
        fig, f"{h} heatmaps of attention weights, one per head, {t} query tokens as rows and "
        f"{s} key tokens as columns; darker cells mark the keys a query attends to most."
    )


def attention_grid(
    weights: Sequence[np.ndarray],
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    batch: int = 0,
    layer_names: Sequence[str] | None = None,
    show_values: bool = False,
    decimals: int = 2,
) -> Figure:
    """Attention weights of several layers: a grid of layers (rows) x heads (columns).

    Parameters
    ----------
    weights : sequence of L arrays, each (B, H, T, S) or (H, T, S)
        One entry per layer, e.g. ``AttentionMaps.encoder``; all the same shape.
    query_tokens : sequence of str, length T, optional
    key_tokens : sequence of str, length S, optional
    batch : int
    layer_names : sequence of L str, optional
        Default "layer 0", "layer 1", ...
    show_values : bool
    decimals : int

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If there are no layers, layers differ in shape, or labels do not match.
    """
    if isinstance(weights, np.ndarray) or hasattr(weights, "detach") or not len(weights):
        raise ValueError("weights must be a non-empty list of per-layer arrays (B, H, T, S)")
    layers = [_per_head(w, batch, f"weights[{i}]") for i, w in enumerate(weights)]
    for i, w in enumerate(layers):
        if w.shape != layers[0].shape:
            raise ValueError(
                f"weights[{i}] has per-sample shape {w.shape}, weights[0] has {layers[0].shape}"
            )
    h, t, s = layers[0].shape
    names = check_labels(layer_names, len(layers), "layer_names", "layers") or [
        f"layer {i}" for i in range(len(layers))
    ]
    qt = check_labels(query_tokens, t, "query_tokens", "T") or [str(i) for i in range(t)]
    kt = check_labels(key_tokens, s, "key_tokens", "S") or [str(i) for i in range(s)]
    rows: list = [Caption("white = weight 0, the head's colour = weight 1")]
    for name, w in zip(names, layers, strict=True):
        rows.append(Caption(name))
        rows.append(_head_panels(w, qt, kt, show_values, decimals, colorbar=False))
    fig, _ = compose(rows, cell=0.32)
    return set_alt_text(
        fig, f"A grid of attention heatmaps, {len(layers)} layers as rows and {h} heads as "
        f"columns, each with {t} query tokens as rows and {s} key tokens as columns."
    )
