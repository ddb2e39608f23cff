"""Notebook set-up shared by every chapter.

Figures are stored in the notebooks as SVG, not PNG, because nbval compares SVG
outputs and skips PNG: a drawing function that changes without the notebook being
regenerated then fails the test run. Matplotlib's SVG is only reproducible byte
for byte with a fixed hash salt (for clip-path ids) and without the date stamp.
"""

from __future__ import annotations

import matplotlib as mpl
import numpy as np

SVG_METADATA = {"Date": None, "Creator": None}


def setup_figures() -> None:
    """Make every inline figure a deterministic SVG on a white background."""
    mpl.rcParams.update(
        {
            "svg.hashsalt": "mha-book",
            "svg.fonttype": "path",
            "figure.facecolor": "white",
            "savefig.facecolor": "white",
            "figure.dpi": 100,
            "font.size": 10,
        }
    )
    try:
        from IPython import get_ipython
    except ImportError:  # plain Python: nothing to configure
        return
    shell = get_ipython()
    if shell is None:
        return
    from matplotlib_inline.backend_inline import set_matplotlib_formats

    set_matplotlib_formats("svg", metadata=SVG_METADATA, bbox_inches="tight")


def setup_printing() -> None:
    """Print options used by every chapter: 4 decimals, no scientific notation."""
    np.set_printoptions(precision=4, suppress=True)
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a pinned requirement
        return
    torch.set_printoptions(precision=4, sci_mode=False)
