"""Boolean attention masks as grids: True (may attend) light, False (blocked) dark.

Rows are queries, columns are keys, as in the weights the mask shapes, so a
mask and a heatmap of the same layer can be read side by side. The contrast is
one of lightness, not hue, so it survives colour-blindness and greyscale print.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure

from mha._checks import as_bool_mask, check_positive_int
from mha.draw.layout import Grid, Legend, compose
from mha.draw.style import (
    ALLOWED_FILL,
    BLOCKED_FILL,
    check_index,
    check_labels,
    check_ndim_one_of,
    set_alt_text,
    to_numpy,
)

LEGEND = [("True = may attend", ALLOWED_FILL), ("False = blocked", BLOCKED_FILL)]


class MaskPanel(NamedTuple):
    """One mask of :func:`masks_figure`: its title and the tokens on its axes."""

    mask: np.ndarray
    title: str
    query_tokens: Sequence[str] | None = None
    key_tokens: Sequence[str] | None = None


def mask_faces(mask: np.ndarray) -> np.ndarray:
    """RGBA fill per cell: ``ALLOWED_FILL`` where True, ``BLOCKED_FILL`` where False."""
    return np.where(mask[..., None], to_rgba(ALLOWED_FILL), to_rgba(BLOCKED_FILL))


def _as_2d(mask: np.ndarray, batch: int, rows: int | None) -> np.ndarray:
    """(T, S), (B, T, S) or (B, 1|H, 1|T, S) -> one (T, S) boolean grid."""
    mask = to_numpy(mask, "mask")
    check_ndim_one_of(mask, (2, 3, 4), "mask", "(T, S), (B, T, S) or (B, 1, T|1, S)")
    mask = as_bool_mask(mask, "mask")
    if mask.ndim >= 3:
        mask = mask[check_index(batch, mask.shape[0], "batch", "B")]
    if mask.ndim == 3:
        if mask.shape[0] != 1:
            raise ValueError(
                f"mask has {mask.shape[0]} different heads (shape {mask.shape}); "
                "draw one head's mask as a (T, S) array"
            )
        mask = mask[0]
    if mask.shape[0] == 1 and rows is not None and rows != 1:
        # A padding mask (1, S) is the same for every query: repeat it per row.
        mask = np.broadcast_to(mask, (rows, mask.shape[1]))
    return mask


def _mask_grid(p: MaskPanel, batch: int) -> Grid:
    rows = None if p.query_tokens is None else len(p.query_tokens)
    if rows is None and p.key_tokens is not None:
        rows = len(p.key_tokens)  # self-attention: as many queries as keys
    m = _as_2d(p.mask, batch, rows)
    t, s = m.shape
    qt = check_labels(p.query_tokens, t, "query_tokens", "T") or [str(i) for i in range(t)]
    kt = check_labels(p.key_tokens, s, "key_tokens", "S") or [str(i) for i in range(s)]
    return Grid(face=mask_faces(m), row_labels=qt, col_labels=kt, row_name="query",
                col_name="key", title=p.title)


def masks_figure(panels: Sequence[MaskPanel], *, batch: int = 0, per_row: int = 2) -> Figure:
    """Draw several masks side by side with a True/False legend.

    Parameters
    ----------
    panels : sequence of MaskPanel
        Each mask is boolean (True = may attend) of shape (T, S), (B, T, S) or
        (B, 1, T, S); a padding mask (B, 1, 1, S) is repeated over its query
        rows (as many rows as ``query_tokens``, else S).
    batch : int
        Which sample of batched masks to draw.
    per_row : int
        Panels per row.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If a mask is not boolean or of a wrong shape, a token list does not
        match its axis, or ``per_row`` is not a positive integer.
    """
    if not panels:
        raise ValueError("panels must hold at least one MaskPanel")
    per_row = check_positive_int(per_row, "per_row")
    grids = [_mask_grid(MaskPanel(*p), batch) for p in panels]
    rows: list = [Legend(LEGEND)]
    rows += [grids[i : i + per_row] for i in range(0, len(grids), per_row)]
    fig, _ = compose(rows)
    shapes = ", ".join(f"{g.title} ({g.shape[0]} by {g.shape[1]})" for g in grids)
    return set_alt_text(
        fig, f"Boolean masks with queries as rows and keys as columns, light where a query "
        f"may attend and dark where it is blocked: {shapes}."
    )


def mask_figure(
    mask: np.ndarray,
    *,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    title: str = "mask",
    batch: int = 0,
) -> Figure:
    """Draw one boolean mask (queries as rows, keys as columns) with a legend.

    Parameters
    ----------
    mask : bool array_like, shape (T, S), (B, T, S) or (B, 1, T|1, S)
        True = may attend.
    query_tokens : sequence of str, length T, optional
    key_tokens : sequence of str, length S, optional
    title : str
    batch : int
        Which sample of a batched mask to draw.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        See :func:`masks_figure`.
    """
    return masks_figure([MaskPanel(mask, title, query_tokens, key_tokens)], batch=batch)


def padding_mask_figure(mask: np.ndarray, tokens: Sequence[Sequence[str]]) -> Figure:
    """Draw a batch's padding mask: one row per sequence, its tokens in the cells.

    Parameters
    ----------
    mask : bool array_like, shape (B, 1, 1, S) or (B, S)
        From ``mha.padding_mask``; True = a real token (may be attended to).
    tokens : sequence of B sequences of S str
        The padded token sequences, e.g. ``[["You", "are", "welcome"],
        ["Thanks", "<pad>", "<pad>"]]``.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If the mask is not boolean (B, 1, 1, S) / (B, S) or ``tokens`` is not B x S.
    """
    m = to_numpy(mask, "mask")
    if m.ndim == 4 and m.shape[1:3] == (1, 1):
        m = m[:, 0, 0]  # (B, 1, 1, S) -> (B, S)
    check_ndim_one_of(m, (2,), "mask", "(B, 1, 1, S) or (B, S)")
    m = as_bool_mask(m, "mask")
    bsz, s = m.shape
    if isinstance(tokens, str) or len(tokens) != bsz:
        raise ValueError(f"tokens must hold B = {bsz} sequences, one per mask row")
    text = np.array([check_labels(seq, s, f"tokens[{b}]", "S") for b, seq in enumerate(tokens)],
                    dtype=object)
    grid = Grid(face=mask_faces(m), text=text, row_labels=[f"b = {b}" for b in range(bsz)],
                col_labels=[str(i) for i in range(s)], row_name="sequence",
                col_name=f"key position (S = {s})", title="padding mask")
    fig, _ = compose([Legend(LEGEND), [grid]])
    return set_alt_text(
        fig, f"Padding mask of a batch of {bsz} sequences of length {s}, each token in its "
        f"cell, light for real tokens and dark for padding ({int((~m).sum())} padded cells)."
    )
