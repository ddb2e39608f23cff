"""Colours, font sizes and small checks shared by every drawing module.

One colour per head across the whole book: head ``h`` is always drawn in
``head_color(h)``, whichever figure it appears in, so a reader who has learned
"head 0 is blue" can follow head 0 through the split, the weights, the pipeline
and the heatmaps. The palette is Okabe and Ito's, chosen to stay distinguishable
under the common forms of colour-blindness.
"""

from __future__ import annotations

import functools
import numbers
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np
from matplotlib.colors import LinearSegmentedColormap, to_rgba
from matplotlib.figure import Figure
from matplotlib.font_manager import FontProperties
from matplotlib.textpath import TextToPath

from mha._checks import check_non_negative_int

# Okabe-Ito, reordered so the first heads get the most distinct pair (blue,
# orange); black is left out because a black head would hide its cell values.
HEAD_COLORS: tuple[str, ...] = (
    "#0072B2",  # blue
    "#E69F00",  # orange
    "#009E73",  # bluish green
    "#CC79A7",  # reddish purple
    "#56B4E9",  # sky blue
    "#D55E00",  # vermillion
    "#F0E442",  # yellow
)

# Cells that belong to no head (the input x, a score matrix) are drawn neutral.
NEUTRAL_FILL = "#EEEEEE"
EDGE_COLOR = "#555555"
BLOCKED_FILL = "#4D4D4D"  # a mask's False / a score set to -inf
ALLOWED_FILL = "#FFFFFF"
GUIDE_COLOR = "#BBBBBB"  # axes through the origin and other lines behind the data

# Sizes in points; nothing below 8 pt so figures stay readable at the book's
# text width (figures are at most MAX_WIDTH inches wide at 100 dpi).
TICK_PT = 9.0
VALUE_PT = 8.5
NAME_PT = 9.0
TITLE_PT = 10.0
CAPTION_PT = 10.0
MAX_WIDTH = 8.0
CELL = 0.42  # default cell edge in inches

# How strongly a head's colour tints its cells: light enough for black digits.
_TINT = 0.38


def head_color(h: int) -> str:
    """Colour of head ``h`` (hex string), the same in every figure of the book.

    Parameters
    ----------
    h : int
        Head index, ``h >= 0``. Past ``len(HEAD_COLORS)`` heads the palette
        repeats (books rarely draw more than a handful of heads side by side).

    Returns
    -------
    str
        ``HEAD_COLORS[h % len(HEAD_COLORS)]``.
    """
    return HEAD_COLORS[check_non_negative_int(h, "head index h") % len(HEAD_COLORS)]


def head_fill(h: int) -> tuple[float, float, float, float]:
    """RGBA fill of a cell that belongs to head ``h``: a light tint of its colour."""
    return tint(head_color(h), _TINT)


def head_text_color(h: int) -> tuple[float, float, float, float]:
    """Head ``h``'s colour darkened for text (titles), so orange or yellow reads on white."""
    r, g, b, _ = to_rgba(head_color(h))
    return (0.72 * r, 0.72 * g, 0.72 * b, 1.0)


def tint(color: Any, amount: float) -> tuple[float, float, float, float]:
    """Mix ``color`` with white: ``amount`` 1 is the colour itself, 0 is white."""
    r, g, b, _ = to_rgba(color)
    mix = (1 - amount) + amount * np.array([r, g, b])
    return (float(mix[0]), float(mix[1]), float(mix[2]), 1.0)


def head_cmap(h: int) -> LinearSegmentedColormap:
    """Sequential colour map from white (0) to head ``h``'s colour (1), for heatmaps."""
    return LinearSegmentedColormap.from_list(f"head{h}", ["#FFFFFF", head_color(h)])


def text_color_on(face: Any) -> str:
    """Black or white, whichever reads better on ``face`` (relative luminance)."""
    r, g, b, _ = to_rgba(face)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "black" if luminance > 0.45 else "white"


_TEXT_TO_PATH = TextToPath()


@functools.lru_cache(maxsize=4096)
def text_width(s: str, size: float, weight: str = "normal") -> float:
    """Width in inches of ``s`` set in the default font at ``size`` points.

    Cached: laying out one figure measures the same labels many times, and turning
    text into paths is the slow part of it."""
    if not s:
        return 0.0
    width, _, _ = _TEXT_TO_PATH.get_text_width_height_descent(
        s, FontProperties(size=size, weight=weight), ismath=False
    )
    return width / 72.0


def format_value(v: float, decimals: int) -> str:
    """Cell text for ``v``: rounded, no ``-0.00``, and ``-inf`` written as such."""
    if np.isneginf(v):
        return "-inf"
    if np.isposinf(v):
        return "inf"
    if np.isnan(v):
        return "nan"
    # Adding 0.0 turns a rounded -0.0 into 0.0 so no cell reads "-0.00".
    return f"{np.round(float(v), decimals) + 0.0:.{decimals}f}"


def cell_texts(x: np.ndarray, show: bool, decimals: int) -> np.ndarray | None:
    """The rounded value of every cell of ``x`` as strings, or None to draw no values."""
    if not show:
        return None
    return np.vectorize(lambda v: format_value(v, decimals), otypes=[object])(x)


def neutral_faces(shape: tuple[int, ...]) -> np.ndarray:
    """RGBA fills, shape ``(*shape, 4)``, for cells that belong to no head."""
    return np.broadcast_to(np.array(tint(NEUTRAL_FILL, 1.0)), (*shape, 4)).copy()


def head_faces(heads: np.ndarray) -> np.ndarray:
    """RGBA fills, shape ``(*heads.shape, 4)``, from an array of head indices."""
    fills = np.array([head_fill(h) for h in range(int(heads.max()) + 1)])
    return fills[heads]


def to_numpy(x: Any, name: str) -> np.ndarray:
    """``x`` as a NumPy array; accepts torch tensors (detached) and array-likes."""
    if hasattr(x, "detach"):  # a torch tensor, without importing torch here
        x = x.detach().cpu().numpy()
    arr = np.asarray(x)
    if arr.dtype == object:
        raise ValueError(f"{name} must be a numeric array, got dtype object")
    return arr


def check_ndim_one_of(x: np.ndarray, ndims: Sequence[int], name: str, layout: str) -> None:
    """Require ``x.ndim`` to be one of ``ndims``; ``layout`` names them all in the message.

    :func:`mha._checks.check_ndim` takes one ``ndim`` and writes it into the message;
    a figure often accepts several layouts (``"(B, H, T, S) or (H, T, S)"``), which
    ``layout`` spells out instead.
    """
    if x.ndim not in ndims:
        raise ValueError(f"{name} must have shape {layout}, got shape {x.shape}")


def check_figure_size(width: float, height: float) -> None:
    """A figure's size in inches: at most ``MAX_WIDTH`` wide (it must fit the page)."""
    if not 0 < width <= MAX_WIDTH or not height > 0:
        raise ValueError(
            f"width must be in (0, {MAX_WIDTH}] inches and height positive, "
            f"got width={width!r}, height={height!r}"
        )


def check_int_in_range(value: Any, name: str, low: int, high: int) -> int:
    """``value`` as an int in ``[low, high]`` (``bool`` is rejected), else a ValueError."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or not (
        low <= value <= high
    ):
        raise ValueError(f"{name} must be an int in [{low}, {high}], got {value!r}")
    return int(value)


def check_labels(labels: Sequence[str] | None, size: int, name: str, axis: str) -> list[str] | None:
    """Check that there is one label per position along ``axis`` (or none at all)."""
    if labels is None:
        return None
    if isinstance(labels, str):
        raise ValueError(f"{name} must be a sequence of strings, got the string {labels!r}")
    labels = [str(t) for t in labels]
    if len(labels) != size:
        raise ValueError(
            f"{name} has {len(labels)} labels but axis {axis} has size {size}"
        )
    return labels


def check_index(i: int, size: int, name: str, axis: str) -> int:
    """Check ``0 <= i < size`` for an index along ``axis``."""
    if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= i < size:
        raise ValueError(f"{name} must be an int in [0, {size}) for axis {axis}, got {i!r}")
    return int(i)


# Alt text is kept beside the figure rather than on it: matplotlib has no alt
# attribute, and the figure should not change when the text is read.
_ALT_TEXT: weakref.WeakKeyDictionary[Figure, str] = weakref.WeakKeyDictionary()


def set_alt_text(fig: Figure, text: str) -> Figure:
    """Remember a one-sentence description of ``fig`` (see :func:`alt_text`)."""
    _ALT_TEXT[fig] = text
    return fig


def alt_text(fig: Figure) -> str:
    """A one-sentence description of a figure made by ``mha.draw``.

    A starting point for a chapter's hand-written alt text; it says what is
    drawn and the shapes, not what the reader should conclude.

    Raises
    ------
    ValueError
        If ``fig`` was not made by ``mha.draw``.
    """
    try:
        return _ALT_TEXT[fig]
    except KeyError:
        raise ValueError("fig was not made by mha.draw, so it has no alt text") from None
