"""What the drawing tests share: a figure rendered as the notebooks store it, and
rendering without coverage's tracer."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator

import coverage
from matplotlib.backend_bases import RendererBase
from matplotlib.figure import Figure

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
