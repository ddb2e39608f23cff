"""One head's attention, step by step, from the arrays of ``AttentionSteps``.

scores = Q_h @ K_h^T, scaled = scores / sqrt(Dh), masked = -inf where the mask
blocks, weights = softmax over each row, context = weights @ V_h. Every panel
shows the numbers ``multi_head_attention_steps`` computed, never a recomputation.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from mha.draw.layout import Caption, Grid, Legend, Op, compose
from mha.draw.style import (
    BLOCKED_FILL,
    NEUTRAL_FILL,
    cell_texts,
    check_index,
    check_labels,
    head_cmap,
    head_color,
    head_fill,
    head_text_color,
    neutral_faces,
    set_alt_text,
    tint,
)

_FIELDS = ("q_heads", "k_heads", "v_heads", "scores", "scaled", "masked", "weights", "context")


def _head_grid(x: np.ndarray, h: int, rows: list[str], cols: list[str], row_name: str,
               col_name: str, title: str, decimals: int) -> Grid:
    face = np.broadcast_to(np.array(head_fill(h)), (*x.shape, 4)).copy()
    return Grid(face=face, text=cell_texts(x, True, decimals), row_labels=rows,
                col_labels=cols, row_name=row_name, col_name=col_name, title=title,
                title_color=head_text_color(h))


def _score_grid(x: np.ndarray, rows: list[str], cols: list[str], title: str,
                decimals: int) -> Grid:
    face = neutral_faces(x.shape)
    face[np.isneginf(x)] = tint(BLOCKED_FILL, 1.0)  # blocked scores: dark, "-inf"
    return Grid(face=face, text=cell_texts(x, True, decimals), row_labels=rows,
                col_labels=cols, row_name="query", col_name="key", title=title)


def attention_pipeline_figure(
    steps: Any,
    head: int = 0,
    *,
    batch: int = 0,
    query_tokens: Sequence[str] | None = None,
    key_tokens: Sequence[str] | None = None,
    decimals: int = 2,
) -> Figure:
    """Draw one head's attention: Q @ K^T -> scaled -> masked -> softmax -> @ V.

    Parameters
    ----------
    steps : AttentionSteps
        From ``mha.multi_head_attention_steps``; uses ``q_heads`` (B, H, T, Dh),
        ``k_heads``/``v_heads`` (B, H, S, Dh), ``scores``/``scaled``/``masked``/
        ``weights`` (B, H, T, S) and ``context`` (B, H, T, Dh).
    head : int
        Which head h to draw (its colour is ``head_color(h)``).
    batch : int
        Which sample b to draw.
    query_tokens : sequence of str, length T, optional
    key_tokens : sequence of str, length S, optional
    decimals : int
        Rounding of the cell values.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``steps`` lacks a field or its arrays are inconsistent, ``head`` or
        ``batch`` is out of range, or a token list has the wrong length.
    """
    missing = [f for f in _FIELDS if not hasattr(steps, f)]
    if missing:
        raise ValueError(f"steps must be an AttentionSteps; it has no {', '.join(missing)}")
    arrays = {f: np.asarray(getattr(steps, f)) for f in _FIELDS}
    bsz, nheads, t, s = arrays["scores"].shape
    dh = arrays["q_heads"].shape[-1]
    expected = {
        "q_heads": (bsz, nheads, t, dh), "k_heads": (bsz, nheads, s, dh),
        "v_heads": (bsz, nheads, s, arrays["v_heads"].shape[-1]),
        "scaled": (bsz, nheads, t, s), "masked": (bsz, nheads, t, s),
        "weights": (bsz, nheads, t, s),
        "context": (bsz, nheads, t, arrays["v_heads"].shape[-1]),
    }
    for f, shape in expected.items():
        if arrays[f].shape != shape:
            raise ValueError(
                f"steps.{f} has shape {arrays[f].shape}, expected {shape} from "
                f"steps.scores {arrays['scores'].shape} and steps.q_heads "
                f"{arrays['q_heads'].shape}"
            )
    b = check_index(batch, bsz, "batch", "B")
    h = check_index(head, nheads, "head", "H")
    one = {f: a[b, h] for f, a in arrays.items()}  # every field: (T|S, Dh|S)
    qt = check_labels(query_tokens, t, "query_tokens", "T") or [str(i) for i in range(t)]
    kt = check_labels(key_tokens, s, "key_tokens", "S") or [str(i) for i in range(s)]
    dims = [str(i) for i in range(dh)]
    dv = one["v_heads"].shape[-1]
    scale = float(np.sqrt(dh))

    # The weights are tinted by value in the head's colour: dark = attends a lot.
    weights = one["weights"]
    cmap, norm = head_cmap(h), Normalize(0.0, 1.0)
    w_grid = Grid(face=cmap(norm(weights)), text=cell_texts(weights, True, decimals),
                  row_labels=qt, col_labels=kt, row_name="query", col_name="key",
                  title="weights", title_color=head_text_color(h))
    kt_grid = _head_grid(one["k_heads"].T, h, dims, kt, f"Dh = {dh}", "key",
                         f"K_{h}^T", decimals)  # (S, Dh) -> (Dh, S)
    rows: list = [
        Caption(f"Head {h}{f', sample {b}' if bsz > 1 else ''}, step 1: scores = "
                f"Q_{h} @ K_{h}^T: ({t}, {dh}) @ ({dh}, {s}) -> ({t}, {s})"),
        [
            _head_grid(one["q_heads"], h, qt, dims, "query", f"Dh = {dh}", f"Q_{h}", decimals),
            Op("@"),
            kt_grid,
            Op("="),
            _score_grid(one["scores"], qt, kt, "scores", decimals),
        ],
        Caption(f"steps 2-4: scaled = scores / sqrt({dh}) = scores / {scale:.2f}, "
                "masked = -inf where blocked, softmax per row"),
        [
            _score_grid(one["scaled"], qt, kt, "scaled", decimals),
            Op("→"),
            _score_grid(one["masked"], qt, kt, "masked", decimals),
            Op("→"),
            w_grid,
        ],
        Caption(f"step 5: context = weights @ V_{h}: ({t}, {s}) @ ({s}, {dv}) -> ({t}, {dv})"),
        [
            w_grid,
            Op("@"),
            _head_grid(one["v_heads"], h, kt, [str(i) for i in range(dv)], "key",
                       f"Dh = {dv}", f"V_{h}", decimals),
            Op("="),
            _head_grid(one["context"], h, qt, [str(i) for i in range(dv)], "query",
                       f"Dh = {dv}", f"context_{h}", decimals),
        ],
        Legend([("blocked by the mask (-inf)", BLOCKED_FILL), ("score", NEUTRAL_FILL),
                (f"weight 0 to 1, head {h}", head_color(h))]),
    ]
    fig, _ = compose(rows)
    blocked = int(np.isneginf(one["masked"]).sum())
    return set_alt_text(
        fig,
        f"Head {h}'s attention on {t} queries and {s} keys in five steps: Q times K transposed, "
        f"scaled by the square root of {dh}, masked ({blocked} cells set to minus infinity), "
        f"softmax into weights, and weights times V giving the context.",
    )
