"""The language-model length study as a figure: a measure against position, per scheme.

:func:`length_curves_figure` reads the results document that
``python -m mha.translator.lm_lengths`` writes (plain JSON: this module never imports
the translator or torch) and draws, for every position scheme, the mean over seeds of
one per-position measure as a line and the seeds' minimum to maximum as a band, with
the training length marked.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from mha.draw.style import GUIDE_COLOR, HEAD_COLORS, MAX_WIDTH, NAME_PT, TICK_PT, set_alt_text

__all__ = ["MEASURE_LABELS", "length_curves", "length_curves_figure"]

#: The per-position measures of a run, and their axis labels.
MEASURE_LABELS = {
    "loss": "next-token loss (nats)",
    "accuracy": "next-token accuracy",
    "translation_accuracy": "accuracy on the translation",
}


def length_curves(
    results: Mapping[str, Any], measure: str = "loss", smooth: int = 1
) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per scheme, the mean, minimum and maximum over seeds of ``measure`` by position.

    Parameters
    ----------
    results : mapping
        The results document (its ``runs``: ``position_scheme``, and a list per measure).
    measure : str
        A key of :data:`MEASURE_LABELS`.
    smooth : int
        Width of a moving average over positions applied to each run before the
        seeds are combined (1: none); positions with no value (None) are skipped.

    Returns
    -------
    dict of str -> (mean, low, high)
        Arrays of shape ``(P,)``, position ``p = 1 .. P`` at index ``p - 1``, in the
        order the schemes first appear in ``runs``.
    """
    if measure not in MEASURE_LABELS:
        raise ValueError(f"measure must be one of {list(MEASURE_LABELS)}, got {measure!r}")
    if not isinstance(smooth, int) or smooth < 1:
        raise ValueError(f"smooth must be a positive int, got {smooth!r}")
    per_scheme: dict[str, list[np.ndarray]] = {}
    for run in results["runs"]:
        values = np.array([np.nan if v is None else v for v in run[measure]], dtype=float)
        if smooth > 1:  # mean of the last `smooth` positions, ignoring gaps
            kept = np.nan_to_num(values)
            counts = np.convolve(~np.isnan(values), np.ones(smooth))[: len(values)]
            sums = np.convolve(kept, np.ones(smooth))[: len(values)]
            with np.errstate(invalid="ignore", divide="ignore"):
                values = np.where(counts > 0, sums / counts, np.nan)
        per_scheme.setdefault(run["position_scheme"], []).append(values)
    curves = {}
    for scheme, rows in per_scheme.items():
        stack = np.stack(rows)  # (seeds, P)
        curves[scheme] = (stack.mean(axis=0), stack.min(axis=0), stack.max(axis=0))
    return curves


def length_curves_figure(
    results: Mapping[str, Any],
    measures: Sequence[str] = ("loss",),
    smooth: int = 1,
    labels: Mapping[str, str] | None = None,
    order: Sequence[str] | None = None,
    ylims: Sequence[tuple[float, float] | None] | None = None,
    height: float = 2.6,
    alt: str | None = None,
) -> Figure:
    """One panel per measure, stacked: the measure against position, a line (mean) and a
    band (seed range) per scheme, a dashed vertical line at the training length
    ``results["data"]["train_len"]``.

    Parameters
    ----------
    results, smooth
        As :func:`length_curves`.
    measures : sequence of str
        Keys of :data:`MEASURE_LABELS`, one panel each, top to bottom.
    labels : mapping, optional
        Legend name per scheme (default: the scheme's own name).
    order : sequence of str, optional
        Schemes to draw, in this order (default: all, as in the file).
    ylims : sequence of (float, float) or None, optional
        Per panel.
    height : float
        Inches per panel; the width is the book's.
    alt : str, optional
        Alt text stored on the figure (default: one saying what is drawn).
    """
    if isinstance(measures, str) or not measures:
        raise ValueError(f"measures must be a non-empty sequence of names, got {measures!r}")
    ylims = [None] * len(measures) if ylims is None else list(ylims)
    if len(ylims) != len(measures):
        raise ValueError(f"ylims has {len(ylims)} entries for {len(measures)} measures")
    labels = dict(labels or {})
    train_len = results["data"]["train_len"]
    fig, axes = plt.subplots(len(measures), 1, figsize=(MAX_WIDTH, height * len(measures)),
                             sharex=True, layout="constrained", squeeze=False)  # fmt: skip
    for ax, measure, ylim in zip(axes[:, 0], measures, ylims, strict=True):
        curves = length_curves(results, measure, smooth)
        names = list(curves) if order is None else list(order)
        missing = [s for s in names if s not in curves]
        if missing:
            raise ValueError(f"order names schemes not in the results: {missing}")
        for k, scheme in enumerate(names):
            mean, low, high = curves[scheme]
            x = np.arange(1, len(mean) + 1)
            color = HEAD_COLORS[k % len(HEAD_COLORS)]
            ax.fill_between(x, low, high, color=color, alpha=0.22, linewidth=0)
            ax.plot(x, mean, color=color, linewidth=1.5, label=labels.get(scheme, scheme),
                    gid="series")  # fmt: skip
        ax.axvline(train_len, color=GUIDE_COLOR, linestyle="--", linewidth=1.2, zorder=0,
                   label="training length L")  # fmt: skip
        if ylim is not None:
            ax.set_ylim(*ylim)
        size = len(x)
        ax.set_xlim(1, size)
        ax.set_xticks([1, *range(train_len, size + 1, train_len)])
        ax.set_ylabel(MEASURE_LABELS[measure], fontsize=NAME_PT)
        ax.tick_params(labelsize=TICK_PT)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    axes[0, 0].legend(fontsize=TICK_PT, frameon=False, ncols=len(names) + 1,
                      loc="lower center", bbox_to_anchor=(0.5, 1.0))  # fmt: skip
    axes[-1, 0].set_xlabel("position p (tokens read so far)", fontsize=NAME_PT)
    if alt is None:  # a starting point: what is drawn, not what it shows
        drawn = " and ".join(MEASURE_LABELS[m] for m in measures)
        alt = (f"{drawn.capitalize()} against the position, 1 to {size}, one line per "
               f"scheme ({', '.join(labels.get(s, s) for s in names)}) with the range "
               f"of the seeds as a band, and a dashed line at the training length "
               f"{train_len}.")  # fmt: skip
    set_alt_text(fig, alt)
    return fig
