"""mha.draw.alibi_figure: what is drawn equals the arrays it stands for.

Oracles: ALiBi's slopes as the paper lists them (``1/2 .. 1/256`` for 8 heads, ``2^(-8/n)``
ratios) and ``-slope * distance`` written here; colours from the house palette and colour
maps.
"""

from __future__ import annotations

import re

import matplotlib.pyplot as plt
import numpy as np
import pytest
from figures import (
    assert_house_style,
    assert_reproducible,
    assert_tight_box_fits,
    faces,
    gid_texts,
    grid_axes,
    series,
)
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.draw import alibi
from mha.draw.style import BLOCKED_FILL, head_text_color
from mha.notebook import setup_figures


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


PAPER_SLOPES_4 = [1 / 4, 1 / 16, 1 / 64, 1 / 256]  # 2^(-8/4) and its powers


def slope_of(title: str) -> float:
    """The slope written in a title "head h, slope 1/N" (or a decimal)."""
    found = re.search(r"slope (1/(\d+)|[0-9.]+)$", title.strip())
    assert found, title
    return 1 / int(found.group(2)) if found.group(2) else float(found.group(1))


def test_alibi_grids_hold_minus_slope_times_distance_in_head_colours():
    fig = draw.alibi_figure(4, 3)
    grids = grid_axes(fig)
    assert len(grids) == 8  # 4 heads causal, then 4 heads symmetric
    for index, ax in enumerate(grids):
        h, causal = index % 4, index < 4
        slope = PAPER_SLOPES_4[h]
        want = np.array([[-slope * (i - j if causal else abs(i - j)) for j in range(3)]
                         for i in range(3)])
        blocked = np.array([[causal and j > i for j in range(3)] for i in range(3)])
        # three decimals: 1/256 must not read as 0.00
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}"
                                          for v in want[~blocked]]
        fc = faces(ax, (3, 3))
        np.testing.assert_allclose(fc[blocked], np.broadcast_to(to_rgba(BLOCKED_FILL),
                                                                (int(blocked.sum()), 4)))
        # The head's own scale: white at its most negative bias (distance 2), the head's
        # colour at 0, as the other heatmaps (darker = larger).
        lowest = -slope * 2
        np.testing.assert_allclose(fc[~blocked],
                                   draw.head_cmap(h)(1 - want[~blocked] / lowest), atol=1e-12)
        assert slope_of(ax.get_title()) == slope
        assert ax.get_title().strip() == f"head {h}, slope 1/{round(1 / slope)}"
        assert ax.title.get_color() == head_text_color(h)
    # the biases the figure writes are the specification's
    bias = mha.alibi_bias(4, 3)
    assert gid_texts(grids[1], "value") == [f"{np.round(v, 3) + 0.0:.3f}"
                                            for v in bias[1][np.tril(np.ones((3, 3), bool))]]
    legend = [t for t in fig.texts if t.get_text() == "blocked by the causal mask"]
    assert len(legend) == 1


def colorbars(fig) -> list:
    """The colour bars' axes, in drawing order."""
    return [ax for ax in fig.axes if hasattr(ax, "_colorbar")]


def luminance(rgba) -> float:
    r, g, b = np.asarray(rgba)[..., :3].T
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


@pytest.mark.parametrize(("heads", "size"), [(4, 3), (4, 4), (8, 4), (12, 2)])
def test_every_head_has_its_own_scale_and_colour_bar_darker_where_larger(heads, size):
    """A gentle head is as readable as a steep one: each grid runs from white at its
    lowest bias to the head's colour at 0 (darker = larger, as the attention heatmaps),
    and its colour bar, beside it, is labelled with that lowest bias and 0."""
    fig = draw.alibi_figure(heads, size)
    grids, bars = grid_axes(fig), colorbars(fig)
    assert len(bars) == len(grids) == 2 * heads
    slopes = mha.alibi_slopes(heads)
    renderer = fig.canvas.get_renderer()
    for index, (ax, bar) in enumerate(zip(grids, bars, strict=True)):
        h, causal = index % heads, index < heads
        bias = mha.alibi_bias(heads, size, causal=causal)[h]  # (T, S)
        seen = np.tril(np.ones((size, size), bool)) if causal else np.ones((size, size), bool)
        lowest = -slopes[h] * (size - 1)
        fc = faces(ax, (size, size))
        zero = seen & (bias == 0)  # exact: -slope * 0
        np.testing.assert_allclose(fc[zero], np.broadcast_to(
            to_rgba(draw.head_color(h)), (int(zero.sum()), 4)), atol=1e-12)
        far = seen & np.isclose(bias, lowest, rtol=1e-12, atol=0)
        np.testing.assert_allclose(fc[far], 1.0, atol=1e-12)  # white
        # darker = larger: along a row, the shade darkens as the bias grows to 0
        order = np.argsort(bias[seen])
        assert np.all(np.diff(luminance(fc[seen][order])) <= 1e-12)
        np.testing.assert_allclose(bar.get_ylim(), (lowest, 0.0), rtol=1e-12)
        labels = [t.get_text() for t in bar.get_yticklabels()]
        assert len(labels) == 2 and labels[-1] == "0"
        decimals = len(labels[0].split(".")[1])  # the lowest bias, rounded as the cells
        assert float(labels[0]) == pytest.approx(lowest, abs=0.51 * 10.0**-decimals)
        # beside its grid, at the same height, left of the next grid
        box, bar_box = ax.get_window_extent(renderer), bar.get_window_extent(renderer)
        assert 0 < bar_box.x0 - box.x1 < 20 and abs(bar_box.y0 - box.y0) < 1


def test_alibi_titles_follow_the_paper_for_other_head_counts():
    fig = draw.alibi_figure(3, 2, variants=("symmetric",), max_distance=None)
    # 3 heads: the slopes of 2 heads (1/16, 1/256), then the first of 4 heads' in between
    assert [slope_of(ax.get_title()) for ax in grid_axes(fig)] == [1 / 16, 1 / 256, 1 / 4]
    fig = draw.alibi_figure(12, 2, variants=("causal",), max_distance=None)
    titles = [ax.get_title().strip() for ax in grid_axes(fig)]
    assert titles[:8] == [f"head {h}, slope 1/{2 ** (h + 1)}" for h in range(8)]
    assert titles[8] == "head 8, slope 0.707"  # 2^(-1/2): no power of two
    np.testing.assert_allclose([slope_of(t) for t in titles], mha.alibi_slopes(12), rtol=2e-3)


def test_alibi_line_plot_is_bias_against_distance_per_head():
    fig = draw.alibi_figure(4, 3, max_distance=6)
    plot = [ax for ax in fig.axes if series(ax)]
    assert len(plot) == 1
    lines = series(plot[0])
    assert [line.get_label() for line in lines] == [
        f"head {h}, slope 1/{round(1 / s)}" for h, s in enumerate(PAPER_SLOPES_4)]
    for h, line in enumerate(lines):
        np.testing.assert_array_equal(line.get_xdata(), np.arange(7))
        np.testing.assert_allclose(line.get_ydata(), -PAPER_SLOPES_4[h] * np.arange(7),
                                   rtol=1e-15, atol=0)
        assert to_rgba(line.get_color()) == to_rgba(draw.head_color(h))
    assert plot[0].get_xlabel().startswith("distance")
    assert not [ax for ax in draw.alibi_figure(2, 2, max_distance=None).axes if series(ax)]


def test_alibi_queries_are_the_last_of_the_keys_when_decoding():
    fig = draw.alibi_figure(2, 2, num_keys=5, variants=("causal",))
    grids = grid_axes(fig)
    assert [t.get_text() for t in grids[0].get_yticklabels()] == ["3", "4"]
    assert [t.get_text() for t in grids[0].get_xticklabels()] == [str(j) for j in range(5)]
    bias = mha.alibi_bias(2, 2, num_keys=5)
    seen = np.array([[True] * 4 + [False], [True] * 5])  # key 4 is after query 3
    for h, (ax, slope) in enumerate(zip(grids, [1 / 16, 1 / 256], strict=True)):
        want = [-slope * (i - j) for i in (3, 4) for j in range(5) if j <= i]
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}" for v in want]
        assert gid_texts(ax, "value") == [f"{np.round(v, 3) + 0.0:.3f}" for v in bias[h][seen]]


def test_alibi_values_and_rows_adapt_to_the_width():
    fig = draw.alibi_figure(8, 4)
    grids = grid_axes(fig)
    assert len(grids) == 16
    assert all(not gid_texts(ax, "value") for ax in grids)  # 8 heads of values do not fit
    tops = sorted({round(ax.get_position().y1, 6) for ax in grids})
    assert len(tops) == 6  # 3 rows per variant (3, 3 and 2 heads): each has a colour bar
    fig = draw.alibi_figure(2, 3, decimals=1, show_values=True, variants=("symmetric",))
    # head 0 (slope 1/16), query 0: -0, -1/16, -2/16 rounded to one decimal
    assert gid_texts(grid_axes(fig)[0], "value")[:3] == ["0.0", "-0.1", "-0.1"]
    assert not any("blocked" in t.get_text() for t in fig.texts)  # no causal, no legend


def test_alibi_figure_checks_its_claim_on_the_arrays(monkeypatch):
    """A bias that forgets the slope's sign no longer matches what is drawn."""
    monkeypatch.setattr(alibi, "alibi_bias", lambda *a, **kw: -mha.alibi_bias(*a, **kw))
    with pytest.raises(AssertionError):
        draw.alibi_figure(2, 3)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"num_heads": 0}, r"num_heads must be an int in \[1, 16\], got 0"),
        ({"num_heads": 2.0}, "num_heads must be an int"),
        ({"size": 13}, r"size must be an int in \[1, 12\]"),
        ({"size": 4, "num_keys": 3}, "num_keys=3 is smaller than size=4"),
        ({"variants": "causal"}, "variants must be a non-empty sequence"),
        ({"variants": ()}, "variants must be a non-empty sequence"),
        ({"variants": ("causal", "causal")}, "distinct names"),
        ({"variants": ("decoder",)}, r"from \('causal', 'symmetric'\)"),
        ({"decimals": -1}, r"decimals must be an int in \[0, 6\]"),
        ({"max_distance": 0}, r"max_distance must be an int in \[1, 64\]"),
    ],
)
def test_alibi_figure_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        draw.alibi_figure(**kwargs)


# ------------------------------------------------------------------------ house style

BUILDERS = {
    "alibi": lambda: draw.alibi_figure(2, 2),
    "alibi_many": lambda: draw.alibi_figure(8, 4),
    "alibi_twelve": lambda: draw.alibi_figure(12, 2),
}


@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_same_inputs_give_byte_identical_svg():
    assert_reproducible(BUILDERS["alibi"])


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_figures_fit_the_text_width_with_readable_fonts(name):
    fig = BUILDERS[name]()
    assert_house_style(fig)
    assert_tight_box_fits(fig)


def test_alt_text_names_what_is_drawn():
    assert "slopes 1/4, 1/16, 1/64, 1/256" in draw.alt_text(draw.alibi_figure(4, 3))


def test_exported_from_mha_draw():
    assert draw.alibi_figure is alibi.alibi_figure and "alibi_figure" in draw.__all__
