"""What the drawing tests share: a figure rendered as the notebooks store it,
rendering without coverage's tracer, finding what a figure drew by its gid, and the
house style every figure keeps."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable, Iterator

import coverage
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backend_bases import RendererBase
from matplotlib.collections import PatchCollection
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.text import Text

import mha
from mha import draw
from mha.draw.style import MAX_WIDTH
from mha.notebook import SVG_METADATA


@contextlib.contextmanager
def untraced() -> Iterator[None]:
    """Pause coverage, when it measures this run, for a block that runs no line of mha.

    Rendering a finished figure is matplotlib's work alone (``mha.draw`` registers no
    callback that runs at drawing time), yet traced it takes about a third more time.
    The coverage report of ``mha`` is the same with or without the pause.
    """
    cov = coverage.Coverage.current()
    if cov is None:
        yield
        return
    cov.stop()
    try:
        yield
    finally:
        cov.start()


def svg(fig: Figure) -> bytes:
    """The figure as a notebook stores it: SVG, fixed metadata, the tight box."""
    buf = io.BytesIO()
    with untraced():
        fig.savefig(buf, format="svg", metadata=SVG_METADATA, bbox_inches="tight")
    return buf.getvalue()


def rendered(fig: Figure) -> RendererBase:
    """Draw the figure on its canvas (layout engines run then); return the renderer."""
    with untraced():
        fig.canvas.draw()
    return fig.canvas.get_renderer()


# ----------------------------------------------------------- what a figure drew, by gid


def cells(ax: Axes) -> PatchCollection:
    """The one collection of cells of a grid."""
    found = [c for c in ax.collections if c.get_gid() == "cells"]
    assert len(found) == 1
    return found[0]


def grid_axes(fig: Figure) -> list[Axes]:
    """The axes that hold a grid of cells, in drawing order."""
    return [ax for ax in fig.axes if any(c.get_gid() == "cells" for c in ax.collections)]


def faces(ax: Axes, shape: tuple[int, int]) -> np.ndarray:
    """RGBA fill of every cell of the grid in ``ax``, shape ``(*shape, 4)``."""
    coll = cells(ax)
    fc = coll.get_facecolors() if coll.get_array() is None else coll.to_rgba(coll.get_array())
    return np.asarray(fc).reshape(*shape, 4)


def gid_texts(ax: Axes, gid: str) -> list[str]:
    return [t.get_text() for t in ax.texts if t.get_gid() == gid]


def series(ax: Axes) -> list[Line2D]:
    """The lines of data (gid "series"), without guides and reference lines."""
    return [line for line in ax.get_lines() if line.get_gid() == "series"]


def fig_texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.texts]


# ------------------------------------------------------------------------ house style


def assert_reproducible(build: Callable[[], Figure]) -> None:
    """Two figures built from the same inputs give the same SVG bytes, all vector."""
    first, second = svg(build()), svg(build())
    assert first == second
    assert b"<dc:date>" not in first and b"<image" not in first  # vector, no raster


def assert_house_style(fig: Figure) -> None:
    """At most the text width, no text below 8 pt, a white background, alt text."""
    width, _ = fig.get_size_inches()
    assert width <= MAX_WIDTH + 1e-9
    sizes = [t.get_fontsize() for t in fig.findobj(Text) if t.get_text()]
    assert sizes and min(sizes) >= 8
    assert fig.get_facecolor() == to_rgba("white")
    assert len(draw.alt_text(fig)) > 40


def assert_tight_box_fits(fig: Figure) -> None:
    """What the book shows is the tight box around everything drawn (after the layout
    engine, which runs at drawing time): it must fit the text width too."""
    box = fig.get_tightbbox(rendered(fig))  # inches
    assert box.width <= MAX_WIDTH + 1e-9


def assert_inside_the_canvas(fig: Figure) -> None:
    """Every text (labels, step texts, legends) lies inside the figure's canvas."""
    renderer = rendered(fig)
    width, height = fig.bbox.width, fig.bbox.height
    for text in fig.findobj(Text):
        if not text.get_text() or not text.get_visible():
            continue
        box = text.get_window_extent(renderer)
        assert box.x0 >= -1 and box.y0 >= -1, text.get_text()
        assert box.x1 <= width + 1 and box.y1 <= height + 1, text.get_text()


# ------------------------------------------------------- inputs of the FlashAttention figures


def qkv(T: int = 8, S: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One head's queries (T, 4), keys (S, 4) and values (S, 3)."""
    rng = np.random.default_rng(seed)
    return rng.normal(size=(T, 4)), rng.normal(size=(S, 4)), rng.normal(size=(S, 3))


def slightly_off(*args: object, **kwargs: object) -> tuple[np.ndarray, np.ndarray]:
    """mha.flash_attention with a context off by 1e-9: a figure must not draw it as exact."""
    context, logsumexp = mha.flash_attention(*args, **kwargs)
    return context * (1 + 1e-9), logsumexp
