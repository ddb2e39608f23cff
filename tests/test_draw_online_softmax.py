"""mha.draw.online_softmax_figure: what is drawn is the trace.

The lines, bars and texts of the online softmax are checked against a TileTrace
recorded here and against the softmax of the whole row.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
from figures import (
    assert_house_style,
    assert_inside_the_canvas,
    assert_reproducible,
    fig_texts,
    qkv,
    slightly_off,
)
from matplotlib.axes import Axes
from matplotlib.colors import to_rgba

import mha
from mha import draw
from mha.draw import tile_trace
from mha.draw.online_softmax import MAX_COLOR, online_softmax_figure
from mha.notebook import setup_figures


@pytest.fixture(autouse=True)
def _figures():
    setup_figures()
    yield
    plt.close("all")


def fmt(x: float) -> str:
    return f"{np.round(x, 2) + 0.0:.2f}"


def example(query: int = 3, tile_size: int = 4, causal: bool = False, mask=None):
    """Seed 9, row 3: the maximum grows in every tile of 4 keys (0.22, 0.82, 1.99)."""
    q, k, v = qkv(T=12, S=12, seed=9)
    fig = draw.online_softmax_figure(q, k, v, mask, query=query, tile_size=tile_size,
                                     causal=causal)
    trace = mha.TileTrace()
    mha.flash_attention(q, k, v, mask, tile_size=tile_size, causal=causal, trace=trace)
    allowed = np.ones((12, 12), bool) if mask is None else np.broadcast_to(mask, (12, 12))
    if causal:
        allowed = allowed & mha.causal_mask(12)
    scores = np.where(allowed[query], q[query] @ k.T / 2.0, -np.inf)  # sqrt(Dh) = 2
    return fig, trace.row_history(query), scores


def gid(ax: Axes, name: str) -> list:
    return [a for a in (*ax.lines, *ax.collections, *ax.patches, *ax.texts)
            if a.get_gid() == name]


def step_texts(ax: Axes) -> list[tuple[str, tuple]]:
    return [(t.get_text(), to_rgba(t.get_color())) for t in gid(ax, "step_text")]


def bar_heights(ax: Axes, name: str) -> tuple[np.ndarray, np.ndarray]:
    bars = gid(ax, name)
    return (np.array([b.get_x() + b.get_width() / 2 for b in bars]),
            np.array([b.get_height() for b in bars]))


def test_online_softmax_figure_draws_the_running_max_and_sum_of_the_trace():
    fig, history, scores = example()
    np.testing.assert_array_equal(history.key_stop, [4, 8, 12])
    m, l_sum = history.running_max, history.running_sum
    assert np.all(np.diff(m) > 0.5)  # the example really rescales, twice
    assert "Online softmax of query 3: 3 key tiles of tile_size = 4" in fig_texts(fig)
    for i in range(3):
        ax_s, ax_e, ax_t = fig.axes[3 * i : 3 * i + 3]
        (line,) = gid(ax_s, "running_max")
        np.testing.assert_array_equal(line.get_ydata(), [m[i], m[i]])
        (dots,) = gid(ax_s, "scores")
        seen = np.arange(4 * (i + 1))
        np.testing.assert_array_equal(dots.get_offsets()[:, 0], seen)
        np.testing.assert_allclose(dots.get_offsets()[:, 1], scores[seen], rtol=0, atol=1e-12)
        # The bars are exp(score - m) and add up to the trace's l.
        x, h = bar_heights(ax_e, "terms")
        np.testing.assert_array_equal(x, seen)
        np.testing.assert_allclose(h, np.exp(scores[seen] - m[i]), rtol=1e-12)
        np.testing.assert_allclose(h.sum(), l_sum[i], rtol=1e-12)
        texts = step_texts(ax_t)
        assert texts[0][0] == f"tile {i + 1}: keys {4 * i}-{4 * i + 3}"
        assert texts[-1][0].endswith(f"= {fmt(l_sum[i])}")
        if i == 0:
            assert not gid(ax_s, "old_max") and not gid(ax_e, "old_terms")
            assert texts[1][0] == f"m = tile max = {fmt(m[0])}"
            continue
        # The maximum grew: the old one dashed, the earlier terms' old heights outlined,
        # and the earlier terms are the old ones times exp(m_old - m_new).
        (old,) = gid(ax_s, "old_max")
        np.testing.assert_array_equal(old.get_ydata(), [m[i - 1], m[i - 1]])
        factor = math.exp(m[i - 1] - m[i])
        x_old, h_old = bar_heights(ax_e, "old_terms")
        np.testing.assert_array_equal(x_old, np.arange(4 * i))
        np.testing.assert_allclose(h[: 4 * i], h_old * factor, rtol=1e-12)
        assert texts[2] == (f"rescale = exp({fmt(m[i - 1])} - {fmt(m[i])}) = {fmt(factor)}",
                            to_rgba(MAX_COLOR))
        assert texts[3][0] == (f"l = {fmt(factor)} × {fmt(l_sum[i - 1])} + "
                               f"{fmt(l_sum[i] - factor * l_sum[i - 1])} = {fmt(l_sum[i])}")


def test_online_softmax_figure_ends_with_the_softmax_of_the_whole_row():
    fig, history, scores = example()
    ax_w, ax_f = fig.axes[9:]
    x, h = bar_heights(ax_w, "weights")
    np.testing.assert_array_equal(x, np.arange(12))
    np.testing.assert_allclose(h, mha.softmax(scores), rtol=0, atol=1e-12)
    np.testing.assert_allclose(h, np.exp(scores - history.running_max[-1])
                               / history.running_sum[-1], rtol=1e-12)
    (marks,) = gid(ax_w, "softmax")
    np.testing.assert_allclose(marks.get_offsets()[:, 1], mha.softmax(scores), atol=1e-12)
    assert step_texts(ax_f)[1][0] == (f"m = {fmt(history.running_max[-1])}, "
                                      f"l = {fmt(history.running_sum[-1])}")


def test_online_softmax_figure_with_causal_skips_and_blocked_keys():
    # Row 1 of a causal 12 x 12 in tiles of 3: key tiles 2-4 are skipped, and in the
    # one computed tile key 2 is above the diagonal.
    fig, history, scores = example(query=1, tile_size=3, causal=True)
    assert list(history.skipped) == [False, True, True, True]
    assert len(fig.axes) == 3 + 2
    assert ("Online softmax of query 1: 1 key tile of tile_size = 3, 3 skipped (above "
            "the causal diagonal)") in fig_texts(fig)
    (crosses,) = gid(fig.axes[0], "blocked")
    np.testing.assert_array_equal(crosses.get_offsets()[:, 0], [2])
    x, h = bar_heights(fig.axes[3], "weights")
    assert np.all(h[2:] == 0) and np.isclose(h.sum(), 1.0, rtol=0, atol=1e-12)
    # Row 9: four tiles, the last one partly above the diagonal (keys 10, 11).
    fig, history, _ = example(query=9, tile_size=3, causal=True)
    assert len(fig.axes) == 4 * 3 + 2
    (crosses,) = gid(fig.axes[9], "blocked")
    np.testing.assert_array_equal(crosses.get_offsets()[:, 0], [10, 11])


def test_online_softmax_figure_when_the_first_tile_allows_nothing():
    mask = np.ones((12, 12), bool)
    mask[3, :4] = False  # row 3 sees nothing in its first tile: m stays -inf there
    fig, history, scores = example(mask=mask)
    assert np.isneginf(history.running_max[0]) and history.running_sum[0] == 0
    ax_s, _, ax_t = fig.axes[:3]
    assert not gid(ax_s, "running_max") and not gid(ax_s, "scores")
    np.testing.assert_array_equal(gid(ax_s, "blocked")[0].get_offsets()[:, 0], [0, 1, 2, 3])
    assert [t for t, _ in step_texts(ax_t)][1:] == ["no key allowed yet:", "m = -inf, l = 0"]
    # The next tile starts the sum: nothing to rescale, l is the tile's sum.
    assert [t for t, _ in step_texts(fig.axes[5])][1:] == [
        f"m = tile max = {fmt(history.running_max[1])}",
        f"l = sum of the terms = {fmt(history.running_sum[1])}",
    ]
    assert not gid(fig.axes[3], "old_max")


def test_online_softmax_figure_checks_its_claim_on_the_arrays_it_draws(monkeypatch):
    # A tiled attention that is off by 1e-9 must not be drawn as if it were exact.
    monkeypatch.setattr(tile_trace, "flash_attention", slightly_off)
    with pytest.raises(AssertionError):
        draw.online_softmax_figure(*qkv(), query=1, tile_size=2)


@pytest.mark.parametrize("shift_max", [False, True])
def test_online_softmax_figure_checks_the_trace_against_the_scores(monkeypatch, shift_max):
    # A trace that records a wrong l before the last tile (context, final m and l stay
    # right) is caught; so is an m that is not the running maximum but comes with an l
    # consistent with it (l = sum exp(score - m) holds for any m).
    def wrong_trace(*args, trace, **kwargs):
        out = mha.flash_attention(*args, trace=trace, **kwargs)
        for step in trace.steps:
            if step.keys[1] < trace.num_keys:
                step.running_sum[...] *= math.exp(-1e-3) if shift_max else 1.001
                step.running_max[...] += 1e-3 if shift_max else 0.0
        return out

    monkeypatch.setattr(tile_trace, "flash_attention", wrong_trace)
    with pytest.raises(AssertionError):
        draw.online_softmax_figure(*qkv(), query=1, tile_size=2)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"query": 12}, r"query must be an int in \[0, 12\)"),
        ({"query": True}, "query must be an int"),
        ({"tile_size": 1}, "spans 12 computed key tiles, more than 6"),
        ({"causal": 1}, "causal must be True or False"),
        ({"mask": np.arange(12)[:, None] > 0}, "query row 0 may attend to no key"),
    ],
)
def test_online_softmax_figure_rejects_bad_input(kwargs, message):
    args = {"query": 0, "tile_size": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        draw.online_softmax_figure(*qkv(T=12, S=12), **args)


def test_online_softmax_figure_rejects_batched_input():
    q, k, v = qkv()
    with pytest.raises(ValueError, match=r"v must have shape \(S, Dv\), got shape \(1, 8, 3\)"):
        draw.online_softmax_figure(q, k, v[None], query=0, tile_size=2)


# ------------------------------------------------------------------------ house style


BUILDERS = {
    "online": lambda: draw.online_softmax_figure(*qkv(T=12, S=12, seed=9), query=3,
                                                 tile_size=4),
    "online_causal": lambda: draw.online_softmax_figure(*qkv(T=12, S=12, seed=9), query=9,
                                                        tile_size=3, causal=True),
}


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_same_inputs_give_byte_identical_svg(name):
    assert_reproducible(BUILDERS[name])


@pytest.mark.parametrize("name", list(BUILDERS))
@pytest.mark.no_cover  # renders what other tests draw: tracing it again only slows it
def test_figures_fit_the_text_width_with_readable_fonts(name):
    assert_house_style(BUILDERS[name]())


@pytest.mark.parametrize("name", list(BUILDERS))
def test_nothing_drawn_outside_the_figure(name):
    assert_inside_the_canvas(BUILDERS[name]())


def test_exported_from_mha_draw():
    assert draw.online_softmax_figure is online_softmax_figure
    assert "online_softmax_figure" in draw.__all__
