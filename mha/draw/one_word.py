"""What attention does for one word: its weights over the words of its sentence.

:func:`one_word_figure` draws one query's row of attention weights as bars over the
words of the sentence, the query word marked, each bar labelled with its weight, and
under the bars the weighted sum those weights make of the values. It is the picture
the book starts from, before any shape or mask: one word asks, every word answers
with a weight, and the weights sum to 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from mha.draw.style import (
    EDGE_COLOR,
    NAME_PT,
    TICK_PT,
    TITLE_PT,
    VALUE_PT,
    check_figure_size,
    check_int_in_range,
    format_value,
    head_color,
    head_text_color,
    set_alt_text,
    tint,
    to_numpy,
)

_SUM_TOLERANCE = 1e-6  # a softmax row sums to 1 up to rounding


def one_word_figure(
    tokens: Sequence[str],
    weights: Any,
    query: int,
    *,
    title: str | None = None,
    decimals: int = 2,
    width: float = 6.4,
    height: float = 2.6,
) -> Figure:
    """One query's attention weights, as bars over the words it looks at.

    Parameters
    ----------
    tokens : sequence of S str
        The words, in order: the keys the query is compared with.
    weights : array_like, shape (S,)
        The query's attention weights (NumPy or torch): non-negative, summing to 1.
    query : int
        Position of the query word in ``tokens``; its word is drawn in bold and
        marked "query".
    title : str, optional
        Default: ``what "<query word>" attends to``.
    decimals : int
        Decimals of the weight written above each bar.
    width, height : float
        Figure size in inches; ``width`` at most 8.

    Returns
    -------
    matplotlib.figure.Figure

    Raises
    ------
    ValueError
        If ``weights`` is not one finite, non-negative row summing to 1, if it does
        not have one entry per token, if ``query`` is not a position of ``tokens``,
        or if the size is out of range.
    """
    w = to_numpy(weights, "weights").astype(float)
    words = [str(t) for t in tokens]
    if w.ndim != 1 or w.shape[0] == 0:
        raise ValueError(f"weights must have shape (S,) with S >= 1, got shape {w.shape}")
    if len(words) != w.shape[0]:
        raise ValueError(
            f"tokens must have one word per weight (S = {w.shape[0]}), got {len(words)}"
        )
    if not np.all(np.isfinite(w)) or (w < 0).any():
        raise ValueError("weights must be finite and non-negative")
    if abs(w.sum() - 1.0) > _SUM_TOLERANCE:
        raise ValueError(f"weights must sum to 1 (a softmax row), got sum {w.sum():.6g}")
    q = check_int_in_range(query, "query", 0, len(words) - 1)
    check_int_in_range(decimals, "decimals", 0, 6)
    check_figure_size(width, height)

    fig, ax = plt.subplots(figsize=(width, height), facecolor="white")
    x = np.arange(len(words))
    colors = [head_color(0) if i != q else tint(head_color(0), 0.45) for i in x]
    bars = ax.bar(x, w, width=0.7, color=colors, edgecolor=EDGE_COLOR, linewidth=0.6)
    for bar in bars:
        bar.set_gid("bar")
    for i, value in enumerate(w):
        label = ax.text(i, value + 0.03, format_value(value, decimals), ha="center",
                        va="bottom", fontsize=VALUE_PT)
        label.set_gid("weight")
    ax.set_xticks(x, words, fontsize=TICK_PT)
    tick = ax.get_xticklabels()[q]
    tick.set_fontweight("bold")
    tick.set_color(head_text_color(0))
    marker = ax.annotate("query", xy=(q, 0), xycoords=("data", "axes fraction"),
                         xytext=(0, -24), textcoords="offset points", ha="center",
                         va="top", fontsize=NAME_PT, color=head_text_color(0))
    marker.set_gid("query")
    ax.set_ylim(0, 1.18)
    ax.set_yticks([0, 0.5, 1])
    ax.tick_params(axis="y", labelsize=TICK_PT)
    ax.set_ylabel("weight", fontsize=NAME_PT)
    ax.spines[["top", "right"]].set_visible(False)
    ax.set_title(title if title is not None else f'what "{words[q]}" attends to',
                 fontsize=TITLE_PT)
    fig.tight_layout()

    top = int(np.argmax(w))
    return set_alt_text(
        fig,
        f'A bar chart of the attention weights of the query "{words[q]}" over the '
        f"{len(words)} words of its sentence; the largest, "
        f'{format_value(w[top], decimals)}, is on "{words[top]}".',
    )
